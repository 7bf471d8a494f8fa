//! Prompt lookup decoding on real models: speculative greedy output equals plain greedy output token
//! for token, drafts are really accepted on grounded prompts, and the edge cases (short prompts,
//! EOS or max tokens inside an accepted run, stop strings, a full context) end where plain decoding
//! ends.

mod common;

use common::*;
use drafting::{SpecConfig, SpecMethod};
use engine::{FinishReason, GenerationConfig, GenerationOutput, LoadedModel, Message};

fn run(lm: &LoadedModel, prompt: &[u32], config: GenerationConfig, ctx: usize) -> GenerationOutput {
    engine::generate(
        &lm.model,
        &lm.tokenizer,
        prompt.to_vec(),
        config,
        ctx,
        |_| {},
    )
    .expect("generation runs")
}

fn greedy(max_new_tokens: usize, k: usize, min_n: usize, max_n: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        speculation: SpecConfig {
            num_speculative_tokens: k,
            prompt_lookup_min: min_n,
            prompt_lookup_max: max_n,
            // Every draft goes to verification, whatever the timings: these tests check what the
            // verifier does with drafts, so the drafts must not depend on how busy the machine is.
            adaptive: false,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn assert_same(alias: &str, what: &str, plain: &GenerationOutput, spec: &GenerationOutput) {
    assert_eq!(
        plain.token_ids, spec.token_ids,
        "{alias} {what}: speculative tokens differ from plain decoding"
    );
    assert_eq!(plain.text, spec.text, "{alias} {what}: text differs");
    assert_eq!(plain.finish_reason, spec.finish_reason, "{alias} {what}");
}

/// A grounded prompt from the dev workload, rendered with the model's template.
fn grounded_prompt(lm: &LoadedModel, category: &str) -> Vec<u32> {
    let path = repo_dir().join("workloads").join("grounded-dev.jsonl");
    let text = std::fs::read_to_string(&path).expect("grounded-dev.jsonl");
    let row: serde_json::Value = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["category"] == category)
        .expect("a row of the category");
    let turn = row["turns"][0].as_str().unwrap();
    let prompt = lm.render_chat(&[Message::new("user", turn)]).unwrap();
    lm.tokenizer.encode_prompt(&prompt).unwrap()
}

#[test]
fn greedy_identity_over_k_and_ngram_ranges() {
    for (alias, file) in FIXTURE_MODELS {
        let fx = fixture(file);
        let lm = model(alias);
        for case in &fx.generation {
            let plain = run(&lm, &case.prompt_ids, greedy(64, 0, 1, 1), 4096);
            assert_eq!(plain.stats.mean_accepted_tokens(), 1.0);
            // The whole grid on the small model; on the larger one (four times the time per
            // token) a short and a long draft with different n-gram ranges.
            let grid: Vec<(usize, usize, usize)> = if alias == "smollm2-135m" {
                [1, 2, 4, 8, 16]
                    .into_iter()
                    .flat_map(|k| [(k, 1, 1), (k, 1, 3), (k, 2, 4)])
                    .collect()
            } else {
                vec![(2, 1, 3), (8, 2, 4)]
            };
            for (k, min_n, max_n) in grid {
                let spec = run(&lm, &case.prompt_ids, greedy(64, k, min_n, max_n), 4096);
                let what = format!("{} K={k} n={min_n}..{max_n}", case.name);
                assert_same(alias, &what, &plain, &spec);
                assert!(spec.stats.draft_tokens <= k * spec.stats.steps);
            }
        }
    }
}

/// Greedy settings that draft trees: `max_nodes` nodes at most, up to 8 deep, from the n-gram
/// index and the model's own earlier predictions.
fn tree(max_new_tokens: usize, max_nodes: usize, adaptive: bool) -> GenerationConfig {
    let mut c = greedy(max_new_tokens, 8, 1, 3);
    c.speculation.method = SpecMethod::Tree;
    c.speculation.tree_max_nodes = max_nodes;
    c.speculation.adaptive = adaptive;
    c
}

#[test]
fn tree_drafts_give_plain_greedy_output() {
    for (alias, file) in FIXTURE_MODELS {
        let fx = fixture(file);
        let lm = model(alias);
        for case in &fx.generation {
            let plain = run(&lm, &case.prompt_ids, greedy(48, 0, 1, 1), 4096);
            // Every tree setting on the small model, the fixed 24-node tree on the larger one.
            let settings: &[(usize, bool)] = if alias == "smollm2-135m" {
                &[(24, false), (63, false), (24, true)]
            } else {
                &[(24, false)]
            };
            for &(nodes, adaptive) in settings {
                let spec = run(&lm, &case.prompt_ids, tree(48, nodes, adaptive), 4096);
                let what = format!("{} tree of {nodes} nodes, adaptive {adaptive}", case.name);
                assert_same(alias, &what, &plain, &spec);
                assert!(spec.stats.draft_tokens <= nodes * spec.stats.steps);
                if !adaptive {
                    // Trees were really sent and some branch was really taken.
                    assert!(
                        spec.stats.drafted_by_source[drafting::Source::Model] > 0,
                        "{what}: {:?}",
                        spec.stats
                    );
                    assert!(spec.stats.accepted_tokens > 0, "{what}: {:?}", spec.stats);
                }
            }
        }
    }
}

/// Trees and chains of different sequences share passes as the server batches them: each
/// sequence's output is still its plain greedy output.
#[test]
fn trees_and_chains_batched_together_stay_exact() {
    let lm = model("smollm2-135m");
    let prompts = [
        grounded_prompt(&lm, "code_edit"),
        grounded_prompt(&lm, "json_extraction"),
        grounded_prompt(&lm, "code_edit"),
    ];
    let configs = [tree(64, 24, false), greedy(64, 8, 1, 3), tree(64, 8, true)];
    let mut seqs: Vec<engine::Sequence> = prompts
        .iter()
        .zip(&configs)
        .map(|(p, c)| engine::Sequence::new(&lm.model, p.clone(), c.clone(), 4096).unwrap())
        .collect();
    while seqs.iter().any(|s| !s.is_finished()) {
        let mut refs: Vec<&mut engine::Sequence> = seqs.iter_mut().collect();
        engine::step(&lm.model, &lm.tokenizer, &mut refs).unwrap();
    }
    for (i, (seq, prompt)) in seqs.into_iter().zip(&prompts).enumerate() {
        let plain = run(&lm, prompt, greedy(64, 0, 1, 1), 4096);
        let out = seq.into_output();
        assert_eq!(plain.token_ids, out.token_ids, "sequence {i} of the batch");
    }
}

/// Prompts arriving together are fed at most `PROMPT_ROWS_PER_PASS` prompt rows a pass, whole
/// chunks, beside the decoding sequences: the first prefilling sequence first, then the others
/// by the rows they have left, shortest first (a short prompt overtakes a longer one); each
/// sequence still gives its plain output.
#[test]
fn prompts_share_passes_within_the_prompt_row_budget() {
    let lm = model("smollm2-135m");
    let long = grounded_prompt(&lm, "json_extraction");
    let chunk = engine::step::PREFILL_CHUNK;
    assert_eq!(engine::step::PROMPT_ROWS_PER_PASS, 2 * chunk);
    assert!(long.len() >= 2 * chunk + 88, "{} prompt tokens", long.len());
    let prompts: Vec<Vec<u32>> = [2 * chunk + 88, chunk + 44, 100]
        .iter()
        .map(|&n| long[..n].to_vec())
        .collect();
    let mut seqs: Vec<engine::Sequence> = prompts
        .iter()
        .map(|p| engine::Sequence::new(&lm.model, p.clone(), greedy(24, 8, 1, 3), 4096).unwrap())
        .collect();
    let pass = |seqs: &mut Vec<engine::Sequence>| {
        let mut refs: Vec<&mut engine::Sequence> = seqs.iter_mut().collect();
        engine::step(&lm.model, &lm.tokenizer, &mut refs).unwrap();
        seqs.iter().map(|s| s.positions()).collect::<Vec<_>>()
    };
    // The first prompt's chunk, then the shortest (100 rows); the middle one's chunk would pass
    // the budget and waits.
    assert_eq!(pass(&mut seqs), [chunk, 0, 100]);
    // Two whole chunks (the third sequence decodes beside them), then both prompts' rests.
    let second = pass(&mut seqs);
    assert_eq!(second[..2], [2 * chunk, chunk]);
    assert!(second[2] > 100, "the third sequence decoded");
    assert_eq!(pass(&mut seqs)[..2], [2 * chunk + 88, chunk + 44]);
    assert!(seqs.iter().all(|s| !s.in_prefill()));
    while seqs.iter().any(|s| !s.is_finished()) {
        pass(&mut seqs);
    }
    for (i, (seq, prompt)) in seqs.into_iter().zip(&prompts).enumerate() {
        let plain = run(&lm, prompt, greedy(24, 0, 1, 1), 4096);
        assert_eq!(plain.token_ids, seq.into_output().token_ids, "sequence {i}");
    }
}

/// A fork shares its parent's prompt cache (all but the last prompt token) and runs that token
/// itself: under greedy decoding it produces exactly what its parent does.
#[test]
fn a_forked_sequence_continues_from_the_shared_prompt() {
    let lm = model("smollm2-135m");
    let prompt = grounded_prompt(&lm, "json_extraction");
    let mut parent =
        engine::Sequence::new(&lm.model, prompt.clone(), greedy(32, 8, 1, 3), 4096).unwrap();
    assert!(
        parent.fork(&lm.model, None).unwrap().is_none(),
        "no fork before the prompt is in"
    );
    let mut fork = None;
    while !parent.is_finished() {
        engine::step(&lm.model, &lm.tokenizer, &mut [&mut parent]).unwrap();
        if fork.is_none() {
            fork = parent.fork(&lm.model, None).unwrap();
        }
    }
    let mut fork = fork.expect("forked after prefill");
    while !fork.is_finished() {
        engine::step(&lm.model, &lm.tokenizer, &mut [&mut fork]).unwrap();
    }
    let (a, b) = (parent.into_output(), fork.into_output());
    assert_eq!(a.token_ids, b.token_ids);
    assert_eq!(b.prompt_token_ids, prompt);
}

#[test]
fn grounded_prompts_accept_drafts_and_stay_identical() {
    let lm = model("smollm2-135m");
    for category in ["code_edit", "json_extraction"] {
        let prompt = grounded_prompt(&lm, category);
        let plain = run(&lm, &prompt, greedy(96, 0, 1, 1), 4096);
        let spec = run(&lm, &prompt, greedy(96, 8, 1, 3), 4096);
        assert_same("smollm2-135m", category, &plain, &spec);
        assert!(
            spec.stats.accepted_tokens > 0,
            "{category}: no draft was accepted ({:?})",
            spec.stats
        );
        assert!(
            spec.stats.steps < plain.stats.steps,
            "{category}: fewer passes expected"
        );
        assert!(spec.stats.mean_accepted_tokens() > 1.0);
        // Draft lengths chosen from measured pass costs change nothing in the output either.
        let mut adaptive = greedy(96, 8, 1, 3);
        adaptive.speculation.adaptive = true;
        let spec = run(&lm, &prompt, adaptive, 4096);
        assert_same("smollm2-135m", category, &plain, &spec);
        assert!(spec.stats.draft_tokens <= 8 * spec.stats.steps);
        // A tree keeps the n-gram chain's branches and adds the model's: at least as many
        // tokens per pass, and never a different output.
        let t = run(&lm, &prompt, tree(96, 32, false), 4096);
        assert_same("smollm2-135m", &format!("{category} tree"), &plain, &t);
        assert!(
            t.stats.accepted_by_source[drafting::Source::Ngram] > 0,
            "{:?}",
            t.stats
        );
        assert!(t.stats.steps < plain.stats.steps);
    }
}

/// Every KV cache number type keeps speculative output (chains and trees) equal to plain output
/// on a grounded prompt where drafts are accepted: every type by name, whatever the default (bf16
/// on AMX and AVX-512, f32 elsewhere) that the tests above run.
#[test]
fn every_cache_type_keeps_speculation_exact() {
    use engine::kv_cache::KvDtype;
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Q8] {
        let lm = model_caching("smollm2-135m", dtype);
        let prompt = grounded_prompt(&lm, "code_edit");
        let plain = run(&lm, &prompt, greedy(64, 0, 1, 1), 4096);
        let spec = run(&lm, &prompt, greedy(64, 8, 1, 3), 4096);
        let what = format!("code_edit, {} cache", dtype.name());
        assert_same("smollm2-135m", &what, &plain, &spec);
        assert!(spec.stats.accepted_tokens > 0, "{what}: {:?}", spec.stats);
        let t = run(&lm, &prompt, tree(64, 32, false), 4096);
        assert_same("smollm2-135m", &format!("{what}, tree"), &plain, &t);
    }
}

