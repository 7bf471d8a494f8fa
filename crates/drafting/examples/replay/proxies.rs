//! Proxy traces built from the dev workloads without a model: the answers that copy the
//! prompt, in bytes or GPT-2-style words.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::traces::{Trace, TraceSet};

/// A row's first turn and the answer built for it, as text.
pub(crate) struct TextTrace {
    pub(crate) category: String,
    pub(crate) prompt: String,
    pub(crate) output: String,
}

pub(crate) fn proxy_texts(bench: &Path) -> Result<Vec<TextTrace>, String> {
    let mut out = Vec::new();
    for file in ["grounded-dev.jsonl", "spec-bench-dev.jsonl"] {
        let path = bench.join(file);
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let row: Value =
                serde_json::from_str(line).map_err(|e| format!("{}: {e}", path.display()))?;
            let category = row["category"].as_str().unwrap_or_default();
            let Some(prompt) = row["turns"].get(0).and_then(Value::as_str) else {
                continue;
            };
            let answer = match category {
                "code_edit" => code_edit_answer(prompt),
                "json_extraction" => prompt
                    .split_once("Article:")
                    .and_then(|(_, article)| entities_answer(article)),
                "extraction" if prompt.contains("named entities") => prompt
                    .split_once("\n\n")
                    .and_then(|(_, article)| entities_answer(article)),
                _ => None,
            };
            if let Some(output) = answer {
                let category = match category {
                    "extraction" => "spec_bench_entities",
                    c => c,
                };
                out.push(TextTrace {
                    category: category.to_owned(),
                    prompt: prompt.to_owned(),
                    output,
                });
            }
        }
    }
    Ok(out)
}

pub(crate) fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with every whole-identifier `from` replaced by `to`.
pub(crate) fn rename(text: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text;
    let mut prev: Option<char> = None;
    while let Some(at) = rest.find(from) {
        let before = rest[..at].chars().next_back().or(prev);
        let after = rest[at + from.len()..].chars().next();
        out.push_str(&rest[..at]);
        if before.is_some_and(is_ident) || after.is_some_and(is_ident) {
            out.push_str(from);
        } else {
            out.push_str(to);
        }
        prev = from.chars().next_back();
        rest = &rest[at + from.len()..];
    }
    out.push_str(rest);
    out
}

