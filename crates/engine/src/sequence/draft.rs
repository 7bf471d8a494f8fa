//! A decoding sequence's draft for the next pass: proposed by its own drafter at the price a
//! scheduler gave it, or chosen with the rest of the batch (`plan_drafts`: every sequence's
//! candidate chain priced together by the pass's cost in rows, `PassCost::choose_drafts`).
//! Either way only what is sent is verified, so the output is the same tokens; only the number
//! of passes changes.

use super::{Phase, Sequence};
use crate::tokenizer::Tokenizer;
use crate::verify::constrained::cut_draft;
use drafting::pass_cost::PassCost;
use drafting::DraftTree;
use std::time::Instant;

impl Sequence {
    /// The most drafted tokens the next pass may take: the room left in the cache (the pass
    /// writes 1 + nodes positions), the tokens still to emit (the model's own token is one of
    /// them) and the scheduler's limit.
    fn draft_room(&self) -> usize {
        let generated = self.tokens.len() - self.prompt_len;
        let end = match self.budgeted {
            true => self.cache.capacity(),
            false => self.reach,
        };
        let room = end - self.cache.len() - 1;
        let left = self.config.max_new_tokens - generated - 1;
        self.draft_limit.min(room).min(left)
    }

    /// The draft to verify after the last token: the planned length of the chain the batch's
    /// plan kept, or what the drafter proposes within `draft_room` at the scheduler's price; cut
    /// under a grammar.
    pub(super) fn draft(&mut self, tok: &Tokenizer) -> DraftTree {
        let limit = self.draft_room();
        let (price, planned) = (self.draft_price, self.planned.take());
        let mut tree = match self.drafter.as_mut().filter(|_| limit > 0) {
            Some(d) => {
                let t0 = Instant::now();
                let tree = match planned {
                    Some(len) => d.keep_planned(len).clone(),
                    None => d.propose(limit, price).clone(),
                };
                self.stats.propose_time += t0.elapsed();
                tree
            }
            None => DraftTree::new(),
        };
        if let Some(c) = self.constraint.as_mut() {
            let keep = cut_draft(c, &mut tree, tok);
            if let Some(d) = self.drafter.as_mut() {
                d.keep_first(keep);
            }
        }
        self.make_room(self.cache.len() + 1 + tree.len());
        tree
    }

    /// The candidate chain of a decoding sequence whose drafts a scheduler prices (a greedy
    /// one: sampled sequences keep a fixed cap, so that their drafts never depend on timings),
    /// kept in its drafter, with each token's probability of landing with those before it; `None`
    /// where this sequence's draft is not chosen with the batch's.
    fn draft_candidates(&mut self) -> Option<Vec<f64>> {
        if !matches!(self.phase, Phase::Decode(_)) || self.draft_price.is_none() {
            return None;
        }
        let limit = self.draft_room();
        let d = self.drafter.as_mut().filter(|_| limit > 0)?;
        let t0 = Instant::now();
        let paths = d.candidates(limit);
        self.stats.propose_time += t0.elapsed();
        paths
    }
}

/// Chooses the drafts of every decoding sequence of `seqs` that a scheduler prices, together
/// (`PassCost::choose_drafts`); each then sends its planned length in this step's pass. The
/// generated rows are priced by their own count: prompt chunks in the same pass take their own
/// products (another arithmetic), which the drafts neither share nor change.
pub(crate) fn plan_drafts(seqs: &mut [&mut Sequence], cost: &PassCost) {
    let decoding = (seqs.iter())
        .filter(|s| matches!(s.phase, Phase::Decode(_)))
        .count();
    let mut candidates: Vec<(usize, Vec<f64>, usize)> = Vec::new();
    for (i, s) in seqs.iter_mut().enumerate() {
        if let Some(paths) = s.draft_candidates() {
            candidates.push((i, paths, s.positions()));
        }
    }
    let drafts: Vec<(&[f64], usize)> = (candidates.iter())
        .map(|(_, paths, ctx)| (&paths[..], *ctx))
        .collect();
    let lengths = cost.choose_drafts(&drafts, decoding);
    for ((i, ..), len) in candidates.iter().zip(lengths) {
        seqs[*i].planned = Some(len);
    }
}