#[test]
fn edge_cases_end_where_plain_decoding_ends() {
    let alias = "smollm2-135m";
    let lm = model(alias);
    // A prompt shorter than the n-gram.
    let short = lm.tokenizer.encode("Hi").unwrap();
    let plain = run(&lm, &short, greedy(24, 0, 1, 1), 4096);
    let spec = run(&lm, &short, greedy(24, 4, 3, 4), 4096);
    assert_same(alias, "short prompt", &plain, &spec);

    // EOS inside a draft: the answer was already given word for word in an earlier turn, so the
    // drafts copy it, end-of-turn token included.
    let answer = "The capital of France is Paris.";
    let messages = [
        Message::new(
            "user",
            "What is the capital of France? Answer in one sentence.",
        ),
        Message::new("assistant", answer),
        Message::new(
            "user",
            "What is the capital of France? Answer in one sentence.",
        ),
    ];
    let prompt = lm
        .tokenizer
        .encode_prompt(&lm.render_chat(&messages).unwrap())
        .unwrap();
    let plain = run(&lm, &prompt, greedy(64, 0, 1, 1), 4096);
    let spec = run(&lm, &prompt, greedy(64, 16, 1, 3), 4096);
    assert_same(alias, "eos in draft", &plain, &spec);
    assert_eq!(spec.finish_reason, FinishReason::Stop);
    assert!(
        lm.tokenizer.is_end(*spec.token_ids.last().unwrap()),
        "ends on the end-of-turn token"
    );
    assert!(
        spec.stats.accepted_tokens > 0,
        "the copied answer was drafted"
    );

    // Max tokens inside an accepted run: exactly max_new_tokens tokens.
    let code = grounded_prompt(&lm, "code_edit");
    let long_plain = run(&lm, &code, greedy(80, 0, 1, 1), 4096);
    for max in [1, 2, 7, 33] {
        let spec = run(&lm, &code, greedy(max, 16, 1, 3), 4096);
        assert_eq!(spec.token_ids.len(), max, "max_new_tokens {max}");
        assert_eq!(spec.token_ids[..], long_plain.token_ids[..max]);
        assert_eq!(spec.finish_reason, FinishReason::Length);
    }

    // Stop strings reached inside an accepted run.
    let stop_at = {
        let t = &long_plain.text;
        let mid = t.char_indices().nth(t.chars().count() / 2).unwrap().0;
        t[mid..].chars().take(3).collect::<String>()
    };
    let mut with_stop = greedy(80, 0, 1, 1);
    with_stop.stop = vec![stop_at.clone()];
    let plain = run(&lm, &code, with_stop.clone(), 4096);
    with_stop.speculation.num_speculative_tokens = 16;
    with_stop.speculation.prompt_lookup_max = 3;
    let spec = run(&lm, &code, with_stop, 4096);
    assert_eq!(plain.text, spec.text, "stop string {stop_at:?}");
    assert!(!spec.text.contains(&stop_at));
    assert_eq!(spec.finish_reason, FinishReason::Stop);

    // Drafts clipped at the end of the context: the cache holds the prompt and 20 more.
    let ctx = code.len() + 20;
    let plain = run(&lm, &code, greedy(200, 0, 1, 1), ctx);
    let spec = run(&lm, &code, greedy(200, 16, 1, 3), ctx);
    assert_same(alias, "full context", &plain, &spec);
    assert_eq!(spec.finish_reason, FinishReason::Length);
    assert!(code.len() + spec.token_ids.len() <= ctx);
    // A tree's nodes each take a cache slot: near the end it must shrink to what fits.
    let spec = run(&lm, &code, tree(200, 32, false), ctx);
    assert_same(alias, "full context, tree", &plain, &spec);
}

