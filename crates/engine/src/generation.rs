//! What one generation is asked (`GenerationConfig`) and what it reports (`FinishReason`,
//! `GenerationOutput`): the types the generation loop's modules share (`sequence`, `step`,
//! `generate`), kept apart so that they import it and not each other.
//!
//! Also the settings as a surface gives them (`GenerationSettings`, with `SamplingSettings`
//! under the names every API shares) and `GenerationSettings::config`, the one place their
//! defaults are filled in and their values checked, which the server, the Python package and the
//! CLI all call.

use crate::error::{EngineError, Result};
use crate::grammar::ResponseFormat;
use crate::logprobs::TokenLogprob;
use crate::sampling::{SamplingError, SamplingParams, MAX_CHOICES, MAX_TOP_LOGPROBS};
use crate::stats::SpecStats;
use drafting::{SpecConfig, SpecOverrides};
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
    /// Text the first generated token must begin with (token healing: the prompt's last token
    /// was taken back, so the model writes it again with whatever follows, as one token); the
    /// output begins with it. Only the first token is held to it, and the first token is always
    /// chosen from the prompt's last row, never drafted, so speculation cannot change it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_prefix: Option<String>,
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
            first_token_prefix: None,
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
        check_length(self.max_new_tokens, "max_new_tokens")
            .map_err(|e| EngineError::InvalidConfig(e.message))
    }
}

/// A generation setting out of range: the field, as the caller names it, and what is wrong.
pub type SettingError = SamplingError;

/// The settings of one generation as a surface gives them, each `None` (or empty) for its
/// default: what the server's APIs, the Python package and the CLI fill, under their common
/// names, and turn into a `GenerationConfig` with `config`, the one place they are checked and
/// defaulted.
#[derive(Clone, Debug, Default)]
pub struct GenerationSettings {
    /// New tokens at most; default: all the room left in the context.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingSettings,
    pub stop: Vec<String>,
    /// Alternatives per token when log-probabilities are asked for (at most
    /// `MAX_TOP_LOGPROBS`); `None`: none.
    pub logprobs: Option<usize>,
    pub response_format: ResponseFormat,
    /// The `speculative_config` object, and the speculation settings given at the top level,
    /// merged over the surface's defaults by `SpecConfig::merge`.
    pub speculative_config: Option<SpecOverrides>,
    pub speculation: SpecOverrides,
}

/// The sampling settings under the names every API shares (OpenAI's and vLLM's), each `None` for
/// its default (`DEFAULT_*`, which the CLI's flags and Python's `SamplingParams` show as theirs);
/// the server reads them from every request body as they are.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SamplingSettings {
    /// OpenAI's range, 0 to 2 (0 is greedy).
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// -1 or 0 for off, else positive.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<u64>,
}

impl SamplingSettings {
    /// OpenAI's default.
    pub const DEFAULT_TEMPERATURE: f32 = 1.0;
    /// Off.
    pub const DEFAULT_TOP_P: f32 = 1.0;
    /// Off.
    pub const DEFAULT_TOP_K: i64 = 0;
    /// Off.
    pub const DEFAULT_MIN_P: f32 = 0.0;
    /// Off.
    pub const DEFAULT_REPETITION_PENALTY: f32 = 1.0;

    /// The temperature asked for, else the default.
    pub fn temperature(&self) -> f32 {
        self.temperature.unwrap_or(Self::DEFAULT_TEMPERATURE)
    }

    pub fn top_p(&self) -> f32 {
        self.top_p.unwrap_or(Self::DEFAULT_TOP_P)
    }

    pub fn top_k(&self) -> i64 {
        self.top_k.unwrap_or(Self::DEFAULT_TOP_K)
    }

    pub fn min_p(&self) -> f32 {
        self.min_p.unwrap_or(Self::DEFAULT_MIN_P)
    }

    pub fn repetition_penalty(&self) -> f32 {
        self.repetition_penalty
            .unwrap_or(Self::DEFAULT_REPETITION_PENALTY)
    }
}

