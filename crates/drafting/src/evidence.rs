//! The draft of a set of candidates (`draft`: their best path, or the walk below), and drafts
//! sized by evidence: the [`Scored`](crate::MatchPolicy::Scored) chain when
//! [`ScoreParams::min_token_probability`] is set.
//!
//! Every examined occurrence of the matched suffix n-gram also knows its match length: how many
//! tokens before its continuation agree with the end of the sequence (up to
//! [`MAX_MATCH`](crate::scored::MAX_MATCH)). For each match length `m` among them, the
//! occurrences matching at least `m` tokens are read as a trie of continuations, and a path is
//! walked from the heaviest child down (weighted by rank as in `scored`). Each token's estimated
//! probability of being accepted once the tokens before it are has the odds
//! `L * a / (2.3 * (1 + o))`: `L = m + depth` is the context that agrees (the drafted tokens
//! before it, once accepted, count as agreed context), `a` the examined occurrences on the path
//! that continue with the token and `o` those that continue otherwise (occurrences that end
//! there count for neither). Where the [`Drafter`](crate::Drafter) calibrates
//! ([`ScoreParams::calibrate`]), that estimate is scaled by how the sequence's own earlier drafts
//! fared (see `calibration.rs`). The draft keeps a token only while the product of the estimates
//! down the path (its estimated probability of being accepted) stays at or above the threshold;
//! of the match lengths, the one whose path has the most expected accepted tokens (the sum of
//! those products) wins, the longer on a tie, as in SuffixDecoding.
//!
//! The odds are a logistic fit (`logit p = b0 + b1 ln L + b2 ln a + b3 ln (1 + o)`) to every
//! tried token of replays of recorded greedy outputs, drafts at full length with a corpus (pld's
//! 115 recorded turns, 14,368 tried tokens; the 30 rows replayed in vLLM, 2,003): both sets gave
//! `b1`, `b2` and `-b3` within 0.8-1.2 and `b0` about -0.85, so the fit was rounded to
//! exponents of 1 and `e^0.85 = 2.3`. Counting occurrences matters: a token on which 4 or more
//! occurrences agree after a 1-token match was accepted 89% of the time, a lone one 35%, one
//! against 4 or more others 8%. (The curve this replaced, the weighted share times
//! `L / (L + 4)` with `L = m + 2 * depth`, fit those tokens worse, log-likelihood -0.540 against
//! -0.485 on the 115 turns.)

use crate::calibration::{band, Calibration, Estimate};
use crate::scored::{Candidates, ScoreParams, MAX_SCORED_OCCURRENCES};

/// The draft for `k` tokens of candidates `c` under `params`: their
/// [`best_path`](Candidates::best_path), or the evidence walk where
/// `params.min_token_probability` is set; returns the rank of the most recent candidate that
/// follows it.
pub(crate) fn draft(c: &Candidates, k: usize, params: &ScoreParams, out: &mut Vec<u32>) -> usize {
    draft_calibrated(c, k, params, None, out, &mut Vec::new())
}

/// [`draft`] with the evidence walk's estimates calibrated by `calibration` (where given) and its
/// tokens' uncalibrated estimates appended to `estimates`.
pub(crate) fn draft_calibrated(
    c: &Candidates,
    k: usize,
    params: &ScoreParams,
    calibration: Option<&Calibration>,
    out: &mut Vec<u32>,
    estimates: &mut Vec<Estimate>,
) -> usize {
    if params.min_token_probability > 0.0 {
        evidence_path(c, k, params, calibration, out, estimates)
    } else {
        c.best_path(k, params, out)
    }
}

/// Bands of match lengths walked once each: up to 1, 2-3, 4-7, 8-15, 16 and more. (Walking
/// every distinct length instead drafted the same tokens within 0.05% on the replays.)
const MATCH_BANDS: usize = 5;

fn match_band(m: usize) -> usize {
    match m {
        0 | 1 => 0,
        2 | 3 => 1,
        4..=7 => 2,
        8..=15 => 3,
        _ => 4,
    }
}

/// `C` in the odds `L * a / (C * (1 + o))` of a token.
const ODDS_SCALE: f64 = 2.3;
/// What one drafted (and, for the token after it, accepted) token adds to `L`.
const DEPTH_GAIN: f64 = 1.0;

