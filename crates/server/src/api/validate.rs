//! The one validation every API goes through. Each API's reader (`chat`, `responses`,
//! `messages`) turns its body into the same two plain values: a `Conversation` (messages as the
//! chat template takes them, the checked tools, where the prompt ends) or a text prompt, and the
//! `Settings` (generation settings under their common names). This module renders and tokenizes
//! the prompt, checks the settings against the model and the context, compiles any grammar, and
//! returns the `ValidRequest` the handlers submit. Errors name the field as the API calls it
//! (`Names`).

use super::error::ApiError;
use crate::tools::{ReplyFormat, Tools};
use crate::AppState;
use engine::{
    GenerationConfig, GenerationSettings, Message, PromptEnd, RenderOptions, ResponseFormat,
};
use std::sync::Arc;

/// A request that passed every check: what the engine runs and how the answer is shaped.
pub(super) struct ValidRequest {
    pub prompt: Vec<u32>,
    pub config: GenerationConfig,
    /// Choices to generate (1..=`MAX_CHOICES`).
    pub n: usize,
    /// Answer as Server-Sent Events.
    pub stream: bool,
    /// Streamed chat or text completion: end with a chunk of token counts.
    pub include_usage: bool,
    /// How the output is read: as it is (text completions), for `<tool_call>` blocks (tools
    /// offered), or as harmony (a gpt-oss chat).
    pub reply: ReplyFormat,
    /// Limits besides the token budget (`/infill`'s; none by default).
    pub limits: crate::scheduler::Limits,
}

/// What an API calls the fields that errors name.
#[derive(Clone, Copy, Debug)]
pub(super) struct Names {
    /// The field that holds the prompt (`messages`, `prompt`, `input`).
    pub prompt: &'static str,
    /// The field that caps the output (`max_tokens`, `max_completion_tokens`,
    /// `max_output_tokens`): the one the client sent.
    pub max_tokens: &'static str,
    /// The field that asks for alternatives per token (`top_logprobs` in chat completions,
    /// `logprobs` in text completions).
    pub logprobs: &'static str,
    /// The field that holds the tools.
    pub tools: &'static str,
}

impl Names {
    /// An API's names for its prompt and its cap; the rest as OpenAI names them.
    pub(super) const fn new(prompt: &'static str, max_tokens: &'static str) -> Names {
        Names {
            prompt,
            max_tokens,
            logprobs: "logprobs",
            tools: "tools",
        }
    }
}

/// A chat prompt as the template takes it.
pub(super) struct Conversation {
    pub messages: Vec<Message>,
    pub tools: Option<Tools>,
    pub end: PromptEnd,
    /// What else the template reads (the reasoning effort).
    pub options: RenderOptions,
}

/// The settings of a request, under the names every API shares (each reader maps its own names
/// onto these). `None`: the default.
#[derive(Default)]
pub(super) struct Settings {
    /// The model the client named (absent: the served model).
    pub model: Option<String>,
    pub n: Option<usize>,
    /// What the engine checks and defaults (`GenerationSettings::config`).
    pub generation: GenerationSettings,
    /// The field that asked for the output format (`generation.response_format`).
    pub format_field: &'static str,
    pub stream: bool,
    pub include_usage: bool,
}

/// The prompt text of a conversation: its messages rendered by the chat template with its tools,
/// the volatile lines of its system messages dropped (`volatile`) unless the server keeps them.
pub(super) fn render(
    state: &AppState,
    conv: &Conversation,
    names: Names,
) -> Result<String, ApiError> {
    let offered = conv.tools.as_ref().map_or(&[][..], |t| t.offered());
    let messages = if state.config.keep_volatile_lines {
        std::borrow::Cow::Borrowed(&conv.messages[..])
    } else {
        super::volatile::strip_system(&conv.messages)
    };
    state
        .lm
        .render_chat_ending(&messages, offered, conv.end, &conv.options)
        .map_err(|e| {
            let param = if offered.is_empty() {
                names.prompt
            } else {
                names.tools
            };
            ApiError::bad_request(e.to_string(), Some(param))
        })
}

/// Checks a chat request: the conversation rendered and tokenized, then its settings; a forced
/// tool call becomes the output's grammar, and structured output the grammar of the reply's
/// content (`ReplyFormat::constrain`: in harmony, after any reasoning, in the final channel).
pub(super) async fn chat(
    state: &Arc<AppState>,
    conv: Conversation,
    settings: Settings,
    names: Names,
) -> Result<ValidRequest, ApiError> {
    let prompt = render(state, &conv, names)?;
    let ids = tokenize(state, prompt, names.prompt).await?;
    let mut config = config(&settings, state, ids.len(), names)?;
    let tools = conv.tools.as_ref();
    let offered = tools.is_some_and(|t| !t.offered().is_empty());
    let reply = ReplyFormat::of_chat(state.lm.chat_template.as_ref(), offered);
    if let Some(grammar) = tools.and_then(|t| t.forced_grammar(reply)) {
        if !config.response_format.is_text() {
            return Err(ApiError::bad_request(
                format!(
                    "a tool_choice that forces a call cannot be combined with {}",
                    settings.format_field
                ),
                Some("tool_choice"),
            ));
        }
        let format = ResponseFormat::Lark { grammar };
        check_grammar(state, &format, names.tools)?;
        config.response_format = format;
    } else {
        // The content must be the answer: in harmony it goes in the final channel.
        let field = settings.format_field;
        let format = reply
            .constrain(config.response_format.clone())
            .map_err(|e| ApiError::bad_request(format!("{field}: {e}"), Some(field)))?;
        if format != config.response_format {
            check_grammar(state, &format, field)?;
            config.response_format = format;
        }
    }
    Ok(valid(&settings, ids, config, reply))
}

