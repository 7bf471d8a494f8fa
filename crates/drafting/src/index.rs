//! The incremental n-gram index behind [`NgramIndex::propose`].

use std::collections::HashMap;
use std::fmt;

use crate::config::{MatchPolicy, NgramConfig, MAX_NGRAM};
use crate::hash::{fold, BuildKeyHasher, SEED};
use crate::scored::{match_length, Candidates, ScoreParams};
use crate::Match;

/// Marks "no position" in the `u32` position arrays.
const NONE: u32 = u32::MAX;

/// The number of n-gram end positions indexed for a sequence of `len`
/// tokens: every position but the last (whose n-grams have no following
/// token yet), capped so that positions fit in a `u32` below [`NONE`].
#[inline]
fn indexed_ends(len: usize) -> usize {
    len.saturating_sub(1).min(NONE as usize)
}

/// `keys[n]`: the key of the n-gram that ends `suffix`, for n = 1..=`max_n` (`max_n` at most
/// the length of `suffix` and [`MAX_NGRAM`]).
#[inline]
fn suffix_keys(suffix: &[u32], max_n: usize) -> [u64; MAX_NGRAM + 1] {
    let mut keys = [0u64; MAX_NGRAM + 1];
    let mut state = SEED;
    for (n, &t) in (1..=max_n).zip(suffix.iter().rev()) {
        state = fold(state, t);
        keys[n] = state;
    }
    keys
}

/// First and most recent indexed end position of one n-gram key.
#[derive(Clone, Copy, Debug)]
struct Slot {
    earliest: u32,
    recent: u32,
}

/// Everything stored for one n-gram size.
#[derive(Clone)]
struct Level {
    /// Key of an n-gram -> where it ends (first and latest occurrence).
    slots: HashMap<u64, Slot, BuildKeyHasher>,
    /// `prev[e]`: the previous indexed end position with the same key as the
    /// n-gram ending at `e`, or [`NONE`]. Also [`NONE`] where `e + 1 < n`
    /// (no n-gram ends there). One entry per indexed end position.
    prev: Vec<u32>,
}

impl Level {
    fn new() -> Self {
        Level {
            slots: HashMap::with_hasher(BuildKeyHasher),
            prev: Vec::new(),
        }
    }
}

/// An append-only (but rewindable) token sequence with, for each n-gram size
/// in the configured range, a map from every n-gram to its earlier
/// occurrences, so that [`propose`](Self::propose) costs the same whatever
/// the length of the sequence.
///
/// An n-gram is indexed when the token after it is pushed, so every stored
/// occurrence has a continuation and the current suffix is never matched
/// against itself.
///
/// Memory is linear in the sequence length: per n-gram size, one `u32` per
/// position plus one map entry per distinct n-gram. Positions are stored as
/// `u32`; n-grams ending at or past position `u32::MAX` are not indexed.
///
/// N-grams are keyed by a 64-bit hash; a lookup compares the tokens of the
/// candidate occurrence with the suffix, and treats a (very unlikely) hash
/// collision as no match at that size.
#[derive(Clone)]
pub struct NgramIndex {
    config: NgramConfig,
    /// Settings of [`MatchPolicy::Scored`] (sanitized).
    score: ScoreParams,
    tokens: Vec<u32>,
    /// `levels[i]` holds the n-grams of size `config.min_n + i`.
    levels: Vec<Level>,
}

impl fmt::Debug for NgramIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NgramIndex")
            .field("config", &self.config)
            .field("len", &self.tokens.len())
            .finish_non_exhaustive()
    }
}

impl NgramIndex {
    /// An empty index.
    ///
    /// The config should come from [`NgramConfig::new`]. One with fields out
    /// of range is sanitized rather than rejected: `min_n` is raised to 1 and
    /// `max_n` lowered to [`MAX_NGRAM`]; if `min_n > max_n` remains, the
    /// index never proposes anything. [`config`](Self::config) returns the
    /// sanitized values.
    pub fn new(config: NgramConfig) -> Self {
        let config = NgramConfig {
            min_n: config.min_n.max(1),
            max_n: config.max_n.min(MAX_NGRAM),
            policy: config.policy,
        };
        let sizes = (config.max_n + 1).saturating_sub(config.min_n);
        NgramIndex {
            config,
            score: ScoreParams::default(),
            tokens: Vec::new(),
            levels: (0..sizes).map(|_| Level::new()).collect(),
        }
    }

