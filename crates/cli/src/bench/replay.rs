//! `pld bench replay`: recorded API traffic (`pld serve --record-requests DIR` writes
//! `DIR/requests.jsonl`) sent again, request by request, to two servers in this process, one
//! without speculation and one with it, or to another server (`--base-url`, e.g. llama-server).
//! Each recorded request is sent as the client sent it (an agent re-sends its whole history every
//! turn), streamed and greedy, with the model's name and the output cap replaced; its time to
//! first output, end-to-end time, prompt, cached and output tokens are measured from the stream.
//!
//! A conversation is a run of consecutive requests through one API from one API key. With
//! `--clients N`, N conversations are replayed at once (with one, each request goes to the plain
//! server and then to the speculative one, alternating; with more, all go to one, then all to
//! the other). The report gives each turn's time to
//! first output, decode time and cached prompt share (and whether the agent sent it or a script
//! continued its session: `"continued": true` in the recording), each conversation's total time,
//! its later turns' least cached share and longest time to first output against the first's, and
//! over everything the decode and end-to-end speedups and whether the two servers' outputs were
//! identical (they must be: greedy speculation changes no token).

use crate::spec::SpecArgs;
use clap::Args;
use drafting::SpecConfig;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[arg(long, default_value = crate::common::DEFAULT_MODEL)]
    pub model: String,
    #[command(flatten)]
    pub kv: crate::common::KvCacheArgs,
    /// A recorded `requests.jsonl` (repeatable).
    #[arg(long = "requests", required = true, value_name = "FILE")]
    pub requests: Vec<PathBuf>,
    /// Only requests through these APIs (responses, messages, chat.completions, completions).
    #[arg(long, value_delimiter = ',')]
    pub apis: Vec<String>,
    /// At most this many new tokens per request (default: as recorded, within the context).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Replay against this server (its base URL) instead of pld's own two.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The model name sent to `--base-url`.
    #[arg(long, default_value = "bench")]
    pub served_model: String,
    /// Conversations replayed at once.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub prefix_cache: crate::common::PrefixCacheArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// One recorded request.
#[derive(Clone, Debug)]
struct Recorded {
    api: String,
    tenant: u64,
    /// Written by a script that continued a recorded session (tools/agents/continue_session.py),
    /// not sent by the agent itself.
    continued: bool,
    body: Value,
}

/// What one replayed request measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
struct Sample {
    conversation: usize,
    turn: usize,
    api: String,
    ttft_s: f64,
    e2e_s: f64,
    prompt_tokens: u64,
    cached_tokens: u64,
    output_tokens: u64,
    continued: bool,
    /// The output: text and call arguments as they streamed.
    #[serde(skip)]
    output: String,
}

/// The requests of the files, grouped into conversations.
fn conversations(a: &ReplayArgs) -> anyhow::Result<Vec<Vec<Recorded>>> {
    let mut out: Vec<Vec<Recorded>> = Vec::new();
    for path in &a.requests {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: Value = serde_json::from_str(line).map_err(|e| {
                anyhow::anyhow!(
                    "{} line {}: not a recorded request: {e}",
                    path.display(),
                    i + 1
                )
            })?;
            let api = v["api"].as_str().unwrap_or_default().to_string();
            if !["responses", "messages", "chat.completions", "completions"].contains(&api.as_str())
            {
                anyhow::bail!("{} line {}: unknown api '{api}'", path.display(), i + 1);
            }
            if (!a.apis.is_empty() && !a.apis.contains(&api)) || !v["body"].is_object() {
                continue;
            }
            if v["body"]["previous_response_id"].is_string() {
                eprintln!(
                    "skipped {} line {}: chained to a response of the recording",
                    path.display(),
                    i + 1
                );
                continue;
            }
            let r = Recorded {
                api,
                tenant: v["tenant"].as_u64().unwrap_or(0),
                continued: v["continued"].as_bool().unwrap_or(false),
                body: v["body"].clone(),
            };
            match out.last_mut() {
                Some(c) if c[0].api == r.api && c[0].tenant == r.tenant => c.push(r),
                _ => out.push(vec![r]),
            }
        }
    }
    if out.is_empty() {
        anyhow::bail!("the recordings hold no request to replay");
    }
    Ok(out)
}

