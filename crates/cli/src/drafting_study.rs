//! `pld bench drafting`: choosing the drafting settings offline. Under greedy decoding the output
//! does not depend on the drafts, so replaying the recorded outputs of a `pld bench run` through the
//! n-gram index tells exactly how many drafted tokens each setting would have had accepted, step by
//! step. Combined with the measured cost of a forward pass over k tokens (`pld bench forward
//! --json`), that gives each setting's decode time relative to plain decoding, for every
//! combination of match policy, n-gram range and K, in seconds instead of hours of model time.

use clap::Args;
use drafting::{DraftLength, MatchPolicy, NgramConfig, NgramIndex};
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

/// Relative cost of a pass over `t` tokens (1.0 for one token), interpolated from measurements.
struct PassCost(Vec<(f64, f64)>);

impl PassCost {
    fn at(&self, t: usize) -> f64 {
        let t = t as f64;
        let p = &self.0;
        if p.len() < 2 {
            return 1.0;
        }
        let seg = p
            .windows(2)
            .find(|w| t <= w[1].0)
            .unwrap_or(&p[p.len() - 2..]);
        let (a, b) = (seg[0], seg[1]);
        a.1 + (b.1 - a.1) * (t - a.0) / (b.0 - a.0)
    }
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

/// Replays one turn: the first output token comes from prefill, then each step drafts up to `k`
/// tokens and keeps the prefix that matches the recorded output, plus one.
/// With `adaptive`, the draft is cut to what `DraftLength` expects to pay off, as the engine does.
fn replay(turn: &Turn, config: NgramConfig, k: usize, adaptive: bool, cost: &PassCost) -> Tally {
    let mut t = Tally::default();
    if turn.output.len() < 2 {
        return t;
    }
    let mut index = NgramIndex::with_tokens(config, &turn.prompt);
    index.push(turn.output[0]);
    let mut pos = 1;
    let mut draft = Vec::with_capacity(k);
    let mut length = DraftLength::new(engine::generate::PRIOR_DRAFT_TOKEN_COST);
    while pos < turn.output.len() {
        let left = turn.output.len() - pos;
        let n = index
            .propose(k.min(left - 1), &mut draft)
            .map(|m| m.n)
            .unwrap_or(0);
        if adaptive && !draft.is_empty() {
            draft.truncate(length.choose(n, draft.len()));
        }
        let accepted = draft
            .iter()
            .zip(&turn.output[pos..])
            .take_while(|(a, b)| a == b)
            .count();
        let emitted = accepted + 1;
        for &tok in &turn.output[pos..pos + emitted] {
            index.push(tok);
        }
        if draft.is_empty() {
            length.idle();
        } else {
            length.observe(n, draft.len(), accepted);
        }
        length.observe_cost(draft.len() + 1, cost.at(draft.len() + 1));
        t.steps += 1;
        t.decode_tokens += emitted;
        t.spec_cost += cost.at(draft.len() + 1);
        pos += emitted;
    }
    t.plain_cost = (turn.output.len() - 1) as f64;
    t
}

pub fn run(a: DraftingArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.results)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", a.results.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not JSON: {e}", a.results.display()))?;
    let rows = v["rows"].as_array().ok_or_else(|| {
        anyhow::anyhow!(
            "{} has no rows (written by `pld bench run --out`?)",
            a.results.display()
        )
    })?;
    let mut turns = Vec::new();
    for row in rows {
        let category = row["category"].as_str().unwrap_or("?").to_string();
        for t in row["turns"].as_array().into_iter().flatten() {
            let ids = |k: &str| -> Vec<u32> {
                t[k].as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x.as_u64().map(|x| x as u32))
                    .collect()
            };
            turns.push(Turn {
                category: category.clone(),
                prompt: ids("prompt_ids"),
                output: ids("output_ids"),
            });
        }
    }
    if turns.is_empty() {
        anyhow::bail!("no turns with token ids in {}", a.results.display());
    }
    let cost = match &a.forward {
        Some(p) => {
            let f: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p)?)?;
            let passes = f["passes"]
                .as_array()
                .ok_or_else(|| anyhow::anyhow!("{} has no passes", p.display()))?;
            let one = passes[0]["ms"].as_f64().unwrap_or(1.0);
            PassCost(
                passes
                    .iter()
                    .map(|p| {
                        (
                            p["tokens"].as_f64().unwrap_or(1.0),
                            p["ms"].as_f64().unwrap_or(one) / one,
                        )
                    })
                    .collect(),
            )
        }
        None => PassCost(Vec::new()),
    };

    let mut results = Vec::new();
    for policy in MatchPolicy::ALL {
        for (min_n, max_n) in [(1, 1), (1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 5)] {
            for k in [2usize, 3, 4, 6, 8, 12, 16] {
                for adaptive in [false, true] {
                    let config = NgramConfig::new(min_n, max_n)?.with_policy(policy);
                    let mut per_cat: BTreeMap<String, Tally> = BTreeMap::new();
                    let mut all = Tally::default();
                    for turn in &turns {
                        let t = replay(turn, config, k, adaptive, &cost);
                        per_cat.entry(turn.category.clone()).or_default().add(&t);
                        all.add(&t);
                    }
                    results.push((policy, min_n, max_n, k, adaptive, all, per_cat));
                }
            }
        }
    }
    results.sort_by(|a, b| b.5.speedup().total_cmp(&a.5.speedup()));
    if a.json {
        let out: Vec<_> = results
            .iter()
            .map(|(p, mn, mx, k, adaptive, all, cats)| {
                serde_json::json!({
                    "policy": p.to_string(), "min_n": mn, "max_n": mx, "k": k, "adaptive": adaptive,
                    "mean_accepted_tokens": all.mean_accepted(), "estimated_speedup": all.speedup(),
                    "categories": cats.iter().map(|(c, t)| (c.clone(), serde_json::json!({
                        "mean_accepted_tokens": t.mean_accepted(), "estimated_speedup": t.speedup()
                    }))).collect::<serde_json::Map<_, _>>(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
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
    println!("| policy | n-gram | K | adaptive | mean accepted | est. speedup | worst category |\n|---|---|---:|---|---:|---:|---|");
    let worst = |cats: &BTreeMap<String, Tally>| {
        cats.iter()
            .map(|(c, t)| (c.clone(), t.speedup()))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(c, s)| format!("{c} {s:.2}x"))
            .unwrap_or_default()
    };
    for (p, mn, mx, k, adaptive, all, cats) in results.iter().take(a.top) {
        println!(
            "| {p} | {mn}..{mx} | {k} | {adaptive} | {:.2} | {:.2}x | {} |",
            all.mean_accepted(),
            all.speedup(),
            worst(cats)
        );
    }
    let (p, mn, mx, k, adaptive, _, cats) = &results[0];
    println!("\nbest ({p}, {mn}..{mx}, K={k}, adaptive {adaptive}) per category:");
    for (c, t) in cats {
        println!(
            "  {c:16} mean accepted {:.2}, est. speedup {:.2}x",
            t.mean_accepted(),
            t.speedup()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_counts_accepted_prefixes() {
        // The output copies the prompt: after the first token every step can draft the rest.
        let turn = Turn {
            category: "c".into(),
            prompt: vec![1, 2, 3, 4, 5, 6, 9, 1],
            output: vec![2, 3, 4, 5, 6, 7],
        };
        let flat = PassCost(Vec::new());
        let t = replay(&turn, NgramConfig::new(1, 2).unwrap(), 8, false, &flat);
        // Step 1 drafts [3,4,5,6,9] (4 accepted) and adds 7: all five decode tokens in one step.
        assert_eq!(t.decode_tokens, 5);
        assert_eq!(t.steps, 1);
        assert!((t.speedup() - 5.0).abs() < 1e-9);
        let t = replay(&turn, NgramConfig::new(1, 2).unwrap(), 2, false, &flat);
        assert_eq!((t.steps, t.decode_tokens), (2, 5));
    }

    #[test]
    fn pass_cost_interpolates() {
        let c = PassCost(vec![(1.0, 1.0), (2.0, 1.2), (4.0, 1.6), (8.0, 3.0)]);
        assert!((c.at(1) - 1.0).abs() < 1e-9);
        assert!((c.at(3) - 1.4).abs() < 1e-9);
        assert!(
            (c.at(16) - 5.8).abs() < 1e-9,
            "extrapolates the last segment"
        );
    }
}
