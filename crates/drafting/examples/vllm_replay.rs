//! The replay of `tools/drafter_bench/vllm_ngram.py` for pld's drafter alone, in Rust: recorded
//! greedy outputs drafted along as `pld.vllm.Proposer` drafts them inside vLLM, so a change to
//! the drafting crate can be measured against vLLM's `ngram` and `suffix` numbers (which that
//! script gives) without building the Python package.
//!
//! ```text
//! cargo run --release -p pld-drafting --example vllm_replay -- [OPTIONS] FILE...
//!
//!   FILE             tools/vllm/compare.py's report (its plain greedy run: `prompts`, `runs`)
//!                    or `pld bench run`'s results.json (`rows[].turns[]`)
//!   -k N             draft length K (default 8)
//!   --nmin N, --nmax N   n-gram sizes (default 1..4)
//!   --policy NAME    match policy (default scored)
//!   --decay X, --min-path-p X, --max-occurrences N, --min-token-p X
//!                    settings of the scored policy (--min-token-p: drafts sized by evidence)
//!   --corpus         every finished row's output joins a corpus later rows also draft from
//!                    (vLLM's suffix decoding keeps its earlier responses the same way)
//!   --calibrate      with --min-token-p: each row calibrates the estimates by its own drafts
//!   --json FILE      write the counts per category as JSON
//!   --against FILE   vllm_ngram.py's JSON of the same rows and settings: a table of each
//!                    category against vLLM's `ngram` and `suffix`, with where pld loses
//! ```
//!
//! As in the script: the prefill gives the first output token (no step); each step proposes at
//! most K tokens (adaptive lengths off), accepts the draft up to its first token that differs
//! from the recorded output, and emits the accepted tokens and the model's own next one. Rows
//! are replayed one after another; categories are `file-prefix/category` (compare.py) or the
//! row's category (results.json).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use drafting::{Corpus, Drafter, MatchPolicy, ScoreParams, SpecConfig, DEFAULT_CORPUS_TOKENS};
use serde_json::{json, Value};
use traces::{load, Row};

mod traces;

#[derive(Default, Clone, Copy)]
struct Counts {
    rows: usize,
    steps: usize,
    drafted: usize,
    accepted: usize,
    produced: usize,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.rows += o.rows;
        self.steps += o.steps;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.produced += o.produced;
    }
}

/// One row, as `vllm_ngram.py`'s `replay` drives the Proposer.
fn replay(row: &Row, config: &SpecConfig, setup: &dyn Fn(&mut Drafter)) -> Counts {
    let truth: Vec<u32> = row.prompt.iter().chain(&row.output).copied().collect();
    let mut n = (row.prompt.len() + 1).min(truth.len());
    let mut drafter = Drafter::new(config, &truth[..n]);
    setup(&mut drafter);
    let k = config.num_speculative_tokens;
    let mut c = Counts {
        rows: 1,
        ..Counts::default()
    };
    while n < truth.len() {
        let step = traces::step(&mut drafter, k, &truth[n..]);
        n += step.produced;
        c.steps += 1;
        c.drafted += step.drafted;
        c.accepted += step.matched;
        c.produced += step.produced;
    }
    c
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut files = Vec::new();
    let mut config = SpecConfig {
        num_speculative_tokens: 8,
        prompt_lookup_min: 1,
        prompt_lookup_max: 4,
        match_policy: MatchPolicy::Scored,
        adaptive: false,
        ..SpecConfig::default()
    };
    let mut params = ScoreParams::default();
    let mut with_corpus = false;
    let mut json_out = None;
    let mut against = None;
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "-k" => config.num_speculative_tokens = value().parse().expect("-k N"),
            "--nmin" => config.prompt_lookup_min = value().parse().expect("--nmin N"),
            "--nmax" => config.prompt_lookup_max = value().parse().expect("--nmax N"),
            "--policy" => config.match_policy = value().parse().expect("a policy"),
            "--decay" => params.decay = value().parse().expect("--decay X"),
            "--min-path-p" => params.min_path_probability = value().parse().expect("X"),
            "--max-occurrences" => params.max_occurrences = value().parse().expect("N"),
            "--min-token-p" => params.min_token_probability = value().parse().expect("X"),
            "--calibrate" => params.calibrate = true,
            "--corpus" => with_corpus = true,
            "--json" => json_out = Some(value()),
            "--against" => against = Some(value()),
            "-h" | "--help" => {
                println!("see the module doc of crates/drafting/examples/vllm_replay.rs");
                return;
            }
            f => files.push(f.to_owned()),
        }
    }
    let rows: Vec<Row> = files.iter().flat_map(|f| load(f)).collect();
    let corpus = Arc::new(Mutex::new(Corpus::new(DEFAULT_CORPUS_TOKENS)));
    let mut by: BTreeMap<String, Counts> = BTreeMap::new();
    for row in &rows {
        let setup = |d: &mut Drafter| {
            d.set_score_params(params);
            if with_corpus {
                d.set_corpus(corpus.clone());
            }
        };
        let c = replay(row, &config, &setup);
        by.entry(row.category.clone()).or_default().add(&c);
        if with_corpus {
            corpus.lock().expect("corpus").add(&row.output);
        }
    }
    let mut all = Counts::default();
    for c in by.values() {
        all.add(c);
    }
    by.insert("all".into(), all);
    println!(
        "{} rows, K={}, n-grams {}..{}, policy {}{}",
        rows.len(),
        config.num_speculative_tokens,
        config.prompt_lookup_min,
        config.prompt_lookup_max,
        config.match_policy,
        if with_corpus { ", corpus" } else { "" }
    );
    println!("| category | steps | drafted | accepted | tokens/step |\n|---|---:|---:|---:|---:|");
    let mut out = serde_json::Map::new();
    for (cat, c) in &by {
        println!(
            "| {cat} | {} | {} | {} | {:.3} |",
            c.steps,
            c.drafted,
            c.accepted,
            c.produced as f64 / c.steps.max(1) as f64
        );
        out.insert(
            cat.clone(),
            json!({"rows": c.rows, "steps": c.steps, "drafted": c.drafted,
                   "accepted": c.accepted, "produced": c.produced}),
        );
    }
    if let Some(path) = against {
        compare(&by, &path);
    }
    if let Some(path) = json_out {
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&Value::Object(out)).expect("json"),
        )
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