impl GenerationSettings {
    /// The checked settings with their defaults, in this order: the length (`room`: the most new
    /// tokens the context leaves, both the default and the cap, `usize::MAX` where the prompt
    /// is not known yet; `length_field`: what the surface calls `max_tokens`), the
    /// log-probabilities, the sampling settings (`SamplingParams::from_request`), the
    /// speculation settings over `speculation` (`SpecConfig::merge`). The output format is taken
    /// as it is: its grammar is compiled by whoever has the tokenizer.
    pub fn config(
        &self,
        speculation: &SpecConfig,
        room: usize,
        length_field: &'static str,
    ) -> Result<GenerationConfig, SettingError> {
        let max_tokens = self.max_tokens.unwrap_or(room);
        check_length(max_tokens, length_field)?;
        if let Some(k) = self.logprobs.filter(|&k| k > MAX_TOP_LOGPROBS) {
            return Err(SettingError {
                field: "logprobs",
                message: format!(
                    "at most {MAX_TOP_LOGPROBS} alternatives per token, asked for {k}"
                ),
            });
        }
        let s = &self.sampling;
        let sampling = SamplingParams::from_request(
            s.temperature(),
            s.top_p(),
            s.top_k(),
            s.min_p(),
            s.repetition_penalty(),
        )?;
        let speculation = speculation
            .merge(self.speculative_config.as_ref(), &self.speculation)
            .map_err(|e| SettingError {
                field: e.field,
                message: e.to_string(),
            })?;
        Ok(GenerationConfig {
            max_new_tokens: max_tokens.min(room),
            sampling,
            seed: s.seed,
            speculation,
            stop: self.stop.clone(),
            logprobs: self.logprobs,
            response_format: self.response_format.clone(),
            first_token_prefix: None,
        })
    }
}

/// A token budget of at least 1, else an error naming `field`.
fn check_length(max_tokens: usize, field: &'static str) -> Result<(), SettingError> {
    if max_tokens == 0 {
        return Err(SettingError {
            field,
            message: format!("{field} must be at least 1"),
        });
    }
    Ok(())
}

/// The number of choices one request asks for (`n`), checked: 1 to `MAX_CHOICES`.
pub fn check_choices(n: usize) -> Result<usize, SettingError> {
    if !(1..=MAX_CHOICES).contains(&n) {
        return Err(SettingError {
            field: "n",
            message: format!("n must be between 1 and {MAX_CHOICES}, got {n}"),
        });
    }
    Ok(n)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(s: &GenerationSettings, room: usize) -> Result<GenerationConfig, SettingError> {
        s.config(&SpecConfig::off(), room, "max_output_tokens")
    }

    /// Nothing given: the whole room, OpenAI's sampling defaults, the surface's speculation.
    #[test]
    fn defaults_fill_the_room() {
        let c = config(&GenerationSettings::default(), 100).unwrap();
        assert_eq!(c.max_new_tokens, 100);
        assert_eq!(
            c.sampling,
            SamplingParams::from_request(1.0, 1.0, 0, 0.0, 1.0).unwrap()
        );
        assert_eq!(c.speculation, SpecConfig::off());
        assert_eq!(c.logprobs, None);
        let unbounded = config(&GenerationSettings::default(), usize::MAX).unwrap();
        assert_eq!(unbounded.max_new_tokens, usize::MAX);
    }

    /// A length beyond the room is cut to it; 0 is refused under the surface's name; the checks
    /// come in order (length, log-probabilities, sampling, speculation).
    #[test]
    fn each_setting_is_checked_once_in_order() {
        let asked = |max_tokens| GenerationSettings {
            max_tokens: Some(max_tokens),
            ..Default::default()
        };
        assert_eq!(config(&asked(500), 100).unwrap().max_new_tokens, 100);
        let e = config(&asked(0), 100).unwrap_err();
        assert_eq!(
            (e.field, e.message.as_str()),
            ("max_output_tokens", "max_output_tokens must be at least 1")
        );
        let mut bad = GenerationSettings {
            max_tokens: Some(0),
            logprobs: Some(MAX_TOP_LOGPROBS + 1),
            sampling: SamplingSettings {
                temperature: Some(3.0),
                ..Default::default()
            },
            speculation: SpecOverrides {
                method: Some("nope".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut fields = Vec::new();
        while let Err(e) = config(&bad, 100) {
            fields.push(e.field);
            match e.field {
                "max_output_tokens" => bad.max_tokens = None,
                "logprobs" => bad.logprobs = None,
                "temperature" => bad.sampling.temperature = None,
                _ => bad.speculation.method = None,
            }
        }
        assert_eq!(
            fields,
            ["max_output_tokens", "logprobs", "temperature", "method"]
        );
        assert_eq!(check_choices(MAX_CHOICES).unwrap(), MAX_CHOICES);
        assert_eq!(check_choices(0).unwrap_err().field, "n");
    }
}
