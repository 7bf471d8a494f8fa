//! `pld bench infill`: an editing session replayed as the completion plugins send it
//! (`editing`: held-out code typed line by line, a `/infill` request at the start of each line and
//! after each word, one at a time), against two pld servers in this process on loopback, one
//! without speculation and one with it, or against any server that speaks llama-server's
//! `/infill` (`--base-url`, e.g. llama-server itself, with the same requests).
//!
//! With pld's two servers each request goes to both, the order alternating from one request to
//! the next, so that whatever else the machine does falls on both alike; each server keeps its
//! own prefix cache and sees the session as the plugin sent it. Before the session each server
//! answers one short completion (what a server does once is not the first request's time), then
//! the ring update (the chunks alone, `n_predict: 0`), as llama.vim sends it.
//!
//! Each request's latency is measured at the client. From the answer's `timings/prompt_n`
//! (prefilled), `timings/predicted_n` and `tokens_cached` (the prompt and the output, llama-server's
//! `n_past`): the prompt is `tokens_cached` less the predicted tokens, and the cached prompt
//! tokens what of it was not prefilled. From pld's `/metrics`, read before and after each request:
//! output tokens per decoding pass (1 + accepted drafted tokens per verification step) and the
//! drafted and accepted tokens by draft source. The report: every request, and per server the
//! median, p95 and total latency; between pld's two servers the speedup and the completions that
//! differ (greedy speculation changes no token; under `t_max_predict_ms` a completion may end at an
//! earlier newline, so one must be a prefix of the other; any other difference fails the command).

