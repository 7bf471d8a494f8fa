//! Chat and text completions answered in OpenAI's shapes: what every answer carries (`Meta`), log-probabilities, usage, and
//! the whole (not streamed) response, built once every choice has finished.

use super::error::ApiError;
use super::output::{Call, Choice, Finish, Outputs};
use super::Kind;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::{LoadedModel, TokenLogprob};
use serde_json::{json, Value};
use std::sync::Arc;

/// What every chunk or answer of one request carries, and what shapes it.
pub(super) struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
    pub lm: Arc<LoadedModel>,
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

/// OpenAI's `finish_reason`.
pub(super) fn finish_reason(f: &Finish) -> &'static str {
    match f {
        Finish::Stop { .. } => "stop",
        // As llama-server reports its limits on OpenAI's routes.
        Finish::Length | Finish::Limit => "length",
        Finish::ToolCalls => "tool_calls",
    }
}

/// One finished choice of a whole response.
fn choice(meta: &Meta, index: usize, c: Choice) -> Value {
    let lp = meta.logprobs(&c.logprobs, 0);
    let reason = finish_reason(&c.finish);
    match meta.kind {
        Kind::Chat => {
            let mut message = json!({"role": "assistant", "content": c.text});
            if !c.calls.is_empty() {
                message["content"] = json!((!c.text.is_empty()).then_some(&c.text));
                message["tool_calls"] = c.calls.iter().map(openai_call).collect();
            }
            if !c.reasoning.is_empty() {
                // As vLLM and llama.cpp name the model's reasoning.
                message["reasoning_content"] = json!(c.reasoning);
            }
            json!({
                "index": index,
                "message": message,
                "finish_reason": reason,
                "logprobs": lp,
            })
        }
        Kind::Text => json!({
            "index": index,
            "text": c.text,
            "finish_reason": reason,
            "logprobs": lp,
        }),
    }
}

/// A call as a chat completion's `tool_calls` entry.
pub(super) fn openai_call(c: &Call) -> Value {
    json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
}

/// Collects every choice, then answers with all of them.
pub(super) async fn whole(meta: Meta, outputs: Outputs) -> Response {
    let choices = match outputs.collect().await {
        Ok(c) => c,
        Err(m) => return ApiError::server(m).into_response(),
    };
    let prompt = choices.first().map_or(0, |c| c.usage.prompt);
    let cached = choices.first().map_or(0, |c| c.usage.cached);
    let completion = choices.iter().map(|c| c.usage.completion).sum();
    let choices: Vec<Value> = choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| choice(&meta, i, c))
        .collect();
    Json(json!({
        "id": meta.id,
        "object": meta.kind.object(),
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage(prompt, cached, completion),
    }))
    .into_response()
}
