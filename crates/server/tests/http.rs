//! The server over real HTTP on loopback with smollm2-135m: completions in both shapes, streamed and
//! not, stop strings, seeds, every error case, the API key, cancellation on disconnect, batching
//! that does not change results, and the official `openai` Python client.

mod common;

use common::*;
use engine::LoadedModel;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_text_completions() {
    let base = start(config()).await;
    let (status, v) = post(
        &base,
        "/v1/chat/completions",
        chat("What is the capital of France? Answer in one sentence.", 24),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.contains("Paris"), "{text}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(
        v["choices"][0]["finish_reason"] == "stop" || v["choices"][0]["finish_reason"] == "length"
    );
    let u = &v["usage"];
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );

    // Streamed: role first, then content, then the finish reason, the usage, [DONE].
    let mut body = chat("What is the capital of France? Answer in one sentence.", 24);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let lines = sse(&base, "/v1/chat/completions", body).await;
    assert_eq!(lines.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = lines[..lines.len() - 1]
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text, "stream and whole response agree");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], u["completion_tokens"]);
    assert!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"].is_string());

    // Text completions.
    let body = json!({"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0});
    let (status, v) = post(&base, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    let whole = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let mut sbody = body;
    sbody["stream"] = json!(true);
    let lines = sse(&base, "/v1/completions", sbody).await;
    let streamed: String = lines[..lines.len() - 1]
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(streamed, whole);

    // /v1/models, /health, /metrics.
    let models: Value = client()
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "smollm2-135m");
    assert_eq!(
        client()
            .get(format!("{base}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let m = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "pld_requests_total{status=\"200\"}",
        "pld_generation_tokens_total",
        "pld_spec_decode_num_draft_tokens_total",
        "pld_spec_decode_num_accepted_tokens_total",
        "pld_time_to_first_token_seconds_bucket",
        "pld_num_requests_running",
    ] {
        assert!(m.contains(name), "metrics lack {name}:\n{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_and_seeds() {
    let base = start(config()).await;
    let (_, v) = post(
        &base,
        "/v1/chat/completions",
        chat("List the numbers from one to ten in words.", 48),
    )
    .await;
    let full = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // A stop string from the middle of the answer: the output ends just before its first
    // occurrence (whatever the answer is: the model's wording is not the point here).
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 16, "a long enough answer: {full:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let first = full.find(&stop).unwrap();
    let mut body = chat("List the numbers from one to ten in words.", 48);
    body["stop"] = json!([stop.clone()]);
    let (_, v) = post(&base, "/v1/chat/completions", body).await;
    let cut = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(cut, &full[..first], "stop {stop:?} in {full:?}");

    let mut body = chat("Write a sentence about the sea.", 24);
    body["temperature"] = json!(0.9);
    body["seed"] = json!(1234);
    let (_, a) = post(&base, "/v1/chat/completions", body.clone()).await;
    let (_, b) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors() {
    let mut c = config();
    c.max_model_len = 64;
    let base = start(c).await;
    let raw = client()
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let status = raw.status().as_u16();
    assert_error(status, &raw.json().await.unwrap(), 400);
    let mut body = chat("hi", 4);
    body["max_tokens"] = json!("four");
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_error(s, &v, 400);
    assert_eq!(v["error"]["param"], "max_tokens", "{v}");
    let mut body = chat("hi", 4);
    body["model"] = json!("gpt-17");
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_error(s, &v, 404);
    // Without a model name (or with null) the served model answers, as in vLLM.
    for model in [None, Some(Value::Null)] {
        let mut body = chat("hi", 2);
        match model {
            None => {
                body.as_object_mut().unwrap().remove("model");
            }
            Some(m) => body["model"] = m,
        }
        let (s, v) = post(&base, "/v1/chat/completions", body).await;
        assert_eq!(s, 200, "{v}");
    }
    // llama.cpp's json_object with a schema of its own is honoured.
    let mut body = chat("Write an example", 6);
    body["response_format"] = json!({"type": "json_object", "schema": {"const": "42"}});
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "\"42\"", "{v}");
    // And its top-level json_schema and GBNF grammar, one constraint per request.
    let mut body = chat("Write an example", 6);
    body["json_schema"] = json!({"const": "42"});
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "\"42\"", "{v}");
    let gbnf = "root ::= answer \".\"\nanswer ::= \"yes\" | \"no\" # either\n";
    let body = json!({"model": "smollm2-135m", "prompt": "Is water wet? Answer:", "max_tokens": 6,
        "temperature": 0, "grammar": gbnf});
    let (s, v) = post(&base, "/v1/completions", body).await;
    assert_eq!(s, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(text == "yes." || text == "no.", "{v}");
    let mut body = chat("hi", 4);
    body["grammar"] = json!("root ::= \"a\"\nroot ::= \"b\"\n");
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_error(s, &v, 400);
    assert_eq!(v["error"]["param"], "grammar", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("line 2"),
        "{v}"
    );
    let mut body = chat("hi", 4);
    body["grammar"] = json!(gbnf);
    body["response_format"] = json!({"type": "json_object"});
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_error(s, &v, 400);
    assert_eq!(v["error"]["param"], "grammar", "{v}");
    // A last assistant message is a prefill: the reply continues its text, as the same prompt
    // continues on /v1/completions.
    let question = "List three fruits.";
    let prefill = "1. Apple\n2.";
    let body = json!({"model": "smollm2-135m", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": question},
                     {"role": "assistant", "content": prefill}]});
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{v}");
    let rendered = model()
        .render_chat(&[engine::Message::new("user", question)])
        .unwrap();
    let body = json!({"model": "smollm2-135m", "max_tokens": 8, "temperature": 0,
        "prompt": format!("{rendered}{prefill}")});
    let (s, w) = post(&base, "/v1/completions", body).await;
    assert_eq!(s, 200, "{w}");
    assert_eq!(
        v["choices"][0]["message"]["content"], w["choices"][0]["text"],
        "{v} {w}"
    );
    // vLLM's explicit form of the same, and what cannot be continued.
    let turns = json!([{"role": "user", "content": question},
                       {"role": "assistant", "content": prefill}]);
    let ask = |extra: Value, messages: Value| {
        let mut body = json!({"model": "smollm2-135m", "max_tokens": 8, "temperature": 0,
            "messages": messages});
        for (k, x) in extra.as_object().unwrap() {
            body[k] = x.clone();
        }
        body
    };
    let body = ask(
        json!({"continue_final_message": true, "add_generation_prompt": false}),
        turns.clone(),
    );
    let (s, u) = post(&base, "/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{u}");
    assert_eq!(
        u["choices"][0]["message"]["content"],
        v["choices"][0]["message"]["content"]
    );
    let both = json!({"continue_final_message": true, "add_generation_prompt": true});
    let (s, u) = post(&base, "/v1/chat/completions", ask(both, turns.clone())).await;
    assert_error(s, &u, 400);
    assert_eq!(u["error"]["param"], "continue_final_message", "{u}");
    let mut twice = turns.clone();
    twice
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": "3."}));
    let (s, u) = post(&base, "/v1/chat/completions", ask(json!({}), twice)).await;
    assert_error(s, &u, 400);
    let no_assistant = json!([{"role": "user", "content": question}]);
    let cont = json!({"continue_final_message": true});
    let (s, u) = post(&base, "/v1/chat/completions", ask(cont, no_assistant)).await;
    assert_error(s, &u, 400);
    let (s, v) = post(&base, "/v1/chat/completions", chat(&"word ".repeat(200), 4)).await;
    assert_error(s, &v, 400);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("64") && msg.contains("prompt has"), "{msg}");
    let mut body = chat("hi", 4);
    body["n"] = json!(9);
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_error(s, &v, 400);
    assert_eq!(v["error"]["param"], "n", "{v}");
    let (s, v) = post(&base, "/v1/chat/completions", chat(&"x".repeat(100_000), 4)).await;
    assert_error(s, &v, 413);
    // Speculation settings are checked as the CLI checks them: unknown fields in
    // speculative_config and unknown methods are refused by name, bad ranges name the field.
    let mut body = chat("hi", 2);
    body["speculative_config"] = json!({"method": "ngram", "num_lookahead_tokens": 3});
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_error(s, &v, 400);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("num_lookahead_tokens"), "{msg}");
    let mut body = chat("hi", 2);
    body["speculative_config"] = json!({"method": "eagle"});
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_error(s, &v, 400);
    assert_eq!(v["error"]["param"], "speculative_config.method", "{v}");
    let mut body = chat("hi", 2);
    body["speculative_config"] = json!({"prompt_lookup_max": 2});
    body["prompt_lookup_min"] = json!(3);
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_error(s, &v, 400);
    assert_eq!(v["error"]["param"], "prompt_lookup_min", "{v}");
    // The server is still serving.
    let (s, _) = post(&base, "/v1/chat/completions", chat("hi", 2)).await;
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_required_when_set() {
    let mut c = config();
    c.api_keys = vec!["sekret".into()];
    let base = start(c).await;
    let (s, v) = post(&base, "/v1/chat/completions", chat("hi", 2)).await;
    assert_error(s, &v, 401);
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth("wrong")
        .json(&chat("hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth("sekret")
        .json(&chat("hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        client()
            .get(format!("{base}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

/// Fields pld cannot honour are refused by name (or, lenient, ignored); values out of range name
/// their field; unknown routes and methods answer in OpenAI's shape; `/v1/completions` names
/// `prompt` in its context error, also when the byte length alone proves the prompt too long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_requests_name_the_field_at_fault() {
    let mut c = config();
    c.max_model_len = 64;
    let base = start(c.clone()).await;
    let refused = |field: &'static str, value: Value| {
        let base = base.clone();
        async move {
            let mut body = chat("hi", 2);
            body[field] = value;
            let (s, v) = post(&base, "/v1/chat/completions", body).await;
            assert_error(s, &v, 400);
            v["error"]["param"].as_str().unwrap_or("").to_string()
        }
    };
    assert_eq!(refused("frobnicate", json!(1)).await, "frobnicate");
    assert_eq!(refused("logit_bias", json!({"15": 10})).await, "logit_bias");
    assert_eq!(
        refused("presence_penalty", json!(0.5)).await,
        "presence_penalty"
    );
    assert_eq!(refused("temperature", json!(2.5)).await, "temperature");
    assert_eq!(refused("top_p", json!(0)).await, "top_p");
    assert_eq!(refused("echo", json!(true)).await, "echo");
    // SmolLM2's template takes no tools: offering some is refused rather than ignored.
    let tool = json!([{"type": "function", "function": {"name": "f"}}]);
    assert_eq!(refused("tools", tool.clone()).await, "tools");
    assert_eq!(
        refused("tools", json!([{"type": "retrieval"}])).await,
        "tools[0]"
    );
    assert_eq!(
        refused("tool_choice", json!("required")).await,
        "tool_choice"
    );
    assert_eq!(
        refused("response_format", json!({"type": "xml"})).await,
        "response_format"
    );
    assert_eq!(
        refused(
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}})
        )
        .await,
        "response_format"
    );
    // What changes nothing is accepted.
    let mut body = chat("hi", 2);
    body["logit_bias"] = json!({});
    body["presence_penalty"] = json!(0);
    body["user"] = json!("someone");
    body["response_format"] = json!({"type": "text"});
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{v}");
    let mut body = chat("hi", 2);
    body["messages"][0]["role"] = json!("wizard");
    let (s, v) = post(&base, "/v1/chat/completions", body).await;
    assert_error(s, &v, 400);
    assert_eq!(v["error"]["param"], "messages[0].role", "{v}");
    // Context errors of text completions name `prompt`: counted in tokens, and from the byte
    // length alone.
    for prompt in ["word ".repeat(200), "word ".repeat(12_000)] {
        let (s, v) = post(
            &base,
            "/v1/completions",
            json!({"model": "smollm2-135m", "prompt": prompt, "max_tokens": 2}),
        )
        .await;
        assert_error(s, &v, 400);
        assert_eq!(v["error"]["param"], "prompt", "{v}");
        assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    }
    // Unknown paths and methods.
    let r = client()
        .get(format!("{base}/v1/nothing"))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    assert_error(s, &r.json().await.unwrap(), 404);
    let r = client()
        .get(format!("{base}/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    assert_error(s, &r.json().await.unwrap(), 405);
    let metrics = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for status in ["404", "405"] {
        assert!(
            metrics.contains(&format!("pld_requests_total{{status=\"{status}\"}} 1")),
            "{status} counted"
        );
    }
    // A lenient server logs and ignores what it cannot honour.
    c.lenient = true;
    let lenient = start(c).await;
    let mut body = chat("hi", 2);
    body["frobnicate"] = json!(1);
    body["logit_bias"] = json!({"15": 10});
    let (s, v) = post(&lenient, "/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{v}");
}

/// `n` choices: one prompt, prefilled once; each choice samples on its own (so seeded choices
/// differ from each other), a greedy request gives n equal choices, usage counts every choice's
/// tokens, and streaming tags each chunk with its choice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_whole_and_streamed() {
    let base = start(config()).await;
    let mut body = chat("Write one sentence about the sea.", 12);
    body["n"] = json!(3);
    body["temperature"] = json!(1.0);
    body["seed"] = json!(7);
    let (s, v) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(s, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let texts: Vec<&str> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i);
            c["message"]["content"].as_str().unwrap()
        })
        .collect();
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "independent samples: {texts:?}"
    );
    let completion = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(completion > 12 && completion <= 36, "{v}");
    // The same seed gives the same three choices.
    let (_, again) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(again["choices"], v["choices"]);
    // Greedy: all choices are the plain greedy answer.
    let mut greedy = chat("Write one sentence about the sea.", 12);
    greedy["n"] = json!(2);
    let (_, g) = post(&base, "/v1/chat/completions", greedy).await;
    let (_, one) = post(
        &base,
        "/v1/chat/completions",
        chat("Write one sentence about the sea.", 12),
    )
    .await;
    for c in g["choices"].as_array().unwrap() {
        assert_eq!(
            c["message"]["content"],
            one["choices"][0]["message"]["content"]
        );
    }
    // Streamed: every choice gets its role, its text and its finish reason, then [DONE] once.
    body["stream"] = json!(true);
    let lines = sse(&base, "/v1/chat/completions", body).await;
    assert_eq!(lines.last().map(String::as_str), Some("[DONE]"));
    let mut streamed = vec![String::new(); 3];
    let mut finished = [false; 3];
    for l in &lines[..lines.len() - 1] {
        let c: Value = serde_json::from_str(l).unwrap();
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        if let Some(t) = choice["delta"]["content"].as_str() {
            streamed[i].push_str(t);
        }
        finished[i] |= !choice["finish_reason"].is_null();
    }
    assert_eq!(finished, [true; 3]);
    assert_eq!(
        streamed, texts,
        "streamed choices equal the whole ones (same seed)"
    );
}

/// CORS: off by default; with an allowed origin, a preflight is answered before the API key is
/// checked, and answers carry the allow-origin header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_preflight_is_answered_before_authentication() {
    let preflight = |base: String| async move {
        client()
            .request(
                reqwest::Method::OPTIONS,
                format!("{base}/v1/chat/completions"),
            )
            .header("origin", "https://app.example")
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
            .await
            .unwrap()
    };
    let mut c = config();
    c.api_keys = vec!["sekret".into()];
    let closed = start(c.clone()).await;
    let r = preflight(closed).await;
    assert!(r.headers().get("access-control-allow-origin").is_none());
    c.cors_origins = vec!["https://app.example".into()];
    let open = start(c).await;
    let r = preflight(open.clone()).await;
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    // The real request still needs the key, and its answer carries the header too; the scheme
    // is case-insensitive.
    let r = client()
        .post(format!("{open}/v1/chat/completions"))
        .header("origin", "https://app.example")
        .header("authorization", "bearer sekret")
        .json(&chat("hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let r = client()
        .post(format!("{open}/v1/chat/completions"))
        .header("origin", "https://app.example")
        .json(&chat("hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
}

/// Corpus drafts stay within a tenant: a request repeated under the same key drafts from the
/// first one's prompt and output, the same request under another key gets nothing from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_drafts_never_cross_api_keys() {
    let mut c = config();
    c.api_keys = vec!["alice".into(), "bob".into()];
    let base = start(c).await;
    let mut body = chat(
        "Name three colours of the rainbow, then three planets of the solar system.",
        40,
    );
    // Only the corpus source, every node sent: what it drafts is what it found.
    body["speculative_config"] =
        json!({"method": "tree", "tree_sources": ["corpus"], "adaptive": false});
    let ask = |key: &'static str| {
        let (base, body) = (base.clone(), body.clone());
        async move {
            let (s, v) = post_by(&client_of(key), &base, "/v1/chat/completions", body).await;
            assert_eq!(s, 200, "{v}");
            answer(&v)
        }
    };
    let corpus_counts = || {
        let base = base.clone();
        async move {
            let text = client()
                .get(format!("{base}/metrics"))
                .bearer_auth("alice")
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let get = |name: &str| -> u64 {
                let key = format!("{name}{{source=\"corpus\"}} ");
                let line = text.lines().find(|l| l.starts_with(&key)).expect(&key);
                line[key.len()..].parse().unwrap()
            };
            (
                get("pld_spec_decode_draft_tokens_by_source_total"),
                get("pld_spec_decode_accepted_tokens_by_source_total"),
            )
        }
    };
    let first = ask("alice").await;
    assert_eq!(
        corpus_counts().await,
        (0, 0),
        "an empty corpus drafts nothing"
    );
    // Bob's corpus is still empty: Alice's request must not reach it.
    let bob = ask("bob").await;
    assert_eq!(
        corpus_counts().await,
        (0, 0),
        "alice's text drafted for bob"
    );
    assert_eq!(bob, first, "greedy output is the same for both");
    // Alice again: her first request is now in her corpus, and it is copied.
    let again = ask("alice").await;
    assert_eq!(again, first);
    let (drafted, accepted) = corpus_counts().await;
    assert!(
        drafted > 0 && accepted > 0,
        "drafted {drafted}, accepted {accepted}"
    );
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

/// A conversation re-sends its history every turn: the second and third turns start from the
/// prefix cache (`usage.prompt_tokens_details.cached_tokens` covers the earlier turns' full
/// blocks), and every answer, greedy or seeded, whole or streamed, is the one a server with the
/// cache off gives. The metrics count the hits and the bytes held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_reuse_the_prefix_cache() {
    let warm = start(config()).await;
    let mut off = config();
    off.prefix_cache_bytes = 0;
    let cold = start(off).await;
    let mut messages =
        vec![json!({"role": "user", "content": format!("{}\nWhat does f3 return?", document())})];
    let mut prompt_before = 0;
    for (turn, question) in ["What does f7 return?", "And f12?", ""].iter().enumerate() {
        let mut body = json!({"model": "smollm2-135m", "messages": messages, "max_tokens": 20});
        if turn == 1 {
            body["temperature"] = json!(0.8);
            body["seed"] = json!(11);
        } else {
            body["temperature"] = json!(0);
        }
        let (s, a) = post(&warm, "/v1/chat/completions", body.clone()).await;
        assert_eq!(s, 200, "{a}");
        let (s, b) = post(&cold, "/v1/chat/completions", body.clone()).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(
            answer(&a),
            answer(&b),
            "turn {turn}: warm and cold answers differ"
        );
        assert_eq!(cached_tokens(&b), 0, "the cache is off");
        let cached = cached_tokens(&a);
        if turn == 0 {
            assert_eq!(cached, 0, "nothing is cached before the first turn");
        } else {
            assert!(
                cached >= prompt_before / 16 * 16
                    && cached < a["usage"]["prompt_tokens"].as_u64().unwrap(),
                "turn {turn}: {cached} cached of {}, the last prompt had {prompt_before}",
                a["usage"]["prompt_tokens"]
            );
        }
        // The same request streamed is served from the cache too, with the same text.
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let lines = sse(&warm, "/v1/chat/completions", body).await;
        let chunks: Vec<Value> = lines
            .iter()
            .filter(|l| *l != "[DONE]")
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, answer(&b), "turn {turn}: streamed from the cache");
        let usage = chunks.last().unwrap();
        assert!(
            cached_tokens(usage) >= a["usage"]["prompt_tokens"].as_u64().unwrap() / 16 * 16 - 16
        );
        prompt_before = a["usage"]["prompt_tokens"].as_u64().unwrap();
        messages.push(json!({"role": "assistant", "content": answer(&a)}));
        messages.push(json!({"role": "user", "content": question}));
    }
    assert!(gauge(&warm, "pld_prefix_cache_hits_total").await >= 4);
    assert!(gauge(&warm, "pld_prefix_cache_cached_prompt_tokens_total").await > 0);
    let (bytes, budget) = (
        gauge(&warm, "pld_prefix_cache_bytes").await,
        gauge(&warm, "pld_prefix_cache_budget_bytes").await,
    );
    assert!(
        bytes > 0 && bytes <= budget,
        "{bytes} bytes held, budget {budget}"
    );
    assert_eq!(gauge(&cold, "pld_prefix_cache_bytes").await, 0);
}

/// The prefix cache is kept per API key: a prompt another key sent is not a hit (its timing
/// would tell what the other tenant sent), one's own is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_cache_hits_never_cross_api_keys() {
    let mut c = config();
    c.api_keys = vec!["alice".into(), "bob".into()];
    let base = start(c).await;
    let body = chat(&format!("{}\nWhich function adds 3?", document()), 8);
    let ask = |key: &'static str| {
        let (base, body) = (base.clone(), body.clone());
        async move {
            let (s, v) = post_by(&client_of(key), &base, "/v1/chat/completions", body).await;
            assert_eq!(s, 200, "{v}");
            (answer(&v), cached_tokens(&v))
        }
    };
    let (first, cached) = ask("alice").await;
    assert_eq!(cached, 0);
    let (bob, cached) = ask("bob").await;
    assert_eq!(cached, 0, "alice's prompt was a hit for bob");
    assert_eq!(bob, first);
    let (again, cached) = ask("alice").await;
    assert!(cached > 0, "alice's own prompt is cached");
    assert_eq!(again, first);
    let (bob_again, cached) = ask("bob").await;
    assert!(cached > 0, "bob's own prompt is cached");
    assert_eq!(bob_again, first);
}

/// The model source's prediction table is kept per tenant: a tenant's repeated request drafts
/// from what the model predicted on its first one (more accepted nodes than a cold start), and
/// another tenant starts cold (exactly as many as the first request had).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_predictions_warm_up_within_a_tenant_only() {
    let mut c = config();
    c.api_keys = vec!["alice".into(), "bob".into()];
    let base = start(c).await;
    let mut body = chat("List the days of the week, one per line.", 40);
    body["speculative_config"] =
        json!({"method": "tree", "tree_sources": ["model"], "adaptive": false});
    let accepted_model = || {
        let base = base.clone();
        async move {
            let text = client()
                .get(format!("{base}/metrics"))
                .bearer_auth("alice")
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let key = "pld_spec_decode_accepted_tokens_by_source_total{source=\"model\"} ";
            let line = text.lines().find(|l| l.starts_with(key)).expect(key);
            line[key.len()..].parse::<u64>().unwrap()
        }
    };
    let ask = |key: &'static str| {
        let (base, body) = (base.clone(), body.clone());
        async move {
            let (s, v) = post_by(&client_of(key), &base, "/v1/chat/completions", body).await;
            assert_eq!(s, 200, "{v}");
            answer(&v)
        }
    };
    let t0 = accepted_model().await;
    let first = ask("alice").await;
    let t1 = accepted_model().await;
    let bob = ask("bob").await;
    let t2 = accepted_model().await;
    let again = ask("alice").await;
    let t3 = accepted_model().await;
    assert_eq!(bob, first);
    assert_eq!(again, first);
    let (cold, other, warm) = (t1 - t0, t2 - t1, t3 - t2);
    eprintln!("model-source nodes accepted: cold {cold}, other tenant {other}, warm {warm}");
    assert_eq!(other, cold, "bob started from alice's table");
    assert!(
        warm > cold,
        "no warm start: {cold} accepted cold, {warm} warm"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_in_both_shapes() {
    let base = start(config()).await;
    let mut body = chat("What is the capital of France? Answer in one sentence.", 12);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let (status, v) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    let ended = v["choices"][0]["finish_reason"] == "stop";
    assert_eq!(content.len() + usize::from(ended), n, "{v}");
    let text: String = content
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert_eq!(
        text,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );
    for e in content {
        let lp = e["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        // Greedy: the chosen token is the first alternative.
        assert_eq!(top[0]["token"], e["token"]);
        assert!(e["bytes"].is_array());
    }
    // Streamed: the same entries, spread over the chunks.
    body["stream"] = json!(true);
    let lines = sse(&base, "/v1/chat/completions", body).await;
    let streamed: Vec<Value> = lines[..lines.len() - 1]
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&streamed, content);

    // Text completions: the legacy parallel lists.
    let body = json!({"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 6,
        "temperature": 0, "logprobs": 1});
    let (status, v) = post(&base, "/v1/completions", body).await;
    assert_eq!(status, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 6);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 6);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 1);
    assert_eq!(lp["text_offset"][0], 0);
    // Without asking: null.
    let (_, v) = post(&base, "/v1/chat/completions", chat("Hi", 2)).await;
    assert!(v["choices"][0]["logprobs"].is_null());

    // Bad settings are 400s naming the field.
    for (field, value, extra) in [
        ("top_logprobs", json!(50), Some(("logprobs", json!(true)))),
        ("logprobs", json!("yes"), None),
        ("top_logprobs", json!(2), None),
        // The cap is named as the client sent it.
        ("max_tokens", json!(0), None),
        ("max_completion_tokens", json!(0), None),
    ] {
        let mut body = chat("Hi", 2);
        body[field] = value;
        if let Some((k, v)) = extra {
            body[k] = v;
        }
        let (status, v) = post(&base, "/v1/chat/completions", body).await;
        assert_error(status, &v, 400);
        assert_eq!(v["error"]["param"], field, "{v}");
    }
}

