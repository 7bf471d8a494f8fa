//! Every error case in OpenAI's shape, the API key, and strict requests that name the field at
//! fault.

use super::*;

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
    still_serving(&base).await;
}

/// llama.cpp's constraints (a json_object with a schema, a top-level json_schema, a GBNF
/// grammar) are honoured, one per request; a bad grammar is refused naming `grammar`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grammars_and_schemas_constrain_or_are_refused() {
    let mut c = config();
    c.max_model_len = 64;
    let base = start(c).await;
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
    still_serving(&base).await;
}

/// A final assistant message is continued, implicitly or with vLLM's `continue_final_message`;
/// what cannot be continued is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn final_assistant_message_is_continued() {
    let mut c = config();
    c.max_model_len = 64;
    let base = start(c).await;
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
    still_serving(&base).await;
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
    let metrics = metrics_by(&client(), &base).await;
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
