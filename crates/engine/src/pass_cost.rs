//! Timing the model for [`PassCost`]: what a forward pass over 1, 2, 4, ... 32 rows costs on this
//! machine, and what attention over a longer cache adds to it, measured once by whoever runs a
//! batch (the server at start-up, the Python `LLM` at its first batch) and refined from its real
//! passes ([`BatchPricing`]).
//!
//! Speculation adapts to load: a pass over many rows is no longer bound by reading the weights,
//! so drafted rows stop being nearly free as the batch grows, nor as a sequence's context grows
//! (each row attends to every cached position). [`BatchPricing::step`] has the engine's
//! `step_priced` choose the greedy sequences' drafts together by the measured costs: the drafted
//! tokens that buy the most expected tokens per second of the pass's generated rows, which is
//! none once the batch is compute-bound. Each greedy sequence also gets the price of a drafted
//! row in the current batch at its context, which a draft tree goes by. Sampled sequences must
//! stay reproducible for a seed, so their drafts do not depend on timings: they get a fixed cap
//! on drafted tokens that shrinks as the batch grows (`ROW_BUDGET`).

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::model::{BatchItem, Model};
use crate::sequence::Sequence;
use crate::stats::SpecStats;
use crate::step::step_priced;
use crate::tokenizer::Tokenizer;
use drafting::pass_cost::{ContextCost, PassCost, MAX_ROWS};
use std::time::Instant;

/// Rows (last tokens plus drafts) per forward pass that speculation may fill for sampled
/// sequences.
pub const ROW_BUDGET: usize = 16;

/// The draft cap per sequence for a batch of `n` that may fill `rows` rows per pass.
pub fn draft_cap(rows: usize, n: usize) -> usize {
    (rows / n.max(1)).saturating_sub(1)
}

/// What a batch's passes cost, kept by whoever runs batches of sequences through `step` (the
/// server's engine loop, the Python `LLM`), so that both price their drafts the same way.
pub struct BatchPricing {
    cost: PassCost,
}

impl BatchPricing {
    /// Times `model` now (`measure`), or assumes a drafted row costs 0.3 tokens if timing fails.
    pub fn measure(model: &Model) -> Self {
        let cost = match measure(model) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    "could not time forward passes ({e}); assuming a row costs 0.3 tokens"
                );
                PassCost::linear(0.3)
            }
        };
        tracing::info!(
            one_row_ms = format!("{:.1}", cost.seconds(1) * 1e3),
            draft_price_1 = format!("{:.2}", cost.price(1)),
            draft_price_4 = format!("{:.2}", cost.price(4)),
            draft_price_8 = format!("{:.2}", cost.price(8)),
            draft_price_1_at_16k = format!("{:.2}", cost.prices(&[16_384])[0]),
            row_ms_per_1k_positions = format!("{:.2}", cost.context().per_row * 1e6),
            pass_ms_per_1k_positions = format!("{:.2}", cost.context().shared * 1e6),
            "pass costs measured"
        );
        BatchPricing { cost }
    }

    /// Pricing by a table already known.
    pub fn new(cost: PassCost) -> Self {
        BatchPricing { cost }
    }

    pub fn cost(&self) -> &PassCost {
        &self.cost
    }

    /// Sets each sequence's draft price and cap for a pass over all of `seqs`: greedy ones the
    /// price of a drafted row at their context in a batch of this size, and a cap of the widest
    /// pass timed shared among them; sampled ones no price and a fixed share of `ROW_BUDGET`.
    /// Before the memory budget is fitted, since what a sequence may draft is room it needs.
    pub fn price(&self, seqs: &mut [&mut Sequence]) {
        let contexts: Vec<usize> = seqs.iter().map(|s| s.positions()).collect();
        let prices = self.cost.prices(&contexts);
        let n = seqs.len();
        for (s, &price) in seqs.iter_mut().zip(&prices) {
            if s.config().sampling.is_greedy() {
                s.set_draft_price(Some(price));
                s.set_draft_limit(draft_cap(MAX_ROWS, n));
            } else {
                s.set_draft_price(None);
                s.set_draft_limit(draft_cap(ROW_BUDGET, n));
            }
        }
    }

    /// One pass over `seqs` (`step_priced` by this table), after which a pass with no prompt
    /// rows refines the table by its time. Returns what each sequence's speculation did in it.
    pub fn step(
        &mut self,
        model: &Model,
        tok: &Tokenizer,
        seqs: &mut [&mut Sequence],
    ) -> Result<Vec<SpecStats>> {
        let contexts: Vec<usize> = seqs.iter().map(|s| s.positions()).collect();
        let decode_only = seqs.iter().all(|s| !s.in_prefill());
        let before: Vec<SpecStats> = seqs.iter().map(|s| s.stats.clone()).collect();
        let started = Instant::now();
        step_priced(model, tok, seqs, Some(&self.cost))?;
        let seconds = started.elapsed().as_secs_f64();
        let counted: Vec<SpecStats> = (seqs.iter().zip(&before))
            .map(|(s, b)| s.stats.since(b))
            .collect();
        if decode_only {
            let batch: Vec<(usize, usize)> = (counted.iter().zip(&contexts))
                .map(|(c, &ctx)| (1 + c.draft_tokens, ctx))
                .collect();
            self.cost.observe_batch(&batch, seconds);
        }
        Ok(counted)
    }
}

