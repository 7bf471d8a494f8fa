//! What runs before any handler: CORS (a preflight is answered before authentication) and the
//! API key, which names the request's `Tenant`. The key comes as `Authorization: Bearer KEY`
//! (OpenAI's clients) or `x-api-key: KEY` (Anthropic's).

use super::error::{ApiError, ErrorShape};
use crate::tenant::Tenant;
use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// CORS for the given origins (`*` for any); none: no CORS headers at all.
pub(super) fn cors_layer(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
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

/// The API key a request carries: `Authorization: Bearer KEY` or `x-api-key: KEY`.
fn given_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim());
    bearer.or_else(|| {
        headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    })
}

/// The error shape of the API a path belongs to.
pub(super) fn shape_of(path: &str) -> ErrorShape {
    if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        ErrorShape::Anthropic
    } else {
        ErrorShape::OpenAi
    }
}

/// Checks the API key against the server's keys (when it has any) and tags the request with the
/// key's tenant; a missing or wrong key is a 401 in the shape of the path's API.
pub(super) async fn authorize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    mut request: Request,
    next: Next,
) -> Response {
    let keys = &state.config.api_keys;
    if !keys.is_empty() {
        let tenant = given_key(&headers).and_then(|g| keys.iter().position(|k| k == g));
        if let Some(t) = tenant {
            request.extensions_mut().insert(Tenant(t));
        } else {
            state.metrics.count_status(401);
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')",
            )
            .code("invalid_api_key")
            .shaped(shape_of(request.uri().path()))
            .into_response();
        }
    } else {
        request.extensions_mut().insert(Tenant(0));
    }
    next.run(request).await
}
