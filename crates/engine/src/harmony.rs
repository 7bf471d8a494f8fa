//! OpenAI's harmony format, which gpt-oss speaks: what the model writes after the prompt's
//! `<|start|>assistant` is a run of messages, each a header (`<|channel|>analysis`, or
//! `<|channel|>commentary to=functions.NAME <|constrain|>json`, the recipient possibly before the
//! channel), `<|message|>`, a body, and `<|end|>` (more follows, after `<|start|>assistant`) or
//! `<|return|>` / `<|call|>` (the end of the turn; the tokenizer makes these end generation, so
//! they are usually not in the text). `HarmonyStream` reads that text as it arrives into reasoning
//! (the analysis channel), content (the final channel, and commentary without a recipient: a
//! preamble) and function calls (a `functions.NAME` recipient: the body is the arguments), and
//! never lets a marker through. Text that is not harmony (no header where one must be) degrades
//! to content. When the request offered no tools (or `tool_choice` was `none`) a call's body is
//! content instead: no call is made that the client did not allow. The stream also says which
//! bytes of the reply became content (`take_content`), so that log-probabilities can be kept to
//! the content's tokens. `forced_call_grammar` is the grammar of a required call in this format,
//! `final_grammar` that of structured output (in the final channel).

use crate::delta::Delta;
use crate::grammar::ResponseFormat;
use serde_json::{json, Value};
use std::ops::Range;

pub const START: &str = "<|start|>";
pub const END: &str = "<|end|>";
pub const MESSAGE: &str = "<|message|>";
pub const CHANNEL: &str = "<|channel|>";
pub const CONSTRAIN: &str = "<|constrain|>";
pub const RETURN: &str = "<|return|>";
pub const CALL: &str = "<|call|>";

/// Every marker of the format (each one special token of gpt-oss's vocabulary).
const MARKERS: [&str; 7] = [START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL];

/// The longest header read before the text is taken for plain content instead.
const MAX_HEADER: usize = 256;

/// Where a message's body goes.
#[derive(Debug)]
enum Body {
    Reasoning,
    Content,
    /// A call of function `name`; its arguments so far (their bytes in the reply are the
    /// stream's `tentative` ranges).
    Call {
        name: String,
        arguments: String,
    },
    /// A message to a recipient that is no function (a built-in tool the model was not offered):
    /// dropped, as llama.cpp drops it.
    Dropped,
}

#[derive(Debug)]
enum State {
    /// Reading a header (its text so far, markers included) up to `<|message|>`.
    Header(String),
    Body(Body),
}

/// A reply in harmony, read as it arrives (`push`) and closed at the end (`finish`).
#[derive(Debug)]
pub struct HarmonyStream {
    /// Text that may be the start of a marker, held back until it is decided.
    pending: String,
    /// Where `pending` starts in the reply (every byte before it has been read).
    read: usize,
    state: State,
    /// The calls whose messages have ended: (name, arguments).
    calls: Vec<(String, String)>,
    /// Whether a `functions.NAME` recipient makes a call (else the body is content).
    make_calls: bool,
    /// The ranges of the reply that became content and were not yet taken (`take_content`).
    content: Vec<Range<usize>>,
    /// The ranges of the text of the header or call being read: content if the header turns out
    /// not to be one, or the call's arguments not JSON.
    tentative: Vec<Range<usize>>,
}

impl Default for HarmonyStream {
    fn default() -> Self {
        HarmonyStream::new(true)
    }
}

/// The length of the longest tail of `text` that a marker starts with (but is not the marker).
fn marker_prefix_len(text: &str) -> usize {
    let Some(at) = text
        .rfind("<|")
        .or_else(|| text.ends_with('<').then(|| text.len() - 1))
    else {
        return 0;
    };
    let tail = &text[at..];
    if MARKERS
        .iter()
        .any(|m| m.len() > tail.len() && m.starts_with(tail))
    {
        tail.len()
    } else {
        0
    }
}