/// Row counts timed; the table covers the rest by interpolation.
const ANCHORS: [usize; 6] = [1, 2, 4, 8, 16, 32];
/// Cached positions before the timed rows: the short context, and the long ones that give the cost
/// per position (the longest that the model's context holds). Long, because the difference is a
/// few milliseconds at 2,048 positions, no more than a shared machine's noise.
const SHORT: usize = 32;
const LONG: [usize; 3] = [8192, 4096, 2048];
/// Rows of the second timing at both contexts (the first is one row).
const LONG_ROWS: usize = 16;
/// Runs of each timing; the fastest counts (noise only ever adds time).
const RUNS: usize = 3;

/// Times passes over 1, 2, 4, ... 32 rows of one scratch sequence after 32 cached positions,
/// then one and 16 rows after 32 and after 8,192 in turn (about 3.5 s for a 1.5B model on 2
/// cores; the server measures on its engine thread while it already accepts requests). The
/// long cache is filled with made-up keys and values: attention costs the same whatever they hold.
pub fn measure(model: &Model) -> Result<PassCost> {
    let tokens: Vec<u32> = (0..(SHORT + MAX_ROWS) as u32)
        .map(|i| (i * 7919) % model.config.vocab_size as u32)
        .collect();
    let mut short = model.new_cache(SHORT + MAX_ROWS);
    model.forward(&mut [BatchItem {
        tokens: &tokens[..SHORT],
        cache: &mut short,
        all_logits: false,
        prompt: true,
        parents: &[],
    }])?;
    let mut points = Vec::new();
    for &r in &ANCHORS {
        let rows = &tokens[SHORT..SHORT + r];
        points.push((r, fastest(model, &mut short, rows)?));
    }
    let context = context_cost(model, &mut short, &tokens[SHORT..])?;
    for (r, s) in points.iter_mut() {
        *s = (*s - context.seconds(*r, SHORT)).max(f64::MIN_POSITIVE);
    }
    // Costs never fall as rows are added (timing noise aside).
    for i in 1..points.len() {
        points[i].1 = points[i].1.max(points[i - 1].1);
    }
    Ok(PassCost::from_points(&points).with_context(context))
}

/// The cost per cached position: one and `LONG_ROWS` rows timed after the long context and after
/// `short`'s, alternately. None (zero) for a model whose context is short.
fn context_cost(model: &Model, short: &mut KvCache, rows: &[u32]) -> Result<ContextCost> {
    let room = model.config.context_len.saturating_sub(MAX_ROWS);
    let Some(long) = LONG.into_iter().find(|&l| l <= room) else {
        return Ok(ContextCost::default());
    };
    let mut cache = model.new_cache(long + MAX_ROWS);
    let chunk = 256;
    let filler = vec![0x3c_u8; chunk * cache.shape().bytes_per_position()];
    while cache.len() < long {
        cache.put_rows(cache.len(), chunk, &filler);
    }
    // Fastest times of one and LONG_ROWS rows, near (after `short`) and far (after `long`).
    let (mut near, mut far) = ([f64::INFINITY; 2], [f64::INFINITY; 2]);
    for _ in 0..RUNS {
        for (i, n) in [1, LONG_ROWS].into_iter().enumerate() {
            near[i] = near[i].min(pass(model, short, &rows[..n])?);
            far[i] = far[i].min(pass(model, &mut cache, &rows[..n])?);
        }
    }
    let per_position = |i: usize| (far[i] - near[i]) / (long - short.len()) as f64;
    Ok(ContextCost::from_slopes(
        per_position(0),
        LONG_ROWS,
        per_position(1),
    ))
}

