//! OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`, `GET
//! /v1/responses/{id}/input_items`. A request's `input` (a string or items: messages with text
//! parts, `function_call`, `function_call_output`), `instructions` and function `tools` are read
//! into the common `Conversation`; `text.format` into the output format; `previous_response_id`
//! prepends the stored conversation it names (the prefix cache then finds the earlier turns).
//! The answer is a response object with `message` and `function_call` output items, whole or
//! as the typed events of `responses_stream`; with `store` (the default) it is kept per API key
//! in the `ResponseStore`.

use super::error::ApiError;
use super::output::Outputs;
use super::request::{self, json_body, neutral, read_checked, Shared, TopLevelSpec};
use super::responses_items::{keep, response_object, Echo};
use super::validate::{self, Conversation, Names, Settings};
use super::{answer_model, finish, record, submit, unix_now};
use crate::tenant::Tenant;
use crate::tools::Tools;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use engine::{
    GenerationSettings, Message, PromptEnd, RenderOptions, ResponseFormat, SamplingSettings,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;

const NAMES: Names = Names::new("input", "max_output_tokens");

/// Responses fields accepted only with the value that changes nothing here.
fn responses_neutral(field: &str, v: &Value) -> Option<bool> {
    let null_or = |ok: &[&str]| v.is_null() || v.as_str().is_some_and(|s| ok.contains(&s));
    Some(match field {
        "truncation" => null_or(&["disabled"]),
        "service_tier" => null_or(&["auto", "default"]),
        "background" => v.is_null() || v.as_bool() == Some(false),
        "include" => {
            v.is_null()
                || v.as_array()
                    .is_some_and(|a| a.iter().all(|i| i == "reasoning.encrypted_content"))
        }
        // Hints for OpenAI's own caches; pld's prefix cache finds shared prefixes by itself.
        "prompt_cache_key" | "safety_identifier" => v.is_null() || v.is_string(),
        // `effort` is read (for templates that take it, gpt-oss's); there is no summary of the
        // reasoning, which comes whole as a `reasoning` item when the model writes it apart.
        "reasoning" => v.is_null() || v.is_object(),
        "max_tool_calls" | "stream_options" | "prompt" => v.is_null(),
        // What a client says about itself (Codex: its thread and turn); it changes no output.
        "client_metadata" => v.is_null() || v.is_object(),
        _ => return neutral(field, v),
    })
}

/// A request: the settings every API reads, and the Responses API's own fields.
type ResponsesRequest = (SamplingSettings, Shared, TopLevelSpec, Fields);

/// Fields read whose value `responses_neutral` checks first.
const VALUE_CHECKED: &[&str] = &["reasoning"];

/// The Responses API's own fields.
#[derive(Deserialize)]
struct Fields {
    input: Option<Value>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    text: Option<Value>,
    max_output_tokens: Option<usize>,
    metadata: Option<Map<String, Value>>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    /// `{"effort": ..., "summary": ...}` (checked by `responses_neutral`).
    reasoning: Option<Value>,
}

/// `POST /v1/responses`.
pub(super) async fn create(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    record(&state, "responses", tenant, &body);
    let result = answer(&state, tenant, body).await;
    finish(&state, result)
}

async fn answer(
    state: &Arc<AppState>,
    tenant: Tenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ResponsesRequest = read_checked(
        json_body(body)?,
        VALUE_CHECKED,
        responses_neutral,
        state.config.lenient,
    )?;
    let (conv, echo) = read(state, tenant, &req)?;
    let settings = settings(&req)?;
    let stream = settings.stream;
    let valid = validate::chat(state, conv, settings, NAMES).await?;
    let reply = valid.reply;
    let rx = submit(state, tenant, valid)?;
    let outputs = Outputs::new(
        rx,
        1,
        reply,
        format!("call_{}", &echo.id[5..]),
        state.lm.clone(),
    );
    if stream {
        return Ok(
            super::responses_stream::stream(state.clone(), tenant, echo, outputs).into_response(),
        );
    }
    let choice = outputs.single().await.map_err(ApiError::server)?;
    let response = response_object(&echo, Some(&choice), "completed");
    keep(state, tenant, &echo, &response);
    Ok(Json(response).into_response())
}

/// The conversation and what the response echoes.
fn read(
    state: &AppState,
    tenant: Tenant,
    (sampling, shared, _, req): &ResponsesRequest,
) -> Result<(Conversation, Echo), ApiError> {
    let mut input = match &req.previous_response_id {
        Some(prev) => {
            let mut store = state.store.lock().unwrap_or_else(|e| e.into_inner());
            store
                .get(prev, tenant)
                .ok_or_else(|| {
                    ApiError::not_found(
                        format!("Previous response with id '{prev}' not found."),
                        Some("previous_response_id"),
                    )
                })?
                .history()
        }
        None => Vec::new(),
    };
    let first_new = input.len();
    match &req.input {
        Some(Value::String(s)) => input.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => input.extend(items.iter().cloned()),
        None if req.previous_response_id.is_some() => {}
        None => return Err(super::request::missing("input")),
        Some(_) => {
            return Err(ApiError::bad_request(
                "input must be a string or a list of items",
                Some("input"),
            ))
        }
    }
    let mut messages = Vec::new();
    if let Some(system) = &req.instructions {
        messages.push(Message::new("system", system));
    }
    for (i, item) in input.iter().enumerate() {
        // Items from the stored chain were checked when they came in; errors name the new ones.
        let at = i.checked_sub(first_new);
        add_item(&mut messages, item, at)?;
    }
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "input must not be empty",
            Some("input"),
        ));
    }
    let (specs, tools) = tools(req, state.config.lenient)?;
    let asked = req.reasoning.as_ref().and_then(|r| r.get("effort"));
    let effort = match asked {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) => super::chat::reasoning_effort(Some(e), "reasoning.effort")?,
        Some(_) => {
            return Err(ApiError::bad_request(
                "reasoning.effort must be a string",
                Some("reasoning.effort"),
            ))
        }
    };
    let echo = Echo {
        id: super::random_id("resp_"),
        created_at: unix_now(),
        model: answer_model(state, shared.model.as_deref()),
        instructions: req.instructions.clone(),
        tools: specs,
        tool_choice: req.tool_choice.clone().unwrap_or(json!("auto")),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        text: req
            .text
            .clone()
            .unwrap_or(json!({"format": {"type": "text"}})),
        max_output_tokens: req.max_output_tokens,
        temperature: sampling.temperature(),
        top_p: sampling.top_p(),
        metadata: req.metadata.clone().map_or(json!({}), Value::Object),
        store: req.store.unwrap_or(true),
        previous_response_id: req.previous_response_id.clone(),
        effort: effort.clone(),
        input,
    };
    let conv = Conversation {
        messages,
        tools,
        end: PromptEnd::NextTurn,
        options: RenderOptions {
            reasoning_effort: effort,
        },
    };
    Ok((conv, echo))
}

