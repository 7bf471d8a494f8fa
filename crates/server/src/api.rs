//! The HTTP API in OpenAI's shapes: `/v1/models`, `/v1/chat/completions`, `/v1/completions`
//! (streamed as Server-Sent Events when asked), `/health` and `/metrics`. Every error is an
//! OpenAI-shaped body `{"error": {"message", "type", "param", "code"}}` with the right status.

use crate::scheduler::{Event, Job, SubmitError};
use crate::tools::{self, Tools};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use drafting::SpecOverrides;
use engine::{
    FinishReason, GenerationConfig, LoadedModel, Message, PromptEnd, ResponseFormat,
    SamplingParams, TokenLogprob,
};
use futures_util::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    let cors = cors_layer(&state.config.cors_origins);
    let router = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/metrics", get(metrics))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
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

/// CORS for the given origins (`*` for any); none: no CORS headers at all.
fn cors_layer(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list: Vec<axum::http::HeaderValue> =
            origins.iter().filter_map(|o| o.parse().ok()).collect();
        AllowOrigin::list(list)
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods(Any)
            .allow_headers(Any)
            .max_age(std::time::Duration::from_secs(3600)),
    )
}

/// An OpenAI-shaped error.
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
}

impl ApiError {
    fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }});
        (self.status, Json(body)).into_response()
    }
}

/// Who sent a request: the index of its API key (0 for every request when the server has no
/// keys). Per-tenant state (the drafting corpus) is kept apart by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tenant(pub usize);

async fn authorize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    mut request: Request,
    next: Next,
) -> Response {
    let keys = &state.config.api_keys;
    if !keys.is_empty() {
        let given = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, key)| key.trim());
        let tenant = given.and_then(|g| keys.iter().position(|k| k == g));
        if let Some(t) = tenant {
            request.extensions_mut().insert(Tenant(t));
        } else {
            state.metrics.count_status(401);
            return ApiError {
                status: StatusCode::UNAUTHORIZED,
                message: "missing or wrong API key (send 'Authorization: Bearer KEY')".into(),
                kind: "authentication_error",
                param: None,
                code: Some("invalid_api_key"),
            }
            .into_response();
        }
    } else {
        request.extensions_mut().insert(Tenant(0));
    }
    next.run(request).await
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

/// Message content: a string or a list of text parts.
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<Content>,
    /// An assistant turn's calls: `{"id", "type": "function", "function": {"name", "arguments":
    /// <JSON text>}}`.
    tool_calls: Option<Vec<Value>>,
    /// A `tool` turn: the call it answers.
    tool_call_id: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The fields shared by chat and text completions.
#[derive(Deserialize)]
struct Common {
    /// The served model's name; absent or null means the served model (one model per server).
    model: Option<String>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<u64>,
    stop: Option<Stop>,
    n: Option<usize>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    num_speculative_tokens: Option<usize>,
    prompt_lookup_max: Option<usize>,
    prompt_lookup_min: Option<usize>,
    speculative_config: Option<SpecOverrides>,
    /// Chat: true or false (with `top_logprobs`); text completions: the number of alternatives.
    logprobs: Option<Value>,
    top_logprobs: Option<usize>,
    /// `{"type": "text" | "json_object"}` or `{"type": "json_schema", "json_schema": {"schema":
    /// ..., "name": ..., "strict": ...}}`.
    response_format: Option<Value>,
    /// llama.cpp's extensions: a JSON Schema, or a grammar in GBNF.
    json_schema: Option<Value>,
    grammar: Option<String>,
}

/// The most choices one request may ask for (`n`).
const MAX_N: usize = 8;

/// The most alternatives per token a request may ask for (OpenAI's limit).
const MAX_TOP_LOGPROBS: usize = 20;

/// The fields only chat completions have.
#[derive(Deserialize)]
struct ChatFields {
    messages: Vec<ChatMessage>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    /// vLLM's settings for where the prompt ends (see `PromptEnd`).
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
}

