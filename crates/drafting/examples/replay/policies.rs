//! The replay itself: each trace through the drafter under each policy and K, greedy
//! verification simulated, and the tables (and the sweep of the scored policy's settings).

use std::time::Instant;

use drafting::{Drafter, MatchPolicy, ScoreParams, SpecConfig};
use serde_json::{json, Value};

use crate::traces::{Trace, TraceSet};

/// K and the n-gram range it is run with.
pub(crate) const SETTINGS: [(usize, usize, usize); 2] = [(4, 1, 3), (8, 1, 4)];

#[derive(Default, Clone)]
pub(crate) struct Tally {
    pub(crate) rows: usize,
    pub(crate) steps: usize,
    pub(crate) drafted: usize,
    pub(crate) accepted: usize,
    pub(crate) output: usize,
    pub(crate) propose_ns: Vec<u64>,
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

pub(crate) fn median(values: &[u64]) -> f64 {
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
pub(crate) fn replay(trace: &Trace, config: &SpecConfig, params: Option<ScoreParams>) -> Tally {
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

pub(crate) fn config(policy: MatchPolicy, k: usize, min_n: usize, max_n: usize) -> SpecConfig {
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
pub(crate) fn replay_set(
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

pub(crate) fn print_replay(set: &TraceSet, params: ScoreParams, results: &mut Vec<Value>) {
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

pub(crate) fn print_sweep(set: &TraceSet, results: &mut Vec<Value>) {
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
