//! `ApiError`: every way a request can fail, with its HTTP status, answered in the shape of the
//! API it came through: OpenAI's `{"error": {"message", "type", "param", "code"}}` (chat and text
//! completions, Responses, the rest) or Anthropic's `{"type": "error", "error": {"type",
//! "message"}}` (Messages). Validation builds one error; the handler picks the shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// The error body's shape: the API the request came through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrorShape {
    #[default]
    OpenAi,
    Anthropic,
}

/// A failed request: status, message, OpenAI's type and code, and the field at fault.
#[derive(Debug)]
pub struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// OpenAI's `type`: `invalid_request_error`, `server_error`, ...
    kind: &'static str,
    pub(crate) param: Option<String>,
    code: Option<&'static str>,
    shape: ErrorShape,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            shape: ErrorShape::OpenAi,
        }
    }

    /// A 400 naming the field at fault (`None`: the body as a whole).
    pub(crate) fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        let e = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        match param {
            Some(p) => e.param(p),
            None => e,
        }
    }

    /// A 404 for something the client named that does not exist (for this API key).
    pub(crate) fn not_found(message: impl Into<String>, param: Option<&str>) -> Self {
        let e = ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", message);
        match param {
            Some(p) => e.param(p),
            None => e,
        }
    }

    /// A 500: the engine failed, not the request.
    pub(crate) fn server(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// A 400 for a prompt longer than the context, naming the prompt's field.
    pub(crate) fn context_length(message: String, field: &str) -> Self {
        ApiError::bad_request(message, Some(field)).code("context_length_exceeded")
    }

    pub(crate) fn param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    pub(crate) fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The same error, to be answered in `shape`.
    pub(crate) fn shaped(mut self, shape: ErrorShape) -> Self {
        self.shape = shape;
        self
    }

    /// The error as OpenAI's `error` object (also what a failed stored response holds).
    pub(crate) fn openai_object(&self) -> serde_json::Value {
        json!({
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        })
    }

    /// The error as Anthropic's body. Anthropic has no `param`, so the field at fault is named
    /// in the message.
    pub(crate) fn anthropic_body(&self) -> serde_json::Value {
        let message = match &self.param {
            Some(p) if !self.message.contains(p.as_str()) => format!("{}: {}", p, self.message),
            _ => self.message.clone(),
        };
        json!({"type": "error", "error": {"type": anthropic_type(self.status), "message": message}})
    }
}

/// Anthropic's error `type` for a status.
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.shape {
            ErrorShape::OpenAi => json!({"error": self.openai_object()}),
            ErrorShape::Anthropic => self.anthropic_body(),
        };
        (self.status, Json(body)).into_response()
    }
}
