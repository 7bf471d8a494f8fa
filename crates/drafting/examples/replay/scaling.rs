//! The cost of a proposal at long contexts and large batches (`--scaling`).

use std::hint::black_box;
use std::time::Instant;

use drafting::{propose_by_scan, MatchPolicy, NgramConfig, NgramIndex, ScoreParams};
use serde_json::{json, Value};

use crate::policies::median;

/// splitmix64.
pub(crate) struct Rng(pub(crate) u64);

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
pub(crate) struct TextSource {
    pub(crate) cdf: Vec<f64>,
    pub(crate) rng: Rng,
    pub(crate) copy_left: usize,
    pub(crate) copy_from: usize,
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

pub(crate) fn scaling(
    steps: usize,
    max_batch_tokens: usize,
    params: ScoreParams,
    results: &mut Vec<Value>,
) {
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
