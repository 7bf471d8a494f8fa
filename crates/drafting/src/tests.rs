//! Edge cases of the index and the scan, checked side by side.

use super::*;

fn config(min_n: usize, max_n: usize, policy: MatchPolicy) -> NgramConfig {
    NgramConfig::new(min_n, max_n).unwrap().with_policy(policy)
}

/// Proposes with the index (given policy) and, for `Recent`, checks the scan
/// agrees.
fn propose(
    tokens: &[u32],
    min_n: usize,
    max_n: usize,
    k: usize,
    policy: MatchPolicy,
) -> (Option<Match>, Vec<u32>) {
    let index = NgramIndex::with_tokens(config(min_n, max_n, policy), tokens);
    let mut out = vec![99, 99];
    let m = index.propose(k, &mut out);
    if m.is_none() {
        assert!(out.is_empty());
    }
    if policy == MatchPolicy::Recent {
        let mut scan_out = vec![42];
        let s = propose_by_scan(tokens, min_n, max_n, k, &mut scan_out);
        assert_eq!((s, &scan_out), (m, &out), "scan disagrees on {tokens:?}");
    }
    (m, out)
}

#[test]
fn empty_sequence() {
    for p in MatchPolicy::ALL {
        assert_eq!(propose(&[], 1, 4, 8, p), (None, vec![]));
    }
    let index = NgramIndex::new(config(1, 4, MatchPolicy::Recent));
    assert!(index.is_empty());
    assert_eq!(index.len(), 0);
    assert_eq!(index.tokens(), &[] as &[u32]);
}

#[test]
fn single_token() {
    for p in MatchPolicy::ALL {
        assert_eq!(propose(&[3], 1, 4, 8, p), (None, vec![]));
    }
}

#[test]
fn shorter_than_min_n() {
    for p in MatchPolicy::ALL {
        // Two tokens can hold at most one earlier 1-gram occurrence.
        assert_eq!(propose(&[1, 1], 2, 4, 8, p), (None, vec![]));
        assert_eq!(propose(&[1, 2, 1], 3, 4, 8, p), (None, vec![]));
    }
}

#[test]
fn no_match() {
    for p in MatchPolicy::ALL {
        assert_eq!(propose(&[1, 2, 3, 4, 5, 6], 1, 4, 8, p), (None, vec![]));
        // The 2-gram [3, 4] repeats but the suffix 1-gram does not.
        assert_eq!(propose(&[3, 4, 3, 4, 5], 1, 4, 8, p), (None, vec![]));
    }
}

#[test]
fn k_zero_reports_match_without_tokens() {
    for p in MatchPolicy::ALL {
        let (m, out) = propose(&[1, 2, 3, 1, 2], 1, 3, 0, p);
        assert_eq!(
            m,
            Some(Match {
                n: 2,
                start: 0,
                len: 0
            })
        );
        assert!(out.is_empty());
    }
}

#[test]
fn continuation_cut_at_end_of_sequence() {
    // Suffix [1, 2] occurred at 2..4; only [9] follows up to the suffix.
    let (m, out) = propose(&[5, 6, 1, 2, 9, 1, 2], 1, 4, 8, MatchPolicy::Recent);
    assert_eq!(
        m,
        Some(Match {
            n: 2,
            start: 2,
            len: 3
        })
    );
    assert_eq!(out, [9, 1, 2]);
}

#[test]
fn continuation_limited_by_k() {
    let (m, out) = propose(&[1, 2, 3, 4, 5, 6, 7, 1, 2], 1, 4, 3, MatchPolicy::Recent);
    assert_eq!(
        m,
        Some(Match {
            n: 2,
            start: 0,
            len: 3
        })
    );
    assert_eq!(out, [3, 4, 5]);
}

#[test]
fn repeated_single_token() {
    let seq = [7, 7, 7, 7];
    // Largest n with an earlier occurrence is 3 (ending at position 2).
    let (m, out) = propose(&seq, 1, 4, 8, MatchPolicy::Recent);
    assert_eq!(
        m,
        Some(Match {
            n: 3,
            start: 0,
            len: 1
        })
    );
    assert_eq!(out, [7]);
    let (m, out) = propose(&seq, 1, 2, 8, MatchPolicy::Recent);
    assert_eq!(
        m,
        Some(Match {
            n: 2,
            start: 1,
            len: 1
        })
    );
    assert_eq!(out, [7]);
    let (m, out) = propose(&seq, 1, 2, 8, MatchPolicy::Earliest);
    assert_eq!(
        m,
        Some(Match {
            n: 2,
            start: 0,
            len: 2
        })
    );
    assert_eq!(out, [7, 7]);
    let (m, out) = propose(&seq, 1, 1, 8, MatchPolicy::LongestContinuation);
    assert_eq!(
        m,
        Some(Match {
            n: 1,
            start: 0,
            len: 3
        })
    );
    assert_eq!(out, [7, 7, 7]);
    // With k = 1 both occurrences supply one token: the tie goes to recent.
    let (m, _) = propose(&seq, 1, 1, 1, MatchPolicy::LongestContinuation);
    assert_eq!(
        m,
        Some(Match {
            n: 1,
            start: 2,
            len: 1
        })
    );
}

