//! Offline comparison of the match policies: token traces replayed through the drafter with
//! greedy verification simulated, and the cost of a proposal at long contexts and large batches.
//!
//! ```text
//! cargo run --release -p pld-drafting --example replay -- [OPTIONS] [TRACES.json ...]
//!
//!   TRACES.json      a JSON list of {"prompt": [ids], "output": [ids]} (an optional "category"
//!                    names the row's group; otherwise the file's name does); every
//!                    /work/traces/*.json is read as well
//!   --bench DIR      also build proxy traces from DIR/grounded-dev.jsonl and
//!                    DIR/spec-bench-dev.jsonl (default the repository's workloads/; "none" for none)
//!   --units LIST     units of the proxy traces: bytes,words (default both)
//!   --sweep          also replay the scored policy under a grid of its settings
//!   --scaling        time proposals at 1k-128k tokens of context for batches of 64 and 256
//!   --steps N        steps timed per scaling case (default 30)
//!   --max-batch-tokens N   skip scaling cases holding more tokens than this (default 40M)
//!   --decay X, --min-path-p X, --min-token-p X, --max-occurrences N
//!                    settings of the scored policy (default: ScoreParams::default())
//!   --json FILE      write every result as JSON
//!   --show-proxies   print the proxy answers built from the workloads, and stop
//! ```
//!
//! Replay: for each trace, policy and K (K = 4 with n-grams 1-3, K = 8 with 1-4, as vLLM's
//! `ngram` was run in issue 40), a drafter starts from the prompt. Each step it proposes at most
//! K tokens (adaptive length off, as `pld.vllm.Proposer` runs it); the accepted length is the
//! longest prefix of the draft equal to the true next output tokens; the step emits the accepted
//! tokens and the model's own next one (fewer at the end of the output). Reported per policy and
//! K: steps, drafted and accepted tokens, tokens per step (output tokens / steps) and the median
//! time of one `propose` call.
//!
//! Proxy traces: there is no tokenizer here, so the dev workloads' rows are turned into traces
//! without a model, for the rows whose answer is a copy of the prompt: `code_edit` rows answer
//! with the prompt's function after the edit the row asks for, applied mechanically (the rename;
//! `Any` hints on unannotated parameters and the return; a one-line docstring where none is and
//! a comment line above each loop), in a ```python block; `json_extraction` rows (and the
//! Spec-Bench extraction row that asks for named entities) answer with a JSON object of
//! capitalised names and numbers copied from the article (a crude heuristic, but every value is
//! copied text, as in the real task). Units are bytes, or "words": GPT-2-style pre-tokenisation
//! (a word with its leading space, a run of punctuation, a run of whitespace) without BPE merges,
//! each distinct piece one id. Both are proxies for a model's tokens and answers; real traces in
//! the same JSON format are read the same way.

use std::collections::HashMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use drafting::{
    propose_by_scan, Drafter, MatchPolicy, NgramConfig, NgramIndex, ScoreParams, SpecConfig,
};
use serde_json::{json, Value};

/// One sequence to replay: its prompt and the output the model really produced.
struct Trace {
    category: String,
    prompt: Vec<u32>,
    output: Vec<u32>,
}

/// A set of traces in one unit (real tokens, bytes or words).
struct TraceSet {
    unit: String,
    traces: Vec<Trace>,
}

/// K and the n-gram range it is run with.
const SETTINGS: [(usize, usize, usize); 2] = [(4, 1, 3), (8, 1, 4)];

#[derive(Default, Clone)]
struct Tally {
    rows: usize,
    steps: usize,
    drafted: usize,
    accepted: usize,
    output: usize,
    propose_ns: Vec<u64>,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.rows += other.rows;
        self.steps += other.steps;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.output += other.output;
        self.propose_ns.extend_from_slice(&other.propose_ns);
    }

    fn tokens_per_step(&self) -> f64 {
        self.output as f64 / self.steps.max(1) as f64
    }

    fn median_us(&self) -> f64 {
        median(&self.propose_ns) / 1000.0
    }
}

fn median(values: &[u64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid] as f64
    } else {
        (v[mid - 1] + v[mid]) as f64 / 2.0
    }
}

