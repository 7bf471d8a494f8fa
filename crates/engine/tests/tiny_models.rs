//! Every architecture without a real model here, on tiny random-weight checkpoints made with
//! Hugging Face transformers (`tools/tiny_models/make.py`, committed with their reference outputs
//! in `tests/tiny/`): logits against transformers' float32 ones, our greedy decoding against its,
//! a batched pass bit-identical to single steps, and speculative greedy output equal to plain.

mod common;

use common::log_softmax;
use engine::kv_cache::{KvCache, KvDtype};
use engine::model::BatchItem;
use engine::prefix_cache::BLOCK_TOKENS;
use engine::weights::Precision;
use engine::{GenerationConfig, LoadedModel, PrefixCache};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Deserialize)]
struct Reference {
    name: String,
    arch: String,
    gguf: String,
    weights: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    ids: Vec<u32>,
    /// Per position of `ids`, the reference's most likely tokens and their log-probabilities.
    top: Vec<Vec<(u32, f32)>>,
    /// The reference's greedy continuation of `ids`.
    greedy: Vec<u32>,
}

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/tiny")
}

/// Every tiny model with its reference, loaded as served.
fn models() -> Vec<(Reference, LoadedModel)> {
    models_at(Precision::Stored)
}

/// Every tiny model with its reference, weights dequantized to f32 (exact products).
fn models_f32() -> Vec<(Reference, LoadedModel)> {
    models_at(Precision::F32)
}

fn models_at(precision: Precision) -> Vec<(Reference, LoadedModel)> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(tiny_dir())
        .expect("tests/tiny exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    names.sort();
    assert!(names.len() >= 5, "the tiny checkpoints are missing");
    names
        .into_iter()
        .map(|p| {
            let r: Reference = serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let lm = LoadedModel::load_with(&tiny_dir().join(&r.gguf), precision)
                .unwrap_or_else(|e| panic!("{} does not load: {e}", r.name));
            (r, lm)
        })
        .collect()
}

/// How far our log-probabilities may lie from transformers' (which ran on the same weights,
/// dequantized) with the weights dequantized to f32: the products are plain f32, what is left is
/// summation order and RoPE angles computed in f64 (measured: about 1e-5). A wrong RoPE layout or
/// factor, window, norm, activation or fused-tensor split moves them by tenths to whole nats.
const EXACT: f32 = 1e-3;

/// The same bound for the reference's top-1 as served, with an f32 cache. F32 weights: as above. F16 weights:
/// candle's f16 products round the activations to f16 too (measured 0.023; 0.036 with an f16
/// cache). Our quantized formats quantize activations to 8 bits per block of 32, and on these
/// tiny models a block is half of the width and the random weights are large (measured 0.38 on
/// the Q8_0 Mistral, 0.23 on the Q4_0 Gemma 3; 0.37 and 0.16 with an f16 cache): the f32 test
/// above is the one that checks the arithmetic.
fn served_tolerance(weights: &str) -> f32 {
    match weights {
        "F32" => EXACT,
        "F16" => 0.05,
        _ => 0.75,
    }
}

fn all_logits(lm: &LoadedModel, ids: &[u32], cache: &mut KvCache) -> Vec<f32> {
    lm.model
        .forward(&mut [BatchItem {
            tokens: ids,
            cache,
            all_logits: true,
            prompt: false,
            parents: &[],
        }])
        .unwrap()
}

