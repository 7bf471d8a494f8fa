//! `pld bench serve`: a load benchmark of the HTTP server. Two servers run in this process on
//! loopback, one without speculation and one with it; at each concurrency level N clients send
//! grounded prompts (first turns of the workloads' rows, the categories taken in turn) to each in
//! turn, streamed, and the table reports requests/s, generated tokens/s, p50 and p95 latency, time
//! to first token, and the speculative/plain throughput ratio.
//!
//! A workload row with a `schema` (a JSON Schema) asks for its answer under it (OpenAI's
//! `response_format` of type `json_schema`, first turns only), and the table gives the share of
//! those answers that parse and validate (and how many stopped at `--max-tokens`). Each level
//! also reports the process's peak resident memory (both servers and the model are in this
//! process).
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
    /// Workload file(s) in Spec-Bench's JSONL format (repeatable; first turns are sent, under
    /// the row's `schema` where it has one).
    #[arg(long, required = true)]
    pub workload: Vec<PathBuf>,
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
    p50_latency: f64,
    p95_latency: f64,
    mean_ttft: f64,
    p50_ttft: f64,
    /// The answers asked under a schema, where there were any.
    schema: Option<SchemaAnswers>,
    /// The process's peak resident memory over the mode's runs of the level.
    peak_rss_bytes: u64,
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
    /// Whether the answer met the row's schema (rows with one).
    valid: Option<bool>,
    /// Whether the answer stopped at `max_tokens` (finish reason "length").
    cut: bool,
}

/// What became of the answers asked under a schema.
#[derive(Clone, Copy)]
struct SchemaAnswers {
    /// The share that parsed and met the schema.
    valid_share: f64,
    answers: usize,
    /// How many stopped at `max_tokens`.
    cut: usize,
}

/// A first turn to send, with the schema its answer must meet where the row has one.
#[derive(Clone)]
struct Prompt {
    text: String,
    schema: Option<Arc<Schema>>,
}

/// A row's schema, as sent and as compiled for checking answers.
struct Schema {
    json: Value,
    validator: jsonschema::Validator,
}

impl Schema {
    fn new(json: Value) -> anyhow::Result<Self> {
        let validator = jsonschema::validator_for(&json)
            .map_err(|e| anyhow::anyhow!("a workload row's schema does not compile: {e}"))?;
        Ok(Schema { json, validator })
    }

    /// Whether `answer` is JSON that the schema accepts.
    fn accepts(&self, answer: &str) -> bool {
        serde_json::from_str::<Value>(answer.trim()).is_ok_and(|v| self.validator.is_valid(&v))
    }
}

/// The value at quantile `q` of sorted values (NaN when there are none).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ => sorted[((n as f64 * q).ceil() as usize).clamp(1, n) - 1],
    }
}

/// Starts a new window for the process's peak resident memory (`peak_rss`), where Linux allows.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The process's peak resident memory since start or the last `reset_peak_rss`, in bytes (0
/// where `/proc` does not tell).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// What one run of a level measured: wall time and every request.
#[derive(Default)]
struct Samples {
    wall: f64,
    requests: Vec<RequestSample>,
    peak_rss_bytes: u64,
}

