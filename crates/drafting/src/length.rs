//! How many of the proposed tokens to send to verification.
//!
//! Verifying a draft is not free: a forward pass over `t` tokens costs `1 + price * (t - 1)` times a
//! pass over one (price is small on a GPU and large on a CPU). With per-token acceptance
//! probability `a`, a draft of `k` tokens yields `(1 - a^(k+1)) / (1 - a)` tokens in expectation, so
//! the best `k` maximizes that over the pass cost, and is 0 when no draft pays for itself. Free-form
//! chat, where drafts are rarely right, then decodes at plain speed instead of slower.
//!
//! `DraftLength` estimates `a` separately for each matched n-gram size (a long match predicts
//! better than a single repeated token) from decayed counts of accepted and rejected tokens, and
//! `price` from the measured cost of passes. A sequence that does not draft (no draft pays at the
//! current estimates and cost) still sends a one-token probe now and then, with the gap between
//! probes doubling after each rejected one and a probe at every step while they land: a wrong guess about acceptance or cost can then never
//! switch drafting off for good, accepted probes build the evidence that turns longer drafts back
//! on, and free-form text pays almost nothing for the probes.

use crate::MAX_NGRAM;

/// Prior guess of the price of a drafted row: the extra cost of each drafted token in a pass,
/// relative to a one-token pass
/// (refined from measured pass times as a sequence decodes). `pld bench forward` puts it at
/// 0.05-0.15 with the packed kernels on all three models.
pub const PRIOR_PRICE: f64 = 0.1;

/// Decay of the acceptance counts per observation (an effective memory of about 20 drafts).
const DECAY: f64 = 0.95;
/// Prior pseudo-counts of accepted and rejected tokens: a prior acceptance of one half.
const PRIOR_ACCEPT: f64 = 1.0;
const PRIOR_REJECT: f64 = 1.0;
/// The smallest expected gain in tokens per unit of pass cost for which a draft (chain or tree) is
/// sent.
pub(crate) const MIN_GAIN: f64 = 0.1;
/// Steps without a draft before the first probe; the gap doubles after every rejected probe, up to
/// `MAX_PROBE_GAP`.
const FIRST_PROBE_GAP: u32 = 8;
const MAX_PROBE_GAP: u32 = 512;

/// When a drafter that has been sending nothing sends a one-token probe: after `gap` steps without
/// a draft; the gap doubles after every rejected probe (from `FIRST_PROBE_GAP` up to
/// `MAX_PROBE_GAP`) and is 0 after an accepted one (the next step probes again). Used by the chain's [`DraftLength`] and by the tree drafter.
#[derive(Clone, Debug)]
pub(crate) struct Probes {
    /// Steps since the last draft was sent.
    since_draft: u32,
    /// Steps without a draft after which a probe is sent.
    gap: u32,
}

impl Probes {
    pub(crate) fn new() -> Self {
        Probes {
            since_draft: 0,
            gap: FIRST_PROBE_GAP,
        }
    }

    /// Whether a probe is due (and, until the next [`sent`](Self::sent), whether what was sent
    /// counts as one).
    pub(crate) fn due(&self) -> bool {
        self.since_draft >= self.gap
    }

    /// Counts a step without a draft.
    pub(crate) fn idle(&mut self) {
        self.since_draft = self.since_draft.saturating_add(1);
    }

    /// Counts a verified draft; `accepted` is whether any of it was kept.
    pub(crate) fn sent(&mut self, accepted: bool) {
        if self.due() {
            // This was a probe. After a success probe again at the next step: text that has just
            // been copied right tends to go on being copyable, and each landed probe is the
            // evidence that turns real drafts on (on a mixture of experts, where a drafted row
            // costs over half a token, a handful of probes a few steps apart would leave most of
            // a copied passage undrafted). After a rejection back off, doubling the gap.
            self.gap = if accepted {
                0
            } else {
                (self.gap * 2).clamp(FIRST_PROBE_GAP, MAX_PROBE_GAP)
            };
        }
        self.since_draft = 0;
    }
}

