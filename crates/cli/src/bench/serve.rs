//! `pld bench serve`: a load benchmark of the HTTP server. Two servers run in this process on
//! loopback, one without speculation and one with it; at each concurrency level N clients send
//! grounded prompts (first turns of a workload) to each in turn, streamed, and the table reports
//! requests/s, generated tokens/s, mean and p95 latency, time to first token, and the
//! speculative/plain throughput ratio.
//!
//! With `--turns T` each client holds conversations instead: the first message is a workload
//! prompt (a document and a task), the next T-1 are follow-up questions, and every request
//! re-sends the whole history with the answers so far, as a chat client does. The table then
//! also gives the mean time to first token and the cached prompt share of each turn.

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
    #[command(flatten)]
    pub kv: crate::common::KvCacheArgs,
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
    /// Turns per conversation: 1 sends single prompts; more makes each request a conversation
    /// whose later turns re-send the history (`--requests` then counts conversations).
    #[arg(long, default_value_t = 1)]
    pub turns: usize,
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
    mean_ttft: f64,
    /// Per turn: mean time to first token (s) and the share of prompt tokens served from the
    /// prefix cache.
    turns: Vec<(f64, f64)>,
}

/// One request as a client saw it.
#[derive(Clone, Copy)]
struct RequestSample {
    turn: usize,
    latency: f64,
    ttft: f64,
    tokens: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
}

/// What one run of a level measured: wall time and every request.
#[derive(Default)]
struct Samples {
    wall: f64,
    requests: Vec<RequestSample>,
}

impl Samples {
    fn add(&mut self, other: Samples) {
        self.wall += other.wall;
        self.requests.extend(other.requests);
    }

    fn result(&self, turns: usize) -> LevelResult {
        let mut lat: Vec<f64> = self.requests.iter().map(|x| x.latency).collect();
        lat.sort_by(|a, b| a.total_cmp(b));
        let tokens: u64 = self.requests.iter().map(|x| x.tokens).sum();
        let wall = self.wall.max(1e-9);
        let mean = |v: &mut dyn Iterator<Item = f64>| {
            let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
            sum / n.max(1) as f64
        };
        let per_turn = (0..turns)
            .map(|t| {
                let of_turn = || self.requests.iter().filter(move |r| r.turn == t);
                let prompt: u64 = of_turn().map(|r| r.prompt_tokens).sum();
                let cached: u64 = of_turn().map(|r| r.cached_tokens).sum();
                (
                    mean(&mut of_turn().map(|r| r.ttft)),
                    cached as f64 / prompt.max(1) as f64,
                )
            })
            .collect();
        LevelResult {
            requests_per_s: lat.len() as f64 / wall,
            tokens_per_s: tokens as f64 / wall,
            mean_latency: mean(&mut lat.iter().copied()),
            p95_latency: lat
                .get(((lat.len() as f64 * 0.95).ceil() as usize).clamp(1, lat.len().max(1)) - 1)
                .copied()
                .unwrap_or(f64::NAN),
            mean_ttft: mean(&mut self.requests.iter().map(|r| r.ttft)),
            turns: per_turn,
        }
    }
}

/// The questions a conversation's later turns ask about its first message.
const FOLLOW_UPS: [&str; 4] = [
    "Summarize your answer in one sentence.",
    "Which detail of the text above matters most, and why?",
    "Quote the sentence of the text that best supports your answer.",
    "List three terms from the text and say what each means.",
];

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