    /// An index over `tokens` (as if each were [`push`](Self::push)ed).
    pub fn with_tokens(config: NgramConfig, tokens: &[u32]) -> Self {
        let mut index = NgramIndex::new(config);
        index.extend(tokens);
        index
    }

    /// The (sanitized) configuration.
    pub fn config(&self) -> NgramConfig {
        self.config
    }

    /// Changes the match policy; the stored occurrences serve every policy.
    pub fn set_policy(&mut self, policy: MatchPolicy) {
        self.config.policy = policy;
    }

    /// The settings the scored policies draft with: those set, except that under
    /// [`MatchPolicy::Evidence`] the defaults are [`ScoreParams::evidence`] and a threshold of 0
    /// takes its threshold (and calibration).
    pub fn score_params(&self) -> ScoreParams {
        if self.config.policy != MatchPolicy::Evidence {
            return self.score;
        }
        let evidence = ScoreParams::evidence();
        if self.score == ScoreParams::default() {
            evidence
        } else if self.score.min_token_probability == 0.0 {
            ScoreParams {
                min_token_probability: evidence.min_token_probability,
                calibrate: evidence.calibrate,
                ..self.score
            }
        } else {
            self.score
        }
    }

    /// Changes the settings of the scored policies (brought into range by
    /// [`ScoreParams::sanitized`]).
    pub fn set_score_params(&mut self, params: ScoreParams) {
        self.score = params.sanitized();
    }

    /// The whole sequence.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Number of tokens in the sequence.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the sequence is empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Appends a token, indexing the n-grams that end just before it.
    /// O(`max_n`) amortized.
    pub fn push(&mut self, token: u32) {
        let before = indexed_ends(self.tokens.len());
        self.tokens.push(token);
        if indexed_ends(self.tokens.len()) > before {
            self.index_end(before);
        }
    }

    /// Appends every token of `tokens` in order.
    pub fn extend(&mut self, tokens: &[u32]) {
        self.tokens.reserve(tokens.len());
        let extra = tokens.len();
        for level in &mut self.levels {
            level.prev.reserve(extra);
        }
        for &t in tokens {
            self.push(t);
        }
    }