/// One timed pass over `rows` after what `cache` holds, which is kept as it was.
fn pass(model: &Model, cache: &mut KvCache, rows: &[u32]) -> Result<f64> {
    let len = cache.len();
    let t = Instant::now();
    model.forward(&mut [BatchItem {
        tokens: rows,
        cache,
        all_logits: true,
        prompt: false,
        parents: &[],
    }])?;
    let seconds = t.elapsed().as_secs_f64();
    cache.truncate(len);
    Ok(seconds)
}

/// The fastest of `RUNS` passes over `rows` after what `cache` holds.
fn fastest(model: &Model, cache: &mut KvCache, rows: &[u32]) -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..RUNS {
        best = best.min(pass(model, cache, rows)?);
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_cap_shrinks_with_the_batch() {
        assert!(draft_cap(ROW_BUDGET, 1) >= 8);
        assert_eq!(draft_cap(ROW_BUDGET, 2), 7);
        assert_eq!(draft_cap(ROW_BUDGET, 8), 1);
        assert_eq!(draft_cap(ROW_BUDGET, 16), 0);
        assert_eq!(draft_cap(ROW_BUDGET, 32), 0);
    }

    /// A batch priced and stepped by `BatchPricing`: greedy sequences get the wide cap, sampled
    /// ones the fixed share; greedy outputs equal plain decoding's, each pass's speculation is
    /// counted per sequence, and decode passes refine the table (started at ten seconds a row).
    #[test]
    fn a_priced_batch_keeps_outputs_and_learns_its_pass_costs() {
        use crate::generation::GenerationConfig;
        use crate::step::step;
        use crate::test_models::{repeating_prompts, tiny_llama};
        let lm = tiny_llama();
        let (model, tok) = (&lm.model, &lm.tokenizer);
        let prompts = repeating_prompts(3);
        let config = GenerationConfig {
            max_new_tokens: 40,
            ..Default::default()
        };
        let new =
            |p: &Vec<u32>, c: &GenerationConfig| Sequence::new(model, p.clone(), c.clone(), 256);
        let mut plain: Vec<Sequence> = prompts.iter().map(|p| new(p, &config).unwrap()).collect();
        while plain.iter().any(|s| !s.is_finished()) {
            let mut live: Vec<&mut Sequence> =
                plain.iter_mut().filter(|s| !s.is_finished()).collect();
            step(model, tok, &mut live).unwrap();
        }
        let mut sampled = config.clone();
        sampled.sampling.do_sample = true;
        sampled.sampling.temperature = 0.8;
        sampled.seed = Some(7);
        let mut seqs: Vec<Sequence> = prompts.iter().map(|p| new(p, &config).unwrap()).collect();
        seqs.push(new(&prompts[0], &sampled).unwrap());
        let mut pricing = BatchPricing::new(PassCost::linear(10.0));
        let start = pricing.cost().seconds(4);
        {
            let mut all: Vec<&mut Sequence> = seqs.iter_mut().collect();
            pricing.price(&mut all);
        }
        let limits: Vec<usize> = seqs.iter().map(|s| s.draft_limit).collect();
        assert_eq!(limits, [15, 15, 15, 3]);
        let mut counted = 0;
        while seqs.iter().any(|s| !s.is_finished()) {
            let mut live: Vec<&mut Sequence> =
                seqs.iter_mut().filter(|s| !s.is_finished()).collect();
            pricing.price(&mut live);
            let n = live.len();
            let stats = pricing.step(model, tok, &mut live).unwrap();
            assert_eq!(stats.len(), n);
            counted += stats.iter().map(|c| c.draft_tokens).sum::<usize>();
        }
        for (a, b) in seqs.iter().zip(&plain) {
            assert_eq!(a.tokens, b.tokens, "a priced batch changed a greedy output");
        }
        let drafted: usize = seqs.iter().map(|s| s.stats.draft_tokens).sum();
        assert_eq!(
            counted, drafted,
            "the passes' counts add up to the sequences'"
        );
        assert!(
            pricing.cost().seconds(4) < start,
            "decode passes did not refine the table: {} s",
            pricing.cost().seconds(4)
        );
    }
}
