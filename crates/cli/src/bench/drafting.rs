//! `pld bench drafting`: choosing the drafting settings offline. Under greedy decoding the output
//! does not depend on the drafts, so replaying the recorded outputs of a `pld bench run` through the
//! n-gram index tells exactly how many drafted tokens each setting would have had accepted, step by
//! step. Combined with the measured cost of a forward pass over k tokens (`pld bench forward
//! --json`), that gives each setting's decode time relative to plain decoding, for every
//! combination of match policy, n-gram range and K, in seconds instead of hours of model time.

use super::results::{read_json, ForwardReport, ResultsFile};
use clap::Args;
use drafting::{Drafter, MatchPolicy, PassCost, SpecConfig, SpecMethod};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct DraftingArgs {
    /// results.json written by `pld bench run --out`.
    #[arg(long)]
    pub results: PathBuf,
    /// `pld bench forward --json` output: the cost of a pass over 1..16 tokens. Without it every
    /// pass costs the same (the acceptance-only view).
    #[arg(long)]
    pub forward: Option<PathBuf>,
    /// How many of the best settings to list.
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    #[arg(long)]
    pub json: bool,
}

struct Turn {
    category: String,
    prompt: Vec<u32>,
    output: Vec<u32>,
}

#[derive(Default, Clone, Copy, serde::Serialize)]
struct Tally {
    steps: usize,
    decode_tokens: usize,
    spec_cost: f64,
    plain_cost: f64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.steps += o.steps;
        self.decode_tokens += o.decode_tokens;
        self.spec_cost += o.spec_cost;
        self.plain_cost += o.plain_cost;
    }
    fn mean_accepted(&self) -> f64 {
        self.decode_tokens as f64 / self.steps.max(1) as f64
    }
    fn speedup(&self) -> f64 {
        self.plain_cost / self.spec_cost.max(1e-9)
    }
}

/// Replays one turn through a [`Drafter`] with the settings `spec`: the first output token comes
/// from prefill, then each step drafts and keeps the prefix that matches the recorded output, plus
/// one; the drafter observes every outcome and the relative pass cost, as in the engine.
fn replay(turn: &Turn, spec: &SpecConfig, cost: &PassCost) -> Tally {
    let mut t = Tally::default();
    if turn.output.len() < 2 {
        return t;
    }
    let mut drafter = Drafter::new(spec, &turn.prompt);
    drafter.push(turn.output[0]);
    let mut pos = 1;
    while pos < turn.output.len() {
        let left = turn.output.len() - pos;
        let draft = drafter.propose(left - 1, None);
        let drafted = draft.len();
        let path = draft.follow(&turn.output[pos..]);
        let accepted = path.len();
        let emitted = accepted + 1;
        drafter.observe(&path);
        drafter.observe_cost(drafted + 1, cost.relative(drafted + 1));
        for &tok in &turn.output[pos..pos + emitted] {
            drafter.push(tok);
        }
        t.steps += 1;
        t.decode_tokens += emitted;
        t.spec_cost += cost.relative(drafted + 1);
        pos += emitted;
    }
    t.plain_cost = (turn.output.len() - 1) as f64;
    t
}

pub fn run(a: DraftingArgs) -> anyhow::Result<()> {
    let turns = read_turns(&a.results)?;
    let cost = read_cost(a.forward.as_deref())?;

    let settings = settings();
    let mut results = Vec::new();
    for spec in settings {
        spec.validate()?;
        let mut per_cat: BTreeMap<String, Tally> = BTreeMap::new();
        let mut all = Tally::default();
        for turn in &turns {
            let t = replay(turn, &spec, &cost);
            per_cat.entry(turn.category.clone()).or_default().add(&t);
            all.add(&t);
        }
        results.push((spec, all, per_cat));
    }
    results.sort_by(|a, b| b.1.speedup().total_cmp(&a.1.speedup()));
    if a.json {
        return print_json(&results);
    }
    println!(
        "{} turns replayed; pass cost {}",
        turns.len(),
        if a.forward.is_some() {
            "from bench forward"
        } else {
            "flat (acceptance only)"
        }
    );
    print_tables(&results, a.top);
    Ok(())
}

/// A setting, its tally over every turn, and per category.
type Outcome = (SpecConfig, Tally, BTreeMap<String, Tally>);

/// The turns of a results file of `pld bench run --out`, with their categories.
fn read_turns(path: &std::path::Path) -> anyhow::Result<Vec<Turn>> {
    let file: ResultsFile = read_json(path, "a results file of `pld bench run --out` (no rows)")?;
    let turns: Vec<Turn> = file
        .rows
        .into_iter()
        .flat_map(|row| {
            let category = row.category;
            row.turns.into_iter().map(move |t| Turn {
                category: category.clone(),
                prompt: t.prompt_ids,
                output: t.output_ids,
            })
        })
        .collect();
    if turns.is_empty() {
        anyhow::bail!("no turns with token ids in {}", path.display());
    }
    Ok(turns)
}

/// The pass costs of `pld bench forward --json`'s output, or flat ones (acceptance only).
fn read_cost(forward: Option<&std::path::Path>) -> anyhow::Result<PassCost> {
    Ok(match forward {
        Some(p) => {
            let f: ForwardReport = read_json(p, "the output of `pld bench forward --json`")?;
            let points: Vec<(usize, f64)> = f.top.passes.iter().map(|p| (p.tokens, p.ms)).collect();
            if points.is_empty() {
                anyhow::bail!("{} has no passes", p.display());
            }
            PassCost::from_points(&points)
        }
        None => PassCost::flat(),
    })
}

