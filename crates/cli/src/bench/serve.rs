//! `pld bench serve`: a load benchmark of the HTTP server. Two servers run in this process on
//! loopback, one without speculation and one with it; at each concurrency level N clients send
//! grounded prompts (first turns of a workload) to each in turn, and the table reports requests/s,
//! generated tokens/s, mean and p95 latency, and the speculative/plain throughput ratio.

use crate::spec::SpecArgs;
use clap::Args;
use drafting::SpecConfig;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[arg(long, default_value = "qwen-coder-0.5b")]
    pub model: String,
    /// Workload in Spec-Bench's JSONL format (first turns are sent).
    #[arg(long)]
    pub workload: PathBuf,
    #[arg(long, value_delimiter = ',')]
    pub categories: Vec<String>,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    pub clients: Vec<usize>,
    /// Requests per concurrency level, mode and round.
    #[arg(long, default_value_t = 16)]
    pub requests: usize,
    /// Rounds per level, alternating which mode goes first (plain-speculative, then
    /// speculative-plain, ...), so that a machine getting busier or quieter favours neither.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    #[arg(long, default_value_t = 96)]
    pub max_tokens: usize,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub prefix_cache: crate::common::PrefixCacheArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

struct LevelResult {
    requests_per_s: f64,
    tokens_per_s: f64,
    mean_latency: f64,
    p95_latency: f64,
}

/// What one run of a level measured: wall time and (latency, tokens) per request.
#[derive(Default)]
struct Samples {
    wall: f64,
    requests: Vec<(f64, u64)>,
}

impl Samples {
    fn add(&mut self, other: Samples) {
        self.wall += other.wall;
        self.requests.extend(other.requests);
    }

    fn result(&self) -> LevelResult {
        let mut lat: Vec<f64> = self.requests.iter().map(|x| x.0).collect();
        lat.sort_by(|a, b| a.total_cmp(b));
        let tokens: u64 = self.requests.iter().map(|x| x.1).sum();
        let wall = self.wall.max(1e-9);
        LevelResult {
            requests_per_s: lat.len() as f64 / wall,
            tokens_per_s: tokens as f64 / wall,
            mean_latency: lat.iter().sum::<f64>() / lat.len().max(1) as f64,
            p95_latency: lat
                .get(((lat.len() as f64 * 0.95).ceil() as usize).clamp(1, lat.len().max(1)) - 1)
                .copied()
                .unwrap_or(f64::NAN),
        }
    }
}

fn prompts(a: &ServeArgs) -> anyhow::Result<Vec<String>> {
    let out: Vec<String> = super::results::read_workload(&a.workload)?
        .into_iter()
        .filter(|r| a.categories.is_empty() || a.categories.contains(&r.category))
        .map(|r| r.turns[0].clone())
        .collect();
    if out.is_empty() {
        anyhow::bail!("no prompts in {}", a.workload.display());
    }
    Ok(out)
}

fn server_config(
    a: &ServeArgs,
    ctx: usize,
    max_seqs: usize,
    s: SpecConfig,
) -> server::ServerConfig {
    server::ServerConfig {
        model_name: "bench".into(),
        api_keys: Vec::new(),
        corpus_tokens: drafting::DEFAULT_CORPUS_TOKENS,
        prefix_cache_bytes: a.prefix_cache.budget(),
        max_num_seqs: max_seqs,
        max_queue: 1024,
        max_model_len: ctx,
        max_body_bytes: 16 << 20,
        spec: s,
        cors_origins: Vec::new(),
        lenient: false,
    }
}

async fn start(app: axum::Router) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}/v1/chat/completions"))
}

