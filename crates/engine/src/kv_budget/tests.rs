use super::*;
use crate::generation::GenerationConfig;
use crate::prefix_cache::PrefixCache;
use crate::sampling::SamplingParams;
use crate::step::step;
use crate::LoadedModel;
use drafting::SpecConfig;

use crate::test_models::tiny_llama as tiny;

/// The tiny model with an f32 cache, whose bytes grow with every position: a bf16 cache's values
/// take whole blocks of positions (`kv_cache::room`), so one position more may cost no byte, and
/// these tests count positions against bytes one by one.
fn tiny_f32() -> LoadedModel {
    let mut lm = tiny();
    lm.model
        .set_kv_dtype(crate::kv_cache::KvDtype::F32)
        .unwrap();
    lm
}

/// Up to `max_new_tokens`, drafts of up to `k` tokens (0: none), greedy or seeded sampling.
fn config(k: usize, max_new_tokens: usize, sampled: bool) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        speculation: SpecConfig {
            num_speculative_tokens: k,
            adaptive: false,
            ..Default::default()
        },
        sampling: match sampled {
            true => SamplingParams::from_request(0.9, 0.95, 0, 0.0, 1.0).unwrap(),
            false => SamplingParams::default(),
        },
        seed: Some(7),
        ..Default::default()
    }
}

/// A repetitive prompt (so that the n-gram drafter proposes), different per `i`.
fn prompt(i: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| (20 + i * 3 + (j % 12) * 5) as u32)
        .collect()
}

/// Runs `seqs` as one batch to the end within `budget` as a server does: admission, `fit`,
/// preemption of the newest, resume; checks after every `fit` that the caches are within the
/// budget. Returns each sequence's tokens and the preemptions.
fn run_batch(
    lm: &LoadedModel,
    budget: &KvBudget,
    waiting: Vec<Sequence>,
    prefix: &mut PrefixCache,
) -> (Vec<Vec<u32>>, usize) {
    let mut done: Vec<Option<Vec<u32>>> = vec![None; waiting.len()];
    let mut live: Vec<(usize, Sequence)> = Vec::new();
    let mut parked: Vec<(usize, Sequence)> = waiting.into_iter().enumerate().collect();
    let mut preemptions = 0;
    let mut steps = 0;
    while !parked.is_empty() || !live.is_empty() {
        parked.sort_by_key(|(i, _)| *i);
        while !parked.is_empty() {
            let held = held(live.iter().map(|(_, s)| s), &[]);
            let Some((capacity, _)) = budget.admission(&parked[0].1, held, &mut Vec::new()) else {
                break;
            };
            let (i, mut s) = parked.remove(0);
            s.admit(None, capacity, prefix, 0);
            live.push((i, s));
        }
        assert!(!live.is_empty(), "nothing admitted");
        let keep = {
            let mut seqs: Vec<&mut Sequence> = live.iter_mut().map(|(_, s)| s).collect();
            budget.fit(&mut seqs, &mut Vec::new())
        };
        for (i, mut s) in live.drain(keep..).collect::<Vec<_>>() {
            s.preempt(prefix, 0);
            preemptions += 1;
            parked.push((i, s));
        }
        let held = held(live.iter().map(|(_, s)| s), &[]);
        assert!(held <= budget.bytes, "{held} bytes held, over the budget");
        let mut seqs: Vec<&mut Sequence> = live.iter_mut().map(|(_, s)| s).collect();
        step(&lm.model, &lm.tokenizer, &mut seqs).unwrap();
        for (i, s) in live.extract_if(.., |(_, s)| s.is_finished()) {
            s.keep_prefix(prefix, 0);
            done[i] = Some(s.tokens.clone());
        }
        steps += 1;
        assert!(steps < 10_000, "the batch does not end");
    }
    (done.into_iter().map(Option::unwrap).collect(), preemptions)
}

/// One sequence alone, unbudgeted.
fn alone(lm: &LoadedModel, prompt: Vec<u32>, config: GenerationConfig) -> Vec<u32> {
    let mut seq = Sequence::new(&lm.model, prompt, config, 512).unwrap();
    while !seq.is_finished() {
        step(&lm.model, &lm.tokenizer, &mut [&mut seq]).unwrap();
    }
    seq.tokens.clone()
}

