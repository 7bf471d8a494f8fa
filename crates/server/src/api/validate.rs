//! From the fields a client sent to the one request the handlers trust: `ValidRequest` (the
//! prompt tokenized, the generation settings checked, the choices and the shape of the answer).
//! Every check that can refuse a request is here, each error naming its field.

use super::error::ApiError;
use super::request::{missing, ChatMessage, Content, Stop, WireRequest};
use super::Kind;
use crate::tools::Tools;
use crate::AppState;
use axum::http::StatusCode;
use drafting::SpecOverrides;
use engine::{GenerationConfig, Message, PromptEnd, ResponseFormat, SamplingParams};
use serde_json::{json, Value};
use std::sync::Arc;

use engine::sampling::{MAX_CHOICES, MAX_TOP_LOGPROBS};

/// A request that passed every check: what the engine runs and how the answer is shaped.
pub(super) struct ValidRequest {
    pub kind: Kind,
    pub prompt: Vec<u32>,
    pub config: GenerationConfig,
    /// Choices to generate (1..=`MAX_CHOICES`).
    pub n: usize,
    /// Answer as Server-Sent Events.
    pub stream: bool,
    /// Streamed: end with a chunk of token counts.
    pub include_usage: bool,
    /// Tools were offered: the output's calls become `tool_calls`.
    pub tools: bool,
}

/// Checks a chat completion: its messages rendered by the chat template (with its tools) and
/// tokenized, then its settings; a forced tool call becomes the output's grammar.
pub(super) async fn chat(
    state: &Arc<AppState>,
    req: WireRequest,
) -> Result<ValidRequest, ApiError> {
    let wire = req.messages.as_ref().ok_or_else(|| missing("messages"))?;
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
    let tools = Tools::parse(req.tools.as_ref(), req.tool_choice.as_ref())
        .map_err(|(m, p)| ApiError::bad_request(m, Some(&p)))?;
    let offered = tools.as_ref().map_or(&[][..], |t| t.offered());
    let prompt = state
        .lm
        .render_chat_ending(&messages, offered, prompt_end(&req)?)
        .map_err(|e| {
            let param = if offered.is_empty() {
                "messages"
            } else {
                "tools"
            };
            ApiError::bad_request(e.to_string(), Some(param))
        })?;
    let ids = tokenize(state, prompt, Kind::Chat).await?;
    let mut config = config(&req, state, ids.len(), Kind::Chat)?;
    if let Some(grammar) = tools.as_ref().and_then(|t| t.forced_grammar()) {
        if !config.response_format.is_text() {
            return Err(ApiError::bad_request(
                "tool_choice that forces a call cannot be combined with a response_format",
                Some("tool_choice"),
            ));
        }
        let format = ResponseFormat::Lark { grammar };
        check_grammar(state, &format, "tools")?;
        config.response_format = format;
    }
    Ok(valid(&req, Kind::Chat, ids, config, !offered.is_empty()))
}

/// Checks a text completion: one prompt string, tokenized, then its settings.
pub(super) async fn text(
    state: &Arc<AppState>,
    req: WireRequest,
) -> Result<ValidRequest, ApiError> {
    let prompt = match req.prompt.as_ref().ok_or_else(|| missing("prompt"))? {
        Value::String(s) => s.clone(),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or("").to_string()
        }
        _ => {
            return Err(ApiError::bad_request(
                "prompt must be a string (or a list of one string)",
                Some("prompt"),
            ))
        }
    };
    let ids = tokenize(state, prompt, Kind::Text).await?;
    if ids.is_empty() {
        return Err(ApiError::bad_request(
            "prompt must not be empty",
            Some("prompt"),
        ));
    }
    let config = config(&req, state, ids.len(), Kind::Text)?;
    Ok(valid(&req, Kind::Text, ids, config, false))
}