use super::editing::{ring_update, Session, SessionArgs};
use crate::spec::SpecArgs;
use clap::Args;
use drafting::SpecConfig;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct InfillArgs {
    #[arg(long, default_value = crate::common::DEFAULT_MODEL)]
    pub model: String,
    #[command(flatten)]
    pub kv: crate::common::KvCacheArgs,
    #[command(flatten)]
    pub session: SessionArgs,
    /// Drive this server's `/infill` (its base URL, e.g. llama-server's) instead of pld's own two.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The model name sent as `model` (none by default, as llama.vim sends none).
    #[arg(long, value_name = "NAME")]
    pub served_model: Option<String>,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub prefix_cache: crate::common::PrefixCacheArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// pld's speculation counters, as `/metrics` gives them.
#[derive(Clone, Debug, Default)]
struct Counters {
    steps: u64,
    accepted: u64,
    drafted_by_source: BTreeMap<String, u64>,
    accepted_by_source: BTreeMap<String, u64>,
}

impl Counters {
    /// The counters in a Prometheus text; `None` when it has none of pld's.
    fn parse(text: &str) -> Option<Counters> {
        let mut c = Counters::default();
        let mut found = false;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((key, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            let v = v as u64;
            let (name, source) = match key.split_once("{source=\"") {
                Some((n, rest)) => (n, rest.strip_suffix("\"}")),
                None => (key, None),
            };
            match (name, source) {
                ("pld_spec_decode_num_verification_steps_total", None) => {
                    (c.steps, found) = (v, true)
                }
                ("pld_spec_decode_num_accepted_tokens_total", None) => c.accepted = v,
                ("pld_spec_decode_draft_tokens_by_source_total", Some(s)) => {
                    c.drafted_by_source.insert(s.to_string(), v);
                }
                ("pld_spec_decode_accepted_tokens_by_source_total", Some(s)) => {
                    c.accepted_by_source.insert(s.to_string(), v);
                }
                _ => {}
            }
        }
        found.then_some(c)
    }

    /// What was counted since `earlier`.
    fn since(&self, earlier: &Counters) -> Counters {
        let diff = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            now.iter()
                .map(|(k, v)| (k.clone(), v.saturating_sub(*then.get(k).unwrap_or(&0))))
                .collect()
        };
        Counters {
            steps: self.steps.saturating_sub(earlier.steps),
            accepted: self.accepted.saturating_sub(earlier.accepted),
            drafted_by_source: diff(&self.drafted_by_source, &earlier.drafted_by_source),
            accepted_by_source: diff(&self.accepted_by_source, &earlier.accepted_by_source),
        }
    }

    fn add(&mut self, o: &Counters) {
        self.steps += o.steps;
        self.accepted += o.accepted;
        for (mine, theirs) in [
            (&mut self.drafted_by_source, &o.drafted_by_source),
            (&mut self.accepted_by_source, &o.accepted_by_source),
        ] {
            for (k, v) in theirs {
                *mine.entry(k.clone()).or_default() += v;
            }
        }
    }

    /// Output tokens per decoding pass: each verification step emits its accepted drafted
    /// tokens and one of the model's own.
    fn tokens_per_pass(&self) -> Option<f64> {
        (self.steps > 0).then(|| (self.steps + self.accepted) as f64 / self.steps as f64)
    }
}

/// What one request measured.
#[derive(Clone, Debug, Default, Serialize)]
struct Sample {
    line: usize,
    col: usize,
    seconds: f64,
    /// The whole prompt: `tokens_cached` less the predicted tokens.
    prompt_tokens: u64,
    /// Prompt tokens computed (`timings/prompt_n`).
    prefilled_tokens: u64,
    /// Prompt tokens read from the cache: the prompt less the prefilled ones.
    cached_tokens: u64,
    /// `timings/predicted_n`.
    predicted_tokens: u64,
    truncated: bool,
    /// Output tokens per decoding pass (pld's `/metrics`), when the server counts them and the
    /// request decoded.
    tokens_per_pass: Option<f64>,
    content: String,
    /// Whether the completion's first line is what is left to type of the held-out line (what
    /// the user would accept); `None` at a line's end, where nothing is left.
    completes_line: Option<bool>,
    #[serde(skip)]
    counters: Option<Counters>,
}

/// Whether `content` writes `rest` as its first line (trailing whitespace aside); `None` when
/// nothing is left to write.
fn completes_line(content: &str, rest: &str) -> Option<bool> {
    let rest = rest.trim_end();
    (!rest.is_empty()).then(|| content.split('\n').next().unwrap_or("").trim_end() == rest)
}

/// A fresh connection per request (llama-server may close one after answering).
fn http_client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(3600))
        .pool_max_idle_per_host(0)
        .build()
}

async fn post(client: &reqwest::Client, base: &str, body: &Value) -> anyhow::Result<Value> {
    let r = client
        .post(format!("{base}/infill"))
        .json(body)
        .send()
        .await?;
    let status = r.status();
    let text = r.text().await?;
    if !status.is_success() {
        anyhow::bail!("{base}/infill answered {status}: {text}");
    }
    serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{base}/infill answered with something not JSON: {e}"))
}

/// The server's speculation counters, `None` without pld's `/metrics`.
async fn counters(client: &reqwest::Client, base: &str) -> Option<Counters> {
    let r = client.get(format!("{base}/metrics")).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    Counters::parse(&r.text().await.ok()?)
}

/// Sends one request and reads what it measured.
async fn measure(
    client: &reqwest::Client,
    base: &str,
    r: &super::editing::Request,
) -> anyhow::Result<Sample> {
    let before = counters(client, base).await;
    let t = Instant::now();
    let v = post(client, base, &r.body).await?;
    let seconds = t.elapsed().as_secs_f64();
    let after = counters(client, base).await;
    let counters = before.zip(after).map(|(b, a)| a.since(&b));
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let (prefilled, predicted) = (n("timings/prompt_n"), n("timings/predicted_n"));
    let prompt = n("tokens_cached").saturating_sub(predicted);
    let content = v["content"].as_str().unwrap_or_default().to_string();
    Ok(Sample {
        completes_line: completes_line(&content, &r.rest),
        line: r.line,
        col: r.col,
        seconds,
        prompt_tokens: prompt,
        prefilled_tokens: prefilled,
        cached_tokens: prompt.saturating_sub(prefilled),
        predicted_tokens: predicted,
        truncated: v["truncated"].as_bool().unwrap_or(false),
        tokens_per_pass: counters.as_ref().and_then(Counters::tokens_per_pass),
        content,
        counters,
    })
}