impl Samples {
    fn add(&mut self, other: Samples) {
        self.wall += other.wall;
        self.requests.extend(other.requests);
        self.peak_rss_bytes = self.peak_rss_bytes.max(other.peak_rss_bytes);
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
        let mut ttft: Vec<f64> = self.requests.iter().map(|x| x.ttft).collect();
        ttft.sort_by(|a, b| a.total_cmp(b));
        let checked: Vec<(bool, bool)> = (self.requests.iter())
            .filter_map(|r| Some((r.valid?, r.cut)))
            .collect();
        let valid = checked.iter().filter(|c| c.0).count();
        let cut = checked.iter().filter(|c| c.1).count();
        LevelResult {
            requests_per_s: lat.len() as f64 / wall,
            tokens_per_s: tokens as f64 / wall,
            mean_latency: mean(&mut lat.iter().copied()),
            p50_latency: quantile(&lat, 0.5),
            p95_latency: quantile(&lat, 0.95),
            mean_ttft: mean(&mut ttft.iter().copied()),
            p50_ttft: quantile(&ttft, 0.5),
            schema: (!checked.is_empty()).then(|| SchemaAnswers {
                valid_share: valid as f64 / checked.len() as f64,
                answers: checked.len(),
                cut,
            }),
            peak_rss_bytes: self.peak_rss_bytes,
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

/// The first turns of the workloads' rows (of `--categories`), the categories taken in turn
/// (each in file order, categories in the order they first appear), so that any number of
/// requests mixes them.
fn prompts(a: &ServeArgs) -> anyhow::Result<Vec<Prompt>> {
    let mut by_category: Vec<(String, Vec<Prompt>)> = Vec::new();
    for path in &a.workload {
        for r in super::results::read_workload(path)? {
            if !a.categories.is_empty() && !a.categories.contains(&r.category) {
                continue;
            }
            let schema = r.schema.map(Schema::new).transpose()?.map(Arc::new);
            let prompt = Prompt {
                text: r.turns[0].clone(),
                schema,
            };
            match by_category.iter_mut().find(|(c, _)| *c == r.category) {
                Some((_, list)) => list.push(prompt),
                None => by_category.push((r.category, vec![prompt])),
            }
        }
    }
    let longest = by_category.iter().map(|(_, l)| l.len()).max().unwrap_or(0);
    let out: Vec<Prompt> = (0..longest)
        .flat_map(|i| {
            by_category
                .iter()
                .filter_map(move |(_, l)| l.get(i).cloned())
        })
        .collect();
    if out.is_empty() {
        anyhow::bail!("no prompts of the categories asked in the workloads");
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
    schema: Option<&Schema>,
) -> anyhow::Result<(String, RequestSample)> {
    let mut body = json!({
        "model": "bench",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(s) = schema {
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": s.json}});
    }
    let t = Instant::now();
    let mut r = client.post(url).json(&body).send().await?;
    let status = r.status();
    if !status.is_success() {
        let text = r.text().await.unwrap_or_default();
        anyhow::bail!("request failed ({status}): {text}");
    }
    let (mut buf, mut text, mut ttft, mut usage) = (String::new(), String::new(), None, None);
    let mut cut = false;
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
            cut |= v["choices"][0]["finish_reason"] == "length";
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
        valid: schema.map(|s| s.accepts(&text)),
        cut,
    };
    Ok((text, sample))
}

/// `clients` clients send `n` conversations of `turns` turns (`n` requests when `turns` is 1).
async fn level(
    url: &str,
    prompts: &[Prompt],
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
                let prompt = &prompts[i % prompts.len()];
                let first = format!("[conversation {id}]\n{}", prompt.text);
                let mut messages = vec![json!({"role": "user", "content": first})];
                for turn in 0..turns.max(1) {
                    // Only the first turn asks for the row's output; follow-ups are free text.
                    let schema = prompt.schema.as_deref().filter(|_| turn == 0);
                    let (answer, sample) =
                        chat_request(&client, &url, &messages, max_tokens, turn, schema).await?;
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
        peak_rss_bytes: peak_rss(),
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
        let hello = [Prompt {
            text: "Say hello.".into(),
            schema: None,
        }];
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
                    reset_peak_rss();
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
            json!({"requests_per_s": r.requests_per_s, "tokens_per_s": r.tokens_per_s, "mean_latency_s": r.mean_latency, "p50_latency_s": r.p50_latency, "p95_latency_s": r.p95_latency, "mean_ttft_s": r.mean_ttft, "p50_ttft_s": r.p50_ttft, "schema_valid_share": r.schema.map(|v| v.valid_share), "schema_answers": r.schema.map_or(0, |v| v.answers), "schema_answers_cut": r.schema.map_or(0, |v| v.cut), "peak_rss_bytes": r.peak_rss_bytes, "turns": turns})
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
    println!("| clients | mode | req/s | gen tok/s | p50 / p95 latency s | mean / p50 TTFT s | schema-valid | peak RSS GiB | speedup |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for (c, p, s) in rows {
        for (name, r) in [("plain", p), ("speculative", s)] {
            let valid = r.schema.map_or("-".into(), |v| {
                format!(
                    "{:.0}% of {} ({} cut)",
                    v.valid_share * 100.0,
                    v.answers,
                    v.cut
                )
            });
            let speedup = match name {
                "plain" => String::new(),
                _ => format!("{:.2}x", s.tokens_per_s / p.tokens_per_s.max(1e-9)),
            };
            println!(
                "| {c} | {name} | {:.2} | {:.1} | {:.2} / {:.2} | {:.2} / {:.2} | {valid} | {:.2} | {speedup} |",
                r.requests_per_s,
                r.tokens_per_s,
                r.p50_latency,
                r.p95_latency,
                r.mean_ttft,
                r.p50_ttft,
                r.peak_rss_bytes as f64 / (1u64 << 30) as f64,
            );
        }
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
