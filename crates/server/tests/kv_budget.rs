//! The KV memory budget through the server (`--kv-cache-bytes`): a small budget and many long
//! concurrent requests. The caches never hold more than the budget (sampled from `/metrics`
//! during the run), sequences are preempted and resume, every request completes with the output
//! it gets on an idle server (greedy; streamed ones without a duplicate or a gap), resident memory
//! grows by no more than the budgets and a stated slack, and a request that could never fit gets
//! a 400 at once in its API's shape.

mod common;

use common::{client, config, metric_by, model, post, start, status_kb};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const MAX_TOKENS: usize = 120;
const REQUESTS: usize = 6;

/// Resident memory beyond the budgets that a budgeted server may take under this load: the
/// activations and logits of its passes and the compute threads' scratch.
const RESIDENT_SLACK: usize = 64 << 20;

/// A prompt the model continues at length (counting), different per request.
fn prompt(i: usize) -> String {
    let start = 100 * (i + 1);
    let numbers: Vec<String> = (start..start + 40).map(|n| n.to_string()).collect();
    format!("Counting from {start}: {},", numbers.join(", "))
}

fn body(i: usize, stream: bool) -> Value {
    json!({"prompt": prompt(i), "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream})
}

/// A text completion's text, whole or streamed (the `text` of every chunk, in order).
async fn complete(base: &str, i: usize, stream: bool) -> (String, Value) {
    if !stream {
        let (status, r) = post(base, "/v1/completions", body(i, false)).await;
        assert_eq!(status, 200, "{r}");
        return (r["choices"][0]["text"].as_str().unwrap().to_string(), r);
    }
    let r = client()
        .post(format!("{base}/v1/completions"))
        .json(&body(i, true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    let mut out = String::new();
    let mut finish = Value::Null;
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(c) = chunk["choices"].get(0) {
            out.push_str(c["text"].as_str().unwrap_or_default());
            if !c["finish_reason"].is_null() {
                finish = c["finish_reason"].clone();
            }
        }
    }
    (out, json!({"choices": [{"finish_reason": finish}]}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_budget_preempts_and_every_output_is_unchanged() {
    // The idle outputs: one request at a time, no budget to speak of.
    let idle = start(config()).await;
    let mut alone = Vec::new();
    for i in 0..REQUESTS {
        alone.push(complete(&idle, i, false).await.0);
    }
    // A budget of two sequences at their longest (prompt and 120 tokens) and a third's prompt
    // with a few positions more: the third is admitted and must give way as it grows.
    let lm = model();
    let shape = lm.model.kv_shape();
    let tokens = lm.tokenizer.encode_prompt(&prompt(0)).unwrap().len();
    let bytes = |positions| engine::kv_cache::KvCache::bytes_for(shape, positions);
    let budget = 2 * bytes(tokens + MAX_TOKENS) + bytes(tokens + 40);
    let mut c = config();
    c.kv_cache_bytes = Some(budget);
    let base = start(c).await;
    let m = |name: &'static str| {
        let base = base.clone();
        async move { metric_by(&client(), &base, name).await }
    };
    assert_eq!(m("pld_kv_cache_budget_bytes").await, budget as f64);

    // Never fits: refused at once, in each API's shape, naming the budget and the need.
    let huge = json!({"prompt": prompt(0), "max_tokens": 1500, "temperature": 0});
    let (status, e) = post(&base, "/v1/completions", huge).await;
    assert_eq!(status, 400, "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&budget.to_string()) && message.contains("KV cache"),
        "{e}"
    );
    assert_eq!(e["error"]["param"], "max_tokens", "{e}");
    assert_eq!(e["error"]["code"], "kv_cache_budget_exceeded", "{e}");
    let messages =
        json!({"max_tokens": 1500, "messages": [{"role": "user", "content": prompt(1)}]});
    let (status, e) = post(&base, "/v1/messages", messages).await;
    assert_eq!((status, e["type"].as_str()), (400, Some("error")), "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");

    // Sample what the caches hold while the load runs.
    let running = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (base, running) = (base.clone(), running.clone());
        tokio::spawn(async move {
            let (mut most, mut samples) = (0f64, 0);
            while running.load(Ordering::Relaxed) {
                let held = metric_by(&client(), &base, "pld_kv_cache_bytes").await;
                most = most.max(held);
                samples += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            (most, samples)
        })
    };
    // Resident memory from here on: the budgeted server's caches, prefix cache and passes.
    let before = status_kb("VmRSS");
    common::reset_peak_resident();
    let load: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let base = base.clone();
            tokio::spawn(async move { complete(&base, i, i % 2 == 1).await })
        })
        .collect();
    let mut outputs = Vec::new();
    for task in load {
        outputs.push(task.await.unwrap());
    }
    running.store(false, Ordering::Relaxed);
    let (most, samples) = sampler.await.unwrap();

    for (i, ((text, r), idle)) in outputs.iter().zip(&alone).enumerate() {
        assert_eq!(
            r["choices"][0]["finish_reason"], "length",
            "request {i}: {r}"
        );
        assert_eq!(text, idle, "request {i} (streamed: {}) changed", i % 2 == 1);
    }
    assert!(
        samples > 5 && most > 0.0,
        "{samples} samples, at most {most} bytes"
    );
    assert!(
        most <= budget as f64,
        "{most} bytes held, over the budget of {budget}"
    );
    // What the load added to resident memory stays within the KV budget, the prefix cache's
    // budget and a stated slack for the passes' activations and the threads' scratch.
    let peak = status_kb("VmHWM");
    if let (Some(before), Some(peak)) = (before, peak) {
        let grown = peak.saturating_sub(before) as usize * 1024;
        let bound = budget + common::PREFIX_CACHE_BYTES + RESIDENT_SLACK;
        assert!(
            grown <= bound,
            "resident memory grew by {grown} bytes under load, past the budgets and slack ({bound})"
        );
    } else {
        eprintln!(
            "a_small_budget_preempts: /proc/self/status does not tell resident memory; not checked"
        );
    }
    let preemptions = m("pld_num_preemptions_total").await;
    assert!(preemptions >= 1.0, "no sequence was preempted");
    assert_eq!(m("pld_num_requests_waiting").await, 0.0);
}