/// The draft length that maximizes expected tokens per unit of pass cost at `price` a row, where
/// `paths` gives, for each drafted token in order, the probability that it and every token before
/// it are accepted; 0 when no length promises a clear gain.
fn best_prefix(price: f64, paths: impl Iterator<Item = f64>) -> usize {
    let price = price.max(0.0);
    let mut best = (1.0, 0usize); // no draft: one token for one unit of cost
    let mut expected = 1.0; // the model's own token, plus the drafted ones expected to land
    for (i, p) in paths.enumerate() {
        expected += p;
        let rate = expected / (1.0 + price * (i + 1) as f64);
        if rate > best.0 {
            best = (rate, i + 1);
        }
    }
    // A draft must promise a clear gain: estimates and costs are noisy, and a marginal draft
    // risks a loss for almost nothing.
    if best.0 < 1.0 + MIN_GAIN {
        return 0;
    }
    best.1
}

/// Chooses draft lengths from acceptance estimates per n-gram size and the price of a row.
#[derive(Clone, Debug)]
pub struct DraftLength {
    accepted: [f64; MAX_NGRAM + 1],
    rejected: [f64; MAX_NGRAM + 1],
    /// Extra cost of each token beyond the first in a pass, relative to a one-token pass.
    price: f64,
    one_token_cost: Option<f64>,
    probes: Probes,
}

impl DraftLength {
    /// A controller with a prior guess of the per-token pass cost `price`.
    pub fn new(price: f64) -> Self {
        DraftLength {
            accepted: [0.0; MAX_NGRAM + 1],
            rejected: [0.0; MAX_NGRAM + 1],
            price: price.max(0.0),
            one_token_cost: None,
            probes: Probes::new(),
        }
    }

    /// Estimated probability that a drafted token from an n-gram match of size `n` is accepted.
    pub fn acceptance(&self, n: usize) -> f64 {
        let n = n.min(MAX_NGRAM);
        (self.accepted[n] + PRIOR_ACCEPT)
            / (self.accepted[n] + self.rejected[n] + PRIOR_ACCEPT + PRIOR_REJECT)
    }

    /// The price of a drafted row, in plain tokens, as learned from this sequence's passes.
    pub fn price(&self) -> f64 {
        self.price
    }

    /// The number of drafted tokens (at most `available`) to send for a match of size `n`: the one
    /// that maximizes expected tokens per unit of pass cost, or a one-token probe when no draft has
    /// been sent for a while and the match is at least two tokens long (a single repeated token
    /// is the weakest evidence: its continuation lands about one time in five, which does not
    /// pay for the probe's row where a row costs over half a token, as on a mixture of experts).
    pub fn choose(&self, n: usize, available: usize) -> usize {
        self.choose_at_price(self.price, n, available)
    }

    /// `choose` with the pass cost `price` given from outside (a scheduler that knows what a row
    /// costs in the current batch).
    pub fn choose_at_price(&self, price: f64, n: usize, available: usize) -> usize {
        self.or_probe(self.best_length_at_price(price, n, available), n, available)
    }

    /// `choose_at_price` for a draft whose own estimates are known: the `i`-th of `paths` is the
    /// estimated probability that its first `i + 1` tokens are all accepted (an evidence-sized
    /// chain), so the expected tokens of a draft of `k` are `1 + paths[0] + ... + paths[k - 1]`.
    /// `n` is the size of the match behind it, for the probe.
    pub fn choose_from_paths(
        &self,
        price: f64,
        n: usize,
        paths: impl ExactSizeIterator<Item = f64>,
    ) -> usize {
        let available = paths.len();
        self.or_probe(best_prefix(price, paths), n, available)
    }

    /// `best`, or a one-token probe when `best` is no draft, a probe is due and the match is at
    /// least two tokens long (see [`Probes`]).
    pub(crate) fn or_probe(&self, best: usize, n: usize, available: usize) -> usize {
        match best {
            0 if self.probes.due() && n >= 2 => available.min(1),
            k => k,
        }
    }