/// Replays one trace under greedy verification.
fn replay(trace: &Trace, config: &SpecConfig, params: Option<ScoreParams>) -> Tally {
    let mut drafter = Drafter::new(config, &trace.prompt);
    if let Some(p) = params {
        drafter.set_score_params(p);
    }
    let k = config.num_speculative_tokens;
    let mut t = Tally {
        rows: 1,
        output: trace.output.len(),
        ..Tally::default()
    };
    let mut pos = 0;
    let mut draft = Vec::with_capacity(k);
    let mut path = Vec::with_capacity(k);
    while pos < trace.output.len() {
        let start = Instant::now();
        let tree = drafter.propose(k, None);
        let elapsed = start.elapsed().as_nanos() as u64;
        draft.clear();
        draft.extend_from_slice(tree.tokens());
        t.propose_ns.push(elapsed);
        let truth = &trace.output[pos..];
        let accepted = draft.iter().zip(truth).take_while(|(a, b)| a == b).count();
        let emitted = (accepted + 1).min(truth.len());
        path.clear();
        path.extend(0..accepted);
        drafter.observe(&path);
        for &token in &truth[..emitted] {
            drafter.push(token);
        }
        t.steps += 1;
        t.drafted += draft.len();
        t.accepted += accepted;
        pos += emitted;
    }
    t
}

fn config(policy: MatchPolicy, k: usize, min_n: usize, max_n: usize) -> SpecConfig {
    SpecConfig {
        num_speculative_tokens: k,
        prompt_lookup_min: min_n,
        prompt_lookup_max: max_n,
        match_policy: policy,
        adaptive: false,
        ..SpecConfig::default()
    }
}

/// Tallies per category (in order of first appearance) and in total.
fn replay_set(
    set: &TraceSet,
    config: &SpecConfig,
    params: Option<ScoreParams>,
) -> Vec<(String, Tally)> {
    let mut by: Vec<(String, Tally)> = Vec::new();
    let mut all = Tally::default();
    for trace in &set.traces {
        let t = replay(trace, config, params);
        all.add(&t);
        match by.iter_mut().find(|(c, _)| *c == trace.category) {
            Some((_, tally)) => tally.add(&t),
            None => by.push((trace.category.clone(), t)),
        }
    }
    if by.len() > 1 {
        by.push(("all".into(), all));
    }
    by
}

