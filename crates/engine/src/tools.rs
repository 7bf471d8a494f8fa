//! Function calling for chat completions (the server's and the Python bindings'): the request's `tools` and `tool_choice` checked, the
//! grammar that forces a call when the client requires one, and the model's output turned into
//! content, reasoning and OpenAI `tool_calls`, whole or streamed (`ReplyStream`), in the model's
//! format (`ReplyFormat`): Qwen-style `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
//! blocks (the format the chat templates that take tools teach the model), or OpenAI's harmony
//! (gpt-oss: `crate::harmony`).

pub use crate::delta::Delta;
use crate::grammar::ResponseFormat;
use crate::harmony::{self, HarmonyStream};
use serde_json::{json, Value};
use std::ops::Range;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// How the request lets the model use its tools.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// The model decides (the default when tools are given).
    Auto,
    /// Tools are not offered.
    None,
    /// The model must call one of them.
    Required,
    /// The model must call this one.
    Function(String),
}

/// The checked `tools` and `tool_choice` of a request.
#[derive(Clone, Debug)]
pub struct Tools {
    /// The tools as the chat template takes them (OpenAI's objects).
    pub specs: Vec<Value>,
    pub choice: ToolChoice,
}

/// A field's problem: (message, param).
pub type FieldError = (String, String);

