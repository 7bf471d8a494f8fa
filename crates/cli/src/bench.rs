//! `pld bench forward`: the cost of one forward pass over 1..16 new tokens at a realistic cache
//! length, and the decode rate.

use clap::{Args, Subcommand};
use serde_json::json;
use std::time::Instant;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Time forward passes over 1, 2, 4, 8 and 16 new tokens.
    Forward(ForwardArgs),
    /// Run workloads through plain and speculative decoding and report the speedup per category.
    Run(crate::workload::RunArgs),
    /// Replay recorded outputs through the drafter to compare drafting settings offline.
    Drafting(crate::drafting_study::DraftingArgs),
    /// Load-test the HTTP server with and without speculation at several concurrency levels.
    Serve(crate::load::LoadArgs),
}

#[derive(Args, Debug)]
pub struct ForwardArgs {
    #[arg(long, default_value = crate::generate::DEFAULT_MODEL)]
    pub model: String,
    /// Tokens already in the cache when the passes are timed.
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Timed repetitions of each pass size (the median is reported).
    #[arg(long, default_value_t = 7)]
    pub repeats: usize,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Forward(a) => forward(a),
        BenchCommand::Run(a) => crate::workload::run(a),
        BenchCommand::Drafting(a) => crate::drafting_study::run(a),
        BenchCommand::Serve(a) => crate::load::run(a),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn forward(a: ForwardArgs) -> anyhow::Result<()> {
    let threads = crate::init_threads(a.threads)?;
    let lm = crate::load_model(&a.model)?;
    let model = &lm.model;
    let sizes = [1usize, 2, 4, 8, 16];
    let capacity = a.context + 64 + 16;
    if capacity > model.config.context_len {
        anyhow::bail!(
            "--context {} does not fit the model's context of {}",
            a.context,
            model.config.context_len
        );
    }
    // A realistic cache: real text repeated to the wanted length.
    let text = "The quick brown fox jumps over the lazy dog. fn main() { println!(\"hello\"); } ";
    let seed_ids = lm.tokenizer.encode(text)?;
    let tokens: Vec<u32> = seed_ids
        .iter()
        .cycle()
        .take(a.context + 64 + 16)
        .copied()
        .collect();
    let mut cache = model.new_cache(capacity);
    let prefill = |cache: &mut engine::kv_cache::KvCache, toks: &[u32]| -> anyhow::Result<()> {
        for chunk in toks.chunks(engine::generate::PREFILL_CHUNK) {
            model.forward(&mut [engine::model::BatchItem {
                tokens: chunk,
                cache: &mut *cache,
                all_logits: false,
            }])?;
        }
        Ok(())
    };
    prefill(&mut cache, &tokens[..a.context])?;
    let mut passes = Vec::new();
    for &n in &sizes {
        let input = &tokens[a.context..a.context + n];
        let mut times = Vec::new();
        for rep in 0..a.repeats + 1 {
            let t = Instant::now();
            model.forward(&mut [engine::model::BatchItem {
                tokens: input,
                cache: &mut cache,
                all_logits: true,
            }])?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            cache.truncate(a.context);
            if rep > 0 {
                times.push(ms);
            }
        }
        passes.push((n, median(times)));
    }
    // Decode: 64 single-token passes, each appending to the cache.
    let t = Instant::now();
    let decode_steps = 64;
    for i in 0..decode_steps {
        model.forward(&mut [engine::model::BatchItem {
            tokens: &tokens[a.context + i..a.context + i + 1],
            cache: &mut cache,
            all_logits: true,
        }])?;
    }
    let decode_tps = decode_steps as f64 / t.elapsed().as_secs_f64();
    let one = passes[0].1;
    if a.json {
        let v = json!({
            "model": lm.name,
            "model_path": lm.path,
            "threads": threads,
            "context": a.context,
            "passes": passes.iter().map(|(n, ms)| json!({"tokens": n, "ms": ms, "ratio_to_one": ms / one})).collect::<Vec<_>>(),
            "decode_tokens_per_s": decode_tps,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "model {} ({} threads, {} tokens in cache)",
            lm.name, threads, a.context
        );
        for (n, ms) in &passes {
            println!(
                "  pass over {n:>2} tokens: {ms:8.2} ms  ({:.2}x one token)",
                ms / one
            );
        }
        println!("  decode: {decode_tps:.1} tokens/s");
    }
    Ok(())
}
