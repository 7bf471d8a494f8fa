//! The HTTP API in OpenAI's shapes: `/v1/models`, `/v1/chat/completions`, `/v1/completions`
//! (streamed as Server-Sent Events when asked), `/health` and `/metrics`.
//!
//! A completion request goes: `auth` (CORS, API key -> `Tenant`), `request` (the body read and
//! its fields checked by name, deserialized once), `validate` (everything checked, the prompt
//! tokenized: a `ValidRequest`), then `respond` here submits it to the scheduler and answers
//! whole (`response`) or streamed (`stream`). Every error is an `ApiError` (`error`).

mod auth;
mod error;
mod request;
mod response;
mod stream;
mod validate;

pub use error::ApiError;

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
use response::Meta;
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

/// Either endpoint: the body read, validated and answered (the status counted).
async fn complete(
    state: Arc<AppState>,
    tenant: Tenant,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Response {
    let result = async {
        let req = request::parse(body, kind, state.config.lenient)?;
        let valid = match kind {
            Kind::Chat => validate::chat(&state, req).await?,
            Kind::Text => validate::text(&state, req).await?,
        };
        Ok(respond(&state, tenant, valid).await)
    }
    .await;
    finish(&state, result)
}

/// Submits the request to the engine loop and answers, streamed or whole.
async fn respond(state: &Arc<AppState>, tenant: Tenant, req: ValidRequest) -> Response {
    let (tx, rx) = mpsc::unbounded_channel();
    let meta = Meta {
        id: request_id(req.kind.id_prefix()),
        created: unix_now(),
        model: state.config.model_name.clone(),
        kind: req.kind,
        lm: state.lm.clone(),
        tools: req.tools,
        logprobs: req.config.logprobs.is_some(),
    };
    let job = Job {
        tenant,
        n: req.n,
        prompt: req.prompt,
        config: req.config,
        events: tx,
        arrived: Instant::now(),
    };
    if let Err(e) = state.scheduler.submit(job, &state.metrics) {
        return match e {
            SubmitError::QueueFull => {
                let mut r = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    "the server is at capacity (the request queue is full); retry later",
                )
                .code("queue_full")
                .into_response();
                r.headers_mut()
                    .insert("retry-after", axum::http::HeaderValue::from_static("1"));
                r
            }
            SubmitError::Stopped => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the engine has stopped",
            )
            .into_response(),
        };
    }
    if req.stream {
        stream::stream(meta, rx, req.n, req.include_usage).into_response()
    } else {
        response::whole(meta, rx, req.n).await
    }
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.model_name,
            "object": "model",
            "created": unix_now(),
            "owned_by": "pld",
            "max_model_len": state.config.max_model_len,
        }],
    }))
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
    no_route(&state, StatusCode::NOT_FOUND, message, "not_found")
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
    )
}

fn no_route(state: &AppState, status: StatusCode, message: String, code: &'static str) -> Response {
    let error = ApiError::new(status, "invalid_request_error", message).code(code);
    finish(state, Err(error))
}

/// The response, its status counted.
fn finish(state: &AppState, result: Result<Response, ApiError>) -> Response {
    let response = match result {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    state.metrics.count_status(response.status().as_u16());
    response
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn request_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "{prefix}-{}-{}",
        unix_now(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