impl Tools {
    /// Reads `tools` and `tool_choice`; `None` when no tools are offered.
    pub fn parse(
        tools: Option<&Value>,
        choice: Option<&Value>,
    ) -> Result<Option<Tools>, FieldError> {
        let bad = |m: String, p: &str| Err((m, p.to_string()));
        let specs: Vec<Value> = match tools {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return bad("tools must be an array".into(), "tools"),
        };
        for (i, t) in specs.iter().enumerate() {
            let param = format!("tools[{i}]");
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return bad(format!("{param}.type must be 'function'"), &param);
            }
            let name = t
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str);
            if name.is_none_or(|n| n.is_empty()) {
                return bad(format!("{param}.function.name is missing"), &param);
            }
            if let Some(p) = t.get("function").and_then(|f| f.get("parameters")) {
                if !p.is_object() {
                    return bad(
                        format!("{param}.function.parameters must be a JSON Schema object"),
                        &param,
                    );
                }
            }
        }
        let choice = match choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => {
                    return bad(
                        format!("tool_choice must be auto, none, required or a function, got '{other}'"),
                        "tool_choice",
                    )
                }
            },
            Some(v) => match v.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
                Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => {
                    ToolChoice::Function(name.to_string())
                }
                _ => {
                    return bad(
                        "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}".into(),
                        "tool_choice",
                    )
                }
            },
        };
        if specs.is_empty() {
            return match choice {
                ToolChoice::Auto | ToolChoice::None => Ok(None),
                _ => bad("tool_choice requires tools".into(), "tool_choice"),
            };
        }
        if let ToolChoice::Function(name) = &choice {
            if !specs.iter().any(|t| t["function"]["name"] == name.as_str()) {
                return bad(
                    format!("tool_choice names '{name}', which is not among the tools"),
                    "tool_choice",
                );
            }
        }
        Ok(Some(Tools { specs, choice }))
    }

    /// The tools to show the model (none when the choice is `none`).
    pub fn offered(&self) -> &[Value] {
        if self.choice == ToolChoice::None {
            &[]
        } else {
            &self.specs
        }
    }

    /// The grammar (llguidance's Lark syntax) that forces one call when the choice is `required`
    /// or a named function. In `<tool_call>` blocks: `<tool_call>`, a JSON object with the
    /// function's name and arguments valid against its parameters, `</tool_call>`, and then the
    /// end; in harmony, `harmony::forced_call_grammar`.
    pub fn forced_grammar(&self, format: ReplyFormat) -> Option<String> {
        let params = |f: &Value| match f.get("parameters") {
            Some(p) if p.is_object() => p.clone(),
            _ => json!({"type": "object"}),
        };
        let forced: Vec<&Value> = match &self.choice {
            ToolChoice::Auto | ToolChoice::None => return None,
            ToolChoice::Required => self.specs.iter().collect(),
            ToolChoice::Function(name) => self
                .specs
                .iter()
                .filter(|t| t["function"]["name"] == name.as_str())
                .collect(),
        };
        if matches!(format, ReplyFormat::Harmony { .. }) {
            let functions: Vec<(String, Value)> = forced
                .iter()
                .map(|t| {
                    let f = &t["function"];
                    (
                        f["name"].as_str().unwrap_or_default().to_string(),
                        params(f),
                    )
                })
                .collect();
            return Some(harmony::forced_call_grammar(&functions));
        }
        let call = |t: &Value| {
            let f = &t["function"];
            let params = params(f);
            json!({
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        };
        let schema = match &self.choice {
            ToolChoice::Required => {
                json!({"anyOf": forced.iter().map(|t| call(t)).collect::<Vec<_>>()})
            }
            _ => call(forced.first().expect("checked in parse")),
        };
        Some(format!(
            "start: \"{}\\n\" call \"\\n{}\"\ncall: %json {}\n",
            OPEN, CLOSE, schema
        ))
    }
}

/// The function calls in a model's output: the text before the first call (if any) and each call
/// as an OpenAI `tool_calls` entry. `None` when the output holds no well-formed call.
pub fn parse_calls(text: &str, id_prefix: &str) -> Option<(Option<String>, Vec<Value>)> {
    let first = text.find(OPEN)?;
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(OPEN) {
        let body = &rest[start + OPEN.len()..];
        let (inner, next) = match body.find(CLOSE) {
            Some(end) => (&body[..end], &body[end + CLOSE.len()..]),
            None => (body, ""),
        };
        let v: Value = serde_json::from_str(inner.trim()).ok()?;
        let name = v.get("name")?.as_str()?.to_string();
        let arguments = v.get("arguments").cloned().unwrap_or_else(|| json!({}));
        let arguments = match arguments {
            Value::String(s) => s,
            other => other.to_string(),
        };
        calls.push(json!({
            "id": format!("{id_prefix}-{}", calls.len()),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }));
        rest = next;
    }
    let content = text[..first].trim();
    Some(((!content.is_empty()).then(|| content.to_string()), calls))
}

/// A streamed choice's text with calls held back: text before a call goes out as it comes (less
/// any tail that may be the start of `<tool_call>`), everything from the first call on waits for
/// the end, when it is parsed.
#[derive(Default)]
pub struct CallStream {
    held: String,
    in_call: bool,
    /// Bytes pushed, and of those the ones released as content (all those before `held`, or
    /// every one when the calls did not parse).
    read: usize,
    released: usize,
}

impl CallStream {
    /// The part of `text` that can go out now as content.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        self.read += text.len();
        if self.in_call {
            return String::new();
        }
        if let Some(at) = self.held.find(OPEN) {
            self.in_call = true;
            let out = self.held[..at].to_string();
            self.held.drain(..at);
            self.released += out.len();
            return out;
        }
        // Keep back the longest tail that is a prefix of the marker.
        let keep = (1..OPEN.len().min(self.held.len()) + 1)
            .rev()
            .find(|&n| {
                self.held.is_char_boundary(self.held.len() - n)
                    && OPEN.starts_with(&self.held[self.held.len() - n..])
            })
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        self.released += out.len();
        out
    }

    /// At the end: the calls if what was held back parses as calls, else the held text as content.
    pub fn finish(&mut self, id_prefix: &str) -> Result<Vec<Value>, String> {
        let held = std::mem::take(&mut self.held);
        match parse_calls(&held, id_prefix) {
            Some((None, calls)) if self.in_call => Ok(calls),
            _ => {
                self.released = self.read;
                Err(held)
            }
        }
    }
}

/// How a chat model writes its reply, which says how to read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyFormat {
    /// Plain text, read as it is (text completions, and chats without tools).
    Text,
    /// Text that may end in `<tool_call>` blocks (chats that offered tools).
    ToolCallBlocks,
    /// OpenAI's harmony (gpt-oss): channels of reasoning and content, and calls when `calls`
    /// (tools offered and `tool_choice` not `none`; else a call's body is content).
    Harmony { calls: bool },
}