impl ChatFields {
    fn prompt_end(&self) -> Result<PromptEnd, ApiError> {
        Ok(
            match (self.add_generation_prompt, self.continue_final_message) {
                (Some(true), Some(true)) => {
                    return Err(ApiError::bad_request(
                        "add_generation_prompt and continue_final_message cannot both be true",
                        Some("continue_final_message"),
                    ))
                }
                (_, Some(true)) => PromptEnd::ContinueLast,
                (Some(false), _) => PromptEnd::AsIs,
                (Some(true), _) => PromptEnd::NextTurn,
                (None, _) => PromptEnd::Auto,
            },
        )
    }
}

/// The fields only text completions have.
#[derive(Deserialize)]
struct TextFields {
    prompt: Value,
}

/// Parses a JSON body and checks its fields (see `check_fields`), turning every way it can be
/// wrong into a 400 (or 413).
fn parse(
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
    lenient: bool,
) -> Result<Value, ApiError> {
    let body = body.map_err(|e| ApiError {
        status: e.status(),
        message: if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "request body is too large".into()
        } else {
            format!("cannot read the request body: {e}")
        },
        kind: "invalid_request_error",
        param: None,
        code: None,
    })?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}"), None))?;
    check_fields(&value, kind, lenient)?;
    Ok(value)
}

/// Reads the fields of `T` from a parsed body; a wrong type names the field at fault.
fn typed<T: serde::de::DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        ApiError::bad_request(
            format!("invalid request: {}", e.into_inner()),
            param.as_deref(),
        )
    })
}

impl Common {
    /// Checks the fields and builds the generation settings (the prompt length is known).
    /// The `logprobs` setting: `None` for none, or the number of alternatives per token.
    fn logprobs(&self, kind: Kind) -> Result<Option<usize>, ApiError> {
        let top = match (kind, &self.logprobs) {
            (_, None | Some(Value::Null)) | (Kind::Chat, Some(Value::Bool(false))) => {
                if self.top_logprobs.is_some_and(|t| t > 0) {
                    return Err(ApiError::bad_request(
                        "top_logprobs requires logprobs to be true",
                        Some("top_logprobs"),
                    ));
                }
                return Ok(None);
            }
            (Kind::Chat, Some(Value::Bool(true))) => self.top_logprobs.unwrap_or(0),
            (Kind::Text, Some(v)) if v.is_u64() => v.as_u64().unwrap_or(0) as usize,
            (Kind::Chat, Some(_)) => {
                return Err(ApiError::bad_request(
                    "logprobs must be a boolean",
                    Some("logprobs"),
                ))
            }
            (Kind::Text, Some(_)) => {
                return Err(ApiError::bad_request(
                    "logprobs must be a non-negative integer",
                    Some("logprobs"),
                ))
            }
        };
        if top > MAX_TOP_LOGPROBS {
            return Err(ApiError::bad_request(
                format!("at most {MAX_TOP_LOGPROBS} alternatives per token, asked for {top}"),
                Some(if kind == Kind::Chat {
                    "top_logprobs"
                } else {
                    "logprobs"
                }),
            ));
        }
        Ok(Some(top))
    }

    /// The output format asked for, from `response_format` or llama.cpp's `json_schema` or
    /// `grammar` (one of them at most), checked by compiling its grammar: one llguidance cannot
    /// compile is a 400 naming the field.
    fn response_format(&self, state: &AppState) -> Result<ResponseFormat, ApiError> {
        let (format, field) = self.format_asked()?;
        if !format.is_text() {
            check_grammar(state, &format, field)?;
        }
        Ok(format)
    }

