//! What the crate's unit tests run on: the tiny llama checked into `tests/tiny`, and prompts
//! that repeat themselves (so that the n-gram drafter proposes).

use crate::LoadedModel;

/// The tiny llama of `tests/tiny/llama3.gguf`.
pub(crate) fn tiny_llama() -> LoadedModel {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tiny/llama3.gguf");
    LoadedModel::load(&path).unwrap()
}

/// `n` prompts of different lengths and periods, each repeating a short run of token ids.
pub(crate) fn repeating_prompts(n: u32) -> Vec<Vec<u32>> {
    (0..n)
        .map(|s| (0..40 + 7 * s).map(|i| 20 + (i % (9 + s)) * 5).collect())
        .collect()
}