/// The first marker in `text`: where, and which.
fn first_marker(text: &str) -> Option<(usize, &'static str)> {
    let mut from = 0;
    while let Some(i) = text[from..].find("<|") {
        let at = from + i;
        if let Some(m) = MARKERS.iter().find(|m| text[at..].starts_with(**m)) {
            return Some((at, m));
        }
        from = at + 2;
    }
    None
}

/// The word after `key` in a header (up to a space or a marker).
fn word_after<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let rest = &header[header.rfind(key)? + key.len()..];
    let end = rest
        .find(|c: char| c.is_whitespace())
        .into_iter()
        .chain(rest.find("<|"))
        .min()
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Whether `header` (text before its first `<|channel|>`) can begin a message the model writes:
/// its role (`assistant`, after `<|start|>`) or a recipient (` to=...`).
fn plausible(header: &str) -> bool {
    let before = header
        .split(CHANNEL)
        .next()
        .unwrap_or_default()
        .trim_start();
    let rest = match before.strip_prefix("assistant") {
        Some(rest) => rest.trim_start(),
        None if "assistant".starts_with(before) => return true,
        None => before,
    };
    rest.is_empty() || "to=".starts_with(rest) || rest.starts_with("to=")
}

/// A header's text without its markers (what degraded text shows).
fn without_markers(text: &str) -> String {
    MARKERS
        .iter()
        .fold(text.to_string(), |t, m| t.replace(m, ""))
}

/// Where the body of the message with this header goes (a call's only if `calls`).
fn body_of(header: &str, calls: bool) -> Body {
    let recipient = word_after(header, "to=").filter(|r| *r != "assistant");
    match recipient {
        Some(r) => match r.strip_prefix("functions.") {
            Some(_) if !calls => Body::Content,
            Some(name) if !name.is_empty() => Body::Call {
                name: name.to_string(),
                arguments: String::new(),
            },
            _ => Body::Dropped,
        },
        None => match word_after(header, CHANNEL) {
            Some("analysis") => Body::Reasoning,
            _ => Body::Content,
        },
    }
}

fn is_json(text: &str) -> bool {
    serde_json::from_str::<Value>(text.trim()).is_ok()
}

impl HarmonyStream {
    /// A reply read with calls (`make_calls`: the request offered tools and allows calls) or
    /// without (a call's body is content).
    pub fn new(make_calls: bool) -> Self {
        HarmonyStream {
            pending: String::new(),
            read: 0,
            state: State::Header(String::new()),
            calls: Vec::new(),
            make_calls,
            content: Vec::new(),
            tentative: Vec::new(),
        }
    }