fn print_replay(set: &TraceSet, params: ScoreParams, results: &mut Vec<Value>) {
    println!(
        "\n## Replay, unit: {} ({} traces, {} output tokens)\n",
        set.unit,
        set.traces.len(),
        set.traces.iter().map(|t| t.output.len()).sum::<usize>()
    );
    println!("| category | policy | K | n | steps | drafted | accepted | accepted/drafted | tokens/step | µs/step (median) |");
    println!("|---|---|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut rows: Vec<(String, MatchPolicy, usize, usize, usize, Tally)> = Vec::new();
    for (k, min_n, max_n) in SETTINGS {
        for policy in MatchPolicy::ALL {
            for (category, t) in replay_set(set, &config(policy, k, min_n, max_n), Some(params)) {
                rows.push((category, policy, k, min_n, max_n, t));
            }
        }
    }
    // Grouped by category, then K, then policy.
    let mut categories: Vec<String> = Vec::new();
    for r in &rows {
        if !categories.contains(&r.0) {
            categories.push(r.0.clone());
        }
    }
    for c in &categories {
        for (k, _, _) in SETTINGS {
            for r in rows.iter().filter(|r| &r.0 == c && r.2 == k) {
                let (category, policy, k, min_n, max_n, t) = r;
                println!(
                    "| {category} | {policy} | {k} | {min_n}-{max_n} | {} | {} | {} | {:.3} | {:.3} | {:.3} |",
                    t.steps,
                    t.drafted,
                    t.accepted,
                    t.accepted as f64 / t.drafted.max(1) as f64,
                    t.tokens_per_step(),
                    t.median_us()
                );
                results.push(json!({
                    "kind": "replay", "unit": set.unit, "category": category,
                    "policy": policy.to_string(), "k": k, "min_n": min_n, "max_n": max_n,
                    "rows": t.rows, "steps": t.steps, "drafted": t.drafted, "accepted": t.accepted,
                    "output_tokens": t.output, "tokens_per_step": t.tokens_per_step(),
                    "propose_us_median": t.median_us(),
                }));
            }
        }
    }
}

fn print_sweep(set: &TraceSet, results: &mut Vec<Value>) {
    println!(
        "\n## Scored settings, unit: {} (all categories)\n",
        set.unit
    );
    println!("| K | decay | min path p | drafted | accepted | tokens/step |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for (k, min_n, max_n) in SETTINGS {
        let c = config(MatchPolicy::Scored, k, min_n, max_n);
        for decay in [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4] {
            for min_p in [0.0, 0.2, 0.3, 0.4, 0.5, 0.6] {
                let params = ScoreParams {
                    decay,
                    min_path_probability: min_p,
                    ..ScoreParams::default()
                };
                let by = replay_set(set, &c, Some(params));
                let (_, t) = by.last().expect("at least one category");
                println!(
                    "| {k} | {decay} | {min_p} | {} | {} | {:.3} |",
                    t.drafted,
                    t.accepted,
                    t.tokens_per_step()
                );
                results.push(json!({
                    "kind": "sweep", "unit": set.unit, "k": k, "decay": decay,
                    "min_path_probability": min_p, "drafted": t.drafted, "accepted": t.accepted,
                    "tokens_per_step": t.tokens_per_step(),
                }));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Traces from files.

fn read_trace_file(path: &Path) -> Result<Vec<Trace>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let value: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let rows = value
        .as_array()
        .ok_or_else(|| format!("{}: expected a JSON list of traces", path.display()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ids = |v: Option<&Value>, field: &str, i: usize| -> Result<Vec<u32>, String> {
        v.and_then(Value::as_array)
            .ok_or_else(|| format!("{}: trace {i} has no list `{field}`", path.display()))?
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| {
                        format!("{}: trace {i}: `{field}` holds a non-id", path.display())
                    })
            })
            .collect()
    };
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            Ok(Trace {
                category: row
                    .get("category")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| stem.clone()),
                prompt: ids(row.get("prompt"), "prompt", i)?,
                output: ids(row.get("output"), "output", i)?,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Proxy traces from the dev workloads' text.

/// A row's first turn and the answer built for it, as text.
struct TextTrace {
    category: String,
    prompt: String,
    output: String,
}

fn proxy_texts(bench: &Path) -> Result<Vec<TextTrace>, String> {
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

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with every whole-identifier `from` replaced by `to`.
fn rename(text: &str, from: &str, to: &str) -> String {
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
fn split_params(params: &str) -> Vec<&str> {
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
fn add_type_hints(code: &str) -> String {
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
fn add_docstring_and_comments(code: &str) -> String {
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
fn code_edit_answer(prompt: &str) -> Option<String> {
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

const STOP: [&str; 24] = [
    "The", "A", "An", "But", "And", "In", "On", "At", "He", "She", "It", "This", "That", "They",
    "We", "I", "His", "Her", "Their", "Its", "There", "When", "After", "If",
];
const ORG_WORDS: [&str; 16] = [
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

fn push_unique(list: &mut Vec<String>, item: &str, cap: usize) {
    if list.len() < cap && !list.iter().any(|x| x == item) {
        list.push(item.to_owned());
    }
}

/// A JSON answer of people, organisations, locations and numbers copied from `article`, by
/// capitalisation and the word before (no model, no gazetteer: a proxy of the real task's shape).
fn entities_answer(article: &str) -> Option<String> {
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
fn words(text: &str, vocab: &mut HashMap<String, u32>) -> Vec<u32> {
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

fn proxy_sets(bench: &Path, units: &[String]) -> Result<Vec<TraceSet>, String> {
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

// ---------------------------------------------------------------------------------------------
// Proposal time against context length and batch size.

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Token ids drawn from a Zipf law (exponent 1.1) over a 32k vocabulary, with spans of 8-64
/// earlier tokens copied in one time in eight: common tokens recur thousands of times at long
/// contexts (the scored policy's worst case, 64 occurrences read), and copies give long matches.
struct TextSource {
    cdf: Vec<f64>,
    rng: Rng,
    copy_left: usize,
    copy_from: usize,
}

impl TextSource {
    fn new(seed: u64) -> Self {
        let weights: Vec<f64> = (1..=32_000).map(|r| 1.0 / (r as f64).powf(1.1)).collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        TextSource {
            cdf,
            rng: Rng(seed),
            copy_left: 0,
            copy_from: 0,
        }
    }

    fn next(&mut self, so_far: &[u32]) -> u32 {
        if self.copy_left == 0 && so_far.len() > 128 && self.rng.below(8) == 0 {
            self.copy_left = 8 + self.rng.below(57);
            self.copy_from = self.rng.below(so_far.len() - 64);
        }
        if self.copy_left > 0 {
            self.copy_left -= 1;
            self.copy_from += 1;
            return so_far[self.copy_from - 1];
        }
        let u = self.rng.unit();
        self.cdf.partition_point(|&c| c < u).min(31_999) as u32
    }
}

fn scaling(steps: usize, max_batch_tokens: usize, params: ScoreParams, results: &mut Vec<Value>) {
    const K: usize = 8;
    const MIN_N: usize = 1;
    const MAX_N: usize = 4;
    const BATCHES: [usize; 2] = [64, 256];
    println!(
        "\n## Proposal time per step across a batch (K = {K}, n-grams {MIN_N}-{MAX_N}; each step \
         pushes one token to every sequence, then proposes for every sequence; median of {steps} steps)\n"
    );
    println!("| context | batch | policy | µs/step (batch) | µs/sequence | drafted/sequence |");
    println!("|---:|---:|---|---:|---:|---:|");
    for context in [1usize << 10, 8 << 10, 32 << 10, 128 << 10] {
        let largest = BATCHES
            .iter()
            .copied()
            .filter(|b| b * context <= max_batch_tokens)
            .max();
        let Some(largest) = largest else {
            println!("| {context} | - | (skipped: over --max-batch-tokens) | | | |");
            continue;
        };
        // One sequence per batch slot, each with `steps` more tokens to come.
        let build = Instant::now();
        let mut sequences: Vec<(NgramIndex, Vec<u32>)> = (0..largest)
            .map(|s| {
                let mut source = TextSource::new(0x5EED + s as u64);
                let mut tokens = Vec::with_capacity(context + steps);
                while tokens.len() < context + steps {
                    let t = source.next(&tokens);
                    tokens.push(t);
                }
                let config = NgramConfig::new(MIN_N, MAX_N).expect("a valid range");
                let future = tokens.split_off(context);
                (NgramIndex::with_tokens(config, &tokens), future)
            })
            .collect();
        eprintln!(
            "built {largest} indexes of {context} tokens in {:.1} s",
            build.elapsed().as_secs_f64()
        );
        for batch in BATCHES {
            if batch * context > max_batch_tokens {
                println!("| {context} | {batch} | (skipped: over --max-batch-tokens) | | | |");
                continue;
            }
            // Every policy twice, the first round untimed: whichever ran first was up to four
            // times slower (the first pushes past the built length grow the index's arrays).
            let rounds = [false, true].into_iter();
            for (timed, policy) in rounds.flat_map(|t| MatchPolicy::ALL.map(|p| (t, p))) {
                let mut per_step = Vec::with_capacity(steps);
                let mut drafted = 0usize;
                let mut out = Vec::with_capacity(K);
                for (index, _) in sequences.iter_mut().take(batch) {
                    index.set_policy(policy);
                    index.set_score_params(params);
                }
                for step in 0..steps {
                    let start = Instant::now();
                    for (index, future) in sequences.iter_mut().take(batch) {
                        index.push(future[step]);
                        if index.propose(K, &mut out).is_some() {
                            drafted += out.len();
                        }
                    }
                    per_step.push(start.elapsed().as_nanos() as u64);
                }
                for (index, _) in sequences.iter_mut().take(batch) {
                    index.truncate(context);
                }
                if !timed {
                    continue;
                }
                let us = median(&per_step) / 1000.0;
                let per_seq_drafted = drafted as f64 / (steps * batch) as f64;
                println!(
                    "| {context} | {batch} | {policy} | {us:.1} | {:.3} | {per_seq_drafted:.2} |",
                    us / batch as f64
                );
                results.push(json!({
                    "kind": "scaling", "context": context, "batch": batch,
                    "policy": policy.to_string(), "k": K, "min_n": MIN_N, "max_n": MAX_N,
                    "us_per_step": us, "us_per_sequence": us / batch as f64,
                    "drafted_per_sequence": per_seq_drafted,
                }));
            }
            // The O(context) rescan every step, for reference (pld's backward scan with the
            // recent policy; not vLLM's code). Fewer steps: it is slow at long contexts.
            let scan_steps = steps.min(if context >= 32 << 10 { 3 } else { 10 });
            let mut per_step = Vec::with_capacity(scan_steps);
            let mut out = Vec::with_capacity(K);
            for _ in 0..scan_steps {
                let start = Instant::now();
                for (index, _) in sequences.iter().take(batch) {
                    black_box(propose_by_scan(index.tokens(), MIN_N, MAX_N, K, &mut out));
                }
                per_step.push(start.elapsed().as_nanos() as u64);
            }
            let us = median(&per_step) / 1000.0;
            println!(
                "| {context} | {batch} | rescan (reference) | {us:.1} | {:.3} | |",
                us / batch as f64
            );
            results.push(json!({
                "kind": "scaling", "context": context, "batch": batch, "policy": "rescan",
                "k": K, "min_n": MIN_N, "max_n": MAX_N, "us_per_step": us,
                "us_per_sequence": us / batch as f64,
            }));
        }
    }
}

// ---------------------------------------------------------------------------------------------

/// The dev workloads in the repository (`workloads/` at the workspace root).
const WORKLOADS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../workloads");

fn main() {
    let mut bench = Some(PathBuf::from(WORKLOADS));
    let mut units = vec!["bytes".to_owned(), "words".to_owned()];
    let mut files: Vec<PathBuf> = Vec::new();
    let (mut sweep, mut do_scaling, mut show) = (false, false, false);
    let mut steps = 30usize;
    let mut max_batch_tokens = 40usize << 20;
    let mut params = ScoreParams::default();
    let mut json_out: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    let usage = "usage: replay [--bench DIR|none] [--units bytes,words] [--sweep] [--scaling] \
                 [--steps N] [--max-batch-tokens N] [--decay X] [--min-path-p X] [--min-token-p X] [--max-occurrences N] \
                 [--json FILE] [--show-proxies] [TRACES.json ...]";
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value\n{usage}"))
        };
        match arg.as_str() {
            "--bench" => {
                let v = value("--bench");
                bench = (v != "none").then(|| PathBuf::from(v));
            }
            "--units" => units = value("--units").split(',').map(str::to_owned).collect(),
            "--sweep" => sweep = true,
            "--show-proxies" => show = true,
            "--scaling" => do_scaling = true,
            "--steps" => steps = value("--steps").parse().expect("--steps: a number"),
            "--max-batch-tokens" => {
                max_batch_tokens = value("--max-batch-tokens")
                    .parse()
                    .expect("--max-batch-tokens: a number")
            }
            "--json" => json_out = Some(PathBuf::from(value("--json"))),
            "--decay" => params.decay = value("--decay").parse().expect("--decay: a number"),
            "--min-path-p" => {
                params.min_path_probability = value("--min-path-p")
                    .parse()
                    .expect("--min-path-p: a number")
            }
            "--min-token-p" => {
                params.min_token_probability = value("--min-token-p")
                    .parse()
                    .expect("--min-token-p: a number")
            }
            "--max-occurrences" => {
                params.max_occurrences = value("--max-occurrences")
                    .parse()
                    .expect("--max-occurrences: a number")
            }
            "-h" | "--help" => {
                println!("{usage}");
                return;
            }
            f if !f.starts_with("--") => files.push(PathBuf::from(f)),
            other => panic!("unknown option {other}\n{usage}"),
        }
    }
    if let Ok(dir) = std::fs::read_dir("/work/traces") {
        let mut found: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        found.sort();
        for f in found {
            if !files.contains(&f) {
                files.push(f);
            }
        }
    }

    if show {
        let dir = bench.as_deref().unwrap_or(Path::new(WORKLOADS));
        for t in proxy_texts(dir).unwrap_or_else(|e| panic!("{e}")) {
            println!(
                "==== {} ({} prompt bytes)\n{}\n",
                t.category,
                t.prompt.len(),
                t.output
            );
        }
        return;
    }
    let mut sets = Vec::new();
    for f in &files {
        match read_trace_file(f) {
            Ok(traces) => sets.push(TraceSet {
                unit: format!("tokens ({})", f.display()),
                traces,
            }),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
    if let Some(dir) = &bench {
        match proxy_sets(dir, &units) {
            Ok(proxies) => sets.extend(proxies),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }

    let mut results = Vec::new();
    println!("# pld drafting: match policies replayed\n");
    println!(
        "Greedy verification simulated; adaptive length off; scored settings {:?}.",
        params
    );
    for set in &sets {
        print_replay(set, params, &mut results);
        if sweep {
            print_sweep(set, &mut results);
        }
    }
    if do_scaling {
        scaling(steps, max_batch_tokens, params, &mut results);
    }
    if let Some(path) = json_out {
        let text = serde_json::to_string_pretty(&Value::Array(results)).expect("JSON");
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}
