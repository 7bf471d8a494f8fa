//! Shared helpers of the engine's model tests: the reference fixtures and the real models.
#![allow(dead_code)]

use engine::LoadedModel;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Deserialize)]
pub struct Fixture {
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub tokenizer: Vec<TokenizerCase>,
    pub chat_template: Vec<ChatCase>,
    pub generation: Vec<GenerationCase>,
}

#[derive(Deserialize)]
pub struct TokenizerCase {
    pub text: String,
    pub ids: Vec<u32>,
    /// The default encoding (BOS in front where the model adds one); gemma3's fixture only.
    #[serde(default)]
    pub ids_with_special_tokens: Option<Vec<u32>>,
}

#[derive(Deserialize)]
pub struct ChatCase {
    pub messages: Vec<engine::Message>,
    pub add_generation_prompt: bool,
    pub rendered: String,
}

#[derive(Deserialize)]
pub struct GenerationCase {
    pub name: String,
    /// The conversation rendered into `prompt_text`; none for a base model's plain-text prompts.
    pub messages: Option<Vec<engine::Message>>,
    pub prompt_text: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub greedy_text: String,
    pub top5_logprobs: Vec<Vec<(u32, f32)>>,
}

/// The workspace root: the reference fixtures are in its `fixtures/`, the dev workloads in its
/// `workloads/`.
pub fn repo_dir() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.join("../..")
}

/// (alias, fixture file) for the models with reference fixtures.
pub const FIXTURE_MODELS: [(&str, &str); 2] = [
    ("smollm2-135m", "smollm2-135m-instruct.json"),
    ("qwen-coder-0.5b", "qwen2.5-coder-0.5b-instruct.json"),
];

pub fn fixture(file: &str) -> Fixture {
    let path = repo_dir().join("fixtures").join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture parses")
}

/// Loads a model by alias once per test binary (fetching it if missing).
pub fn model(alias: &str) -> Arc<LoadedModel> {
    model_at(alias, engine::weights::Precision::Stored)
}

/// `model` with its weights dequantized to f32 (exact products: checks the arithmetic alone).
pub fn model_f32(alias: &str) -> Arc<LoadedModel> {
    model_at(alias, engine::weights::Precision::F32)
}

/// `model`, loaded afresh (not shared), its KV caches of number type `dtype`.
#[allow(dead_code)]
pub fn model_caching(alias: &str, dtype: engine::kv_cache::KvDtype) -> LoadedModel {
    let path = models::resolve_model(alias).expect("model available");
    let mut lm = LoadedModel::load(&path).expect("model loads");
    lm.model
        .set_kv_dtype(dtype)
        .expect("the model takes the cache type");
    lm
}

fn model_at(alias: &str, precision: engine::weights::Precision) -> Arc<LoadedModel> {
    type Cache = Mutex<Vec<(String, Arc<LoadedModel>)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    let mut guard = cache.lock().unwrap_or_else(|e| e.into_inner());
    let key = format!("{alias} {precision:?}");
    if let Some((_, m)) = guard.iter().find(|(a, _)| *a == key) {
        return m.clone();
    }
    let path = models::resolve_model(alias).expect("model available");
    let m = Arc::new(LoadedModel::load_with(&path, precision).expect("model loads"));
    guard.push((key, m.clone()));
    m
}

/// The log-softmax of a row of logits (the sum in f64).
pub fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = row
        .iter()
        .map(|v| ((v - max) as f64).exp())
        .sum::<f64>()
        .ln() as f32
        + max;
    row.iter().map(|v| v - lse).collect()
}

/// Prefill in chunks, then every reference token fed in one pass: the logits of each generated
/// position. The cache stores the model's KV type.
pub fn teacher_forced(m: &engine::model::Model, prompt: &[u32], cont: &[u32]) -> Vec<f32> {
    teacher_forced_in(m, m.kv_shape().dtype, prompt, cont)
}

/// `teacher_forced` with a cache of number type `dtype`.
pub fn teacher_forced_in(
    m: &engine::model::Model,
    dtype: engine::kv_cache::KvDtype,
    prompt: &[u32],
    cont: &[u32],
) -> Vec<f32> {
    teacher_forced_as(m, dtype, prompt, cont, false)
}

/// `teacher_forced_in` with the continuation's rows fed as prompt rows (`BatchItem::prompt`)
/// when `cont_as_prompt`, in the arithmetic a later turn's prompt gives them.
pub fn teacher_forced_as(
    m: &engine::model::Model,
    dtype: engine::kv_cache::KvDtype,
    prompt: &[u32],
    cont: &[u32],
    cont_as_prompt: bool,
) -> Vec<f32> {
    let shape = engine::kv_cache::KvShape {
        dtype,
        ..m.kv_shape()
    };
    let mut cache = engine::kv_cache::KvCache::new(shape, prompt.len() + cont.len() + 1);
    let mut rows = Vec::new();
    for chunk in prompt.chunks(engine::step::PREFILL_CHUNK) {
        rows = m
            .forward(&mut [engine::model::BatchItem {
                tokens: chunk,
                cache: &mut cache,
                all_logits: false,
                prompt: true,
                parents: &[],
            }])
            .unwrap();
    }
    rows.extend(
        m.forward(&mut [engine::model::BatchItem {
            tokens: &cont[..cont.len() - 1],
            cache: &mut cache,
            all_logits: true,
            prompt: cont_as_prompt,
            parents: &[],
        }])
        .unwrap(),
    );
    rows
}
