//! The streamed answer: Server-Sent Events in OpenAI's chunk shapes. Chat opens with a role
//! chunk per choice; text goes out as it comes; with tools offered, text from the first call on
//! is held back and sent as one `tool_calls` delta once the choice finishes; `[DONE]` ends it
//! (after a usage chunk when asked for).

use super::response::{finish_reason, usage, Meta};
use super::Kind;
use crate::scheduler::Event;
use crate::tools::CallStream;
use axum::response::sse::{Event as SseEvent, Sse};
use engine::FinishReason;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use std::convert::Infallible;
use tokio::sync::mpsc;

type Chunk = Result<SseEvent, Infallible>;

fn data(v: Value) -> Chunk {
    Ok(SseEvent::default().data(v.to_string()))
}

fn done() -> Chunk {
    Ok(SseEvent::default().data("[DONE]"))
}

impl Meta {
    /// A chunk with these choices (and fields after them, such as `usage`).
    fn chunk_of(&self, choices: Value, more: Option<(&str, Value)>) -> Value {
        let mut c = json!({
            "id": self.id, "object": self.kind.chunk_object(), "created": self.created,
            "model": self.model, "choices": choices,
        });
        if let Some((k, v)) = more {
            c[k] = v;
        }
        c
    }

    /// A chunk of one choice: new text (`delta`), its end (`reason`), and for chat the opening
    /// `role`.
    fn chunk(
        &self,
        index: usize,
        delta: Option<&str>,
        reason: Option<&str>,
        role: bool,
        lp: Value,
    ) -> Value {
        let choice = match self.kind {
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
        self.chunk_of(json!([choice]), None)
    }
}

/// What the stream has said so far.
struct Said {
    rx: mpsc::UnboundedReceiver<Event>,
    meta: Meta,
    n: usize,
    include_usage: bool,
    opened: bool,
    done: bool,
    /// Per choice: text sent so far in bytes.
    sent: Vec<usize>,
    /// Per choice, when tools were offered: the text from the first call on, held back.
    calls: Vec<CallStream>,
    finished: usize,
    completion: usize,
}

impl Said {
    fn text(&mut self, index: usize, text: String, lps: Vec<engine::TokenLogprob>) -> Vec<Chunk> {
        let text = if self.meta.tools {
            self.calls[index].push(&text)
        } else {
            text
        };
        if text.is_empty() && (!self.meta.logprobs || lps.is_empty()) {
            return Vec::new();
        }
        let lp = self.meta.logprobs(&lps, self.sent[index]);
        let c = self.meta.chunk(index, Some(&text), None, false, lp);
        self.sent[index] += text.len();
        vec![data(c)]
    }

    /// Choice `index` is done; `cached_tokens` of the request's `prompt_tokens` came from the
    /// prefix cache.
    fn finished(
        &mut self,
        index: usize,
        reason: FinishReason,
        prompt_tokens: usize,
        cached_tokens: usize,
        completion_tokens: usize,
    ) -> Vec<Chunk> {
        let mut out = Vec::new();
        let mut reason = finish_reason(reason);
        if self.meta.tools {
            match self.calls[index].finish(&self.meta.call_ids(index)) {
                Ok(calls) => {
                    let deltas: Vec<Value> = calls
                        .into_iter()
                        .enumerate()
                        .map(|(i, mut c)| {
                            c["index"] = json!(i);
                            c
                        })
                        .collect();
                    let choice = json!([{"index": index, "delta": {"tool_calls": deltas}, "finish_reason": null, "logprobs": null}]);
                    out.push(data(self.meta.chunk_of(choice, None)));
                    reason = "tool_calls";
                }
                Err(held) if !held.is_empty() => {
                    let c = self
                        .meta
                        .chunk(index, Some(&held), None, false, Value::Null);
                    out.push(data(c));
                }
                Err(_) => {}
            }
        }
        let c = self
            .meta
            .chunk(index, None, Some(reason), false, Value::Null);
        out.push(data(c));
        self.finished += 1;
        self.completion += completion_tokens;
        if self.finished == self.n {
            if self.include_usage {
                let u = usage(prompt_tokens, cached_tokens, self.completion);
                out.push(data(self.meta.chunk_of(json!([]), Some(("usage", u)))));
            }
            out.push(done());
            self.done = true;
        }
        out
    }
}

/// Streams the events of a request's `n` choices as they come.
pub(super) fn stream(
    meta: Meta,
    rx: mpsc::UnboundedReceiver<Event>,
    n: usize,
    include_usage: bool,
) -> Sse<impl Stream<Item = Chunk>> {
    let start = Said {
        rx,
        meta,
        n,
        include_usage,
        opened: false,
        done: false,
        sent: vec![0; n],
        calls: (0..n).map(|_| CallStream::default()).collect(),
        finished: 0,
        completion: 0,
    };
    let s = stream::unfold(start, move |mut st| async move {
        if st.done {
            return None;
        }
        if !st.opened && st.meta.kind == Kind::Chat {
            st.opened = true;
            let first: Vec<_> = (0..n)
                .map(|i| data(st.meta.chunk(i, Some(""), None, true, Value::Null)))
                .collect();
            return Some((first, st));
        }
        st.opened = true;
        let out = match st.rx.recv().await? {
            Event::Text {
                index,
                text,
                logprobs,
            } => st.text(index, text, logprobs),
            Event::Finished {
                index,
                reason,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
            } => st.finished(
                index,
                reason,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
            ),
            Event::Failed(m) => {
                let err = json!({"error": {"message": m, "type": "server_error", "param": null, "code": null}});
                st.done = true;
                vec![data(err), done()]
            }
        };
        Some((out, st))
    })
    .flat_map(stream::iter);
    Sse::new(s)
}
