//! OpenAI's chat and text completions (`/v1/chat/completions`, `/v1/completions`): the body
//! (`request::WireRequest`: the settings every API reads, the fields of both endpoints, each
//! one's own) read into the common `Conversation` or prompt and `Settings`, checked by
//! `validate`, and answered in OpenAI's shapes, whole (`response`) or streamed (`stream`).

use super::error::ApiError;
use super::output::Outputs;
use super::request::{
    self, missing, ChatFields, ChatMessage, Completion, Content, Prompt, Stop, TextFields,
    WireRequest,
};
use super::response::{self, Meta};
use super::validate::{self, Conversation, Names, Settings};
use super::{request_id, submit, unix_now, Kind};
use crate::tenant::Tenant;
use crate::tools::Tools;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use engine::{GenerationSettings, Message, PromptEnd, ResponseFormat};
use serde_json::{json, Value};
use std::sync::Arc;

impl Kind {
    pub(super) fn names(self) -> Names {
        let names = Names::new(self.prompt_field(), "max_tokens");
        match self {
            Kind::Chat => Names {
                logprobs: "top_logprobs",
                ..names
            },
            Kind::Text => names,
        }
    }
}

/// Either endpoint: the body read, validated, submitted and answered.
pub(super) async fn complete(
    state: &Arc<AppState>,
    tenant: Tenant,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Result<Response, ApiError> {
    let req = request::parse(body, kind, state.config.lenient)?;
    let settings = settings(&req, kind)?;
    let mut names = kind.names();
    if req.completion.max_completion_tokens.is_some() {
        // The cap used (`settings`), named as the client sent it.
        names.max_tokens = "max_completion_tokens";
    }
    let valid = match &req.prompt {
        Prompt::Chat(chat) => {
            let conv = conversation(chat)?;
            validate::chat(state, conv, settings, names).await?
        }
        Prompt::Text(text) => {
            let prompt = text_prompt(text)?;
            match text.suffix.clone().filter(|s| !s.is_empty()) {
                Some(suffix) => {
                    super::infill::with_suffix(state, prompt, suffix, settings, names).await?
                }
                None => validate::text(state, prompt, settings, names).await?,
            }
        }
    };
    let meta = Meta {
        id: request_id(kind.id_prefix()),
        created: unix_now(),
        model: super::answer_model(state, req.shared.model.as_deref()),
        kind,
        lm: state.lm.clone(),
        logprobs: valid.config.logprobs.is_some(),
    };
    let (n, stream, include_usage, reply) =
        (valid.n, valid.stream, valid.include_usage, valid.reply);
    let rx = submit(state, tenant, valid)?;
    let outputs = Outputs::new(rx, n, reply, format!("call-{}", meta.id), meta.lm.clone());
    Ok(if stream {
        super::stream::stream(meta, outputs, n, include_usage).into_response()
    } else {
        response::whole(meta, outputs).await
    })
}

/// The text completion's one prompt string.
fn text_prompt(req: &TextFields) -> Result<String, ApiError> {
    match req.prompt.as_ref().ok_or_else(|| missing("prompt"))? {
        Value::String(s) => Ok(s.clone()),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            Ok(a[0].as_str().unwrap_or("").to_string())
        }
        _ => Err(ApiError::bad_request(
            "prompt must be a string (or a list of one string)",
            Some("prompt"),
        )),
    }
}

/// The chat's messages, tools, prompt end and reasoning effort.
fn conversation(req: &ChatFields) -> Result<Conversation, ApiError> {
    let mut conv = conversation_of(
        req.messages.as_deref(),
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        prompt_end(req.add_generation_prompt, req.continue_final_message)?,
    )?;
    conv.options.reasoning_effort =
        reasoning_effort(req.reasoning_effort.as_deref(), "reasoning_effort")?;
    Ok(conv)
}

/// A reasoning effort as the templates know it (`low`, `medium`, `high`: gpt-oss's), from the
/// names OpenAI's and Anthropic's APIs also use (`none`, `minimal` the least, `xhigh`, `max` the
/// most); anything else is a 400 naming `field`.
pub(super) fn reasoning_effort(
    effort: Option<&str>,
    field: &str,
) -> Result<Option<String>, ApiError> {
    let level = match effort {
        None => return Ok(None),
        Some("none" | "minimal" | "low") => "low",
        Some("medium") => "medium",
        Some("high" | "xhigh" | "max") => "high",
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("{field} must be low, medium or high, got '{other}'"),
                Some(field),
            ))
        }
    };
    Ok(Some(level.to_string()))
}