/// Sequences that outgrow a small budget preempt the newest, which resumes from its tokens: every
/// output equals the sequence's alone, greedy and seeded sampling, with and without drafts,
/// with the prefix cache on (preempted blocks reused) and off (all recomputed).
#[test]
fn preempted_sequences_resume_with_their_outputs() {
    let lm = tiny();
    let shape = lm.model.kv_shape();
    for (k, sampled) in [(0, false), (6, false), (0, true), (4, true)] {
        for prefix_bytes in [0, 64 << 20] {
            let seqs: Vec<(Vec<u32>, GenerationConfig)> = (0..4)
                .map(|i| (prompt(i, 40 + 8 * i), config(k, 120, sampled)))
                .collect();
            let reach = seqs
                .iter()
                .map(|(p, c)| p.len() + c.max_new_tokens)
                .max()
                .unwrap();
            // Room for one sequence at its longest and a little more: they must take turns.
            let budget = KvBudget {
                bytes: KvCache::bytes_for(shape, reach) + KvCache::bytes_for(shape, 48),
                shape,
            };
            let waiting = seqs
                .iter()
                .map(|(p, c)| Sequence::waiting(&lm.model, p.clone(), c.clone(), 512).unwrap())
                .collect();
            let mut prefix = PrefixCache::new(shape, prefix_bytes);
            let (outs, preemptions) = run_batch(&lm, &budget, waiting, &mut prefix);
            let what = format!("k = {k}, sampled = {sampled}, prefix cache {prefix_bytes}");
            assert!(preemptions > 0, "{what}: nothing was preempted");
            for ((p, c), out) in seqs.into_iter().zip(outs) {
                assert_eq!(out, alone(&lm, p, c), "{what}: a preempted output changed");
            }
        }
    }
}

/// `fit` grows the oldest first: the newest gives way (itself when it is the one that must
/// grow), and spares go before any sequence.
#[test]
fn fit_preempts_the_newest_and_drops_spares_first() {
    let lm = tiny_f32();
    let shape = lm.model.kv_shape();
    let decoding = |len: usize, capacity: usize| {
        let mut s =
            Sequence::waiting(&lm.model, prompt(0, len), config(0, 400, false), 512).unwrap();
        let mut prefix = PrefixCache::new(shape, 0);
        s.admit(None, capacity, &mut prefix, 0);
        while s.in_prefill() {
            step(&lm.model, &lm.tokenizer, &mut [&mut s]).unwrap();
        }
        s
    };
    // Each cache full: the next token needs more room.
    let (mut a, mut b) = (decoding(33, 33), decoding(33, 33));
    assert_eq!(a.next_need().0, a.capacity() + 1);
    let two = a.cache_bytes() + b.cache_bytes();
    // Room for both to grow a little: both keep running, both grew.
    let roomy = KvBudget {
        bytes: two + 4 * KvCache::bytes_for(shape, 33),
        shape,
    };
    assert_eq!(roomy.fit(&mut [&mut a, &mut b], &mut Vec::new()), 2);
    assert!(a.capacity() > 33 && b.capacity() > 33);
    // Room for the first to grow only: the second (the newest) is preempted.
    let (mut a, mut b) = (decoding(33, 33), decoding(33, 33));
    let tight = KvBudget {
        bytes: KvCache::bytes_for(shape, 34) + b.cache_bytes(),
        shape,
    };
    assert_eq!(tight.fit(&mut [&mut a, &mut b], &mut Vec::new()), 1);
    assert_eq!(
        a.capacity(),
        34,
        "the oldest grew to what its next pass needs"
    );
    // A spare cache goes first.
    let (mut a, mut b) = (decoding(33, 33), decoding(33, 33));
    let mut spares = vec![KvCache::new(shape, 100)];
    let with_spare = KvBudget {
        bytes: tight.bytes + spares[0].bytes(),
        shape,
    };
    let kept = with_spare.fit(&mut [&mut a, &mut b], &mut spares);
    assert!(spares.is_empty(), "the spare was dropped before a sequence");
    assert_eq!(kept, 2, "its room went to the second");
    // Alone, the sequence that cannot grow preempts itself.
    let mut c = decoding(33, 33);
    let none = KvBudget {
        bytes: c.cache_bytes(),
        shape,
    };
    assert_eq!(none.fit(&mut [&mut c], &mut Vec::new()), 0);
}

/// A request whose cache could never fit is refused with the figures; `room` is the output the
/// budget holds beside a prompt; the cache's bytes are what `bytes_for` says.
#[test]
fn requests_that_never_fit_are_refused_with_the_figures() {
    let lm = tiny_f32();
    let shape = lm.model.kv_shape();
    let budget = KvBudget {
        bytes: KvCache::bytes_for(shape, 300),
        shape,
    };
    assert!(budget.check(300, 1).is_ok());
    let e = budget.check(301, 1).unwrap_err().to_string();
    assert!(
        e.contains("301 positions") && e.contains(&budget.bytes.to_string()),
        "{e}"
    );
    assert!(
        budget.check(200, 2).is_err(),
        "two choices of 200 positions"
    );
    assert_eq!(budget.positions_within(budget.bytes), 300);
    assert_eq!(budget.room(100, 1), 200);
    assert_eq!(budget.room(400, 1), 0);
    assert_eq!(KvCache::new(shape, 300).bytes(), budget.bytes);
    assert_eq!(KvCache::bytes_for(shape, 0), 0);
    assert!(KvCache::bytes_for(shape, 300) >= 300 * shape.bytes_per_position());
}