/// The config of a benchmarked server, serving the model as "bench".
pub(super) fn server_config(
    prefix_cache_bytes: usize,
    ctx: usize,
    max_seqs: usize,
    s: SpecConfig,
) -> server::ServerConfig {
    server::ServerConfig {
        model_names: vec!["bench".into()],
        api_keys: Vec::new(),
        corpus_tokens: drafting::DEFAULT_CORPUS_TOKENS,
        prefix_cache_bytes,
        kv_cache_bytes: None,
        max_num_seqs: max_seqs,
        max_queue: 1024,
        max_model_len: ctx,
        max_body_bytes: 16 << 20,
        spec: s,
        cors_origins: Vec::new(),
        lenient: false,
        max_stored_responses: server::DEFAULT_MAX_STORED_RESPONSES,
        stored_responses_bytes: server::DEFAULT_STORED_RESPONSES_BYTES,
        record_requests: None,
        keep_volatile_lines: false,
        prefix_cache_dir: None,
        prefix_cache_dir_bytes: 0,
    }
}

async fn start(app: axum::Router) -> anyhow::Result<String> {
    Ok(format!("{}/v1/chat/completions", start_server(app).await?))
}

/// Serves `app` on a free loopback port in this process; its base URL.
pub(super) async fn start_server(app: axum::Router) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}"))
}

/// Conversations started in this process (each gets its own id).
static CONVERSATIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One streamed chat request: the answer's text and how the client saw it.
async fn chat_request(
    client: &reqwest::Client,
    url: &str,
    messages: &[Value],
    max_tokens: usize,
    turn: usize,
) -> anyhow::Result<(String, RequestSample)> {
    let body = json!({
        "model": "bench",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let t = Instant::now();
    let mut r = client.post(url).json(&body).send().await?;
    let status = r.status();
    if !status.is_success() {
        let text = r.text().await.unwrap_or_default();
        anyhow::bail!("request failed ({status}): {text}");
    }
    let (mut buf, mut text, mut ttft, mut usage) = (String::new(), String::new(), None, None);
    while let Some(chunk) = r.chunk().await? {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(data)?;
            if let Some(e) = v.get("error") {
                anyhow::bail!("the server failed the request: {e}");
            }
            if let Some(delta) = v["choices"][0]["delta"]["content"].as_str() {
                if !delta.is_empty() {
                    ttft.get_or_insert_with(|| t.elapsed().as_secs_f64());
                    text.push_str(delta);
                }
            }
            if v["usage"].is_object() {
                usage = Some(v["usage"].clone());
            }
        }
    }
    let latency = t.elapsed().as_secs_f64();
    let usage = usage.ok_or_else(|| anyhow::anyhow!("the stream ended without usage"))?;
    let sample = RequestSample {
        turn,
        latency,
        ttft: ttft.unwrap_or(latency),
        tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    };
    Ok((text, sample))
}

/// `clients` clients send `n` conversations of `turns` turns (`n` requests when `turns` is 1).
async fn level(
    url: &str,
    prompts: &[String],
    clients: usize,
    n: usize,
    max_tokens: usize,
    turns: usize,
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
                // Its own first line keeps each conversation from reusing another's prefix.
                let id = CONVERSATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let first = format!("[conversation {id}]\n{}", prompts[i % prompts.len()]);
                let mut messages = vec![json!({"role": "user", "content": first})];
                for turn in 0..turns.max(1) {
                    let (answer, sample) =
                        chat_request(&client, &url, &messages, max_tokens, turn).await?;
                    out.push(sample);
                    messages.push(json!({"role": "assistant", "content": answer}));
                    let next_question = FOLLOW_UPS[(i + turn) % FOLLOW_UPS.len()];
                    messages.push(json!({"role": "user", "content": next_question}));
                }
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
    let lm = Arc::new(crate::common::load_model(&a.model, &a.kv)?);
    let ctx = lm.model.config.context_len.min(8192);
    let max_seqs = a.clients.iter().copied().max().unwrap_or(1).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rows = rt.block_on(async {
        let plain_url = start(server::app(
            lm.clone(),
            server_config(a.prefix_cache.budget(), ctx, max_seqs, plain),
        )?)
        .await?;
        let spec_url = start(server::app(
            lm.clone(),
            server_config(a.prefix_cache.budget(), ctx, max_seqs, spec),
        )?)
        .await?;
        // Warm-up.
        let hello = ["Say hello.".to_string()];
        level(&plain_url, &hello, 1, 1, 8, 1).await?;
        level(&spec_url, &hello, 1, 1, 8, 1).await?;
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
                    let got = level(url, &prompts, c, a.requests, a.max_tokens, a.turns).await?;
                    if speculative {
                        s.add(got)
                    } else {
                        p.add(got)
                    }
                }
            }
            let (p, s) = (p.result(a.turns.max(1)), s.result(a.turns.max(1)));
            eprintln!(
                "{c} clients: plain {:.1} tok/s, speculative {:.1} tok/s",
                p.tokens_per_s, s.tokens_per_s
            );
            rows.push((c, p, s));
        }
        Ok::<_, anyhow::Error>(rows)
    })?;
    if a.json {
        let mode = |r: &LevelResult| {
            let turns: Vec<Value> = r
                .turns
                .iter()
                .map(|(ttft, cached)| json!({"mean_ttft_s": ttft, "cached_prompt_share": cached}))
                .collect();
            json!({"requests_per_s": r.requests_per_s, "tokens_per_s": r.tokens_per_s, "mean_latency_s": r.mean_latency, "p95_latency_s": r.p95_latency, "mean_ttft_s": r.mean_ttft, "turns": turns})
        };
        let v: Vec<Value> = rows
            .iter()
            .map(|(c, p, s)| {
                json!({
                    "clients": c,
                    "plain": mode(p),
                    "speculative": mode(s),
                    "speedup": s.tokens_per_s / p.tokens_per_s.max(1e-9),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"model": lm.name, "threads": threads, "max_tokens": a.max_tokens, "requests": a.requests, "rounds": a.rounds, "turns": a.turns.max(1), "levels": v})
            )?
        );
    } else {
        print_tables(&a, &lm.name, threads, &rows);
    }
    Ok(())
}

