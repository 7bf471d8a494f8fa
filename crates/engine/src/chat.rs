//! Conversations into prompt text: the model's chat template (`tokenizer.chat_template`), rendered
//! with minijinja the way Hugging Face renders it (Jinja2 semantics with trimmed blocks, Python
//! string methods (`.strip()`), `raise_exception`, `strftime_now`, `tojson` as Python's
//! `json.dumps` writes it, `add_generation_prompt`, `reasoning_effort` when asked), and `render`,
//! which decides where the prompt ends (`PromptEnd`: a next turn opened, a last assistant message
//! continued, or neither) and refuses what a template cannot take. Harmony templates (gpt-oss,
//! `ChatTemplate::is_harmony`) are known by their markers; the filters they need are in
//! `template_fns`.

use crate::error::{EngineError, Result};
use crate::harmony;
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// Where a rendered conversation ends (`render`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PromptEnd {
    /// As llama.cpp's server does: a last assistant message (without tool calls) is a prefill the
    /// reply continues; otherwise the assistant's next turn is opened.
    #[default]
    Auto,
    /// The assistant's next turn is opened, whatever the last message (`add_generation_prompt`).
    NextTurn,
    /// The last message, an assistant's, is continued (vLLM's `continue_final_message`).
    ContinueLast,
    /// The conversation as it is, no turn opened (`add_generation_prompt: false`).
    AsIs,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant turn's function calls, as templates take them: `{"id", "type": "function",
    /// "function": {"name", "arguments": <object>}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` turn: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning (OpenAI chat's `reasoning_content`), for templates that
    /// show it (gpt-oss's shows the reasoning before a call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            thinking: None,
        }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    harmony: bool,
}

fn raise_exception(msg: String) -> std::result::Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// Options of a rendering beyond the messages and tools, passed to templates that read them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RenderOptions {
    /// `low`, `medium` or `high` (gpt-oss's `Reasoning:` line); `None`: the template's default.
    pub reasoning_effort: Option<String>,
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", template_fns::strftime_now);
        env.add_filter("tojson", template_fns::tojson);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| EngineError::ChatTemplate(format!("cannot parse the template: {e}")))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            harmony: source.contains(harmony::CHANNEL) && source.contains(harmony::MESSAGE),
        })
    }

    /// Whether the template writes OpenAI's harmony format (gpt-oss): its reply is then read by
    /// `crate::harmony`.
    pub fn is_harmony(&self) -> bool {
        self.harmony
    }

    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// `render` with the functions the model may call (`tools`, OpenAI's `{"type": "function",
    /// "function": {...}}` objects), for templates that take them; none renders as `render`.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let options = RenderOptions::default();
        self.render_with_options(messages, tools, add_generation_prompt, &options)
    }

    /// `render_with_tools` with the `options` the template may read.
    pub fn render_with_options(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        options: &RenderOptions,
    ) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| EngineError::ChatTemplate(e.to_string()))?;
        let tools = (!tools.is_empty()).then_some(tools);
        // Only what was asked is defined, so that a template's defaults hold otherwise.
        let effort = match &options.reasoning_effort {
            Some(e) => minijinja::context! { reasoning_effort => e },
            None => minijinja::context! {},
        };
        tmpl.render(minijinja::context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
            ..effort
        })
        .map_err(|e| EngineError::ChatTemplate(format!("rendering failed: {e}")))
    }
}

/// The prompt text for a conversation rendered by the model's `template` (none: a base model,
/// which has no turns), ending where `end` says.
pub fn render(
    template: Option<&ChatTemplate>,
    messages: &[Message],
    tools: &[serde_json::Value],
    end: PromptEnd,
    options: &RenderOptions,
) -> Result<String> {
    let adjusted;
    let messages = if template.is_some_and(ChatTemplate::is_harmony) {
        adjusted = for_harmony(messages);
        &adjusted[..]
    } else {
        messages
    };
    // The last message, when it is one the reply could continue.
    let open_last = messages
        .split_last()
        .filter(|(last, _)| last.role == "assistant" && last.tool_calls.is_none());
    let (last, before) =
        match (end, open_last) {
            (PromptEnd::Auto | PromptEnd::ContinueLast, Some(split)) => split,
            (PromptEnd::ContinueLast, None) => return Err(EngineError::ChatTemplate(
                "continuing the final message needs an assistant message (without tool calls) last"
                    .into(),
            )),
            _ => return render_turns(template, messages, tools, end != PromptEnd::AsIs, options),
        };
    if before.last().is_some_and(|m| m.role == "assistant") {
        return Err(EngineError::ChatTemplate(
            "the conversation ends with two assistant messages: only one can be continued".into(),
        ));
    }
    let mut prompt = render_turns(template, before, tools, true, options)?;
    if template.is_some_and(ChatTemplate::is_harmony) {
        // The turn opened is `<|start|>assistant`: what is continued is its final message.
        prompt.push_str(harmony::CHANNEL);
        prompt.push_str("final");
        prompt.push_str(harmony::MESSAGE);
    }
    prompt.push_str(&last.content);
    Ok(prompt)
}

/// Messages as gpt-oss's template takes them: a call's reasoning is its analysis message, which
/// the template refuses beside content, so content beside both is dropped (as llama.cpp does).
fn for_harmony(messages: &[Message]) -> Vec<Message> {
    let mut out = messages.to_vec();
    for m in &mut out {
        if m.thinking.is_some() && m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
            m.content.clear();
        }
    }
    out
}

/// The conversation rendered by the template, up to the assistant's next turn when
/// `add_generation_prompt`.
fn render_turns(
    template: Option<&ChatTemplate>,
    messages: &[Message],
    tools: &[serde_json::Value],
    add_generation_prompt: bool,
    options: &RenderOptions,
) -> Result<String> {
    match template {
        Some(t) if !tools.is_empty() => {
            let with = t.render_with_options(messages, tools, add_generation_prompt, options)?;
            if with == t.render_with_options(messages, &[], add_generation_prompt, options)? {
                return Err(EngineError::ChatTemplate(
                    "the model's chat template does not take tools".into(),
                ));
            }
            Ok(with)
        }
        Some(t) => t.render_with_options(messages, &[], add_generation_prompt, options),
        None => Err(EngineError::ChatTemplate(
            "the model has no chat template (tokenizer.chat_template): it is a base model, give it plain text (pld generate without --chat, or /v1/completions)".into(),
        )),
    }
}

mod template_fns;

#[cfg(test)]
mod harmony_tests;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_methods_and_exceptions() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}[{{ m.content.strip() }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let out = t.render(&[Message::new("user", "  hi  ")], true).unwrap();
        assert_eq!(out, "[hi]>");
        let e = t.render(&[Message::new("bad", "x")], false).unwrap_err();
        assert!(e.to_string().contains("no bad roles"), "{e}");
    }

    #[test]
    fn parse_errors_are_reported() {
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }
}
