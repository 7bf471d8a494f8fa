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
    pub messages: Vec<engine::Message>,
    pub prompt_text: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub greedy_text: String,
    pub top5_logprobs: Vec<Vec<(u32, f32)>>,
}

/// The shared/ folder beside the repository (as laid out for developers and CI).
pub fn shared_dir() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.join("../../../shared")
}

/// (alias, fixture file) for the models with reference fixtures.
pub const FIXTURE_MODELS: [(&str, &str); 2] = [
    ("smollm2-135m", "smollm2-135m-instruct.json"),
    ("qwen-coder-0.5b", "qwen2.5-coder-0.5b-instruct.json"),
];

pub fn fixture(file: &str) -> Fixture {
    let path = shared_dir().join("fixtures").join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture parses")
}

/// Loads a model by alias once per test binary (fetching it if missing).
pub fn model(alias: &str) -> Arc<LoadedModel> {
    type Cache = Mutex<Vec<(String, Arc<LoadedModel>)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    let mut guard = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, m)) = guard.iter().find(|(a, _)| a == alias) {
        return m.clone();
    }
    let path = models::resolve_model(alias).expect("model available");
    let m = Arc::new(LoadedModel::load(&path).expect("model loads"));
    guard.push((alias.to_string(), m.clone()));
    m
}