/// Splits `params` at its top-level commas (outside brackets and quotes), keeping every piece's
/// own whitespace.
pub(crate) fn split_params(params: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let (mut depth, mut quote, mut start) = (0i32, None::<char>, 0);
    for (i, c) in params.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                pieces.push(&params[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pieces.push(&params[start..]);
    pieces
}

/// `Any` hints on the unannotated parameters and the return of the function `code` starts with.
pub(crate) fn add_type_hints(code: &str) -> String {
    let Some(open) = code.find('(') else {
        return code.to_owned();
    };
    let mut depth = 0;
    let mut close = None;
    for (i, c) in code[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(open + i);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(close) = close else {
        return code.to_owned();
    };
    let params: Vec<String> = split_params(&code[open + 1..close])
        .into_iter()
        .map(|piece| {
            let name = piece.trim();
            let lead = &piece[..piece.len() - piece.trim_start().len()];
            let tail = &piece[piece.trim_end().len()..];
            let bare = name.trim_start_matches('*');
            let annotated = if name.is_empty()
                || name == "*"
                || name == "/"
                || bare == "self"
                || bare == "cls"
                || name.contains(':')
            {
                name.to_owned()
            } else if let Some((n, default)) = name.split_once('=') {
                format!("{}: Any = {}", n.trim(), default.trim())
            } else {
                format!("{name}: Any")
            };
            format!("{lead}{annotated}{tail}")
        })
        .collect();
    let after = &code[close + 1..];
    let after = if after.trim_start().starts_with("->") {
        after.to_owned()
    } else {
        after.replacen(':', " -> Any:", 1)
    };
    format!("{}({}){}", &code[..open], params.join(","), after)
}

/// A one-line docstring where the function has none, and a comment line above each loop.
pub(crate) fn add_docstring_and_comments(code: &str) -> String {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::with_capacity(lines.len() + 8);
    // The signature ends at the first line ending in ':' (outside a comment).
    let sig_end = lines
        .iter()
        .position(|l| l.split('#').next().unwrap_or("").trim_end().ends_with(':'))
        .unwrap_or(0);
    let body_indent = lines
        .get(sig_end + 1)
        .map(|l| &l[..l.len() - l.trim_start().len()])
        .unwrap_or("    ");
    let has_doc = lines.get(sig_end + 1).is_some_and(|l| {
        let t = l.trim_start();
        t.starts_with("\"\"\"") || t.starts_with("'''") || t.starts_with("r\"\"\"")
    });
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with("for ") || t.starts_with("while ") || t.starts_with("async for ") {
            let indent = &line[..line.len() - t.len()];
            out.push(format!("{indent}# Go through each item in turn."));
        }
        out.push((*line).to_owned());
        if i == sig_end && !has_doc {
            out.push(format!(
                "{body_indent}\"\"\"Do what the name says and return the result.\"\"\""
            ));
        }
    }
    out.join("\n")
}

/// The answer to a `code_edit` row: its function with the edit applied, in a code block.
pub(crate) fn code_edit_answer(prompt: &str) -> Option<String> {
    let (_, rest) = prompt.split_once("```python\n")?;
    let (code, _) = rest.split_once("\n```")?;
    let edited = if let Some(r) = prompt.strip_prefix("Rename the variable `") {
        let (from, r) = r.split_once("` to `")?;
        let (to, _) = r.split_once('`')?;
        rename(code, from, to)
    } else if prompt.starts_with("Add type hints") {
        add_type_hints(code)
    } else if prompt.starts_with("Add a short docstring") {
        add_docstring_and_comments(code)
    } else {
        code.to_owned()
    };
    Some(format!("```python\n{edited}\n```"))
}

pub(crate) const STOP: [&str; 24] = [
    "The", "A", "An", "But", "And", "In", "On", "At", "He", "She", "It", "This", "That", "They",
    "We", "I", "His", "Her", "Their", "Its", "There", "When", "After", "If",
];
pub(crate) const ORG_WORDS: [&str; 16] = [
    "Company",
    "Inc",
    "Service",
    "Party",
    "University",
    "Department",
    "Association",
    "Club",
    "Council",
    "Court",
    "Committee",
    "Agency",
    "Bank",
    "Corp",
    "Group",
    "News",
];

pub(crate) fn push_unique(list: &mut Vec<String>, item: &str, cap: usize) {
    if list.len() < cap && !list.iter().any(|x| x == item) {
        list.push(item.to_owned());
    }
}

/// A JSON answer of people, organisations, locations and numbers copied from `article`, by
/// capitalisation and the word before (no model, no gazetteer: a proxy of the real task's shape).
pub(crate) fn entities_answer(article: &str) -> Option<String> {
    let words: Vec<&str> = article.split_whitespace().collect();
    let clean = |w: &str| -> String {
        w.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'' && c != '-')
            .trim_end_matches("'s")
            .trim_end_matches("’s")
            .to_owned()
    };
    let capitalised = |w: &str| w.chars().next().is_some_and(char::is_uppercase);
    let (mut people, mut orgs, mut places, mut numbers) = (vec![], vec![], vec![], vec![]);
    let mut i = 0;
    while i < words.len() {
        let w = clean(words[i]);
        if w.chars().any(|c| c.is_ascii_digit()) {
            push_unique(&mut numbers, &w, 12);
            i += 1;
            continue;
        }
        if !capitalised(&w) || STOP.contains(&w.as_str()) {
            i += 1;
            continue;
        }
        // A span of capitalised words, not crossing a sentence's or clause's end.
        let mut span = vec![w.clone()];
        let mut j = i + 1;
        let ends = |raw: &str| raw.ends_with(['.', ',', ';', ':', '?', '!', ')', '\'', '"', '’']);
        if !ends(words[i]) {
            while j < words.len()
                && capitalised(&clean(words[j]))
                && !STOP.contains(&clean(words[j]).as_str())
            {
                span.push(clean(words[j]));
                let stop = ends(words[j]);
                j += 1;
                if stop {
                    break;
                }
            }
        }
        let text = span.join(" ");
        let before = if i > 0 {
            words[i - 1].to_lowercase()
        } else {
            String::new()
        };
        let sentence_start = i == 0 || words[i - 1].ends_with(['.', '?', '!', ':']);
        let acronym = span.len() == 1
            && w.len() >= 2
            && w.len() <= 5
            && w.chars().all(|c| c.is_ascii_uppercase());
        if acronym || span.iter().any(|s| ORG_WORDS.contains(&s.as_str())) {
            push_unique(&mut orgs, &text, 10);
        } else if ["in", "at", "from", "near", "to"].contains(&before.as_str()) {
            push_unique(&mut places, &text, 10);
        } else if span.len() >= 2 && span.len() <= 3 {
            push_unique(&mut people, &text, 10);
        } else if span.len() == 1 && !sentence_start && w.len() > 3 {
            push_unique(&mut orgs, &text, 10);
        }
        i = j;
    }
    let list = |items: &[String]| -> String {
        if items.is_empty() {
            return "[]".into();
        }
        let inner: Vec<String> = items
            .iter()
            .map(|s| format!("    {}", Value::String(s.clone())))
            .collect();
        format!("[\n{}\n  ]", inner.join(",\n"))
    };
    Some(format!(
        "```json\n{{\n  \"people\": {},\n  \"organizations\": {},\n  \"locations\": {},\n  \"numbers\": {}\n}}\n```",
        list(&people),
        list(&orgs),
        list(&places),
        list(&numbers)
    ))
}

/// GPT-2-style pre-tokenisation without merges: a word (letters and digits) with at most one
/// leading space, a run of punctuation with at most one leading space, or a run of whitespace
/// (a final space before a word or punctuation goes with it).
pub(crate) fn words(text: &str, vocab: &mut HashMap<String, u32>) -> Vec<u32> {
    let chars: Vec<char> = text.chars().collect();
    let mut ids = Vec::new();
    let mut i = 0;
    let class = |c: char| {
        if c.is_alphanumeric() || c == '_' {
            0
        } else if c.is_whitespace() {
            1
        } else {
            2
        }
    };
    while i < chars.len() {
        let start = i;
        let mut j = i;
        if chars[j] == ' ' && j + 1 < chars.len() && class(chars[j + 1]) != 1 {
            j += 1;
        }
        let c = class(chars[j]);
        j += 1;
        while j < chars.len() && class(chars[j]) == c {
            // Leave a run of whitespace's last space to the piece after it.
            if c == 1 && chars[j] == ' ' && j + 1 < chars.len() && class(chars[j + 1]) != 1 {
                break;
            }
            j += 1;
        }
        let piece: String = chars[start..j].iter().collect();
        let next = vocab.len() as u32;
        ids.push(*vocab.entry(piece).or_insert(next));
        i = j;
    }
    ids
}

pub(crate) fn proxy_sets(bench: &Path, units: &[String]) -> Result<Vec<TraceSet>, String> {
    let texts = proxy_texts(bench)?;
    let mut sets = Vec::new();
    for unit in units {
        let traces = match unit.as_str() {
            "bytes" => texts
                .iter()
                .map(|t| Trace {
                    category: t.category.clone(),
                    prompt: t.prompt.bytes().map(u32::from).collect(),
                    output: t.output.bytes().map(u32::from).collect(),
                })
                .collect(),
            "words" => {
                let mut vocab = HashMap::new();
                texts
                    .iter()
                    .map(|t| Trace {
                        category: t.category.clone(),
                        prompt: words(&t.prompt, &mut vocab),
                        output: words(&t.output, &mut vocab),
                    })
                    .collect()
            }
            other => return Err(format!("unknown unit {other:?} (bytes, words)")),
        };
        sets.push(TraceSet {
            unit: format!("{unit} (proxy)"),
            traces,
        });
    }
    Ok(sets)
}