#[test]
fn policies_pick_different_occurrences() {
    //          0  1  2  3  4  5  6  7  8  9
    let seq = [1, 2, 3, 4, 5, 1, 2, 6, 1, 2];
    let (m, out) = propose(&seq, 2, 2, 4, MatchPolicy::Recent);
    assert_eq!((m.unwrap().start, out), (5, vec![6, 1, 2]));
    let (m, out) = propose(&seq, 2, 2, 4, MatchPolicy::Earliest);
    assert_eq!((m.unwrap().start, out), (0, vec![3, 4, 5, 1]));
    let (m, out) = propose(&seq, 2, 2, 4, MatchPolicy::LongestContinuation);
    assert_eq!((m.unwrap().start, out), (0, vec![3, 4, 5, 1]));
    // With k = 3 the recent occurrence supplies 3 too: tie, recent wins.
    let (m, _) = propose(&seq, 2, 2, 3, MatchPolicy::LongestContinuation);
    assert_eq!(m.unwrap().start, 5);
}

#[test]
fn longer_ngram_preferred() {
    // The 1-gram [2] most recently occurred at 4, but the 3-gram [9, 1, 2]
    // occurred at 0..3.
    let seq = [9, 1, 2, 8, 2, 5, 9, 1, 2];
    let (m, out) = propose(&seq, 1, 4, 2, MatchPolicy::Recent);
    assert_eq!(
        m,
        Some(Match {
            n: 3,
            start: 0,
            len: 2
        })
    );
    assert_eq!(out, [8, 2]);
}

#[test]
fn truncate_restores_previous_occurrence() {
    let cfg = config(1, 3, MatchPolicy::Recent);
    let mut index = NgramIndex::with_tokens(cfg, &[4, 5, 0, 4, 5, 1, 4, 5, 2]);
    let mut out = Vec::new();
    index.truncate(7); // ... 4, 5, 1, 4
    assert_eq!(index.tokens(), &[4, 5, 0, 4, 5, 1, 4]);
    // [5, 1, 4] / [1, 4] are new; [4] most recently at 3.
    assert_eq!(
        index.propose(2, &mut out),
        Some(Match {
            n: 1,
            start: 3,
            len: 2
        })
    );
    index.truncate(5); // 4, 5, 0, 4, 5: the [4, 5] at 3..5 is the suffix itself.
    assert_eq!(
        index.propose(2, &mut out),
        Some(Match {
            n: 2,
            start: 0,
            len: 2
        })
    );
    assert_eq!(out, [0, 4]);
    index.truncate(1);
    assert_eq!(index.propose(2, &mut out), None);
    index.extend(&[5, 4]);
    assert_eq!(
        index.propose(2, &mut out),
        Some(Match {
            n: 1,
            start: 0,
            len: 2
        })
    );
    assert_eq!(out, [5, 4]);
    // Truncating past the end changes nothing.
    index.truncate(100);
    assert_eq!(index.len(), 3);
}

#[test]
fn truncate_removes_earliest() {
    let cfg = config(1, 2, MatchPolicy::Earliest);
    let mut index = NgramIndex::with_tokens(cfg, &[3, 3, 3, 3]);
    let mut out = Vec::new();
    assert_eq!(index.propose(4, &mut out).unwrap().start, 0);
    index.truncate(0);
    assert!(index.is_empty());
    index.extend(&[6, 3, 6]);
    assert_eq!(
        index.propose(4, &mut out),
        Some(Match {
            n: 1,
            start: 0,
            len: 2
        })
    );
    assert_eq!(out, [3, 6]);
}

#[test]
fn clear_resets() {
    let mut index = NgramIndex::with_tokens(config(1, 4, MatchPolicy::Recent), &[1, 2, 1, 2]);
    index.clear();
    assert!(index.is_empty());
    let mut out = Vec::new();
    assert_eq!(index.propose(4, &mut out), None);
    index.extend(&[1, 2, 1]);
    assert_eq!(
        index.propose(4, &mut out),
        Some(Match {
            n: 1,
            start: 0,
            len: 2
        })
    );
}