async fn running(base: &str) -> u64 {
    gauge(base, "pld_num_requests_running").await
}

async fn waiting(base: &str) -> u64 {
    gauge(base, "pld_num_requests_waiting").await
}

async fn gauge(base: &str, name: &str) -> u64 {
    gauge_by(&client(), base, name).await
}

async fn gauge_by(c: &reqwest::Client, base: &str, name: &str) -> u64 {
    metric_by(c, base, name).await as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_frees_the_sequence_and_full_queue_is_429() {
    let mut c = config();
    c.max_num_seqs = 1;
    c.max_queue = 1;
    let base = start(c).await;
    let mut body = chat("Tell me a very long story about a dragon.", 2000);
    body["stream"] = json!(true);
    body["min_p"] = json!(0.0);
    let mut resp = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    // Wait until it generates.
    let first = resp.chunk().await.unwrap();
    assert!(first.is_some());
    let _ = resp.chunk().await.unwrap();
    // The engine thread sends text before it updates the gauge at the end of its step.
    for _ in 0..100 {
        if running(&base).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running(&base).await, 1);
    // One waits in the queue, the next is refused.
    let queued = tokio::spawn({
        let base = base.clone();
        async move { post(&base, "/v1/chat/completions", chat("hi", 2)).await }
    });
    for _ in 0..600 {
        if waiting(&base).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(waiting(&base).await, 1, "the second request waits");
    let refused = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat("hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .map(|h| h.to_str().unwrap()),
        Some("1"),
        "a 429 says when to retry"
    );
    let s = refused.status().as_u16();
    assert_error(s, &refused.json().await.unwrap(), 429);
    // The client goes away: the sequence stops and the queued request runs.
    drop(resp);
    let (s, _) = tokio::time::timeout(Duration::from_secs(60), queued)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s, 200);
    let mut freed = false;
    for _ in 0..50 {
        if running(&base).await == 0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(freed, "the dropped sequence is freed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_does_not_change_results() {
    let base = start(config()).await;
    let prompts: Vec<String> = (0..16)
        .map(|i| {
            format!(
                "Repeat this code exactly: let x{i} = vec![{i}, {}, {}];",
                i + 1,
                i * 3
            )
        })
        .collect();
    let mut alone = Vec::new();
    for p in &prompts {
        let (s, v) = post(&base, "/v1/chat/completions", chat(p, 24)).await;
        assert_eq!(s, 200);
        alone.push(
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let base = base.clone();
            let body = chat(p, 24);
            tokio::spawn(async move { post(&base, "/v1/chat/completions", body).await })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let (s, v) = h.await.unwrap();
        assert_eq!(s, 200);
        assert_eq!(
            v["choices"][0]["message"]["content"].as_str().unwrap(),
            alone[i],
            "request {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_client_works() {
    let base = start(config()).await;
    let script = format!(
        r#"
import openai
c = openai.OpenAI(base_url="{base}/v1", api_key="none")
r = c.chat.completions.create(model="smollm2-135m", messages=[{{"role": "user", "content": "What is the capital of France? Answer in one sentence."}}], max_tokens=16, temperature=0)
assert "Paris" in r.choices[0].message.content, r
parts = []
for chunk in c.chat.completions.create(model="smollm2-135m", messages=[{{"role": "user", "content": "What is the capital of France? Answer in one sentence."}}], max_tokens=16, temperature=0, stream=True):
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
assert "".join(parts) == r.choices[0].message.content, (parts, r)
t = c.completions.create(model="smollm2-135m", prompt="The capital of France is", max_tokens=8, temperature=0)
assert t.usage.completion_tokens == 8, t
m = c.chat.completions.create(model="smollm2-135m", messages=[{{"role": "user", "content": "Name a colour."}}], max_tokens=6, temperature=1.0, seed=3, n=3)
assert [ch.index for ch in m.choices] == [0, 1, 2], m
assert all(ch.message.content for ch in m.choices), m
import json, jsonschema
schema = {{"type": "object", "properties": {{"name": {{"type": "string", "maxLength": 40}}, "age": {{"type": "integer", "minimum": 0, "maximum": 150}}}}, "required": ["name", "age"], "additionalProperties": False}}
ask = [{{"role": "user", "content": "Ada Lovelace was 36. Give her name and age as JSON."}}]
s = c.chat.completions.create(model="smollm2-135m", messages=ask, max_tokens=60, temperature=0, response_format={{"type": "json_schema", "json_schema": {{"name": "person", "schema": schema, "strict": True}}}})
assert s.choices[0].finish_reason == "stop", s
jsonschema.validate(json.loads(s.choices[0].message.content), schema)
parts = []
for chunk in c.chat.completions.create(model="smollm2-135m", messages=ask, max_tokens=60, temperature=0, stream=True, response_format={{"type": "json_schema", "json_schema": {{"name": "person", "schema": schema}}}}):
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
assert "".join(parts) == s.choices[0].message.content, parts
o = c.completions.create(model="smollm2-135m", prompt="A JSON object describing a cat:", max_tokens=80, temperature=0, extra_body={{"response_format": {{"type": "json_object"}}}})
if o.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(o.choices[0].text), dict), o
else:
    assert o.choices[0].text.lstrip().startswith("{{"), o
try:
    c.chat.completions.create(model="smollm2-135m", messages=[{{"role": "user", "content": "hi"}}], max_tokens=2, logit_bias={{"15": 5}})
    raise SystemExit("logit_bias was accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "logit_bias", e.body
print("ok")
"#
    );
    run_python(script).await;
}

/// Resident memory of this process (the server runs in it), in kB (0 where Linux does not tell).
fn rss_kb() -> u64 {
    common::status_kb("VmRSS").unwrap_or(0)
}

/// The soak's two tenants, and the document each asks about.
const SOAK_KEYS: [&str; 2] = ["alice", "bob"];

fn soak_question(tenant: usize, j: usize) -> Value {
    let doc = format!("{}# kept by {}\n", document(), SOAK_KEYS[tenant]);
    chat(&format!("{doc}\nWhat does f{} return?", 3 * j + 1), 6)
}

/// One request of the soak, from tenant `i % 2`: plain, streamed, cancelled mid-stream,
/// over-long (refused), a text completion with two choices, or a question about the tenant's
/// document whose answer must be `answers[tenant][j]` (by `i % 6`).
async fn soak_request(base: String, i: usize, answers: Arc<Vec<Vec<String>>>) {
    let tenant = (i / 6) % 2;
    let c = client_of(SOAK_KEYS[tenant]);
    match i % 6 {
        5 => {
            let j = (i / 12) % answers[tenant].len();
            let (s, v) = post_by(&c, &base, "/v1/chat/completions", soak_question(tenant, j)).await;
            assert_eq!(s, 200, "{v}");
            assert_eq!(answer(&v), answers[tenant][j], "request {i}");
        }
        0 => {
            let (s, v) = post_by(
                &c,
                &base,
                "/v1/chat/completions",
                chat(&format!("Say {i}."), 4),
            )
            .await;
            assert_eq!(s, 200, "{v}");
        }
        1 => {
            let mut body = chat(&format!("Count to {}.", i % 7), 4);
            body["stream"] = json!(true);
            let lines = sse_by(&c, &base, "/v1/chat/completions", body).await;
            assert_eq!(lines.last().map(String::as_str), Some("[DONE]"));
        }
        2 => {
            let mut body = chat("Tell me a long story about the sea.", 200);
            body["stream"] = json!(true);
            let mut r = c
                .post(format!("{base}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            let _ = r.chunk().await;
            drop(r); // the client goes away mid-stream
        }
        3 => {
            let (s, v) = post_by(
                &c,
                &base,
                "/v1/chat/completions",
                chat(&"word ".repeat(3000), 4),
            )
            .await;
            assert_error(s, &v, 400);
        }
        _ => {
            let (s, v) = post_by(
                &c,
                &base,
                "/v1/completions",
                json!({"model": "smollm2-135m", "prompt": format!("Item {i}:"), "max_tokens": 3, "n": 2, "temperature": 0.8, "seed": i}),
            )
            .await;
            assert_eq!(s, 200, "{v}");
        }
    }
}

/// A soak of 1,000 mixed requests from two API keys, eight at a time (plain, streamed,
/// cancelled, over-long, two choices, questions about each key's document sharing its prefix),
/// with a prefix cache of 8 MB: every answer is right (a document question's is the one a
/// server without the cache gives), nothing is left running, resident memory after the last 800
/// is within 10% of what it was after the first 200, the cache stays within its budget while
/// evicting, and afterwards a third key's first question is no hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_of_mixed_requests_keeps_memory_flat() {
    let mut c = config();
    c.api_keys = vec![SOAK_KEYS[0].into(), SOAK_KEYS[1].into(), "carol".into()];
    c.prefix_cache_bytes = 8 << 20;
    let mut reference = c.clone();
    reference.prefix_cache_bytes = 0;
    let reference = start(reference).await;
    let mut answers = vec![Vec::new(), Vec::new()];
    for (tenant, list) in answers.iter_mut().enumerate() {
        for j in 0..4 {
            let (s, v) = post_by(
                &client_of("carol"),
                &reference,
                "/v1/chat/completions",
                soak_question(tenant, j),
            )
            .await;
            assert_eq!(s, 200, "{v}");
            list.push(answer(&v));
        }
    }
    let answers = Arc::new(answers);
    let base = start(c).await;
    let run = |from: usize, to: usize| {
        let (base, answers) = (base.clone(), answers.clone());
        async move {
            for group in (from..to).collect::<Vec<_>>().chunks(8) {
                let tasks: Vec<_> = group
                    .iter()
                    .map(|&i| tokio::spawn(soak_request(base.clone(), i, answers.clone())))
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            }
        }
    };
    let started = std::time::Instant::now();
    run(0, 200).await;
    let warm = rss_kb();
    run(200, 1000).await;
    // Cancelled sequences leave within a step or two.
    for _ in 0..100 {
        if gauge_by(&client_of("carol"), &base, "pld_num_requests_running").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let carol = client_of("carol");
    assert_eq!(
        gauge_by(&carol, &base, "pld_num_requests_running").await,
        0,
        "sequences left running"
    );
    let end = rss_kb();
    let gauge = |name: &'static str| gauge_by(&carol, &base, name);
    let (bytes, budget) = (gauge("pld_prefix_cache_bytes").await, 8 << 20);
    assert!(bytes <= budget, "the prefix cache holds {bytes} bytes");
    assert!(
        gauge("pld_prefix_cache_evicted_blocks_total").await > 0,
        "nothing evicted"
    );
    let (hits, evicted) = (
        gauge("pld_prefix_cache_hits_total").await,
        gauge("pld_prefix_cache_evicted_blocks_total").await,
    );
    eprintln!(
        "soak: prefix cache {bytes} bytes of {budget}, {hits} hits, {evicted} blocks evicted"
    );
    assert!(hits > 100, "few hits");
    assert!(evicted > 0, "nothing evicted");
    let (s, v) = post_by(&carol, &base, "/v1/chat/completions", soak_question(0, 0)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        cached_tokens(&v),
        0,
        "another key's document was a hit for carol"
    );
    assert_eq!(answer(&v), answers[0][0]);
    eprintln!(
        "soak: 1000 requests in {:.1} s; resident memory {} MB after 200, {} MB after 1000",
        started.elapsed().as_secs_f64(),
        warm / 1024,
        end / 1024
    );
    assert!(warm > 0, "no /proc/self/status");
    assert!(
        end * 10 <= warm * 11,
        "resident memory grew from {warm} kB to {end} kB"
    );
}

/// Function calling through the official client on a model whose template takes tools
/// (qwen-coder-0.5b): a required call and a named one come back as `tool_calls` with arguments
/// that match the parameters (the grammar forces them), also streamed; the call and a `tool`
/// answer go back in for the next turn; an unknown function name is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_round_trip_with_the_openai_client() {
    let path = models::resolve_model("qwen-coder-0.5b").expect("model available");
    let lm = Arc::new(LoadedModel::load(&path).expect("model loads"));
    let mut c = config();
    c.model_names = vec!["qwen-coder-0.5b".into()];
    let base = start_with(lm, c).await;
    let script = format!(
        r#"
import json, openai
c = openai.OpenAI(base_url="{base}/v1", api_key="none")
tools = [{{"type": "function", "function": {{"name": "get_weather", "description": "Current weather in a city", "parameters": {{"type": "object", "properties": {{"city": {{"type": "string", "maxLength": 30}}}}, "required": ["city"], "additionalProperties": False}}}}}},
         {{"type": "function", "function": {{"name": "get_time", "parameters": {{"type": "object", "properties": {{}}, "additionalProperties": False}}}}}}]
msgs = [{{"role": "user", "content": "What is the weather in Paris right now?"}}]
for choice in ["required", {{"type": "function", "function": {{"name": "get_weather"}}}}]:
    r = c.chat.completions.create(model="qwen-coder-0.5b", messages=msgs, tools=tools, tool_choice=choice, max_tokens=60, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", r
    call = ch.message.tool_calls[0]
    assert call.function.name == "get_weather", r
    assert isinstance(json.loads(call.function.arguments)["city"], str), r
streamed, finish = [], None
for chunk in c.chat.completions.create(model="qwen-coder-0.5b", messages=msgs, tools=tools, tool_choice="required", max_tokens=60, temperature=0, stream=True):
    if chunk.choices:
        if chunk.choices[0].delta.tool_calls:
            streamed.extend(chunk.choices[0].delta.tool_calls)
        finish = chunk.choices[0].finish_reason or finish
assert finish == "tool_calls" and streamed[0].function.name == "get_weather", streamed
assert streamed[0].function.arguments == call.function.arguments, (streamed, call)
back = msgs + [{{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}},
               {{"role": "tool", "tool_call_id": call.id, "content": json.dumps({{"temperature_c": 18}})}}]
r2 = c.chat.completions.create(model="qwen-coder-0.5b", messages=back, tools=tools, tool_choice="none", max_tokens=24, temperature=0)
assert r2.choices[0].message.content, r2
try:
    c.chat.completions.create(model="qwen-coder-0.5b", messages=msgs, tools=tools, tool_choice={{"type": "function", "function": {{"name": "nope"}}}}, max_tokens=4)
    raise SystemExit("an unknown function was accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "tool_choice", e.body
print("ok")
"#
    );
    run_python(script).await;
}
