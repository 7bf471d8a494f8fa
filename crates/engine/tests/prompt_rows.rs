//! A prompt's rows may take another arithmetic than generated rows (`kernels::RowKind`: the Amx
//! class computes them on bf16 tiles). Whatever the class, a request's output depends only on
//! its tokens: a prompt gives the same bits in any chunking and beside other sequences' rows, and
//! a later turn whose prompt holds an earlier turn's output gives, from the prefix cache in memory
//! or on disk, what it gives cold, with and without drafts.

mod common;

use common::*;
use drafting::SpecConfig;
use engine::kv_cache::KvCache;
use engine::model::{BatchItem, Model};
use engine::prefix_cache::PrefixCache;
use engine::{GenerationConfig, LoadedModel, Message};

/// The alias of a model whose products take the prompt rows' arithmetic where the class has one
/// (Q4_K and Q6_K matrices).
const MODEL: &str = "qwen-coder-0.5b";

fn prompt_of(lm: &LoadedModel, words: usize) -> Vec<u32> {
    let fx = fixture("qwen2.5-coder-0.5b-instruct.json");
    let text: String = (0..words)
        .map(|i| fx.generation[i % fx.generation.len()].prompt_text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    lm.tokenizer.encode_prompt(&text).unwrap()
}

/// Prefills `prompt` in passes of `chunk` prompt rows (the last pass `last` rows, when given),
/// then feeds `cont` one generated row at a time: the prompt's last logits row, then each
/// generated row's.
fn chunked(m: &Model, prompt: &[u32], (chunk, last): (usize, usize), cont: &[u32]) -> Vec<f32> {
    let mut cache = m.new_cache(prompt.len() + cont.len() + 1);
    let mut rows = Vec::new();
    let (head, tail) = prompt.split_at(prompt.len() - last);
    for part in head.chunks(chunk).chain(tail.chunks(chunk)) {
        rows = pass(m, &mut cache, part, true);
    }
    for t in cont {
        rows.extend(pass(m, &mut cache, &[*t], false));
    }
    rows
}

fn pass(m: &Model, cache: &mut KvCache, tokens: &[u32], prompt: bool) -> Vec<f32> {
    m.forward(&mut [BatchItem {
        tokens,
        cache,
        all_logits: !prompt,
        prompt,
        parents: &[],
    }])
    .unwrap()
}

#[test]
fn a_prompt_gives_the_same_bits_in_any_chunking() {
    let lm = model(MODEL);
    let prompt = prompt_of(&lm, 6);
    assert!(prompt.len() > 300, "a prompt of {} tokens", prompt.len());
    let cont = [11u32, 279, 1156, 13];
    let whole = chunked(&lm.model, &prompt, (prompt.len(), 0), &cont);
    // Chunks of many rows, of part tiles, and a last prompt row alone (as a fork's first pass).
    let chunk = engine::step::PREFILL_CHUNK;
    for split in [(chunk, 0), (100, 0), (17, 0), (prompt.len(), 1), (chunk, 3)] {
        let got = chunked(&lm.model, &prompt, split, &cont);
        assert!(got == whole, "chunks {split:?} give other logits");
    }
}

#[test]
fn prompt_rows_beside_generated_rows_keep_their_bits() {
    let lm = model(MODEL);
    let m = &lm.model;
    let (a, b) = (prompt_of(&lm, 2), prompt_of(&lm, 3));
    // Sequence b is decoding (its prompt in), sequence a feeds its prompt.
    let new_b = |m: &Model| {
        let mut cache = m.new_cache(b.len() + 8);
        pass(m, &mut cache, &b, true);
        cache
    };
    let mut ca = m.new_cache(a.len() + 8);
    let mut cb = new_b(m);
    let drafts = [11u32, 279, 1156];
    let together = m
        .forward(&mut [
            BatchItem {
                tokens: &a,
                cache: &mut ca,
                all_logits: false,
                prompt: true,
                parents: &[],
            },
            BatchItem {
                tokens: &drafts,
                cache: &mut cb,
                all_logits: true,
                prompt: false,
                parents: &[],
            },
        ])
        .unwrap();
    let alone_a = pass(m, &mut m.new_cache(a.len() + 8), &a, true);
    let alone_b = pass(m, &mut new_b(m), &drafts, false);
    let vocab = m.config.vocab_size;
    assert!(together[..vocab] == alone_a[..], "the prompt's row");
    assert!(together[vocab..] == alone_b[..], "the generated rows");
}

fn greedy(k: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: 24,
        speculation: SpecConfig {
            num_speculative_tokens: k,
            adaptive: false,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Turn 1, then turn 2 (turn 1's prompt, its answer and a new question) through `prefix`: turn
/// 2's output.
fn second_turn(lm: &LoadedModel, prefix: Option<&mut PrefixCache>, k: usize) -> (Vec<u32>, usize) {
    let first = vec![Message::new(
        "user",
        "Write a Rust function that adds two numbers.",
    )];
    let render = |msgs: &[Message]| {
        let text = lm.render_chat(msgs).unwrap();
        lm.tokenizer.encode_prompt(&text).unwrap()
    };
    let mut prefix = prefix;
    let run = |prompt: Vec<u32>, prefix: Option<&mut PrefixCache>| {
        engine::generate_reusing(
            &lm.model,
            &lm.tokenizer,
            prompt,
            greedy(k),
            4096,
            prefix,
            |_| true,
        )
        .unwrap()
    };
    let one = run(render(&first), prefix.as_deref_mut());
    let mut second = first.clone();
    second.push(Message::new("assistant", &one.text));
    second.push(Message::new("user", "Now make it subtract them."));
    let two = run(render(&second), prefix);
    (two.token_ids, two.cached_tokens)
}

#[test]
fn a_later_turn_from_the_prefix_cache_equals_a_cold_one() {
    let lm = model(MODEL);
    let path = models::resolve_model(MODEL).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        PrefixCache::open(
            &path,
            lm.model.kv_shape(),
            64 << 20,
            Some(dir.path()),
            1 << 30,
        )
    };
    for k in [0, 4] {
        let (cold, _) = second_turn(&lm, None, k);
        let mut memory = open().unwrap();
        let (warm, cached) = second_turn(&lm, Some(&mut memory), k);
        assert!(cached > 0, "k {k}: turn 2 took nothing from the cache");
        assert_eq!(warm, cold, "k {k}: from memory");
        drop(memory);
        // A new process's cache: turn 1's blocks come from the directory.
        let mut disk = open().unwrap();
        let (again, cached) = second_turn(&lm, Some(&mut disk), k);
        assert!(cached > 0, "k {k}: turn 2 took nothing from the directory");
        assert_eq!(again, cold, "k {k}: from disk");
    }
}
