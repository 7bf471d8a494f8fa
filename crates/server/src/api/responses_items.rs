//! What a Responses answer is made of, whole (`responses`) or streamed (`responses_stream`): the
//! request's `Echo`, the output items (`message`, `reasoning`, `function_call`) and their ids, the
//! response object, and keeping it in the store when it is finished. Both renderers import it;
//! it imports neither.

use super::output::{Call, Choice, Finish};
use crate::tenant::Tenant;
use crate::AppState;
use serde_json::{json, Value};

/// What a response object echoes of its request, and what the answer needs to be built.
pub(super) struct Echo {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub instructions: Option<String>,
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub text: Value,
    pub max_output_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub metadata: Value,
    pub store: bool,
    pub previous_response_id: Option<String>,
    /// The reasoning effort asked for (as the template takes it).
    pub effort: Option<String>,
    /// Every input item of the conversation (the chained ones first), for the store.
    pub input: Vec<Value>,
}

/// Keeps a finished response when the request asked for it.
pub(super) fn keep(state: &AppState, tenant: Tenant, echo: &Echo, response: &Value) {
    if echo.store {
        let mut store = state.store.lock().unwrap_or_else(|e| e.into_inner());
        if !store.put(&echo.id, tenant, response.clone(), echo.input.clone()) {
            tracing::warn!(id = %echo.id, "response too large to store");
        }
    }
}

/// The output items of a finished choice: its `reasoning` (when the model wrote it apart), a
/// `message` with its text (when there is any, or when there are no calls), then one
/// `function_call` per call.
pub(super) fn output_items(echo: &Echo, choice: &Choice) -> Vec<Value> {
    let mut items = Vec::new();
    if !choice.reasoning.is_empty() {
        items.push(reasoning_item(echo, &choice.reasoning, "completed"));
    }
    if !choice.text.is_empty() || choice.calls.is_empty() {
        items.push(message_item(echo, &choice.text, "completed"));
    }
    for call in &choice.calls {
        items.push(call_item(call, "completed"));
    }
    items
}

/// The id of the response's message item.
pub(super) fn message_id(echo: &Echo) -> String {
    format!("msg_{}", &echo.id[5..])
}

pub(super) fn message_item(echo: &Echo, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([text_part(text)])
    };
    json!({
        "type": "message",
        "id": message_id(echo),
        "status": status,
        "role": "assistant",
        "content": content,
    })
}

/// The id of the response's reasoning item.
pub(super) fn reasoning_id(echo: &Echo) -> String {
    format!("rs_{}", &echo.id[5..])
}

pub(super) fn reasoning_item(echo: &Echo, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([reasoning_part(text)])
    };
    json!({
        "type": "reasoning",
        "id": reasoning_id(echo),
        "status": status,
        "summary": [],
        "content": content,
    })
}

pub(super) fn reasoning_part(text: &str) -> Value {
    json!({"type": "reasoning_text", "text": text})
}

pub(super) fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The item id of a call (the call's own id is its `call_id`).
pub(super) fn call_item_id(call: &Call) -> String {
    format!("fc_{}", call.id.trim_start_matches("call_"))
}

pub(super) fn call_item(call: &Call, status: &str) -> Value {
    let arguments = if status == "in_progress" {
        ""
    } else {
        call.arguments.as_str()
    };
    json!({
        "type": "function_call",
        "id": call_item_id(call),
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    })
}

/// The response object: `choice` is the finished output (none yet while it runs).
pub(super) fn response_object(echo: &Echo, choice: Option<&Choice>, status: &str) -> Value {
    let (status, incomplete) = match choice.map(|c| &c.finish) {
        Some(Finish::Length) => ("incomplete", json!({"reason": "max_output_tokens"})),
        _ => (status, Value::Null),
    };
    let usage = choice.map_or(Value::Null, |c| {
        json!({
            "input_tokens": c.usage.prompt,
            "input_tokens_details": {"cached_tokens": c.usage.cached, "cache_write_tokens": 0},
            "output_tokens": c.usage.completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": c.usage.prompt + c.usage.completion,
        })
    });
    json!({
        "id": echo.id,
        "object": "response",
        "created_at": echo.created_at,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "model": echo.model,
        "output": choice.map_or_else(Vec::new, |c| output_items(echo, c)),
        "parallel_tool_calls": echo.parallel_tool_calls,
        "previous_response_id": echo.previous_response_id,
        "reasoning": {"effort": echo.effort, "summary": null},
        "store": echo.store,
        "temperature": echo.temperature,
        "text": echo.text,
        "tool_choice": echo.tool_choice,
        "tools": echo.tools,
        "top_p": echo.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": null,
        "metadata": echo.metadata,
    })
}
