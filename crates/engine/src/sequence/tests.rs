use super::*;
use crate::step::step;
use crate::test_models::{repeating_prompts, tiny_llama};
use crate::LoadedModel;
use drafting::SpecConfig;

/// Greedy decoding of up to `max_new_tokens`, with drafts of up to `k` tokens (0: none), every
/// draft verified whatever the timings.
fn greedy(k: usize, max_new_tokens: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        speculation: SpecConfig {
            num_speculative_tokens: k,
            adaptive: false,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Runs `prompt` to the end with the cache first holding `first_room` positions past it;
/// returns the tokens and the cache's final size.
fn run(
    lm: &LoadedModel,
    prompt: &[u32],
    config: &GenerationConfig,
    first_room: usize,
) -> (Vec<u32>, usize) {
    let (model, tok) = (&lm.model, &lm.tokenizer);
    let mut seq = Sequence::with_first_room(
        model,
        prompt.to_vec(),
        config.clone(),
        256,
        first_room,
        None,
    )
    .unwrap();
    while !seq.is_finished() {
        step(model, tok, &mut [&mut seq]).unwrap();
    }
    (seq.tokens.clone(), seq.cache.capacity())
}

/// A cache that starts small and grows while the sequence decodes gives the tokens of one
/// sized for the whole run, plain and with drafts (which must find room for their rows).
#[test]
fn a_cache_that_grows_gives_the_output_of_a_whole_one() {
    let lm = tiny_llama();
    // A repetitive prompt, so that the n-gram drafter proposes.
    let prompt: Vec<u32> = (0..48).map(|i| 20 + (i % 12) * 5).collect();
    for k in [0usize, 6] {
        let config = greedy(k, 150);
        let (whole, whole_size) = run(&lm, &prompt, &config, 10_000);
        let (grown, grown_size) = run(&lm, &prompt, &config, 3);
        assert_eq!(whole, grown, "k = {k}: a grown cache changed the output");
        let generated = grown.len() - prompt.len();
        assert!(
            generated > 3,
            "k = {k}: too short to grow ({generated} tokens)"
        );
        assert_eq!(
            whole_size,
            prompt.len() + 150,
            "k = {k}: sized to what it can reach"
        );
        assert!(
            grown_size >= prompt.len() + generated && grown_size <= whole_size,
            "k = {k}: grew to {grown_size}"
        );
    }
}

#[test]
fn stop_strings_are_found_across_pushes() {
    let stops = vec!["END".to_string(), "\n\n".to_string()];
    assert_eq!(find_stop("abcEN", 3, &stops), None);
    assert_eq!(find_stop("abcEND", 5, &stops), Some((3, 0)));
    assert_eq!(find_stop("a\n\nb", 2, &stops), Some((1, 1)));
    assert_eq!(safe_len("abcEN", &stops), 3);
    assert_eq!(safe_len("abc\n", &stops), 3);
    assert_eq!(safe_len("abc", &stops), 3);
    assert_eq!(safe_len("héE", &stops), "hé".len());
}

/// A sequence on a spare cache, one that another sequence filled and left, gives the tokens it
/// gives on a new cache, plain and with drafts; and it does take the spare.
#[test]
fn a_reused_cache_gives_the_output_of_a_new_one() {
    let lm = tiny_llama();
    let (model, tok) = (&lm.model, &lm.tokenizer);
    let first: Vec<u32> = (0..90).map(|i| 7 + (i % 17) * 3).collect();
    let second: Vec<u32> = (0..40).map(|i| 30 + (i % 9) * 4).collect();
    for k in [0usize, 6] {
        let config = greedy(k, 100);
        let finish = |seq: &mut Sequence| {
            while !seq.is_finished() {
                step(model, tok, &mut [&mut *seq]).unwrap();
            }
        };
        let mut filler = Sequence::new(model, first.clone(), config.clone(), 256).unwrap();
        finish(&mut filler);
        let spare = filler.take_cache();
        let filled = spare.capacity();
        let mut fresh = Sequence::new(model, second.clone(), config.clone(), 256).unwrap();
        finish(&mut fresh);
        let mut reused =
            Sequence::reusing(model, second.clone(), config.clone(), 256, Some(spare)).unwrap();
        assert_eq!(
            reused.cache.capacity(),
            filled,
            "k = {k}: the spare was not taken"
        );
        finish(&mut reused);
        assert_eq!(
            fresh.tokens, reused.tokens,
            "k = {k}: a reused cache changed the output"
        );
    }
}

/// Drafts chosen for the whole batch (`step_priced`) give every sequence the tokens it gives
/// without drafts; where rows are cheap the plan sends drafts, and where a row costs five passes
/// it sends none but the drafter's probes.
#[test]
fn drafts_chosen_for_the_batch_keep_each_output() {
    use drafting::pass_cost::PassCost;
    let lm = tiny_llama();
    let (model, tok) = (&lm.model, &lm.tokenizer);
    let prompts = repeating_prompts(4);
    let run = |k: usize, cost: Option<&PassCost>| {
        let mut config = greedy(k, 60);
        config.speculation.adaptive = true;
        let mut seqs: Vec<Sequence> = (prompts.iter())
            .map(|p| Sequence::new(model, p.clone(), config.clone(), 256).unwrap())
            .collect();
        for s in seqs.iter_mut() {
            s.set_draft_price(Some(0.5));
        }
        while seqs.iter().any(|s| !s.is_finished()) {
            let mut live: Vec<&mut Sequence> =
                seqs.iter_mut().filter(|s| !s.is_finished()).collect();
            crate::step::step_priced(model, tok, &mut live, cost).unwrap();
        }
        let drafted: usize = seqs.iter().map(|s| s.stats.draft_tokens).sum();
        (
            seqs.into_iter().map(|s| s.tokens).collect::<Vec<_>>(),
            drafted,
        )
    };
    let (plain, none) = run(0, None);
    assert_eq!(none, 0);
    let (cheap, drafted) = run(8, Some(&PassCost::flat()));
    assert_eq!(
        cheap, plain,
        "drafts chosen with cheap rows changed an output"
    );
    assert!(drafted > 20, "cheap rows: {drafted} drafted tokens");
    let (dear, probes) = run(8, Some(&PassCost::linear(5.0)));
    assert_eq!(
        dear, plain,
        "drafts chosen with dear rows changed an output"
    );
    assert!(
        probes < drafted / 2,
        "dear rows: {probes} drafted tokens against {drafted}"
    );
}