    /// The number of drafted tokens (at most `available`) that maximizes expected tokens per unit
    /// of pass cost, for a match of size `n`.
    pub fn best_length(&self, n: usize, available: usize) -> usize {
        self.best_length_at_price(self.price, n, available)
    }

    fn best_length_at_price(&self, price: f64, n: usize, available: usize) -> usize {
        best_prefix(price, self.paths(n, available))
    }

    /// For each of `len` drafted tokens from a match of size `n`, the estimated probability that
    /// it and every token before it are accepted: `a^i` for token `i` (from 1), `a` the
    /// acceptance of the match's size.
    pub(crate) fn paths(&self, n: usize, len: usize) -> impl Iterator<Item = f64> {
        let a = self.acceptance(n).min(0.999);
        (1..=len).scan(1.0, move |power, _| {
            *power *= a;
            Some(*power)
        })
    }

    /// Records a verified draft: `drafted` tokens from a match of size `n`, of which the first
    /// `accepted` were kept.
    pub fn observe(&mut self, n: usize, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let n = n.min(MAX_NGRAM);
        self.probes.sent(accepted > 0);
        for i in 0..=MAX_NGRAM {
            self.accepted[i] *= DECAY;
            self.rejected[i] *= DECAY;
        }
        self.accepted[n] += accepted as f64;
        self.rejected[n] += f64::from(u8::from(accepted < drafted));
    }

    /// Counts a step without a draft. The estimates stay as they are: they move on evidence
    /// only, and the probes bring that evidence when no draft pays.
    pub fn idle(&mut self) {
        self.probes.idle();
    }

