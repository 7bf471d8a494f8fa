//! The streamed answer: Server-Sent Events in OpenAI's chunk shapes. Chat opens with a role
//! chunk per choice; text goes out as it comes (the model's reasoning, when it writes it apart,
//! as `delta.reasoning_content`, as vLLM and llama.cpp stream it); with tools offered, text from the first call on
//! is held back and sent as one `tool_calls` delta once the choice finishes; `[DONE]` ends it
//! (after a usage chunk when asked for).

use super::output::{Call, Finish, Outputs, Piece, Usage};
use super::response::{finish_reason, openai_call, Meta};
use super::Kind;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use std::convert::Infallible;

pub(super) type Chunk = Result<SseEvent, Infallible>;

/// While a long prompt is prefilled nothing else is sent: an SSE comment every 10 s keeps
/// clients and proxies with idle timeouts from giving up (SSE readers skip comments).
pub(super) fn keep_alive() -> KeepAlive {
    KeepAlive::new().interval(std::time::Duration::from_secs(10))
}

pub(super) fn data(v: Value) -> Chunk {
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
    outputs: Outputs,
    meta: Meta,
    n: usize,
    include_usage: bool,
    opened: bool,
    done: bool,
    /// Per choice: text sent so far in bytes.
    sent: Vec<usize>,
    completion: usize,
}

impl Said {
    /// Reasoning of chat choice `index`.
    fn reasoning(&self, index: usize, text: String) -> Vec<Chunk> {
        let choice = json!([{"index": index, "delta": {"reasoning_content": text}, "finish_reason": null, "logprobs": null}]);
        vec![data(self.meta.chunk_of(choice, None))]
    }

    fn text(&mut self, index: usize, text: String, lps: Vec<engine::TokenLogprob>) -> Vec<Chunk> {
        let lp = self.meta.logprobs(&lps, self.sent[index]);
        let c = self.meta.chunk(index, Some(&text), None, false, lp);
        self.sent[index] += text.len();
        vec![data(c)]
    }

    /// Choice `index` ended in calls: one `tool_calls` delta with all of them.
    fn calls(&self, index: usize, calls: &[Call]) -> Vec<Chunk> {
        let deltas: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut d = openai_call(c);
                d["index"] = json!(i);
                d
            })
            .collect();
        let choice = json!([{"index": index, "delta": {"tool_calls": deltas}, "finish_reason": null, "logprobs": null}]);
        vec![data(self.meta.chunk_of(choice, None))]
    }

    /// Choice `index` is done; after the last, the usage chunk (when asked for) and `[DONE]`.
    fn finished(&mut self, index: usize, finish: &Finish, usage: Usage) -> Vec<Chunk> {
        let reason = finish_reason(finish);
        let c = self
            .meta
            .chunk(index, None, Some(reason), false, Value::Null);
        let mut out = vec![data(c)];
        self.completion += usage.completion;
        if self.outputs.done() {
            if self.include_usage {
                let u = super::response::usage(usage.prompt, usage.cached, self.completion);
                out.push(data(self.meta.chunk_of(json!([]), Some(("usage", u)))));
            }
            out.push(done());
            self.done = true;
        }
        out
    }

    fn piece(&mut self, piece: Piece) -> Vec<Chunk> {
        match piece {
            Piece::Text {
                index,
                text,
                logprobs,
            } => self.text(index, text, logprobs),
            Piece::Reasoning { index, text } => self.reasoning(index, text),
            Piece::Calls { index, calls } => self.calls(index, &calls),
            Piece::Finished {
                index,
                finish,
                usage,
            } => self.finished(index, &finish, usage),
            Piece::Failed(m) => {
                let err = json!({"error": {"message": m, "type": "server_error", "param": null, "code": null}});
                self.done = true;
                vec![data(err), done()]
            }
        }
    }
}

/// Streams the output of a request's `n` choices as it comes.
pub(super) fn stream(
    meta: Meta,
    outputs: Outputs,
    n: usize,
    include_usage: bool,
) -> Sse<impl Stream<Item = Chunk>> {
    let start = Said {
        outputs,
        meta,
        n,
        include_usage,
        opened: false,
        done: false,
        sent: vec![0; n],
        completion: 0,
    };
    let s = stream::unfold(start, move |mut st| async move {
        if st.done {
            return None;
        }
        if !st.opened && st.meta.kind == Kind::Chat {
            st.opened = true;
            let first: Vec<_> = (0..st.n)
                .map(|i| data(st.meta.chunk(i, Some(""), None, true, Value::Null)))
                .collect();
            return Some((first, st));
        }
        st.opened = true;
        let mut out = Vec::new();
        for piece in st.outputs.next().await? {
            out.extend(st.piece(piece));
        }
        Some((out, st))
    })
    .flat_map(stream::iter);
    Sse::new(s).keep_alive(keep_alive())
}
