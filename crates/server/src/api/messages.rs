//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`. The
//! `system` prompt (a string or text blocks) and `messages` (string or block content: `text`,
//! `tool_use`, `tool_result`) are read into the common `Conversation`, `tools` (with
//! `input_schema`) and `tool_choice` (`auto`, `any`, `tool`, `none`) into the checked tools; the
//! answer is a message with `text` and `tool_use` content blocks, whole or as the events of
//! `messages_stream`. Errors are in Anthropic's shape.

use super::error::{ApiError, ErrorShape};
use super::messages_items::message_object;
use super::output::Outputs;
use super::request::{self, json_body, neutral, read_checked, Shared, TopLevelSpec};
use super::validate::{self, Conversation, Names, Settings};
use super::{answer_model, finish, record, submit};
use crate::tenant::Tenant;
use crate::tools::Tools;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use engine::{GenerationSettings, Message, PromptEnd, RenderOptions, SamplingSettings};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

const NAMES: Names = Names::new("messages", "max_tokens");

/// Messages fields accepted only with the value that changes nothing here.
fn messages_neutral(field: &str, v: &Value) -> Option<bool> {
    Some(match field {
        "service_tier" => {
            v.is_null()
                || v.as_str()
                    .is_some_and(|s| s == "auto" || s == "standard_only")
        }
        // Clearing thinking blocks clears nothing: no output here has any.
        "context_management" => {
            v.is_null()
                || v["edits"].as_array().is_some_and(|edits| {
                    edits.iter().all(|e| {
                        e["type"]
                            .as_str()
                            .is_some_and(|t| t.starts_with("clear_thinking"))
                    })
                })
        }
        "container" | "mcp_servers" | "diagnostics" => {
            v.is_null() || v.as_array().is_some_and(|a| a.is_empty())
        }
        // Hints for Anthropic's own caches and routing; pld's prefix cache finds shared
        // prefixes by itself.
        "cache_control" => v.is_null() || v.is_object(),
        "inference_geo" | "user_profile_id" | "workspace_id" => v.is_null() || v.is_string(),
        "speed" => v.is_null() || v == "standard",
        // Anthropic's `{"user_id": ...}`: nothing here reads it.
        "metadata" => true,
        _ => return neutral(field, v),
    })
}

/// A request: the settings every API reads, and the Messages API's own fields.
type MessagesRequest = (SamplingSettings, Shared, TopLevelSpec, Fields);

/// The Messages API's own fields.
#[derive(Deserialize)]
struct Fields {
    max_tokens: Option<usize>,
    messages: Option<Vec<WireMessage>>,
    system: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    /// `{"format": {"type": "json_schema", "schema": ...}, "effort": ...}`.
    output_config: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": N}`, `{"type": "disabled"}` or `{"type": "adaptive"}`.
    thinking: Option<Value>,
}

/// The fields read but not accepted: `count_tokens` takes no `max_tokens`.
fn left_out(count: bool) -> &'static [&'static str] {
    if count {
        &["max_tokens"]
    } else {
        &[]
    }
}

#[derive(Deserialize)]
struct WireMessage {
    role: String,
    content: Value,
}

/// The body checked and read; `count` reads `count_tokens`' body (no `max_tokens`).
fn read_body(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
    count: bool,
) -> Result<MessagesRequest, ApiError> {
    let req: MessagesRequest = read_checked(
        json_body(body)?,
        left_out(count),
        messages_neutral,
        state.config.lenient,
    )?;
    if req.1.model.is_none() {
        return Err(super::request::missing("model"));
    }
    if !count && req.3.max_tokens.is_none() {
        return Err(super::request::missing("max_tokens"));
    }
    Ok(req)
}

