//! Timing the model for [`PassCost`]: what a forward pass over 1, 2, 4, ... 32 rows costs on this
//! machine, and what attention over a longer cache adds to it, measured once at start-up by the
//! server (and refined from its real passes).

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::model::{BatchItem, Model};
use drafting::pass_cost::{ContextCost, PassCost, MAX_ROWS};
use std::time::Instant;

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