impl ReplyFormat {
    /// The format of a chat reply from a model whose template is `template` (see
    /// `ChatTemplate::is_harmony`), tools offered (and calls allowed) or not.
    pub fn of_chat(template: Option<&crate::ChatTemplate>, tools: bool) -> ReplyFormat {
        ReplyFormat::new(template.is_some_and(|t| t.is_harmony()), tools)
    }

    /// A chat reply's format: harmony's (from a harmony template) or not, calls allowed or not.
    pub fn new(harmony: bool, calls: bool) -> ReplyFormat {
        match (harmony, calls) {
            (true, calls) => ReplyFormat::Harmony { calls },
            (false, true) => ReplyFormat::ToolCallBlocks,
            (false, false) => ReplyFormat::Text,
        }
    }

    /// Structured output (`format`) as it applies to a reply in this format: the content must
    /// be the answer, so in harmony the grammar lets the model reason first and then puts the
    /// answer alone in the final channel (`harmony::final_grammar`); in the other formats the
    /// whole output is the content, and `format` stays as it is. An error names what did not
    /// translate.
    pub fn constrain(self, format: ResponseFormat) -> Result<ResponseFormat, String> {
        match self {
            ReplyFormat::Harmony { .. } => Ok(match harmony::final_grammar(&format)? {
                Some(grammar) => ResponseFormat::Lark { grammar },
                None => format,
            }),
            _ => Ok(format),
        }
    }
}

/// A reply read as it arrives, in its `ReplyFormat`: content and reasoning as they can go out
/// (never a marker of the format, nor what may yet be one), the calls at the end; and which of
/// the reply's bytes became content (`take_content`).
pub struct ReplyStream {
    reader: Reader,
    /// Plain text: the bytes read, and those already reported by `take_content`.
    read: usize,
    reported: usize,
}

enum Reader {
    Text,
    Calls(CallStream),
    Harmony(HarmonyStream),
}

impl ReplyStream {
    pub fn new(format: ReplyFormat) -> Self {
        let reader = match format {
            ReplyFormat::Text => Reader::Text,
            ReplyFormat::ToolCallBlocks => Reader::Calls(CallStream::default()),
            ReplyFormat::Harmony { calls } => Reader::Harmony(HarmonyStream::new(calls)),
        };
        ReplyStream {
            reader,
            read: 0,
            reported: 0,
        }
    }

