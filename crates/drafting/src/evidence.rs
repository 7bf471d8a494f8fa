//! Drafts sized by evidence: the [`Scored`](crate::MatchPolicy::Scored) chain when
//! [`ScoreParams::min_token_probability`] is set.
//!
//! Every examined occurrence of the matched suffix n-gram also knows its match length: how many
//! tokens before its continuation agree with the end of the sequence (up to
//! [`MAX_MATCH`](crate::scored::MAX_MATCH)). For each match length `m` among them, the
//! occurrences matching at least `m` tokens are read as a trie of continuations (weighted by
//! rank as in `scored`), and a path is walked from the heaviest child down. Each token's
//! estimated probability of being accepted once the tokens before it are is the child's share
//! of the weight there times the reliability of a copy whose context agrees over `L` tokens,
//! `L / (L + 4)`, with `L = m + 2 * depth` (the drafted tokens before it, once accepted, count as
//! context that agreed). The draft keeps a token only while the product of those estimates down
//! the path (its estimated probability of being accepted) stays at or above the threshold; of the
//! match lengths, the one whose path has the most expected accepted tokens (the sum of those
//! products) wins, the longer on a tie, as in SuffixDecoding.
//!
//! The reliability was measured on replays of recorded greedy outputs (pld's 115 recorded turns,
//! every step's draft at full length, no threshold): the first token of a draft from a single
//! occurrence was accepted 18% of the time after a match of 1 token, 32% after 2, 49% after 4,
//! 56% after 9-16 and 88% after 17 or more (`m / (m + 4)`: 20%, 33%, 50%, 69-80%, 81-86%); the
//! 30 rows replayed in vLLM gave the same table within their noise (12%, 25%, 35%, ..., 82%).
//! Later tokens, given the earlier ones were accepted, were accepted more often than `m + depth`
//! predicts, hence the factor of 2 on depth.

use crate::scored::{Candidates, ScoreParams, MAX_SCORED_OCCURRENCES};

/// `L` in the reliability `L / (L + RELIABILITY_PRIOR)` of a copy whose context agrees over `L`
/// tokens.
const RELIABILITY_PRIOR: f64 = 4.0;
/// What one drafted (and, for the token after it, accepted) token adds to `L`.
const DEPTH_GAIN: f64 = 2.0;

/// The estimated probability that a copy whose context agreed over `agreed` tokens goes on.
fn reliability(agreed: f64) -> f64 {
    agreed / (agreed + RELIABILITY_PRIOR)
}

/// Appends to `out` the walk down the continuations of the candidates whose match is at least
/// `m` long (at most `cap` tokens, cut below `min_p`); returns the expected accepted tokens and
/// the rank of the most recent candidate that follows the whole path.
fn walk(
    c: &Candidates,
    m: usize,
    cap: usize,
    params: &ScoreParams,
    out: &mut Vec<u32>,
) -> (f64, usize) {
    let mut alive = [0u8; MAX_SCORED_OCCURRENCES];
    let mut alive_len = 0;
    for i in 0..c.len() {
        if c.matched(i) >= m {
            alive[alive_len] = i as u8;
            alive_len += 1;
        }
    }
    let weights = params.weights();
    let (mut p, mut score) = (1.0f64, 0.0f64);
    let first = alive[0] as usize;
    for depth in 0..cap {
        let Some((token, share)) = c.heaviest_child(&alive[..alive_len], depth, &weights) else {
            break; // every candidate on the path ends here
        };
        let q = p * share * reliability(m as f64 + DEPTH_GAIN * depth as f64);
        if q < params.min_token_probability {
            break;
        }
        p = q;
        score += p;
        out.push(token);
        alive_len = c.keep_following(&mut alive[..alive_len], depth, token);
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

/// Appends to `out` the draft of the match length with the most expected accepted tokens (see
/// the module) and returns the rank of the most recent candidate that follows it. There must be
/// at least one candidate.
pub(crate) fn evidence_path(
    c: &Candidates,
    k: usize,
    params: &ScoreParams,
    out: &mut Vec<u32>,
) -> usize {
    debug_assert!(c.len() > 0, "a path needs a candidate");
    let base = out.len();
    let (mut best_len, mut best_score, mut best_rank) = (0, 0.0, 0);
    // Each distinct match length once, shortest first (so a tie goes to the longer).
    let mut m = 0;
    while let Some(next) = (0..c.len()).map(|i| c.matched(i)).filter(|&l| l > m).min() {
        m = next;
        let (score, rank) = walk(c, m, k, params, out);
        if score > 0.0 && score >= best_score {
            out.drain(base..base + best_len);
            best_len = out.len() - base;
            best_score = score;
            best_rank = rank;
        } else {
            out.truncate(base + best_len);
        }
    }
    best_rank
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
        evidence_path(&c, k, &params, &mut out);
        out
    }

    #[test]
    fn a_longer_match_drafts_further() {
        let run: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8];
        // One occurrence matching 1 token: 1/5 for the first token, then 1/5 * 3/7, ...
        assert_eq!(draft(&[(run, 1)], 8, 0.05), [1, 2]);
        assert_eq!(draft(&[(run, 1)], 8, 0.3), [] as [u32; 0]);
        // Matching 24 tokens: 0.86, then 0.86 * 0.87, ...
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
        // Disagreement at a short match drafts nothing.
        let c: &[u32] = &[7];
        assert!(draft(&[(a, 1), (c, 1)], 6, 0.15).is_empty());
    }
}