/// The model the request names, checked (under `--lenient` an unknown name is logged and served
/// by the one model: agents ask for their vendor's model names by default).
fn model_named(state: &AppState, req: &MessagesRequest) -> Result<Option<String>, ApiError> {
    let named = &req.1.model;
    match validate::check_model(state, named.as_deref()) {
        Ok(()) => Ok(named.clone()),
        Err(_) if state.config.lenient => {
            tracing::warn!(model = ?named, "unknown model: served by {}", state.config.model_name());
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// `POST /v1/messages`.
pub(super) async fn create(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    record(&state, "messages", tenant, &body);
    let result = answer(&state, tenant, body)
        .await
        .map_err(|e| e.shaped(ErrorShape::Anthropic));
    finish(&state, result)
}

async fn answer(
    state: &Arc<AppState>,
    tenant: Tenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = read_body(state, body, false)?;
    let model = model_named(state, &req)?;
    let conv = conversation(&req, state.config.lenient)?;
    let settings = settings(&req, model.clone())?;
    let valid = validate::chat(state, conv, settings, NAMES).await?;
    let (stream, reply, prompt_tokens) = (valid.stream, valid.reply, valid.prompt.len());
    let rx = submit(state, tenant, valid)?;
    let id = super::random_id("msg_");
    let outputs = Outputs::new(
        rx,
        1,
        reply,
        format!("toolu_{}", &id[4..]),
        state.lm.clone(),
    );
    let model = answer_model(state, model.as_deref());
    if stream {
        return Ok(
            super::messages_stream::stream(id, model, prompt_tokens, outputs).into_response(),
        );
    }
    let choice = outputs.single().await.map_err(ApiError::server)?;
    Ok(Json(message_object(&id, &model, &choice)).into_response())
}

/// `POST /v1/messages/count_tokens`: the tokens the prompt (system, messages, tools) takes.
pub(super) async fn count_tokens(
    State(state): State<Arc<AppState>>,
    Extension(_tenant): Extension<Tenant>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let req = read_body(&state, body, true)?;
        model_named(&state, &req)?;
        let conv = conversation(&req, state.config.lenient)?;
        let prompt = validate::render(&state, &conv, NAMES)?;
        let ids = validate::tokenize(&state, prompt, NAMES.prompt).await?;
        Ok(Json(json!({"input_tokens": ids.len()})).into_response())
    }
    .await
    .map_err(|e: ApiError| e.shaped(ErrorShape::Anthropic));
    finish(&state, result)
}

fn settings(
    (sampling, shared, speculation, req): &MessagesRequest,
    model: Option<String>,
) -> Result<Settings, ApiError> {
    let shared = request::settings(sampling, shared, speculation);
    Ok(Settings {
        model,
        generation: GenerationSettings {
            max_tokens: req.max_tokens,
            stop: req.stop_sequences.clone().unwrap_or_default(),
            response_format: output_format(req.output_config.as_ref())?,
            ..shared.generation
        },
        format_field: "output_config.format",
        ..shared
    })
}

/// Structured output from `output_config.format` (a JSON schema); `effort` is read by
/// `conversation`, for templates that take it.
fn output_format(config: Option<&Value>) -> Result<engine::ResponseFormat, ApiError> {
    let Some(config) = config.filter(|c| !c.is_null()) else {
        return Ok(engine::ResponseFormat::Text);
    };
    let Some(object) = config.as_object() else {
        return Err(ApiError::bad_request(
            "output_config must be an object",
            Some("output_config"),
        ));
    };
    for (key, value) in object {
        match key.as_str() {
            "format" => {}
            // How hard to think: for the templates that take it (`conversation`).
            "effort" => {}
            other => {
                return Err(ApiError::bad_request(
                    format!("output_config.{other} is not supported with this value ({value})"),
                    Some(&format!("output_config.{other}")),
                ))
            }
        }
    }
    match config.get("format").filter(|f| !f.is_null()) {
        None => Ok(engine::ResponseFormat::Text),
        Some(f) if f["type"] == "json_schema" => {
            validate::schema_format(f.get("schema"), "output_config.format.schema")
        }
        Some(_) => Err(ApiError::bad_request(
            "output_config.format.type must be json_schema",
            Some("output_config.format"),
        )),
    }
}

/// The system prompt, the messages and the tools as the template takes them.
fn conversation((_, _, _, req): &MessagesRequest, lenient: bool) -> Result<Conversation, ApiError> {
    let wire = req
        .messages
        .as_ref()
        .ok_or_else(|| super::request::missing("messages"))?;
    if wire.is_empty() {
        return Err(ApiError::bad_request(
            "messages: at least one message is required",
            Some("messages"),
        ));
    }
    let mut messages = Vec::new();
    if let Some(system) = &req.system {
        let text = blocks_text(system, "system")?;
        if !text.is_empty() {
            messages.push(Message::new("system", &text));
        }
    }
    for (i, m) in wire.iter().enumerate() {
        add_message(&mut messages, m, i)?;
    }
    let thinking = thinking_effort(req.thinking.as_ref())?;
    let effort = match req.output_config.as_ref().and_then(|c| c.get("effort")) {
        None | Some(Value::Null) => thinking,
        Some(e) => super::chat::reasoning_effort(
            Some(e.as_str().unwrap_or_default()),
            "output_config.effort",
        )?,
    };
    Ok(Conversation {
        messages,
        tools: tools(req, lenient)?,
        end: PromptEnd::Auto,
        options: RenderOptions {
            reasoning_effort: effort,
        },
    })
}

/// The reasoning effort `thinking` asks for, for the templates that take one (gpt-oss's; the others
/// ignore it, as they ignore `output_config.effort`, which wins when both are given): `enabled`
/// with a `budget_tokens` of at least 1024 (Anthropic's minimum) maps onto the three levels as
/// LiteLLM maps them the other way (1024 tokens low, 2048 medium, 4096 high); `disabled` is the
/// least (gpt-oss always reasons); `adaptive`, or no `thinking`, is the template's default.
fn thinking_effort(thinking: Option<&Value>) -> Result<Option<String>, ApiError> {
    let Some(t) = thinking.filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    let level = match t.get("type").and_then(Value::as_str) {
        Some("adaptive") => return Ok(None),
        Some("disabled") => "low",
        Some("enabled") => match t.get("budget_tokens").and_then(Value::as_u64) {
            Some(b) if b < 1024 => return Err(budget_error()),
            Some(..2048) => "low",
            Some(..4096) => "medium",
            Some(_) => "high",
            None => return Err(budget_error()),
        },
        _ => {
            return Err(ApiError::bad_request(
                "thinking.type must be enabled, disabled or adaptive",
                Some("thinking.type"),
            ))
        }
    };
    Ok(Some(level.to_string()))
}

fn budget_error() -> ApiError {
    ApiError::bad_request(
        "thinking.budget_tokens must be an integer of at least 1024",
        Some("thinking.budget_tokens"),
    )
}

/// Text content: a string, or text blocks (joined by blank lines).
fn blocks_text(content: &Value, param: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for (j, b) in blocks.iter().enumerate() {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => parts.push(b["text"].as_str().unwrap_or("").to_string()),
                    other => return Err(unsupported_block(other, &format!("{param}[{j}]"))),
                }
            }
            Ok(parts.join("\n\n"))
        }
        _ => Err(ApiError::bad_request(
            format!("{param} must be a string or a list of text blocks"),
            Some(param),
        )),
    }
}

