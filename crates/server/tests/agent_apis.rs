//! The APIs coding agents speak, over real HTTP on loopback: OpenAI's Responses API and
//! Anthropic's Messages API through their official Python clients (every streamed event checked
//! against the SDK's own types), stored responses kept apart per API key and within their bounds,
//! vLLM's `/tokenize` and `/detokenize`, several served model names, and the request record.

mod common;

use common::*;
use engine::LoadedModel;
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};

fn qwen() -> Arc<LoadedModel> {
    static M: OnceLock<Arc<LoadedModel>> = OnceLock::new();
    M.get_or_init(|| {
        let path = models::resolve_model("qwen-coder-0.5b").expect("model available");
        Arc::new(LoadedModel::load(&path).expect("model loads"))
    })
    .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_api_with_the_official_openai_client() {
    let base = start(config()).await;
    run_client(
        "responses_client.py",
        vec![base, "smollm2-135m".into(), "text".into()],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_api_with_the_official_anthropic_client() {
    let mut c = config();
    c.api_keys = vec!["k-anthropic".into()];
    let base = start(c).await;
    let args = vec![
        base,
        "smollm2-135m".into(),
        "text".into(),
        "k-anthropic".into(),
    ];
    run_client("messages_client.py", args).await;
}

/// Claude Code's billing line, which changes with every session (and on some versions with every
/// request), costs no cache: requests differing only in it read at least 95% of their prompts
/// from the prefix cache, and only because the line is dropped (`--keep-volatile-lines` keeps it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_billing_line_does_not_cost_the_cache() {
    for (keep, mode) in [(false, "dropped"), (true, "kept")] {
        let mut c = config();
        c.keep_volatile_lines = keep;
        let base = start(c).await;
        run_client(
            "billing_client.py",
            vec![base, "smollm2-135m".into(), mode.into()],
        )
        .await;
    }
}

/// Function calls on a model whose template takes tools: a forced call comes back as a
/// `function_call` item / `tool_use` block, goes back in as its output / `tool_result`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_round_trips_in_both_agent_apis() {
    let mut c = config();
    c.model_names = vec!["qwen-coder-0.5b".into()];
    let base = start_with(qwen(), c).await;
    let responses = vec![base.clone(), "qwen-coder-0.5b".into(), "tools".into()];
    run_client("responses_client.py", responses).await;
    let messages = vec![
        base,
        "qwen-coder-0.5b".into(),
        "tools".into(),
        "none".into(),
    ];
    run_client("messages_client.py", messages).await;
}

async fn get_by(c: &reqwest::Client, url: String) -> (u16, Value) {
    let r = c.get(url).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// A stored response is found, continued and deleted only with the API key that made it; for
/// another key it does not exist (404 in OpenAI's shape, the same as an unknown id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_never_cross_api_keys() {
    let mut c = config();
    c.api_keys = vec!["alice".into(), "bob".into()];
    let base = start(c).await;
    let (alice, bob) = (client_of("alice"), client_of("bob"));
    let body = json!({"input": "Say hi.", "max_output_tokens": 4});
    let (status, r) = post_by(&alice, &base, "/v1/responses", body).await;
    assert_eq!(status, 200, "{r}");
    let id = r["id"].as_str().unwrap().to_string();
    let url = format!("{base}/v1/responses/{id}");
    assert_eq!(get_by(&alice, url.clone()).await.0, 200);
    let (status, e) = get_by(&bob, url.clone()).await;
    assert_eq!(status, 404, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains(&id), "{e}");
    let unknown = get_by(&bob, format!("{base}/v1/responses/resp_unknown")).await;
    assert_eq!(unknown.0, 404);
    assert_eq!(e["error"]["type"], unknown.1["error"]["type"]);
    let chained = json!({"input": "Again.", "previous_response_id": id, "max_output_tokens": 2});
    let (status, e) = post_by(&bob, &base, "/v1/responses", chained.clone()).await;
    assert_eq!(
        (status, e["error"]["param"].clone()),
        (404, json!("previous_response_id"))
    );
    let r = bob.delete(url.clone()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(
        post_by(&alice, &base, "/v1/responses", chained).await.0,
        200
    );
    let r = alice.delete(url.clone()).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(get_by(&alice, url).await.0, 404);
}

/// Under a soak of stored responses the store keeps at most its count and its bytes, the most
/// recent ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_stay_within_their_bounds() {
    let mut c = config();
    c.max_stored_responses = 4;
    let base = start(c).await;
    let http = client();
    let mut ids = Vec::new();
    for i in 0..12 {
        let body =
            json!({"input": format!("Number {i}?"), "max_output_tokens": 2, "temperature": 0});
        let (status, r) = post_by(&http, &base, "/v1/responses", body).await;
        assert_eq!(status, 200, "{r}");
        ids.push(r["id"].as_str().unwrap().to_string());
    }
    let kept: Vec<bool> = futures_util::future::join_all(
        ids.iter()
            .map(|id| get_by(&http, format!("{base}/v1/responses/{id}"))),
    )
    .await
    .into_iter()
    .map(|(s, _)| s == 200)
    .collect();
    assert_eq!(kept, [vec![false; 8], vec![true; 4]].concat());

    // Bounded by bytes: each response is well over 300 bytes, so 1,000 hold at most two.
    let mut c = config();
    c.stored_responses_bytes = 1000;
    let base = start(c).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        let body = json!({"input": format!("Number {i}?"), "max_output_tokens": 2});
        ids.push(post_by(&http, &base, "/v1/responses", body).await.1["id"].clone());
    }
    let mut found = 0;
    for id in &ids {
        let url = format!("{base}/v1/responses/{}", id.as_str().unwrap());
        found += usize::from(get_by(&http, url).await.0 == 200);
    }
    assert!((1..=2).contains(&found), "{found} of 6 kept in 1,000 bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_detokenize_and_several_model_names() {
    let mut c = config();
    c.model_names = vec!["smollm2-135m".into(), "small".into()];
    let base = start(c).await;
    let (status, t) = post(
        &base,
        "/tokenize",
        json!({"model": "small", "prompt": "Hello world"}),
    )
    .await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["count"], t["tokens"].as_array().unwrap().len());
    assert_eq!(t["max_model_len"], 2048);
    let (_, d) = post(&base, "/detokenize", json!({"tokens": t["tokens"]})).await;
    assert_eq!(d["prompt"], "Hello world");
    let (_, chat) = post(
        &base,
        "/tokenize",
        json!({"messages": [{"role": "user", "content": "Hello world"}], "return_token_strs": true}),
    )
    .await;
    assert!(
        chat["count"].as_u64().unwrap() > t["count"].as_u64().unwrap(),
        "{chat}"
    );
    assert_eq!(
        chat["token_strs"].as_array().unwrap().len() as u64,
        chat["count"].as_u64().unwrap()
    );
    let (status, e) = post(&base, "/detokenize", json!({"tokens": [1, -4]})).await;
    assert_eq!(
        (status, e["error"]["param"].clone()),
        (400, json!("tokens[1]"))
    );
    let (status, e) = post(&base, "/tokenize", json!({"model": "other", "prompt": "x"})).await;
    assert_eq!(
        (status, e["error"]["code"].clone()),
        (404, json!("model_not_found"))
    );

    let models: Value = client()
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["smollm2-135m", "small"]);
    let body =
        json!({"model": "small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let (status, r) = post(&base, "/v1/chat/completions", body).await;
    assert_eq!((status, r["model"].clone()), (200, json!("small")));
    let body =
        json!({"model": "small", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]});
    let (status, m) = post(&base, "/v1/messages", body).await;
    assert_eq!((status, m["model"].clone()), (200, json!("small")), "{m}");
}