fn valid(
    req: &WireRequest,
    kind: Kind,
    prompt: Vec<u32>,
    config: GenerationConfig,
    tools: bool,
) -> ValidRequest {
    ValidRequest {
        kind,
        prompt,
        config,
        n: req.n.unwrap_or(1),
        stream: req.stream,
        include_usage: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        tools,
    }
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
            let arguments = match f.get("arguments") {
                Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
                    ApiError::bad_request(
                        format!("{param}.function.arguments is not JSON: {e}"),
                        Some(&param),
                    )
                })?,
                Some(v) => v.clone(),
                None => json!({}),
            };
            Ok(json!({
                "id": c.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {"name": f["name"], "arguments": arguments},
            }))
        })
        .collect()
}

/// Where the rendered prompt ends, from vLLM's `add_generation_prompt` and
/// `continue_final_message`.
fn prompt_end(req: &WireRequest) -> Result<PromptEnd, ApiError> {
    Ok(
        match (req.add_generation_prompt, req.continue_final_message) {
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
        },
    )
}

/// Tokenizes a prompt off the async workers (a multi-megabyte prompt takes a while), after
/// refusing one whose byte length alone proves it longer than the context: no token is longer
/// than the tokenizer's longest piece.
async fn tokenize(state: &Arc<AppState>, prompt: String, kind: Kind) -> Result<Vec<u32>, ApiError> {
    let ctx = state.config.max_model_len;
    let longest = state.longest_token_bytes.max(1);
    let fewest_tokens = prompt.len() / longest;
    if fewest_tokens >= ctx {
        return Err(ApiError::context_length(
            format!(
                "This model's maximum context length is {ctx} tokens. However, your prompt has at least {fewest_tokens} tokens ({} bytes).",
                prompt.len()
            ),
            kind.prompt_field(),
        ));
    }
    let lm = state.lm.clone();
    tokio::task::spawn_blocking(move || lm.tokenizer.encode_prompt(&prompt))
        .await
        .map_err(|e| ApiError::server(format!("tokenizing failed: {e}")))?
        .map_err(|e| ApiError::bad_request(e.to_string(), Some(kind.prompt_field())))
}

