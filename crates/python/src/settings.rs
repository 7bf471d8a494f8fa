//! `SamplingParams` as Python gives them (vLLM's names, passed as JSON by `pld/__init__.py`) into
//! the engine's `GenerationConfig`, with the checks every surface makes: a wrong value is an error
//! naming its field. The sampling fields are the engine's `SamplingSettings` as they are, and
//! their defaults the engine's (`defaults`, which `pld/__init__.py` shows as its own).

use engine::{GenerationConfig, GenerationSettings, ResponseFormat, SamplingSettings};
use serde::Deserialize;

/// vLLM's `SamplingParams` fields that pld honours (unknown ones are refused by the Python class;
/// a `#[serde(flatten)]` struct cannot refuse them here).
#[derive(Deserialize)]
pub struct Sampling {
    #[serde(default = "one")]
    pub n: usize,
    /// `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`, `seed`.
    #[serde(flatten)]
    pub sampling: SamplingSettings,
    /// vLLM's default is 16 new tokens; `None` fills the context.
    #[serde(default)]
    pub max_tokens: Option<usize>,
    #[serde(default)]
    pub stop: Vec<String>,
    #[serde(default)]
    pub logprobs: Option<usize>,
    #[serde(default)]
    pub structured_outputs: Option<Structured>,
}

/// vLLM's `StructuredOutputsParams`, the kinds pld supports.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Structured {
    /// A JSON schema (an object, or its text).
    #[serde(default)]
    pub json: Option<serde_json::Value>,
    #[serde(default)]
    pub json_object: Option<bool>,
    /// A grammar: llama.cpp's GBNF (rules `name ::= ...`, start rule `root`) or llguidance's
    /// Lark (start rule `start`), told apart by `::=`.
    #[serde(default)]
    pub grammar: Option<String>,
}

fn one() -> usize {
    1
}

/// The engine's defaults of the settings `LLM` and `SamplingParams` take, as JSON: the sampling
/// settings under their names, `max_num_seqs` and `prefix_cache_dir_bytes`.
pub fn defaults() -> String {
    let s = SamplingSettings::default();
    serde_json::json!({
        "sampling": {
            "temperature": s.temperature(),
            "top_p": s.top_p(),
            "top_k": s.top_k(),
            "min_p": s.min_p(),
            "repetition_penalty": s.repetition_penalty(),
        },
        "max_num_seqs": engine::DEFAULT_MAX_NUM_SEQS,
        "prefix_cache_dir_bytes": engine::DEFAULT_PREFIX_CACHE_DIR_BYTES,
    })
    .to_string()
}

/// A setting out of range: its field and what is wrong.
pub struct FieldError {
    pub field: &'static str,
    pub message: String,
}

fn field(field: &'static str, message: String) -> FieldError {
    FieldError { field, message }
}

impl Sampling {
    pub fn parse(json: &str) -> Result<Sampling, FieldError> {
        serde_json::from_str(json).map_err(|e| field("sampling_params", e.to_string()))
    }

    /// The generation settings, checked and defaulted by the engine
    /// (`GenerationSettings::config`, as the server's); `speculation` is the model's (one per
    /// `LLM`). `max_tokens` absent fills the context.
    pub fn config(
        &self,
        speculation: drafting::SpecConfig,
    ) -> Result<GenerationConfig, FieldError> {
        engine::check_choices(self.n).map_err(|e| field(e.field, e.message))?;
        let settings = GenerationSettings {
            max_tokens: self.max_tokens,
            sampling: self.sampling.clone(),
            stop: self
                .stop
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
            logprobs: self.logprobs,
            ..Default::default()
        };
        let mut config = settings
            .config(&speculation, usize::MAX, "max_tokens")
            .map_err(|e| field(e.field, e.message))?;
        config.response_format = self.response_format()?;
        Ok(config)
    }

    fn response_format(&self) -> Result<ResponseFormat, FieldError> {
        let Some(s) = &self.structured_outputs else {
            return Ok(ResponseFormat::Text);
        };
        let asked = [
            s.json.is_some(),
            s.json_object == Some(true),
            s.grammar.is_some(),
        ];
        if asked.iter().filter(|&&a| a).count() > 1 {
            let m = "give one of structured_outputs.json, json_object and grammar".to_string();
            return Err(field("structured_outputs", m));
        }
        Ok(match (&s.json, s.json_object, &s.grammar) {
            (Some(schema), _, _) => {
                let schema = match schema {
                    serde_json::Value::String(text) => serde_json::from_str(text)
                        .map_err(|e| field("structured_outputs.json", format!("not JSON: {e}")))?,
                    other => other.clone(),
                };
                ResponseFormat::JsonSchema { schema }
            }
            (_, Some(true), _) => ResponseFormat::JsonObject,
            (_, _, Some(grammar)) if grammar.contains("::=") => ResponseFormat::Gbnf {
                grammar: grammar.clone(),
            },
            (_, _, Some(grammar)) => ResponseFormat::Lark {
                grammar: grammar.clone(),
            },
            _ => ResponseFormat::Text,
        })
    }
}