    /// The format and the field that asked for it.
    fn format_asked(&self) -> Result<(ResponseFormat, &'static str), ApiError> {
        let given = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
        let asked = [
            ("response_format", given(&self.response_format)),
            ("json_schema", given(&self.json_schema)),
            ("grammar", self.grammar.is_some()),
        ];
        let mut named = asked.iter().filter(|(_, on)| *on).map(|(f, _)| *f);
        if let (Some(a), Some(b)) = (named.next(), named.next()) {
            return Err(ApiError::bad_request(
                format!("give one of {a} and {b}, not both"),
                Some(b),
            ));
        }
        if let Some(grammar) = &self.grammar {
            let format = ResponseFormat::Gbnf {
                grammar: grammar.clone(),
            };
            return Ok((format, "grammar"));
        }
        if let Some(schema) = self.json_schema.as_ref().filter(|v| !v.is_null()) {
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(ApiError::bad_request(
                    "json_schema must be a JSON Schema object",
                    Some("json_schema"),
                ));
            }
            let format = ResponseFormat::JsonSchema {
                schema: schema.clone(),
            };
            return Ok((format, "json_schema"));
        }
        let bad = |m: String| ApiError::bad_request(m, Some("response_format"));
        let Some(v) = self.response_format.as_ref().filter(|v| !v.is_null()) else {
            return Ok((ResponseFormat::Text, "response_format"));
        };
        let format = match v.get("type").and_then(Value::as_str) {
            Some("text") => ResponseFormat::Text,
            // llama.cpp's extension: a json_object with its own `schema`.
            Some("json_object") => match v.get("schema") {
                None | Some(Value::Null) => ResponseFormat::JsonObject,
                Some(schema) if schema.is_object() || schema.is_boolean() => {
                    ResponseFormat::JsonSchema {
                        schema: schema.clone(),
                    }
                }
                Some(_) => {
                    return Err(bad(
                        "response_format.schema must be a JSON Schema object".into()
                    ))
                }
            },
            Some("json_schema") => {
                let schema = v
                    .get("json_schema")
                    .and_then(|j| j.get("schema"))
                    .filter(|s| s.is_object() || s.is_boolean())
                    .ok_or_else(|| {
                        bad(
                            "response_format.json_schema.schema must be a JSON Schema object"
                                .into(),
                        )
                    })?;
                ResponseFormat::JsonSchema {
                    schema: schema.clone(),
                }
            }
            other => {
                return Err(bad(format!(
                    "response_format.type must be text, json_object or json_schema, got {}",
                    other.map_or_else(|| "nothing".to_string(), |t| format!("'{t}'"))
                )))
            }
        };
        Ok((format, "response_format"))
    }

    fn config(
        &self,
        state: &AppState,
        prompt_len: usize,
        kind: Kind,
    ) -> Result<GenerationConfig, ApiError> {
        let named = self.model.as_deref();
        if let Some(model) = named.filter(|&m| m != state.config.model_name && m != state.lm.name) {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("The model `{model}` does not exist."),
                kind: "invalid_request_error",
                param: Some("model".into()),
                code: Some("model_not_found"),
            });
        }
        if let Some(n) = self.n {
            if !(1..=MAX_N).contains(&n) {
                return Err(ApiError::bad_request(
                    format!("n must be between 1 and {MAX_N}, got {n}"),
                    Some("n"),
                ));
            }
        }
        let ctx = state.config.max_model_len;
        if prompt_len >= ctx {
            return Err(ApiError {
                status: StatusCode::BAD_REQUEST,
                message: format!(
                    "This model's maximum context length is {ctx} tokens. However, your prompt has {prompt_len} tokens."
                ),
                kind: "invalid_request_error",
                param: Some(kind.prompt_field().into()),
                code: Some("context_length_exceeded"),
            });
        }
        let room = ctx - prompt_len;
        let max_tokens = self
            .max_completion_tokens
            .or(self.max_tokens)
            .unwrap_or(room);
        if max_tokens == 0 {
            return Err(ApiError::bad_request(
                "max_tokens must be at least 1",
                Some("max_tokens"),
            ));
        }
        let temperature = self.temperature.unwrap_or(1.0);
        // OpenAI's range; the engine itself takes any temperature >= 0.
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::bad_request(
                format!("temperature must be between 0 and 2, got {temperature}"),
                Some("temperature"),
            ));
        }
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::bad_request(
                    format!("top_k must be -1, 0 or positive, got {k}"),
                    Some("top_k"),
                ))
            }
        };
        let sampling = SamplingParams {
            do_sample: temperature > 0.0,
            temperature,
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
        };
        sampling
            .validate()
            .map_err(|e| ApiError::bad_request(e.message, Some(e.field)))?;
        let top_level = SpecOverrides {
            num_speculative_tokens: self.num_speculative_tokens,
            prompt_lookup_max: self.prompt_lookup_max,
            prompt_lookup_min: self.prompt_lookup_min,
            ..Default::default()
        };
        let speculation = state
            .config
            .spec
            .merge(self.speculative_config.as_ref(), &top_level)
            .map_err(|e| ApiError::bad_request(e.to_string(), Some(e.field)))?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        let config = GenerationConfig {
            max_new_tokens: max_tokens.min(room),
            sampling,
            seed: self.seed,
            speculation,
            stop,
            logprobs: self.logprobs(kind)?,
            response_format: self.response_format(state)?,
        };
        config
            .validate()
            .map_err(|e| ApiError::bad_request(e.to_string(), None))?;
        Ok(config)
    }
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let value = parse(body, Kind::Chat, state.config.lenient)?;
        let common: Common = typed(&value)?;
        let req: ChatFields = typed(&value)?;
        if req.messages.is_empty() {
            return Err(ApiError::bad_request(
                "messages must not be empty",
                Some("messages"),
            ));
        }
        let mut messages = Vec::with_capacity(req.messages.len());
        for (i, m) in req.messages.iter().enumerate() {
            if !["system", "developer", "user", "assistant", "tool"].contains(&m.role.as_str()) {
                return Err(ApiError::bad_request(
                    format!(
                        "messages[{i}].role '{}' is not supported (system, developer, user, assistant, tool)",
                        m.role
                    ),
                    Some(&format!("messages[{i}].role")),
                ));
            }
            // Chat templates know `system`; `developer` is OpenAI's newer name for it.
            let role = if m.role == "developer" { "system" } else { &m.role };
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut s = String::new();
                    for p in parts {
                        if p.kind != "text" {
                            return Err(ApiError::bad_request(
                                format!("content part type '{}' is not supported", p.kind),
                                Some("messages"),
                            ));
                        }
                        s.push_str(p.text.as_deref().unwrap_or(""));
                    }
                    s
                }
            };
            let mut message = Message::new(role, &content);
            if let Some(calls) = &m.tool_calls {
                message.tool_calls = Some(template_calls(calls, i)?);
            }
            message.tool_call_id = m.tool_call_id.clone();
            message.name = m.name.clone();
            messages.push(message);
        }
        let tools = Tools::parse(req.tools.as_ref(), req.tool_choice.as_ref())
            .map_err(|(m, p)| ApiError::bad_request(m, Some(&p)))?;
        let offered = tools.as_ref().map_or(&[][..], |t| t.offered());
        let prompt = state
            .lm
            .render_chat_ending(&messages, offered, req.prompt_end()?)
            .map_err(|e| {
                let param = if offered.is_empty() { "messages" } else { "tools" };
                ApiError::bad_request(e.to_string(), Some(param))
            })?;
        let ids = tokenize(&state, prompt, Kind::Chat).await?;
        let mut config = common.config(&state, ids.len(), Kind::Chat)?;
        if let Some(grammar) = tools.as_ref().and_then(|t| t.forced_grammar()) {
            if !config.response_format.is_text() {
                return Err(ApiError::bad_request(
                    "tool_choice that forces a call cannot be combined with a response_format",
                    Some("tool_choice"),
                ));
            }
            let format = ResponseFormat::Lark { grammar };
            check_grammar(&state, &format, "tools")?;
            config.response_format = format;
        }
        let calls = !offered.is_empty();
        Ok(respond(&state, tenant, ids, config, &common, Kind::Chat, calls).await)
    }
    .await;
    finish(&state, result)
}

