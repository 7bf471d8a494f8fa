//! The drafter's unit tests.

use super::*;
use crate::config::MatchPolicy;

/// One chain from the most recent occurrence (not the default `Evidence`): most tests here are
/// of the per-n-gram length estimate, which evidence-sized chains do not use.
fn config(k: usize, adaptive: bool) -> SpecConfig {
    SpecConfig {
        num_speculative_tokens: k,
        prompt_lookup_max: 3,
        prompt_lookup_min: 1,
        match_policy: MatchPolicy::Recent,
        adaptive,
        ..Default::default()
    }
}

#[test]
fn proposes_what_followed_and_respects_the_limit() {
    let mut d = Drafter::new(&config(8, false), &[1, 2, 3, 4, 5, 6, 1, 2]);
    assert_eq!(d.propose(8, None).tokens(), [3, 4, 5, 6, 1, 2]);
    assert_eq!(d.propose(2, None).tokens(), [3, 4]);
    assert!(d.propose(0, None).is_empty(), "no room, no draft");
    let mut short = Drafter::new(&config(3, false), d.tokens());
    assert_eq!(
        short.propose(8, None).tokens(),
        [3, 4, 5],
        "K caps the draft"
    );
}

/// Drafts 200 times on a sequence whose repeats never continue the same way (every draft is
/// rejected); returns the drafter and how many tokens it sent.
fn draft_on_repeats_that_never_continue(policy: MatchPolicy) -> (Drafter, usize) {
    let c = SpecConfig {
        match_policy: policy,
        ..config(8, true)
    };
    let mut d = Drafter::new(&c, &[7, 1, 7, 2, 7, 3, 7]);
    let mut sent = 0;
    for t in 0..200u32 {
        sent += d.propose(8, Some(0.1)).len();
        d.observe(&[]);
        d.push(100 + t);
        d.push(7);
    }
    (d, sent)
}

#[test]
fn outcomes_steer_later_drafts() {
    // Rejections switch drafting off except for the occasional one-token probe.
    let (d, sent) = draft_on_repeats_that_never_continue(MatchPolicy::Recent);
    assert!(sent < 40, "{sent} tokens sent");
    assert!(d.length().acceptance(1) < 0.4);
    assert_eq!(d.length().best_length(1, 8), 0, "no draft pays any more");
    // A price no draft can pay sends nothing but probes, even for a perfect match.
    let mut e = Drafter::new(&config(8, true), &[1, 2, 3, 4, 5, 1, 2]);
    assert!(e.propose(8, Some(5.0)).len() <= 1);
    // Evidence sizing, the default, sends almost nothing here from the start: every earlier `7`
    // was followed by something else, so no continuation has the evidence to pay for its row.
    assert_eq!(SpecConfig::default().match_policy, MatchPolicy::Evidence);
    let (_, sent) = draft_on_repeats_that_never_continue(MatchPolicy::Evidence);
    assert!(sent < 10, "{sent} tokens sent");
}

#[test]
fn nodes_cut_before_sending_count_neither_way() {
    // Every sent token is accepted, but only the first of each draft is sent (as when a
    // grammar forbids the second): the estimate must see an accepted token, not an accepted
    // token and a rejected one.
    let run = |cut: bool| {
        let mut d = Drafter::new(&config(8, true), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 1]);
        for _ in 0..30 {
            let sent = d.propose(8, Some(0.1)).len();
            if cut {
                d.keep_first(sent.min(1));
            }
            d.observe(if sent > 0 { &[0] } else { &[] });
        }
        d.length().acceptance(1)
    };
    assert!(run(true) > 0.9, "cut: {}", run(true));
    assert!(run(false) <= 0.55, "uncut: {}", run(false));
}

#[test]
fn truncate_rewinds_the_sequence() {
    let mut d = Drafter::new(&config(4, false), &[1, 2, 3, 1]);
    d.push(9);
    d.truncate(4);
    assert_eq!(d.tokens(), [1, 2, 3, 1]);
    assert_eq!(d.propose(4, None).tokens(), [2, 3, 1]);
}

fn tree_config(adaptive: bool, sources: &str) -> SpecConfig {
    SpecConfig {
        method: SpecMethod::Tree,
        tree_sources: sources.parse().unwrap(),
        ..config(4, adaptive)
    }
}

#[test]
fn a_tree_holds_every_earlier_continuation() {
    let mut d = Drafter::new(&tree_config(false, "ngram"), &[1, 2, 3, 5, 1, 2, 4, 1, 2]);
    let t = d.propose(8, None);
    // "1 2" was followed by "4 1 2" and by "3 5 1 2" (cut at K = 4 deep); "2" adds nothing new.
    assert_eq!(
        t.children(ROOT).map(|c| t.tokens()[c]).collect::<Vec<_>>(),
        [4, 3]
    );
    let path = t.follow(&[3, 5, 1, 2, 9]);
    assert_eq!(
        path.iter().map(|&n| t.tokens()[n]).collect::<Vec<_>>(),
        [3, 5, 1, 2]
    );
    assert!(t.depths().iter().all(|&d| d <= 4));
    assert!(t.sources().iter().all(|&s| s == Source::Ngram));
    // The node budget caps the tree.
    assert_eq!(d.propose(3, None).len(), 3);
}