#[test]
fn tiny_models_cover_every_architecture() {
    let models = models();
    let archs: Vec<String> = models.iter().map(|(r, _)| r.arch.clone()).collect();
    for arch in ["llama", "qwen3", "qwen3moe", "gemma3", "phi3", "gpt-oss"] {
        assert!(archs.iter().any(|a| a == arch), "no tiny {arch} model");
    }
    // Mixtral: llama files with experts, in llama.cpp's 3-D layout and the older one tensor per
    // expert (the same weights, so the same references).
    let mixtures: Vec<(&str, &str)> = models
        .iter()
        .filter(|(_, lm)| lm.model.config.moe.is_some())
        .map(|(r, _)| (r.name.as_str(), r.arch.as_str()))
        .collect();
    assert_eq!(
        mixtures,
        [
            ("gpt-oss-mxfp4", "gpt-oss"),
            ("gpt-oss", "gpt-oss"),
            ("mixtral-split", "llama"),
            ("mixtral", "llama"),
            ("qwen3moe", "qwen3moe")
        ]
    );
}

/// Compares every position's log-probabilities with the reference's top 8 (or only its top 1),
/// and the argmax wherever the reference leads by more than twice the tolerance, the keys and
/// values cached as `dtype`; returns the largest difference. Up to `outliers` positions (out of
/// all the cases') may lie beyond the tolerance or have another argmax; they are reported.
fn compare_in(
    r: &Reference,
    lm: &LoadedModel,
    dtype: KvDtype,
    (tol, top1_only, outliers): (f32, bool, usize),
) -> f32 {
    let vocab = lm.model.config.vocab_size;
    let mut worst = 0f32;
    let mut beyond = Vec::new();
    for (ci, case) in r.cases.iter().enumerate() {
        let shape = engine::kv_cache::KvShape {
            dtype,
            ..lm.model.kv_shape()
        };
        let mut cache = KvCache::new(shape, case.ids.len());
        let rows = all_logits(lm, &case.ids, &mut cache);
        for (j, top) in case.top.iter().enumerate() {
            let row = &rows[j * vocab..(j + 1) * vocab];
            let lp = log_softmax(row);
            let diffs: Vec<(u32, f32, f32)> = top[..if top1_only { 1 } else { top.len() }]
                .iter()
                .map(|&(id, ref_lp)| (id, lp[id as usize], ref_lp))
                .collect();
            let far = diffs
                .iter()
                .find(|(_, ours, theirs)| (ours - theirs).abs() > tol);
            if let Some(&(id, ours, theirs)) = far {
                let what = format!(
                    "{} case {ci} position {j}: log p({id}) = {ours}, transformers {theirs}",
                    r.name
                );
                assert!(beyond.len() < outliers, "{what}");
                eprintln!("{what} (one of the {outliers} allowed beyond {tol})");
                beyond.push(what);
                continue;
            }
            for (_, ours, theirs) in diffs {
                worst = worst.max((ours - theirs).abs());
            }
            if top[0].1 - top[1].1 > 2.0 * tol {
                let argmax = engine::sampling::argmax(row);
                let what = format!("{} case {ci} position {j}: argmax {argmax}", r.name);
                // A flipped argmax at an expert near-tie counts among the outliers too.
                if argmax != top[0].0 && beyond.len() < outliers {
                    eprintln!("{what} (one of the {outliers} allowed)");
                    beyond.push(what);
                    continue;
                }
                assert_eq!(argmax, top[0].0, "{what}");
            }
        }
    }
    worst
}

#[test]
fn tiny_logits_match_transformers_exactly_in_f32() {
    for (r, lm) in models_f32() {
        let worst = compare_in(&r, &lm, KvDtype::F32, (EXACT, false, 0));
        eprintln!(
            "{} ({}, {} as f32): largest difference {worst:.2e}",
            r.name, r.arch, r.weights
        );
    }
}

/// Positions of the served comparison that may lie beyond its tolerance. A mixture of experts
/// routes each row to its best-scored experts, and where two scores nearly tie, the noise of
/// 8-bit activations can choose the other one: that row's output then differs by the two
/// experts' difference (measured on the Q8_0 Mixtral: 10.8 nats at one position of 76, 0.8 at
/// one more; every other within 0.6). In f32 the choices are transformers' (the test above), and
/// the served path is checked bit for bit against itself (batched, speculative, cached).
fn served_outliers(r: &Reference, lm: &LoadedModel) -> usize {
    let positions: usize = r.cases.iter().map(|c| c.top.len()).sum();
    match (&lm.model.config.moe, r.weights.as_str()) {
        (Some(_), w) if w != "F32" => positions / 20,
        _ => 0,
    }
}