/// Compiles the grammar of `format` once to check it; a failure is a 400 naming `param`.
fn check_grammar(state: &AppState, format: &ResponseFormat, param: &str) -> Result<(), ApiError> {
    let vocab = state.lm.model.config.vocab_size;
    state
        .lm
        .tokenizer
        .grammar(vocab)
        .and_then(|g| g.compile(format))
        .map(|_| ())
        .map_err(|e| ApiError::bad_request(e.to_string(), Some(param)))
}

/// An assistant turn's `tool_calls` as chat templates take them: the arguments (JSON text in
/// OpenAI's format) as an object.
fn template_calls(calls: &[Value], message: usize) -> Result<Vec<Value>, ApiError> {
    calls
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let param = format!("messages[{message}].tool_calls[{j}]");
            let f = c
                .get("function")
                .filter(|f| f["name"].is_string())
                .ok_or_else(|| {
                    ApiError::bad_request(format!("{param} needs function.name"), Some(&param))
                })?;
            let arguments = match f.get("arguments") {
                Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
                    ApiError::bad_request(
                        format!("{param}.function.arguments is not JSON: {e}"),
                        Some(&param),
                    )
                })?,
                Some(v) => v.clone(),
                None => json!({}),
            };
            Ok(json!({
                "id": c.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {"name": f["name"], "arguments": arguments},
            }))
        })
        .collect()
}

