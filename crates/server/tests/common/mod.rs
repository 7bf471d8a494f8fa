//! What the server's test files share: the test model, a server config, a server started on a
//! free loopback port, HTTP clients, and running the official Python clients.
#![allow(dead_code)]

use engine::LoadedModel;
use serde_json::Value;
use server::ServerConfig;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub fn model() -> Arc<LoadedModel> {
    static M: OnceLock<Arc<LoadedModel>> = OnceLock::new();
    M.get_or_init(|| {
        let path = models::resolve_model("smollm2-135m").expect("model available");
        Arc::new(LoadedModel::load(&path).expect("model loads"))
    })
    .clone()
}

/// The prefix cache's budget in these tests (a few thousand positions of smollm2-135m).
pub const PREFIX_CACHE_BYTES: usize = 256 << 20;

pub fn config() -> ServerConfig {
    ServerConfig {
        model_names: vec!["smollm2-135m".into()],
        api_keys: Vec::new(),
        corpus_tokens: drafting::DEFAULT_CORPUS_TOKENS,
        prefix_cache_bytes: PREFIX_CACHE_BYTES,
        kv_cache_bytes: None,
        max_num_seqs: 16,
        max_queue: 64,
        max_model_len: 2048,
        max_body_bytes: 64 * 1024,
        spec: drafting::SpecConfig {
            num_speculative_tokens: 8,
            prompt_lookup_max: 3,
            prompt_lookup_min: 1,
            match_policy: drafting::MatchPolicy::Recent,
            adaptive: true,
            ..Default::default()
        },
        cors_origins: Vec::new(),
        lenient: false,
        max_stored_responses: server::DEFAULT_MAX_STORED_RESPONSES,
        stored_responses_bytes: server::DEFAULT_STORED_RESPONSES_BYTES,
        record_requests: None,
        keep_volatile_lines: false,
        prefix_cache_dir: None,
        prefix_cache_dir_bytes: 0,
    }
}

/// Starts a server on a free loopback port; returns its base URL.
pub async fn start(config: ServerConfig) -> String {
    start_with(model(), config).await
}

/// `start` with another model.
pub async fn start_with(lm: Arc<LoadedModel>, config: ServerConfig) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = server::app(lm, config).expect("the server starts");
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    format!("http://{addr}")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

pub async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    post_by(&client(), base, path, body).await
}

/// `post` with a given client (one that sends an API key).
pub async fn post_by(c: &reqwest::Client, base: &str, path: &str, body: Value) -> (u16, Value) {
    let r = c
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A client that sends `key` with every request.
pub fn client_of(key: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = format!("Bearer {key}").parse().unwrap();
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .default_headers(headers)
        .build()
        .unwrap()
}

/// Runs a Python script (the openai client's tests) off the async workers; fails with its output
/// unless it succeeds.
pub async fn run_python(script: String) {
    python_clients();
    run_python_with(vec!["-c".into(), script], None, "the python client script").await;
}

/// Runs `python3 ARGS` (in `dir`) off the async workers; fails with its output unless it succeeds.
async fn run_python_with(args: Vec<String>, dir: Option<&'static str>, what: &str) {
    let out = tokio::task::spawn_blocking(move || {
        let mut c = std::process::Command::new("python3");
        c.args(&args);
        if let Some(d) = dir {
            c.current_dir(d);
        }
        c.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Installs the official Python clients the tests drive, unless they are there.
pub fn python_clients() {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import openai, anthropic, jsonschema, pydantic"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        let st = std::process::Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "openai",
                "anthropic",
                "jsonschema",
            ])
            .status()
            .expect("python3 runs");
        assert!(
            st.success(),
            "pip install openai anthropic jsonschema failed"
        );
    }
}

/// Runs one of the client scripts in `tests/clients` with these arguments; fails with its output
/// unless it succeeds.
pub async fn run_client(script: &str, args: Vec<String>) {
    python_clients();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients");
    let args = [vec![format!("{dir}/{script}")], args].concat();
    run_python_with(args, Some(dir), script).await;
}

/// The server's `/metrics` page at `base`, as `c` reads it.
pub async fn metrics_by(c: &reqwest::Client, base: &str) -> String {
    c.get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of metric `name` on the server at `base` (as `c` reads `/metrics`), NaN when absent.
pub async fn metric_by(c: &reqwest::Client, base: &str, name: &str) -> f64 {
    let m = metrics_by(c, base).await;
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN)
}

/// A memory line of this process's `/proc/self/status` in kB (`VmRSS`, `VmHWM`; the servers the
/// tests start run in it), where Linux tells it.
pub fn status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// Starts a new window for `VmHWM` (Linux's `clear_refs`); where it is refused, the peak since
/// start is what `status_kb("VmHWM")` reads.
pub fn reset_peak_resident() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}