fn unsupported_block(kind: Option<&str>, param: &str) -> ApiError {
    ApiError::bad_request(
        format!(
            "{param}: content blocks of type {} are not supported here (text, thinking, tool_use, tool_result)",
            kind.map_or("(missing)".to_string(), |k| format!("'{k}'"))
        ),
        Some(param),
    )
}

/// Message `i`: a user turn's `tool_result` blocks become `tool` turns (in order, before its
/// text); an assistant turn's `tool_use` blocks become its calls.
fn add_message(messages: &mut Vec<Message>, m: &WireMessage, i: usize) -> Result<(), ApiError> {
    let param = format!("messages[{i}]");
    if m.role == "system" {
        // A system message within the conversation (Claude Code sends them): text only.
        let text = blocks_text(&m.content, &format!("{param}.content"))?;
        messages.push(Message::new("system", &text));
        return Ok(());
    }
    if m.role != "user" && m.role != "assistant" {
        return Err(ApiError::bad_request(
            format!(
                "{param}.role must be user, assistant or system, got '{}'",
                m.role
            ),
            Some(&format!("{param}.role")),
        ));
    }
    let blocks = match &m.content {
        Value::String(s) => {
            messages.push(Message::new(&m.role, s));
            return Ok(());
        }
        Value::Array(b) => b,
        _ => {
            return Err(ApiError::bad_request(
                format!("{param}.content must be a string or a list of content blocks"),
                Some(&format!("{param}.content")),
            ))
        }
    };
    let mut text = Vec::new();
    let mut calls = Vec::new();
    let mut thinking: Option<String> = None;
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{param}.content[{j}]");
        match (b.get("type").and_then(Value::as_str), m.role.as_str()) {
            (Some("text"), _) => text.push(b["text"].as_str().unwrap_or("").to_string()),
            // The model's reasoning given back (its signature is not checked: pld signs none).
            (Some("thinking"), "assistant") => thinking
                .get_or_insert_default()
                .push_str(b["thinking"].as_str().unwrap_or("")),
            (Some("redacted_thinking"), "assistant") => {}
            (Some("tool_use"), "assistant") => {
                let (Some(id), Some(name)) = (b["id"].as_str(), b["name"].as_str()) else {
                    return Err(ApiError::bad_request(
                        format!("{at}: a tool_use block needs id and name"),
                        Some(&at),
                    ));
                };
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(super::chat::template_call(json!(id), json!(name), input));
            }
            (Some("tool_result"), "user") => {
                let Some(id) = b["tool_use_id"].as_str() else {
                    return Err(ApiError::bad_request(
                        format!("{at}: a tool_result block needs tool_use_id"),
                        Some(&at),
                    ));
                };
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => blocks_text(c, &format!("{at}.content"))?,
                };
                let content = if b["is_error"] == true {
                    format!("Error: {content}")
                } else {
                    content
                };
                let turn = super::chat::tool_turn(messages, id, &content);
                messages.push(turn);
            }
            (other, _) => return Err(unsupported_block(other, &at)),
        }
    }
    if !text.is_empty() || !calls.is_empty() || thinking.is_some() {
        let mut message = Message::new(&m.role, &text.join("\n\n"));
        if !calls.is_empty() {
            message.tool_calls = Some(calls);
        }
        message.thinking = thinking;
        messages.push(message);
    }
    Ok(())
}

