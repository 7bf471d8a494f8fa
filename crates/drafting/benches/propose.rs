//! One proposal at several context lengths: the incremental index against
//! the backwards scan it replaces, and the index under each match policy.
//! (`examples/replay.rs --scaling` times whole batches on text where common
//! tokens recur, the scored policy's costly case.)
//!
//! Contexts are random tokens from a 32k vocabulary with spans of earlier
//! text copied in (as when a model quotes its prompt). In the `hit` case the
//! last tokens repeat a span from the first half of the context, so the scan
//! has to walk back a long way before it finds it; in the `miss` case the
//! last token never occurred before, which is the scan's worst case (every
//! n-gram size scans the whole context).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use drafting::{propose_by_scan, MatchPolicy, NgramConfig, NgramIndex};

const VOCAB: u32 = 32_000;
const MIN_N: usize = 1;
const MAX_N: usize = 4;
const K: usize = 8;
const SIZES: [usize; 4] = [1 << 10, 8 << 10, 32 << 10, 128 << 10];

/// splitmix64: a small deterministic generator for the fixtures.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `len` tokens: random text with copied spans, ending in a 12-token copy
/// of a span from the first half (`hit`) or in a never-seen token (`miss`).
fn context(len: usize, hit: bool, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed);
    let mut tokens = Vec::with_capacity(len);
    let body = len - 12;
    while tokens.len() < body {
        if tokens.len() > 64 && rng.below(8) == 0 {
            // Copy 8..64 tokens from anywhere earlier.
            let span = 8 + rng.below(56) as usize;
            let from = rng.below((tokens.len() - span) as u64) as usize;
            for i in 0..span.min(body - tokens.len()) {
                tokens.push(tokens[from + i]);
            }
        } else {
            tokens.push(rng.below(u64::from(VOCAB)) as u32);
        }
    }
    if hit {
        let from = (body / 4) + rng.below((body / 4) as u64) as usize;
        for i in 0..12 {
            tokens.push(tokens[from + i]);
        }
    } else {
        tokens.extend((0..12).map(|_| rng.below(u64::from(VOCAB)) as u32));
        *tokens.last_mut().unwrap() = VOCAB + 1;
    }
    tokens
}

fn bench_propose(c: &mut Criterion) {
    let config = NgramConfig::new(MIN_N, MAX_N).unwrap();
    for &size in &SIZES {
        let mut group = c.benchmark_group(format!("propose/{}k", size >> 10));
        group.throughput(Throughput::Elements(1));
        for (case, hit) in [("hit", true), ("miss", false)] {
            let tokens = context(size, hit, size as u64);
            let index = NgramIndex::with_tokens(config, &tokens);
            let mut out = Vec::with_capacity(K);
            // Both must agree before their speed is worth comparing.
            let expect = propose_by_scan(&tokens, MIN_N, MAX_N, K, &mut out);
            assert_eq!(index.propose(K, &mut out), expect);
            assert_eq!(expect.is_some(), hit);
            if let Some(m) = expect {
                eprintln!(
                    "{size} tokens, {case}: n = {}, match starts {} tokens before the end",
                    m.n,
                    size - m.start
                );
            }

            group.bench_function(BenchmarkId::new("index", case), |b| {
                b.iter(|| black_box(index.propose(black_box(K), &mut out)))
            });
            // The other policies over the same index (`index` above is `recent`).
            for policy in [
                MatchPolicy::Earliest,
                MatchPolicy::LongestContinuation,
                MatchPolicy::Scored,
            ] {
                let mut other = index.clone();
                other.set_policy(policy);
                group.bench_function(BenchmarkId::new(format!("index-{policy}"), case), |b| {
                    b.iter(|| black_box(other.propose(black_box(K), &mut out)))
                });
            }
            group.bench_function(BenchmarkId::new("scan", case), |b| {
                b.iter(|| {
                    black_box(propose_by_scan(
                        black_box(&tokens),
                        MIN_N,
                        MAX_N,
                        black_box(K),
                        &mut out,
                    ))
                })
            });
        }
        group.finish();
    }
}

/// Cost of building the index by pushing every token of a 128k context.
fn bench_build(c: &mut Criterion) {
    let config = NgramConfig::new(MIN_N, MAX_N).unwrap();
    let size = 128 << 10;
    let tokens = context(size, true, 7);
    let mut group = c.benchmark_group("build");
    group.throughput(Throughput::Elements(size as u64));
    group.sample_size(10);
    group.bench_function("push_128k", |b| {
        b.iter(|| black_box(NgramIndex::with_tokens(config, black_box(&tokens))))
    });
    group.finish();
}

fn short() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = short();
    targets = bench_propose, bench_build
}
criterion_main!(benches);