/// Errors on the Messages routes come in Anthropic's shape, wherever they arise (routing, the
/// API key, the body); the others in OpenAI's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_api_answers_errors_in_its_own_shape() {
    let mut c = config();
    c.api_keys = vec!["k".into()];
    let base = start(c).await;
    let anthropic = |status: u16, body: &Value, kind: &str| {
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], kind, "{status} {body}");
        assert!(body["error"]["message"].is_string(), "{body}");
    };
    let r = client()
        .post(format!("{base}/v1/messages"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    anthropic(401, &r.json().await.unwrap(), "authentication_error");
    let keyed = reqwest::Client::new();
    let send = |path: &'static str, body: &'static str| {
        keyed
            .post(format!("{base}{path}"))
            .header("x-api-key", "k")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let r = send("/v1/messages", "{not json").await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    anthropic(400, &r.json().await.unwrap(), "invalid_request_error");
    let r = send(
        "/v1/messages",
        r#"{"model": "smollm2-135m", "max_tokens": 4, "messages": []}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    anthropic(400, &r.json().await.unwrap(), "invalid_request_error");
    let r = send("/v1/messages/batches", "{}").await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    anthropic(404, &r.json().await.unwrap(), "not_found_error");
    let r = send("/v1/responses", r#"{"input": 5}"#).await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "input", "{e}");
    // pld's own settings are read by every API, and checked the same way.
    let bad_spec = r#"{"input": "hi", "speculative_config": {"method": "eagle"}}"#;
    let e: Value = send("/v1/responses", bad_spec)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("eagle"),
        "{e}"
    );
    let bad_seed = r#"{"model": "smollm2-135m", "max_tokens": 2, "seed": "x", "messages": [{"role": "user", "content": "hi"}]}"#;
    let r = send("/v1/messages", bad_seed).await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    anthropic(400, &r.json().await.unwrap(), "invalid_request_error");
    let r = send(
        "/v1/responses",
        r#"{"input": [{"type": "web_search_call", "id": "ws_1", "status": "completed"}]}"#,
    )
    .await
    .unwrap();
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "input[0]", "{e}");
}

/// `--record-requests`: every body lands in `requests.jsonl` with its API and tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_recorded_per_api() {
    let dir = std::env::temp_dir().join(format!("pld-record-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut c = config();
    c.record_requests = Some(dir.clone());
    let base = start(c).await;
    post(
        &base,
        "/v1/responses",
        json!({"input": "Hi", "max_output_tokens": 1}),
    )
    .await;
    post(&base, "/v1/messages", json!({"model": "smollm2-135m", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]})).await;
    post(
        &base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
    )
    .await;
    let lines: Vec<Value> = std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let apis: Vec<&str> = lines.iter().map(|l| l["api"].as_str().unwrap()).collect();
    assert_eq!(apis, ["responses", "messages", "chat.completions"]);
    assert_eq!(lines[1]["body"]["max_tokens"], 1);
    assert!(lines
        .iter()
        .all(|l| l["time"].as_f64().unwrap() > 1.7e9 && l["tenant"] == 0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bodies shaped as Codex CLI and Claude Code send them (every field they send, with their
/// values): accepted as they are; the hosted tools among them only under `--lenient`, refused
/// naming the tool otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_shaped_requests_are_accepted() {
    let function = json!({"type": "function", "name": "exec_command", "description": "Runs a command.", "strict": false,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"], "additionalProperties": false}});
    let codex = json!({
        "model": "qwen-coder-0.5b", "stream": true, "store": false, "tool_choice": "auto", "parallel_tool_calls": true,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
        ],
        "tools": [function, {"type": "namespace", "name": "multi_agent", "tools": []}, {"type": "web_search"}],
        "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0123", "client_metadata": {"thread_id": "0123"}, "max_output_tokens": 4,
    });
    // Greedy: Messages samples at temperature 1 by default, and a sampled answer may end within
    // the 4 tokens this test expects it to fill.
    let claude = json!({
        "model": "qwen-coder-0.5b", "max_tokens": 4, "stream": false, "temperature": 0,
        "system": [{"type": "text", "text": "billing header"}, {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>date</system-reminder>"}, {"type": "text", "text": "List the files.", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": "Available agent types: none."},
        ],
        "tools": [{"name": "Bash", "description": "Runs a command.", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "metadata": {"user_id": "{\"session_id\": \"x\"}"}, "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    });
    let qwen_config = || {
        let mut c = config();
        c.model_names = vec!["qwen-coder-0.5b".into()];
        c
    };
    let strict = start_with(qwen(), qwen_config()).await;
    let (status, e) = post(&strict, "/v1/responses", codex.clone()).await;
    assert_eq!(
        (status, e["error"]["param"].clone()),
        (400, json!("tools[1]")),
        "{e}"
    );
    let (status, e) = post(&strict, "/v1/messages", claude.clone()).await;
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("tools[1]"),
        "{e}"
    );
    let mut plain = claude.clone();
    plain["tools"].as_array_mut().unwrap().pop();
    let (status, m) = post(&strict, "/v1/messages", plain).await;
    assert_eq!((status, m["type"].clone()), (200, json!("message")), "{m}");

    let mut c = qwen_config();
    c.lenient = true;
    let lenient = start_with(qwen(), c).await;
    let r = client()
        .post(format!("{lenient}/v1/responses"))
        .json(&codex)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("event: response.completed") || text.contains("event: response.incomplete"),
        "{text}"
    );
    let (status, m) = post(&lenient, "/v1/messages", claude).await;
    assert_eq!(
        (status, m["stop_reason"].clone()),
        (200, json!("max_tokens")),
        "{m}"
    );
}
