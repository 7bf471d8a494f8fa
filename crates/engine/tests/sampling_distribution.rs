//! Speculative sampling preserves the distribution. A toy model over five tokens (its next-token
//! logits are a fixed function of the last two tokens) is decoded for three tokens, many times, once
//! by plain ancestral sampling and once through the verifier with drafts that are sometimes right and
//! sometimes wrong. The two empirical distributions over the 125 possible sequences must agree with
//! the exact one within a bound that a correct sampler exceeds with negligible probability; the
//! seeds are fixed so the test cannot flake. Draft trees (several candidates per position, tried in
//! turn) are checked the same way.

use drafting::{DraftTree, Source, ROOT};
use engine::sampling::{Distribution, SamplingParams};
use engine::verify::{verify, verify_tree};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

const VOCAB: usize = 5;
const LEN: usize = 3;

fn toy_logits(prefix: &[u32]) -> Vec<f32> {
    let a = prefix[prefix.len() - 1] as f32;
    let b = prefix[prefix.len() - 2] as f32;
    (0..VOCAB)
        .map(|t| {
            let t = t as f32;
            ((a * 1.7 + b * 0.9 + t * 2.3).sin() * 2.0) + if t == a { 0.8 } else { 0.0 }
        })
        .collect()
}

fn params() -> SamplingParams {
    SamplingParams {
        do_sample: true,
        temperature: 0.9,
        top_k: 4,
        top_p: 0.95,
        min_p: 0.02,
        repetition_penalty: 1.3,
    }
}

/// Exact probability of every sequence under plain decoding.
fn exact(prompt: &[u32]) -> HashMap<Vec<u32>, f64> {
    let mut out = HashMap::new();
    let mut stack = vec![(prompt.to_vec(), 1f64)];
    while let Some((seq, p)) = stack.pop() {
        if seq.len() == prompt.len() + LEN {
            out.insert(seq[prompt.len()..].to_vec(), p);
            continue;
        }
        let dist = Distribution::new(&toy_logits(&seq), &seq, &params());
        for &(t, q) in &dist.candidates {
            let mut next = seq.clone();
            next.push(t);
            stack.push((next, p * q as f64));
        }
    }
    out
}

fn plain_sample(prompt: &[u32], rng: &mut ChaCha8Rng) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    while seq.len() < prompt.len() + LEN {
        let dist = Distribution::new(&toy_logits(&seq), &seq, &params());
        seq.push(dist.sample(rng));
    }
    seq[prompt.len()..].to_vec()
}

/// Decoding through the verifier: each step drafts up to 3 tokens (random guesses, so some are
/// accepted and some rejected), scores [last, drafts...] and keeps what `verify` returns.
fn speculative_sample(prompt: &[u32], rng: &mut ChaCha8Rng) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    while seq.len() < prompt.len() + LEN {
        let k = rng
            .random_range(0..=3usize)
            .min(prompt.len() + LEN - seq.len() - 1);
        let draft: Vec<u32> = (0..k).map(|_| rng.random_range(0..VOCAB as u32)).collect();
        let mut rows = Vec::new();
        let mut ctx = seq.clone();
        rows.extend(toy_logits(&ctx));
        for &d in &draft {
            ctx.push(d);
            rows.extend(toy_logits(&ctx));
        }
        let v = verify(&rows, VOCAB, &draft, &seq, &params(), rng);
        seq.extend(&v.tokens);
    }
    seq.truncate(prompt.len() + LEN);
    seq[prompt.len()..].to_vec()
}

