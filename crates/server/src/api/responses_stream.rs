//! A streamed Responses answer: the typed Server-Sent Events OpenAI documents, each with its
//! `sequence_number`, in order: `response.created`, `response.in_progress`; for the model's
//! reasoning (when it writes it apart), the reasoning item (`response.output_item.added`,
//! `response.content_part.added`, `response.reasoning_text.delta`...,
//! `response.reasoning_text.done`, `response.content_part.done`, `response.output_item.done`);
//! for the text, the message item (`response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`..., `response.output_text.done`, `response.content_part.done`,
//! `response.output_item.done`); for each call, its `function_call` item
//! (`response.output_item.added`, `response.function_call_arguments.delta` and `.done`,
//! `response.output_item.done`); then `response.completed` (or `response.incomplete` at the
//! output cap, `response.failed` if the engine failed) with the whole response, which is then
//! stored when the request asked.

use super::output::{Call, Choice, Finish, Outputs, Piece};
use super::responses_items::{
    call_item, call_item_id, keep, message_id, message_item, reasoning_id, reasoning_item,
    reasoning_part, response_object, text_part, Echo,
};
use super::stream::Chunk;
use crate::tenant::Tenant;
use crate::AppState;
use axum::response::sse::{Event as SseEvent, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use std::sync::Arc;

/// What the stream has said so far.
struct Said {
    state: Arc<AppState>,
    tenant: Tenant,
    echo: Echo,
    outputs: Outputs,
    sequence: u64,
    started: bool,
    done: bool,
    /// The reasoning item is open (its text so far).
    reasoning: Option<String>,
    /// The message item is open (its text so far).
    text: Option<String>,
    /// Output items sent so far.
    items: usize,
    /// The output as it will be stored.
    choice: Choice,
}

impl Said {
    fn event(&mut self, kind: &str, mut body: Value) -> Chunk {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        Ok(SseEvent::default().event(kind).data(body.to_string()))
    }

    fn reasoning(&mut self, delta: String, out: &mut Vec<Chunk>) {
        if delta.is_empty() {
            return;
        }
        self.close_text(out);
        let (id, index) = (reasoning_id(&self.echo), self.items);
        if self.reasoning.is_none() {
            self.reasoning = Some(String::new());
            let item = reasoning_item(&self.echo, "", "in_progress");
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ));
            out.push(self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": reasoning_part("")}),
            ));
        }
        self.choice.reasoning.push_str(&delta);
        if let Some(r) = &mut self.reasoning {
            r.push_str(&delta);
        }
        out.push(self.event(
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta}),
        ));
    }

    fn close_reasoning(&mut self, out: &mut Vec<Chunk>) {
        let Some(text) = self.reasoning.take() else {
            return;
        };
        let (id, index) = (reasoning_id(&self.echo), self.items);
        out.push(self.event(
            "response.reasoning_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
        ));
        out.push(self.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": reasoning_part(&text)}),
        ));
        let item = reasoning_item(&self.echo, &text, "completed");
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.items += 1;
    }

    fn open_text(&mut self, out: &mut Vec<Chunk>) {
        if self.text.is_some() {
            return;
        }
        self.close_reasoning(out);
        self.text = Some(String::new());
        let item = message_item(&self.echo, "", "in_progress");
        let index = self.items;
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        let id = message_id(&self.echo);
        out.push(self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part("")}),
        ));
    }

    fn close_text(&mut self, out: &mut Vec<Chunk>) {
        let Some(text) = self.text.take() else {
            return;
        };
        let (id, index) = (message_id(&self.echo), self.items);
        out.push(self.event(
            "response.output_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
        ));
        out.push(self.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part(&text)}),
        ));
        let item = message_item(&self.echo, &text, "completed");
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.items += 1;
    }

    fn text(&mut self, delta: String, out: &mut Vec<Chunk>) {
        if delta.is_empty() {
            return;
        }
        self.open_text(out);
        self.choice.text.push_str(&delta);
        if let Some(t) = &mut self.text {
            t.push_str(&delta);
        }
        let (id, index) = (message_id(&self.echo), self.items);
        out.push(self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []}),
        ));
    }

    fn calls(&mut self, calls: Vec<Call>, out: &mut Vec<Chunk>) {
        self.close_reasoning(out);
        self.close_text(out);
        for call in &calls {
            let (id, index) = (call_item_id(call), self.items);
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": call_item(call, "in_progress")}),
            ));
            out.push(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": call.arguments}),
            ));
            out.push(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "name": call.name, "arguments": call.arguments}),
            ));
            out.push(self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": call_item(call, "completed")}),
            ));
            self.items += 1;
        }
        self.choice.calls = calls;
    }

    fn finished(&mut self, choice_end: (Finish, super::output::Usage), out: &mut Vec<Chunk>) {
        if self.choice.calls.is_empty() {
            // A message item even when the text is empty, as the whole answer has.
            self.open_text(out);
        }
        self.close_reasoning(out);
        self.close_text(out);
        (self.choice.finish, self.choice.usage) = choice_end;
        let response = response_object(&self.echo, Some(&self.choice), "completed");
        let kind = if response["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        keep(&self.state, self.tenant, &self.echo, &response);
        out.push(self.event(kind, json!({"response": response})));
        self.done = true;
    }

    fn failed(&mut self, message: String, out: &mut Vec<Chunk>) {
        let mut response = response_object(&self.echo, None, "failed");
        response["error"] = json!({"code": "server_error", "message": message});
        out.push(self.event("response.failed", json!({"response": response})));
        self.done = true;
    }
}

/// Streams one response's events as its output comes.
pub(super) fn stream(
    state: Arc<AppState>,
    tenant: Tenant,
    echo: Echo,
    outputs: Outputs,
) -> Sse<impl Stream<Item = Chunk>> {
    let start = Said {
        state,
        tenant,
        echo,
        outputs,
        sequence: 0,
        started: false,
        done: false,
        reasoning: None,
        text: None,
        items: 0,
        choice: Choice {
            text: String::new(),
            reasoning: String::new(),
            logprobs: Vec::new(),
            calls: Vec::new(),
            finish: Finish::Length,
            usage: Default::default(),
        },
    };
    let s = stream::unfold(start, |mut st| async move {
        if st.done {
            return None;
        }
        let mut out = Vec::new();
        if !st.started {
            st.started = true;
            let response = response_object(&st.echo, None, "in_progress");
            out.push(st.event("response.created", json!({"response": response})));
            out.push(st.event("response.in_progress", json!({"response": response})));
            return Some((out, st));
        }
        for piece in st.outputs.next().await? {
            match piece {
                Piece::Text { text, .. } => st.text(text, &mut out),
                Piece::Reasoning { text, .. } => st.reasoning(text, &mut out),
                Piece::Calls { calls, .. } => st.calls(calls, &mut out),
                Piece::Finished { finish, usage, .. } => st.finished((finish, usage), &mut out),
                Piece::Failed(m) => st.failed(m, &mut out),
            }
        }
        Some((out, st))
    })
    .flat_map(stream::iter);
    Sse::new(s).keep_alive(super::stream::keep_alive())
}