#[test]
fn tiny_logits_as_served_stay_near_transformers() {
    for (r, lm) in models() {
        let outliers = served_outliers(&r, &lm);
        for dtype in [KvDtype::F32, KvDtype::Bf16] {
            if dtype == KvDtype::Bf16 && lm.model.config.head_dim % 2 == 1 {
                continue;
            }
            let tol = match dtype {
                KvDtype::F32 => served_tolerance(&r.weights),
                _ => served_tolerance(&r.weights).max(BF16_CACHE),
            };
            let worst = compare_in(&r, &lm, dtype, (tol, true, outliers));
            eprintln!(
                "{} ({}, {}, {dtype:?} cache): largest top-1 difference {worst:.2e}",
                r.name, r.arch, r.weights
            );
        }
    }
}

/// The bound as served with the default bf16 cache: its 8-bit keys and values move these random
/// models' sharp attention further than real models' (measured 0.105 nats on the F16 Llama 3,
/// 0.08 on the F32 gpt-oss; on the transformers fixtures of the real models bf16 stays as close
/// as f32, see fixtures.rs).
const BF16_CACHE: f32 = 0.25;

/// The KV cache keeps bf16 keys and values unless told otherwise where the class's attention
/// over bf16 heads is the faster (AMX tiles, AVX-512; f32 elsewhere), and the caches made after
/// `set_kv_dtype` are of the type it names.
#[test]
fn the_cache_number_type_is_bf16_unless_told() {
    for (r, mut lm) in models().into_iter().chain(models_f32()) {
        let want = KvDtype::auto(lm.model.config.head_dim);
        let hd = lm.model.config.head_dim;
        let isa = engine::kernels::isa();
        let bf16 = engine::kernels::bf16_by_default(isa, hd);
        // The tiles attend over bf16 heads only: always the default where they run.
        assert!(
            bf16 || !engine::kernels::tiles_attend(isa, hd),
            "{}",
            r.name
        );
        assert_eq!(want, if bf16 { KvDtype::Bf16 } else { KvDtype::F32 });
        assert_eq!(lm.model.kv_shape().dtype, want, "{}", r.name);
        assert_eq!(lm.model.new_cache(8).shape().dtype, want, "{}", r.name);
        for dtype in [KvDtype::F16, KvDtype::F32] {
            lm.model.set_kv_dtype(dtype).unwrap();
            assert_eq!(lm.model.new_cache(8).shape().dtype, dtype);
        }
        // q8_0 takes heads of whole blocks of 32; others are refused, the type kept, with an
        // error that names the type and the heads.
        match lm.model.set_kv_dtype(KvDtype::Q8) {
            Ok(()) => {
                assert_eq!(hd % 32, 0, "{}", r.name);
                assert_eq!(lm.model.new_cache(8).shape().dtype, KvDtype::Q8);
            }
            Err(e) => {
                assert_ne!(hd % 32, 0, "{}", r.name);
                let msg = e.to_string();
                assert!(
                    msg.contains("q8_0") && msg.contains(&hd.to_string()),
                    "{msg}"
                );
                assert_eq!(lm.model.new_cache(8).shape().dtype, KvDtype::F32);
            }
        }
    }
}

fn greedy(lm: &LoadedModel, ids: &[u32], n: usize, k: usize) -> engine::GenerationOutput {
    let mut config = GenerationConfig {
        max_new_tokens: n,
        ..Default::default()
    };
    config.speculation.num_speculative_tokens = k;
    config.speculation.adaptive = false;
    engine::generate(&lm.model, &lm.tokenizer, ids.to_vec(), config, 256, |_| {}).unwrap()
}