/// The estimated probability that a token is accepted once the tokens before it are, when the
/// context agreed over `agreed` tokens and `agree` examined occurrences continue with it while
/// `other` continue otherwise.
fn estimate(agreed: f64, agree: usize, other: usize) -> f64 {
    let odds = agreed * agree as f64 / (ODDS_SCALE * (1 + other) as f64);
    odds / (1.0 + odds)
}

/// What every walk of one proposal shares.
struct Walks<'c, 'a> {
    c: &'c Candidates<'a>,
    /// The most tokens drafted.
    cap: usize,
    /// The threshold on a token's estimated probability of acceptance.
    min_p: f64,
    weights: [u64; MAX_SCORED_OCCURRENCES],
    calibration: Option<&'c Calibration>,
}

impl Walks<'_, '_> {
    /// Appends to `out` the walk down the continuations of the candidates whose match is at
    /// least `m` long, and to `estimates` each token's estimate before calibration; returns the
    /// expected accepted tokens and the rank of the most recent candidate that follows the whole
    /// path.
    fn walk(&self, m: usize, out: &mut Vec<u32>, estimates: &mut Vec<Estimate>) -> (f64, usize) {
        let Walks {
            c,
            cap,
            min_p,
            ref weights,
            calibration,
        } = *self;
        let mut alive = [0u8; MAX_SCORED_OCCURRENCES];
        let mut alive_len = 0;
        for i in 0..c.len() {
            if c.matched(i) >= m {
                alive[alive_len] = i as u8;
                alive_len += 1;
            }
        }
        let (mut p, mut score) = (1.0f64, 0.0f64);
        let first = alive[0] as usize;
        for depth in 0..cap {
            let Some((token, _, with)) = c.heaviest_child(&alive[..alive_len], depth, weights)
            else {
                break; // every candidate on the path ends here
            };
            let mut next = alive;
            let agree = c.keep_following(&mut next[..alive_len], depth, token);
            let agreed = m as f64 + DEPTH_GAIN * depth as f64;
            let raw = estimate(agreed, agree, with - agree);
            let q = p * calibration.map_or(raw, |c| c.estimate(raw, agreed));
            if q < min_p {
                break;
            }
            p = q;
            score += p;
            out.push(token);
            estimates.push(Estimate {
                band: band(agreed),
                p: raw as f32,
                path: p as f32,
            });
            alive = next;
            alive_len = agree;
        }
        (
            score,
            if alive_len > 0 {
                alive[0] as usize
            } else {
                first
            },
        )
    }
}

/// Appends to `out` the draft of the match length with the most expected accepted tokens (see
/// the module), estimated under `calibration` where given, and to `estimates` its tokens'
/// estimates before calibration; returns the rank of the most recent candidate that follows it.
/// There must be at least one candidate.
pub(crate) fn evidence_path(
    c: &Candidates,
    k: usize,
    params: &ScoreParams,
    calibration: Option<&Calibration>,
    out: &mut Vec<u32>,
    estimates: &mut Vec<Estimate>,
) -> usize {
    evidence_path_counted(c, k, params, calibration, out, estimates).0
}

