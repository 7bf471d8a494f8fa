//! pld's OpenAI-compatible HTTP server: a thin layer over the engine. Requests become sequences in
//! one continuous-batching loop (`scheduler`), which advances every running sequence in the same
//! forward pass with the engine's `step`; the HTTP side (`api`) parses and validates requests,
//! streams text back as Server-Sent Events, and reports errors in OpenAI's shape.

pub mod api;
pub mod metrics;
pub mod scheduler;
pub mod tenant;
/// Function calling lives in the engine (the Python bindings use it too); re-exported here.
pub use engine::tools;

use engine::LoadedModel;
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The name clients use in `model` (the alias or file name it was started with).
    pub model_name: String,
    /// Keys accepted in `Authorization: Bearer KEY` (none: no authentication). Each key is one
    /// tenant: drafts from earlier requests (the corpus source) come only from the same key's.
    pub api_keys: Vec<String>,
    /// Bytes of keys and values the prefix cache may hold across requests (0: off).
    pub prefix_cache_bytes: usize,
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
}

/// Everything the handlers share.
pub struct AppState {
    pub lm: Arc<LoadedModel>,
    pub config: ServerConfig,
    pub scheduler: scheduler::Scheduler,
    pub metrics: Arc<metrics::Metrics>,
    /// Bytes of the tokenizer's longest token (for the prompt-length pre-check).
    pub longest_token_bytes: usize,
}

/// Starts the engine loop and returns the router serving the API.
pub fn app(lm: Arc<LoadedModel>, config: ServerConfig) -> axum::Router {
    let metrics = Arc::new(metrics::Metrics::default());
    let scheduler = scheduler::Scheduler::start(lm.clone(), &config, metrics.clone());
    let state = Arc::new(AppState {
        longest_token_bytes: lm.tokenizer.longest_token_bytes(),
        lm,
        config,
        scheduler,
        metrics,
    });
    api::router(state)
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
        config.model_name,
        listener.local_addr()?
    );
    let router = app(lm, config);
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
