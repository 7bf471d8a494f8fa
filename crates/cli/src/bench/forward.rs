//! `pld bench forward`: the cost of one forward pass over 1..64 new tokens at a realistic cache
//! length, the decode and prefill rates, and each beside its physical limit (memory bandwidth over
//! the weights and the cache; the int8 peak for the products and the f32 peak for attention; all
//! three measured in the same run).

use super::results::{ForwardReport, ForwardRun, PassTiming};
use clap::Args;
use engine::kv_cache::KvCache;
use engine::model::BatchItem;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ForwardArgs {
    #[arg(long, default_value = crate::common::DEFAULT_MODEL)]
    pub model: String,
    #[command(flatten)]
    pub kv: crate::common::KvCacheArgs,
    /// Tokens already in the cache when the passes are timed.
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Timed repetitions of each pass size (the median is reported).
    #[arg(long, default_value_t = 7)]
    pub repeats: usize,
    /// Length of the prompt whose prefill is timed.
    #[arg(long, default_value_t = 1024)]
    pub prefill_tokens: usize,
    /// Thread counts to measure, comma-separated (default: 1 and all cores). Each count runs in
    /// its own process, one after the other.
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    #[arg(long)]
    pub json: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn run(a: ForwardArgs) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut counts = if a.threads.is_empty() {
        vec![1, cores]
    } else {
        a.threads.clone()
    };
    counts.dedup();
    if let Some(0) = counts.iter().copied().min() {
        anyhow::bail!("--threads must be at least 1");
    }
    let runs = if let [n] = counts[..] {
        vec![forward_one(&a, n)?]
    } else {
        runs_in_children(&a, &counts)?
    };
    if a.json {
        // The run with the most threads at the top level (`threads`, `passes`,
        // `decode_tokens_per_s`, ...), every run under `runs`.
        let top = runs
            .iter()
            .max_by_key(|r| r.threads)
            .cloned()
            .expect("at least one thread count");
        let report = ForwardReport { top, runs };
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("model {}", runs[0].model);
    for r in &runs {
        print_run(r);
    }
    Ok(())
}

/// Each thread count's run in a child process of its own (the thread pool is set once per
/// process), one after the other.
fn runs_in_children(a: &ForwardArgs, counts: &[usize]) -> anyhow::Result<Vec<ForwardRun>> {
    let exe = std::env::current_exe()?;
    let mut runs = Vec::new();
    for n in counts {
        let out = std::process::Command::new(&exe)
            .args(["bench", "forward", "--json", "--model", &a.model])
            .args(["--context", &a.context.to_string()])
            .args(["--repeats", &a.repeats.to_string()])
            .args(["--prefill-tokens", &a.prefill_tokens.to_string()])
            .args(["--kv-cache-dtype", a.kv.kv_cache_dtype.name()])
            .args(["--threads", &n.to_string()])
            .stderr(std::process::Stdio::inherit())
            .output()?;
        if !out.status.success() {
            anyhow::bail!("bench forward with {n} threads failed");
        }
        let report: ForwardReport = serde_json::from_slice(&out.stdout)?;
        runs.extend(report.runs);
    }
    Ok(runs)
}

/// One thread count's figures as text: each pass, then decode and prefill.
fn print_run(r: &ForwardRun) {
    println!(
        "{} threads ({} tokens in an {} cache):",
        r.threads, r.context, r.kv_cache_dtype
    );
    for p in &r.passes {
        print_pass(p);
    }
    println!(
        "  decode: {:.1} tokens/s = {:.0}% of the bandwidth bound ({:.1} tokens/s: {:.0} MB of \
         weights and {:.0} MB of cache at {:.1} GB/s)",
        r.decode_tokens_per_s,
        100.0 * r.decode_fraction_of_bound,
        r.bandwidth_bound_tokens_per_s,
        r.weight_bytes_per_token as f64 / 1e6,
        r.cache_bytes_per_token as f64 / 1e6,
        r.bandwidth_gb_s
    );
    print_prefill(r);
}

/// One pass size's line.
fn print_pass(p: &PassTiming) {
    let experts = match (p.experts_per_layer, p.expert_bytes) {
        (Some(n), Some(b)) => {
            format!("; {n:.1} experts a layer, {:.0} MB of them", b as f64 / 1e6)
        }
        _ => String::new(),
    };
    let attention = match (p.attention_ms, p.attention_limit_ms) {
        (Some(ms), Some(limit)) => format!(
            "; attention {ms:.1} ms, {:.0}% of the pass, limit {limit:.1} ms",
            100.0 * ms / p.ms
        ),
        _ => String::new(),
    };
    println!(
        "  pass over {:>2} tokens: {:8.2} ms, fastest {:8.2}  ({:.2}x one token; limit {:.2} ms, \
         {:.0}% of it{experts}{attention})",
        p.tokens,
        p.ms,
        p.fastest_ms,
        p.ratio_to_one,
        p.limit_ms,
        100.0 * p.share_of_limit
    );
}

/// The prefill's rate beside its compute limit, and where a chunk's time went.
fn print_prefill(r: &ForwardRun) {
    let compute = match (
        r.prefill_compute_limit_tokens_per_s,
        r.prefill_fraction_of_compute_limit,
    ) {
        (Some(l), Some(f)) => format!(
            " = {:.0}% of the compute limit ({l:.1} tokens/s at {:.0} G int8{}{} and {:.0} G \
             f32 multiply-adds/s){}",
            100.0 * f,
            r.int8_peak_gmacs.unwrap_or(0.0),
            r.amx_int8_peak_gmacs
                .map(|p| format!(" ({p:.0} G on AMX tiles)"))
                .unwrap_or_default(),
            r.amx_bf16_peak_gmacs
                .map(|p| format!(", {p:.0} G bf16 on tiles for prompt rows"))
                .unwrap_or_default(),
            r.f32_peak_gmacs.unwrap_or(0.0),
            r.prefill_fraction_of_tile_peak
                .map(|f| format!(
                    "; its products at {:.0}% of the tile peak of prompt rows ({})",
                    100.0 * f,
                    r.prompt_rows
                ))
                .unwrap_or_default(),
        ),
        _ => String::new(),
    };
    println!(
        "  prefill of {} tokens: {:.1} tokens/s{compute}",
        r.prefill_tokens, r.prefill_tokens_per_s
    );
    if let (Some(ms), Some(products), Some(attention)) = (
        r.prefill_chunk_ms,
        r.prefill_products_share,
        r.prefill_attention_share,
    ) {
        let peak = r
            .prefill_products_fraction_of_tile_peak
            .map(|f| format!(" (at {:.0}% of the tile peak of prompt rows)", 100.0 * f))
            .unwrap_or_default();
        println!(
            "    per chunk of {} tokens: {ms:.1} ms: products {:.0}%{peak}, attention {:.0}%, \
             the rest {:.0}%",
            engine::step::PREFILL_CHUNK,
            100.0 * products,
            100.0 * attention,
            100.0 * (1.0 - products - attention)
        );
    }
}

/// Feeds `toks` into `cache` in prefill chunks, as generation does.
fn prefill(model: &engine::Model, cache: &mut KvCache, toks: &[u32]) -> anyhow::Result<()> {
    for chunk in toks.chunks(engine::step::PREFILL_CHUNK) {
        model.forward(&mut [BatchItem {
            tokens: chunk,
            cache: &mut *cache,
            all_logits: false,
            prompt: true,
            parents: &[],
        }])?;
    }
    Ok(())
}

/// One pass size's timing: rows, median and fastest ms, and in a mixture of experts what the
/// pass read of them.
struct Timed {
    rows: usize,
    ms: f64,
    fastest_ms: f64,
    /// Attention's part of the median pass.
    attention_ms: f64,
    experts: Option<engine::model::ExpertsRead>,
}

/// Each pass size over `context` cached positions (the cache cut back after each): its size, its
/// median and its fastest time in ms over `repeats` runs after one warm-up.
fn time_passes(
    model: &engine::Model,
    cache: &mut KvCache,
    tokens: &[u32],
    context: usize,
    repeats: usize,
) -> anyhow::Result<Vec<Timed>> {
    let sizes = [1usize, 2, 4, 8, 16, 32, 64];
    let mut passes = Vec::new();
    for &n in &sizes {
        let input = &tokens[context..context + n];
        let (mut times, mut attention) = (Vec::new(), Vec::new());
        for rep in 0..repeats + 1 {
            let (t, a) = (Instant::now(), engine::model::attention_time());
            model.forward(&mut [BatchItem {
                tokens: input,
                cache: &mut *cache,
                all_logits: true,
                prompt: false,
                parents: &[],
            }])?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let attention_ms = (engine::model::attention_time() - a).as_secs_f64() * 1e3;
            cache.truncate(context);
            if rep > 0 {
                times.push(ms);
                attention.push(attention_ms);
            }
        }
        let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
        passes.push(Timed {
            rows: n,
            ms: median(times),
            fastest_ms: fastest,
            attention_ms: median(attention),
            experts: model.experts_read(),
        });
    }
    Ok(passes)
}

/// Decode: 64 single-token passes after `context` positions, each appending to the cache;
/// tokens per second.
fn time_decode(
    model: &engine::Model,
    cache: &mut KvCache,
    tokens: &[u32],
    context: usize,
) -> anyhow::Result<f64> {
    let t = Instant::now();
    let decode_steps = 64;
    for i in 0..decode_steps {
        model.forward(&mut [BatchItem {
            tokens: &tokens[context + i..context + i + 1],
            cache: &mut *cache,
            all_logits: true,
            prompt: false,
            parents: &[],
        }])?;
    }
    Ok(decode_steps as f64 / t.elapsed().as_secs_f64())
}

/// What one thread count measured: the prefill of a long prompt into an empty cache (its
/// seconds, and its products' and attention's), each pass size after the context, and decode.
struct Measured {
    prefill_s: f64,
    prefill_products_s: f64,
    prefill_attention_s: f64,
    passes: Vec<Timed>,
    decode_tps: f64,
}

/// Times the prefill, the passes and decode over a cache of real text repeated to length.
fn measure(a: &ForwardArgs, lm: &engine::LoadedModel) -> anyhow::Result<Measured> {
    let model = &lm.model;
    let capacity = (a.context + 64 + 64).max(a.prefill_tokens + 1);
    if capacity > model.config.context_len {
        anyhow::bail!(
            "--context {} / --prefill-tokens {} do not fit the model's context of {}",
            a.context,
            a.prefill_tokens,
            model.config.context_len
        );
    }
    // A realistic cache: real text repeated to the wanted length.
    let text = "The quick brown fox jumps over the lazy dog. fn main() { println!(\"hello\"); } ";
    let seed_ids = lm.tokenizer.encode(text)?;
    let tokens: Vec<u32> = seed_ids.iter().cycle().take(capacity).copied().collect();
    let mut cache = model.new_cache(capacity);
    // Prefill of a long prompt into an empty cache, as generation does it (chunked).
    let clocks = (
        engine::model::products_time(),
        engine::model::attention_time(),
    );
    let t = Instant::now();
    prefill(model, &mut cache, &tokens[..a.prefill_tokens])?;
    let prefill_s = t.elapsed().as_secs_f64();
    let prefill_products_s = (engine::model::products_time() - clocks.0).as_secs_f64();
    let prefill_attention_s = (engine::model::attention_time() - clocks.1).as_secs_f64();
    cache.truncate(0);
    prefill(model, &mut cache, &tokens[..a.context])?;
    let passes = time_passes(model, &mut cache, &tokens, a.context, a.repeats)?;
    let decode_tps = time_decode(model, &mut cache, &tokens, a.context)?;
    Ok(Measured {
        prefill_s,
        prefill_products_s,
        prefill_attention_s,
        passes,
        decode_tps,
    })
}

/// What bounds a pass after `context` positions: a streaming read over the weights and the cache
/// it reads (once for all its rows), or its compute, the products' int8 multiply-adds and
/// attention's f32 ones, each at its own peak measured in this run.
struct Limits<'a> {
    model: &'a engine::Model,
    context: usize,
    gb_s: f64,
    weight_bytes: usize,
    macs: usize,
    peak: Option<f64>,
    f32_peak: Option<f64>,
    amx_peak: Option<f64>,
    bf16_peak: Option<f64>,
    /// The peak of what prompt rows run on under `PLD_PROMPT_ROWS=int8`: int8 tiles, or the
    /// vector int8 loop in a class without them; else the bf16 tiles (none in other classes).
    prompt_peak: Option<f64>,
    /// What attention runs on: bf16 tiles (measured, or half the int8 peak) or f32 lanes.
    attention_peak: Option<f64>,
}

