//! `ApiError`: every way a request can fail, answered in OpenAI's shape
//! `{"error": {"message", "type", "param", "code"}}` with its HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An OpenAI-shaped error.
#[derive(Debug)]
pub struct ApiError {
    pub(crate) status: StatusCode,
    message: String,
    /// OpenAI's `type`: `invalid_request_error`, `server_error`, ...
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
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
