//! The `scored` match policy: the draft follows what the earlier occurrences of the suffix agree
//! on, instead of whatever followed one occurrence picked by its position.
//!
//! Every examined occurrence (the most recent ones, at most [`ScoreParams::max_occurrences`])
//! contributes its continuation, up to `k` tokens. Read together, the continuations form a small
//! trie: the root's children are the distinct tokens that followed the suffix, their children the
//! distinct tokens after those, and so on. Each occurrence carries a weight that falls with its
//! recency rank (`decay^rank`, the most recent at rank 0), so a branch is scored by how often it
//! followed and how recently. The draft walks down the trie taking the heaviest child each time;
//! the child's share of the weight of the occurrences that reached its parent (and still have a
//! token there) is its estimated probability of being right given the path so far, and the
//! product of those shares down the path is the estimated probability that the whole draft is
//! accepted. Drafting stops before the token that would take that product below
//! [`ScoreParams::min_path_probability`], when no examined occurrence has a further token, or at
//! `k` tokens.
//!
//! So the evidence sizes the draft: occurrences that all continue alike give a full draft, ones
//! that split give a short one, or none. A single occurrence has probability 1 at every depth and
//! gives the whole continuation, exactly what [`Recent`](crate::MatchPolicy::Recent) and
//! [`Earliest`](crate::MatchPolicy::Earliest) draft (with one occurrence both pick it). Only
//! occurrences of the longest matching suffix n-gram are examined, so a longer match (more
//! context in common) is trusted over a shorter one, as with the other policies.
//!
//! Rank 0 is not always the most recent occurrence: a sequence that has been copying a stretch
//! of itself (a model quoting its prompt) stands at some place in that stretch, its cursor (see
//! [`NgramIndex::propose_from`](crate::NgramIndex::propose_from); the
//! [`Drafter`](crate::Drafter) keeps it). The occurrence continuing at the cursor, or else the
//! examined one continuing nearest after it, takes rank 0 and the others follow by recency.
//! With the default decay of 0.6 that occurrence outweighs any two others together, but the
//! three next in rank outweigh it when they agree: the copy in progress is followed unless the
//! evidence against it is broad. (On the word-level proxy traces of `examples/replay.rs`, all
//! categories, K = 4, path threshold 0.4: decay 0.6 accepted 4185 tokens from 7827 drafted; 0.5
//! and below, where rank 0 outweighs all others together and counts only size the draft, 4189
//! from 7828; 0.7-1.0, 4097-4103 from 6616-6751. Without the cursor the policy accepted fewer
//! tokens than `earliest` on the code edits.)
//!
//! Weights are integers (`decay^rank` in units of 2^-32), so sums do not depend on the order in
//! which they are added; ties between children go to the one followed by the most recent
//! occurrence. A proposal examines at most [`MAX_SCORED_OCCURRENCES`] occurrences and never
//! allocates, so its cost does not grow with the context.

/// The most occurrences a scored proposal examines (the cap on
/// [`ScoreParams::max_occurrences`]).
pub const MAX_SCORED_OCCURRENCES: usize = 64;

/// The longest match (tokens before a continuation that agree with the end of the sequence)
/// told apart: SuffixDecoding's default tree depth in vLLM.
pub const MAX_MATCH: usize = 24;

/// How many tokens before `end` (exclusive) in `tokens` agree with the end of `suffix`, at most
/// [`MAX_MATCH`].
#[inline]
pub(crate) fn match_length(tokens: &[u32], end: usize, suffix: &[u32]) -> usize {
    tokens[..end]
        .iter()
        .rev()
        .zip(suffix.iter().rev())
        .take(MAX_MATCH)
        .take_while(|(a, b)| a == b)
        .count()
}

/// Smallest accepted [`ScoreParams::decay`].
const MIN_DECAY: f64 = 0.01;

/// One unit of weight: the most recent occurrence weighs 2^32.
const UNIT: f64 = 4_294_967_296.0;

