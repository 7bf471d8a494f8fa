//! gpt-oss's harmony format through all three APIs, over real HTTP. There is no gpt-oss model (nor
//! its o200k tokenizer) here: the model is the tiny random-weight Qwen3 of the engine's tests
//! (`crates/engine/tests/tiny/qwen3.gguf`, SmolLM2's first 512 tokens) given gpt-oss's chat
//! template and harmony's seven markers as control tokens in place of seven of its own (ids 3 to
//! 9), written to a temporary GGUF. A call forced by `tool_choice` makes it write harmony (the
//! forced grammar's markers are those special tokens); the reply is read by the harmony reader
//! in `api::output` and rendered by each API, whole and streamed.

mod common;

use candle_core::quantized::gguf_file::{self, Value as Meta};
use candle_core::quantized::QTensor;
use candle_core::Device;
use common::*;
use engine::LoadedModel;
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};

const TEMPLATE: &str = include_str!("../../engine/tests/harmony/openai-gpt-oss-120b.jinja");
const MARKERS: [&str; 7] = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
];

/// The tiny model with harmony's markers and template, written once per test process.
fn harmony_model() -> Arc<LoadedModel> {
    static M: OnceLock<Arc<LoadedModel>> = OnceLock::new();
    M.get_or_init(|| {
        let src = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../engine/tests/tiny/qwen3.gguf"
        );
        let mut file = std::fs::File::open(src).unwrap();
        let content = gguf_file::Content::read(&mut file).unwrap();
        let mut metadata = content.metadata.clone();
        let Some(Meta::Array(tokens)) = metadata.get("tokenizer.ggml.tokens").cloned() else {
            panic!("no tokens")
        };
        let mut tokens = tokens;
        for (i, m) in MARKERS.iter().enumerate() {
            tokens[3 + i] = Meta::String(m.to_string());
        }
        metadata.insert("tokenizer.ggml.tokens".into(), Meta::Array(tokens));
        metadata.insert("tokenizer.ggml.eos_token_id".into(), Meta::U32(8)); // <|return|>
                                                                             // gpt-oss's system message alone is longer than the tiny model's 256 positions; its
                                                                             // random weights run as well at any position.
        metadata.insert("qwen3.context_length".into(), Meta::U32(2048));
        metadata.insert(
            "tokenizer.chat_template".into(),
            Meta::String(TEMPLATE.into()),
        );
        let mut names: Vec<&String> = content.tensor_infos.keys().collect();
        names.sort();
        let tensors: Vec<_> = names
            .iter()
            .map(|n| {
                let t = content.tensor(&mut file, n, &Device::Cpu).unwrap();
                if n.as_str() == "output.weight" {
                    end_early(&t)
                } else {
                    t
                }
            })
            .collect();
        let meta: Vec<(&str, &Meta)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let named: Vec<(&str, &_)> = names.iter().map(|n| n.as_str()).zip(&tensors).collect();
        let path = std::env::temp_dir().join(format!("pld-harmony-{}.gguf", std::process::id()));
        let mut out = std::fs::File::create(&path).unwrap();
        gguf_file::write(&mut out, &meta, &named).unwrap();
        drop(out);
        let lm = LoadedModel::load(&path).expect("the harmony model loads");
        std::fs::remove_file(&path).ok();
        Arc::new(lm)
    })
    .clone()
}

/// The output head with `<|end|>`'s row twice the row of "ich" (485), the second token the model
/// writes in its reasoning: it now ends its reasoning there, after " ex", and goes on to the
/// forced call (unchanged, it reasons until the output cap).
fn end_early(head: &QTensor) -> QTensor {
    let w = head.dequantize(&Device::Cpu).unwrap();
    let mut rows: Vec<Vec<f32>> = w.to_vec2().unwrap();
    rows[4] = rows[485].iter().map(|x| 2.0 * x).collect();
    let (n, d) = (rows.len(), rows[0].len());
    let flat: Vec<f32> = rows.into_iter().flatten().collect();
    let w = candle_core::Tensor::from_vec(flat, (n, d), &Device::Cpu).unwrap();
    QTensor::quantize(&w, head.dtype()).unwrap()
}

async fn server() -> String {
    let mut c = config();
    c.model_names = vec!["tiny-harmony".into()];
    c.max_model_len = 1024;
    start_with(harmony_model(), c).await
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"], "additionalProperties": false},
    }})
}