/// The body to send: streamed, greedy, to `model`, the output capped.
fn replay_body(r: &Recorded, model: &str, max_tokens: Option<usize>) -> Value {
    let mut b = r.body.clone();
    b["model"] = json!(model);
    b["stream"] = json!(true);
    b["temperature"] = json!(0);
    for k in ["top_p", "top_k", "seed", "n"] {
        if let Some(o) = b.as_object_mut() {
            o.remove(k);
        }
    }
    let cap = match r.api.as_str() {
        "responses" => "max_output_tokens",
        _ => "max_tokens",
    };
    if let Some(o) = b.as_object_mut() {
        if let Some(m) = o.remove("max_completion_tokens") {
            o.insert("max_tokens".into(), m);
        }
    }
    if let Some(m) = max_tokens {
        let recorded = b[cap].as_u64().map_or(m, |r| (r as usize).min(m));
        b[cap] = json!(recorded);
    }
    if r.api == "responses" {
        b["store"] = json!(false);
    }
    if r.api.ends_with("completions") {
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

/// Reads one streamed answer: the output and, from the usage it ends with, the token counts.
fn read_event(api: &str, v: &Value, s: &mut Sample) -> Option<String> {
    let delta = match api {
        "responses" => {
            if let Some(u) = v["response"]["usage"].as_object() {
                s.prompt_tokens = u["input_tokens"].as_u64().unwrap_or(0);
                s.cached_tokens = u["input_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0);
                s.output_tokens = u["output_tokens"].as_u64().unwrap_or(0);
            }
            match v["type"].as_str() {
                Some("response.output_text.delta" | "response.function_call_arguments.delta") => {
                    v["delta"].as_str()
                }
                _ => None,
            }
        }
        "messages" => {
            // The prompt's counts come with `message_delta` (pld) or only with `message_start`
            // (llama-server): whichever has them.
            let u = match v["type"].as_str() {
                Some("message_start") => &v["message"]["usage"],
                Some("message_delta") => &v["usage"],
                _ => &Value::Null,
            };
            if let Some(input) = u["input_tokens"].as_u64() {
                let cached = u["cache_read_input_tokens"].as_u64().unwrap_or(0);
                s.prompt_tokens = input + cached;
                s.cached_tokens = cached;
            }
            if let Some(n) = u["output_tokens"].as_u64() {
                s.output_tokens = n;
            }
            let d = &v["delta"];
            d["text"].as_str().or(d["partial_json"].as_str())
        }
        _ => {
            if let Some(u) = v["usage"].as_object() {
                s.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
                s.cached_tokens = u
                    .get("prompt_tokens_details")
                    .and_then(|d| d["cached_tokens"].as_u64())
                    .unwrap_or(0);
                s.output_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
            }
            let c = &v["choices"][0];
            c["delta"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .or(c["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        }
    };
    delta.filter(|d| !d.is_empty()).map(str::to_string)
}

/// Sends one request and reads its stream.
async fn send(
    client: &reqwest::Client,
    base: &str,
    r: &Recorded,
    body: &Value,
) -> anyhow::Result<Sample> {
    let path = match r.api.as_str() {
        "responses" => "/v1/responses",
        "messages" => "/v1/messages",
        "chat.completions" => "/v1/chat/completions",
        _ => "/v1/completions",
    };
    let t = Instant::now();
    let mut resp = client
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await?;
    if !resp.status().is_success() {
        let status = resp.status();
        anyhow::bail!(
            "{path} answered {status}: {}",
            resp.text().await.unwrap_or_default()
        );
    }
    let mut s = Sample {
        api: r.api.clone(),
        continued: r.continued,
        ..Default::default()
    };
    let mut buf = String::new();
    while let Some(chunk) = resp.chunk().await? {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data.trim()) else {
                continue;
            };
            if let Some(d) = read_event(&r.api, &v, &mut s) {
                if s.output.is_empty() {
                    s.ttft_s = t.elapsed().as_secs_f64();
                }
                s.output.push_str(&d);
            }
        }
    }
    s.e2e_s = t.elapsed().as_secs_f64();
    if s.output.is_empty() {
        s.ttft_s = s.e2e_s;
    }
    Ok(s)
}

/// Replays the conversations against `base`, `clients` at a time; the samples in order.
async fn replay(
    base: &str,
    convs: &[Vec<Recorded>],
    model: &str,
    a: &ReplayArgs,
) -> anyhow::Result<Vec<Sample>> {
    let client = http_client()?;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let convs = Arc::new(convs.to_vec());
    let mut tasks = Vec::new();
    for _ in 0..a.clients.max(1) {
        let (client, next, convs) = (client.clone(), next.clone(), convs.clone());
        let (base, model, cap) = (base.to_string(), model.to_string(), a.max_tokens);
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let c = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(conv) = convs.get(c) else {
                    return Ok::<_, anyhow::Error>(out);
                };
                for (turn, r) in conv.iter().enumerate() {
                    let mut s = send(&client, &base, r, &replay_body(r, &model, cap)).await?;
                    (s.conversation, s.turn) = (c, turn);
                    out.push(s);
                }
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    all.sort_by_key(|s| (s.conversation, s.turn));
    Ok(all)
}

/// One short request, answered before the replay starts: what a server does once when it meets
/// its first request (pld times its passes to price drafts; the weights are first read from the
/// page cache) is start-up, not the first turn's time to first output.
async fn warm_up(base: &str, model: &str) -> anyhow::Result<()> {
    let r = Recorded {
        api: "chat.completions".into(),
        tenant: 0,
        continued: false,
        body: json!({"messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 1}),
    };
    send(&http_client()?, base, &r, &replay_body(&r, model, Some(1))).await?;
    Ok(())
}

/// A fresh connection per request: a server that closes a connection after a streamed answer
/// (llama-server does) would otherwise fail the next request sent over the pooled one.
fn http_client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(3600))
        .pool_max_idle_per_host(0)
        .build()
}

/// One client: each request goes to the plain server, then the same request to the speculative
/// one, so that whatever else the machine does in the meantime falls on both alike (each server
/// keeps its own prefix cache, so each still sees the conversation as the agent sent it).
async fn replay_alternating(
    plain: &str,
    fast: &str,
    convs: &[Vec<Recorded>],
    a: &ReplayArgs,
) -> anyhow::Result<(Vec<Sample>, Vec<Sample>)> {
    let client = http_client()?;
    let (mut p, mut s) = (Vec::new(), Vec::new());
    for (c, conv) in convs.iter().enumerate() {
        for (turn, r) in conv.iter().enumerate() {
            let body = replay_body(r, "bench", a.max_tokens);
            for (base, out) in [(plain, &mut p), (fast, &mut s)] {
                let mut x = send(&client, base, r, &body).await?;
                (x.conversation, x.turn) = (c, turn);
                out.push(x);
            }
        }
    }
    Ok((p, s))
}

/// Totals over samples.
#[derive(Default, serde::Serialize)]
struct Totals {
    requests: usize,
    prompt_tokens: u64,
    cached_tokens: u64,
    output_tokens: u64,
    /// Seconds to the first output, summed.
    ttft_s: f64,
    /// Seconds after the first output (decoding), summed.
    decode_s: f64,
    e2e_s: f64,
    first_turn_ttft_s: f64,
    later_turns_ttft_s: f64,
}

fn totals(samples: &[Sample]) -> Totals {
    let mut t = Totals::default();
    let (mut first, mut later, mut n_first, mut n_later) = (0.0, 0.0, 0, 0);
    for s in samples {
        t.requests += 1;
        t.prompt_tokens += s.prompt_tokens;
        t.cached_tokens += s.cached_tokens;
        t.output_tokens += s.output_tokens;
        t.ttft_s += s.ttft_s;
        t.decode_s += s.e2e_s - s.ttft_s;
        t.e2e_s += s.e2e_s;
        if s.turn == 0 {
            (first, n_first) = (first + s.ttft_s, n_first + 1);
        } else {
            (later, n_later) = (later + s.ttft_s, n_later + 1);
        }
    }
    t.first_turn_ttft_s = first / f64::from(n_first.max(1));
    t.later_turns_ttft_s = later / f64::from(n_later.max(1));
    t
}

/// One conversation's figures: what an agent's user waits for over a session.
#[derive(serde::Serialize)]
struct ConversationTotals {
    conversation: usize,
    requests: usize,
    e2e_s: f64,
    /// The least share of a later request's prompt read from the cache (1 with no later turn).
    later_min_cached_share: f64,
    /// The longest time to first output of a later request, as a share of the first request's.
    later_max_ttft_share: f64,
}

fn conversation_totals(samples: &[Sample]) -> Vec<ConversationTotals> {
    let mut out: Vec<ConversationTotals> = Vec::new();
    let mut first_ttft = 0.0;
    for s in samples {
        if out.last().map(|c| c.conversation) != Some(s.conversation) {
            first_ttft = s.ttft_s;
            out.push(ConversationTotals {
                conversation: s.conversation,
                requests: 0,
                e2e_s: 0.0,
                later_min_cached_share: 1.0,
                later_max_ttft_share: 0.0,
            });
        }
        let c = out.last_mut().expect("pushed above");
        c.requests += 1;
        c.e2e_s += s.e2e_s;
        if s.turn > 0 {
            let share = s.cached_tokens as f64 / s.prompt_tokens.max(1) as f64;
            c.later_min_cached_share = c.later_min_cached_share.min(share);
            c.later_max_ttft_share = c.later_max_ttft_share.max(s.ttft_s / first_ttft.max(1e-9));
        }
    }
    out
}

pub fn run(a: ReplayArgs) -> anyhow::Result<()> {
    let convs = conversations(&a)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if let Some(base) = &a.base_url {
        let base = base.trim_end_matches('/');
        let samples = rt.block_on(async {
            warm_up(base, &a.served_model).await?;
            replay(base, &convs, &a.served_model, &a).await
        })?;
        return report(&a, None, &[("server", samples)]);
    }
    let threads = crate::common::init_threads(a.threads)?;
    let spec = a.spec.resolve()?;
    let lm = Arc::new(crate::common::load_model(&a.model, &a.kv)?);
    let ctx = lm.model.config.context_len;
    let budget = a.prefix_cache.budget();
    let modes = rt.block_on(async {
        let max_seqs = a.clients.max(1);
        // Agents send fields and tools pld cannot honour; the recording server ignored them too.
        let lenient = |mut c: server::ServerConfig| {
            c.lenient = true;
            c
        };
        let plain = lenient(super::serve::server_config(
            budget,
            ctx,
            max_seqs,
            SpecConfig::off(),
        ));
        let fast = lenient(super::serve::server_config(budget, ctx, max_seqs, spec));
        let plain = super::serve::start_server(server::app(lm.clone(), plain)?).await?;
        let fast = super::serve::start_server(server::app(lm.clone(), fast)?).await?;
        warm_up(&plain, "bench").await?;
        warm_up(&fast, "bench").await?;
        let (p, s) = if a.clients <= 1 {
            replay_alternating(&plain, &fast, &convs, &a).await?
        } else {
            let p = replay(&plain, &convs, "bench", &a).await?;
            (p, replay(&fast, &convs, "bench", &a).await?)
        };
        Ok::<_, anyhow::Error>(vec![("plain", p), ("speculative", s)])
    })?;
    report(&a, Some((lm.name.as_str(), threads)), &modes)
}

fn report(
    a: &ReplayArgs,
    model: Option<(&str, usize)>,
    modes: &[(&str, Vec<Sample>)],
) -> anyhow::Result<()> {
    let mismatches = match modes {
        [(_, p), (_, s)] => p
            .iter()
            .zip(s)
            .filter(|(p, s)| p.output != s.output)
            .count(),
        _ => 0,
    };
    let sums: Vec<(&str, Totals)> = modes.iter().map(|(m, s)| (*m, totals(s))).collect();
    if a.json {
        let v = json!({
            "model": model.map(|m| m.0), "threads": model.map(|m| m.1),
            "max_tokens": a.max_tokens, "clients": a.clients, "mismatches": mismatches,
            "modes": sums.iter().zip(modes).map(|((m, t), (_, s))| json!({"mode": m, "totals": t, "conversations": conversation_totals(s), "requests": s})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_report(a, model, modes, &sums, mismatches);
    }
    if mismatches > 0 {
        anyhow::bail!("{mismatches} request(s) differ between plain and speculative decoding");
    }
    Ok(())
}

fn print_report(
    a: &ReplayArgs,
    model: Option<(&str, usize)>,
    modes: &[(&str, Vec<Sample>)],
    sums: &[(&str, Totals)],
    mismatches: usize,
) {
    if let Some((name, threads)) = model {
        println!("model {name} ({threads} threads), {} client(s)", a.clients);
    }
    let heads: Vec<String> = modes
        .iter()
        .map(|(m, _)| format!("{m} TTFT s | {m} decode s"))
        .collect();
    println!(
        "| conv | turn | api | sent by | prompt | cached | out | {} |\n|---:|---:|---|---|---:|---:|---:|{}",
        heads.join(" | "),
        "---:|---:|".repeat(modes.len())
    );
    for (i, s) in modes[0].1.iter().enumerate() {
        let cells: Vec<String> = modes
            .iter()
            .map(|(_, m)| format!("{:.2} | {:.2}", m[i].ttft_s, m[i].e2e_s - m[i].ttft_s))
            .collect();
        println!(
            "| {} | {} | {} | {} | {} | {} ({:.1}%) | {} | {} |",
            s.conversation,
            s.turn + 1,
            s.api,
            if s.continued { "continued" } else { "agent" },
            s.prompt_tokens,
            s.cached_tokens,
            100.0 * s.cached_tokens as f64 / s.prompt_tokens.max(1) as f64,
            s.output_tokens,
            cells.join(" | ")
        );
    }
    for (m, samples) in modes {
        for c in conversation_totals(samples) {
            println!(
                "{m}, conversation {}: {} requests, end to end {:.1} s; later turns: at least {:.1}% of the prompt cached, TTFT at most {:.1}% of the first's",
                c.conversation,
                c.requests,
                c.e2e_s,
                100.0 * c.later_min_cached_share,
                100.0 * c.later_max_ttft_share
            );
        }
    }
    for (m, t) in sums {
        println!(
            "{m}: {} requests, {} prompt tokens ({:.0}% cached), {} output tokens, TTFT first turns {:.2} s, later turns {:.2} s, decode {:.1} tok/s, end to end {:.1} s",
            t.requests,
            t.prompt_tokens,
            100.0 * t.cached_tokens as f64 / t.prompt_tokens.max(1) as f64,
            t.output_tokens,
            t.first_turn_ttft_s,
            t.later_turns_ttft_s,
            t.output_tokens as f64 / t.decode_s.max(1e-9),
            t.e2e_s
        );
    }
    if let [(_, p), (_, s)] = sums {
        println!(
            "speculative / plain: decode {:.2}x, end to end {:.2}x, {mismatches} mismatches",
            p.decode_s / s.decode_s.max(1e-9),
            p.e2e_s / s.e2e_s.max(1e-9)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(events: &[Value]) -> Sample {
        let mut s = Sample::default();
        for e in events {
            read_event("messages", e, &mut s);
        }
        s
    }

    #[test]
    fn messages_usage_read_from_whichever_event_carries_it() {
        // pld: the start counts the whole prompt as new; the delta gives the cached split.
        let pld = read_all(&[
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 100, "output_tokens": 0, "cache_read_input_tokens": 0}}}),
            json!({"type": "message_delta", "usage": {"input_tokens": 20, "output_tokens": 7, "cache_read_input_tokens": 80}}),
        ]);
        // llama-server: the split at the start, only the output count in the delta.
        let llama = read_all(&[
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 20, "output_tokens": 0, "cache_read_input_tokens": 80}}}),
            json!({"type": "message_delta", "usage": {"output_tokens": 7}}),
        ]);
        for s in [pld, llama] {
            assert_eq!(
                (s.prompt_tokens, s.cached_tokens, s.output_tokens),
                (100, 80, 7)
            );
        }
    }
}
