//! vLLM's `POST /tokenize` and `POST /detokenize`. `/tokenize` takes a `prompt` string, or chat
//! `messages` (with `tools`, rendered by the chat template as a chat completion would be), and
//! answers `{"count", "max_model_len", "tokens"}` (and `token_strs` when asked);
//! `/detokenize` takes `tokens` and answers `{"prompt"}`.

use super::error::ApiError;
use super::request::{json_body, neutral, read_checked, ChatMessage};
use super::validate::{self, Names};
use super::{finish, Kind};
use crate::tenant::Tenant;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Deserialize)]
struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    tools: Option<Value>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    /// With a `prompt`: the model's BOS in front when it takes one (the default).
    add_special_tokens: Option<bool>,
    #[serde(default)]
    return_token_strs: bool,
}

/// `POST /tokenize`.
pub(super) async fn tokenize(
    State(state): State<Arc<AppState>>,
    Extension(_tenant): Extension<Tenant>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let (req,): (TokenizeRequest,) =
            read_checked(json_body(body)?, &[], neutral, state.config.lenient)?;
        validate::check_model(&state, req.model.as_deref())?;
        let tokens = match (&req.prompt, &req.messages) {
            (Some(_), Some(_)) => {
                return Err(ApiError::bad_request(
                    "give prompt or messages, not both",
                    Some("messages"),
                ))
            }
            (Some(prompt), None) => {
                let names = Names::new("prompt", "max_tokens");
                let text = prompt.clone();
                let mut ids = validate::tokenize(&state, text, names.prompt).await?;
                if req.add_special_tokens == Some(false) {
                    if let Some(bos) = state.lm.tokenizer.bos {
                        if ids.first() == Some(&bos) {
                            ids.remove(0);
                        }
                    }
                }
                ids
            }
            (None, Some(_)) => chat_tokens(&state, &req).await?,
            (None, None) => return Err(super::request::missing("prompt")),
        };
        let mut answer = json!({
            "count": tokens.len(),
            "max_model_len": state.config.max_model_len,
            "tokens": tokens,
        });
        if req.return_token_strs {
            let tok = &state.lm.tokenizer;
            answer["token_strs"] = tokens
                .iter()
                .map(|&t| json!(String::from_utf8_lossy(tok.token_bytes(t))))
                .collect();
        }
        Ok(Json(answer).into_response())
    }
    .await;
    finish(&state, result)
}

/// The tokens of chat messages rendered as a chat completion renders them.
async fn chat_tokens(state: &Arc<AppState>, req: &TokenizeRequest) -> Result<Vec<u32>, ApiError> {
    let end = super::chat::prompt_end(req.add_generation_prompt, req.continue_final_message)?;
    let conv =
        super::chat::conversation_of(req.messages.as_deref(), req.tools.as_ref(), None, end)?;
    let prompt = validate::render(state, &conv, Kind::Chat.names())?;
    validate::tokenize(state, prompt, "messages").await
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<i64>,
}

/// `POST /detokenize`.
pub(super) async fn detokenize(
    State(state): State<Arc<AppState>>,
    Extension(_tenant): Extension<Tenant>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = (|| {
        let (req,): (DetokenizeRequest,) =
            read_checked(json_body(body)?, &[], neutral, state.config.lenient)?;
        validate::check_model(&state, req.model.as_deref())?;
        let vocab = state.lm.model.config.vocab_size;
        let ids = req
            .tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                u32::try_from(t)
                    .ok()
                    .filter(|&t| (t as usize) < vocab)
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            format!("tokens[{i}] = {t} is not a token id (0..{vocab})"),
                            Some(&format!("tokens[{i}]")),
                        )
                    })
            })
            .collect::<Result<Vec<u32>, _>>()?;
        Ok(Json(json!({"prompt": state.lm.tokenizer.decode(&ids)})).into_response())
    })();
    finish(&state, result)
}