/// [`evidence_path`], also returning how many walks it took.
fn evidence_path_counted(
    c: &Candidates,
    k: usize,
    params: &ScoreParams,
    calibration: Option<&Calibration>,
    out: &mut Vec<u32>,
    estimates: &mut Vec<Estimate>,
) -> (usize, usize) {
    debug_assert!(c.len() > 0, "a path needs a candidate");
    let base = out.len();
    let est_base = estimates.len();
    let (mut best_len, mut best_score, mut best_rank) = (0, 0.0, 0);
    // One walk per band of match lengths (at most MATCH_BANDS, however many candidates), at the
    // shortest length in the band (the walk there reads every candidate of the band and the
    // longer ones), shortest first so that a tie goes to the longer.
    let walks = Walks {
        c,
        cap: k,
        min_p: params.min_token_probability,
        weights: params.weights(c.len()),
        calibration,
    };
    let mut lengths = [usize::MAX; MATCH_BANDS];
    for i in 0..c.len() {
        let m = c.matched(i);
        let b = match_band(m);
        lengths[b] = lengths[b].min(m);
    }
    let mut walked = 0;
    for m in lengths.into_iter().filter(|&m| m != usize::MAX) {
        walked += 1;
        let (score, rank) = walks.walk(m, out, estimates);
        if score > 0.0 && score >= best_score {
            out.drain(base..base + best_len);
            estimates.drain(est_base..est_base + best_len);
            best_len = out.len() - base;
            best_score = score;
            best_rank = rank;
        } else {
            out.truncate(base + best_len);
            estimates.truncate(est_base + best_len);
        }
    }
    (best_rank, walked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(runs: &[(&[u32], usize)], k: usize, min_p: f64) -> Vec<u32> {
        let params = ScoreParams {
            decay: 1.0,
            min_token_probability: min_p,
            ..ScoreParams::default()
        };
        let mut c = Candidates::new(params.max_occurrences);
        for (i, (run, m)) in runs.iter().enumerate() {
            c.push(run, i, *m);
        }
        let mut out = Vec::new();
        evidence_path(&c, k, &params, None, &mut out, &mut Vec::new());
        out
    }

    #[test]
    fn a_longer_match_drafts_further() {
        let run: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8];
        // One occurrence matching 1 token: odds 1/2.3 for the first token (0.30), then 0.30 *
        // 0.47 (0.14), * 0.57 (0.080), * 0.64 (0.051), * 0.68 (0.035), ...
        assert_eq!(draft(&[(run, 1)], 8, 0.05), [1, 2, 3, 4]);
        assert_eq!(draft(&[(run, 1)], 8, 0.1), [1, 2]);
        assert_eq!(draft(&[(run, 1)], 8, 0.31), [] as [u32; 0]);
        // Matching 24 tokens: 0.91, then 0.91 * 0.92, ...
        assert_eq!(draft(&[(run, 24)], 8, 0.3).len(), 8);
        assert_eq!(draft(&[(run, 24)], 3, 0.3).len(), 3, "K caps the draft");
    }

    #[test]
    fn the_best_match_length_wins() {
        // Three short matches agree on 9; one long match says 1 2 3 ...: the long one expects
        // more accepted tokens.
        let a: &[u32] = &[9, 9, 9];
        let b: &[u32] = &[1, 2, 3, 4, 5, 6];
        assert_eq!(draft(&[(a, 1), (a, 1), (a, 1), (b, 20)], 6, 0.1), b);
        // Disagreement at a short match drafts nothing (odds 1 / (2.3 * 2): 0.18).
        let c: &[u32] = &[7];
        assert!(draft(&[(a, 1), (c, 1)], 6, 0.2).is_empty());
        assert_eq!(draft(&[(a, 1), (c, 1)], 6, 0.15), [9]);
    }

    #[test]
    fn a_proposal_walks_at_most_one_path_per_band() {
        // 24 occurrences, each matching a different length: 5 walks, not 24.
        let runs: Vec<Vec<u32>> = (0..24).map(|i| vec![i, 100 + i, 200 + i]).collect();
        let params = ScoreParams {
            max_occurrences: 64,
            min_token_probability: 0.01,
            ..ScoreParams::default()
        };
        let mut c = Candidates::new(params.max_occurrences);
        for (i, run) in runs.iter().enumerate() {
            c.push(run, i, i + 1);
        }
        let mut out = Vec::new();
        let (_, walked) = evidence_path_counted(&c, 8, &params, None, &mut out, &mut Vec::new());
        assert_eq!(walked, MATCH_BANDS);
        // Band 16+ is walked at 16, over the 9 occurrences matching 16 or more (which all
        // disagree): the most recent of them, matching 16, gives odds 16 / (2.3 * 9) for its
        // first token, then its lone run; no shorter band expects as many tokens.
        assert_eq!(out, runs[15]);
    }

    #[test]
    fn agreeing_occurrences_raise_the_estimate() {
        // After a 1-token match a lone occurrence gives 0.30, four that agree 0.63.
        let run: &[u32] = &[1, 2];
        assert!(draft(&[(run, 1)], 8, 0.5).is_empty());
        assert_eq!(draft(&[(run, 1); 4], 1, 0.5), [1]);
        // Occurrences that end before a depth do not count against the token there.
        let short: &[u32] = &[1];
        assert_eq!(draft(&[(run, 3), (short, 3), (short, 3)], 8, 0.5), [1, 2]);
    }
}
