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

mod policies;
mod proxies;
mod scaling;
mod traces;

use std::path::{Path, PathBuf};

use drafting::ScoreParams;
use policies::{print_replay, print_sweep};
use proxies::{proxy_sets, proxy_texts};
use scaling::scaling;
use serde_json::Value;
use traces::{read_trace_file, TraceSet};

/// What the command line asks for.
struct Options {
    bench: Option<PathBuf>,
    units: Vec<String>,
    files: Vec<PathBuf>,
    sweep: bool,
    do_scaling: bool,
    show: bool,
    steps: usize,
    max_batch_tokens: usize,
    params: ScoreParams,
    json_out: Option<PathBuf>,
}

/// The options, with every trace file of `/work/traces` added; `None` after `--help`.
fn options() -> Option<Options> {
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
                return None;
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
    Some(Options {
        bench,
        units,
        files,
        sweep,
        do_scaling,
        show,
        steps,
        max_batch_tokens,
        params,
        json_out,
    })
}

/// `--show-proxies`: the proxy answers built from the workloads.
fn show_proxies(bench: Option<&Path>) {
    let dir = bench.unwrap_or(Path::new(WORKLOADS));
    for t in proxy_texts(dir).unwrap_or_else(|e| panic!("{e}")) {
        println!(
            "==== {} ({} prompt bytes)\n{}\n",
            t.category,
            t.prompt.len(),
            t.output
        );
    }
}

/// The trace sets: each file's, then the proxies of the workloads; an error ends the program.
fn trace_sets(o: &Options) -> Vec<TraceSet> {
    let mut sets = Vec::new();
    for f in &o.files {
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
    if let Some(dir) = &o.bench {
        match proxy_sets(dir, &o.units) {
            Ok(proxies) => sets.extend(proxies),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
    sets
}

/// The dev workloads in the repository (`workloads/` at the workspace root).
const WORKLOADS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../workloads");

fn main() {
    let Some(o) = options() else {
        return;
    };
    if o.show {
        show_proxies(o.bench.as_deref());
        return;
    }
    let sets = trace_sets(&o);
    let params = o.params;
    let mut results = Vec::new();
    println!("# pld drafting: match policies replayed\n");
    println!(
        "Greedy verification simulated; adaptive length off; scored settings {:?}.",
        params
    );
    for set in &sets {
        print_replay(set, params, &mut results);
        if o.sweep {
            print_sweep(set, &mut results);
        }
    }
    if o.do_scaling {
        scaling(o.steps, o.max_batch_tokens, params, &mut results);
    }
    if let Some(path) = o.json_out {
        let text = serde_json::to_string_pretty(&Value::Array(results)).expect("JSON");
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}