async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let value = parse(body, Kind::Text, state.config.lenient)?;
        let common: Common = typed(&value)?;
        let req: TextFields = typed(&value)?;
        let prompt = match &req.prompt {
            Value::String(s) => s.clone(),
            Value::Array(a) if a.len() == 1 && a[0].is_string() => {
                a[0].as_str().unwrap_or("").to_string()
            }
            _ => {
                return Err(ApiError::bad_request(
                    "prompt must be a string (or a list of one string)",
                    Some("prompt"),
                ))
            }
        };
        let ids = tokenize(&state, prompt, Kind::Text).await?;
        if ids.is_empty() {
            return Err(ApiError::bad_request(
                "prompt must not be empty",
                Some("prompt"),
            ));
        }
        let config = common.config(&state, ids.len(), Kind::Text)?;
        Ok(respond(&state, tenant, ids, config, &common, Kind::Text, false).await)
    }
    .await;
    finish(&state, result)
}

/// Tokenizes a prompt off the async workers (a multi-megabyte prompt takes a while), after
/// refusing one whose byte length alone proves it longer than the context: no token is longer
/// than the tokenizer's longest piece.
async fn tokenize(state: &Arc<AppState>, prompt: String, kind: Kind) -> Result<Vec<u32>, ApiError> {
    let ctx = state.config.max_model_len;
    let longest = state.longest_token_bytes.max(1);
    let fewest_tokens = prompt.len() / longest;
    if fewest_tokens >= ctx {
        return Err(ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!(
                "This model's maximum context length is {ctx} tokens. However, your prompt has at least {fewest_tokens} tokens ({} bytes).",
                prompt.len()
            ),
            kind: "invalid_request_error",
            param: Some(kind.prompt_field().into()),
            code: Some("context_length_exceeded"),
        });
    }
    let lm = state.lm.clone();
    tokio::task::spawn_blocking(move || lm.tokenizer.encode_prompt(&prompt))
        .await
        .map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("tokenizing failed: {e}"),
            kind: "server_error",
            param: None,
            code: None,
        })?
        .map_err(|e| ApiError::bad_request(e.to_string(), Some(kind.prompt_field())))
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
    let error = ApiError {
        status,
        message,
        kind: "invalid_request_error",
        param: None,
        code: Some(code),
    };
    finish(state, Err(error))
}

fn finish(state: &AppState, result: Result<Response, ApiError>) -> Response {
    let response = match result {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    state.metrics.count_status(response.status().as_u16());
    response
}

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

    /// The fields of this endpoint's requests that pld reads.
    fn fields(self) -> &'static [&'static str] {
        match self {
            Kind::Chat => &[
                "messages",
                "tools",
                "tool_choice",
                "add_generation_prompt",
                "continue_final_message",
            ],
            Kind::Text => &["prompt"],
        }
    }
}

/// Fields read by both endpoints.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "num_speculative_tokens",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "speculative_config",
    "logprobs",
    "top_logprobs",
    "response_format",
    "json_schema",
    "grammar",
];

/// OpenAI fields accepted only with the value that changes nothing (what pld does anyway);
/// any other value is refused rather than silently ignored.
fn neutral(field: &str, v: &Value) -> Option<bool> {
    let empty = |v: &Value| {
        v.is_null()
            || v.as_object().is_some_and(|o| o.is_empty())
            || v.as_array().is_some_and(|a| a.is_empty())
    };
    Some(match field {
        "user" => v.is_string() || v.is_null(),
        "frequency_penalty" | "presence_penalty" => v.is_null() || v.as_f64() == Some(0.0),
        "logit_bias" | "metadata" => empty(v),
        "parallel_tool_calls" | "store" => v.is_null() || v.is_boolean(),
        "echo" => v.is_null() || v.as_bool() == Some(false),
        "suffix" => v.is_null(),
        "best_of" => v.is_null() || v.as_u64() == Some(1),
        _ => return None,
    })
}

