//! Corpus drafts, the prefix cache and the model source's predictions, each kept per tenant.

use super::*;

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
            let text = metrics_by(&client_of("alice"), &base).await;
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
            let text = metrics_by(&client_of("alice"), &base).await;
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
