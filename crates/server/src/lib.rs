//! pld's HTTP server: a thin layer over the engine that speaks OpenAI's chat and text
//! completions, OpenAI's Responses API and Anthropic's Messages API. Requests become sequences in
//! one continuous-batching loop (`scheduler`), which advances every running sequence in the same
//! forward pass with the engine's `step`; the HTTP side (`api`) reads each API's body into one
//! validated request, renders the same engine events in each API's shapes (whole or as
//! Server-Sent Events), and reports errors in the shape of the API they came through.

pub mod api;
pub mod metrics;
pub mod scheduler;
pub mod tenant;
/// Function calling lives in the engine (the Python bindings use it too); re-exported here.
pub use engine::tools;

use engine::{LoadedModel, PrefixCache};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The names clients may use in `model` (the first is the one answers carry when a request
    /// names none); never empty.
    pub model_names: Vec<String>,
    /// Keys accepted in `Authorization: Bearer KEY` (none: no authentication). Each key is one
    /// tenant: drafts from earlier requests (the corpus source) come only from the same key's.
    pub api_keys: Vec<String>,
    /// Bytes of keys and values the prefix cache may hold across requests (0: off).
    pub prefix_cache_bytes: usize,
    /// Bytes the KV caches of the batch (and the spares of ended requests) may reserve together
    /// (`engine::kv_budget`); `None`: derived from the machine's memory
    /// (`kv_budget::default_budget`).
    pub kv_cache_bytes: Option<usize>,
    /// Tokens of earlier prompts and outputs kept per tenant for drafting (0: no corpus).
    pub corpus_tokens: usize,
    pub max_num_seqs: usize,
    /// Requests waiting beyond `max_num_seqs` before new ones get 429.
    pub max_queue: usize,
    pub max_model_len: usize,
    pub max_body_bytes: usize,
    /// Speculation defaults (each request may override them, see `SpecConfig::merge`).
    pub spec: drafting::SpecConfig,
    /// Origins allowed by CORS (`*` for any); empty: no CORS headers.
    pub cors_origins: Vec<String>,
    /// Log and ignore request fields pld cannot honour instead of refusing them.
    pub lenient: bool,
    /// Responses API: stored responses kept per server, at most this many ...
    pub max_stored_responses: usize,
    /// ... and this many bytes (least recently used go first).
    pub stored_responses_bytes: usize,
    /// Write every request body, with its time, API and tenant, to `requests.jsonl` here (for
    /// replaying agent traffic).
    pub record_requests: Option<std::path::PathBuf>,
    /// Keep the lines agents change between requests in their system prompts
    /// (`api::volatile::VOLATILE_LINES`) instead of dropping them before the chat template.
    pub keep_volatile_lines: bool,
    /// Also keep the prefix cache's blocks as files in this directory, so that a restarted
    /// server starts from them ...
    pub prefix_cache_dir: Option<std::path::PathBuf>,
    /// ... holding at most this many bytes (least recently used go first).
    pub prefix_cache_dir_bytes: u64,
}

impl ServerConfig {
    /// The name answers carry when the request named none.
    pub fn model_name(&self) -> &str {
        self.model_names.first().map_or("model", String::as_str)
    }

    /// Whether `name` is one of the served names.
    pub fn serves(&self, name: &str) -> bool {
        self.model_names.iter().any(|n| n == name)
    }
}

/// Stored responses kept by default (`--max-stored-responses`).
pub const DEFAULT_MAX_STORED_RESPONSES: usize = 1000;
/// Bytes of stored responses kept by default (`--stored-responses-bytes`).
pub const DEFAULT_STORED_RESPONSES_BYTES: usize = 64 << 20;

/// Everything the handlers share.
pub struct AppState {
    pub lm: Arc<LoadedModel>,
    pub config: ServerConfig,
    pub scheduler: scheduler::Scheduler,
    pub metrics: Arc<metrics::Metrics>,
    /// The KV caches' memory budget: requests that could never fit are refused (`api::validate`).
    pub budget: engine::KvBudget,
    /// Bytes of the tokenizer's longest token (for the prompt-length pre-check).
    pub longest_token_bytes: usize,
    /// The Responses API's stored responses.
    pub store: std::sync::Mutex<api::ResponseStore>,
    /// Where request bodies are recorded (`--record-requests`).
    pub recorder: Option<api::Recorder>,
}

/// The server's prefix cache: `prefix_cache_bytes` in memory and, with `prefix_cache_dir`, its
/// blocks kept in that directory too (failing when it cannot be opened or is in use).
pub fn prefix_cache(lm: &LoadedModel, config: &ServerConfig) -> anyhow::Result<PrefixCache> {
    let shape = lm.model.kv_shape();
    let per_token = shape.bytes_per_position();
    tracing::info!(
        budget_bytes = config.prefix_cache_bytes,
        bytes_per_token = per_token,
        tokens = config.prefix_cache_bytes / per_token.max(1),
        "prefix cache"
    );
    PrefixCache::open(
        &lm.path,
        shape,
        config.prefix_cache_bytes,
        config.prefix_cache_dir.as_deref(),
        config.prefix_cache_dir_bytes,
    )
}

/// Starts the engine loop and returns the router serving the API (an error when the prefix
/// cache's directory cannot be opened).
pub fn app(lm: Arc<LoadedModel>, config: ServerConfig) -> anyhow::Result<axum::Router> {
    let metrics = Arc::new(metrics::Metrics::default());
    let prefix = prefix_cache(&lm, &config)?;
    let budget =
        engine::kv_budget::for_model(&lm, config.kv_cache_bytes, config.prefix_cache_bytes);
    metrics
        .kv_cache_budget_bytes
        .store(budget.bytes as u64, std::sync::atomic::Ordering::Relaxed);
    let scheduler =
        scheduler::Scheduler::start(lm.clone(), &config, prefix, budget, metrics.clone());
    let recorder = config.record_requests.as_deref().and_then(|dir| {
        api::Recorder::create(dir)
            .map_err(|e| tracing::error!("cannot record requests in {}: {e}", dir.display()))
            .ok()
    });
    let store = api::ResponseStore::new(config.max_stored_responses, config.stored_responses_bytes);
    let state = Arc::new(AppState {
        longest_token_bytes: lm.tokenizer.longest_token_bytes(),
        lm,
        config,
        scheduler,
        metrics,
        budget,
        store: std::sync::Mutex::new(store),
        recorder,
    });
    Ok(api::router(state))
}

/// Serves until the process is stopped.
pub async fn serve(
    lm: Arc<LoadedModel>,
    config: ServerConfig,
    addr: std::net::SocketAddr,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    tracing::info!(
        "serving {} on http://{}",
        config.model_names.join(", "),
        listener.local_addr()?
    );
    let router = app(lm, config)?;
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