#[test]
fn sanitizes_out_of_range_config() {
    let raw = NgramConfig {
        min_n: 0,
        max_n: 100,
        policy: MatchPolicy::Recent,
    };
    let index = NgramIndex::with_tokens(raw, &[1, 2, 1]);
    assert_eq!((index.config().min_n, index.config().max_n), (1, MAX_NGRAM));
    let mut out = Vec::new();
    assert_eq!(
        index.propose(3, &mut out),
        Some(Match {
            n: 1,
            start: 0,
            len: 2
        })
    );

    let inverted = NgramConfig {
        min_n: 3,
        max_n: 2,
        policy: MatchPolicy::Recent,
    };
    let index = NgramIndex::with_tokens(inverted, &[1, 2, 3, 1, 2, 3]);
    assert_eq!(index.propose(3, &mut out), None);
    assert!(out.is_empty());
}

#[test]
fn set_policy_switches_occurrence() {
    let mut index = NgramIndex::with_tokens(config(1, 1, MatchPolicy::Recent), &[1, 8, 1, 9, 1]);
    let mut out = Vec::new();
    assert_eq!(index.propose(1, &mut out).unwrap().start, 2);
    index.set_policy(MatchPolicy::Earliest);
    assert_eq!(index.config().policy, MatchPolicy::Earliest);
    assert_eq!(index.propose(1, &mut out).unwrap().start, 0);
}

#[test]
fn large_token_ids() {
    let big = [u32::MAX, u32::MAX - 1, 0, u32::MAX, u32::MAX - 1];
    let (m, out) = propose(&big, 1, 4, 8, MatchPolicy::Recent);
    assert_eq!(
        m,
        Some(Match {
            n: 2,
            start: 0,
            len: 3
        })
    );
    assert_eq!(out, [0, u32::MAX, u32::MAX - 1]);
}

fn scored(
    tokens: &[u32],
    min_n: usize,
    max_n: usize,
    k: usize,
    params: ScoreParams,
) -> (Option<Match>, Vec<u32>) {
    let mut index = NgramIndex::with_tokens(config(min_n, max_n, MatchPolicy::Scored), tokens);
    index.set_score_params(params);
    let mut out = vec![99];
    let m = index.propose(k, &mut out);
    (m, out)
}

fn params(decay: f64, min_path_probability: f64) -> ScoreParams {
    ScoreParams {
        decay,
        min_path_probability,
        ..ScoreParams::default()
    }
}

#[test]
fn scored_follows_the_majority_not_the_latest() {
    //          0  1  2  3  4  5  6  7  8  9 10 11 12 13 14
    let seq = [5, 1, 2, 3, 5, 1, 2, 3, 5, 1, 2, 9, 5, 1, 2];
    // "5 1 2" went on with 3 twice, then with 9 once (the latest).
    let (m, out) = propose(&seq, 1, 3, 2, MatchPolicy::Recent);
    assert_eq!((m.unwrap().start, out), (8, vec![9, 5]));
    let (m, out) = scored(&seq, 1, 3, 2, params(1.0, 0.0));
    assert_eq!(out, [3, 5]);
    assert_eq!(
        m,
        Some(Match {
            n: 3,
            start: 4,
            len: 2
        }),
        "the most recent occurrence on the chosen path"
    );
    // A decay steep enough for the latest to outweigh the two older ones together.
    assert_eq!(scored(&seq, 1, 3, 2, params(0.4, 0.0)).1, [9, 5]);
    // 3 has two thirds of the (uniform) weight: a threshold above that drafts nothing, but the
    // match is still reported.
    let (m, out) = scored(&seq, 1, 3, 2, params(1.0, 0.7));
    assert!(out.is_empty());
    assert_eq!(m.map(|m| (m.n, m.len)), Some((3, 0)));
}

#[test]
fn scored_drafts_while_the_occurrences_agree() {
    // "7" was followed by "1 2 3" and by "1 2 4": both agree on two tokens, then split.
    let seq = [7, 1, 2, 3, 0, 7, 1, 2, 4, 0, 7];
    let (m, out) = scored(&seq, 1, 1, 8, params(1.0, 0.6));
    assert_eq!(out, [1, 2]);
    assert_eq!(m.unwrap().start, 5);
    // At or below one half the split is taken too, towards the most recent (uniform weights).
    assert_eq!(scored(&seq, 1, 1, 8, params(1.0, 0.5)).1, [1, 2, 4, 0, 7]);
    // k caps the draft.
    assert_eq!(scored(&seq, 1, 1, 3, params(1.0, 0.0)).1, [1, 2, 4]);
}

