//! The server over real HTTP on loopback with smollm2-135m: completions in both shapes, streamed and
//! not, stop strings, seeds, every error case, the API key, cancellation on disconnect, batching
//! that does not change results, and the official `openai` Python client.

#[path = "../common/mod.rs"]
mod common;
mod errors;
mod load;
mod openai;
mod prefix_cache;

use common::*;
use serde_json::{json, Value};

fn chat(content: &str, max_tokens: usize) -> Value {
    json!({
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

fn assert_error(status: u16, body: &Value, want: u16) {
    assert_eq!(status, want, "{body}");
    let e = &body["error"];
    assert!(e["message"].is_string(), "error shape: {body}");
    for key in ["type", "param", "code"] {
        assert!(e.get(key).is_some(), "error.{key} missing: {body}");
    }
}

/// The server at `base` still answers a chat request, after whatever was sent it before.
async fn still_serving(base: &str) {
    let (s, _) = post(base, "/v1/chat/completions", chat("hi", 2)).await;
    assert_eq!(s, 200);
}

/// The data lines of an SSE response.
async fn sse(base: &str, path: &str, body: Value) -> Vec<String> {
    sse_by(&client(), base, path, body).await
}

async fn sse_by(c: &reqwest::Client, base: &str, path: &str, body: Value) -> Vec<String> {
    let r = c
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect()
}

/// A document to ask about: long enough for several cache blocks.
fn document() -> String {
    (0..40)
        .map(|i| format!("def f{i}(x):\n    return x * {i} + {}\n", i % 7))
        .collect()
}

/// How many prompt tokens came from the prefix cache, as the usage says.
fn cached_tokens(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {v}"))
}

fn answer(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no answer in {v}"))
        .to_string()
}

async fn gauge(base: &str, name: &str) -> u64 {
    gauge_by(&client(), base, name).await
}

async fn gauge_by(c: &reqwest::Client, base: &str, name: &str) -> u64 {
    metric_by(c, base, name).await as u64
}
