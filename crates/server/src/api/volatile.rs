//! Volatile text: lines that agents put in their system prompts and change between requests (or
//! between sessions) without changing what they ask of the model. Left in, each such line makes
//! every prompt after it new to the prefix cache, so a 19k-token preamble that is the same in
//! every session is prefilled again. pld drops them from system messages before the chat template
//! is applied, whichever API the request came through, unless the server runs with
//! `--keep-volatile-blocks`.
//!
//! This list is the one place that knows them; docs/agents.md names each.

use engine::Message;
use std::borrow::Cow;

/// A kind of volatile line, found by how it starts.
pub struct VolatileLine {
    /// Its name in logs and docs.
    pub name: &'static str,
    /// What sends it.
    pub sender: &'static str,
    /// A line of a system message that starts with this is dropped.
    pub starts_with: &'static str,
}

/// Every kind pld drops.
pub const VOLATILE_LINES: &[VolatileLine] = &[VolatileLine {
    // `x-anthropic-billing-header: cc_version=2.1.197.58e; cc_entrypoint=sdk-cli;` (the
    // version's 3-hex suffix is derived from the request's content, so a new session gets a
    // new one; versions 2.1.36-2.1.177 add a `cch=<5 hex>;` nonce that changes every request).
    name: "claude-code-billing-header",
    sender: "Claude Code",
    starts_with: "x-anthropic-billing-header:",
}];

/// `text` without its volatile lines (each with the line breaks that follow it), and the kind of
/// the first line dropped; the text itself, borrowed, when it has none.
pub fn strip(text: &str) -> (Cow<'_, str>, Option<&'static str>) {
    let kind_of = |line: &str| {
        VOLATILE_LINES
            .iter()
            .find(|v| line.trim_start().starts_with(v.starts_with))
    };
    if !text.lines().any(|l| kind_of(l).is_some()) {
        return (Cow::Borrowed(text), None);
    }
    let mut kept = String::with_capacity(text.len());
    let mut dropped = None;
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find('\n').map_or(rest.len(), |i| i + 1);
        let (line, after) = rest.split_at(end);
        match kind_of(line) {
            Some(v) => {
                dropped.get_or_insert(v.name);
                // The blank lines that separated it from what follows go with it.
                rest = after.trim_start_matches(['\n', '\r']);
            }
            None => {
                kept.push_str(line);
                rest = after;
            }
        }
    }
    (Cow::Owned(kept), dropped)
}

/// `messages` without the volatile lines of their system messages, and without a system message
/// left empty by that (borrowed when there were none); says so in the log at debug level.
pub fn strip_system(messages: &[Message]) -> Cow<'_, [Message]> {
    let volatile = |m: &Message| m.role == "system" && strip(&m.content).1.is_some();
    if !messages.iter().any(volatile) {
        return Cow::Borrowed(messages);
    }
    let mut kept = Vec::with_capacity(messages.len());
    for m in messages {
        let (text, dropped) = strip(&m.content);
        match dropped {
            Some(kind) if m.role == "system" => {
                tracing::debug!(kind, "dropped a volatile line from a system message");
                if !text.trim().is_empty() {
                    let mut m = m.clone();
                    m.content = text.into_owned();
                    kept.push(m);
                }
            }
            _ => kept.push(m.clone()),
        }
    }
    Cow::Owned(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "x-anthropic-billing-header: cc_version=2.1.197.58e; cc_entrypoint=sdk-cli;";

    #[test]
    fn the_billing_line_goes_with_its_blank_lines() {
        let text = format!("{HEADER}\n\nYou are Claude Code.\nBe brief.");
        let (kept, kind) = strip(&text);
        assert_eq!(kept, "You are Claude Code.\nBe brief.");
        assert_eq!(kind, Some("claude-code-billing-header"));
        let mid = format!("A\n\n{HEADER} cch=1f2e3;\n\nB");
        assert_eq!(strip(&mid).0, "A\n\nB");
    }

    #[test]
    fn other_text_is_borrowed_unchanged() {
        let text = "You are helpful.\nx-anthropic-billing-header is a header name.";
        // Only a line that starts with the header's name and colon is volatile.
        let (kept, kind) = strip(text);
        assert!(matches!(kept, Cow::Borrowed(_)));
        assert_eq!(kind, None);
    }

    #[test]
    fn two_sessions_give_the_same_system_messages() {
        let session = |suffix: &str, nonce: &str| {
            vec![
                Message::new(
                    "system",
                    &format!(
                        "x-anthropic-billing-header: cc_version=2.1.197.{suffix}; {nonce}cc_entrypoint=sdk-cli;"
                    ),
                ),
                Message::new("system", "You are Claude Code."),
                Message::new("user", "hi"),
            ]
        };
        let (a, b) = (session("58e", ""), session("f02", "cch=9a3c1; "));
        let (a, b) = (strip_system(&a), strip_system(&b));
        assert_eq!(a.len(), 2, "the header-only message is dropped");
        let texts = |m: &[Message]| m.iter().map(|m| m.content.clone()).collect::<Vec<_>>();
        assert_eq!(texts(&a), texts(&b));
        // A user message is never touched.
        let u = vec![Message::new("user", HEADER)];
        assert!(matches!(strip_system(&u), Cow::Borrowed(_)));
    }
}