fn print_tables(
    a: &ServeArgs,
    model: &str,
    threads: usize,
    rows: &[(usize, LevelResult, LevelResult)],
) {
    let unit = if a.turns > 1 {
        format!("conversations of {} turns", a.turns)
    } else {
        "requests".into()
    };
    println!(
        "model {model} ({threads} threads), {} {unit} per level and mode in each of {} rounds, {} new tokens",
        a.requests, a.rounds, a.max_tokens
    );
    println!("| clients | mode | req/s | gen tok/s | mean latency s | p95 latency s | mean TTFT s | speedup |\n|---:|---|---:|---:|---:|---:|---:|---:|");
    for (c, p, s) in rows {
        println!(
            "| {c} | plain | {:.2} | {:.1} | {:.2} | {:.2} | {:.2} | |",
            p.requests_per_s, p.tokens_per_s, p.mean_latency, p.p95_latency, p.mean_ttft
        );
        println!(
            "| {c} | speculative | {:.2} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2}x |",
            s.requests_per_s,
            s.tokens_per_s,
            s.mean_latency,
            s.p95_latency,
            s.mean_ttft,
            s.tokens_per_s / p.tokens_per_s.max(1e-9)
        );
    }
    if a.turns <= 1 {
        return;
    }
    println!("\nTime to first token by turn (cached prompt share):\n");
    let heads: Vec<String> = (1..=a.turns).map(|t| format!("turn {t}")).collect();
    println!(
        "| clients | mode | {} |\n|---:|---|{}",
        heads.join(" | "),
        "---:|".repeat(a.turns)
    );
    for (c, p, s) in rows {
        for (name, r) in [("plain", p), ("speculative", s)] {
            let cells: Vec<String> = r
                .turns
                .iter()
                .map(|(ttft, cached)| format!("{ttft:.2} s ({:.0}%)", cached * 100.0))
                .collect();
            println!("| {c} | {name} | {} |", cells.join(" | "));
        }
    }
}
