//! Under load: disconnects and a full queue, batching that does not change results, and a soak
//! of mixed requests.

use super::*;
use std::sync::Arc;
use std::time::Duration;

async fn running(base: &str) -> u64 {
    gauge(base, "pld_num_requests_running").await
}

async fn waiting(base: &str) -> u64 {
    gauge(base, "pld_num_requests_waiting").await
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
