//! `step`: one forward pass over any set of sequences. Each sequence sends its inputs (a prompt
//! chunk while in prefill, within the pass's budget of prompt rows, `PROMPT_ROWS_PER_PASS`; else
//! its last token and a draft), every row goes through the model together, and each sequence
//! then takes its own logits rows (`Sequence::prefilled` and `decoded`, in `sequence.rs`):
//! prefill moves on (the prompt's last row gives the first token), a decode step verifies its
//! draft, keeps the accepted path in its cache, counts it, teaches its drafter and emits the
//! tokens.

use crate::error::Result;
use crate::model::{BatchItem, Model};
use crate::sequence::{plan_drafts, Pass, PassInput, Phase, Sequence};
use crate::tokenizer::Tokenizer;
use drafting::pass_cost::PassCost;
use std::time::Instant;

pub use crate::sequence::PREFILL_CHUNK;

/// Prompt rows (prefill and refill chunks) one pass takes at most beside its decoding rows: two
/// chunks. The first prefilling sequence of the set goes first (a server's oldest), so that
/// every prompt gets through; the others follow by the rows they have left, shortest first,
/// whole chunks while they fit, so that a short prompt (an agent's side request, a chat's next
/// turn after its cached prefix) never waits behind a long one. Without a budget, N prompts
/// arriving together made one pass of N chunks: thousands of rows whose activations outgrew the
/// caches (and took gigabytes), while every decoding sequence waited on it for its next token.
/// What a sequence computes never depends on the pass its chunks ride in.
pub const PROMPT_ROWS_PER_PASS: usize = 2 * PREFILL_CHUNK;

/// Which of `seqs` feed their next prompt chunk (`Sequence::prompt_chunk`) this pass, within
/// `PROMPT_ROWS_PER_PASS`; decoding sequences are not counted.
fn prompt_feeders(seqs: &[&mut Sequence]) -> Vec<bool> {
    // (rows left, chunk rows, place) of each sequence feeding a prompt, in the set's order.
    let mut waiting: Vec<(usize, usize, usize)> = (seqs.iter().enumerate())
        .filter_map(|(i, s)| Some((s.prompt_rows_left()?, s.prompt_chunk()?.len(), i)))
        .collect();
    let mut feeds = vec![false; seqs.len()];
    let Some(&(_, mut rows, first)) = waiting.first() else {
        return feeds;
    };
    feeds[first] = true;
    waiting[1..].sort_unstable();
    for &(_, chunk, i) in &waiting[1..] {
        if rows + chunk <= PROMPT_ROWS_PER_PASS {
            feeds[i] = true;
            rows += chunk;
        }
    }
    feeds
}

/// Advances every decoding sequence by one forward pass (its last token plus its draft, a chain
/// or a tree), and the sequences still feeding a prompt by a chunk each within
/// `PROMPT_ROWS_PER_PASS`. Each sequence drafts on its own (at the price its scheduler set).
pub fn step(model: &Model, tok: &Tokenizer, seqs: &mut [&mut Sequence]) -> Result<()> {
    step_priced(model, tok, seqs, None)
}

/// `step`, with the drafts of the sequences a scheduler prices (`Sequence::set_draft_price`)
/// chosen together by what the pass's generated rows cost (`cost`: `PassCost::choose_drafts`)
/// where it is given.
pub fn step_priced(
    model: &Model,
    tok: &Tokenizer,
    seqs: &mut [&mut Sequence],
    cost: Option<&PassCost>,
) -> Result<()> {
    let started = Instant::now();
    let feeds = prompt_feeders(seqs);
    if let Some(cost) = cost {
        plan_drafts(seqs, cost);
    }
    let inputs: Vec<PassInput> = seqs
        .iter_mut()
        .enumerate()
        .filter(|(si, seq)| !seq.in_prefill() || feeds[*si])
        .filter_map(|(si, seq)| seq.pass_input(si, tok))
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
