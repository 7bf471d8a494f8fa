//! What adaptive drafting gains at a given cost of a pass, replayed on recorded greedy outputs.
//!
//! ```text
//! cargo run --release -p pld-drafting --example priced_replay -- [--costs C1,C2,...] [--prior-price P] [--fixed] [--policy P] RESULTS.json
//! ```
//!
//! `RESULTS.json` is what `pld bench run --out` writes (or `tools/vllm/compare.py`; see
//! `traces::load`). Each turn goes through the engine's drafter as `pld`'s own decoder drives it
//! (the default `SpecConfig`: adaptive chains, K = 8): each step it proposes, the longest prefix
//! equal to the recorded output is accepted, plus the model's own token, and the drafter is told
//! what the pass cost. A pass over r rows costs `C_r` times a one-row pass (`--costs`, rows 1, 2,
//! ...; past the list the last step is extended linearly; default `1,1.1`: a dense model's price
//! of 0.1 a row). `--prior-price` is the drafter's starting price (`Model::draft_price_prior`;
//! default 0.1). `--fixed` sends every proposed token (`--fixed-draft`). `--policy` is the match
//! policy (`--match-policy`; default the engine's, `evidence`).
//!
//! Per category: steps, drafted and accepted tokens, and the speedup: output tokens over the
//! summed cost of the passes, against plain decoding's one token per one-row pass. Under greedy
//! decoding with these costs the replay is deterministic, so it compares policies and prices
//! exactly where the machine's timings cannot (they vary by several percent between runs).

use std::collections::BTreeMap;

use drafting::{Drafter, MatchPolicy, SpecConfig};
use traces::{load, Row};

mod traces;

#[derive(Default, Clone, Copy)]
struct Sums {
    turns: usize,
    steps: usize,
    drafted: usize,
    accepted: usize,
    produced: usize,
    cost: f64,
}

impl Sums {
    fn add(&mut self, o: &Sums) {
        self.turns += o.turns;
        self.steps += o.steps;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.produced += o.produced;
        self.cost += o.cost;
    }
}

/// The cost of a pass over `rows` rows, in one-row passes.
fn pass_cost(costs: &[f64], rows: usize) -> f64 {
    match costs.get(rows - 1) {
        Some(&c) => c,
        None => {
            let n = costs.len();
            let step = if n >= 2 {
                costs[n - 1] - costs[n - 2]
            } else {
                0.0
            };
            costs[n - 1] + step * (rows - n) as f64
        }
    }
}

fn replay(row: &Row, config: &SpecConfig, costs: &[f64], prior: f64) -> Sums {
    let mut drafter = Drafter::new(config, &row.prompt).with_prior_price(prior);
    let k = config.num_speculative_tokens;
    let mut s = Sums {
        turns: 1,
        ..Sums::default()
    };
    let mut n = 0;
    while n < row.output.len() {
        let step = traces::step(&mut drafter, k, &row.output[n..]);
        let cost = pass_cost(costs, 1 + step.drafted);
        drafter.observe_cost(1 + step.drafted, cost);
        n += step.produced;
        s.steps += 1;
        s.drafted += step.drafted;
        s.accepted += step.matched.min(step.produced - 1);
        s.produced += step.produced;
        s.cost += cost;
    }
    s
}

fn main() {
    let mut costs = vec![1.0, 1.1];
    let mut prior = 0.1;
    let mut fixed = false;
    let mut policy = SpecConfig::default().match_policy;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--costs" => {
                let list = args.next().expect("--costs C1,C2,...");
                costs = list
                    .split(',')
                    .map(|c| c.parse().expect("a number"))
                    .collect();
                assert!(
                    costs.first() == Some(&1.0),
                    "--costs starts with 1 (one row)"
                );
            }
            "--prior-price" => prior = args.next().expect("a price").parse().expect("a number"),
            "--fixed" => fixed = true,
            "--policy" => {
                let name = args.next().expect("--policy NAME");
                policy = name
                    .parse::<MatchPolicy>()
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            f => files.push(f.to_owned()),
        }
    }
    assert!(!files.is_empty(), "give a results.json");
    let config = SpecConfig {
        adaptive: !fixed,
        match_policy: policy,
        ..SpecConfig::default()
    };
    let mut by_category: BTreeMap<String, Sums> = BTreeMap::new();
    let mut all = Sums::default();
    for f in &files {
        for t in load(f) {
            let s = replay(&t, &config, &costs, prior);
            by_category.entry(t.category.clone()).or_default().add(&s);
            all.add(&s);
        }
    }
    println!(
        "costs {costs:?}, prior price {prior}, {}, {policy}",
        if fixed { "fixed drafts" } else { "adaptive" }
    );
    println!("| category | turns | steps | drafted | accepted | tokens per step | speedup |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, s) in by_category.iter().chain([(&"**all**".to_owned(), &all)]) {
        println!(
            "| {name} | {} | {} | {} | {} | {:.3} | {:.3}x |",
            s.turns,
            s.steps,
            s.drafted,
            s.accepted,
            s.produced as f64 / s.steps as f64,
            s.produced as f64 / s.cost
        );
    }
}