#[test]
fn scored_with_one_occurrence_drafts_like_recent_and_earliest() {
    let seq = [1, 2, 3, 4, 5, 6, 7, 1, 2];
    let want = propose(&seq, 1, 4, 5, MatchPolicy::Recent);
    assert_eq!(want, propose(&seq, 1, 4, 5, MatchPolicy::Earliest));
    for p in [params(1.0, 1.0), params(0.01, 0.99), ScoreParams::default()] {
        assert_eq!(scored(&seq, 1, 4, 5, p), want);
    }
}

#[test]
fn scored_examines_only_the_most_recent_occurrences() {
    // "8" went on with 1 four times long ago, then with 2 twice lately.
    let seq = [8, 1, 8, 1, 8, 1, 8, 1, 8, 2, 8, 2, 8];
    let cap = |max_occurrences| ScoreParams {
        max_occurrences,
        decay: 1.0,
        min_path_probability: 0.0,
        min_token_probability: 0.0,
        calibrate: false,
    };
    assert_eq!(scored(&seq, 1, 1, 1, cap(64)).1, [1]);
    assert_eq!(scored(&seq, 1, 1, 1, cap(2)).1, [2]);
    // Three of them: 2 twice against 1 once.
    assert_eq!(scored(&seq, 1, 1, 1, cap(3)).1, [2]);
}

#[test]
fn scored_rewinds_with_the_index() {
    let cfg = config(1, 2, MatchPolicy::Scored);
    let mut index = NgramIndex::with_tokens(cfg, &[4, 1, 4, 1, 4, 2, 4]);
    index.set_score_params(params(1.0, 0.0));
    let mut out = Vec::new();
    assert_eq!(index.propose(1, &mut out).unwrap().n, 1);
    assert_eq!(out, [1]);
    index.truncate(3); // 4 1 4
    assert_eq!(index.propose(4, &mut out).unwrap().start, 0);
    assert_eq!(out, [1, 4]);
    // The settings are kept, in range.
    index.set_score_params(ScoreParams {
        max_occurrences: 0,
        ..ScoreParams::default()
    });
    assert_eq!(index.score_params().max_occurrences, 1);
}

#[test]
fn scored_cursor_ranks_the_copy_in_progress_first() {
    //          0  1  2  3  4  5  6  7  8  9
    let seq = [3, 1, 4, 8, 3, 1, 5, 9, 3, 1];
    // "3 1" went on with 4 (from 2) and with 5 (from 6): an even split, the latest wins.
    let mut index = NgramIndex::with_tokens(config(1, 3, MatchPolicy::Scored), &seq);
    index.set_score_params(params(1.0, 0.0));
    let at = |index: &NgramIndex, cursor| {
        let mut out = Vec::new();
        let m = index.propose_from(2, cursor, &mut out).unwrap();
        (m.start, out)
    };
    assert_eq!(at(&index, None), (4, vec![5, 9]));
    assert_eq!(
        at(&index, Some(2)),
        (0, vec![4, 8]),
        "the copy continues at 2"
    );
    assert_eq!(at(&index, Some(1)), (0, vec![4, 8]), "nearest after 1");
    assert_eq!(at(&index, Some(3)), (4, vec![5, 9]), "nearest after 3");
    assert_eq!(
        at(&index, Some(7)),
        (4, vec![5, 9]),
        "none after 7: recency decides"
    );
    assert_eq!(at(&index, Some(100)), (4, vec![5, 9]));
    // Other policies ignore the cursor.
    index.set_policy(MatchPolicy::Recent);
    assert_eq!(at(&index, Some(2)), (4, vec![5, 9]));
}

#[test]
fn scored_cursor_reaches_past_the_examined_occurrences() {
    // "8" went on with 1 first, then with 2 four times.
    let seq = [8, 1, 8, 2, 8, 2, 8, 2, 8, 2, 8];
    let mut index = NgramIndex::with_tokens(config(1, 1, MatchPolicy::Scored), &seq);
    index.set_score_params(ScoreParams {
        max_occurrences: 2,
        decay: 0.4,
        min_path_probability: 0.0,
        min_token_probability: 0.0,
        calibrate: false,
    });
    let mut out = Vec::new();
    assert_eq!(index.propose_from(1, None, &mut out).unwrap().start, 8);
    assert_eq!(out, [2]);
    // The occurrence at 0 is not among the two most recent, but the cursor points at it.
    assert_eq!(index.propose_from(1, Some(1), &mut out).unwrap().start, 0);
    assert_eq!(out, [1]);
}