/// Adds input item `at` (None: an item of the stored chain) to the messages: a message, a
/// function call (joined to the assistant turn before it) or a call's output (a `tool` turn).
fn add_item(messages: &mut Vec<Message>, item: &Value, at: Option<usize>) -> Result<(), ApiError> {
    let param = at.map_or_else(
        || "previous_response_id".to_string(),
        |i| format!("input[{i}]"),
    );
    let bad = |m: String| Err(ApiError::bad_request(format!("{param}: {m}"), Some(&param)));
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    match kind {
        "message" => {
            let role = item.get("role").and_then(Value::as_str).unwrap_or("");
            let role = match role {
                "user" | "assistant" | "system" => role,
                "developer" => "system",
                other => {
                    return bad(format!(
                        "role '{other}' is not supported (user, assistant, system, developer)"
                    ))
                }
            };
            let text = item_text(item.get("content"), &param)?;
            match messages.last_mut() {
                // The answer after its reasoning item: one turn.
                Some(m) if role == "assistant" && is_reasoning_only(m) => m.content = text,
                _ => messages.push(Message::new(role, &text)),
            }
        }
        "reasoning" => {
            // The model's reasoning, given back: the thinking of the assistant turn it opens.
            let text = reasoning_text(item);
            match messages.last_mut() {
                Some(m) if is_reasoning_only(m) => m.thinking.get_or_insert_default().push_str(&text),
                _ => {
                    let mut m = Message::new("assistant", "");
                    m.thinking = Some(text);
                    messages.push(m);
                }
            }
        }
        "function_call" => {
            let (Some(name), Some(call_id)) = (
                item.get("name").and_then(Value::as_str),
                item.get("call_id").and_then(Value::as_str),
            ) else {
                return bad("a function_call needs name and call_id".into());
            };
            let arguments = super::chat::template_arguments(item.get("arguments"), &param)?;
            let call = super::chat::template_call(json!(call_id), json!(name), arguments);
            match messages.last_mut() {
                Some(m) if m.role == "assistant" => {
                    m.tool_calls.get_or_insert_with(Vec::new).push(call)
                }
                _ => {
                    let mut m = Message::new("assistant", "");
                    m.tool_calls = Some(vec![call]);
                    messages.push(m);
                }
            }
        }
        "function_call_output" => {
            let Some(call_id) = item.get("call_id").and_then(Value::as_str) else {
                return bad("a function_call_output needs call_id".into());
            };
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                other => item_text(other, &param)?,
            };
            let turn = super::chat::tool_turn(messages, call_id, &output);
            messages.push(turn);
        }
        other => {
            return bad(format!(
                "items of type '{other}' are not supported (message, function_call, function_call_output)"
            ))
        }
    }
    Ok(())
}