#[test]
fn the_model_source_expands_its_predictions() {
    let mut d = Drafter::new(&tree_config(false, "model"), &[5, 6, 7]);
    assert_eq!(d.wants_predictions(), 4);
    assert!(d.propose(8, None).is_empty(), "nothing recorded yet");
    lock(&d.predictions).record(None, 7, &[8, 9]);
    lock(&d.predictions).record(None, 8, &[10]);
    let t = d.propose(8, None).clone();
    let mut tokens = t.tokens().to_vec();
    tokens.sort();
    assert_eq!(tokens, [8, 9, 10]);
    assert_eq!(t.follow(&[8, 10, 3]).len(), 2);
    assert!(t.sources().iter().all(|&s| s == Source::Model));
    // Rejections at rank 1 lower its estimate; acceptances at rank 0 raise it.
    let before = (
        d.tree_rate(Source::Model, 0, 1),
        d.tree_rate(Source::Model, 1, 1),
    );
    for _ in 0..20 {
        let t = d.propose(8, None).clone();
        d.observe(&t.follow(&[8, 10]));
    }
    assert!(d.tree_rate(Source::Model, 0, 1) > before.0);
    assert!(d.tree_rate(Source::Model, 1, 1) < before.1);
    assert!(d.tree_rate(Source::Model, 0, 2) > 0.8);
}

#[test]
fn costly_rows_shrink_the_tree() {
    let mut d = Drafter::new(&tree_config(true, "ngram,model"), &[1, 2, 3, 1, 2, 4, 1, 2]);
    lock(&d.predictions).record(None, 2, &[3, 4, 5, 6]);
    let cheap = d.propose(8, Some(0.02)).len();
    let dear = d.propose(8, Some(0.3)).len();
    assert!(cheap > dear, "{cheap} nodes at 0.02, {dear} at 0.3");
    assert!(
        d.propose(8, Some(5.0)).is_empty(),
        "nothing pays at 5 tokens a row"
    );
    d.observe(&[]);
}

#[test]
fn the_corpus_source_drafts_from_earlier_documents() {
    let corpus: SharedCorpus = Arc::new(Mutex::new(Corpus::new(1000)));
    corpus.lock().unwrap().add(&[40, 41, 42, 43, 44]);
    let mut d = Drafter::new(&tree_config(false, "corpus"), &[9, 41, 42]);
    assert!(d.propose(8, None).is_empty(), "no corpus yet");
    d.set_corpus(corpus);
    let t = d.propose(8, None);
    assert_eq!(t.tokens(), [43, 44]);
    assert!(t.sources().iter().all(|&s| s == Source::Corpus));
}

#[test]
fn a_scored_chain_draws_on_the_corpus_too() {
    let chain = |policy| SpecConfig {
        match_policy: policy,
        ..config(4, false)
    };
    let corpus: SharedCorpus = Arc::new(Mutex::new(Corpus::new(1000)));
    // Three earlier documents continue "41 42" with 43 44; the sequence itself once with 50.
    for _ in 0..3 {
        corpus.lock().unwrap().add(&[40, 41, 42, 43, 44]);
    }
    let prompt = [41, 42, 50, 9, 41, 42];
    let mut d = Drafter::new(&chain(MatchPolicy::Scored), &prompt);
    assert_eq!(
        d.propose(8, None).tokens(),
        [50, 9, 41, 42],
        "no corpus yet"
    );
    d.set_corpus(corpus.clone());
    d.set_score_params(crate::ScoreParams {
        decay: 1.0,
        min_path_probability: 0.5,
        ..Default::default()
    });
    // Same size of match (2) in both: three votes for 43 against one for 50.
    assert_eq!(d.propose(8, None).tokens(), [43, 44]);
    // Other policies draft from the sequence only.
    let mut r = Drafter::new(&chain(MatchPolicy::Recent), &prompt);
    r.set_corpus(corpus.clone());
    assert_eq!(r.propose(8, None).tokens(), [50, 9, 41, 42]);
    // A longer match in the sequence outranks the corpus's shorter one.
    let mut d = Drafter::new(&chain(MatchPolicy::Scored), &[7, 41, 42, 60, 7, 41, 42]);
    d.set_corpus(corpus.clone());
    assert_eq!(d.propose(8, None).tokens(), [60, 7, 41, 42]);
    // And a match found only in the corpus still drafts.
    let mut d = Drafter::new(&chain(MatchPolicy::Scored), &[1, 2, 41, 42]);
    d.set_corpus(corpus);
    assert_eq!(d.propose(8, None).tokens(), [43, 44]);
}