/// Settings of the [`Scored`](crate::MatchPolicy::Scored) policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreParams {
    /// The most recent occurrences examined, at most [`MAX_SCORED_OCCURRENCES`]. The cost of a
    /// proposal grows with it where the suffix is common (two memory reads an occurrence); on the
    /// replay's proxy traces 16, 32 and 64 accepted within 0.3% of each other, so the default is
    /// 32.
    pub max_occurrences: usize,
    /// Weight of the occurrence of rank `r` (0: the one at the cursor, else the most recent) is
    /// `decay^r`; 1 counts every occurrence alike, 0.5 and below lets rank 0 outweigh all others
    /// together.
    pub decay: f64,
    /// Drafting stops before the token that would take the estimated probability of the whole
    /// draft below this (0: never cut on evidence).
    pub min_path_probability: f64,
    /// Above 0, drafts are sized by evidence instead (see `evidence.rs`): at every match length
    /// among the examined occurrences, each token's estimated probability of being accepted
    /// (its share of the continuations times the reliability of a copy matching that long) must
    /// stay at or above this; `min_path_probability` is then unused. 0 (the default) keeps the
    /// heaviest path cut by `min_path_probability`.
    pub min_token_probability: f64,
    /// With `min_token_probability` set: scale the evidence walk's estimates by how the
    /// sequence's own earlier drafts fared (see `calibration.rs`; a [`Drafter`](crate::Drafter)
    /// keeps the sums).
    pub calibrate: bool,
}

impl Default for ScoreParams {
    fn default() -> Self {
        ScoreParams {
            max_occurrences: 32,
            decay: 0.6,
            min_path_probability: 0.4,
            min_token_probability: 0.0,
            calibrate: false,
        }
    }
}

/// The threshold of [`ScoreParams::evidence`].
pub const EVIDENCE_MIN_TOKEN_PROBABILITY: f64 = 0.04;

impl ScoreParams {
    /// The settings of [`MatchPolicy::Evidence`](crate::MatchPolicy::Evidence): drafts sized by
    /// evidence at a threshold of [`EVIDENCE_MIN_TOKEN_PROBABILITY`], calibrated per sequence,
    /// from the 16 most recent occurrences (on the replays 32 drafted and accepted within 0.5%
    /// of 16, at twice the memory reads).
    pub fn evidence() -> Self {
        ScoreParams {
            max_occurrences: 16,
            min_token_probability: EVIDENCE_MIN_TOKEN_PROBABILITY,
            calibrate: true,
            ..ScoreParams::default()
        }
    }

    /// The same settings brought into range: `max_occurrences` into `1..=64`, `decay` into
    /// `[0.01, 1]` and `min_path_probability` into `[0, 1]` (a NaN takes the default).
    #[must_use]
    pub fn sanitized(self) -> Self {
        let default = ScoreParams::default();
        let decay = if self.decay.is_nan() {
            default.decay
        } else {
            self.decay.clamp(MIN_DECAY, 1.0)
        };
        let min_path_probability = if self.min_path_probability.is_nan() {
            default.min_path_probability
        } else {
            self.min_path_probability.clamp(0.0, 1.0)
        };
        let min_token_probability = if self.min_token_probability.is_nan() {
            default.min_token_probability
        } else {
            self.min_token_probability.clamp(0.0, 1.0)
        };
        ScoreParams {
            max_occurrences: self.max_occurrences.clamp(1, MAX_SCORED_OCCURRENCES),
            decay,
            min_path_probability,
            min_token_probability,
            calibrate: self.calibrate,
        }
    }

    /// The integer weight of the occurrence of recency rank `rank`: `decay^rank` in units of
    /// 2^-32, at least 1.
    pub fn weight(&self, rank: usize) -> u64 {
        let w = self.decay.powi(rank.min(i32::MAX as usize) as i32) * UNIT;
        (w as u64).max(1)
    }

    /// `weight` of the ranks below `n` (the rest 0).
    pub(crate) fn weights(&self, n: usize) -> [u64; MAX_SCORED_OCCURRENCES] {
        std::array::from_fn(|rank| if rank < n { self.weight(rank) } else { 0 })
    }
}

/// The continuations of the examined occurrences, most recent first: at most
/// [`MAX_SCORED_OCCURRENCES`], on the stack.
pub(crate) struct Candidates<'a> {
    runs: [&'a [u32]; MAX_SCORED_OCCURRENCES],
    /// Where each occurrence starts in its own sequence (reported in the [`Match`](crate::Match)).
    starts: [u32; MAX_SCORED_OCCURRENCES],
    /// How many tokens before each continuation agree with the end of the sequence (its match
    /// length, at least the n-gram's size, at most [`MAX_MATCH`]).
    matched: [u16; MAX_SCORED_OCCURRENCES],
    /// Whether candidate 0 continues where the copy in progress stands (the cursor).
    pub(crate) at_cursor: bool,
    len: usize,
    cap: usize,
}