/// Our greedy continuation (f32 products) is transformers' wherever they part for no reason: if
/// they differ at some token, our own top two there are within the tolerance (a tie the two float
/// paths may break differently).
#[test]
fn tiny_greedy_matches_transformers() {
    for (r, lm) in models_f32() {
        let tol = EXACT;
        for (ci, case) in r.cases.iter().enumerate() {
            let ours = greedy(&lm, &case.ids, case.greedy.len(), 0).token_ids;
            let same = ours
                .iter()
                .zip(&case.greedy)
                .take_while(|(a, b)| a == b)
                .count();
            if same == case.greedy.len() {
                continue;
            }
            assert!(same < ours.len(), "{} case {ci}: stopped early", r.name);
            let mut prefix = case.ids.clone();
            prefix.extend(&case.greedy[..same]);
            let mut cache = lm.model.new_cache(prefix.len());
            let rows = all_logits(&lm, &prefix, &mut cache);
            let vocab = lm.model.config.vocab_size;
            let lp = log_softmax(&rows[rows.len() - vocab..]);
            let gap = (lp[ours[same] as usize] - lp[case.greedy[same] as usize]).abs();
            assert!(
                gap <= tol,
                "{} case {ci}: greedy parts from transformers at token {same} with a gap of {gap}",
                r.name
            );
        }
    }
}

/// One pass over a prompt's tokens gives bit-identical logits to one pass per token.
#[test]
fn tiny_batched_pass_equals_single_steps() {
    for (r, lm) in models() {
        let case = r.cases.last().unwrap();
        let mut a = lm.model.new_cache(case.ids.len());
        let all = all_logits(&lm, &case.ids, &mut a);
        let mut b = lm.model.new_cache(case.ids.len());
        let mut singles = Vec::new();
        for t in &case.ids {
            singles.extend(all_logits(&lm, &[*t], &mut b));
        }
        assert!(
            all == singles,
            "{}: batched pass differs from single steps",
            r.name
        );
    }
}

/// Speculative greedy output (chains of several lengths and a draft tree) equals plain greedy,
/// with every KV cache number type (bf16 on AMX tiles where the CPU's class has them) (each model's drafts must be accepted somewhere, so that the comparison covers
/// kept drafts: Mistral's random weights accept one draft token in all with f32 keys and none
/// with f16, so acceptance counts over both).
#[test]
fn tiny_speculative_greedy_equals_plain() {
    for (r, mut lm) in models() {
        let mut accepted = 0;
        for dtype in [KvDtype::F16, KvDtype::Bf16, KvDtype::F32, KvDtype::Q8] {
            if !dtype.fits(lm.model.config.head_dim) {
                continue;
            }
            lm.model.set_kv_dtype(dtype).unwrap();
            for case in &r.cases {
                let plain = greedy(&lm, &case.ids, 64, 0);
                for k in [2, 8] {
                    let spec = greedy(&lm, &case.ids, 64, k);
                    assert_eq!(
                        plain.token_ids, spec.token_ids,
                        "{} {dtype:?} K={k}",
                        r.name
                    );
                    accepted += spec.stats.accepted_tokens;
                }
                let mut config = GenerationConfig {
                    max_new_tokens: 64,
                    ..Default::default()
                };
                config.speculation.method = drafting::SpecMethod::Tree;
                config.speculation.adaptive = false;
                let tree = engine::generate(
                    &lm.model,
                    &lm.tokenizer,
                    case.ids.clone(),
                    config,
                    256,
                    |_| {},
                )
                .unwrap();
                assert_eq!(plain.token_ids, tree.token_ids, "{} {dtype:?} tree", r.name);
            }
        }
        assert!(accepted > 0, "{}: no draft was ever accepted", r.name);
    }
}