/// An assistant turn that so far holds only reasoning.
fn is_reasoning_only(m: &Message) -> bool {
    m.role == "assistant" && m.thinking.is_some() && m.content.is_empty() && m.tool_calls.is_none()
}

/// A reasoning item's text: its `reasoning_text` content, else its summary's texts.
fn reasoning_text(item: &Value) -> String {
    let texts = |key: &str| -> String {
        item.get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect()
    };
    let content = texts("content");
    if content.is_empty() {
        texts("summary")
    } else {
        content
    }
}

/// A message's content: a string or text parts (`input_text`, `output_text`, `text`,
/// `refusal`); other parts (images, files) are refused.
fn item_text(content: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                let piece = match kind {
                    "input_text" | "output_text" | "text" => p.get("text"),
                    "refusal" => p.get("refusal"),
                    _ => {
                        let at = format!("{param}.content[{j}]");
                        return Err(ApiError::bad_request(
                            format!("{at}: content of type '{kind}' is not supported (text only)"),
                            Some(&at),
                        ));
                    }
                };
                text.push_str(piece.and_then(Value::as_str).unwrap_or(""));
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::bad_request(
            format!("{param}.content must be a string or a list of parts"),
            Some(param),
        )),
    }
}

/// The function tools, as the response echoes them and as the template and grammar take them.
/// Other tools (OpenAI's hosted tools, namespaces) are refused, or under `--lenient` dropped with
/// a log line.
fn tools(req: &Fields, lenient: bool) -> Result<(Vec<Value>, Option<Tools>), ApiError> {
    let mut given = req.tools.clone().unwrap_or_default();
    let mut openai = Vec::new();
    let mut dropped = Vec::new();
    for (i, t) in given.iter().enumerate() {
        let param = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                let problem = format!(
                    "{param}.type {} is not supported (function tools only)",
                    other.map_or("missing".to_string(), |t| format!("'{t}'"))
                );
                if !lenient {
                    return Err(ApiError::bad_request(problem, Some(&param)));
                }
                tracing::warn!("ignored: {problem}");
                dropped.push(i);
                continue;
            }
        }
        let mut function = json!({"name": t.get("name").cloned().unwrap_or(Value::Null)});
        for key in ["description", "parameters", "strict"] {
            if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                function[key] = v.clone();
            }
        }
        openai.push(json!({"type": "function", "function": function}));
    }
    for i in dropped.into_iter().rev() {
        given.remove(i);
    }
    // Responses names a function as {"type": "function", "name": ...}; chat nests it.
    let choice = req.tool_choice.as_ref().map(|c| match c.get("name") {
        Some(name) if c.get("type").and_then(Value::as_str) == Some("function") => {
            json!({"type": "function", "function": {"name": name}})
        }
        _ => c.clone(),
    });
    let checked = Tools::parse(Some(&Value::Array(openai)), choice.as_ref())
        .map_err(|(m, p)| ApiError::bad_request(m, Some(&p)))?;
    Ok((given, checked))
}