/// Decoding through the tree verifier: each step drafts a random tree (up to three distinct
/// children per node, up to two levels, so several siblings are tried in turn and some are
/// rejected), scores [last, nodes...] in tree order and keeps what `verify_tree` returns.
fn tree_sample(prompt: &[u32], rng: &mut ChaCha8Rng) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    while seq.len() < prompt.len() + LEN {
        let depth = rng
            .random_range(0..=2usize)
            .min(prompt.len() + LEN - seq.len() - 1);
        let mut tree = DraftTree::new();
        let mut frontier = vec![ROOT];
        for _ in 0..depth {
            let mut next = Vec::new();
            for &parent in &frontier {
                let mut tokens: Vec<u32> = (0..VOCAB as u32).collect();
                for _ in 0..rng.random_range(0..=3usize) {
                    let t = tokens.swap_remove(rng.random_range(0..tokens.len()));
                    next.push(tree.push(t, parent, Source::Model) as u32);
                }
            }
            frontier = next;
        }
        let mut rows = toy_logits(&seq);
        for node in 0..tree.len() {
            let mut ctx = seq.clone();
            ctx.extend(tree.path(node).iter().map(|&i| tree.tokens()[i]));
            rows.extend(toy_logits(&ctx));
        }
        let v = verify_tree(&rows, VOCAB, &tree, &seq, &params(), rng);
        seq.extend(&v.tokens);
    }
    seq.truncate(prompt.len() + LEN);
    seq[prompt.len()..].to_vec()
}

fn total_variation(
    counts: &HashMap<Vec<u32>, usize>,
    n: usize,
    exact: &HashMap<Vec<u32>, f64>,
) -> f64 {
    let mut tv = 0.0;
    for (seq, p) in exact {
        let q = *counts.get(seq).unwrap_or(&0) as f64 / n as f64;
        tv += (p - q).abs();
    }
    for (seq, c) in counts {
        assert!(
            exact.contains_key(seq),
            "impossible sequence {seq:?} sampled ({c} times)"
        );
    }
    tv / 2.0
}

#[test]
fn speculative_sampling_matches_plain_distribution() {
    let prompt = [1u32, 3];
    let truth = exact(&prompt);
    let total: f64 = truth.values().sum();
    assert!(
        (total - 1.0).abs() < 1e-4,
        "exact distribution sums to {total}"
    );
    let n = 60_000;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut plain = HashMap::new();
    let mut spec = HashMap::new();
    for _ in 0..n {
        *plain.entry(plain_sample(&prompt, &mut rng)).or_insert(0) += 1;
        *spec
            .entry(speculative_sample(&prompt, &mut rng))
            .or_insert(0) += 1;
    }
    let tv_plain = total_variation(&plain, n, &truth);
    let tv_spec = total_variation(&spec, n, &truth);
    // With s possible sequences the expected total variation of an n-sample empirical
    // distribution is about sqrt(s / (2 pi n)) ~ 0.018 here; 0.04 is more than twice that, while
    // a verifier that, say, kept rejected drafts or resampled from p instead of the residual shows
    // a total variation several times larger.
    assert!(tv_plain < 0.04, "plain sampler off: {tv_plain}");
    assert!(tv_spec < 0.04, "speculative sampler off: {tv_spec}");
}

/// The same check run on a broken verifier (accepting every draft) must fail it, so the bound has
/// teeth.
#[test]
fn the_bound_detects_a_biased_sampler() {
    let prompt = [1u32, 3];
    let truth = exact(&prompt);
    let n = 60_000;
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut biased = HashMap::new();
    for _ in 0..n {
        let mut s = plain_sample(&prompt, &mut rng);
        // "Accept" a random guess at the last position a third of the time.
        if rng.random_range(0..3) == 0 {
            let guess = rng.random_range(0..VOCAB as u32);
            let mut ctx = prompt.to_vec();
            ctx.extend(&s[..LEN - 1]);
            if Distribution::new(&toy_logits(&ctx), &ctx, &params()).prob(guess) > 0.0 {
                s[LEN - 1] = guess;
            }
        }
        *biased.entry(s).or_insert(0) += 1;
    }
    assert!(total_variation(&biased, n, &truth) > 0.04);
}

#[test]
fn tree_sampling_matches_plain_distribution() {
    let prompt = [2u32, 4];
    let truth = exact(&prompt);
    let n = 60_000;
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let mut counts = HashMap::new();
    for _ in 0..n {
        *counts.entry(tree_sample(&prompt, &mut rng)).or_insert(0) += 1;
    }
    let tv = total_variation(&counts, n, &truth);
    assert!(tv < 0.04, "tree sampler off: {tv}");
}
