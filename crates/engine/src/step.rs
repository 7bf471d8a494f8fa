//! `step`: one forward pass over any set of sequences. Each sequence sends its inputs (a prompt
//! chunk while in prefill, else its last token and a draft), within the pass's budget of prompt
//! rows (`PROMPT_ROWS_PER_PASS`), every row goes through the model together, and each sequence then takes its own logits rows (`Sequence::prefilled` and
//! `decoded`, in `sequence.rs`): prefill moves on (the prompt's
//! last row gives the first token), a decode step verifies its draft, keeps the accepted path in
//! its cache, counts it, teaches its drafter and emits the tokens.

use crate::error::Result;
use crate::model::{BatchItem, Model};
use crate::sequence::{Pass, PassInput, Phase, Sequence};
use crate::tokenizer::Tokenizer;
use std::time::Instant;

pub use crate::sequence::PREFILL_CHUNK;

/// Prompt rows (prefill and refill chunks) one pass takes at most beside its decoding rows: one
/// chunk, the width the prompt kernels are made for. Sequences feeding a prompt go in their
/// order, whole chunks only, each while the pass's prompt rows stay within this (the first always
/// goes); the rest wait for a later pass. Without it, N sequences arriving together made one pass
/// of N chunks: a pass of thousands of rows whose activations outgrew the caches (and took
/// gigabytes), while every decoding sequence waited on it for its next token. What a sequence
/// computes never depends on the pass its chunks ride in.
pub const PROMPT_ROWS_PER_PASS: usize = PREFILL_CHUNK;

/// Advances every decoding sequence by one forward pass (its last token plus its draft, a chain
/// or a tree), and the sequences still feeding a prompt by a chunk each, in order, within
/// `PROMPT_ROWS_PER_PASS`.
pub fn step(model: &Model, tok: &Tokenizer, seqs: &mut [&mut Sequence]) -> Result<()> {
    let started = Instant::now();
    let mut prompt_rows = 0;
    let inputs: Vec<PassInput> = seqs
        .iter_mut()
        .enumerate()
        .filter_map(|(si, seq)| {
            let input = seq.pass_input(si, tok)?;
            if seq.in_prefill() {
                // A chunk is only sliced from the prompt: leaving it out changes nothing.
                let rows = input.tokens.len();
                if prompt_rows > 0 && prompt_rows + rows > PROMPT_ROWS_PER_PASS {
                    return None;
                }
                prompt_rows += rows;
            }
            Some(input)
        })
        .collect();
    if inputs.is_empty() {
        return Ok(());
    }
    let logits = forward(model, seqs, &inputs)?;
    let pass = Pass {
        elapsed: started.elapsed(),
        alone: inputs.len() == 1,
        vocab: model.config.vocab_size,
    };
    let mut row = 0;
    for input in inputs {
        let seq = &mut *seqs[input.seq];
        match seq.phase {
            Phase::Prefill(done) => {
                let last_row = &logits[row * pass.vocab..(row + 1) * pass.vocab];
                row += 1;
                seq.prefilled(tok, done + input.tokens.len(), last_row, &pass);
            }
            Phase::Refill { done, last } => {
                row += 1;
                seq.refilled(done + input.tokens.len(), last, &pass);
            }
            Phase::Decode(_) => {
                let n = input.tokens.len();
                let rows = &logits[row * pass.vocab..(row + n) * pass.vocab];
                row += n;
                seq.decoded(tok, input, rows, &pass);
            }
            Phase::Finished(_) => unreachable!("finished sequences have no inputs"),
        }
    }
    Ok(())
}

/// Runs every sequence's inputs through the model in one pass.
fn forward(model: &Model, seqs: &mut [&mut Sequence], inputs: &[PassInput]) -> Result<Vec<f32>> {
    let mut items: Vec<BatchItem<'_>> = Vec::with_capacity(inputs.len());
    let mut pending = inputs.iter().peekable();
    for (si, seq) in seqs.iter_mut().enumerate() {
        if let Some(input) = pending.next_if(|i| i.seq == si) {
            let all_logits = matches!(seq.phase, Phase::Decode(_));
            let prompt = seq.feeds_prompt();
            items.push(BatchItem {
                tokens: &input.tokens,
                cache: &mut seq.cache,
                all_logits,
                prompt,
                parents: &input.parents,
            });
        }
    }
    model.forward(&mut items)
}
