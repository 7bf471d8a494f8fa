//! A streamed Messages answer: Anthropic's events, each an SSE event of its type:
//! `message_start` (the message with empty content), `ping`, then for each content block
//! `content_block_start`, `content_block_delta` (`thinking_delta` in the `thinking` block of the
//! model's reasoning, `text_delta`, or one `input_json_delta` with a call's whole arguments) and
//! `content_block_stop`, and at the end `message_delta` (the stop
//! reason and output tokens) and `message_stop`. A failure is an `error` event; while
//! nothing else is sent (a long prefill) a `ping` goes out every 10 s.

use super::messages_items::{stop_reason, thinking_block, usage};
use super::output::{Call, Outputs, Piece, Usage};
use super::stream::Chunk;
use axum::response::sse::{Event as SseEvent, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};

struct Said {
    id: String,
    /// The prompt's tokens (how many come from the prefix cache is known at the end).
    prompt_tokens: usize,
    model: String,
    outputs: Outputs,
    started: bool,
    done: bool,
    /// The open thinking block's index.
    thinking: Option<usize>,
    /// The open text block's index.
    text: Option<usize>,
    /// Blocks started so far.
    blocks: usize,
    calls: bool,
}

fn event(kind: &str, mut body: Value) -> Chunk {
    body["type"] = json!(kind);
    Ok(SseEvent::default().event(kind).data(body.to_string()))
}

impl Said {
    fn thinking(&mut self, thinking: String, out: &mut Vec<Chunk>) {
        if thinking.is_empty() {
            return;
        }
        self.close_text(out);
        let index = match self.thinking {
            Some(i) => i,
            None => {
                let index = self.blocks;
                self.blocks += 1;
                self.thinking = Some(index);
                out.push(event(
                    "content_block_start",
                    json!({"index": index, "content_block": thinking_block("")}),
                ));
                index
            }
        };
        out.push(event(
            "content_block_delta",
            json!({"index": index, "delta": {"type": "thinking_delta", "thinking": thinking}}),
        ));
    }

    fn close_thinking(&mut self, out: &mut Vec<Chunk>) {
        if let Some(index) = self.thinking.take() {
            out.push(event("content_block_stop", json!({"index": index})));
        }
    }

    fn open_text(&mut self, out: &mut Vec<Chunk>) -> usize {
        if let Some(i) = self.text {
            return i;
        }
        self.close_thinking(out);
        let index = self.blocks;
        self.blocks += 1;
        self.text = Some(index);
        out.push(event(
            "content_block_start",
            json!({"index": index, "content_block": {"type": "text", "text": ""}}),
        ));
        index
    }

    fn close_text(&mut self, out: &mut Vec<Chunk>) {
        if let Some(index) = self.text.take() {
            out.push(event("content_block_stop", json!({"index": index})));
        }
    }

    fn text(&mut self, text: String, out: &mut Vec<Chunk>) {
        if text.is_empty() {
            return;
        }
        let index = self.open_text(out);
        out.push(event(
            "content_block_delta",
            json!({"index": index, "delta": {"type": "text_delta", "text": text}}),
        ));
    }

    fn calls(&mut self, calls: &[Call], out: &mut Vec<Chunk>) {
        self.close_thinking(out);
        self.close_text(out);
        self.calls = !calls.is_empty();
        for call in calls {
            let index = self.blocks;
            self.blocks += 1;
            out.push(event(
                "content_block_start",
                json!({"index": index, "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}}),
            ));
            let arguments = call.input().to_string();
            out.push(event(
                "content_block_delta",
                json!({"index": index, "delta": {"type": "input_json_delta", "partial_json": arguments}}),
            ));
            out.push(event("content_block_stop", json!({"index": index})));
        }
    }

    fn finished(&mut self, finish: &super::output::Finish, u: Usage, out: &mut Vec<Chunk>) {
        if !self.calls {
            // A text block even when the text is empty, as the whole answer has.
            self.open_text(out);
        }
        self.close_thinking(out);
        self.close_text(out);
        let (reason, sequence) = stop_reason(finish);
        out.push(event(
            "message_delta",
            json!({"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage(&u)}),
        ));
        out.push(event("message_stop", json!({})));
        self.done = true;
    }
}

/// Streams one message's events as its output comes.
pub(super) fn stream(
    id: String,
    model: String,
    prompt_tokens: usize,
    outputs: Outputs,
) -> Sse<impl Stream<Item = Chunk>> {
    let start = Said {
        prompt_tokens,
        id,
        model,
        outputs,
        started: false,
        done: false,
        thinking: None,
        text: None,
        blocks: 0,
        calls: false,
    };
    let s = stream::unfold(start, |mut st| async move {
        if st.done {
            return None;
        }
        let mut out = Vec::new();
        if !st.started {
            st.started = true;
            let message = json!({
                "id": st.id, "type": "message", "role": "assistant", "model": st.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": st.prompt_tokens, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
            });
            out.push(event("message_start", json!({"message": message})));
            out.push(event("ping", json!({})));
            return Some((out, st));
        }
        for piece in st.outputs.next().await? {
            match piece {
                Piece::Text { text, .. } => st.text(text, &mut out),
                Piece::Reasoning { text, .. } => st.thinking(text, &mut out),
                Piece::Calls { calls, .. } => st.calls(&calls, &mut out),
                Piece::Finished { finish, usage, .. } => st.finished(&finish, usage, &mut out),
                Piece::Failed(m) => {
                    out.push(event("error", json!({"error": {"type": "api_error", "message": m}})));
                    st.done = true;
                }
            }
        }
        Some((out, st))
    })
    .flat_map(stream::iter);
    // Anthropic's own keep-alive is a `ping` event.
    let ping = SseEvent::default().event("ping").data(r#"{"type":"ping"}"#);
    Sse::new(s).keep_alive(super::stream::keep_alive().event(ping))
}
