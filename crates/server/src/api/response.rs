//! Answers in OpenAI's shapes: what every answer carries (`Meta`), log-probabilities, usage, and
//! the whole (not streamed) response, built once every choice has finished.

use super::error::ApiError;
use super::Kind;
use crate::scheduler::Event;
use crate::tools;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::{FinishReason, LoadedModel, TokenLogprob};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

/// What every chunk or answer of one request carries, and what shapes it.
pub(super) struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
    pub lm: Arc<LoadedModel>,
    /// Tools were offered: the output's calls become `tool_calls`.
    pub tools: bool,
    /// The request asked for log-probabilities.
    pub logprobs: bool,
}

impl Meta {
    /// Log-probabilities in the response's shape: chat's `{"content": [...]}` or the text
    /// completion's parallel lists (`text_offset` counts from `offset`). Null when the request
    /// did not ask for them.
    pub fn logprobs(&self, lps: &[TokenLogprob], offset: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
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

    /// The id prefix of the calls parsed from choice `index`.
    pub fn call_ids(&self, index: usize) -> String {
        format!("call-{}-{index}", self.id)
    }
}

/// OpenAI's usage object; `cached` of the `prompt` tokens came from the prefix cache.
pub(super) fn usage(prompt: usize, cached: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

pub(super) fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        // The server ends a request a client left by dropping it; it never cancels one itself.
        FinishReason::Cancelled => "stop",
    }
}

/// One finished choice of a whole response.
fn choice(meta: &Meta, index: usize, text: String, reason: FinishReason, lp: Value) -> Value {
    let calls = meta
        .tools
        .then(|| tools::parse_calls(&text, &meta.call_ids(index)))
        .flatten();
    match (meta.kind, calls) {
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
    }
}

/// Collects every choice's text, then answers with all of them.
pub(super) async fn whole(
    meta: Meta,
    mut rx: mpsc::UnboundedReceiver<Event>,
    n: usize,
) -> Response {
    let mut texts = vec![String::new(); n];
    let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); n];
    let mut choices: Vec<Option<Value>> = vec![None; n];
    let mut completion = 0;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text {
                index,
                text,
                logprobs,
            } => {
                texts[index].push_str(&text);
                lps[index].extend(logprobs);
            }
            Event::Failed(m) => return ApiError::server(m).into_response(),
            Event::Finished {
                index,
                reason,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
            } => {
                completion += completion_tokens;
                let lp = meta.logprobs(&lps[index], 0);
                let text = std::mem::take(&mut texts[index]);
                choices[index] = Some(choice(&meta, index, text, reason, lp));
                if choices.iter().all(Option::is_some) {
                    return Json(json!({
                        "id": meta.id,
                        "object": meta.kind.object(),
                        "created": meta.created,
                        "model": meta.model,
                        "choices": choices,
                        "usage": usage(prompt_tokens, cached_tokens, completion),
                    }))
                    .into_response();
                }
            }
        }
    }
    ApiError::server("the engine dropped the request").into_response()
}