impl<'a> Limits<'a> {
    fn new(model: &'a engine::Model, context: usize) -> Limits<'a> {
        let weight_bytes = model.weight_bytes_per_token();
        // A streaming read over twice the model's weights (at least 1 GiB, past any cache).
        let gb_s = engine::kernels::read_bandwidth((2 * weight_bytes).max(1 << 30));
        let (amx_peak, bf16_peak) = (
            engine::kernels::amx_int8_peak_gmacs(),
            engine::kernels::amx_bf16_peak_gmacs(),
        );
        let peak = engine::kernels::int8_peak_gmacs();
        let f32_peak = engine::kernels::f32_peak_gmacs();
        let prompt_peak = match engine::kernels::prompt_rows_on_int8() {
            true => amx_peak.or(peak),
            false => bf16_peak,
        };
        let tiles = engine::kernels::tiles_attend(engine::kernels::isa(), model.config.head_dim)
            && model.kv_shape().dtype == engine::kv_cache::KvDtype::Bf16;
        let attention_peak = match tiles {
            true => bf16_peak.or(amx_peak.map(|p| p / 2.0)),
            false => f32_peak,
        };
        Limits {
            model,
            context,
            gb_s,
            weight_bytes,
            macs: model.macs_per_token(),
            peak,
            f32_peak,
            amx_peak,
            bf16_peak,
            prompt_peak,
            attention_peak,
        }
    }

    /// Seconds of compute for `tokens` rows after `before` positions of cache: a prompt's rows at
    /// the peak of what they run on; generated rows on AMX int8 tiles from `AMX_MIN_ROWS` rows.
    fn compute_s(&self, before: usize, tokens: usize, prompt: bool) -> f64 {
        let peak = match (self.prompt_peak, self.amx_peak) {
            (Some(p), _) if prompt => Some(p),
            (_, Some(p)) if tokens >= engine::kernels::AMX_MIN_ROWS => Some(p),
            _ => self.peak,
        };
        let products = peak.map_or(0.0, |p| (tokens * self.macs) as f64 / (p * 1e9));
        let attention: usize = (1..=tokens)
            .map(|r| self.model.attention_macs(before + r))
            .sum();
        products + self.f32_peak.map_or(0.0, |p| attention as f64 / (p * 1e9))
    }

    /// A pass of `tokens` rows, in ms. A mixture's pass reads the experts its rows chose
    /// (measured), not a token's average.
    fn pass_ms(&self, tokens: usize, experts: Option<engine::model::ExpertsRead>) -> f64 {
        let model = self.model;
        let weights = experts.map_or(self.weight_bytes, |x| model.dense_weight_bytes() + x.bytes);
        let bytes = weights + model.cache_bytes_read(self.context + tokens);
        let memory = bytes as f64 / (self.gb_s * 1e9);
        memory.max(self.compute_s(self.context, tokens, false)) * 1e3
    }

    /// Attention's own part of a pass of `tokens` rows, in ms: the cache it reads, or its
    /// multiply-adds at the peak of what it runs on.
    fn attention_ms(&self, tokens: usize) -> f64 {
        let model = self.model;
        let memory = model.cache_bytes_read(self.context + tokens) as f64 / (self.gb_s * 1e9);
        let macs: usize = (1..=tokens)
            .map(|r| model.attention_macs(self.context + r))
            .sum();
        let compute = self.attention_peak.map_or(0.0, |p| macs as f64 / (p * 1e9));
        memory.max(compute) * 1e3
    }
}

/// Every figure at one thread count, in this process.
fn forward_one(a: &ForwardArgs, threads: usize) -> anyhow::Result<ForwardRun> {
    let threads = crate::common::init_threads(Some(threads))?;
    let lm = crate::common::load_model(&a.model, &a.kv)?;
    let model = &lm.model;
    let m = measure(a, &lm)?;
    let l = Limits::new(model, a.context);
    let (weight_bytes, macs) = (l.weight_bytes, l.macs);
    let cache_bytes = model.cache_bytes_read(a.context);
    let bound = l.gb_s * 1e9 / (weight_bytes + cache_bytes) as f64;
    let prefill_tps = a.prefill_tokens as f64 / m.prefill_s;
    // Prefill goes in chunks, each reading the weights once: its limit is its compute.
    let prefill_limit_tps = l
        .peak
        .map(|_| a.prefill_tokens as f64 / l.compute_s(0, a.prefill_tokens, true));
    let one = m.passes[0].ms;
    let chunks = a.prefill_tokens.div_ceil(engine::step::PREFILL_CHUNK) as f64;
    Ok(ForwardRun {
        model: lm.name.clone(),
        model_path: lm.path.clone(),
        threads,
        isa: format!("{:?}", engine::kernels::isa()),
        context: a.context,
        passes: m
            .passes
            .iter()
            .map(|p| (p, l.pass_ms(p.rows, p.experts)))
            .map(|(p, limit_ms)| PassTiming {
                tokens: p.rows,
                ms: p.ms,
                fastest_ms: p.fastest_ms,
                ratio_to_one: p.ms / one,
                limit_ms,
                share_of_limit: limit_ms / p.ms,
                experts_per_layer: p.experts.map(|x| x.per_layer),
                expert_bytes: p.experts.map(|x| x.bytes),
                attention_ms: Some(p.attention_ms),
                attention_limit_ms: Some(l.attention_ms(p.rows)),
            })
            .collect(),
        decode_tokens_per_s: m.decode_tps,
        prefill_tokens: a.prefill_tokens,
        prefill_tokens_per_s: prefill_tps,
        weight_bytes_per_token: weight_bytes,
        cache_bytes_per_token: cache_bytes,
        kv_cache_dtype: model.kv_shape().dtype.name().into(),
        attention_macs_per_token: model.attention_macs(a.context + 1),
        bandwidth_gb_s: l.gb_s,
        bandwidth_bound_tokens_per_s: bound,
        decode_fraction_of_bound: m.decode_tps / bound,
        macs_per_token: macs,
        int8_peak_gmacs: l.peak,
        amx_int8_peak_gmacs: l.amx_peak,
        amx_bf16_peak_gmacs: l.bf16_peak,
        prompt_rows: engine::kernels::prompt_arithmetic().to_string(),
        prompt_copy_bytes: model.prompt_copy_bytes(),
        prefill_fraction_of_tile_peak: l.prompt_peak.map(|p| prefill_tps * macs as f64 / (p * 1e9)),
        prefill_chunk_ms: Some(m.prefill_s * 1e3 / chunks),
        prefill_products_share: Some(m.prefill_products_s / m.prefill_s),
        prefill_attention_share: Some(m.prefill_attention_s / m.prefill_s),
        // The layers' products only: the head is outside their clock (and runs on one row).
        prefill_products_fraction_of_tile_peak: l.prompt_peak.map(|p| {
            let layer_macs = macs - model.head_macs();
            (a.prefill_tokens * layer_macs) as f64 / m.prefill_products_s / (p * 1e9)
        }),
        f32_peak_gmacs: l.f32_peak,
        prefill_fraction_of_compute_limit: prefill_limit_tps.map(|l| prefill_tps / l),
        prefill_compute_limit_tokens_per_s: prefill_limit_tps,
    })
}