/// One short completion, then the ring update: before the session, as a plugin's server sees
/// them.
async fn prepare(client: &reqwest::Client, base: &str, s: &Session) -> anyhow::Result<()> {
    let mut warm = ring_update(&[]);
    warm["input_prefix"] = json!("def warm_up():\n");
    warm["n_predict"] = json!(4);
    if let Some(m) = s.requests.first().and_then(|r| r.body.get("model")) {
        warm["model"] = m.clone();
    }
    post(client, base, &warm).await?;
    if !s.extra.is_empty() {
        let mut ring = ring_update(&s.extra);
        if let Some(m) = warm.get("model") {
            ring["model"] = m.clone();
        }
        post(client, base, &ring).await?;
    }
    Ok(())
}

/// Replays the session against the servers at `bases` (named `names` in the log), each request
/// to each in turn, the order alternating from one request to the next; their samples, in
/// `bases`' order.
async fn replay(bases: &[String], names: &[&str], s: &Session) -> anyhow::Result<Vec<Vec<Sample>>> {
    let client = http_client()?;
    for b in bases {
        prepare(&client, b, s).await?;
    }
    let mut out = vec![Vec::new(); bases.len()];
    for (i, r) in s.requests.iter().enumerate() {
        let mut order: Vec<usize> = (0..bases.len()).collect();
        if i % 2 == 1 {
            order.reverse();
        }
        for k in order {
            let x = measure(&client, &bases[k], r).await?;
            eprintln!(
                "{:>11} line {:4} col {:3}: {:8.1} ms, prefilled {}, wrote {}",
                names[k],
                x.line,
                x.col,
                x.seconds * 1e3,
                x.prefilled_tokens,
                x.predicted_tokens
            );
            out[k].push(x);
        }
    }
    Ok(out)
}

/// One server's figures over the session.
#[derive(Debug, Default, Serialize)]
struct Summary {
    requests: usize,
    median_s: f64,
    p95_s: f64,
    total_s: f64,
    prompt_tokens: u64,
    prefilled_tokens: u64,
    cached_tokens: u64,
    predicted_tokens: u64,
    /// Requests with something left to type on their line, and those whose completion's first
    /// line was exactly that.
    lines_open: usize,
    lines_completed: usize,
    tokens_per_pass: Option<f64>,
    drafted_by_source: BTreeMap<String, u64>,
    accepted_by_source: BTreeMap<String, u64>,
}

/// The median (the mean of the middle two of an even count) and the p95 (the sorted value at
/// round(0.95 (n - 1)), ties to even), as replay.py takes them.
fn median_p95(samples: &[Sample]) -> (f64, f64) {
    let mut s: Vec<f64> = samples.iter().map(|x| x.seconds).collect();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    let at = (0.95 * (n - 1) as f64).round_ties_even() as usize;
    (median, s[at.min(n - 1)])
}

fn summary(samples: &[Sample]) -> Summary {
    let (median_s, p95_s) = median_p95(samples);
    let mut c: Option<Counters> = None;
    for x in samples {
        if let Some(d) = &x.counters {
            c.get_or_insert_with(Counters::default).add(d);
        }
    }
    let sum = |f: fn(&Sample) -> u64| -> u64 { samples.iter().map(f).sum() };
    Summary {
        requests: samples.len(),
        median_s,
        p95_s,
        total_s: samples.iter().map(|x| x.seconds).sum(),
        prompt_tokens: sum(|x| x.prompt_tokens),
        prefilled_tokens: sum(|x| x.prefilled_tokens),
        cached_tokens: sum(|x| x.cached_tokens),
        predicted_tokens: sum(|x| x.predicted_tokens),
        lines_open: samples
            .iter()
            .filter(|x| x.completes_line.is_some())
            .count(),
        lines_completed: samples
            .iter()
            .filter(|x| x.completes_line == Some(true))
            .count(),
        tokens_per_pass: c.as_ref().and_then(Counters::tokens_per_pass),
        drafted_by_source: c
            .as_ref()
            .map(|c| c.drafted_by_source.clone())
            .unwrap_or_default(),
        accepted_by_source: c.map(|c| c.accepted_by_source).unwrap_or_default(),
    }
}

