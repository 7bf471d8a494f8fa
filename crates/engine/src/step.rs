//! `step`: one forward pass over any set of sequences. Each sequence sends its inputs (a prompt
//! chunk while in prefill, else its last token and a draft), every row goes through the model
//! together, and each sequence then takes its own logits rows: prefill moves on (the prompt's
//! last row gives the first token), a decode step verifies its draft, keeps the accepted path in
//! its cache, counts it, teaches its drafter and emits the tokens.

use crate::error::Result;
use crate::logprobs::top_ids;
use crate::model::{BatchItem, Model};
use crate::sequence::{Phase, Sequence};
use crate::tokenizer::Tokenizer;
use crate::verify::constrained::{cut_draft, first_token, verify_constrained};
use crate::verify::{verify, verify_tree};
use drafting::{path_rows, DraftTree};
use std::time::{Duration, Instant};

/// Prompt tokens fed per forward pass during prefill.
pub const PREFILL_CHUNK: usize = 256;

/// One sequence's inputs to a pass.
struct PassInput {
    seq: usize,
    tokens: Vec<u32>,
    /// The drafted tree (empty for prefill and plain decoding).
    tree: DraftTree,
    /// Row parents for the model when the tree is not a chain (see `BatchItem::parents`).
    parents: Vec<u32>,
}

/// What every sequence of a pass shares.
struct Pass {
    elapsed: Duration,
    /// The pass had this sequence alone (its time says what its own rows cost).
    alone: bool,
    vocab: usize,
}

/// Advances every unfinished sequence by one forward pass: a prompt chunk for those still in
/// prefill, the last token plus its draft (a chain or a tree) for those decoding.
pub fn step(model: &Model, tok: &Tokenizer, seqs: &mut [&mut Sequence]) -> Result<()> {
    let started = Instant::now();
    let inputs: Vec<PassInput> = seqs
        .iter_mut()
        .enumerate()
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
            items.push(BatchItem {
                tokens: &input.tokens,
                cache: &mut seq.cache,
                all_logits,
                parents: &input.parents,
            });
        }
    }
    model.forward(&mut items)
}

impl Sequence {
    /// What this sequence sends to the next pass (`si`: its place in the step), if anything.
    fn pass_input(&mut self, si: usize, tok: &Tokenizer) -> Option<PassInput> {
        match self.phase {
            Phase::Finished(_) => None,
            Phase::Prefill(done) => {
                let end = (done + PREFILL_CHUNK).min(self.prompt_len);
                Some(PassInput {
                    seq: si,
                    tokens: self.tokens[done..end].to_vec(),
                    tree: DraftTree::new(),
                    parents: Vec::new(),
                })
            }
            Phase::Decode(last) => {
                let tree = self.draft(tok);
                let mut tokens = Vec::with_capacity(tree.len() + 1);
                tokens.push(last);
                tokens.extend_from_slice(tree.tokens());
                Some(PassInput {
                    seq: si,
                    tokens,
                    parents: tree.row_parents(),
                    tree,
                })
            }
        }
    }

    /// The draft to verify after the last token: what the drafter proposes within the room left
    /// and the scheduler's limit, cut under a grammar.
    fn draft(&mut self, tok: &Tokenizer) -> DraftTree {
        let generated = self.tokens.len() - self.prompt_len;
        // Room left: the pass writes 1 + nodes positions, and at most max_new_tokens tokens may
        // still be emitted (the model's own token is one of them).
        let room = self.cache.capacity() - self.cache.len() - 1;
        let left = self.config.max_new_tokens - generated - 1;
        let limit = self.draft_limit.min(room).min(left);
        let price = self.draft_price;
        let mut tree = match self.drafter.as_mut().filter(|_| limit > 0) {
            Some(d) => {
                let t0 = Instant::now();
                let tree = d.propose(limit, price).clone();
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
        tree
    }

    /// A prefill pass is done: `done` prompt tokens are in; once all are, the prompt's last row
    /// gives the first token.
    fn prefilled(&mut self, tok: &Tokenizer, done: usize, last_row: &[f32], pass: &Pass) {
        self.prefill_time += pass.elapsed;
        if done < self.prompt_len {
            self.phase = Phase::Prefill(done);
            return;
        }
        self.ensure_constraint(tok, pass.vocab);
        if self.is_finished() {
            return;
        }
        let (params, rng) = (&self.config.sampling, &mut self.rng);
        let token = match self.constraint.as_mut() {
            Some(c) => first_token(c, last_row, &self.tokens, params, rng),
            None => verify(last_row, pass.vocab, &[], &self.tokens, params, rng).tokens[0],
        };
        self.emit(tok, token, last_row);
    }

    /// A decode pass is done: verifies the draft against `rows` (one per input), keeps the
    /// accepted path in the cache, counts it, teaches the drafter and emits the tokens.
    fn decoded(&mut self, tok: &Tokenizer, input: PassInput, rows: &[f32], pass: &Pass) {
        let PassInput { tokens, tree, .. } = input;
        let vocab = pass.vocab;
        self.decode_time += pass.elapsed;
        let start = self.cache.len() - tokens.len();
        let (params, rng) = (&self.config.sampling, &mut self.rng);
        let verdict = match self.constraint.as_mut() {
            Some(c) => verify_constrained(c, rows, vocab, &tree, &self.tokens, params, rng),
            None => verify_tree(rows, vocab, &tree, &self.tokens, params, rng),
        };
        // The rows whose logits predicted each emitted token: the root's, then each accepted
        // node's. Keep the cache for the root and the accepted path only.
        let kept = path_rows(&verdict.path);
        self.cache.keep_rows(start, &kept);
        self.stats.count_step(&tree, &verdict.path);
        self.teach_drafter(rows, &verdict.path, tokens.len(), pass);
        for (&t, &r) in verdict.tokens.iter().zip(&kept) {
            self.stats.decode_tokens += 1;
            if !self.emit(tok, t, &rows[r * vocab..(r + 1) * vocab]) {
                break;
            }
        }
    }

    /// Hands the drafter what the pass showed: the model's top candidates at every row (when its
    /// model source is on), the accepted path, and (alone, greedy) what `rows` rows cost.
    fn teach_drafter(&mut self, logits: &[f32], path: &[usize], rows: usize, pass: &Pass) {
        let Some(d) = self.drafter.as_mut() else {
            return;
        };
        let k = d.wants_predictions();
        if k > 0 {
            let top: Vec<Vec<u32>> = logits
                .chunks_exact(pass.vocab)
                .map(|r| top_ids(r, k))
                .collect();
            d.record_predictions(&top);
        }
        d.observe(path);
        // Timings vary from run to run: they may steer draft lengths only where the output cannot
        // depend on them (greedy), so seeded sampling stays reproducible. A pass shared with other
        // sequences says nothing about this one's draft cost.
        if self.config.sampling.is_greedy() && pass.alone {
            d.observe_cost(rows, pass.elapsed.as_secs_f64());
        }
    }
}
