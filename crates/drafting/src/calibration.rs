//! Per-sequence calibration of the evidence walk's estimates (see `evidence.rs`).
//!
//! The walk estimates each drafted token's chance of being accepted once the tokens before it
//! are: the share of the continuations that agree on it times `L / (L + 4)`, a curve fitted over
//! all rows of the recorded replays. Rows differ far more than that curve can tell: a summary or
//! a code edit copies its source for dozens of tokens, a story or a chat turn only echoes a word
//! here and there. So each sequence keeps, per band of `L`, decayed sums of what the curve
//! predicted for its tried tokens and of how many of them were accepted; the estimate is scaled
//! by `(accepted + W) / (predicted + W)`, the curve being the prior worth `W` predicted tokens.
//! A row whose drafts keep landing scales its estimates up (longer drafts pass the threshold), a
//! row whose drafts keep failing scales them down (shorter drafts, or none).
//!
//! A token is tried when every token drafted before it was accepted: of a draft of `d` tokens of
//! which `a` were accepted, tokens `0..a` were tried and accepted and token `a` (if `a < d`) was
//! tried and rejected; the rest say nothing.

/// Bands of `L` (the context agreed over, in tokens): below 2, 4, 8, 16, and 16 or more.
pub(crate) const BANDS: usize = 5;

/// The calibrating sums' prior weight `W`, in predicted tokens.
const PRIOR_WEIGHT: f64 = 2.0;
/// Decay of the sums per verified draft (a memory of some 20 drafts).
const DECAY: f64 = 0.95;
/// The most a calibrated estimate can reach.
const MAX_ESTIMATE: f64 = 0.98;

/// The band of a context agreed over `agreed` tokens.
pub(crate) fn band(agreed: f64) -> u8 {
    match agreed {
        a if a < 2.0 => 0,
        a if a < 4.0 => 1,
        a if a < 8.0 => 2,
        a if a < 16.0 => 3,
        _ => 4,
    }
}

/// What the walk estimated for one drafted token before calibration, and its band; and, after
/// calibration, the estimated probability that the draft is accepted up to and including it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Estimate {
    pub(crate) band: u8,
    pub(crate) p: f32,
    pub(crate) path: f32,
}

/// One sequence's calibrating sums.
#[derive(Clone, Debug)]
pub struct Calibration {
    predicted: [f64; BANDS],
    accepted: [f64; BANDS],
}

impl Default for Calibration {
    fn default() -> Self {
        Self::new()
    }
}

impl Calibration {
    /// No evidence yet: every factor is 1.
    pub fn new() -> Self {
        Calibration {
            predicted: [0.0; BANDS],
            accepted: [0.0; BANDS],
        }
    }

    /// The factor on estimates of band `band`.
    pub fn factor(&self, band: usize) -> f64 {
        (self.accepted[band] + PRIOR_WEIGHT) / (self.predicted[band] + PRIOR_WEIGHT)
    }

    /// The calibrated estimate for an uncalibrated `p` at context `agreed`.
    pub(crate) fn estimate(&self, p: f64, agreed: f64) -> f64 {
        (p * self.factor(usize::from(band(agreed)))).min(MAX_ESTIMATE.max(p))
    }

    /// Records the verified outcome of a draft whose tokens had the uncalibrated `estimates`:
    /// the first `accepted` were accepted.
    pub(crate) fn observe(&mut self, estimates: &[Estimate], accepted: usize) {
        if estimates.is_empty() {
            return;
        }
        for b in 0..BANDS {
            self.predicted[b] *= DECAY;
            self.accepted[b] *= DECAY;
        }
        let tried = (accepted + 1).min(estimates.len());
        for (i, e) in estimates[..tried].iter().enumerate() {
            let b = usize::from(e.band);
            self.predicted[b] += f64::from(e.p);
            if i < accepted {
                self.accepted[b] += 1.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimates(p: f32, n: usize) -> Vec<Estimate> {
        vec![
            Estimate {
                band: 2,
                p,
                path: p
            };
            n
        ]
    }

    #[test]
    fn acceptances_raise_and_rejections_lower_the_factor() {
        let mut c = Calibration::new();
        assert_eq!(c.factor(2), 1.0);
        for _ in 0..10 {
            c.observe(&estimates(0.4, 4), 4);
        }
        assert!(c.factor(2) > 2.0, "{}", c.factor(2));
        assert!(c.estimate(0.4, 5.0) > 0.8);
        assert_eq!(c.estimate(0.9, 5.0), MAX_ESTIMATE, "capped");
        assert_eq!(c.factor(0), 1.0, "other bands keep their prior");
        let mut c = Calibration::new();
        for _ in 0..10 {
            c.observe(&estimates(0.4, 4), 0);
        }
        assert!(c.factor(2) < 0.5, "{}", c.factor(2));
        assert!(c.estimate(0.4, 5.0) < 0.2);
    }

    #[test]
    fn only_tried_tokens_count() {
        // Of 4 tokens, the first was rejected: the 3 after it were never tried.
        let mut c = Calibration::new();
        c.observe(&estimates(0.5, 4), 0);
        assert!((c.factor(2) - 2.0 / 2.5).abs() < 1e-9);
        // An empty draft says nothing (and does not decay the sums).
        c.observe(&[], 0);
        assert!((c.factor(2) - 2.0 / 2.5).abs() < 1e-9);
    }
}