    /// What `text`, the next of the reply, adds to the reasoning and the content.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        while let Some((at, marker)) = first_marker(&self.pending) {
            let before = self.pending[..at].to_string();
            self.pending.drain(..at + marker.len());
            self.text(&before, &mut out);
            self.read += marker.len();
            self.marker(marker);
        }
        let keep = marker_prefix_len(&self.pending);
        let ready: String = self.pending.drain(..self.pending.len() - keep).collect();
        self.text(&ready, &mut out);
        merge(out)
    }

    /// Which bytes of the reply became content: the ranges decided since the last call, and the
    /// offset up to which every byte is decided (the rest may still become content: text held
    /// back, a header, a call's arguments). After `finish` everything is decided.
    pub fn take_content(&mut self) -> (usize, Vec<Range<usize>>) {
        let decided = self
            .tentative
            .first()
            .map_or(self.read, |r| r.start.min(self.read));
        (decided, std::mem::take(&mut self.content))
    }

    /// At the end of the reply: the rest of the reasoning and content, and the calls (OpenAI
    /// `tool_calls` entries with ids `{id_prefix}-{i}`). Arguments that are not JSON come back
    /// as content instead of a call.
    pub fn finish(&mut self, id_prefix: &str) -> (Vec<Delta>, Vec<Value>) {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        self.text(&rest, &mut out);
        match std::mem::replace(&mut self.state, State::Header(String::new())) {
            // A header cut off: the model only opened a message. Text that never was a header
            // (no channel named) is content.
            State::Header(h) if !h.contains(CHANNEL) && !h.trim().is_empty() => {
                let text = without_markers(&h);
                let text = text.trim_start().strip_prefix("assistant").unwrap_or(&text);
                out.push(Delta::Content(text.to_string()));
                self.content.append(&mut self.tentative);
            }
            State::Header(_) => self.tentative.clear(),
            State::Body(body) => self.close(body),
        }
        let mut calls = Vec::new();
        for (name, arguments) in std::mem::take(&mut self.calls) {
            let arguments = arguments.trim();
            if is_json(arguments) {
                calls.push(json!({
                    "id": format!("{id_prefix}-{}", calls.len()),
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }));
            } else {
                out.push(Delta::Content(arguments.to_string()));
            }
        }
        (merge(out), calls)
    }

    /// Text between markers (the reply's next bytes), where the state sends it.
    fn text(&mut self, text: &str, out: &mut Vec<Delta>) {
        if text.is_empty() {
            return;
        }
        let range = self.read..self.read + text.len();
        self.read = range.end;
        match &mut self.state {
            State::Header(h) => {
                h.push_str(text);
                self.tentative.push(range);
                if !plausible(h) || h.len() > MAX_HEADER {
                    // Not harmony: the text so far, and what follows, is content.
                    out.push(Delta::Content(without_markers(h)));
                    self.content.append(&mut self.tentative);
                    self.state = State::Body(Body::Content);
                }
            }
            State::Body(Body::Reasoning) => out.push(Delta::Reasoning(text.to_string())),
            State::Body(Body::Content) => {
                out.push(Delta::Content(text.to_string()));
                self.content.push(range);
            }
            State::Body(Body::Call { arguments, .. }) => {
                arguments.push_str(text);
                self.tentative.push(range);
            }
            State::Body(Body::Dropped) => {}
        }
    }

    /// A marker, which moves the state.
    fn marker(&mut self, marker: &'static str) {
        let state = std::mem::replace(&mut self.state, State::Header(String::new()));
        self.state = match (state, marker) {
            (State::Header(h), MESSAGE) => {
                self.tentative.clear();
                State::Body(body_of(&h, self.make_calls))
            }
            (State::Header(mut h), CHANNEL | CONSTRAIN) => {
                h.push_str(marker);
                State::Header(h)
            }
            // A new message, or a message that ended before its body.
            (State::Header(_), _) => {
                self.tentative.clear();
                State::Header(String::new())
            }
            // Out of place in a body: dropped.
            (s @ State::Body(_), MESSAGE | CONSTRAIN) => s,
            (State::Body(body), _) => {
                self.close(body);
                // A channel in a body opens a new header (a message without its `<|end|>`).
                State::Header(if marker == CHANNEL {
                    CHANNEL.to_string()
                } else {
                    String::new()
                })
            }
        };
    }

    /// A message's end: a call is kept (its arguments, when they are not JSON, are content).
    fn close(&mut self, body: Body) {
        if let Body::Call { name, arguments } = body {
            if is_json(&arguments) {
                self.tentative.clear();
            } else {
                self.content.append(&mut self.tentative);
            }
            self.calls.push((name, arguments));
        }
    }
}

/// Adjacent deltas of one kind joined; empty ones dropped.
fn merge(deltas: Vec<Delta>) -> Vec<Delta> {
    let mut out: Vec<Delta> = Vec::new();
    for d in deltas {
        match (out.last_mut(), d) {
            (_, Delta::Content(t) | Delta::Reasoning(t)) if t.is_empty() => {}
            (Some(Delta::Content(a)), Delta::Content(b)) => a.push_str(&b),
            (Some(Delta::Reasoning(a)), Delta::Reasoning(b)) => a.push_str(&b),
            (_, d) => out.push(d),
        }
    }
    out
}