    /// What the next `text` of the reply adds.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        let content = match &mut self.reader {
            Reader::Text => {
                self.read += text.len();
                text.to_string()
            }
            Reader::Calls(c) => c.push(text),
            Reader::Harmony(h) => return h.push(text),
        };
        if content.is_empty() {
            Vec::new()
        } else {
            vec![Delta::Content(content)]
        }
    }

    /// At the end: what was held back, and the calls (OpenAI `tool_calls` entries with ids
    /// `{id_prefix}-{i}`; none when the reply made none).
    pub fn finish(&mut self, id_prefix: &str) -> (Vec<Delta>, Vec<Value>) {
        match &mut self.reader {
            Reader::Text => (Vec::new(), Vec::new()),
            Reader::Calls(c) => match c.finish(id_prefix) {
                Ok(calls) => (Vec::new(), calls),
                Err(held) if held.is_empty() => (Vec::new(), Vec::new()),
                Err(held) => (vec![Delta::Content(held)], Vec::new()),
            },
            Reader::Harmony(h) => h.finish(id_prefix),
        }
    }

    /// Which bytes of the reply (offsets in the text pushed so far) became content: the ranges
    /// decided since the last call, and the offset up to which all is decided (after it, text
    /// that may yet go either way: a possible marker, a call being read). Everything is
    /// decided after `finish`.
    pub fn take_content(&mut self) -> (usize, Vec<Range<usize>>) {
        let (decided, content) = match &mut self.reader {
            Reader::Text => (self.read, self.reported..self.read),
            Reader::Calls(c) => (c.read - c.held.len(), self.reported..c.released),
            Reader::Harmony(h) => return h.take_content(),
        };
        self.reported = content.end.max(self.reported);
        let content = Some(content).filter(|r| !r.is_empty());
        (decided, content.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_parsed_with_the_text_before_them() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = parse_calls(text, "call").unwrap();
        assert_eq!(content.as_deref(), Some("Let me look."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["function"]["name"], "weather");
        assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(calls[1]["id"], "call-1");
        assert!(parse_calls("no calls here", "c").is_none());
        assert!(parse_calls("<tool_call>{not json</tool_call>", "c").is_none());
    }

    #[test]
    fn streams_hold_back_what_may_be_a_call() {
        let mut s = CallStream::default();
        assert_eq!(s.push("Hello <tool"), "Hello ");
        assert_eq!(s.push("_call>\n{\"name\": \"f\", "), "");
        assert_eq!(s.push("\"arguments\": {\"a\": 1}}\n</tool_call>"), "");
        let calls = s.finish("id").unwrap();
        assert_eq!(calls[0]["function"]["name"], "f");
        let mut plain = CallStream::default();
        assert_eq!(plain.push("a <"), "a ");
        assert_eq!(plain.push(" b and more"), "< b and more");
        assert_eq!(plain.finish("id").unwrap_err(), "");
    }

    #[test]
    fn the_content_of_calls_and_text_is_located() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        let read = |format: ReplyFormat, text: &str| {
            let mut r = ReplyStream::new(format);
            let mut ranges = Vec::new();
            for piece in [&text[..10], &text[10..20], &text[20..]] {
                r.push(piece);
                let (decided, content) = r.take_content();
                assert!(content.iter().all(|c| c.end <= decided));
                ranges.extend(content);
            }
            let calls = r.finish("c").1;
            let (decided, content) = r.take_content();
            assert_eq!(decided, text.len());
            ranges.extend(content);
            let bytes: String = ranges.iter().map(|c| &text[c.clone()]).collect();
            (bytes, calls.len())
        };
        assert_eq!(
            read(ReplyFormat::ToolCallBlocks, text),
            ("Let me look.\n".into(), 1)
        );
        // No tools (or tool_choice none): a call's text is content, and no call is made.
        assert_eq!(ReplyFormat::of_chat(None, false), ReplyFormat::Text);
        assert_eq!(read(ReplyFormat::Text, text), (text.into(), 0));
        let broken = "See <tool_call>{not json</tool_call> and more";
        assert_eq!(
            read(ReplyFormat::ToolCallBlocks, broken),
            (broken.into(), 0)
        );
        // Structured output is the whole output outside harmony.
        let json = ResponseFormat::JsonObject;
        assert_eq!(ReplyFormat::Text.constrain(json.clone()), Ok(json.clone()));
        let harmony = ReplyFormat::Harmony { calls: false };
        assert!(matches!(
            harmony.constrain(json),
            Ok(ResponseFormat::Lark { .. })
        ));
    }

    #[test]
    fn choices_are_checked() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]);
        let t = Tools::parse(Some(&tools), Some(&json!("required")))
            .unwrap()
            .unwrap();
        let g = t.forced_grammar(ReplyFormat::ToolCallBlocks).unwrap();
        assert!(g.contains("%json") && g.contains("\"const\":\"f\""), "{g}");
        assert!(Tools::parse(
            Some(&tools),
            Some(&json!({"type": "function", "function": {"name": "g"}}))
        )
        .is_err());
        assert!(Tools::parse(None, Some(&json!("required"))).is_err());
        assert!(Tools::parse(Some(&json!([{"type": "retrieval"}])), None).is_err());
        let none = Tools::parse(Some(&tools), Some(&json!("none")))
            .unwrap()
            .unwrap();
        assert!(
            none.offered().is_empty()
                && none
                    .forced_grammar(ReplyFormat::Harmony { calls: false })
                    .is_none()
        );
        let h = t
            .forced_grammar(ReplyFormat::Harmony { calls: true })
            .unwrap();
        assert!(
            h.contains("\"commentary to=functions.f \" <|constrain|>"),
            "{h}"
        );
    }
}
