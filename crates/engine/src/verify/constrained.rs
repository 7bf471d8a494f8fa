//! Verification under a grammar (`response_format`): the draft is a chain cut before its first
//! forbidden token, and each logits row is masked by the grammar state after the drafts before
//! it, so that what is emitted is what constrained decoding one token at a time would emit.

use super::{verify, verify_tree, Verdict};
use crate::grammar::{Chooser, Constraint};
use crate::sampling::{greedy, SamplingParams};
use crate::tokenizer::Tokenizer;
use drafting::DraftTree;
use rand::Rng;

/// Cuts a drafted chain (the drafter proposes chains under a grammar) before its first token the
/// grammar forbids and before any end token; returns how many nodes are left.
pub(crate) fn cut_draft(c: &mut Constraint, tree: &mut DraftTree, tok: &Tokenizer) -> usize {
    let chain = tree.tokens();
    let free = chain
        .iter()
        .position(|&t| tok.is_end(t))
        .unwrap_or(chain.len());
    let keep = c.valid_prefix(&chain[..free]);
    tree.truncate(keep);
    keep
}

/// The first token after the prompt, chosen from `row` masked by the grammar.
pub(crate) fn first_token(
    c: &mut Constraint,
    row: &[f32],
    context: &[u32],
    params: &SamplingParams,
    rng: &mut impl Rng,
) -> u32 {
    let mut masked = row.to_vec();
    c.mask(&mut masked);
    verify(&masked, row.len(), &[], context, params, rng).tokens[0]
}

/// Verifies a drafted chain with each row masked by the grammar state after the drafts before
/// it; under greedy only the rows the walk reaches (the chain is cut where the model's
/// constrained choice leaves it, which changes no verdict).
pub(crate) fn verify_constrained(
    c: &mut Constraint,
    rows: &[f32],
    vocab: usize,
    tree: &DraftTree,
    context: &[u32],
    params: &SamplingParams,
    rng: &mut impl Rng,
) -> Verdict {
    let penalized = params.repetition_penalty != 1.0;
    let mut seen = if penalized {
        context.to_vec()
    } else {
        Vec::new()
    };
    let drafts = tree.tokens();
    let mut choose = |row: &[f32], i: usize| {
        if i > 0 && penalized {
            seen.push(drafts[i - 1]);
        }
        greedy(row, &seen, params)
    };
    let chooser: Option<&mut Chooser<'_>> = if params.is_greedy() {
        Some(&mut choose)
    } else {
        None
    };
    let (masked, verified) = c.masked_rows(rows, vocab, drafts, chooser);
    let mut checked = tree.clone();
    checked.truncate(verified);
    verify_tree(&masked, vocab, &checked, context, params, rng)
}
