//! Property tests: the index and the scan against a brute-force search.

use std::collections::BTreeMap;

use drafting::{
    propose_by_scan, Match, MatchPolicy, NgramConfig, NgramIndex, ScoreParams, MAX_NGRAM,
    MAX_SCORED_OCCURRENCES,
};
use proptest::prelude::*;

/// Every earlier occurrence (by start) of the suffix n-gram, for the largest
/// n in `min_n..=max_n` that has one, straight from the definition.
fn occurrences(tokens: &[u32], min_n: usize, max_n: usize) -> Option<(usize, Vec<usize>)> {
    let len = tokens.len();
    for n in (min_n..=max_n).rev() {
        if n > len {
            continue;
        }
        let suffix = &tokens[len - n..];
        // The occurrence must end at or before len - 2.
        let starts: Vec<usize> = (0..len)
            .filter(|&s| s + n < len && &tokens[s..s + n] == suffix)
            .collect();
        if !starts.is_empty() {
            return Some((n, starts));
        }
    }
    None
}

/// The expected `Scored` proposal, from its definition: the trie of the continuations of the
/// most recent `max_occurrences` occurrences, as a map from every prefix of a continuation to the
/// summed weight of the occurrences that continue with it (and the most recent of them), walked
/// from the root to the heaviest child while the product of the children's shares stays at or
/// above the threshold. Returns the n-gram size, the start of the most recent occurrence that
/// continues with the whole draft, and the draft.
///
/// With a `cursor`, the occurrence whose continuation starts at the cursor is examined first
/// (with the `max_occurrences - 1` most recent others), or, if there is none, the examined
/// occurrence whose continuation starts nearest at or after the cursor is moved first.
fn expected_scored(
    tokens: &[u32],
    min_n: usize,
    max_n: usize,
    k: usize,
    params: &ScoreParams,
    cursor: Option<usize>,
) -> Option<(usize, usize, Vec<u32>)> {
    let (n, starts) = occurrences(tokens, min_n, max_n)?;
    let exact = cursor.and_then(|c| starts.iter().copied().find(|&s| s + n == c));
    let mut newest_first: Vec<usize> = exact
        .into_iter()
        .chain(starts.iter().rev().copied().filter(|&s| Some(s) != exact))
        .take(params.max_occurrences)
        .collect();
    if let (None, Some(c)) = (exact, cursor) {
        let nearest = newest_first.iter().copied().filter(|&s| s + n >= c).min();
        if let Some(s) = nearest {
            newest_first.retain(|&x| x != s);
            newest_first.insert(0, s);
        }
    }
    let continuations: Vec<&[u32]> = newest_first
        .iter()
        .map(|&s| &tokens[s + n..(s + n + k).min(tokens.len())])
        .collect();
    let weight = |rank: usize| ((params.decay.powi(rank as i32) * 4_294_967_296.0) as u64).max(1);
    // prefix -> (weight, most recent rank)
    let mut trie: BTreeMap<Vec<u32>, (u64, usize)> = BTreeMap::new();
    for (rank, c) in continuations.iter().enumerate() {
        for depth in 1..=c.len() {
            let node = trie.entry(c[..depth].to_vec()).or_insert((0, rank));
            node.0 += weight(rank);
            node.1 = node.1.min(rank);
        }
    }
    let mut path: Vec<u32> = Vec::new();
    let mut p = 1.0f64;
    while path.len() < k {
        let children: Vec<(&Vec<u32>, (u64, usize))> = trie
            .iter()
            .filter(|(prefix, _)| prefix.len() == path.len() + 1 && prefix.starts_with(&path))
            .map(|(prefix, &node)| (prefix, node))
            .collect();
        let total: u64 = children.iter().map(|(_, (w, _))| w).sum();
        // Heaviest; on equal weight the one with the most recent occurrence.
        let Some((best, (w, _))) = children
            .into_iter()
            .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.1 .1.cmp(&a.1 .1)))
        else {
            break;
        };
        let q = p * (w as f64 / total as f64);
        if q < params.min_path_probability {
            break;
        }
        p = q;
        path = best.clone();
    }
    let representative = continuations
        .iter()
        .position(|c| c.starts_with(&path))
        .expect("the path follows some occurrence");
    Some((n, newest_first[representative], path))
}