/// Checks every top-level field of a request: fields pld reads pass; OpenAI fields whose value
/// pld cannot honour, and unknown fields, are a 400 naming the field, unless the server is
/// lenient, in which case they are logged and ignored.
fn check_fields(body: &Value, kind: Kind, lenient: bool) -> Result<(), ApiError> {
    let Some(object) = body.as_object() else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
            None,
        ));
    };
    for (name, value) in object {
        if COMMON_FIELDS.contains(&name.as_str()) || kind.fields().contains(&name.as_str()) {
            continue;
        }
        let problem = match neutral(name, value) {
            Some(true) => continue,
            Some(false) => format!("'{name}' is not supported with this value ({value})"),
            None => format!("Unrecognized request argument supplied: {name}"),
        };
        if lenient {
            tracing::warn!(field = %name, "ignored: {problem}");
            continue;
        }
        return Err(ApiError::bad_request(problem, Some(name)));
    }
    Ok(())
}

fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// Submits the request to the engine loop and answers, streamed or whole.
async fn respond(
    state: &Arc<AppState>,
    tenant: Tenant,
    ids: Vec<u32>,
    config: GenerationConfig,
    common: &Common,
    kind: Kind,
    tools: bool,
) -> Response {
    let config_logprobs = config.logprobs.is_some();
    let (tx, rx) = mpsc::unbounded_channel();
    let n = common.n.unwrap_or(1);
    let job = Job {
        tenant,
        n,
        prompt: ids,
        config,
        events: tx,
        arrived: Instant::now(),
    };
    if let Err(e) = state.scheduler.submit(job, &state.metrics) {
        return match e {
            SubmitError::QueueFull => {
                let mut r = ApiError {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    message: "the server is at capacity (the request queue is full); retry later"
                        .into(),
                    kind: "rate_limit_error",
                    param: None,
                    code: Some("queue_full"),
                }
                .into_response();
                r.headers_mut()
                    .insert("retry-after", axum::http::HeaderValue::from_static("1"));
                return r;
            }
            SubmitError::Stopped => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "the engine has stopped".into(),
                kind: "server_error",
                param: None,
                code: None,
            },
        }
        .into_response();
    }
    let (prefix, object) = match kind {
        Kind::Chat => ("chatcmpl", "chat.completion"),
        Kind::Text => ("cmpl", "text_completion"),
    };
    let meta = Meta {
        id: request_id(prefix),
        created: unix_now(),
        model: state.config.model_name.clone(),
        object,
        kind,
        lm: state.lm.clone(),
        tools,
    };
    let logprobs = config_logprobs;
    if common.stream {
        let usage = common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage);
        stream_response(meta, rx, n, usage, logprobs).into_response()
    } else {
        whole_response(meta, rx, n, logprobs).await
    }
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    object: &'static str,
    kind: Kind,
    lm: Arc<LoadedModel>,
    /// Tools were offered: the output's calls become `tool_calls`.
    tools: bool,
}