#[test]
fn the_vocabulary_ends_turns_as_harmony_does() {
    let lm = harmony_model();
    let tok = &lm.tokenizer;
    let id = |m: &str| tok.encode(m).unwrap()[0];
    assert!(tok.is_end(id("<|return|>")) && tok.is_end(id("<|call|>")));
    assert!(
        !tok.is_end(id("<|end|>")),
        "<|end|> ends a message, not the turn"
    );
    assert!(lm.chat_template.as_ref().unwrap().is_harmony());
    let prompt = lm
        .render_chat(&[engine::Message::new("user", "Hi")])
        .unwrap();
    assert!(prompt.ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant"));
    let ids = tok.encode_prompt(&prompt).unwrap();
    assert!(ids.contains(&id("<|start|>")) && ids.contains(&id("<|message|>")));
}

/// The data of each SSE event of a streamed answer.
async fn events(base: &str, path: &str, body: Value) -> Vec<Value> {
    let r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    assert_no_marker(&text);
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn assert_no_marker(text: &str) {
    for m in MARKERS {
        assert!(!text.contains(m), "{m} reached the client: {text}");
    }
}

/// The forced call's arguments: the one city the schema allows first... either city.
fn assert_weather_arguments(arguments: &str) {
    let v: Value = serde_json::from_str(arguments).unwrap();
    assert!(v["city"] == "Paris" || v["city"] == "Rome", "{v}");
}

/// A request that makes the model reason (" ex") and call `get_weather` (the model writes
/// `<|channel|>analysis<|message|> ex<|end|><|start|>assistant<|channel|>commentary
/// to=functions.get_weather <|constrain|>json<|message|>{...}` and ends with `<|call|>`).
fn forced(mut body: Value) -> Value {
    body["tools"] = json!([weather_tool()]);
    body["temperature"] = json!(0);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_carry_reasoning_and_calls() {
    let base = server().await;
    let body = forced(json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tool_choice": "required",
        "max_tokens": 80,
    }));
    let (status, r) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_no_marker(&r.to_string());
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{r}");
    let message = &choice["message"];
    assert_eq!(message["reasoning_content"], " ex", "{r}");
    assert_eq!(message["content"], Value::Null, "{r}");
    let call = &message["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_weather_arguments(call["function"]["arguments"].as_str().unwrap());

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let chunks = events(&base, "/v1/chat/completions", streamed).await;
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    let reasoning: String = deltas
        .iter()
        .filter_map(|d| d["reasoning_content"].as_str())
        .collect();
    assert_eq!(reasoning, " ex");
    let content: String = deltas
        .iter()
        .filter_map(|d| d["content"].as_str())
        .collect();
    assert_eq!(content, "");
    let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "tool_calls");

    // The call goes back with its reasoning and the tool's result; the next turn renders.
    let follow = forced(json!({
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "reasoning_content": " ex", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
        ],
        "tool_choice": "none",
        "reasoning_effort": "high",
        "max_tokens": 8,
    }));
    let (status, r) = post(&base, "/v1/chat/completions", follow).await;
    assert_eq!(status, 200, "{r}");
    assert_no_marker(&r.to_string());
    let (status, e) = post(
        &base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"}),
    )
    .await;
    assert_eq!(
        (status, e["error"]["param"].clone()),
        (400, json!("reasoning_effort"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_carry_a_reasoning_item_before_the_call() {
    let base = server().await;
    let f = &weather_tool()["function"];
    let tool = json!({"type": "function", "name": f["name"], "description": f["description"], "parameters": f["parameters"]});
    let body = forced(json!({
        "input": "Weather in Paris?",
        "tool_choice": "required",
        "max_output_tokens": 80,
        "reasoning": {"effort": "low"},
    }));
    let mut body = body;
    body["tools"] = json!([tool]);
    let (status, r) = post(&base, "/v1/responses", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_no_marker(&r.to_string());
    assert_eq!(r["reasoning"]["effort"], "low");
    let output = r["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{r}");
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["content"][0]["type"], "reasoning_text");
    assert_eq!(output[0]["content"][0]["text"], " ex");
    assert_eq!(output[1]["type"], "function_call");
    assert_eq!(output[1]["name"], "get_weather");
    assert_weather_arguments(output[1]["arguments"].as_str().unwrap());

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let events = events(&base, "/v1/responses", streamed).await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let at = |k: &str| {
        kinds
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("no {k}: {kinds:?}"))
    };
    assert!(at("response.reasoning_text.delta") < at("response.reasoning_text.done"));
    assert!(at("response.reasoning_text.done") < at("response.function_call_arguments.done"));
    let reasoning: String = events
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(reasoning, " ex");
    let added: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .collect();
    assert_eq!(added[0]["item"]["type"], "reasoning");
    assert_eq!(added[0]["output_index"], 0);
    assert_eq!(added[1]["item"]["type"], "function_call");
    assert_eq!(added[1]["output_index"], 1);
    assert!(!kinds.contains(&"response.output_text.delta"), "{kinds:?}");
    let done = events.last().unwrap();
    assert_eq!(done["type"], "response.completed");
    assert_eq!(done["response"]["output"][0]["type"], "reasoning");

    // The reasoning item and the call go back in, with the call's output.
    let call = &output[1];
    let follow = json!({
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            output[0].clone(),
            call.clone(),
            {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
        ],
        "tools": [tool],
        "max_output_tokens": 8,
    });
    let (status, r) = post(&base, "/v1/responses", follow).await;
    assert_eq!(status, 200, "{r}");
    assert_no_marker(&r.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_carry_a_thinking_block_before_the_tool_use() {
    let base = server().await;
    let tool = json!({"name": "get_weather", "description": "Weather of a city", "input_schema": weather_tool()["function"]["parameters"]});
    let body = json!({
        "model": "tiny-harmony",
        "max_tokens": 80,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [tool],
        "tool_choice": {"type": "any"},
        "temperature": 0,
    });
    let (status, r) = post(&base, "/v1/messages", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_no_marker(&r.to_string());
    assert_eq!(r["stop_reason"], "tool_use", "{r}");
    let content = r["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{r}");
    assert_eq!(content[0]["type"], "thinking");
    assert_eq!(content[0]["thinking"], " ex");
    assert_eq!(content[1]["type"], "tool_use");
    assert_eq!(content[1]["name"], "get_weather");
    assert_weather_arguments(&content[1]["input"].to_string());

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = events(&base, "/v1/messages", streamed).await;
    let starts: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .collect();
    assert_eq!(starts[0]["index"], 0);
    assert_eq!(starts[0]["content_block"]["type"], "thinking");
    assert_eq!(starts[1]["index"], 1);
    assert_eq!(starts[1]["content_block"]["type"], "tool_use");
    let thinking: String = events
        .iter()
        .filter(|e| e["delta"]["type"] == "thinking_delta")
        .map(|e| e["delta"]["thinking"].as_str().unwrap())
        .collect();
    assert_eq!(thinking, " ex");
    assert!(events.iter().all(|e| e["delta"]["type"] != "text_delta"));
    let end = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(end["delta"]["stop_reason"], "tool_use");

    // The thinking block and the tool use go back with the result.
    let follow = json!({
        "model": "tiny-harmony",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": content[1]["id"], "content": "sunny"}]},
        ],
        "tools": [tool],
        "output_config": {"effort": "medium"},
    });
    let (status, r) = post(&base, "/v1/messages", follow).await;
    assert_eq!(status, 200, "{r}");
    assert_no_marker(&r.to_string());
}

/// Without a forced call the tiny model writes no harmony: its text is content, and whatever
/// markers it emits on the way never reach the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_that_is_not_harmony_is_content() {
    let base = server().await;
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 24, "temperature": 0});
    let (status, r) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_no_marker(&r.to_string());
    assert!(
        r["choices"][0]["message"].get("tool_calls").is_none(),
        "{r}"
    );
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let chunks = events(&base, "/v1/chat/completions", streamed).await;
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let whole = r["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    let reasoning = r["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .unwrap_or_default();
    let streamed_reasoning: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    assert_eq!(
        (text.as_str(), streamed_reasoning.as_str()),
        (whole, reasoning)
    );
}

/// The same answers read by the official OpenAI and Anthropic Python clients, every streamed
/// event checked against the SDK's own type for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_clients_read_the_reasoning() {
    let base = server().await;
    run_client("harmony_client.py", vec![base, "tiny-harmony".into()]).await;
}

/// The tokens' text of chat log-probabilities, joined.
fn logprob_text(choice: &Value) -> String {
    choice["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect()
}

/// Structured output on a harmony model: the model may reason, then the answer is the final
/// channel's content, the JSON alone; its log-probabilities are those of the JSON's tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_output_is_the_final_channels_content() {
    let base = server().await;
    // Compact JSON: with llguidance's flexible whitespace the tiny random model writes
    // whitespace to the output cap.
    let mut schema = weather_tool()["function"]["parameters"].clone();
    schema["x-guidance"] = json!({"whitespace_flexible": false});
    let body = json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
        "max_tokens": 80,
        "temperature": 0,
        "logprobs": true,
    });
    let (status, r) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_no_marker(&r.to_string());
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{r}");
    let reasoning = choice["message"]["reasoning_content"].as_str().unwrap();
    assert!(!reasoning.is_empty(), "{r}");
    let content = choice["message"]["content"].as_str().unwrap();
    assert_weather_arguments(content);
    assert_eq!(logprob_text(choice), content, "{r}");

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let chunks = events(&base, "/v1/chat/completions", streamed).await;
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, content);
    let tokens: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert_eq!(tokens, content);

    // The same through the Messages API's output_config.format and a json_object request.
    let (status, m) = post(
        &base,
        "/v1/messages",
        json!({"model": "tiny-harmony", "max_tokens": 80, "temperature": 0,
               "messages": [{"role": "user", "content": "Weather in Paris?"}],
               "output_config": {"format": {"type": "json_schema", "schema": schema}}}),
    )
    .await;
    assert_eq!(status, 200, "{m}");
    let blocks = m["content"].as_array().unwrap();
    assert_eq!(
        (&blocks[0]["type"], &blocks[1]["type"]),
        (&json!("thinking"), &json!("text"))
    );
    assert_eq!(blocks[1]["text"], content, "{m}");
    let (status, o) = post(
        &base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 80,
               "temperature": 0, "response_format": {"type": "json_object"}}),
    )
    .await;
    assert_eq!(status, 200, "{o}");
    assert_no_marker(&o.to_string());
    // Flexible whitespace: the tiny model's object may not close within the cap.
    let text = o["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with('{'), "{o}");
}