/// The expected proposal for `policy`, by brute force.
fn expected(
    tokens: &[u32],
    min_n: usize,
    max_n: usize,
    k: usize,
    policy: MatchPolicy,
    params: &ScoreParams,
    cursor: Option<usize>,
) -> Option<(Match, Vec<u32>)> {
    if policy == MatchPolicy::Scored {
        let (n, start, draft) = expected_scored(tokens, min_n, max_n, k, params, cursor)?;
        let m = Match {
            n,
            start,
            len: draft.len(),
        };
        return Some((m, draft));
    }
    let (n, starts) = occurrences(tokens, min_n, max_n)?;
    let first = starts[0];
    let last = *starts.last().unwrap();
    let supply = |s: usize| k.min(tokens.len() - (s + n));
    let start = match policy {
        MatchPolicy::Recent => last,
        MatchPolicy::Earliest => first,
        MatchPolicy::LongestContinuation => {
            if supply(first) > supply(last) {
                first
            } else {
                last
            }
        }
        MatchPolicy::Scored | MatchPolicy::Evidence => unreachable!("handled above or not drawn"),
    };
    let cont: Vec<u32> = tokens[start + n..].iter().take(k).copied().collect();
    Some((
        Match {
            n,
            start,
            len: cont.len(),
        },
        cont,
    ))
}

/// Checks one proposal of `index` against the brute force, and the scan.
fn check(index: &NgramIndex, k: usize) -> Result<(), TestCaseError> {
    check_from(index, k, None)
}

/// [`check`] for a proposal with a cursor (which only the scored policy heeds).
fn check_from(index: &NgramIndex, k: usize, cursor: Option<usize>) -> Result<(), TestCaseError> {
    let cfg = index.config();
    let tokens = index.tokens();
    let mut out = vec![123];
    let got = index.propose_from(k, cursor, &mut out);
    let want = expected(
        tokens,
        cfg.min_n,
        cfg.max_n,
        k,
        cfg.policy,
        &index.score_params(),
        cursor.filter(|_| cfg.policy == MatchPolicy::Scored),
    );
    match (&got, &want) {
        (None, None) => prop_assert!(out.is_empty()),
        (Some(m), Some((wm, wout))) => {
            // Spelled out so a failure says which property broke.
            prop_assert_eq!(m.n, wm.n, "different n");
            let (n, start) = (m.n, m.start);
            prop_assert!(
                start + n < tokens.len(),
                "occurrence must end before the last position"
            );
            prop_assert_eq!(
                &tokens[start..start + n],
                &tokens[tokens.len() - n..],
                "not the suffix n-gram"
            );
            prop_assert_eq!(start, wm.start, "wrong occurrence for {}", cfg.policy);
            prop_assert_eq!(
                &out[..],
                &tokens[start + n..start + n + m.len],
                "not the continuation"
            );
            prop_assert_eq!(m, wm);
            prop_assert_eq!(&out, wout);
        }
        _ => prop_assert!(
            false,
            "index {:?} vs brute force {:?} on {:?}",
            got,
            want,
            tokens
        ),
    }
    if cfg.policy == MatchPolicy::Recent {
        let mut scan_out = Vec::new();
        let scan = propose_by_scan(tokens, cfg.min_n, cfg.max_n, k, &mut scan_out);
        prop_assert_eq!(scan, got);
        prop_assert_eq!(scan_out, out);
    }
    Ok(())
}

fn policy() -> impl Strategy<Value = MatchPolicy> {
    prop_oneof![
        1 => Just(MatchPolicy::Recent),
        1 => Just(MatchPolicy::Earliest),
        1 => Just(MatchPolicy::LongestContinuation),
        2 => Just(MatchPolicy::Scored),
    ]
}

