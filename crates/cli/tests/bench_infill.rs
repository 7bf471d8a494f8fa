//! `pld bench infill` end to end: an editing session replayed through pld's two servers on
//! qwen-coder-0.5b (a model with fill-in-the-middle tokens), its report's shape, speculative
//! completions equal to plain ones, drafts taken from the extra chunks; and clean failures for a
//! model without those tokens and a range past the end of the file.

use serde_json::Value;
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

fn assert_clean_failure(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success: {err}");
    assert!(err.contains(needle), "message lacks {needle:?}: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
}

/// A file of the repository, as the held-out code.
fn held_out() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/editing_session/replay.py")
}

#[test]
fn bench_infill_reports_each_request_and_speculation_changes_no_completion() {
    let file = held_out();
    let text = std::fs::read_to_string(&file).unwrap();
    // One line typed, near the end of the file: its text is in the ring (the file's own last
    // chunks, as llama.vim picks them around the cursor), so drafts come from the chunks.
    let start = text
        .lines()
        .position(|l| l == "    if args.json:")
        .expect("the line");
    let line = text.lines().nth(start).unwrap();
    let words = line.split(' ').filter(|w| !w.is_empty()).count();
    let f = file.to_str().unwrap();
    let start_flag = start.to_string();
    let o = pld(&[
        "bench",
        "infill",
        "--model",
        "qwen-coder-0.5b",
        "--file",
        f,
        "--start",
        &start_flag,
        "--lines",
        "1",
        "--context",
        f,
        "--n-prefix",
        "16",
        "--n-suffix",
        "8",
        "--n-predict",
        "16",
        "--ring-chunks",
        "2",
        "--chunk-lines",
        "16",
        "--t-max-predict-ms",
        "0",
        "--threads",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in ["machine", "kernels", "kv_cache_dtype"] {
        assert!(v[k].as_str().is_some_and(|s| !s.is_empty()), "{k}: {v}");
    }
    // The model's own name, from its GGUF.
    assert!(v["model"].as_str().unwrap().contains("0.5B"), "{v}");
    assert_eq!(v["threads"], 2);
    assert_eq!(v["session"]["chunks"], 2);
    assert_eq!(v["mismatches"], 0);
    assert!(v["speedup"]["total"].as_f64().unwrap() > 0.0, "{v}");
    let modes = v["modes"].as_array().unwrap();
    let names: Vec<&str> = modes.iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(names, ["plain", "speculative"]);
    let requests = |m: &Value| m["requests"].as_array().unwrap().clone();
    let (plain, fast) = (requests(&modes[0]), requests(&modes[1]));
    // At the line's start and after each word.
    assert_eq!(plain.len(), words + 1, "{line}");
    assert_eq!(plain[0]["col"], 0);
    assert_eq!(plain[words]["col"], line.chars().count());
    for (p, s) in plain.iter().zip(&fast) {
        assert_eq!(p["content"], s["content"], "{p} {s}");
        assert_eq!(p["col"], s["col"]);
    }
    for m in modes {
        let r = requests(m);
        for x in &r {
            let prompt = x["prompt_tokens"].as_u64().unwrap();
            let (cached, prefilled) = (x["cached_tokens"].as_u64(), x["prefilled_tokens"].as_u64());
            assert!(prompt > 200, "{x}");
            assert_eq!(cached.unwrap() + prefilled.unwrap(), prompt, "{x}");
            assert!(x["predicted_tokens"].as_u64().unwrap() >= 1, "{x}");
        }
        // Within the line only the typed words change, at the prompt's end: the prefix cache
        // serves the rest (whole blocks of 16, so at most 15 cached positions recomputed).
        for x in &r[1..] {
            assert!(x["prefilled_tokens"].as_u64() < Some(40), "{x}");
        }
        // The ring update put the chunks in the cache: every completion starts from them.
        assert!(
            r.iter().all(|x| x["cached_tokens"].as_u64() >= Some(128)),
            "{m}"
        );
        let t = &m["summary"];
        let total: f64 = r.iter().map(|x| x["seconds"].as_f64().unwrap()).sum();
        assert!((t["total_s"].as_f64().unwrap() - total).abs() < 1e-9, "{t}");
        assert!(t["median_s"].as_f64() <= t["p95_s"].as_f64(), "{t}");
        assert_eq!(t["requests"], words + 1);
    }
    // Plain decoding emits one token a pass; the speculative server copies from the chunks.
    assert_eq!(modes[0]["summary"]["tokens_per_pass"], 1.0);
    let fast = &modes[1]["summary"];
    assert!(fast["tokens_per_pass"].as_f64().unwrap() > 1.0, "{fast}");
    assert!(
        fast["accepted_by_source"]["ngram"].as_u64().unwrap() > 0,
        "{fast}"
    );
}

#[test]
fn bench_infill_refuses_what_it_cannot_replay() {
    let f = held_out();
    let f = f.to_str().unwrap();
    let o = pld(&[
        "bench",
        "infill",
        "--model",
        "smollm2-135m",
        "--file",
        f,
        "--lines",
        "1",
    ]);
    assert_clean_failure(&o, "has no fill-in-the-middle tokens");
    let o = pld(&[
        "bench", "infill", "--file", f, "--start", "100000", "--lines", "1",
    ]);
    assert_clean_failure(&o, "runs past the end of");
}