/// Checks a text completion: one prompt string, tokenized, then its settings.
pub(super) async fn text(
    state: &Arc<AppState>,
    prompt: String,
    settings: Settings,
    names: Names,
) -> Result<ValidRequest, ApiError> {
    let ids = tokenize(state, prompt, names.prompt).await?;
    tokens(state, ids, settings, names)
}

/// Checks a text completion whose prompt is token ids (a fill-in-the-middle prompt, or a
/// tokenized text): not empty, then its settings.
pub(super) fn tokens(
    state: &Arc<AppState>,
    ids: Vec<u32>,
    settings: Settings,
    names: Names,
) -> Result<ValidRequest, ApiError> {
    if ids.is_empty() {
        return Err(ApiError::bad_request(
            format!("{} must not be empty", names.prompt),
            Some(names.prompt),
        ));
    }
    let config = config(&settings, state, ids.len(), names)?;
    Ok(valid(&settings, ids, config, ReplyFormat::Text))
}

fn valid(
    settings: &Settings,
    prompt: Vec<u32>,
    config: GenerationConfig,
    reply: ReplyFormat,
) -> ValidRequest {
    ValidRequest {
        prompt,
        config,
        n: settings.n.unwrap_or(1),
        stream: settings.stream,
        include_usage: settings.include_usage,
        reply,
        limits: Default::default(),
    }
}

/// Tokenizes a prompt off the async workers (a multi-megabyte prompt takes a while), after
/// refusing one whose byte length alone proves it longer than the context: no token is longer
/// than the tokenizer's longest piece.
pub(super) async fn tokenize(
    state: &Arc<AppState>,
    prompt: String,
    field: &str,
) -> Result<Vec<u32>, ApiError> {
    let ctx = state.config.max_model_len;
    let longest = state.longest_token_bytes.max(1);
    let fewest_tokens = prompt.len() / longest;
    if fewest_tokens >= ctx {
        return Err(ApiError::context_length(
            format!(
                "This model's maximum context length is {ctx} tokens. However, your prompt has at least {fewest_tokens} tokens ({} bytes).",
                prompt.len()
            ),
            field,
        ));
    }
    let lm = state.lm.clone();
    tokio::task::spawn_blocking(move || lm.tokenizer.encode_prompt(&prompt))
        .await
        .map_err(|e| ApiError::server(format!("tokenizing failed: {e}")))?
        .map_err(|e| ApiError::bad_request(e.to_string(), Some(field)))
}

/// Checks that `model` (when named) is one this server serves: a 404 otherwise.
pub(super) fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if !state.config.serves(m) && m != state.lm.name => Err(ApiError::not_found(
            format!("The model `{m}` does not exist."),
            Some("model"),
        )
        .code("model_not_found")),
        _ => Ok(()),
    }
}

/// Checks the settings and builds the generation config (the prompt length is known).
fn config(
    s: &Settings,
    state: &AppState,
    prompt_len: usize,
    names: Names,
) -> Result<GenerationConfig, ApiError> {
    check_model(state, s.model.as_deref())?;
    if let Some(n) = s.n {
        engine::check_choices(n).map_err(|e| ApiError::bad_request(e.message, Some(e.field)))?;
    }
    let ctx = state.config.max_model_len;
    if prompt_len >= ctx {
        return Err(ApiError::context_length(
            format!(
                "This model's maximum context length is {ctx} tokens. However, your prompt has {prompt_len} tokens."
            ),
            names.prompt,
        ));
    }
    let room = budget_room(s, state, prompt_len, names)?;
    let config = s
        .generation
        .config(&state.config.spec, room, names.max_tokens)
        .map_err(|e| {
            let field = if e.field == "logprobs" {
                names.logprobs
            } else {
                e.field
            };
            ApiError::bad_request(e.message, Some(field))
        })?;
    if !config.response_format.is_text() {
        check_grammar(state, &config.response_format, s.format_field)?;
    }
    Ok(config)
}

/// The output a request may reach: the context's room, within the KV cache budget when the
/// client named no `max_tokens`; a request whose caches could never fit the budget, even alone,
/// is a 400 naming its prompt or its `max_tokens` (`KvBudget::check`).
fn budget_room(
    s: &Settings,
    state: &AppState,
    prompt_len: usize,
    names: Names,
) -> Result<usize, ApiError> {
    let ctx_room = state.config.max_model_len - prompt_len;
    let choices = s.n.unwrap_or(1);
    let over = |e: engine::EngineError, field: &str| {
        ApiError::bad_request(e.to_string(), Some(field)).code("kv_cache_budget_exceeded")
    };
    let budget = &state.budget;
    budget
        .check(prompt_len + 1, choices)
        .map_err(|e| over(e, names.prompt))?;
    if let Some(asked) = s.generation.max_tokens.filter(|&m| m > 0) {
        budget
            .check(prompt_len + asked.min(ctx_room), choices)
            .map_err(|e| over(e, names.max_tokens))?;
    }
    Ok(ctx_room.min(budget.room(prompt_len, choices)))
}

/// A JSON Schema given for structured output: an object or a boolean, else a 400 naming `field`.
pub(super) fn schema_format(
    schema: Option<&serde_json::Value>,
    field: &str,
) -> Result<ResponseFormat, ApiError> {
    match schema {
        Some(s) if s.is_object() || s.is_boolean() => {
            Ok(ResponseFormat::JsonSchema { schema: s.clone() })
        }
        _ => Err(ApiError::bad_request(
            format!("{field} must be a JSON Schema object"),
            Some(field),
        )),
    }
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
