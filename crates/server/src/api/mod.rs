//! The HTTP API: OpenAI's `/v1/chat/completions`, `/v1/completions` and `/v1/responses`,
//! Anthropic's `/v1/messages` (and `count_tokens`), llama-server's `/infill` (fill-in-the-middle,
//! `infill`), vLLM's `/tokenize` and `/detokenize`, and `/v1/models`, `/health`, `/metrics`.
//!
//! Every generating request goes one way: `auth` (CORS, API key -> `Tenant`), the API's reader
//! (`chat`, `responses`, `messages`: the body read and checked by name into the common
//! `Conversation` and `Settings`), `validate` (the prompt rendered and tokenized, every setting
//! checked: a `ValidRequest`), `submit` here (to the scheduler), and the API's renderer over the
//! request's `Outputs` (text, parsed calls and the end, whole or streamed). Every error is an
//! `ApiError`, answered in the shape of the API it came through.

mod auth;
mod chat;
mod error;
mod infill;
mod messages;
mod messages_items;
mod messages_stream;
mod output;
mod record;
mod request;
mod response;
mod responses;
mod responses_items;
mod responses_stream;
mod store;
mod stream;
mod tokenize;
mod validate;
pub mod volatile;

pub use error::{ApiError, ErrorShape};
pub use record::Recorder;
pub use store::ResponseStore;

use crate::scheduler::{Job, SubmitError};
use crate::tenant::Tenant;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use validate::ValidRequest;

pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    let cors = auth::cors_layer(&state.config.cors_origins);
    let router = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/infill", post(infill::infill))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/v1/messages", post(messages::create))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/metrics", get(metrics))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authorize,
        ))
        .route("/health", get(|| async { "ok" }))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state);
    // Outermost: a preflight is answered before authentication.
    match cors {
        Some(c) => router.layer(c),
        None => router,
    }
}

/// The two completion endpoints.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Chat,
    Text,
}

impl Kind {
    /// The request field that holds the prompt.
    fn prompt_field(self) -> &'static str {
        match self {
            Kind::Chat => "messages",
            Kind::Text => "prompt",
        }
    }

    /// The `object` of a whole answer.
    fn object(self) -> &'static str {
        match self {
            Kind::Chat => "chat.completion",
            Kind::Text => "text_completion",
        }
    }

    /// The `object` of a streamed chunk.
    fn chunk_object(self) -> &'static str {
        match self {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        }
    }

    /// The prefix of the request ids.
    fn id_prefix(self) -> &'static str {
        match self {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        }
    }
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(state, tenant, body, Kind::Chat).await
}

async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(state, tenant, body, Kind::Text).await
}

/// Either endpoint: the body recorded, read, validated and answered (the status counted).
async fn complete(
    state: Arc<AppState>,
    tenant: Tenant,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Response {
    let api = match kind {
        Kind::Chat => "chat.completions",
        Kind::Text => "completions",
    };
    record(&state, api, tenant, &body);
    let result = chat::complete(&state, tenant, body, kind).await;
    finish(&state, result)
}

/// Writes the body to the request record, when the server keeps one.
fn record(state: &AppState, api: &str, tenant: Tenant, body: &Result<Bytes, BytesRejection>) {
    if let (Some(r), Ok(b)) = (&state.recorder, body) {
        r.write(api, tenant, b);
    }
}

/// Submits a validated request to the engine loop; the receiver of its events, or the error that
/// it cannot run now (a full queue is a 429 with `retry-after`).
fn submit(
    state: &Arc<AppState>,
    tenant: Tenant,
    req: ValidRequest,
) -> Result<mpsc::UnboundedReceiver<crate::scheduler::Event>, ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        tenant,
        limits: req.limits,
        n: req.n,
        prompt: req.prompt,
        config: req.config,
        events: tx,
        arrived: Instant::now(),
    };
    match state.scheduler.submit(job, &state.metrics) {
        Ok(()) => Ok(rx),
        Err(SubmitError::QueueFull) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "the server is at capacity (the request queue is full); retry later",
        )
        .code("queue_full")),
        Err(SubmitError::Stopped) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the engine has stopped",
        )),
    }
}

/// The model name an answer carries: the one the request named if it is served, else the first.
fn answer_model(state: &AppState, named: Option<&str>) -> String {
    match named {
        Some(m) if state.config.serves(m) => m.to_string(),
        _ => state.config.model_name().to_string(),
    }
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    let data: Vec<Value> = state
        .config
        .model_names
        .iter()
        .map(|name| {
            json!({
                "id": name,
                "object": "model",
                "created": unix_now(),
                "owned_by": "pld",
                "max_model_len": state.config.max_model_len,
            })
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

/// OpenAI-shaped answers for paths and methods the API does not have, counted like the rest.
async fn not_found(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let message = format!("no route for {} {}", request.method(), request.uri().path());
    let path = request.uri().path();
    no_route(&state, StatusCode::NOT_FOUND, message, "not_found", path)
}

async fn method_not_allowed(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let message = format!(
        "method {} is not allowed on {}",
        request.method(),
        request.uri().path()
    );
    no_route(
        &state,
        StatusCode::METHOD_NOT_ALLOWED,
        message,
        "method_not_allowed",
        request.uri().path(),
    )
}

fn no_route(
    state: &AppState,
    status: StatusCode,
    message: String,
    code: &'static str,
    path: &str,
) -> Response {
    let error = ApiError::new(status, "invalid_request_error", message)
        .code(code)
        .shaped(auth::shape_of(path));
    finish(state, Err(error))
}

/// The response, its status counted; a 429 says when to retry.
fn finish(state: &AppState, result: Result<Response, ApiError>) -> Response {
    let mut response = match result {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from_static("1"));
    }
    state.metrics.count_status(response.status().as_u16());
    response
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(super) fn request_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "{prefix}-{}-{}",
        unix_now(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh id with the API's prefix (`resp_`, `msg_`, `toolu_`): the time, a process counter
/// and a random part, so that ids are never reused and hard to guess.
pub(super) fn random_id(prefix: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{prefix}{:016x}{:x}", h.finish(), n)
}