/// The requests whose completions differ between two servers, under greedy decoding: exactly,
/// or, with `t_max_predict_ms` on (which may end either at an earlier newline), where neither is
/// a prefix of the other.
fn mismatches(a: &[Sample], b: &[Sample], timed: bool) -> Vec<(usize, usize)> {
    a.iter()
        .zip(b)
        .filter(|(x, y)| {
            let agree = if timed {
                x.content.starts_with(&y.content) || y.content.starts_with(&x.content)
            } else {
                x.content == y.content
            };
            !agree
        })
        .map(|(x, _)| (x.line, x.col))
        .collect()
}

/// What the report says about the machine and the model served.
struct Setting {
    machine: String,
    kernels: String,
    /// pld's own servers: the model's name, threads and KV cache number type.
    model: Option<(String, usize, String)>,
    target: String,
    /// Chunks in the ring.
    chunks: usize,
}

pub fn run(a: InfillArgs) -> anyhow::Result<()> {
    let session = Session::read(&a.session, a.served_model.as_deref())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut setting = Setting {
        machine: crate::common::machine_description(),
        kernels: format!("{:?}", engine::kernels::isa()),
        model: None,
        target: String::new(),
        chunks: session.extra.len(),
    };
    if let Some(base) = &a.base_url {
        let base = base.trim_end_matches('/').to_string();
        let samples = rt.block_on(replay(std::slice::from_ref(&base), &["server"], &session))?;
        setting.target = base;
        let modes = vec![("server", samples.into_iter().next().unwrap_or_default())];
        return report(&a, &setting, &modes);
    }
    let threads = crate::common::init_threads(a.threads)?;
    let spec = a.spec.resolve()?;
    let lm = Arc::new(crate::common::load_model(&a.model, &a.kv)?);
    if lm.fim.is_none() {
        anyhow::bail!(
            "the model {} has no fill-in-the-middle tokens, so it cannot answer /infill; use a \
             code model that has them, such as qwen-coder-1.5b",
            lm.name
        );
    }
    let ctx = lm.model.config.context_len;
    let budget = a.prefix_cache.budget();
    let modes = rt.block_on(async {
        let mut bases = Vec::new();
        for s in [SpecConfig::off(), spec] {
            let config = super::serve::server_config(budget, ctx, 1, s);
            bases.push(super::serve::start_server(server::app(lm.clone(), config)?).await?);
        }
        replay(&bases, &["plain", "speculative"], &session).await
    })?;
    setting.model = Some((
        lm.name.clone(),
        threads,
        lm.model.kv_shape().dtype.name().to_string(),
    ));
    setting.target = "pld, in this process".into();
    let modes: Vec<(&str, Vec<Sample>)> = ["plain", "speculative"].into_iter().zip(modes).collect();
    report(&a, &setting, &modes)
}