/// Chat messages, tools and where the prompt ends, as the template takes them.
pub(super) fn conversation_of(
    messages: Option<&[ChatMessage]>,
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    end: PromptEnd,
) -> Result<Conversation, ApiError> {
    let wire = messages.ok_or_else(|| missing("messages"))?;
    if wire.is_empty() {
        return Err(ApiError::bad_request(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let messages = wire
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let tools =
        Tools::parse(tools, tool_choice).map_err(|(m, p)| ApiError::bad_request(m, Some(&p)))?;
    Ok(Conversation {
        messages,
        tools,
        end,
        options: Default::default(),
    })
}

/// The settings under their common names.
fn settings(req: &WireRequest, kind: Kind) -> Result<Settings, ApiError> {
    let c = &req.completion;
    let (format, format_field) = format_asked(c)?;
    let shared = request::settings(&req.sampling, &req.shared, &req.speculation);
    Ok(Settings {
        n: c.n,
        generation: GenerationSettings {
            max_tokens: c.max_completion_tokens.or(c.max_tokens),
            stop: match &c.stop {
                None => Vec::new(),
                Some(Stop::One(s)) => vec![s.clone()],
                Some(Stop::Many(v)) => v.clone(),
            },
            logprobs: logprobs(c, kind)?,
            response_format: format,
            ..shared.generation
        },
        format_field,
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
        ..shared
    })
}

/// Message `i` as the chat template takes it.
fn message(i: usize, m: &ChatMessage) -> Result<Message, ApiError> {
    if !["system", "developer", "user", "assistant", "tool"].contains(&m.role.as_str()) {
        return Err(ApiError::bad_request(
            format!(
                "messages[{i}].role '{}' is not supported (system, developer, user, assistant, tool)",
                m.role
            ),
            Some(&format!("messages[{i}].role")),
        ));
    }
    // Chat templates know `system`; `developer` is OpenAI's newer name for it.
    let role = if m.role == "developer" {
        "system"
    } else {
        &m.role
    };
    let content = match &m.content {
        None => String::new(),
        Some(Content::Text(t)) => t.clone(),
        Some(Content::Parts(parts)) => {
            let mut s = String::new();
            for p in parts {
                if p.kind != "text" {
                    return Err(ApiError::bad_request(
                        format!("content part type '{}' is not supported", p.kind),
                        Some("messages"),
                    ));
                }
                s.push_str(p.text.as_deref().unwrap_or(""));
            }
            s
        }
    };
    let mut message = Message::new(role, &content);
    if let Some(calls) = &m.tool_calls {
        message.tool_calls = Some(template_calls(calls, i)?);
    }
    message.tool_call_id = m.tool_call_id.clone();
    message.name = m.name.clone();
    if role == "assistant" {
        message.thinking = m.reasoning_content.clone();
    }
    Ok(message)
}

/// An assistant turn's `tool_calls` as chat templates take them: the arguments (JSON text in
/// OpenAI's format) as an object.
fn template_calls(calls: &[Value], message: usize) -> Result<Vec<Value>, ApiError> {
    calls
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let param = format!("messages[{message}].tool_calls[{j}]");
            let f = c
                .get("function")
                .filter(|f| f["name"].is_string())
                .ok_or_else(|| {
                    ApiError::bad_request(format!("{param} needs function.name"), Some(&param))
                })?;
            let arguments = template_arguments(f.get("arguments"), &param)?;
            Ok(template_call(
                c.get("id").cloned().unwrap_or(Value::Null),
                f["name"].clone(),
                arguments,
            ))
        })
        .collect()
}

/// Call arguments given as JSON text (OpenAI's way) or as a value, as the object templates take.
pub(super) fn template_arguments(given: Option<&Value>, param: &str) -> Result<Value, ApiError> {
    match given {
        Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
            ApiError::bad_request(
                format!("{param}: the arguments are not JSON: {e}"),
                Some(param),
            )
        }),
        Some(v) => Ok(v.clone()),
        None => Ok(json!({})),
    }
}

/// One call of an assistant turn as chat templates take it.
pub(super) fn template_call(id: Value, name: Value, arguments: Value) -> Value {
    json!({
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    })
}