#[test]
fn a_scored_chain_keeps_its_place_in_a_copy() {
    // The output copies the prompt but puts a 7 before every 1: after "7 1" only the 1 is
    // matched, and it occurred three times. The copy's place says which one comes next.
    let prompt = [10, 1, 20, 11, 1, 21, 12, 1, 22, 99];
    let output = [10, 7, 1, 20, 11, 7, 1, 21, 12, 7, 1, 22];
    let run = |policy| {
        let c = SpecConfig {
            match_policy: policy,
            ..config(4, false)
        };
        let mut d = Drafter::new(&c, &prompt);
        let (mut accepted, mut pos) = (0, 0);
        while pos < output.len() {
            let draft = d.propose(4, None).tokens().to_vec();
            let a = draft
                .iter()
                .zip(&output[pos..])
                .take_while(|(x, y)| x == y)
                .count();
            d.observe(&(0..a).collect::<Vec<_>>());
            let emitted = (a + 1).min(output.len() - pos);
            for &t in &output[pos..pos + emitted] {
                d.push(t);
            }
            accepted += a;
            pos += emitted;
        }
        accepted
    };
    let (scored, recent, earliest) = (
        run(MatchPolicy::Scored),
        run(MatchPolicy::Recent),
        run(MatchPolicy::Earliest),
    );
    // (5, 4 and 5 tokens.) After "10 7 1" the scored chain drafts from the prompt's first 1,
    // where the copy stands, and keeps 20 11; the recent policy drafts from its last 1.
    assert!(
        scored > recent && scored >= earliest,
        "{scored} {recent} {earliest}"
    );
}

#[test]
fn calibration_follows_the_sequence_s_own_drafts() {
    // A 1-token match with one occurrence: 4 tokens at threshold 0.05 before any evidence.
    let evidence = |calibrate| {
        let c = SpecConfig {
            match_policy: MatchPolicy::Scored,
            ..config(8, false)
        };
        let mut d = Drafter::new(&c, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 1]);
        d.set_score_params(crate::ScoreParams {
            min_token_probability: 0.05,
            calibrate,
            ..Default::default()
        });
        d
    };
    let mut d = evidence(true);
    assert_eq!(d.propose(8, None).len(), 4);
    // Rejected drafts shorten the next ones, down to a single token (the decayed evidence
    // never scales an estimate below a quarter of the prior's).
    let mut lengths = Vec::new();
    for _ in 0..30 {
        lengths.push(d.propose(8, None).len());
        d.observe(&[]);
    }
    assert!(lengths.windows(2).all(|w| w[1] <= w[0]), "{lengths:?}");
    assert_eq!(*lengths.last().unwrap(), 1, "{lengths:?}");
    // Accepted drafts lengthen them, up to K.
    let mut d = evidence(true);
    let mut lengths = Vec::new();
    for _ in 0..12 {
        let n = d.propose(8, None).len();
        lengths.push(n);
        d.observe(&(0..n).collect::<Vec<_>>());
    }
    assert!(lengths.windows(2).all(|w| w[1] >= w[0]), "{lengths:?}");
    assert_eq!(*lengths.last().unwrap(), 8, "{lengths:?}");
    // Without calibration the outcomes change nothing.
    let mut d = evidence(false);
    for _ in 0..12 {
        d.propose(8, None);
        d.observe(&[]);
    }
    assert_eq!(d.propose(8, None).len(), 4);
}

#[test]
fn adaptive_evidence_chains_are_sized_by_their_own_estimates_and_the_price() {
    let c = SpecConfig {
        match_policy: MatchPolicy::Evidence,
        ..config(8, true)
    };
    // A long copy in progress: the last 9 tokens occurred before (each token about 0.8 once
    // the ones before it land), so a long draft pays at a dense model's price, a shorter one at
    // a higher price.
    let copy: Vec<u32> = (1..=20).chain(1..=9).collect();
    let mut d = Drafter::new(&c, &copy);
    let long = d.propose(8, Some(0.1)).tokens().to_vec();
    assert!(
        long.len() >= 6 && long[..6] == [10, 11, 12, 13, 14, 15],
        "{long:?}"
    );
    let short = d.propose(8, Some(0.3)).len();
    assert!(short >= 1 && short < long.len(), "{short}");
    // A lone 1-token match (about 0.3 for its first token): at 0.1 a row a short draft pays, at
    // 0.6 a row (a mixture of experts) none does, and a 1-token match is never probed.
    let mut d = Drafter::new(&c, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 1]);
    let cheap = d.propose(8, Some(0.1)).len();
    assert!((1..=3).contains(&cheap), "{cheap}");
    for _ in 0..40 {
        assert!(d.propose(8, Some(0.6)).is_empty());
        d.observe(&[]);
    }
}

#[test]
fn invalid_settings_are_refused() {
    let mut c = config(4, true);
    c.prompt_lookup_min = 5;
    assert_eq!(c.validate().unwrap_err().field, "prompt_lookup_min");
}
