//! Completions in both shapes, stop strings and seeds, `n` choices, CORS, logprobs, and the
//! official `openai` Python client, also with tool calls.

use super::*;
use engine::LoadedModel;
use std::sync::Arc;

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
    let m = metrics_by(&client(), &base).await;
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
