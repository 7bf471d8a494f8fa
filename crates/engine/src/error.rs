//! Errors the engine reports to its callers. Every variant names the problem in words a user can act on.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("model file not found: {0}")]
    ModelNotFound(PathBuf),
    #[error("cannot read model file {path}: {reason}")]
    BadModelFile { path: PathBuf, reason: String },
    #[error("unsupported model architecture '{name}' (supported: {supported})")]
    UnsupportedArchitecture {
        name: String,
        /// The architectures pld runs, comma-separated.
        supported: &'static str,
    },
    #[error("'{name}' is a mixture-of-experts model that pld does not run yet (mixtures supported: {supported})")]
    UnsupportedMixture {
        name: String,
        /// The mixture families pld runs.
        supported: &'static str,
    },
    #[error("tensor '{name}' has type {dtype}, which pld cannot compute with")]
    UnsupportedTensorType { name: String, dtype: String },
    #[error("model metadata is missing or wrong: {0}")]
    BadMetadata(String),
    #[error("prompt is too long: {prompt_tokens} tokens, but the context holds {context_len} (room must be left for at least one new token)")]
    PromptTooLong {
        prompt_tokens: usize,
        context_len: usize,
    },
    #[error("a {dtype} KV cache cannot hold this model's heads of {head_dim} dimensions (bf16 pairs them, q8_0 takes blocks of 32); use f16 or f32")]
    KvDtypeUnfit {
        dtype: &'static str,
        head_dim: usize,
    },
    #[error("this request's KV cache would need {need} bytes at its longest ({choices} x {positions} positions: the prompt and max_tokens), more than the KV cache budget of {budget} bytes (--kv-cache-bytes); ask for fewer tokens")]
    OverKvBudget {
        need: usize,
        budget: usize,
        positions: usize,
        choices: usize,
    },
    #[error("context is full: {needed} positions needed, the cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("invalid generation settings: {0}")]
    InvalidConfig(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
