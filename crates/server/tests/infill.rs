//! Fill-in-the-middle over real HTTP on loopback: `/infill` as llama.vim and llama.vscode send
//! it (the whole answer, its `response_fields`, the stream, the prefix cache warmed by a
//! chunks-only request, `t_max_predict_ms`, a client that hangs up) and OpenAI's `suffix` on
//! `/v1/completions` (through the official `openai` client), all with qwen-coder-0.5b, whose
//! vocabulary has the fill-in-the-middle tokens; the middle equals the plain decoding of the same
//! prompt written out by hand, with speculation and without. smollm2-135m has no such tokens:
//! a 400 that says so.

mod common;

use common::*;
use engine::LoadedModel;
use serde_json::{json, Value};
use server::ServerConfig;
use std::io::Write;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

fn coder() -> Arc<LoadedModel> {
    static M: OnceLock<Arc<LoadedModel>> = OnceLock::new();
    M.get_or_init(|| {
        let path = models::resolve_model("qwen-coder-0.5b").expect("model available");
        Arc::new(LoadedModel::load(&path).expect("model loads"))
    })
    .clone()
}

fn coder_config() -> ServerConfig {
    let mut c = config();
    c.model_names = vec!["qwen-coder-0.5b".into()];
    c
}

async fn start_coder() -> String {
    start_with(coder(), coder_config()).await
}

const PREFIX: &str = "def add(a, b):\n";
const PROMPT: &str = "    return ";
const SUFFIX: &str = "\n\n\nprint(add(2, 3))\n";

fn infill(n_predict: i64) -> Value {
    json!({
        "input_prefix": PREFIX,
        "prompt": PROMPT,
        "input_suffix": SUFFIX,
        "n_predict": n_predict,
        "temperature": 0,
    })
}

/// The prompt pld builds for `infill`, written out: the text before the cursor split where
/// `fim::split` says the written middle starts, the written middle after the middle token less
/// its last token, the trailing space of `PROMPT` (token healing: the model's first token must
/// begin with it, and the answer leaves it out).
fn by_hand() -> String {
    let before = format!("{PREFIX}{PROMPT}");
    let (prefix, middle) = before.split_at(engine::fim::split::written_middle_start(&before));
    let middle = middle.trim_end_matches(' ');
    format!("<|fim_prefix|>{prefix}<|fim_suffix|>{SUFFIX}<|fim_middle|>{middle}")
}

/// The prompt pld builds for OpenAI's `suffix`, written out: all of `prompt` is the prefix.
fn by_hand_for_suffix() -> String {
    format!("<|fim_prefix|>{PREFIX}{PROMPT}<|fim_suffix|>{SUFFIX}<|fim_middle|>")
}

fn number(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {v}"))
}