    /// Records how long a pass over `tokens` tokens took, refining `price`.
    pub fn observe_cost(&mut self, tokens: usize, seconds: f64) {
        if tokens == 1 {
            self.one_token_cost = Some(match self.one_token_cost {
                Some(c) => 0.8 * c + 0.2 * seconds,
                None => seconds,
            });
        } else if let Some(one) = self.one_token_cost {
            let per_token = ((seconds / one) - 1.0) / (tokens - 1) as f64;
            if per_token.is_finite() {
                self.price = 0.8 * self.price + 0.2 * per_token.clamp(0.0, 2.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_matches_get_long_drafts_bad_ones_none() {
        let mut c = DraftLength::new(0.3);
        for _ in 0..40 {
            c.observe(3, 8, 8);
            c.observe(1, 4, 0);
        }
        assert!(c.acceptance(3) > 0.9);
        assert!(c.acceptance(1) < 0.1);
        assert_eq!(c.choose(3, 8), 8);
        assert_eq!(c.choose(1, 8), 0);
    }

    #[test]
    fn a_draft_with_its_own_estimates_is_cut_where_it_stops_paying() {
        let c = DraftLength::new(0.1);
        // Tokens 1-2 very likely, then unlikely: rates 1.73, 2.25, 2.15, 2.02 at 0.1 a row.
        let paths = [0.9, 0.8, 0.1, 0.05];
        assert_eq!(c.choose_from_paths(0.1, 3, paths.into_iter()), 2);
        // Free rows: everything with any chance goes.
        assert_eq!(c.choose_from_paths(0.0, 3, paths.into_iter()), 4);
        // A row costing a whole token never pays (and no probe is due yet).
        assert_eq!(c.choose_from_paths(1.0, 3, paths.into_iter()), 0);
        // The estimates decide, not the acceptance learned per n-gram size: a copy whose tokens
        // are all near certain is sent whole after drafts of this size kept failing.
        let mut c = DraftLength::new(0.1);
        for _ in 0..30 {
            c.observe(3, 8, 0);
        }
        assert_eq!(c.choose_at_price(0.1, 3, 8), 0);
        assert_eq!(c.choose_from_paths(0.1, 3, [0.97; 8].into_iter()), 8);
    }

    #[test]
    fn marginal_drafts_are_not_sent() {
        let mut c = DraftLength::new(0.0);
        // Nine in ten drafted tokens accepted.
        for _ in 0..60 {
            c.observe(3, 10, 9);
        }
        let a = c.acceptance(3);
        assert!(a > 0.85 && a < 0.95, "{a}");
        // At a price of 0.8 tokens per drafted row the best draft gains under 10%: none is sent.
        assert_eq!(c.best_length_at_price(0.8, 3, 8), 0);
        // At 0.5 it clearly pays.
        assert!(c.best_length_at_price(0.5, 3, 8) > 0);
    }

    #[test]
    fn cheap_passes_allow_longer_drafts() {
        let c = DraftLength::new(0.02);
        let costly = DraftLength::new(0.8);
        assert!(c.choose(2, 16) > costly.choose(2, 16));
        assert_eq!(
            costly.choose(2, 16),
            0,
            "a half-right draft does not pay at 0.8 per token"
        );
    }

    #[test]
    fn switched_off_drafting_comes_back_through_accepted_probes() {
        let mut c = DraftLength::new(0.2);
        for _ in 0..40 {
            c.observe(2, 4, 0);
        }
        assert_eq!(c.choose(2, 4), 0);
        for _ in 0..200 {
            c.idle();
        }
        assert_eq!(c.choose(2, 4), 1, "after a while it probes");
        // The text became predictable: probes are accepted, and full drafts return.
        let mut steps = 0;
        while c.best_length(2, 4) < 4 {
            match c.choose(2, 4) {
                0 => c.idle(),
                k => c.observe(2, k, k),
            }
            steps += 1;
            assert!(steps < 200, "drafting never recovered");
        }
    }

    #[test]
    fn probes_back_off_when_rejected_and_reset_when_accepted() {
        // Passes so costly that no draft pays, whatever the acceptance.
        let mut c = DraftLength::new(2.0);
        assert_eq!(c.best_length(3, 8), 0);
        let mut probes = Vec::new();
        for step in 0..400u32 {
            match c.choose(3, 8) {
                0 => c.idle(),
                k => {
                    assert_eq!(k, 1, "a probe is one token");
                    probes.push(step);
                    c.observe(3, 1, 0);
                }
            }
        }
        // Idle steps between consecutive probes: 16, 32, 64, 128, 256.
        let idle: Vec<u32> = probes.windows(2).map(|w| w[1] - w[0] - 1).collect();
        assert_eq!(probes[0], FIRST_PROBE_GAP);
        assert_eq!(idle, [16, 32, 64, 128], "probes at {probes:?}");
        // An accepted probe is followed by another at the very next step, while they land.
        for _ in 0..c.probes.gap {
            c.idle();
        }
        assert_eq!(c.choose(3, 8), 1);
        c.observe(3, 1, 1);
        assert_eq!(c.choose(3, 8), 1, "a landed probe is followed at once");
        c.observe(3, 1, 1);
        assert_eq!(c.choose(3, 0), 0, "nothing to send, no probe");
        // The first rejection after that goes back to the first gap, not to no gap at all.
        assert_eq!(c.choose(3, 8), 1);
        c.observe(3, 1, 0);
        assert_eq!(c.probes.gap, FIRST_PROBE_GAP);
        assert_eq!(c.choose(3, 8), 0);
    }

    #[test]
    fn a_single_token_match_is_never_probed() {
        let mut c = DraftLength::new(2.0);
        for _ in 0..1000 {
            assert_eq!(c.choose(1, 8), 0);
            c.idle();
        }
        assert_eq!(c.choose(2, 8), 1, "a longer match is");
    }

    #[test]
    fn cost_is_learned_from_timings() {
        let mut c = DraftLength::new(1.0);
        for _ in 0..50 {
            c.observe_cost(1, 0.010);
            c.observe_cost(9, 0.014);
        }
        assert!((c.price() - 0.05).abs() < 0.01, "{}", c.price());
    }
}
