//! What one generation is asked (`GenerationConfig`) and what it reports (`FinishReason`,
//! `GenerationOutput`): the types the generation loop's modules share (`sequence`, `step`,
//! `generate`), kept apart so that they import it and not each other.

use crate::error::{EngineError, Result};
use crate::grammar::ResponseFormat;
use crate::logprobs::TokenLogprob;
use crate::sampling::SamplingParams;
use crate::stats::SpecStats;
use drafting::SpecConfig;
use serde::{Deserialize, Serialize};
use std::time::Duration;

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