/// The settings a conversation is checked under for prefix reuse: plain greedy, greedy chains,
/// a greedy tree and seeded sampling with chains.
fn reuse_configs() -> Vec<(&'static str, GenerationConfig)> {
    let base = GenerationConfig {
        max_new_tokens: 24,
        logprobs: Some(3),
        ..Default::default()
    };
    let mut chain = base.clone();
    chain.speculation.num_speculative_tokens = 4;
    chain.speculation.adaptive = false;
    let mut tree = base.clone();
    tree.speculation.method = drafting::SpecMethod::Tree;
    tree.speculation.adaptive = false;
    let mut sampled = chain.clone();
    sampled.sampling.do_sample = true;
    sampled.sampling.temperature = 0.9;
    sampled.seed = Some(7);
    let mut plain = base;
    plain.speculation.num_speculative_tokens = 0;
    vec![
        ("plain", plain),
        ("chain", chain),
        ("tree", tree),
        ("sampled", sampled),
    ]
}

/// A conversation's second turn (the first turn's prompt and answer, then new tokens) started
/// from what the first turn left in the prefix cache gives the same tokens and log-probabilities,
/// bit for bit, as a cold start and as a run with the cache off: every architecture (sliding
/// windows included), plain, chains, trees and seeded sampling. The cached rows of the first
/// answer were computed by decode passes, the cold ones by prefill (where those differ, the
/// answer is not cached: `Sequence::keep_prefix`).
#[test]
fn tiny_prefix_cache_reuse_is_bit_identical() {
    let run = |lm: &LoadedModel, ids: &[u32], c: &GenerationConfig, p: Option<&mut PrefixCache>| {
        engine::generate_reusing(
            &lm.model,
            &lm.tokenizer,
            ids.to_vec(),
            c.clone(),
            256,
            p,
            |_| true,
        )
        .unwrap()
    };
    for (r, lm) in models() {
        for (name, config) in reuse_configs() {
            let (first_ids, extra) = (&r.cases[2].ids, &r.cases[0].ids);
            let mut warm = PrefixCache::new(lm.model.kv_shape(), 64 << 20);
            let mut off = PrefixCache::new(lm.model.kv_shape(), 0);
            let first = run(&lm, first_ids, &config, Some(&mut warm));
            assert_eq!(first.cached_tokens, 0, "{} {name}: a cold cache", r.name);
            let mut second = first_ids.clone();
            second.extend(&first.token_ids);
            second.extend(extra);
            let w = run(&lm, &second, &config, Some(&mut warm));
            let c = run(&lm, &second, &config, None);
            let o = run(&lm, &second, &config, Some(&mut off));
            // The first turn leaves its prompt and its answer (all but the last token, which
            // no pass fed); only its prompt where prompt rows take an arithmetic of their own,
            // as the second turn computes the answer's tokens as prompt rows.
            let computed = match engine::kernels::prompt_arithmetic_differs() {
                true => first_ids.len(),
                false => first_ids.len() + first.token_ids.len() - 1,
            };
            let want = computed / BLOCK_TOKENS * BLOCK_TOKENS;
            assert_eq!(w.cached_tokens, want, "{} {name}: reused", r.name);
            assert_eq!((c.cached_tokens, o.cached_tokens), (0, 0));
            assert_eq!(w.token_ids, c.token_ids, "{} {name}: warm vs cold", r.name);
            assert_eq!(o.token_ids, c.token_ids, "{} {name}: off vs cold", r.name);
            assert!(
                w.logprobs == c.logprobs,
                "{} {name}: log-probabilities",
                r.name
            );
            assert!(
                o.logprobs == c.logprobs,
                "{} {name}: log-probabilities",
                r.name
            );
        }
    }
}