/// Log-probabilities cover the content's tokens alone: a reply of reasoning and a call has none
/// (no marker, header, reasoning or argument token among them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_leave_out_the_markup_reasoning_and_calls() {
    let base = server().await;
    let mut body = forced(json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tool_choice": "required",
        "max_tokens": 80,
        "logprobs": true,
        "top_logprobs": 2,
    }));
    let (status, r) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls", "{r}");
    assert_eq!(logprob_text(&r["choices"][0]), "", "{r}");
    body["stream"] = json!(true);
    let chunks = events(&base, "/v1/chat/completions", body).await;
    let streamed: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .collect();
    assert!(streamed.is_empty(), "{streamed:?}");
}

/// Anthropic's extended thinking is a reasoning effort here: accepted, enabled or disabled, and
/// checked as Anthropic checks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_take_thinking_as_a_reasoning_effort() {
    let base = server().await;
    let ask = json!([{"role": "user", "content": "Hi"}]);
    for thinking in [
        json!({"type": "enabled", "budget_tokens": 1024}),
        json!({"type": "enabled", "budget_tokens": 20000}),
        json!({"type": "disabled"}),
        json!({"type": "adaptive"}),
    ] {
        let body = json!({"model": "tiny-harmony", "max_tokens": 4, "messages": ask, "thinking": thinking});
        let (status, r) = post(&base, "/v1/messages", body).await;
        assert_eq!(status, 200, "{thinking}: {r}");
    }
    for (thinking, param) in [
        (json!({"type": "enabled"}), "thinking.budget_tokens"),
        (
            json!({"type": "enabled", "budget_tokens": 512}),
            "thinking.budget_tokens",
        ),
        (json!({"type": "sometimes"}), "thinking.type"),
    ] {
        let body = json!({"model": "tiny-harmony", "max_tokens": 4, "messages": ask, "thinking": thinking});
        let (status, e) = post(&base, "/v1/messages", body).await;
        assert_eq!(status, 400, "{thinking}: {e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(param),
            "{e}"
        );
    }
}