async fn metric(base: &str, name: &str) -> f64 {
    metric_by(&client(), base, name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infill_writes_the_middle_in_llama_servers_shape() {
    let base = start_coder().await;
    let (status, v) = post(&base, "/infill", infill(32)).await;
    assert_eq!(status, 200, "{v}");
    let content = v["content"].as_str().unwrap().to_string();
    assert!(content.starts_with("a + b"), "{v}");
    assert_eq!(v["stop"], true);
    // The model ends the middle with <|endoftext|>, its BOS, which ends no chat turn.
    assert_eq!(v["stop_type"], "eos", "{v}");
    assert!(!content.contains("<|"), "{v}");
    let predicted = number(&v, "tokens_predicted");
    let evaluated = number(&v, "tokens_evaluated");
    assert!((1.0..=32.0).contains(&predicted), "{v}");
    assert_eq!(number(&v, "tokens_cached"), evaluated + predicted);
    let prompt = v["prompt"].as_str().unwrap();
    assert_eq!(
        prompt,
        by_hand(),
        "no chunks: the plain layout, the typed part of the line after the middle token"
    );
    let t = &v["timings"];
    assert_eq!(number(t, "predicted_n"), predicted);
    assert_eq!(number(t, "prompt_n") + number(t, "cache_n"), evaluated);
    for key in [
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    ] {
        assert!(number(t, key) >= 0.0, "{key}: {t}");
    }
    assert_eq!(v["model"], "qwen-coder-0.5b");

    // The same middle from the prompt written out by hand (which the model begins with the
    // healed space), and OpenAI's suffix the same as its prompt by hand, with and without
    // speculation.
    let markers = [
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<|endoftext|>",
    ];
    let (by_hand, for_suffix) = (by_hand(), by_hand_for_suffix());
    let mut suffix_middle = None;
    for spec in [json!(0), json!(8)] {
        let mut body = infill(32);
        body["num_speculative_tokens"] = spec.clone();
        let (s, w) = post(&base, "/infill", body).await;
        assert_eq!(s, 200, "{w}");
        assert_eq!(w["content"], content, "speculation {spec}");
        let (s, c) = post(
            &base,
            "/v1/completions",
            json!({"prompt": format!("{PREFIX}{PROMPT}"), "suffix": SUFFIX, "max_tokens": 16,
                   "temperature": 0, "num_speculative_tokens": spec}),
        )
        .await;
        assert_eq!(s, 200, "{c}");
        let text = c["choices"][0]["text"].clone();
        assert!(text.as_str().unwrap().contains("a + b"), "{c}");
        assert_eq!(suffix_middle.get_or_insert(text.clone()), &text, "{spec}");
        let (s, c) = post(
            &base,
            "/v1/completions",
            json!({"prompt": for_suffix, "max_tokens": 16, "temperature": 0, "stop": markers,
                   "num_speculative_tokens": spec}),
        )
        .await;
        assert_eq!(s, 200, "{c}");
        assert_eq!(
            c["choices"][0]["text"], text,
            "suffix by hand, speculation {spec}"
        );
        let (s, c) = post(
            &base,
            "/v1/completions",
            json!({"prompt": by_hand, "max_tokens": 32, "temperature": 0, "stop": markers,
                   "num_speculative_tokens": spec}),
        )
        .await;
        assert_eq!(s, 200, "{c}");
        assert_eq!(
            c["choices"][0]["text"],
            format!(" {content}"),
            "by hand, speculation {spec}"
        );
    }

    // Chunks of other files in the repository layout; response_fields by path.
    let mut body = infill(16);
    body["input_extra"] = json!([{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n", "time": [1, 2]}]);
    body["response_fields"] = json!(["content", "timings/prompt_n", "prompt", "nothing/here"]);
    let (s, w) = post(&base, "/infill", body).await;
    assert_eq!(s, 200, "{w}");
    let keys: Vec<&String> = w.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 3, "{w}");
    assert!(w["timings/prompt_n"].is_u64(), "{w}");
    assert!(
        w["prompt"].as_str().unwrap().starts_with(
            "<|repo_name|>project\n<|file_sep|>util.py\ndef sub(a, b):\n    return a - b\n<|file_sep|>edited\n<|fim_prefix|>"
        ),
        "{w}"
    );
}

/// A cursor inside a word: ` ret` and `u` are taken back from the prompt and the first token
/// must begin with ` retu` (token healing), so the model writes ` return` whole and the answer
/// goes on from the cursor; the same with speculation (and streamed, in
/// `infill_streams_pieces_then_the_answer`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_inside_a_word_is_healed() {
    let base = start_coder().await;
    let mut body = infill(32);
    body["prompt"] = json!("    retu");
    let (s, v) = post(&base, "/infill", body.clone()).await;
    assert_eq!(s, 200, "{v}");
    let content = v["content"].as_str().unwrap();
    assert!(content.starts_with("rn a + b"), "{v}");
    let prompt = v["prompt"].as_str().unwrap();
    // Nothing of ` retu` is left in the prompt (the rest of the request holds no `ret`).
    assert!(!prompt.contains("ret"), "{v}");
    body["num_speculative_tokens"] = json!(8);
    let (_, w) = post(&base, "/infill", body.clone()).await;
    assert_eq!(w["content"], v["content"], "speculation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infill_streams_pieces_then_the_answer() {
    let base = start_coder().await;
    // The second prompt ends inside a word: the streamed pieces start after the healed text too.
    for prompt in [PROMPT, "    retu"] {
        let mut body = infill(16);
        body["prompt"] = json!(prompt);
        streams_pieces_then_the_answer(&base, body).await;
    }
}

async fn streams_pieces_then_the_answer(base: &str, mut body: Value) {
    let (_, whole) = post(base, "/infill", body.clone()).await;
    body["stream"] = json!(true);
    let r = client()
        .post(format!("{base}/infill"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let (last, pieces) = events.split_last().unwrap();
    assert!(!pieces.is_empty());
    assert!(pieces.iter().all(|e| e["stop"] == false), "{text}");
    let streamed: String = pieces
        .iter()
        .map(|e| e["content"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, whole["content"].as_str().unwrap());
    assert_eq!(last["stop"], true);
    assert_eq!(last["content"], "");
    assert_eq!(last["tokens_predicted"], whole["tokens_predicted"]);
    assert!(last["timings"]["predicted_ms"].is_number());
}

/// llama.vim's two requests as its source builds them (ggml-org/llama.vim a1c8e6e,
/// autoload/llama.vim): the chunks-only request that warms the cache, then a completion, which
/// finds the chunks in the prefix cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_vim_requests_are_served_and_the_chunks_are_cached() {
    let base = start_coder().await;
    let chunk: String = (0..40)
        .map(|i| format!("def f{i}(x):\n    return x * {i}\n"))
        .collect();
    let extra = json!([{"text": chunk, "time": [1733400000, 1], "filename": "lib.py"}]);
    let warm = json!({
        "id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra,
        "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": false,
        "cache_prompt": true, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
        "response_fields": [""],
    });
    let r = client()
        .post(format!("{base}/infill"))
        .json(&warm)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({}));
    let fields = [
        "content",
        "timings/prompt_n",
        "timings/prompt_ms",
        "timings/prompt_per_token_ms",
        "timings/prompt_per_second",
        "timings/predicted_n",
        "timings/predicted_ms",
        "timings/predicted_per_token_ms",
        "timings/predicted_per_second",
        "truncated",
        "tokens_cached",
    ];
    // As llama.vim sends it: an empty model and an empty key when none is set.
    let fim = json!({
        "model": "",
        "id_slot": 0, "input_prefix": "import lib\n\n", "input_suffix": "\n",
        "input_extra": extra, "prompt": "y = lib.f3", "n_predict": 24, "stop": [],
        "n_indent": 0, "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"],
        "stream": false, "cache_prompt": true, "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000, "response_fields": fields,
    });
    let r = client()
        .post(format!("{base}/infill"))
        .header("Authorization", "Bearer ")
        .json(&fim)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let raw = r.text().await.unwrap();
    // llama.vim's quick check of an answer before it decodes it.
    assert!(
        raw.trim_start().starts_with('{') && raw.contains("\"content\":\""),
        "{raw}"
    );
    let v: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(v.as_object().unwrap().len(), fields.len(), "{v}");
    let (prompt_n, cached) = (number(&v, "timings/prompt_n"), number(&v, "tokens_cached"));
    assert!(
        prompt_n < 100.0,
        "the chunk ({} tokens in all) came from the cache: {v}",
        cached
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_from_the_chunks_are_accepted() {
    let base = start_coder().await;
    let body = r#"def normalize(values):
    total = sum(values)
    if total == 0:
        return [0.0 for _ in values]
    return [round(v / total, 4) for v in values]
"#;
    let before = metric(&base, "pld_spec_decode_num_accepted_tokens_total").await;
    let (s, v) = post(
        &base,
        "/infill",
        json!({
            "input_extra": [{"filename": "old/stats.py", "text": body}],
            "input_prefix": "# stats.py\n\n", "prompt": "def normalize(values):\n",
            "input_suffix": "\n\nprint(normalize([1, 2, 3]))\n", "n_predict": 48, "temperature": 0,
        }),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let accepted = metric(&base, "pld_spec_decode_num_accepted_tokens_total").await - before;
    assert!(accepted > 0.0, "drafted from the chunk and accepted: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t_max_predict_ms_ends_at_a_newline() {
    let base = start_coder().await;
    let body = json!({
        "input_prefix": "", "prompt": "def fibonacci(n):\n",
        "input_suffix": "\n\nprint(fibonacci(10))\n", "n_predict": 400, "temperature": 0,
        "t_max_predict_ms": 1,
    });
    let (s, v) = post(&base, "/infill", body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["stop_type"], "limit", "{v}");
    assert!(number(&v, "tokens_predicted") < 400.0, "{v}");
    assert!(v["content"].as_str().unwrap().contains('\n'), "{v}");
}

/// A client that hangs up on a request that is not streamed: its sequence leaves the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_stops_its_request() {
    let base = start_coder().await;
    let addr = base.strip_prefix("http://").unwrap();
    let body = json!({
        "input_prefix": "", "prompt": "numbers = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
        "input_suffix": "", "n_predict": 1800, "temperature": 0,
    })
    .to_string();
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    let request = format!(
        "POST /infill HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).unwrap();
    // The engine times its passes when it starts, then prefills.
    let mut started = false;
    for _ in 0..2400 {
        if metric(&base, "pld_num_requests_running").await == 1.0 {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started, "the request runs");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        metric(&base, "pld_num_requests_running").await,
        1.0,
        "still generating"
    );
    drop(socket);
    let mut freed = false;
    for _ in 0..100 {
        if metric(&base, "pld_num_requests_running").await == 0.0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "the sequence left the batch");
    // Counted when it left, and nothing after.
    let after = metric(&base, "pld_generation_tokens_total").await;
    assert!(after < 1800.0, "{after} tokens: stopped early");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(metric(&base, "pld_generation_tokens_total").await, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_gets_the_middle_from_suffix() {
    let base = start_coder().await;
    let (_, v) = post(
        &base,
        "/v1/completions",
        json!({"prompt": format!("{PREFIX}{PROMPT}"), "suffix": SUFFIX, "max_tokens": 16,
               "temperature": 0}),
    )
    .await;
    let middle = v["choices"][0]["text"].as_str().unwrap();
    let script = format!(
        r#"
import openai
c = openai.OpenAI(base_url="{base}/v1", api_key="none")
r = c.completions.create(model="qwen-coder-0.5b", prompt={prompt}, suffix={suffix}, max_tokens=16, temperature=0)
assert r.choices[0].text == {middle}, r
assert "a + b" in r.choices[0].text, r
parts = [ch.choices[0].text for ch in c.completions.create(model="qwen-coder-0.5b", prompt={prompt}, suffix={suffix}, max_tokens=16, temperature=0, stream=True) if ch.choices]
assert "".join(parts) == {middle}, parts
print("ok")
"#,
        prompt = json!(format!("{PREFIX}{PROMPT}")),
        suffix = json!(SUFFIX),
        middle = json!(middle),
    );
    run_python(script).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_fim_tokens_says_so() {
    let base = start(config()).await;
    let (s, v) = post(&base, "/infill", infill(8)).await;
    assert_eq!(s, 400, "{v}");
    let e = &v["error"];
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("no fill-in-the-middle tokens"),
        "{v}"
    );
    assert_eq!(e["param"], "input_prefix");
    assert_eq!(e["code"], "fim_not_supported");
    let completion = |suffix: Value| json!({"prompt": "The capital of France is", "suffix": suffix, "max_tokens": 4, "temperature": 0});
    let (s, v) = post(&base, "/v1/completions", completion(json!(" Paris."))).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["param"], "suffix");
    // No suffix, or an empty one, is a plain completion.
    for suffix in [Value::Null, json!("")] {
        let (s, v) = post(&base, "/v1/completions", completion(suffix)).await;
        assert_eq!(s, 200, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infill_fields_are_checked_like_the_other_routes() {
    let base = start_coder().await;
    let mut body = infill(4);
    body["lora"] = json!([{"id": 0, "scale": 0.5}]);
    let (s, v) = post(&base, "/infill", body.clone()).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["param"], "lora");
    let (s, v) = post(&base, "/infill", json!({"input_suffix": ""})).await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("input_prefix"));
    let (s, v) = post(
        &base,
        "/infill",
        json!({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"]["param"]
        .as_str()
        .unwrap()
        .starts_with("input_extra"));
    let mut lenient = coder_config();
    lenient.lenient = true;
    let base = start_with(coder(), lenient).await;
    let (s, v) = post(&base, "/infill", body).await;
    assert_eq!(s, 200, "lenient: dropped and logged: {v}");
}