impl Meta {
    /// Log-probabilities in the response's shape: chat's `{"content": [...]}` or the text
    /// completion's parallel lists (`text_offset` counts from `offset`). `None` when the request
    /// did not ask for them.
    fn logprobs(&self, lps: Option<&[TokenLogprob]>, offset: usize) -> Value {
        let Some(lps) = lps else {
            return Value::Null;
        };
        let tok = &self.lm.tokenizer;
        let text = |id: u32| String::from_utf8_lossy(tok.token_bytes(id)).into_owned();
        match self.kind {
            Kind::Chat => {
                let entry = |id: u32, lp: f32| json!({"token": text(id), "logprob": lp, "bytes": tok.token_bytes(id)});
                let content: Vec<Value> = lps
                    .iter()
                    .map(|l| {
                        let mut e = entry(l.token, l.logprob);
                        e["top_logprobs"] = l.top.iter().map(|&(t, p)| entry(t, p)).collect();
                        e
                    })
                    .collect();
                json!({ "content": content })
            }
            Kind::Text => {
                let tokens: Vec<String> = lps.iter().map(|l| text(l.token)).collect();
                let offsets: Vec<usize> = tokens
                    .iter()
                    .scan(offset, |at, t| {
                        let start = *at;
                        *at += t.len();
                        Some(start)
                    })
                    .collect();
                json!({
                    "tokens": tokens,
                    "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                    "top_logprobs": lps
                        .iter()
                        .map(|l| l.top.iter().map(|&(t, p)| (text(t), json!(p))).collect::<serde_json::Map<_, _>>())
                        .collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

async fn whole_response(
    meta: Meta,
    mut rx: mpsc::UnboundedReceiver<Event>,
    n: usize,
    logprobs: bool,
) -> Response {
    let mut texts = vec![String::new(); n];
    let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    let mut choices: Vec<Option<Value>> = vec![None; n];
    let mut completion = 0;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text {
                index,
                text: t,
                logprobs,
            } => {
                texts[index].push_str(&t);
                lps[index].extend(logprobs);
            }
            Event::Failed(m) => {
                return ApiError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    message: m,
                    kind: "server_error",
                    param: None,
                    code: None,
                }
                .into_response()
            }
            Event::Finished {
                index,
                reason,
                prompt_tokens,
                completion_tokens,
            } => {
                completion += completion_tokens;
                let lp = meta.logprobs(logprobs.then_some(&lps[index][..]), 0);
                let text = std::mem::take(&mut texts[index]);
                let calls = meta
                    .tools
                    .then(|| tools::parse_calls(&text, &format!("call-{}-{index}", meta.id)))
                    .flatten();
                choices[index] = Some(match (meta.kind, calls) {
                    (Kind::Chat, Some((content, calls))) => json!({
                        "index": index,
                        "message": {"role": "assistant", "content": content, "tool_calls": calls},
                        "finish_reason": "tool_calls",
                        "logprobs": lp,
                    }),
                    (Kind::Chat, None) => json!({
                        "index": index,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": finish_reason(reason),
                        "logprobs": lp,
                    }),
                    (Kind::Text, _) => json!({
                        "index": index,
                        "text": text,
                        "finish_reason": finish_reason(reason),
                        "logprobs": lp,
                    }),
                });
                if choices.iter().all(Option::is_some) {
                    return Json(json!({
                        "id": meta.id,
                        "object": meta.object,
                        "created": meta.created,
                        "model": meta.model,
                        "choices": choices,
                        "usage": usage(prompt_tokens, completion),
                    }))
                    .into_response();
                }
            }
        }
    }
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message: "the engine dropped the request".into(),
        kind: "server_error",
        param: None,
        code: None,
    }
    .into_response()
}

fn stream_response(
    meta: Meta,
    rx: mpsc::UnboundedReceiver<Event>,
    n: usize,
    include_usage: bool,
    logprobs: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let object = match meta.kind {
        Kind::Chat => "chat.completion.chunk",
        Kind::Text => "text_completion",
    };
    let chunk = move |meta: &Meta,
                      index: usize,
                      delta: Option<&str>,
                      reason: Option<&str>,
                      role: bool,
                      lp: Value|
          -> Value {
        let choice = match meta.kind {
            Kind::Chat => {
                let mut d = serde_json::Map::new();
                if role {
                    d.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = delta {
                    d.insert("content".into(), json!(t));
                }
                json!({"index": index, "delta": d, "finish_reason": reason, "logprobs": lp})
            }
            Kind::Text => {
                json!({"index": index, "text": delta.unwrap_or(""), "finish_reason": reason, "logprobs": lp})
            }
        };
        json!({"id": meta.id, "object": object, "created": meta.created, "model": meta.model, "choices": [choice]})
    };
    // What the stream has said so far.
    struct State {
        rx: mpsc::UnboundedReceiver<Event>,
        meta: Meta,
        opened: bool,
        done: bool,
        /// Per choice: text sent so far in bytes.
        sent: Vec<usize>,
        /// Per choice, when tools were offered: the text from the first call on, held back.
        calls: Vec<tools::CallStream>,
        finished: usize,
        completion: usize,
    }
    let start = State {
        rx,
        meta,
        opened: false,
        done: false,
        sent: vec![0; n],
        calls: (0..n).map(|_| tools::CallStream::default()).collect(),
        finished: 0,
        completion: 0,
    };
    let s = stream::unfold(start, move |mut st| async move {
        if st.done {
            return None;
        }
        let data = |v: Value| Ok::<_, Infallible>(SseEvent::default().data(v.to_string()));
        if !st.opened && st.meta.kind == Kind::Chat {
            st.opened = true;
            let first: Vec<_> = (0..n)
                .map(|i| data(chunk(&st.meta, i, Some(""), None, true, Value::Null)))
                .collect();
            return Some((first, st));
        }
        st.opened = true;
        match st.rx.recv().await {
            Some(Event::Text { index, text, logprobs: lps }) => {
                let text = if st.meta.tools { st.calls[index].push(&text) } else { text };
                if text.is_empty() && (!logprobs || lps.is_empty()) {
                    return Some((Vec::new(), st));
                }
                let lp = st.meta.logprobs(logprobs.then_some(&lps[..]), st.sent[index]);
                let c = chunk(&st.meta, index, Some(&text), None, false, lp);
                st.sent[index] += text.len();
                Some((vec![data(c)], st))
            }
            Some(Event::Finished { index, reason, prompt_tokens, completion_tokens }) => {
                let mut out = Vec::new();
                let mut reason = finish_reason(reason);
                if st.meta.tools {
                    match st.calls[index].finish(&format!("call-{}-{index}", st.meta.id)) {
                        Ok(calls) => {
                            let deltas: Vec<Value> = calls
                                .into_iter()
                                .enumerate()
                                .map(|(i, mut c)| {
                                    c["index"] = json!(i);
                                    c
                                })
                                .collect();
                            let m = &st.meta;
                            out.push(data(json!({
                                "id": m.id, "object": object, "created": m.created, "model": m.model,
                                "choices": [{"index": index, "delta": {"tool_calls": deltas}, "finish_reason": null, "logprobs": null}],
                            })));
                            reason = "tool_calls";
                        }
                        Err(held) if !held.is_empty() => {
                            out.push(data(chunk(&st.meta, index, Some(&held), None, false, Value::Null)));
                        }
                        Err(_) => {}
                    }
                }
                out.push(data(chunk(&st.meta, index, None, Some(reason), false, Value::Null)));
                st.finished += 1;
                st.completion += completion_tokens;
                if st.finished == n {
                    if include_usage {
                        let m = &st.meta;
                        out.push(data(json!({
                            "id": m.id, "object": object, "created": m.created, "model": m.model,
                            "choices": [], "usage": usage(prompt_tokens, st.completion),
                        })));
                    }
                    out.push(Ok(SseEvent::default().data("[DONE]")));
                    st.done = true;
                }
                Some((out, st))
            }
            Some(Event::Failed(m)) => {
                let err = json!({"error": {"message": m, "type": "server_error", "param": null, "code": null}});
                st.done = true;
                Some((vec![data(err), Ok(SseEvent::default().data("[DONE]"))], st))
            }
            None => None,
        }
    })
    .flat_map(stream::iter);
    Sse::new(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// JSON values whose object keys are mostly the request's own fields, so that the typed
    /// reading is reached with wrong types, nesting and values.
    fn request_like() -> impl Strategy<Value = Value> {
        let keys: Vec<&'static str> = COMMON_FIELDS
            .iter()
            .copied()
            .chain([
                "messages",
                "prompt",
                "role",
                "content",
                "logit_bias",
                "tools",
                "x",
            ])
            .collect();
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            "[a-z ]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            let keys = keys.clone();
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::vec((proptest::sample::select(keys), inner), 0..6).prop_map(
                    |kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                ),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Any body is read into a request or refused with a 400; nothing panics.
        #[test]
        fn any_body_is_read_or_refused(v in request_like(), chat in any::<bool>(), lenient in any::<bool>()) {
            let kind = if chat { Kind::Chat } else { Kind::Text };
            let bytes = Bytes::from(serde_json::to_vec(&v).unwrap());
            match parse(Ok(bytes), kind, lenient) {
                Ok(value) => {
                    if let Ok(common) = typed::<Common>(&value) {
                        let _ = common.logprobs(kind);
                    }
                    let _ = typed::<ChatFields>(&value);
                    let _ = typed::<TextFields>(&value);
                }
                Err(e) => prop_assert_eq!(e.status, StatusCode::BAD_REQUEST),
            }
        }

        #[test]
        fn any_bytes_are_read_or_refused(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Err(e) = parse(Ok(Bytes::from(raw)), Kind::Chat, false) {
                prop_assert_eq!(e.status, StatusCode::BAD_REQUEST);
            }
        }
    }
}