/// A whole reply: (reasoning, content, calls).
pub fn parse(text: &str, id_prefix: &str) -> (String, String, Vec<Value>) {
    let mut s = HarmonyStream::default();
    let mut deltas = s.push(text);
    let (rest, calls) = s.finish(id_prefix);
    deltas.extend(rest);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for d in deltas {
        match d {
            Delta::Reasoning(t) => reasoning.push_str(&t),
            Delta::Content(t) => content.push_str(&t),
        }
    }
    (reasoning, content, calls)
}

/// The analysis message a constrained reply may begin with (free reasoning, ended), in
/// llguidance's Lark syntax with the markers as special tokens.
const ANALYSIS: &str =
    "analysis: <|channel|> \"analysis\" <|message|> REASONING <|end|> <|start|> \"assistant\"\n\
                        REASONING: /(.|\\n)*/\n";

/// The grammar (llguidance's Lark syntax, markers as special tokens) of a reply in harmony that
/// must call one of `functions` ((name, JSON Schema of the arguments)): an optional analysis
/// message, then the call, the recipient in the channel's header as gpt-oss writes it, and its
/// arguments as compact JSON.
pub fn forced_call_grammar(functions: &[(String, Value)]) -> String {
    let mut g = format!("start: analysis? call\n{ANALYSIS}");
    let names: Vec<String> = (0..functions.len()).map(|i| format!("call_{i}")).collect();
    g.push_str(&format!("call: {}\n", names.join(" | ")));
    for (rule, (name, schema)) in names.iter().zip(functions) {
        // Compact JSON, as gpt-oss writes its arguments (`{"location":"Paris"}`).
        let mut schema = schema.clone();
        if let Some(object) = schema.as_object_mut() {
            object.insert(
                "x-guidance".into(),
                json!({"whitespace_flexible": false, "item_separator": ",", "key_separator": ":"}),
            );
        }
        g.push_str(&format!(
            "{rule}: <|channel|> {} <|constrain|> \"json\" <|message|> %json {}\n",
            Value::String(format!("commentary to=functions.{name} ")),
            schema
        ));
    }
    g
}

#[cfg(test)]
mod tests;

/// The grammar (llguidance's Lark syntax) of a reply in harmony whose answer must be `format`
/// (structured output): an optional analysis message, as in `forced_call_grammar`, then the
/// final channel's message, whose body (the content the client gets) is the answer alone: the
/// JSON, or the text of the client's grammar (nested whole). `None` for free text; an error when
/// a GBNF grammar does not translate.
pub fn final_grammar(format: &ResponseFormat) -> Result<Option<String>, String> {
    let answer = match format {
        ResponseFormat::Text => return Ok(None),
        ResponseFormat::JsonObject => format!("%json {}", json!({"type": "object"})),
        ResponseFormat::JsonSchema {
            schema: Value::Bool(true),
        } => "%json {}".to_string(),
        ResponseFormat::JsonSchema { schema } => format!("%json {schema}"),
        ResponseFormat::Lark { grammar } => format!("%lark {{\n{grammar}\n}}"),
        ResponseFormat::Gbnf { grammar } => {
            format!("%lark {{\n{}\n}}", crate::grammar::gbnf::to_lark(grammar)?)
        }
    };
    // gpt-oss may name the JSON it writes in the header, as it does for a call's arguments.
    let json = matches!(
        format,
        ResponseFormat::JsonObject | ResponseFormat::JsonSchema { .. }
    );
    let constrain = if json {
        "(\" \" <|constrain|> \"json\")? "
    } else {
        ""
    };
    Ok(Some(format!(
        "start: analysis? final\n{ANALYSIS}\
         final: <|channel|> \"final\" {constrain}<|message|> answer\n\
         answer: {answer}\n"
    )))
}
