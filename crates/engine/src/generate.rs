//! One generation from start to end: `generate`, which is `step` over a batch of one, and
//! `generate_reusing`, the same through the prefix cache. Its settings and report are in
//! `generation`; the server drives the same `step` over many sequences (`sequence`, `step`).

use crate::error::Result;
use crate::generation::{GenerationConfig, GenerationOutput};
use crate::model::Model;
use crate::prefix_cache::PrefixCache;
use crate::sequence::Sequence;
use crate::step::step;
use crate::tokenizer::Tokenizer;

/// The prefix-cache namespace of a single local user (`generate_reusing`, `pld chat`); a server
/// gives each tenant its own.
pub const LOCAL_NAMESPACE: u64 = 0;

/// Generates from `prompt` (token ids), handing text to `on_text` as it is accepted.
pub fn generate(
    model: &Model,
    tok: &Tokenizer,
    prompt: Vec<u32>,
    config: GenerationConfig,
    context_len: usize,
    mut on_text: impl FnMut(&str),
) -> Result<GenerationOutput> {
    generate_reusing(model, tok, prompt, config, context_len, None, |t| {
        on_text(t);
        true
    })
}

/// `generate` starting from the longest prefix of `prompt` that `prefix` holds, and leaving it
/// the keys and values of the prompt and the output for the next call (a conversation's next
/// turn re-sends this one). `None` is plain `generate`. `on_text` returns whether to go on:
/// false ends the generation there (`FinishReason::Cancelled`), with what it has produced.
pub fn generate_reusing(
    model: &Model,
    tok: &Tokenizer,
    prompt: Vec<u32>,
    config: GenerationConfig,
    context_len: usize,
    mut prefix: Option<&mut PrefixCache>,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationOutput> {
    if !config.response_format.is_text() {
        // A schema that does not compile is an error now rather than an empty answer.
        tok.grammar(model.config.vocab_size)?
            .compile(&config.response_format)?;
    }
    let mut seq = Sequence::new(model, prompt, config, context_len)?;
    if let Some(p) = prefix.as_deref_mut() {
        seq.reuse_prefix(p, LOCAL_NAMESPACE);
    }
    while !seq.is_finished() {
        step(model, tok, &mut [&mut seq])?;
        let t = seq.take_new_text();
        if !t.is_empty() && !on_text(&t) {
            seq.cancel();
        }
    }
    if let Some(p) = prefix {
        seq.keep_prefix(p, LOCAL_NAMESPACE);
    }
    Ok(seq.into_output())
}