    /// Keeps the first `len` tokens (no-op if there are not more) and forgets
    /// the n-grams that are no longer followed by a token. Afterwards the
    /// index is exactly as if only those tokens had been pushed. Costs
    /// O(removed tokens × sizes).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.tokens.len() {
            return;
        }
        let keep = indexed_ends(len);
        let had = indexed_ends(self.tokens.len());
        // Most recent first: each end removed is then the latest occurrence
        // of its key, so the slot falls back along the `prev` chain.
        for end in (keep..had).rev() {
            self.unindex_end(end);
        }
        for level in &mut self.levels {
            level.prev.truncate(keep);
        }
        self.tokens.truncate(len);
    }

    /// Empties the sequence and the index (keeping allocations).
    pub fn clear(&mut self) {
        self.tokens.clear();
        for level in &mut self.levels {
            level.slots.clear();
            level.prev.clear();
        }
    }

    /// Writes up to `k` proposed tokens into `out` (clearing it first) and
    /// returns the match they came from, or `None` with `out` left empty.
    ///
    /// Sizes are tried from `max_n` down to `min_n`; the first size whose
    /// suffix n-gram occurred earlier wins, and the configured
    /// [`MatchPolicy`] picks the occurrence. The proposal is the tokens that
    /// followed that occurrence, up to `k` of them and up to the end of the
    /// sequence. With `k == 0` a match is still reported, with `len == 0`.
    pub fn propose(&self, k: usize, out: &mut Vec<u32>) -> Option<Match> {
        self.propose_from(k, None, out)
    }

    /// [`propose`](Self::propose) with a cursor: the position in the sequence where the copy it
    /// has been following stands (the [`Drafter`](crate::Drafter) tracks it: where the source of
    /// its last chain continues, or stopped agreeing with what was emitted; 0 before any).
    /// Under [`MatchPolicy::Scored`] the occurrence of the matched suffix n-gram whose
    /// continuation starts at the cursor ranks first, whether or not it is among the most recent
    /// occurrences; failing that, the examined occurrence whose continuation starts nearest after
    /// the cursor does. The other policies ignore the cursor.
    pub fn propose_from(
        &self,
        k: usize,
        cursor: Option<usize>,
        out: &mut Vec<u32>,
    ) -> Option<Match> {
        out.clear();
        if self.config.policy.is_scored() {
            return self.propose_scored(k, cursor, out);
        }
        let tokens = &self.tokens;
        let len = tokens.len();
        let min_n = self.config.min_n;
        // An earlier occurrence ends at or before len - 2, so n <= len - 1.
        let max_n = self.config.max_n.min(len.saturating_sub(1));
        if self.levels.is_empty() || max_n < min_n {
            return None;
        }
        let keys = suffix_keys(tokens, max_n);

        let suffix_end = len - 1;
        for n in (min_n..=max_n).rev() {
            let level = &self.levels[n - min_n];
            let Some(slot) = level.slots.get(&keys[n]) else {
                continue;
            };
            let end = self.choose(slot, k) as usize;
            let start = end + 1 - n;
            if tokens[start..=end] != tokens[suffix_end + 1 - n..] {
                // Hash collision with a different n-gram: no match at this n.
                continue;
            }
            return Some(crate::copy_continuation(tokens, start, n, k, out));
        }
        None
    }

    /// [`propose`](Self::propose) under [`MatchPolicy::Scored`] and [`MatchPolicy::Evidence`].
    fn propose_scored(&self, k: usize, cursor: Option<usize>, out: &mut Vec<u32>) -> Option<Match> {
        let params = self.score_params();
        let mut candidates = Candidates::new(params.max_occurrences);
        let n = self.scored_candidates(k, cursor, &mut candidates)?;
        let best = crate::evidence::draft(&candidates, k, &params, out);
        Some(Match {
            n,
            start: candidates.start(best),
            len: out.len(),
        })
    }

    /// Adds to `candidates` the continuations (up to `k` tokens each, up to the end of the
    /// sequence) of the most recent earlier occurrences of the longest suffix n-gram that has
    /// any, most recent first, until `candidates` is full; returns that n-gram's size, or `None`
    /// (nothing added) when no suffix n-gram in range occurred before. With a `cursor`, the one
    /// continuing nearest at or after it comes first (see [`propose_from`](Self::propose_from)).
    pub(crate) fn scored_candidates<'a>(
        &'a self,
        k: usize,
        cursor: Option<usize>,
        candidates: &mut Candidates<'a>,
    ) -> Option<usize> {
        let tokens = &self.tokens;
        let len = tokens.len();
        let min_n = self.config.min_n;
        // An earlier occurrence ends at or before len - 2, so n <= len - 1.
        let max_n = self.config.max_n.min(len.saturating_sub(1));
        if self.levels.is_empty() || max_n < min_n {
            return None;
        }
        let keys = suffix_keys(tokens, max_n);
        let before = candidates.len();
        // Match lengths matter only to drafts sized by evidence (reads back from each occurrence).
        let measure = self.score_params().min_token_probability > 0.0;
        let matched = |from: usize, n: usize| {
            if measure {
                match_length(tokens, from, tokens)
            } else {
                n
            }
        };
        for n in (min_n..=max_n).rev() {
            let level = &self.levels[n - min_n];
            let Some(slot) = level.slots.get(&keys[n]) else {
                continue;
            };
            let suffix = &tokens[len - n..];
            // The occurrence continuing at the cursor is checked directly, wherever it is.
            let exact =
                cursor.filter(|&from| from >= n && from < len && &tokens[from - n..from] == suffix);
            if let Some(from) = exact {
                let m = matched(from, n);
                candidates.push(&tokens[from..(from + k).min(len)], from - n, m);
                candidates.at_cursor = before == 0;
            }
            let mut end = slot.recent;
            while end != NONE && !candidates.is_full() {
                let e = end as usize;
                // A different n-gram with the same key (a hash collision) is skipped.
                if &tokens[e + 1 - n..=e] == suffix && Some(e + 1) != exact {
                    let from = e + 1;
                    let m = matched(from, n);
                    candidates.push(&tokens[from..(from + k).min(len)], e + 1 - n, m);
                }
                end = level.prev[e];
            }
            if let (None, Some(c)) = (exact, cursor) {
                // Otherwise the examined occurrence continuing nearest at or after the cursor.
                let nearest = (before..candidates.len())
                    .filter(|&i| candidates.start(i) + n >= c)
                    .min_by_key(|&i| candidates.start(i));
                if let Some(i) = nearest {
                    candidates.promote(before, i);
                }
            }
            if candidates.len() > before {
                return Some(n);
            }
        }
        None
    }

    /// Calls `f(n, from)` for earlier occurrences of the sequence's suffix n-grams, longest `n`
    /// first and, within one size, most recent first, where `from` is the position of the token
    /// that followed the occurrence; at most `max` calls. `f` returns false to stop early.
    /// Occurrences of a shorter n-gram include those of the longer ones already visited; callers
    /// merging continuations into a tree get nothing new from those.
    pub fn for_each_occurrence(&self, max: usize, f: impl FnMut(usize, usize) -> bool) {
        let len = self.tokens.len();
        // An earlier occurrence ends at or before len - 2, so n <= len - 1.
        let longest = self.config.max_n.min(len.saturating_sub(1));
        self.occurrences_of(&self.tokens[len - longest..], max, f)
    }

    /// [`for_each_occurrence`](Self::for_each_occurrence) for the n-grams that end `suffix` (a
    /// sequence other than the indexed one, e.g. a request looked up in a corpus).
    pub fn for_each_occurrence_of(
        &self,
        suffix: &[u32],
        max: usize,
        f: impl FnMut(usize, usize) -> bool,
    ) {
        let longest = self.config.max_n.min(suffix.len());
        self.occurrences_of(&suffix[suffix.len() - longest..], max, f)
    }

    fn occurrences_of(&self, suffix: &[u32], max: usize, mut f: impl FnMut(usize, usize) -> bool) {
        let tokens = &self.tokens;
        let min_n = self.config.min_n;
        let max_n = suffix.len();
        if self.levels.is_empty() || max_n < min_n || max == 0 {
            return;
        }
        let keys = suffix_keys(suffix, max_n);
        let mut calls = 0;
        for n in (min_n..=max_n).rev() {
            let level = &self.levels[n - min_n];
            let Some(slot) = level.slots.get(&keys[n]) else {
                continue;
            };
            let tail = &suffix[max_n - n..];
            let mut end = slot.recent;
            while end != NONE {
                let e = end as usize;
                if &tokens[e + 1 - n..=e] == tail {
                    calls += 1;
                    if !f(n, e + 1) || calls >= max {
                        return;
                    }
                }
                end = level.prev[e];
            }
        }
    }

    /// End position of the occurrence the policy picks from `slot`.
    #[inline]
    fn choose(&self, slot: &Slot, k: usize) -> u32 {
        match self.config.policy {
            // (Scored proposals go through `propose_scored`; the most recent stands in.)
            MatchPolicy::Recent | MatchPolicy::Scored | MatchPolicy::Evidence => slot.recent,
            MatchPolicy::Earliest => slot.earliest,
            MatchPolicy::LongestContinuation => {
                let len = self.tokens.len();
                let supply = |end: u32| k.min(len - 1 - end as usize);
                if supply(slot.earliest) > supply(slot.recent) {
                    slot.earliest
                } else {
                    slot.recent
                }
            }
        }
    }

    /// Indexes the n-grams (of every configured size) ending at `end`, which
    /// must be the next position to index.
    fn index_end(&mut self, end: usize) {
        let min_n = self.config.min_n;
        let pos = end as u32;
        let mut state = SEED;
        for (i, level) in self.levels.iter_mut().enumerate() {
            debug_assert_eq!(level.prev.len(), end);
            let n = min_n + i;
            if n > end + 1 {
                // No n-gram of this size (or larger) ends here yet.
                level.prev.push(NONE);
                continue;
            }
            if i == 0 {
                for &t in self.tokens[end + 1 - n..=end].iter().rev() {
                    state = fold(state, t);
                }
            } else {
                state = fold(state, self.tokens[end + 1 - n]);
            }
            let prev = match level.slots.entry(state) {
                std::collections::hash_map::Entry::Occupied(mut e) => {
                    let slot = e.get_mut();
                    std::mem::replace(&mut slot.recent, pos)
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(Slot {
                        earliest: pos,
                        recent: pos,
                    });
                    NONE
                }
            };
            level.prev.push(prev);
        }
    }

    /// Undoes [`index_end`](Self::index_end) for `end`, which must be the
    /// last indexed position.
    fn unindex_end(&mut self, end: usize) {
        let min_n = self.config.min_n;
        let mut state = SEED;
        for (i, level) in self.levels.iter_mut().enumerate() {
            let n = min_n + i;
            if n > end + 1 {
                break;
            }
            if i == 0 {
                for &t in self.tokens[end + 1 - n..=end].iter().rev() {
                    state = fold(state, t);
                }
            } else {
                state = fold(state, self.tokens[end + 1 - n]);
            }
            let prev = level.prev[end];
            if prev == NONE {
                level.slots.remove(&state);
            } else if let Some(slot) = level.slots.get_mut(&state) {
                debug_assert_eq!(slot.recent as usize, end);
                slot.recent = prev;
            }
        }
    }
}