/// Counts of one drafter in `vllm_ngram.py`'s JSON, by category (its results.json categories
/// carry no file prefix, as here).
fn reference(v: &Value, drafter: &str) -> BTreeMap<String, Counts> {
    let mut out = BTreeMap::new();
    if let Some(m) = v["replay"][drafter].as_object() {
        for (cat, c) in m {
            let n = |f: &str| c[f].as_u64().unwrap_or(0) as usize;
            out.insert(
                cat.clone(),
                Counts {
                    rows: n("rows"),
                    steps: n("steps"),
                    drafted: n("drafted"),
                    accepted: n("accepted"),
                    produced: n("produced"),
                },
            );
        }
    }
    out
}

/// Prints every category against vLLM's `ngram` and `suffix` from `path`; the last column says
/// where pld takes fewer tokens per step or drafts more tokens than either.
fn compare(by: &BTreeMap<String, Counts>, path: &str) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let ngram = reference(&v, "vLLM ngram");
    let suffix = reference(&v, "vLLM suffix (arctic-inference)");
    let rate = |c: &Counts| c.produced as f64 / c.steps.max(1) as f64;
    println!(
        "\n| category | pld | vLLM ngram | vLLM suffix | loses to |\n|---|---:|---:|---:|---|"
    );
    let (mut lost_rate, mut lost_drafted) = (0, 0);
    for (cat, c) in by {
        let cell = |c: Option<&Counts>| {
            c.map_or("-".into(), |c| format!("{} / {:.3}", c.drafted, rate(c)))
        };
        let mut losses = Vec::new();
        for (name, r) in [("ngram", ngram.get(cat)), ("suffix", suffix.get(cat))] {
            let Some(r) = r else { continue };
            if rate(c) < rate(r) - 1e-9 {
                losses.push(format!("{name} tok/step ({:+.3})", rate(c) - rate(r)));
                lost_rate += usize::from(cat != "all");
            }
            if c.drafted > r.drafted {
                losses.push(format!(
                    "{name} drafted (x{:.2})",
                    c.drafted as f64 / r.drafted.max(1) as f64
                ));
                lost_drafted += usize::from(cat != "all");
            }
        }
        println!(
            "| {cat} | {} | {} | {} | {} |",
            cell(Some(c)),
            cell(ngram.get(cat)),
            cell(suffix.get(cat)),
            losses.join("; ")
        );
    }
    println!(
        "losses in categories: {lost_rate} in tokens per step, {lost_drafted} in drafted tokens"
    );
}