/// A GGUF of an architecture pld does not run is refused with an error that names it and lists the
/// supported ones (the tiny Llama with every "llama" in its metadata rewritten as "mamba").
#[test]
fn unknown_architecture_is_named() {
    let bytes = std::fs::read(tiny_dir().join("llama3.gguf")).unwrap();
    let mut patched = bytes.clone();
    let mut replaced = 0;
    for i in 0..patched.len().saturating_sub(5) {
        if &patched[i..i + 5] == b"llama" {
            patched[i..i + 5].copy_from_slice(b"mamba");
            replaced += 1;
        }
    }
    assert!(replaced > 5, "the architecture name and its keys");
    let path = std::env::temp_dir().join(format!("pld-mamba-{}.gguf", std::process::id()));
    std::fs::write(&path, &patched).unwrap();
    let err = match LoadedModel::load(&path) {
        Ok(_) => panic!("a mamba model loaded"),
        Err(e) => e.to_string(),
    };
    std::fs::remove_file(&path).ok();
    assert!(err.contains("'mamba'"), "{err}");
    for arch in [
        "llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3", "gpt-oss",
    ] {
        assert!(err.contains(arch), "{err} should list {arch}");
    }
}

/// `tiny/<file>` with every `from` in its bytes (metadata keys and values) replaced by `to`, of
/// the same length, loaded: the error it gives.
fn load_patched(file: &str, from: &[u8], to: &[u8]) -> String {
    let mut bytes = std::fs::read(tiny_dir().join(file)).unwrap();
    let mut replaced = 0;
    for i in 0..bytes.len().saturating_sub(from.len()) {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(to);
            replaced += 1;
        }
    }
    assert!(replaced > 5, "the architecture name and its keys");
    let name = String::from_utf8_lossy(to);
    let path = std::env::temp_dir().join(format!("pld-{name}-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let result = LoadedModel::load(&path);
    std::fs::remove_file(&path).ok();
    match result {
        Ok(_) => panic!("a {name} model loaded"),
        Err(e) => e.to_string(),
    }
}

/// Mixtures of experts pld does not run are refused as such, by name, with the mixtures it runs:
/// a known family (qwen2moe, the tiny Qwen3-MoE renamed), and any unknown architecture whose
/// file declares experts (the tiny Mixtral's "llama" renamed "mamba").
#[test]
fn unsupported_mixtures_are_named() {
    for (file, from, to) in [
        ("qwen3moe.gguf", &b"qwen3moe"[..], &b"qwen2moe"[..]),
        ("mixtral.gguf", b"llama", b"mamba"),
        ("gpt-oss.gguf", b"gpt-oss", b"grok-15"),
    ] {
        let err = load_patched(file, from, to);
        let name = String::from_utf8_lossy(to);
        assert!(
            err.contains(&format!("'{name}' is a mixture-of-experts model")),
            "{err}"
        );
        for family in ["qwen3moe", "mixtral", "gpt-oss"] {
            assert!(err.contains(family), "{err} should list {family}");
        }
    }
}

/// Seeded sampling through chains, trees and plain decoding: each setting gives the same tokens
/// again for the same seed, and every token's reported log-probabilities are, bit for bit, those
/// of the row a one-token-at-a-time pass over the same tokens gives (the verifier read rows equal
/// to plain decoding's, whatever else shared their passes).
#[test]
fn tiny_sampled_speculation_reads_plain_rows() {
    let mut accepted = 0;
    for (r, lm) in models() {
        let vocab = lm.model.config.vocab_size;
        for (name, config) in reuse_configs() {
            let mut config = config.clone();
            config.sampling.do_sample = true;
            config.sampling.temperature = 0.9;
            config.seed = Some(11);
            let ids = &r.cases[2].ids;
            let run = || generate_with(&lm, ids, config.clone());
            let (a, b) = (run(), run());
            assert_eq!(a.token_ids, b.token_ids, "{} {name}: same seed", r.name);
            accepted += a.stats.accepted_tokens;
            let mut cache = lm.model.new_cache(ids.len() + a.token_ids.len());
            let mut rows = all_logits(&lm, &ids[..ids.len() - 1], &mut cache);
            rows.clear();
            let fed = std::iter::once(ids[ids.len() - 1]).chain(a.token_ids.iter().copied());
            for t in fed.take(a.logprobs.len()) {
                rows.extend(all_logits(&lm, &[t], &mut cache));
            }
            for (i, lp) in a.logprobs.iter().enumerate() {
                let row = &rows[i * vocab..(i + 1) * vocab];
                let plain = engine::TokenLogprob::from_logits(row, lp.token, 3);
                assert!(*lp == plain, "{} {name}: token {i}", r.name);
            }
        }
    }
    assert!(accepted > 0, "no sampled draft was ever accepted");
}

/// Several sequences stepped together (a tree, a chain and a sampled chain over different
/// prompts, so that a mixture's experts gather rows of several sequences) each give what they
/// give alone.
#[test]
fn tiny_sequences_batched_together_give_their_own_output() {
    for (r, lm) in models() {
        let configs: Vec<GenerationConfig> = reuse_configs()
            .into_iter()
            .filter(|(name, _)| *name != "plain")
            .map(|(_, c)| c)
            .collect();
        let mut seqs: Vec<engine::Sequence> = r
            .cases
            .iter()
            .zip(&configs)
            .map(|(case, c)| {
                engine::Sequence::new(&lm.model, case.ids.clone(), c.clone(), 256).unwrap()
            })
            .collect();
        while seqs.iter().any(|s| !s.is_finished()) {
            let mut refs: Vec<&mut engine::Sequence> = seqs.iter_mut().collect();
            engine::step(&lm.model, &lm.tokenizer, &mut refs).unwrap();
        }
        for ((seq, case), c) in seqs.into_iter().zip(&r.cases).zip(&configs) {
            let alone = generate_with(&lm, &case.ids, c.clone());
            let out = seq.into_output();
            assert_eq!(alone.token_ids, out.token_ids, "{}", r.name);
            assert!(alone.logprobs == out.logprobs, "{}", r.name);
        }
    }
}

fn generate_with(
    lm: &LoadedModel,
    ids: &[u32],
    config: GenerationConfig,
) -> engine::GenerationOutput {
    engine::generate(&lm.model, &lm.tokenizer, ids.to_vec(), config, 256, |_| {}).unwrap()
}

/// Mixtral's two GGUF layouts of the same weights (llama.cpp's 3-D `ffn_*_exps`, and one 2-D
/// tensor per expert) give the same logits, bit for bit.
#[test]
fn tiny_mixtral_layouts_agree_bit_for_bit() {
    let models = models();
    let [merged, split] = ["mixtral", "mixtral-split"]
        .map(|name| models.iter().find(|(r, _)| r.name == name).expect(name));
    for case in &merged.0.cases {
        let logits = |lm: &LoadedModel| {
            let mut cache = lm.model.new_cache(case.ids.len());
            all_logits(lm, &case.ids, &mut cache)
        };
        assert!(logits(&merged.1) == logits(&split.1));
    }
}

/// A mixture of experts starts its drafters at a price that counts the experts a drafted row
/// adds (the tiny Qwen3-MoE: a second row misses the first row's 2 of 8 experts with probability
/// 3/4 each); a dense model keeps the drafters' own prior.
#[test]
fn mixtures_price_drafted_rows_by_the_experts_they_add() {
    for (r, lm) in models() {
        let prior = lm.model.draft_price_prior();
        match (lm.model.config.moe, prior) {
            (None, None) => {}
            (Some(_), Some(p)) => {
                assert!(p > drafting::PRIOR_PRICE && p < 2.0, "{}: {p}", r.name);
                // All F32, the experts most of the bytes: a drafted row adds a lot.
                if r.name == "qwen3moe" {
                    assert!(p > drafting::PRIOR_PRICE + 0.2, "{}: {p}", r.name);
                }
            }
            other => panic!("{}: {other:?}", r.name),
        }
    }
}