/// A `tool` turn with `content` answering call `id`, named after that call among the turns before.
pub(super) fn tool_turn(earlier: &[Message], id: &str, content: &str) -> Message {
    let name = earlier
        .iter()
        .flat_map(|m| m.tool_calls.iter().flatten())
        .find(|c| c["id"] == id)
        .and_then(|c| c["function"]["name"].as_str().map(str::to_string));
    let mut turn = Message::new("tool", content);
    turn.tool_call_id = Some(id.to_string());
    turn.name = name;
    turn
}

/// Where the rendered prompt ends, from vLLM's `add_generation_prompt` and
/// `continue_final_message`.
pub(super) fn prompt_end(
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
) -> Result<PromptEnd, ApiError> {
    Ok(match (add_generation_prompt, continue_final_message) {
        (Some(true), Some(true)) => {
            return Err(ApiError::bad_request(
                "add_generation_prompt and continue_final_message cannot both be true",
                Some("continue_final_message"),
            ))
        }
        (_, Some(true)) => PromptEnd::ContinueLast,
        (Some(false), _) => PromptEnd::AsIs,
        (Some(true), _) => PromptEnd::NextTurn,
        (None, _) => PromptEnd::Auto,
    })
}

/// The `logprobs` setting: `None` for none, or the number of alternatives per token.
pub(super) fn logprobs(req: &Completion, kind: Kind) -> Result<Option<usize>, ApiError> {
    let top = match (kind, &req.logprobs) {
        (_, None | Some(Value::Null)) | (Kind::Chat, Some(Value::Bool(false))) => {
            if req.top_logprobs.is_some_and(|t| t > 0) {
                return Err(ApiError::bad_request(
                    "top_logprobs requires logprobs to be true",
                    Some("top_logprobs"),
                ));
            }
            return Ok(None);
        }
        (Kind::Chat, Some(Value::Bool(true))) => req.top_logprobs.unwrap_or(0),
        (Kind::Text, Some(v)) if v.is_u64() => v.as_u64().unwrap_or(0) as usize,
        (Kind::Chat, Some(_)) => {
            return Err(ApiError::bad_request(
                "logprobs must be a boolean",
                Some("logprobs"),
            ))
        }
        (Kind::Text, Some(_)) => {
            return Err(ApiError::bad_request(
                "logprobs must be a non-negative integer",
                Some("logprobs"),
            ))
        }
    };
    // The most alternatives is checked with the other settings (`GenerationSettings::config`).
    Ok(Some(top))
}

/// The format asked for, from `response_format` or llama.cpp's `json_schema` or `grammar` (one of
/// them at most), and the field that asked for it.
fn format_asked(req: &Completion) -> Result<(ResponseFormat, &'static str), ApiError> {
    let given = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
    let asked = [
        ("response_format", given(&req.response_format)),
        ("json_schema", given(&req.json_schema)),
        ("grammar", req.grammar.is_some()),
    ];
    let mut named = asked.iter().filter(|(_, on)| *on).map(|(f, _)| *f);
    if let (Some(a), Some(b)) = (named.next(), named.next()) {
        return Err(ApiError::bad_request(
            format!("give one of {a} and {b}, not both"),
            Some(b),
        ));
    }
    if let Some(grammar) = &req.grammar {
        let format = ResponseFormat::Gbnf {
            grammar: grammar.clone(),
        };
        return Ok((format, "grammar"));
    }
    if let Some(schema) = req.json_schema.as_ref().filter(|v| !v.is_null()) {
        return Ok((
            validate::schema_format(Some(schema), "json_schema")?,
            "json_schema",
        ));
    }
    let Some(v) = req.response_format.as_ref().filter(|v| !v.is_null()) else {
        return Ok((ResponseFormat::Text, "response_format"));
    };
    let format = match v.get("type").and_then(Value::as_str) {
        Some("text") => ResponseFormat::Text,
        // llama.cpp's extension: a json_object with its own `schema`.
        Some("json_object") => match v.get("schema") {
            None | Some(Value::Null) => ResponseFormat::JsonObject,
            schema => validate::schema_format(schema, "response_format.schema")?,
        },
        Some("json_schema") => validate::schema_format(
            v.get("json_schema").and_then(|j| j.get("schema")),
            "response_format.json_schema.schema",
        )?,
        other => {
            return Err(ApiError::bad_request(
                format!(
                    "response_format.type must be text, json_object or json_schema, got {}",
                    other.map_or_else(|| "nothing".to_string(), |t| format!("'{t}'"))
                ),
                Some("response_format"),
            ))
        }
    };
    Ok((format, "response_format"))
}