/// Settings of the scored policy: the default, or any in range (a small cap, so that it bites on
/// short sequences; decays from "count only" to "the most recent decides"; thresholds from "never
/// cut" to "cut at any disagreement").
fn score_params() -> impl Strategy<Value = ScoreParams> {
    prop_oneof![
        1 => Just(ScoreParams::default()),
        3 => (
            prop_oneof![1usize..=6, Just(MAX_SCORED_OCCURRENCES)],
            prop_oneof![Just(1.0), Just(0.5), 0.01f64..=1.0],
            prop_oneof![Just(0.0), Just(1.0), 0.0f64..=1.0],
        )
            .prop_map(|(max_occurrences, decay, min_path_probability)| ScoreParams {
                max_occurrences,
                decay,
                min_path_probability,
                min_token_probability: 0.0,
                calibrate: false,
            }),
    ]
}

/// A valid (min_n, max_n), mostly small.
fn sizes() -> impl Strategy<Value = (usize, usize)> {
    (1usize..=6, 0usize..=4).prop_map(|(min_n, extra)| (min_n, (min_n + extra).min(MAX_NGRAM)))
}

/// Tokens over a random small alphabet (1..=5 symbols) or a large one.
fn sequence(max_len: usize) -> impl Strategy<Value = Vec<u32>> {
    prop_oneof![
        3 => (1u32..=5).prop_flat_map(move |a| prop::collection::vec(0..a, 0..max_len)),
        1 => prop::collection::vec(any::<u32>(), 0..max_len),
    ]
}

/// Distinct tokens ending in a copy of an earlier span of them: every suffix n-gram of the copy
/// occurred exactly once before.
fn copied_once() -> impl Strategy<Value = Vec<u32>> {
    (2usize..60, 0usize..60, 1usize..20).prop_map(|(len, from, span)| {
        let mut tokens: Vec<u32> = (0..len as u32).map(|t| t * 7 + 1).collect();
        let from = from % len;
        let to = (from + span).min(len - 1).max(from + 1);
        tokens.extend_from_within(from..to);
        tokens
    })
}

#[derive(Clone, Debug)]
enum Op {
    Push(u32),
    Extend(Vec<u32>),
    Truncate(usize),
    Propose(usize),
}