impl<'a> Candidates<'a> {
    /// An empty list that takes at most `cap` candidates (clamped to `1..=64`).
    #[inline(always)]
    pub(crate) fn new(cap: usize) -> Self {
        Candidates {
            runs: [&[]; MAX_SCORED_OCCURRENCES],
            starts: [0; MAX_SCORED_OCCURRENCES],
            matched: [0; MAX_SCORED_OCCURRENCES],
            at_cursor: false,
            len: 0,
            cap: cap.clamp(1, MAX_SCORED_OCCURRENCES),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len >= self.cap
    }

    /// Adds the continuation `run` of the next older occurrence (starting at `start`, its match
    /// `matched` tokens long); ignored when full.
    pub(crate) fn push(&mut self, run: &'a [u32], start: usize, matched: usize) {
        if !self.is_full() {
            self.runs[self.len] = run;
            self.starts[self.len] = start.min(u32::MAX as usize) as u32;
            self.matched[self.len] = matched.min(MAX_MATCH) as u16;
            self.len += 1;
        }
    }

    /// Appends `other`'s candidates after these (they rank as older), as many as fit.
    pub(crate) fn extend(&mut self, other: &Candidates<'a>) {
        for i in 0..other.len {
            self.push(
                other.runs[i],
                other.starts[i] as usize,
                other.matched[i] as usize,
            );
        }
    }

    /// Moves candidate `i` to position `at`, shifting those between down one.
    pub(crate) fn promote(&mut self, at: usize, i: usize) {
        self.runs[at..=i].rotate_right(1);
        self.starts[at..=i].rotate_right(1);
        self.matched[at..=i].rotate_right(1);
    }

    /// The match length of candidate `i`.
    pub(crate) fn matched(&self, i: usize) -> usize {
        usize::from(self.matched[i])
    }

    /// The start of candidate `i`.
    pub(crate) fn start(&self, i: usize) -> usize {
        self.starts[i] as usize
    }

    /// Of the candidates `alive` (ranks, most recent first), the next token at `depth` with the
    /// most weight, its share of the weight of those that go on (the first, most recent, on a
    /// tie) and how many go on; `None` where every one ends.
    pub(crate) fn heaviest_child(
        &self,
        alive: &[u8],
        depth: usize,
        weights: &[u64; MAX_SCORED_OCCURRENCES],
    ) -> Option<(u32, f64, usize)> {
        // The distinct next tokens in order of their most recent candidate, with summed weights.
        let mut child_token = [0u32; MAX_SCORED_OCCURRENCES];
        let mut child_weight = [0u64; MAX_SCORED_OCCURRENCES];
        let (mut children, mut total, mut with) = (0, 0u64, 0);
        for &rank in alive {
            let Some(&token) = self.runs[rank as usize].get(depth) else {
                continue;
            };
            let w = weights[rank as usize];
            total += w;
            with += 1;
            match child_token[..children].iter().position(|&t| t == token) {
                Some(c) => child_weight[c] += w,
                None => {
                    child_token[children] = token;
                    child_weight[children] = w;
                    children += 1;
                }
            }
        }
        let mut best = 0;
        for c in 1..children {
            if child_weight[c] > child_weight[best] {
                best = c;
            }
        }
        (children > 0).then(|| {
            let share = child_weight[best] as f64 / total as f64;
            (child_token[best], share, with)
        })
    }

    /// Keeps, in order, the candidates of `alive` whose run has `token` at `depth`; returns how
    /// many.
    pub(crate) fn keep_following(&self, alive: &mut [u8], depth: usize, token: u32) -> usize {
        let mut kept = 0;
        for i in 0..alive.len() {
            let rank = alive[i];
            if self.runs[rank as usize].get(depth) == Some(&token) {
                alive[kept] = rank;
                kept += 1;
            }
        }
        kept
    }

    /// Appends to `out` the draft along the heaviest path (at most `k` tokens, cut where the
    /// path's estimated probability would fall below `params.min_path_probability`) and returns
    /// the rank of the most recent candidate that follows the whole draft. There must be at
    /// least one candidate.
    pub(crate) fn best_path(&self, k: usize, params: &ScoreParams, out: &mut Vec<u32>) -> usize {
        debug_assert!(self.len > 0, "a path needs a candidate");
        if self.len == 1 {
            // Every share is 1 (and a threshold is at most 1): the whole run, as the loop below
            // would find it, without its tables. The usual case where a long n-gram matched.
            let run = self.runs[0];
            out.extend_from_slice(&run[..k.min(run.len())]);
            return 0;
        }
        let weights = params.weights(self.len);
        // The candidates that follow the path so far, most recent first.
        let mut alive = [0u8; MAX_SCORED_OCCURRENCES];
        for (rank, a) in alive[..self.len].iter_mut().enumerate() {
            *a = rank as u8;
        }
        let mut alive_len = self.len;
        let mut path_p = 1.0f64;
        for depth in 0..k {
            let Some((token, share, _)) = self.heaviest_child(&alive[..alive_len], depth, &weights)
            else {
                break; // every candidate on the path ends here
            };
            let p = path_p * share;
            if p < params.min_path_probability {
                break;
            }
            path_p = p;
            out.push(token);
            alive_len = self.keep_following(&mut alive[..alive_len], depth, token);
        }
        alive[0] as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(runs: &[&[u32]], k: usize, params: &ScoreParams) -> (Vec<u32>, usize) {
        let mut c = Candidates::new(params.max_occurrences);
        for (i, r) in runs.iter().enumerate() {
            c.push(r, 100 + i, 1);
        }
        let mut out = Vec::new();
        let rep = c.best_path(k, params, &mut out);
        (out, rep)
    }

    fn params(decay: f64, min_p: f64) -> ScoreParams {
        ScoreParams {
            max_occurrences: MAX_SCORED_OCCURRENCES,
            decay,
            min_path_probability: min_p,
            min_token_probability: 0.0,
            calibrate: false,
        }
    }

    #[test]
    fn one_candidate_gives_its_whole_run() {
        let p = params(0.9, 0.99);
        assert_eq!(draft(&[&[4, 5, 6]], 8, &p), (vec![4, 5, 6], 0));
        assert_eq!(draft(&[&[4, 5, 6]], 2, &p), (vec![4, 5], 0));
        assert_eq!(draft(&[&[4, 5, 6]], 0, &p), (vec![], 0));
    }

    #[test]
    fn the_majority_outweighs_the_most_recent() {
        // The most recent continuation is 9; three older ones say 1 2 3.
        let runs: [&[u32]; 4] = [&[9, 9], &[1, 2, 3], &[1, 2, 3], &[1, 2, 4]];
        let (out, rep) = draft(&runs, 8, &params(1.0, 0.0));
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(rep, 1, "the most recent candidate on the path");
        // With a steep decay the most recent wins alone.
        assert_eq!(draft(&runs, 8, &params(0.3, 0.0)).0, [9, 9]);
    }

    #[test]
    fn disagreement_cuts_the_draft() {
        // Four agree on 1 2, then split 2:2 on 3 / 4.
        let runs: [&[u32]; 4] = [&[1, 2, 3], &[1, 2, 4], &[1, 2, 3], &[1, 2, 4]];
        let p = params(1.0, 0.6);
        assert_eq!(
            draft(&runs, 8, &p).0,
            [1, 2],
            "a 1/2 branch takes the path below 0.6"
        );
        let p = params(1.0, 0.5);
        let (out, rep) = draft(&runs, 8, &p);
        assert_eq!(out, [1, 2, 3], "a tie goes to the most recent");
        assert_eq!(rep, 0);
        // A first token with no majority is not drafted at all.
        let runs: [&[u32]; 3] = [&[1], &[2], &[3]];
        assert_eq!(draft(&runs, 8, &params(1.0, 0.4)).0, [] as [u32; 0]);
    }

    #[test]
    fn runs_that_end_leave_the_vote() {
        // The two runs that say 5 end there: the one left decides the next token alone.
        let runs: [&[u32]; 3] = [&[5], &[5, 6, 7], &[5]];
        assert_eq!(draft(&runs, 8, &params(1.0, 0.9)).0, [5, 6, 7]);
    }

    #[test]
    fn params_are_brought_into_range() {
        let p = ScoreParams {
            max_occurrences: 0,
            decay: f64::NAN,
            min_path_probability: 3.0,
            min_token_probability: f64::NAN,
            calibrate: false,
        }
        .sanitized();
        assert_eq!(p.max_occurrences, 1);
        assert_eq!(p.decay, ScoreParams::default().decay);
        assert_eq!(p.min_path_probability, 1.0);
        let p = ScoreParams {
            max_occurrences: 1000,
            decay: 0.0,
            min_path_probability: -1.0,
            min_token_probability: 2.0,
            calibrate: false,
        }
        .sanitized();
        assert_eq!(
            (p.max_occurrences, p.decay, p.min_path_probability),
            (MAX_SCORED_OCCURRENCES, MIN_DECAY, 0.0)
        );
        assert_eq!(p.min_token_probability, 1.0);
        assert_eq!(p.weight(0), 1 << 32);
        assert_eq!(p.weight(63), 1, "weights never reach 0");
    }

    #[test]
    fn the_cap_bounds_the_candidates() {
        let mut c = Candidates::new(2);
        c.push(&[1], 0, 1);
        c.push(&[2], 1, 1);
        c.push(&[3], 2, 1);
        assert_eq!(c.len(), 2);
        assert!(c.is_full());
    }
}
