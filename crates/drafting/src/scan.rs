//! The seed algorithm: a backwards scan of the whole sequence per proposal.

use crate::Match;

/// Proposes like [`NgramIndex::propose`](crate::NgramIndex::propose) with
/// [`MatchPolicy::Recent`](crate::MatchPolicy::Recent), by scanning the
/// sequence backwards for the suffix n-gram on every call: O(context × sizes)
/// per proposal. Kept as the reference for tests and the benchmark baseline.
///
/// `min_n` is treated as at least 1. Unlike [`NgramConfig`](crate::NgramConfig),
/// `max_n` is not capped at [`MAX_NGRAM`](crate::MAX_NGRAM).
pub fn propose_by_scan(
    tokens: &[u32],
    min_n: usize,
    max_n: usize,
    k: usize,
    out: &mut Vec<u32>,
) -> Option<Match> {
    out.clear();
    let len = tokens.len();
    let min_n = min_n.max(1);
    // An earlier occurrence must end at len - 2 or before.
    let max_n = max_n.min(len.saturating_sub(1));
    for n in (min_n..=max_n).rev() {
        let suffix = &tokens[len - n..];
        // Windows of the sequence without its last token: every window has a
        // following token. The last matching one is the most recent.
        let Some(start) = tokens[..len - 1].windows(n).rposition(|w| w == suffix) else {
            continue;
        };
        return Some(crate::copy_continuation(tokens, start, n, k, out));
    }
    None
}