fn op(alphabet: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..alphabet).prop_map(Op::Push),
        1 => prop::collection::vec(0..alphabet, 0..12).prop_map(Op::Extend),
        2 => (0usize..80).prop_map(Op::Truncate),
        4 => (0usize..10).prop_map(Op::Propose),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A fresh index over a random sequence proposes what the brute force
    /// finds, after every prefix.
    #[test]
    fn every_prefix_matches_brute_force(
        tokens in sequence(64),
        (min_n, max_n) in sizes(),
        k in 0usize..12,
        policy in policy(),
        params in score_params(),
    ) {
        let cfg = NgramConfig::new(min_n, max_n).unwrap().with_policy(policy);
        let mut index = NgramIndex::new(cfg);
        index.set_score_params(params);
        check(&index, k)?;
        for &t in &tokens {
            index.push(t);
            check(&index, k)?;
        }
        let mut built = NgramIndex::with_tokens(cfg, &tokens);
        built.set_score_params(params);
        check(&built, k)?;
    }

    /// Random interleavings of push / extend / truncate / propose, compared
    /// after every step with the brute force (and with a freshly built
    /// index, which must agree on the same policy).
    #[test]
    fn interleaved_operations(
        alphabet in 1u32..=4,
        (min_n, max_n) in sizes(),
        policy in policy(),
        params in score_params(),
        seed_ops in prop::collection::vec(op(4), 1..120),
    ) {
        let cfg = NgramConfig::new(min_n, max_n).unwrap().with_policy(policy);
        let mut index = NgramIndex::new(cfg);
        index.set_score_params(params);
        let mut model: Vec<u32> = Vec::new();
        for o in seed_ops {
            match o {
                Op::Push(t) => {
                    let t = t % alphabet;
                    index.push(t);
                    model.push(t);
                }
                Op::Extend(ts) => {
                    let ts: Vec<u32> = ts.into_iter().map(|t| t % alphabet).collect();
                    index.extend(&ts);
                    model.extend_from_slice(&ts);
                }
                Op::Truncate(len) => {
                    index.truncate(len);
                    model.truncate(len);
                }
                Op::Propose(k) => {
                    prop_assert_eq!(index.tokens(), &model[..]);
                    check(&index, k)?;
                    let mut fresh = NgramIndex::with_tokens(cfg, &model);
                    fresh.set_score_params(params);
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    prop_assert_eq!(index.propose(k, &mut a), fresh.propose(k, &mut b));
                    prop_assert_eq!(a, b);
                }
            }
            prop_assert_eq!(index.len(), model.len());
            check(&index, 4)?;
        }
    }

    /// The scan equals the index with the Recent policy on any sizes,
    /// including out-of-range ones the index sanitizes.
    #[test]
    fn scan_equals_recent_index(
        tokens in sequence(200),
        min_n in 0usize..8,
        max_n in 0usize..(MAX_NGRAM + 4),
        k in 0usize..20,
    ) {
        let raw = NgramConfig { min_n, max_n, policy: MatchPolicy::Recent };
        let index = NgramIndex::with_tokens(raw, &tokens);
        let mut a = Vec::new();
        let mut b = Vec::new();
        let got = index.propose(k, &mut a);
        let scan = propose_by_scan(&tokens, min_n, max_n.min(MAX_NGRAM), k, &mut b);
        prop_assert_eq!(got, scan);
        prop_assert_eq!(a, b);
    }

    /// Long sequences with copied spans: the index and brute force agree at
    /// the end, for every policy.
    #[test]
    fn long_sequence_with_copies(
        base in prop::collection::vec(0u32..50, 100..400),
        copies in prop::collection::vec((0usize..400, 1usize..30), 0..10),
        k in 1usize..16,
        (min_n, max_n) in sizes(),
    ) {
        let mut tokens = base.clone();
        for (from, span) in copies {
            let from = from % tokens.len();
            let to = (from + span).min(tokens.len());
            let piece = tokens[from..to].to_vec();
            tokens.extend(piece);
        }
        // (Evidence has no brute-force twin: its walk is checked in evidence.rs.)
        for p in MatchPolicy::ALL.into_iter().filter(|&p| p != MatchPolicy::Evidence) {
            let cfg = NgramConfig::new(min_n, max_n).unwrap().with_policy(p);
            let index = NgramIndex::with_tokens(cfg, &tokens);
            check(&index, k)?;
        }
    }

    /// Proposals with a cursor, anywhere in or past the sequence, against the brute force (the
    /// other policies must ignore it).
    #[test]
    fn proposals_with_a_cursor_match_brute_force(
        tokens in prop_oneof![sequence(80), copied_once()],
        (min_n, max_n) in sizes(),
        k in 0usize..12,
        policy in policy(),
        params in score_params(),
        cursors in prop::collection::vec(0usize..90, 1..6),
    ) {
        let cfg = NgramConfig::new(min_n, max_n).unwrap().with_policy(policy);
        let mut index = NgramIndex::with_tokens(cfg, &tokens);
        index.set_score_params(params);
        for c in cursors {
            check_from(&index, k, Some(c))?;
            if policy != MatchPolicy::Scored {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                prop_assert_eq!(index.propose_from(k, Some(c), &mut a), index.propose(k, &mut b));
                prop_assert_eq!(a, b);
            }
        }
    }

    /// Where the longest matching suffix n-gram occurred once before, the scored policy drafts
    /// exactly what the recent and earliest policies draft, whatever its settings and cursor.
    #[test]
    fn one_occurrence_scores_like_recent_and_earliest(
        tokens in prop_oneof![sequence(80), copied_once()],
        (min_n, max_n) in sizes(),
        k in 0usize..12,
        params in score_params(),
        cursor in prop::option::of(0usize..90),
    ) {
        let Some((_, starts)) = occurrences(&tokens, min_n, max_n) else {
            return Ok(());
        };
        prop_assume!(starts.len() == 1);
        let propose = |policy: MatchPolicy| {
            let cfg = NgramConfig::new(min_n, max_n).unwrap().with_policy(policy);
            let mut index = NgramIndex::with_tokens(cfg, &tokens);
            index.set_score_params(params);
            let mut out = Vec::new();
            let m = index.propose_from(k, cursor, &mut out);
            (m, out)
        };
        let scored = propose(MatchPolicy::Scored);
        prop_assert_eq!(&scored, &propose(MatchPolicy::Recent));
        prop_assert_eq!(&scored, &propose(MatchPolicy::Earliest));
    }
}