/// Every chain setting, and trees from the n-gram source (the other sources need the model's
/// logits or other requests, which a replay does not have).
fn settings() -> Vec<SpecConfig> {
    let mut settings = Vec::new();
    for policy in MatchPolicy::ALL {
        for (min_n, max_n) in [(1, 1), (1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 5)] {
            for k in [2usize, 3, 4, 6, 8, 12, 16] {
                for adaptive in [false, true] {
                    settings.push(SpecConfig {
                        num_speculative_tokens: k,
                        prompt_lookup_max: max_n,
                        prompt_lookup_min: min_n,
                        match_policy: policy,
                        adaptive,
                        ..SpecConfig::default()
                    });
                }
            }
        }
    }
    for (min_n, max_n) in [(1, 3), (1, 4), (2, 4)] {
        for k in [4usize, 8, 16] {
            for nodes in [8usize, 16, 32] {
                for adaptive in [false, true] {
                    settings.push(SpecConfig {
                        method: SpecMethod::Tree,
                        num_speculative_tokens: k,
                        prompt_lookup_max: max_n,
                        prompt_lookup_min: min_n,
                        adaptive,
                        tree_max_nodes: nodes,
                        tree_sources: "ngram".parse().expect("a valid source list"),
                        ..SpecConfig::default()
                    });
                }
            }
        }
    }
    settings
}

fn shape(s: &SpecConfig) -> String {
    match s.method {
        SpecMethod::Ngram => "chain".to_string(),
        SpecMethod::Tree => format!("tree {}", s.tree_max_nodes),
    }
}

/// Every setting's estimates as JSON, best first.
fn print_json(results: &[Outcome]) -> anyhow::Result<()> {
    let out: Vec<_> = results
        .iter()
        .map(|(s, all, cats)| {
            serde_json::json!({
                "method": s.method.name(), "tree_max_nodes": s.tree_max_nodes,
                "policy": s.match_policy.to_string(), "min_n": s.prompt_lookup_min,
                "max_n": s.prompt_lookup_max, "k": s.num_speculative_tokens,
                "adaptive": s.adaptive,
                "mean_accepted_tokens": all.mean_accepted(), "estimated_speedup": all.speedup(),
                "categories": cats.iter().map(|(c, t)| (c.clone(), serde_json::json!({
                    "mean_accepted_tokens": t.mean_accepted(), "estimated_speedup": t.speedup()
                }))).collect::<serde_json::Map<_, _>>(),
            })
        })
        .collect();
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// The `top` best settings as a table, then the best chain's and tree's estimates per category.
fn print_tables(results: &[Outcome], top: usize) {
    println!("| shape | policy | n-gram | K | adaptive | mean accepted | est. speedup | worst category |\n|---|---|---|---:|---|---:|---:|---|");
    let worst = |cats: &BTreeMap<String, Tally>| {
        cats.iter()
            .map(|(c, t)| (c.clone(), t.speedup()))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(c, s)| format!("{c} {s:.2}x"))
            .unwrap_or_default()
    };
    for (s, all, cats) in results.iter().take(top) {
        println!(
            "| {} | {} | {}..{} | {} | {} | {:.2} | {:.2}x | {} |",
            shape(s),
            s.match_policy,
            s.prompt_lookup_min,
            s.prompt_lookup_max,
            s.num_speculative_tokens,
            s.adaptive,
            all.mean_accepted(),
            all.speedup(),
            worst(cats)
        );
    }
    for (label, method) in [("chain", SpecMethod::Ngram), ("tree", SpecMethod::Tree)] {
        let Some((s, _, cats)) = results.iter().find(|r| r.0.method == method) else {
            continue;
        };
        println!(
            "\nbest {label} ({}, {}..{}, K={}, adaptive {}) per category:",
            shape(s),
            s.prompt_lookup_min,
            s.prompt_lookup_max,
            s.num_speculative_tokens,
            s.adaptive
        );
        for (c, t) in cats {
            println!(
                "  {c:16} mean accepted {:.2}, est. speedup {:.2}x",
                t.mean_accepted(),
                t.speedup()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(k: usize, max_n: usize) -> SpecConfig {
        SpecConfig {
            num_speculative_tokens: k,
            prompt_lookup_max: max_n,
            prompt_lookup_min: 1,
            adaptive: false,
            ..Default::default()
        }
    }

    #[test]
    fn replay_counts_accepted_prefixes() {
        // The output copies the prompt: after the first token every step can draft the rest.
        let turn = Turn {
            category: "c".into(),
            prompt: vec![1, 2, 3, 4, 5, 6, 9, 1],
            output: vec![2, 3, 4, 5, 6, 7],
        };
        let flat = PassCost::flat();
        let t = replay(&turn, &spec(8, 2), &flat);
        // Step 1 drafts [3,4,5,6,9] (4 accepted) and adds 7: all five decode tokens in one step.
        assert_eq!(t.decode_tokens, 5);
        assert_eq!(t.steps, 1);
        assert!((t.speedup() - 5.0).abs() < 1e-9);
        let t = replay(&turn, &spec(2, 2), &flat);
        assert_eq!((t.steps, t.decode_tokens), (2, 5));
    }
}