fn report(a: &InfillArgs, setting: &Setting, modes: &[(&str, Vec<Sample>)]) -> anyhow::Result<()> {
    let s = &a.session;
    let greedy = s.temperature == 0.0;
    let differ = match modes {
        [(_, p), (_, q)] if greedy => Some(mismatches(p, q, s.t_max_predict_ms > 0)),
        _ => None,
    };
    let sums: Vec<(&str, Summary)> = modes.iter().map(|(m, x)| (*m, summary(x))).collect();
    let speedup = match &sums[..] {
        [(_, p), (_, q)] => Some(json!({
            "total": p.total_s / q.total_s.max(1e-9),
            "median": p.median_s / q.median_s.max(1e-9),
        })),
        _ => None,
    };
    if a.json {
        let (model, threads, kv) = match &setting.model {
            Some((m, t, kv)) => (json!(m), json!(t), json!(kv)),
            None => (json!(a.served_model), Value::Null, Value::Null),
        };
        let context: Vec<String> = s.context.iter().map(|p| p.display().to_string()).collect();
        let v = json!({
            "machine": setting.machine, "kernels": setting.kernels, "target": setting.target,
            "model": model, "threads": threads, "kv_cache_dtype": kv,
            "session": {
                "file": s.file.display().to_string(), "start": s.start, "lines": s.lines,
                "context": context, "chunks": setting.chunks, "n_prefix": s.n_prefix, "n_suffix": s.n_suffix,
                "n_predict": s.n_predict, "ring_chunks": s.ring_chunks,
                "chunk_lines": s.chunk_lines, "t_max_predict_ms": s.t_max_predict_ms,
                "temperature": s.temperature, "stops": format!("{:?}", s.stops),
            },
            "modes": sums.iter().zip(modes).map(|((m, t), (_, x))| json!({"mode": m, "summary": t, "requests": x})).collect::<Vec<_>>(),
            "speedup": speedup,
            "mismatches": differ.as_ref().map(Vec::len),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_report(a, setting, modes, &sums, differ.as_deref());
    }
    match differ {
        Some(d) if !d.is_empty() => anyhow::bail!(
            "{} completion(s) differ between plain and speculative decoding (line, column): {d:?}",
            d.len()
        ),
        _ => Ok(()),
    }
}

fn print_report(
    a: &InfillArgs,
    setting: &Setting,
    modes: &[(&str, Vec<Sample>)],
    sums: &[(&str, Summary)],
    differ: Option<&[(usize, usize)]>,
) {
    let s = &a.session;
    println!("machine: {}", setting.machine);
    match &setting.model {
        Some((m, t, kv)) => println!(
            "model {m} ({t} threads, kernels {}, KV cache {kv}), {}",
            setting.kernels, setting.target
        ),
        None => println!("server {}", setting.target),
    }
    println!(
        "session: {} lines {}..{} typed, {} requests, {} chunk(s) of {} lines of extra context, n_prefix {}, n_suffix {}, n_predict {}, t_max_predict_ms {}, temperature {}",
        s.file.display(),
        s.start,
        s.start + s.lines,
        modes[0].1.len(),
        setting.chunks,
        s.chunk_lines,
        s.n_prefix,
        s.n_suffix,
        s.n_predict,
        s.t_max_predict_ms,
        s.temperature
    );
    let heads: Vec<String> = modes
        .iter()
        .map(|(m, _)| format!("{m} s | {m} cached | {m} out | {m} tok/pass"))
        .collect();
    println!(
        "\n| line | col | prompt | {} |\n|---:|---:|---:|{}",
        heads.join(" | "),
        "---:|---:|---:|---:|".repeat(modes.len())
    );
    for (i, x) in modes[0].1.iter().enumerate() {
        let cells: Vec<String> = modes
            .iter()
            .map(|(_, m)| {
                let y = &m[i];
                let tpp = y.tokens_per_pass.map_or("-".into(), |t| format!("{t:.2}"));
                format!(
                    "{:.3} | {} | {} | {tpp}",
                    y.seconds, y.cached_tokens, y.predicted_tokens
                )
            })
            .collect();
        println!(
            "| {} | {} | {} | {} |",
            x.line,
            x.col,
            x.prompt_tokens,
            cells.join(" | ")
        );
    }
    println!();
    for (m, t) in sums {
        let tpp = t
            .tokens_per_pass
            .map_or("no /metrics".into(), |v| format!("{v:.2} tokens per pass"));
        let by_source: Vec<String> = t
            .drafted_by_source
            .iter()
            .filter(|(_, &d)| d > 0)
            .map(|(k, d)| format!("{k} {}/{d}", t.accepted_by_source.get(k).unwrap_or(&0)))
            .collect();
        let drafts = if by_source.is_empty() {
            String::new()
        } else {
            format!(" (accepted/drafted by source: {})", by_source.join(", "))
        };
        println!(
            "{m}: {} requests, median {:.3} s, p95 {:.3} s, total {:.2} s; prompt {} tokens ({} cached, {} prefilled), {} predicted, {tpp}{drafts}; the held-out line written in {} of {}",
            t.requests, t.median_s, t.p95_s, t.total_s, t.prompt_tokens, t.cached_tokens,
            t.prefilled_tokens, t.predicted_tokens, t.lines_completed, t.lines_open
        );
    }
    if let [(_, p), (_, q)] = sums {
        let differ = differ.map_or("not compared (temperature above 0)".into(), |d| {
            format!("{} mismatches", d.len())
        });
        println!(
            "speculative / plain: total {:.2}x faster, median {:.2}x; {differ}",
            p.total_s / q.total_s.max(1e-9),
            p.median_s / q.median_s.max(1e-9)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_read_from_prometheus_text() {
        let text = "# HELP x\npld_spec_decode_num_verification_steps_total 10\n\
                    pld_spec_decode_num_accepted_tokens_total 15\n\
                    pld_spec_decode_draft_tokens_by_source_total{source=\"ngram\"} 30\n\
                    pld_spec_decode_accepted_tokens_by_source_total{source=\"ngram\"} 15\n";
        let c = Counters::parse(text).unwrap();
        assert_eq!((c.steps, c.accepted), (10, 15));
        assert_eq!(c.tokens_per_pass(), Some(2.5));
        let zero = Counters::parse(&text.replace(" 10\n", " 4\n").replace(" 15\n", " 3\n"))
            .unwrap()
            .since(&c);
        assert_eq!((zero.steps, zero.accepted), (0, 0));
        assert_eq!(zero.tokens_per_pass(), None);
        assert!(Counters::parse("llamacpp:tokens_predicted_total 5\n").is_none());
    }

    fn sample(seconds: f64, content: &str) -> Sample {
        Sample {
            seconds,
            content: content.into(),
            ..Default::default()
        }
    }

    #[test]
    fn median_and_p95_as_replay_py_takes_them() {
        let s: Vec<Sample> = [4.0, 1.0, 3.0, 2.0].map(|x| sample(x, "")).to_vec();
        // statistics.median: 2.5; p95: sorted[round(2.85)] = sorted[3].
        assert_eq!(median_p95(&s), (2.5, 4.0));
        let s: Vec<Sample> = (1..=21).map(|x| sample(x as f64, "")).collect();
        // round(19.0) = 19: the 20th value.
        assert_eq!(median_p95(&s), (11.0, 20.0));
    }

    #[test]
    fn a_completion_that_writes_the_rest_of_the_line_completes_it() {
        assert_eq!(completes_line("b)\n    c", "b)"), Some(true));
        assert_eq!(completes_line("b)  ", "b)"), Some(true));
        assert_eq!(completes_line("b", "b)"), Some(false));
        assert_eq!(completes_line("b) + 1", "b)"), Some(false));
        assert_eq!(completes_line("x", "  "), None);
    }

    #[test]
    fn a_completion_cut_short_by_the_time_limit_is_no_mismatch() {
        let a = [sample(1.0, "x = 1\ny = 2\n"), sample(1.0, "a")];
        let b = [sample(1.0, "x = 1\n"), sample(1.0, "b")];
        assert_eq!(mismatches(&a, &b, true).len(), 1);
        assert_eq!(mismatches(&a, &b, false).len(), 2);
    }
}
