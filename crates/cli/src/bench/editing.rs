//! The editing session that `pld bench infill` replays: held-out code typed line by line, and the
//! `/infill` requests a completion plugin sends while it is typed. The requests are built as
//! `tools/editing_session/replay.py` builds them, after llama.vim (ggml-org/llama.vim a1c8e6e,
//! `autoload/llama.vim`, `s:fim_ctx_local` and `llama#fim`):
//!
//! - the lines `[start, start + lines)` of the file are typed one after the other; the lines above
//!   and the lines after the typed ones are there already;
//! - a request goes at the start of each typed line and after each word (`stops`);
//! - the cursor's line holds what has been typed of it and nothing after the cursor (the rest of
//!   the line is not written yet), so `prompt` is the typed part and `input_suffix` starts with
//!   an empty rest of the line; a line typed so far only in whitespace sends an empty `prompt`
//!   and `n_indent` 0, as llama.vim does for a line full of whitespace;
//! - `input_prefix`: the `n_prefix` lines above the cursor's line, each ending in a newline;
//!   `input_suffix`: the rest of the line (empty), a newline, the `n_suffix` lines below, a
//!   newline;
//! - `input_extra`: the ring of chunks, the last `ring_chunks` chunks of `chunk_lines` lines of
//!   the context files in order (llama.vim picks them around the places visited; taken in order
//!   here so that runs are comparable), sent first alone with `n_predict: 0`, as llama.vim's ring
//!   update does (`ring_update`);
//! - `n_predict`, `n_indent` (the line's indentation), `top_k` 40, `top_p` 0.90, `samplers`,
//!   `t_max_prompt_ms`, `t_max_predict_ms` and the `response_fields` llama.vim asks for; and the
//!   temperature, which llama.vim leaves to the server (0 here by default, so that runs repeat
//!   and two servers' completions can be compared).
//!
//! Lines are split as Python's `str.splitlines` splits them, and columns count characters, as
//! replay.py counts them.

use serde_json::{json, Value};
use std::path::PathBuf;

/// The response fields llama.vim asks for.
pub const RESPONSE_FIELDS: [&str; 11] = [
    "content",
    "timings/prompt_n",
    "timings/prompt_ms",
    "timings/prompt_per_token_ms",
    "timings/prompt_per_second",
    "timings/predicted_n",
    "timings/predicted_ms",
    "timings/predicted_per_token_ms",
    "timings/predicted_per_second",
    "truncated",
    "tokens_cached",
];

/// The flags that shape the session: what is typed, and the plugin's settings.
#[derive(clap::Args, Debug, Clone)]
pub struct SessionArgs {
    /// The held-out code typed into (the project's workloads hold no code file to default to).
    #[arg(long, value_name = "FILE")]
    pub file: PathBuf,
    /// First line typed (0-based).
    #[arg(long, default_value_t = 0)]
    pub start: usize,
    /// Lines typed, one after the other.
    #[arg(long, default_value_t = 10)]
    pub lines: usize,
    /// Files whose chunks make the ring of extra context, in order (repeatable).
    #[arg(long, value_name = "FILE", num_args = 1..)]
    pub context: Vec<PathBuf>,
    /// Lines above the cursor's line sent as `input_prefix`.
    #[arg(long, default_value_t = 256)]
    pub n_prefix: usize,
    /// Lines below sent in `input_suffix`.
    #[arg(long, default_value_t = 64)]
    pub n_suffix: usize,
    /// `n_predict` of each completion.
    #[arg(long, default_value_t = 128)]
    pub n_predict: usize,
    /// Chunks in the ring at most (the last ones of the context files).
    #[arg(long, default_value_t = 16)]
    pub ring_chunks: usize,
    /// Lines per chunk.
    #[arg(long, default_value_t = 64)]
    pub chunk_lines: usize,
    /// `t_max_predict_ms` of each completion (0: off). 250 is what llama.vim sends with the
    /// request a keystroke makes (its configured 1000 goes only with the follow-up request it
    /// sends in the background once a completion is shown, which this session does not replay).
    #[arg(long, default_value_t = 250)]
    pub t_max_predict_ms: u64,
    /// The temperature sent (llama.vim sends none and gets the server's default); 0 is greedy,
    /// which makes runs repeatable and lets the two servers' completions be compared.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Where in each line requests go.
    #[arg(long, value_enum, default_value_t = Stops::Words)]
    pub stops: Stops,
}

/// One completion request of the session.
#[derive(Clone, Debug)]
pub struct Request {
    /// The typed line (0-based, in the file).
    pub line: usize,
    /// Characters of it typed when the request is sent.
    pub col: usize,
    /// What is left to type of the line: the held-out text a completion should write first (the
    /// whole line when what was typed of it is sent as nothing).
    pub rest: String,
    pub body: Value,
}

/// The session read from its files: the completion requests, and the ring of chunks.
#[derive(Debug)]
pub struct Session {
    pub requests: Vec<Request>,
    /// `input_extra`: the ring's chunks (empty without context files).
    pub extra: Vec<Value>,
}

