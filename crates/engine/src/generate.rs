//! One generation: its settings (`GenerationConfig`), how it ended and what it reports
//! (`GenerationOutput`), and `generate`, which is `step` over a batch of one. The server drives
//! the same `step` over many sequences (`sequence`, `step`).

use crate::error::{EngineError, Result};
use crate::grammar::ResponseFormat;
use crate::logprobs::TokenLogprob;
use crate::model::Model;
use crate::prefix_cache::PrefixCache;
use crate::sampling::SamplingParams;
use crate::sequence::Sequence;
use crate::stats::SpecStats;
use crate::step::step;
use crate::tokenizer::Tokenizer;
use drafting::SpecConfig;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The prefix-cache namespace of a single local user (`generate_reusing`, `pld chat`); a server
/// gives each tenant its own.
pub const LOCAL_NAMESPACE: u64 = 0;

/// Prompt tokens fed per forward pass during prefill.
pub const PREFILL_CHUNK: usize = 256;

/// Settings of one generation, named as in Hugging Face's `GenerationConfig` where it has them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerationConfig {
    pub max_new_tokens: usize,
    #[serde(flatten)]
    pub sampling: SamplingParams,
    pub seed: Option<u64>,
    /// How to draft (`num_speculative_tokens` = 0 turns speculation off), as `SpecConfig::merge`
    /// checked it.
    pub speculation: SpecConfig,
    /// Strings that end generation; they are not part of the output text.
    pub stop: Vec<String>,
    /// Record each generated token's log-probability under the model (before temperature and
    /// the other sampling settings), with this many of the most likely alternatives; `None`
    /// records nothing.
    pub logprobs: Option<usize>,
    /// What the output must be (free text, any JSON object, JSON matching a schema).
    #[serde(default, skip_serializing_if = "ResponseFormat::is_text")]
    pub response_format: ResponseFormat,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        GenerationConfig {
            max_new_tokens: 256,
            sampling: SamplingParams::default(),
            seed: None,
            speculation: SpecConfig::default(),
            stop: Vec::new(),
            logprobs: None,
            response_format: ResponseFormat::Text,
        }
    }
}

impl GenerationConfig {
    /// Checks the sampling settings and the token budget. The speculation settings are checked
    /// once, by `SpecConfig::merge` on every surface, and trusted here.
    pub fn validate(&self) -> Result<()> {
        self.sampling
            .validate()
            .map_err(|e| EngineError::InvalidConfig(e.message))?;
        if self.max_new_tokens == 0 {
            return Err(EngineError::InvalidConfig(
                "max_new_tokens must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_new_tokens` reached, or the context is full.
    Length,
    /// The caller stopped it (`generate_reusing`'s `on_text` said so).
    Cancelled,
}

/// Everything a finished generation reports.
#[derive(Clone, Debug, Serialize)]
pub struct GenerationOutput {
    pub text: String,
    pub token_ids: Vec<u32>,
    /// Per generated token, when `GenerationConfig::logprobs` asked for them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<TokenLogprob>,
    pub prompt_token_ids: Vec<u32>,
    /// Prompt tokens whose keys and values came from the prefix cache (not prefilled).
    pub cached_tokens: usize,
    pub finish_reason: FinishReason,
    pub stats: SpecStats,
    #[serde(skip)]
    pub prefill_time: Duration,
    #[serde(skip)]
    pub decode_time: Duration,
}

impl GenerationOutput {
    pub fn decode_tokens_per_s(&self) -> f64 {
        let t = self.decode_time.as_secs_f64();
        if t > 0.0 {
            self.stats.decode_tokens as f64 / t
        } else {
            0.0
        }
    }

    pub fn prefill_tokens_per_s(&self) -> f64 {
        let t = self.prefill_time.as_secs_f64();
        if t > 0.0 {
            self.prompt_token_ids.len() as f64 / t
        } else {
            0.0
        }
    }
}

/// Generates from `prompt` (token ids), handing text to `on_text` as it is accepted.
pub fn generate(
    model: &Model,
    tok: &Tokenizer,
    prompt: Vec<u32>,
    config: GenerationConfig,
    context_len: usize,
    mut on_text: impl FnMut(&str),
) -> Result<GenerationOutput> {
    generate_reusing(model, tok, prompt, config, context_len, None, |t| {
        on_text(t);
        true
    })
}

/// `generate` starting from the longest prefix of `prompt` that `prefix` holds, and leaving it
/// the keys and values of the prompt and the output for the next call (a conversation's next
/// turn re-sends this one). `None` is plain `generate`. `on_text` returns whether to go on:
/// false ends the generation there (`FinishReason::Cancelled`), with what it has produced.
pub fn generate_reusing(
    model: &Model,
    tok: &Tokenizer,
    prompt: Vec<u32>,
    config: GenerationConfig,
    context_len: usize,
    mut prefix: Option<&mut PrefixCache>,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationOutput> {
    if !config.response_format.is_text() {
        // A schema that does not compile is an error now rather than an empty answer.
        tok.grammar(model.config.vocab_size)?
            .compile(&config.response_format)?;
    }
    let mut seq = Sequence::new(model, prompt, config, context_len)?;
    if let Some(p) = prefix.as_deref_mut() {
        seq.reuse_prefix(p, LOCAL_NAMESPACE);
    }
    while !seq.is_finished() {
        step(model, tok, &mut [&mut seq])?;
        let t = seq.take_new_text();
        if !t.is_empty() && !on_text(&t) {
            seq.cancel();
        }
    }
    if let Some(p) = prefix {
        seq.keep_prefix(p, LOCAL_NAMESPACE);
    }
    Ok(seq.into_output())
}