/// Log-probabilities come from the logit row that predicted each token; a verification pass
/// computes each row exactly as a single-token pass would, so speculative and plain decoding report
/// the same numbers, bit for bit.
#[test]
fn logprobs_are_identical_with_and_without_speculation() {
    let lm = model("smollm2-135m");
    let prompt = grounded_prompt(&lm, "code_edit");
    let with_logprobs = |k: usize| GenerationConfig {
        logprobs: Some(3),
        ..greedy(32, k, 1, 3)
    };
    let plain = run(&lm, &prompt, with_logprobs(0), 4096);
    let spec = run(&lm, &prompt, with_logprobs(8), 4096);
    assert_same("smollm2-135m", "logprobs", &plain, &spec);
    assert!(spec.stats.accepted_tokens > 0, "drafts were accepted");
    assert_eq!(plain.logprobs, spec.logprobs);
    // Through a tree: each token's row is its parent node's, wherever that sat in the pass.
    let t = run(
        &lm,
        &prompt,
        GenerationConfig {
            logprobs: Some(3),
            ..tree(32, 24, false)
        },
        4096,
    );
    assert!(t.stats.accepted_tokens > 0, "tree drafts were accepted");
    assert_eq!(plain.logprobs, t.logprobs);
    let ended_by_eos = plain.finish_reason == FinishReason::Stop;
    assert_eq!(
        plain.logprobs.len() + usize::from(ended_by_eos),
        plain.token_ids.len(),
        "one entry per generated token (the end-of-turn token has none)"
    );
    for (lp, &t) in plain.logprobs.iter().zip(&plain.token_ids) {
        assert_eq!(lp.token, t);
        assert!(lp.logprob <= 0.0);
        assert_eq!(lp.top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(lp.top[0], (t, lp.logprob));
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
        let mass: f32 = lp.top.iter().map(|(_, p)| p.exp()).sum();
        assert!(mass <= 1.0 + 1e-4);
    }
}

#[test]
fn seeded_sampling_is_reproducible_with_and_without_speculation() {
    let lm = model("smollm2-135m");
    let prompt = grounded_prompt(&lm, "code_edit");
    for k in [0, 8] {
        let mut c = greedy(40, k, 1, 3);
        c.sampling.do_sample = true;
        c.sampling.temperature = 1.0;
        c.sampling.top_p = 0.95;
        c.seed = Some(42);
        let a = run(&lm, &prompt, c.clone(), 4096);
        let b = run(&lm, &prompt, c.clone(), 4096);
        assert_eq!(a.token_ids, b.token_ids, "K={k}: same seed, same tokens");
        // Copying code is near-certain even when sampling, so one other seed may well give the
        // same tokens; among several, some must differ.
        let differs = (43..48).any(|seed| {
            c.seed = Some(seed);
            run(&lm, &prompt, c.clone(), 4096).token_ids != a.token_ids
        });
        assert!(differs, "K={k}: other seeds, other tokens");
    }
}

#[test]
fn prompt_longer_than_context_is_an_error() {
    let lm = model("smollm2-135m");
    let prompt = grounded_prompt(&lm, "code_edit");
    let err = engine::generate(
        &lm.model,
        &lm.tokenizer,
        prompt.clone(),
        greedy(8, 0, 1, 1),
        prompt.len(),
        |_| {},
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("prompt is too long"), "{msg}");
    assert!(msg.contains(&prompt.len().to_string()), "{msg}");
}