/// The settings under their common names; `text.format` as the output format.
fn settings((sampling, shared, speculation, req): &ResponsesRequest) -> Result<Settings, ApiError> {
    let shared = request::settings(sampling, shared, speculation);
    Ok(Settings {
        generation: GenerationSettings {
            max_tokens: req.max_output_tokens,
            response_format: text_format(req.text.as_ref())?,
            ..shared.generation
        },
        format_field: "text.format",
        ..shared
    })
}

/// `text.format`: `text`, `json_object`, or `json_schema` with its `schema` beside the type.
fn text_format(text: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    let Some(format) = text.and_then(|t| t.get("format")).filter(|f| !f.is_null()) else {
        return Ok(ResponseFormat::Text);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => validate::schema_format(format.get("schema"), "text.format.schema"),
        other => Err(ApiError::bad_request(
            format!(
                "text.format.type must be text, json_object or json_schema, got {}",
                other.map_or("nothing".to_string(), |t| format!("'{t}'"))
            ),
            Some("text.format"),
        )),
    }
}

/// `GET /v1/responses/{id}`: the tenant's stored response.
pub(super) async fn retrieve(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> Response {
    let found = stored(&state, &id, tenant).map(|s| Json(s.response).into_response());
    finish(&state, found)
}

/// `GET /v1/responses/{id}/input_items`: the input items of the tenant's stored response.
pub(super) async fn input_items(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> Response {
    let found = stored(&state, &id, tenant).map(|s| {
        let data: Vec<Value> = s
            .input
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let mut item = item.clone();
                if item.get("id").is_none() {
                    item["id"] = json!(format!("item_{}_{i}", &id));
                }
                if item.get("type").is_none() {
                    item["type"] = json!("message");
                }
                item
            })
            .collect();
        let first = data.first().map(|d| d["id"].clone());
        let last = data.last().map(|d| d["id"].clone());
        Json(json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": false}))
            .into_response()
    });
    finish(&state, found)
}

/// `DELETE /v1/responses/{id}`.
pub(super) async fn delete(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> Response {
    let removed = state
        .store
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id, tenant);
    let result = if removed {
        Ok(Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response())
    } else {
        Err(unknown(&id))
    };
    finish(&state, result)
}

fn stored(state: &AppState, id: &str, tenant: Tenant) -> Result<super::store::Stored, ApiError> {
    state
        .store
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(id, tenant)
        .ok_or_else(|| unknown(id))
}

/// The 404 for an id that is not stored for this API key (unknown, deleted, evicted, or
/// another key's: the answer does not tell them apart).
fn unknown(id: &str) -> ApiError {
    ApiError::not_found(format!("Response with id '{id}' not found."), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_it_accepts() {
        super::super::request::assert_reads_what_it_accepts::<ResponsesRequest>(
            VALUE_CHECKED,
            responses_neutral,
        );
    }
}
