//! What a Messages answer is made of, whole (`messages`) or streamed (`messages_stream`): the
//! `thinking` block, the stop reason, the usage and the whole message. Both renderers import it;
//! it imports neither.

use super::output::{Choice, Finish};
use serde_json::{json, Value};

/// The model's reasoning as a `thinking` block (unsigned: pld has no signature to give).
pub(super) fn thinking_block(thinking: &str) -> Value {
    json!({"type": "thinking", "thinking": thinking, "signature": ""})
}

/// Anthropic's `stop_reason` and `stop_sequence`.
pub(super) fn stop_reason(finish: &Finish) -> (&'static str, Value) {
    match finish {
        Finish::Stop { sequence: Some(s) } => ("stop_sequence", json!(s)),
        Finish::Stop { sequence: None } => ("end_turn", Value::Null),
        Finish::Length | Finish::Limit => ("max_tokens", Value::Null),
        Finish::ToolCalls => ("tool_use", Value::Null),
    }
}

/// Anthropic's usage: `input_tokens` counts only the prompt tokens not read from the cache.
pub(super) fn usage(u: &super::output::Usage) -> Value {
    json!({
        "input_tokens": u.prompt.saturating_sub(u.cached),
        "output_tokens": u.completion,
        "cache_read_input_tokens": u.cached,
        "cache_creation_input_tokens": 0,
    })
}

/// A whole message.
pub(super) fn message_object(id: &str, model: &str, c: &Choice) -> Value {
    let mut content = Vec::new();
    if !c.reasoning.is_empty() {
        content.push(thinking_block(&c.reasoning));
    }
    if !c.text.is_empty() || c.calls.is_empty() {
        content.push(json!({"type": "text", "text": c.text}));
    }
    for call in &c.calls {
        content.push(
            json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.input()}),
        );
    }
    let (reason, sequence) = stop_reason(&c.finish);
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(&c.usage),
    })
}
