//! pld's inference engine: GGUF model loading, the tokenizer and chat template, the KV cache, the
//! kernels and forward pass, sampling, the speculative verifier, and the generation loop that both
//! `pld generate` and the server drive.

pub mod chat;
pub mod config;
pub mod delta;
pub mod error;
pub mod fim;
pub mod generate;
pub mod generation;
pub mod gguf;
pub mod grammar;
pub mod harmony;
pub mod kernels;
pub mod kv_budget;
pub mod kv_cache;
pub mod logprobs;
pub mod model;
pub mod pass_cost;
pub mod prefix_cache;
pub mod sampling;
pub mod sequence;
pub mod stats;
pub mod step;
pub mod tokenizer;
pub mod tools;
pub mod verify;
pub mod weights;

#[cfg(test)]
mod cannot_run;
#[cfg(test)]
mod test_models;

pub use chat::{ChatTemplate, Message, PromptEnd, RenderOptions};
pub use error::{EngineError, Result};
pub use generate::{generate, generate_reusing, LOCAL_NAMESPACE};
pub use generation::{
    check_choices, FinishReason, GenerationConfig, GenerationOutput, GenerationSettings,
    SamplingSettings, SettingError,
};
pub use grammar::ResponseFormat;
pub use kv_budget::KvBudget;
pub use logprobs::{ContentLogprobs, TokenLogprob};
pub use model::{Config, Model};
pub use prefix_cache::PrefixCache;
pub use sampling::SamplingParams;
pub use sequence::Sequence;
pub use stats::{BySource, SpecStats};
pub use step::step;
pub use tokenizer::Tokenizer;

use std::path::{Path, PathBuf};

/// Sequences decoded together in one batch unless told otherwise: `pld serve --max-num-seqs` and
/// Python's `LLM(max_num_seqs=...)`.
pub const DEFAULT_MAX_NUM_SEQS: usize = 8;

/// Bytes the prefix cache's directory may hold unless told otherwise (16 GiB):
/// `--prefix-cache-dir-bytes` and Python's `LLM(prefix_cache_dir_bytes=...)`.
pub const DEFAULT_PREFIX_CACHE_DIR_BYTES: u64 = 16 << 30;

/// A model ready to run: weights, tokenizer and chat template from one GGUF file.
pub struct LoadedModel {
    pub path: PathBuf,
    pub name: String,
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// The model's fill-in-the-middle tokens, if it has them (code models).
    pub fim: Option<fim::FimTokens>,
}

impl LoadedModel {
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_with(path, weights::Precision::Stored)
    }

    /// `load` with the weight matrices held at `precision` (f32 only to check arithmetic).
    pub fn load_with(path: &Path, precision: weights::Precision) -> Result<Self> {
        let file = gguf::GgufFile::open(path)?;
        let model = Model::load_with(&file, precision)?;
        let copy = model.prompt_copy_bytes();
        if copy > 0 {
            tracing::info!(
                copy_bytes = copy,
                "prompt rows in the rotated int8 arithmetic (PLD_PROMPT_ROWS=int8): a copy of the weights \
                 of {} MiB beside them",
                copy >> 20
            );
        }
        let tokenizer = Tokenizer::from_gguf(&file)?;
        if tokenizer.vocab_size() < model.config.vocab_size {
            return Err(EngineError::BadMetadata(format!(
                "the tokenizer has {} tokens, the model {}",
                tokenizer.vocab_size(),
                model.config.vocab_size
            )));
        }
        let text_of = |id: Option<u32>| {
            id.map(|i| String::from_utf8_lossy(tokenizer.token_bytes(i)).into_owned())
                .unwrap_or_default()
        };
        let chat_template = match file.get_str_opt("tokenizer.chat_template") {
            Some(src) => Some(ChatTemplate::new(
                src,
                &text_of(tokenizer.bos),
                &text_of(tokenizer.eos),
            )?),
            None => None,
        };
        let name = file
            .get_str_opt("general.name")
            .map(str::to_string)
            .unwrap_or_else(|| {
                path.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
        Ok(LoadedModel {
            path: path.to_path_buf(),
            name,
            model,
            tokenizer,
            chat_template,
            fim: fim::FimTokens::from_gguf(&file),
        })
    }

    /// The prompt text for a conversation, rendered with the model's chat template.
    pub fn render_chat(&self, messages: &[Message]) -> Result<String> {
        self.render_chat_with_tools(messages, &[])
    }

    /// `render_chat` offering the model functions to call (see `ChatTemplate::render_with_tools`),
    /// ending as `PromptEnd::Auto` says. A template that ignores `tools` would leave the model
    /// unaware of them: that is an error.
    pub fn render_chat_with_tools(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
    ) -> Result<String> {
        let options = RenderOptions::default();
        self.render_chat_ending(messages, tools, PromptEnd::Auto, &options)
    }

    /// The prompt text for a conversation, ending where `end` says, with the template's
    /// `options` (see `chat::render`).
    pub fn render_chat_ending(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        end: PromptEnd,
        options: &RenderOptions,
    ) -> Result<String> {
        chat::render(self.chat_template.as_ref(), messages, tools, end, options)
    }

    /// Generates from a prompt given as text (already chat-rendered if wanted).
    pub fn generate_text(
        &self,
        prompt: &str,
        config: GenerationConfig,
        context_len: usize,
        on_text: impl FnMut(&str),
    ) -> Result<GenerationOutput> {
        let ids = self.tokenizer.encode_prompt(prompt)?;
        generate(
            &self.model,
            &self.tokenizer,
            ids,
            config,
            context_len,
            on_text,
        )
    }
}