async fn level(
    url: &str,
    prompts: &[String],
    clients: usize,
    n: usize,
    max_tokens: usize,
) -> anyhow::Result<Samples> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3600))
        .build()?;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, next, url, prompts) = (
            client.clone(),
            next.clone(),
            url.to_string(),
            prompts.to_vec(),
        );
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(out);
                }
                let body = json!({
                    "model": "bench",
                    "messages": [{"role": "user", "content": prompts[i % prompts.len()]}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                });
                let t = Instant::now();
                let r = client.post(&url).json(&body).send().await?;
                let status = r.status();
                let v: Value = r.json().await?;
                if !status.is_success() {
                    anyhow::bail!("request failed ({status}): {v}");
                }
                let tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
                out.push((t.elapsed().as_secs_f64(), tokens));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(Samples {
        wall: started.elapsed().as_secs_f64(),
        requests: all,
    })
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let threads = crate::common::init_threads(a.threads)?;
    let spec = a.spec.resolve()?;
    let plain = SpecConfig::off();
    let prompts = prompts(&a)?;
    let lm = Arc::new(crate::common::load_model(&a.model)?);
    let ctx = lm.model.config.context_len.min(8192);
    let max_seqs = a.clients.iter().copied().max().unwrap_or(1).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rows = rt.block_on(async {
        let plain_url = start(server::app(
            lm.clone(),
            server_config(&a, ctx, max_seqs, plain),
        ))
        .await?;
        let spec_url = start(server::app(
            lm.clone(),
            server_config(&a, ctx, max_seqs, spec),
        ))
        .await?;
        // Warm-up.
        level(&plain_url, &prompts, 1, 1, 8).await?;
        level(&spec_url, &prompts, 1, 1, 8).await?;
        let mut rows = Vec::new();
        for &c in &a.clients {
            let (mut p, mut s) = (Samples::default(), Samples::default());
            for round in 0..a.rounds.max(1) {
                let order = if round % 2 == 0 {
                    [false, true]
                } else {
                    [true, false]
                };
                for speculative in order {
                    let url = if speculative { &spec_url } else { &plain_url };
                    let got = level(url, &prompts, c, a.requests, a.max_tokens).await?;
                    if speculative {
                        s.add(got)
                    } else {
                        p.add(got)
                    }
                }
            }
            let (p, s) = (p.result(), s.result());
            eprintln!(
                "{c} clients: plain {:.1} tok/s, speculative {:.1} tok/s",
                p.tokens_per_s, s.tokens_per_s
            );
            rows.push((c, p, s));
        }
        Ok::<_, anyhow::Error>(rows)
    })?;
    if a.json {
        let v: Vec<Value> = rows
            .iter()
            .map(|(c, p, s)| {
                json!({
                    "clients": c,
                    "plain": {"requests_per_s": p.requests_per_s, "tokens_per_s": p.tokens_per_s, "mean_latency_s": p.mean_latency, "p95_latency_s": p.p95_latency},
                    "speculative": {"requests_per_s": s.requests_per_s, "tokens_per_s": s.tokens_per_s, "mean_latency_s": s.mean_latency, "p95_latency_s": s.p95_latency},
                    "speedup": s.tokens_per_s / p.tokens_per_s.max(1e-9),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"model": lm.name, "threads": threads, "max_tokens": a.max_tokens, "requests": a.requests, "rounds": a.rounds, "levels": v})
            )?
        );
    } else {
        println!(
            "model {} ({threads} threads), {} requests per level and mode in each of {} rounds, {} new tokens",
            lm.name, a.requests, a.rounds, a.max_tokens
        );
        println!("| clients | mode | req/s | gen tok/s | mean latency s | p95 latency s | speedup |\n|---:|---|---:|---:|---:|---:|---:|");
        for (c, p, s) in &rows {
            println!(
                "| {c} | plain | {:.2} | {:.1} | {:.2} | {:.2} | |",
                p.requests_per_s, p.tokens_per_s, p.mean_latency, p.p95_latency
            );
            println!(
                "| {c} | speculative | {:.2} | {:.1} | {:.2} | {:.2} | {:.2}x |",
                s.requests_per_s,
                s.tokens_per_s,
                s.mean_latency,
                s.p95_latency,
                s.tokens_per_s / p.tokens_per_s.max(1e-9)
            );
        }
    }
    Ok(())
}