/// Checks the settings and builds the generation config (the prompt length is known).
fn config(
    req: &WireRequest,
    state: &AppState,
    prompt_len: usize,
    kind: Kind,
) -> Result<GenerationConfig, ApiError> {
    let named = req.model.as_deref();
    if let Some(model) = named.filter(|&m| m != state.config.model_name && m != state.lm.name) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{model}` does not exist."),
        )
        .param("model")
        .code("model_not_found"));
    }
    if let Some(n) = req.n {
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(ApiError::bad_request(
                format!("n must be between 1 and {MAX_CHOICES}, got {n}"),
                Some("n"),
            ));
        }
    }
    let ctx = state.config.max_model_len;
    if prompt_len >= ctx {
        return Err(ApiError::context_length(
            format!(
                "This model's maximum context length is {ctx} tokens. However, your prompt has {prompt_len} tokens."
            ),
            kind.prompt_field(),
        ));
    }
    let room = ctx - prompt_len;
    let max_tokens = req.max_completion_tokens.or(req.max_tokens).unwrap_or(room);
    if max_tokens == 0 {
        return Err(ApiError::bad_request(
            "max_tokens must be at least 1",
            Some("max_tokens"),
        ));
    }
    let top_level = SpecOverrides {
        num_speculative_tokens: req.num_speculative_tokens,
        prompt_lookup_max: req.prompt_lookup_max,
        prompt_lookup_min: req.prompt_lookup_min,
        ..Default::default()
    };
    let sampling = sampling(req)?;
    let speculation = state
        .config
        .spec
        .merge(req.speculative_config.as_ref(), &top_level)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some(e.field)))?;
    let stop = match &req.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    Ok(GenerationConfig {
        max_new_tokens: max_tokens.min(room),
        sampling,
        seed: req.seed,
        speculation,
        stop,
        logprobs: logprobs(req, kind)?,
        response_format: response_format(req, state)?,
    })
}

/// The sampling settings, in OpenAI's ranges (the engine's one check, `SamplingParams::from_request`).
fn sampling(req: &WireRequest) -> Result<SamplingParams, ApiError> {
    SamplingParams::from_request(
        req.temperature.unwrap_or(1.0),
        req.top_p.unwrap_or(1.0),
        req.top_k.unwrap_or(0),
        req.min_p.unwrap_or(0.0),
        req.repetition_penalty.unwrap_or(1.0),
    )
    .map_err(|e| ApiError::bad_request(e.message, Some(e.field)))
}

/// The `logprobs` setting: `None` for none, or the number of alternatives per token.
pub(super) fn logprobs(req: &WireRequest, kind: Kind) -> Result<Option<usize>, ApiError> {
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
    if top > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad_request(
            format!("at most {MAX_TOP_LOGPROBS} alternatives per token, asked for {top}"),
            Some(if kind == Kind::Chat {
                "top_logprobs"
            } else {
                "logprobs"
            }),
        ));
    }
    Ok(Some(top))
}

/// The output format asked for, from `response_format` or llama.cpp's `json_schema` or
/// `grammar` (one of them at most), checked by compiling its grammar: one llguidance cannot
/// compile is a 400 naming the field.
fn response_format(req: &WireRequest, state: &AppState) -> Result<ResponseFormat, ApiError> {
    let (format, field) = format_asked(req)?;
    if !format.is_text() {
        check_grammar(state, &format, field)?;
    }
    Ok(format)
}

/// The format and the field that asked for it.
fn format_asked(req: &WireRequest) -> Result<(ResponseFormat, &'static str), ApiError> {
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
        if !(schema.is_object() || schema.is_boolean()) {
            return Err(ApiError::bad_request(
                "json_schema must be a JSON Schema object",
                Some("json_schema"),
            ));
        }
        let format = ResponseFormat::JsonSchema {
            schema: schema.clone(),
        };
        return Ok((format, "json_schema"));
    }
    let bad = |m: String| ApiError::bad_request(m, Some("response_format"));
    let Some(v) = req.response_format.as_ref().filter(|v| !v.is_null()) else {
        return Ok((ResponseFormat::Text, "response_format"));
    };
    let format = match v.get("type").and_then(Value::as_str) {
        Some("text") => ResponseFormat::Text,
        // llama.cpp's extension: a json_object with its own `schema`.
        Some("json_object") => match v.get("schema") {
            None | Some(Value::Null) => ResponseFormat::JsonObject,
            Some(schema) if schema.is_object() || schema.is_boolean() => {
                ResponseFormat::JsonSchema {
                    schema: schema.clone(),
                }
            }
            Some(_) => {
                return Err(bad(
                    "response_format.schema must be a JSON Schema object".into()
                ))
            }
        },
        Some("json_schema") => {
            let schema = v
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| {
                    bad("response_format.json_schema.schema must be a JSON Schema object".into())
                })?;
            ResponseFormat::JsonSchema {
                schema: schema.clone(),
            }
        }
        other => {
            return Err(bad(format!(
                "response_format.type must be text, json_object or json_schema, got {}",
                other.map_or_else(|| "nothing".to_string(), |t| format!("'{t}'"))
            )))
        }
    };
    Ok((format, "response_format"))
}

/// Compiles the grammar of `format` once to check it; a failure is a 400 naming `param`.
fn check_grammar(state: &AppState, format: &ResponseFormat, param: &str) -> Result<(), ApiError> {
    let vocab = state.lm.model.config.vocab_size;
    state
        .lm
        .tokenizer
        .grammar(vocab)
        .and_then(|g| g.compile(format))
        .map(|_| ())
        .map_err(|e| ApiError::bad_request(e.to_string(), Some(param)))
}