/// The tools (`name`, `description`, `input_schema`) and `tool_choice`, checked as chat's.
/// Anthropic's server tools are refused, or under `--lenient` dropped with a log line.
fn tools(req: &Fields, lenient: bool) -> Result<Option<Tools>, ApiError> {
    let mut openai = Vec::new();
    for (i, t) in req.tools.iter().flatten().enumerate() {
        let param = format!("tools[{i}]");
        let kind = t.get("type").and_then(Value::as_str);
        if let Some(kind) = kind.filter(|k| *k != "custom") {
            let problem = format!("{param}: tools of type '{kind}' (server tools) are not supported; give custom tools with name and input_schema");
            if !lenient {
                return Err(ApiError::bad_request(problem, Some(&param)));
            }
            tracing::warn!("ignored: {problem}");
            continue;
        }
        let mut function = json!({"name": t.get("name").cloned().unwrap_or(Value::Null)});
        if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
            function["description"] = d.clone();
        }
        if let Some(s) = t.get("input_schema").filter(|s| !s.is_null()) {
            function["parameters"] = s.clone();
        }
        openai.push(json!({"type": "function", "function": function}));
    }
    let choice = match &req.tool_choice {
        None | Some(Value::Null) => None,
        Some(c) => Some(match c.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => {
                json!({"type": "function", "function": {"name": c.get("name").cloned().unwrap_or(Value::Null)}})
            }
            _ => {
                return Err(ApiError::bad_request(
                    "tool_choice.type must be auto, any, tool or none",
                    Some("tool_choice"),
                ))
            }
        }),
    };
    Tools::parse(Some(&Value::Array(openai)), choice.as_ref())
        .map_err(|(m, p)| ApiError::bad_request(m, Some(&p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_it_accepts() {
        super::super::request::assert_reads_what_it_accepts::<MessagesRequest>(
            &[],
            messages_neutral,
        );
    }

    #[test]
    fn thinking_budgets_become_efforts() {
        // `None`: refused; `Some(None)`: the template's default.
        let effort = |t: Value| thinking_effort(Some(&t)).ok();
        let level = |l: &str| Some(Some(l.to_string()));
        let enabled = |n: u64| effort(json!({"type": "enabled", "budget_tokens": n}));
        assert_eq!(enabled(1024), level("low"));
        assert_eq!(enabled(2048), level("medium"));
        assert_eq!(enabled(4095), level("medium"));
        assert_eq!(enabled(31999), level("high"));
        assert_eq!(enabled(1023), None);
        assert_eq!(effort(json!({"type": "disabled"})), level("low"));
        assert_eq!(effort(json!({"type": "adaptive"})), Some(None));
        assert_eq!(effort(json!({"type": "on"})), None);
        assert!(thinking_effort(None).unwrap().is_none());
    }
}
