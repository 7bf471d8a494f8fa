//! The drafting policy of one sequence, in one place: where drafts come from (the n-gram index over
//! the sequence), how many of the proposed tokens to send (the [`DraftLength`] controller, priced
//! by the pass cost), and what is learned from each verified outcome.
//!
//! The engine's `step` and the offline drafting study drive the same [`Drafter`] through the same
//! four calls per step: [`propose`](Drafter::propose) under a price, then (after verification)
//! [`observe`](Drafter::observe) the accepted count, [`push`](Drafter::push) the tokens that were
//! emitted, and, where timings are trusted, [`observe_cost`](Drafter::observe_cost).

use crate::length::{DraftLength, PRIOR_DRAFT_TOKEN_COST};
use crate::spec_config::{SpecConfig, SpecError};
use crate::NgramIndex;

/// One sequence's drafter: the sequence so far, indexed, and the draft-length controller.
#[derive(Clone, Debug)]
pub struct Drafter {
    index: NgramIndex,
    length: DraftLength,
    /// Most tokens drafted per step (K).
    max_tokens: usize,
    adaptive: bool,
    /// The draft of the current step.
    draft: Vec<u32>,
    /// Size of the n-gram match behind `draft`.
    draft_match: usize,
}

impl Drafter {
    /// Begins drafting over `prompt` with the given settings (which must have speculation on to
    /// draft anything; K = 0 gives a drafter that never proposes).
    pub fn new(config: &SpecConfig, prompt: &[u32]) -> Result<Self, SpecError> {
        let ngram = config.ngram()?;
        Ok(Drafter {
            index: NgramIndex::with_tokens(ngram, prompt),
            length: DraftLength::new(PRIOR_DRAFT_TOKEN_COST),
            max_tokens: config.num_speculative_tokens,
            adaptive: config.adaptive,
            draft: Vec::with_capacity(config.num_speculative_tokens),
            draft_match: 0,
        })
    }

    /// The sequence as the drafter knows it (prompt and emitted tokens).
    pub fn tokens(&self) -> &[u32] {
        self.index.tokens()
    }

    /// Appends an emitted token.
    pub fn push(&mut self, token: u32) {
        self.index.push(token);
    }

    /// Cuts the sequence back to `len` tokens (the estimates are kept).
    pub fn truncate(&mut self, len: usize) {
        self.index.truncate(len);
    }

    /// The draft for the next pass: at most `limit` tokens (and at most K). With adaptive drafting
    /// it is cut to the length expected to pay for its rows at `price` (the cost of a drafted row
    /// in plain tokens, as a scheduler measured it for this batch; `None` uses the drafter's own
    /// estimate from [`observe_cost`](Self::observe_cost)). Empty when nothing is worth sending.
    pub fn propose(&mut self, limit: usize, price: Option<f64>) -> &[u32] {
        self.draft.clear();
        self.draft_match = 0;
        let k = self.max_tokens.min(limit);
        if k == 0 {
            return &self.draft;
        }
        if let Some(m) = self.index.propose(k, &mut self.draft) {
            self.draft_match = m.n;
            if self.adaptive {
                let price = price.unwrap_or(self.length.alpha());
                self.draft
                    .truncate(self.length.choose_at_cost(price, m.n, self.draft.len()));
            }
        }
        &self.draft
    }

    /// Records the verified outcome of the last proposal: its first `accepted` tokens were kept.
    /// A step whose proposal was empty counts as a step without a draft.
    pub fn observe(&mut self, accepted: usize) {
        let drafted = self.draft.len();
        if drafted == 0 {
            self.length.idle();
        } else {
            self.length
                .observe(self.draft_match, drafted, accepted.min(drafted));
        }
        self.draft.clear();
    }

    /// Records what a pass over `rows` rows cost (seconds, or relative to one row), refining the
    /// drafter's own price of a drafted row.
    pub fn observe_cost(&mut self, rows: usize, seconds: f64) {
        self.length.observe_cost(rows, seconds);
    }

    /// The controller's estimates (acceptance by n-gram size, price of a row).
    pub fn length(&self) -> &DraftLength {
        &self.length
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(k: usize, adaptive: bool) -> SpecConfig {
        SpecConfig {
            num_speculative_tokens: k,
            prompt_lookup_max: 3,
            prompt_lookup_min: 1,
            adaptive,
            ..Default::default()
        }
    }

    #[test]
    fn proposes_what_followed_and_respects_the_limit() {
        let mut d = Drafter::new(&config(8, false), &[1, 2, 3, 4, 5, 6, 1, 2]).unwrap();
        assert_eq!(d.propose(8, None), [3, 4, 5, 6, 1, 2]);
        assert_eq!(d.propose(2, None), [3, 4]);
        assert!(d.propose(0, None).is_empty(), "no room, no draft");
        let mut short = Drafter::new(&config(3, false), d.tokens()).unwrap();
        assert_eq!(short.propose(8, None), [3, 4, 5], "K caps the draft");
    }

    #[test]
    fn outcomes_steer_later_drafts() {
        // A sequence whose repeats never continue the same way: every draft is rejected.
        let mut d = Drafter::new(&config(8, true), &[7, 1, 7, 2, 7, 3, 7]).unwrap();
        let mut sent = 0;
        for t in 0..200u32 {
            sent += d.propose(8, Some(0.1)).len();
            d.observe(0);
            d.push(100 + t);
            d.push(7);
        }
        // Rejections switch drafting off except for the occasional one-token probe.
        assert!(sent < 40, "{sent} tokens sent");
        assert!(d.length().acceptance(1) < 0.2);
        // A price no draft can pay sends nothing but probes, even for a perfect match.
        let mut e = Drafter::new(&config(8, true), &[1, 2, 3, 4, 5, 1, 2]).unwrap();
        assert!(e.propose(8, Some(5.0)).len() <= 1);
    }

    #[test]
    fn truncate_rewinds_the_sequence() {
        let mut d = Drafter::new(&config(4, false), &[1, 2, 3, 1]).unwrap();
        d.push(9);
        d.truncate(4);
        assert_eq!(d.tokens(), [1, 2, 3, 1]);
        assert_eq!(d.propose(4, None), [2, 3, 1]);
    }

    #[test]
    fn invalid_settings_are_refused() {
        let mut c = config(4, true);
        c.prompt_lookup_min = 5;
        assert_eq!(
            Drafter::new(&c, &[1]).unwrap_err().field,
            "prompt_lookup_min"
        );
    }
}