/// The lines of `text` as Python's `str.splitlines` splits them (no trailing empty line).
pub fn split_lines(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut chars) = (0, text.char_indices().peekable());
    while let Some((i, c)) = chars.next() {
        let boundary = matches!(
            c,
            '\n' | '\r'
                | '\x0b'
                | '\x0c'
                | '\x1c'
                | '\x1d'
                | '\x1e'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        );
        if !boundary {
            continue;
        }
        out.push(&text[start..i]);
        start = i + c.len_utf8();
        if c == '\r' && chars.peek().map(|&(_, n)| n) == Some('\n') {
            chars.next();
            start += 1;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// Where in a line the session's requests go.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stops {
    /// At the line's start and after each word (before the space that follows it).
    Words,
    /// At the line's start and halfway through each word of two characters or more: the cursor
    /// inside a word, as a keystroke leaves it most of the time.
    MidWords,
}

/// Where requests are sent on a line, in characters.
pub fn stops(line: &str, how: Stops) -> Vec<usize> {
    let c: Vec<char> = line.chars().collect();
    let mut at = vec![0];
    let mut word_start = None;
    for i in 0..=c.len() {
        let in_word = i < c.len() && c[i] != ' ';
        match (word_start, in_word) {
            (None, true) => word_start = Some(i),
            (Some(w), false) => {
                word_start = None;
                match how {
                    Stops::Words => at.push(i),
                    Stops::MidWords if i - w >= 2 => at.push(w + (i - w).div_ceil(2)),
                    Stops::MidWords => {}
                }
            }
            _ => {}
        }
    }
    at.dedup();
    at
}

/// The ring: the last `ring` chunks of `size` lines of the files, in order.
pub fn chunks(files: &[(String, String)], size: usize, ring: usize) -> Vec<Value> {
    let mut out = Vec::new();
    for (name, text) in files {
        for piece in split_lines(text).chunks(size.max(1)) {
            let text = piece.join("\n") + "\n";
            out.push(json!({"text": text, "time": [0, 0], "filename": name}));
        }
    }
    out.split_off(out.len() - ring.min(out.len()))
}

/// The request llama.vim sends while `line` is typed up to `col` characters: the editor's line
/// holds those characters and the cursor is at their end; `above` are the lines above it and
/// `below` those below.
pub fn request(
    a: &SessionArgs,
    above: &[&str],
    line: &str,
    col: usize,
    below: &[&str],
    extra: &[Value],
) -> Value {
    // llama.vim's `s:fim_ctx_local`: a line of whitespace only sends nothing of itself and
    // indentation 0; otherwise the indentation is the line's leading whitespace.
    let typed: String = line.chars().take(col).collect();
    let (typed, indent) = if typed.trim().is_empty() {
        (String::new(), 0)
    } else {
        let indent = typed
            .chars()
            .take_while(|c| *c == ' ' || *c == '\t')
            .count();
        (typed, indent)
    };
    let prefix: String = above[above.len() - a.n_prefix.min(above.len())..]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    // The rest of the cursor's line is not typed yet: the suffix starts with an empty one.
    let suffix = format!("\n{}\n", below[..a.n_suffix.min(below.len())].join("\n"));
    json!({
        "id_slot": 0,
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": extra,
        "prompt": typed,
        "n_predict": a.n_predict,
        "stop": [],
        "n_indent": indent,
        "top_k": 40,
        "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": false,
        "cache_prompt": true,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": a.t_max_predict_ms,
        "response_fields": RESPONSE_FIELDS,
        "temperature": a.temperature,
    })
}

/// The request llama.vim's ring update sends: the chunks alone, nothing to predict.
pub fn ring_update(extra: &[Value]) -> Value {
    json!({
        "id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra,
        "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": false,
        "cache_prompt": true, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
        "response_fields": [""],
    })
}

fn read(path: &std::path::Path, flag: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {flag} {}: {e}", path.display()))
}

impl Session {
    /// Reads the files and builds every request; `model`, when given, is sent as `model`.
    pub fn read(a: &SessionArgs, model: Option<&str>) -> anyhow::Result<Session> {
        if a.chunk_lines == 0 {
            anyhow::bail!("--chunk-lines must be at least 1");
        }
        if a.lines == 0 {
            anyhow::bail!("--lines 0 types nothing: give at least 1");
        }
        let text = read(&a.file, "--file")?;
        let lines = split_lines(&text);
        if a.start + a.lines > lines.len() {
            anyhow::bail!(
                "--start {} --lines {} runs past the end of {} ({} lines)",
                a.start,
                a.lines,
                a.file.display(),
                lines.len()
            );
        }
        let mut files = Vec::new();
        for p in &a.context {
            files.push((p.display().to_string(), read(p, "--context")?));
        }
        let extra = chunks(&files, a.chunk_lines, a.ring_chunks);
        let below = &lines[a.start + a.lines..];
        let mut requests = Vec::new();
        for k in a.start..a.start + a.lines {
            for col in stops(lines[k], a.stops) {
                let mut body = request(a, &lines[..k], lines[k], col, below, &extra);
                if let Some(m) = model {
                    body["model"] = json!(m);
                }
                let sent = body["prompt"].as_str().unwrap_or_default().chars().count();
                let rest = lines[k].chars().skip(sent).collect();
                requests.push(Request {
                    line: k,
                    col,
                    rest,
                    body,
                });
            }
        }
        Ok(Session { requests, extra })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> SessionArgs {
        SessionArgs {
            file: PathBuf::new(),
            start: 0,
            lines: 1,
            context: Vec::new(),
            n_prefix: 2,
            n_suffix: 1,
            n_predict: 16,
            ring_chunks: 2,
            chunk_lines: 2,
            t_max_predict_ms: 0,
            temperature: 0.0,
            stops: Stops::Words,
        }
    }

    #[test]
    fn lines_split_as_python_splits_them() {
        assert_eq!(split_lines("a\nb\r\nc\rd\n"), ["a", "b", "c", "d"]);
        assert_eq!(split_lines("a\n\nb"), ["a", "", "b"]);
        assert_eq!(split_lines("é\u{2028}x"), ["é", "x"]);
        assert!(split_lines("").is_empty());
    }

    #[test]
    fn requests_go_at_the_start_and_after_each_word() {
        let words = |l| stops(l, Stops::Words);
        assert_eq!(words("    return a  + b"), [0, 10, 12, 15, 17]);
        assert_eq!(words(""), [0]);
        assert_eq!(words("x"), [0, 1]);
        assert_eq!(words("é é"), [0, 1, 3]);
        // Halfway through "return" (6 characters) and "ab" (2); "+" is too short.
        let mid = |l| stops(l, Stops::MidWords);
        assert_eq!(mid("    return ab  + b"), [0, 7, 12]);
        assert_eq!(mid("abc"), [0, 2]);
    }

    #[test]
    fn the_ring_keeps_the_last_chunks_in_order() {
        let files = [
            ("a.py".to_string(), "1\n2\n3\n".to_string()),
            ("b.py".to_string(), "4\n5\n".to_string()),
        ];
        let ring = chunks(&files, 2, 2);
        assert_eq!(ring.len(), 2);
        assert_eq!(ring[0]["text"], "3\n");
        assert_eq!(ring[0]["filename"], "a.py");
        assert_eq!(ring[1]["text"], "4\n5\n");
        assert!(chunks(&files, 2, 0).is_empty());
        assert_eq!(chunks(&files, 2, 9).len(), 3);
    }

    #[test]
    fn a_request_holds_the_lines_around_the_cursor() {
        let a = args();
        let b = request(&a, &["x", "y", "z"], "  ab cd", 4, &["u", "v"], &[]);
        assert_eq!(b["input_prefix"], "y\nz\n");
        assert_eq!(b["prompt"], "  ab");
        // " cd" is not typed yet: it is in no part of the request.
        assert_eq!(b["input_suffix"], "\nu\n");
        assert_eq!(b["n_indent"], 2);
        // At the start of the line nothing of it is typed, so no indentation either.
        let b = request(&a, &["x"], "  ab cd", 0, &["u"], &[]);
        assert_eq!(
            (b["prompt"].as_str(), b["n_indent"].as_u64()),
            (Some(""), Some(0))
        );
        assert_eq!(b["n_predict"], 16);
        assert_eq!(b["response_fields"].as_array().unwrap().len(), 11);
        // No lines asked for (llama.vim's getline over an empty range), none there, a blank line.
        let a = SessionArgs {
            n_prefix: 0,
            n_suffix: 0,
            ..args()
        };
        let b = request(&a, &["x"], "   ", 3, &[], &[]);
        assert_eq!(b["input_prefix"], "");
        assert_eq!(b["input_suffix"], "\n\n");
        assert_eq!(b["n_indent"], 0);
    }

    #[test]
    fn bad_ranges_are_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("pld-editing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f.py");
        std::fs::write(&file, "a = 1\nb = 2\n").unwrap();
        let a = SessionArgs {
            file: file.clone(),
            start: 1,
            lines: 2,
            ..args()
        };
        let e = Session::read(&a, None).unwrap_err().to_string();
        assert!(
            e.contains("runs past the end") && e.contains("(2 lines)"),
            "{e}"
        );
        let a = SessionArgs {
            file,
            start: 1,
            lines: 1,
            ..args()
        };
        let s = Session::read(&a, Some("m")).unwrap();
        assert_eq!(
            s.requests.iter().map(|r| r.col).collect::<Vec<_>>(),
            [0, 1, 3, 5]
        );
        assert_eq!(s.requests[2].body["prompt"], "b =");
        assert_eq!(s.requests[2].rest, " 2");
        assert_eq!(s.requests[0].rest, "b = 2");
        assert_eq!(s.requests[2].body["input_prefix"], "a = 1\n");
        assert_eq!(s.requests[2].body["model"], "m");
        let missing = SessionArgs {
            file: dir.join("none.py"),
            ..args()
        };
        let e = Session::read(&missing, None).unwrap_err().to_string();
        assert!(e.contains("cannot read --file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
