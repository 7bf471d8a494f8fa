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
/// Cached positions before the timed rows: the short context, and the long one that gives the
/// cost per position (when the model's context holds it).
const SHORT: usize = 32;
const LONG: usize = 2048;
/// Rows of the second timing at the long context (the first is one row).
const LONG_ROWS: usize = 16;

/// Times passes over 1, 2, 4, ... 32 rows of one scratch sequence after 32 cached positions,
/// then one and 16 rows after 2,048 (a few hundred milliseconds for a small model), the best of
/// two runs each. The long cache is filled with made-up keys and values: attention costs the
/// same whatever they hold.
pub fn measure(model: &Model) -> Result<PassCost> {
    let tokens: Vec<u32> = (0..(SHORT + MAX_ROWS) as u32)
        .map(|i| (i * 7919) % model.config.vocab_size as u32)
        .collect();
    let mut cache = model.new_cache(SHORT + MAX_ROWS);
    model.forward(&mut [BatchItem {
        tokens: &tokens[..SHORT],
        cache: &mut cache,
        all_logits: false,
        parents: &[],
    }])?;
    let mut points = Vec::new();
    for &r in &ANCHORS {
        points.push((r, best_pass(model, &mut cache, &tokens[SHORT..SHORT + r])?));
    }
    let at = |rows: usize| points.iter().find(|p| p.0 == rows).map_or(0.0, |p| p.1);
    let context = context_cost(model, &tokens, at(1), at(LONG_ROWS))?;
    for (r, s) in points.iter_mut() {
        *s = (*s - context.seconds(*r, SHORT)).max(f64::MIN_POSITIVE);
    }
    // Costs never fall as rows are added (timing noise aside).
    for i in 1..points.len() {
        points[i].1 = points[i].1.max(points[i - 1].1);
    }
    Ok(PassCost::from_points(&points).with_context(context))
}

/// The cost per cached position, from one and `LONG_ROWS` rows timed after `LONG` positions
/// against the same rows after `SHORT` (`one`, `many`). None (zero) for a short-context model.
fn context_cost(model: &Model, tokens: &[u32], one: f64, many: f64) -> Result<ContextCost> {
    if model.config.context_len < LONG + MAX_ROWS {
        return Ok(ContextCost::default());
    }
    let mut cache = model.new_cache(LONG + MAX_ROWS);
    let filler = vec![0x3c_u8; LONG * cache.shape().bytes_per_position()];
    cache.put_rows(0, LONG, &filler);
    let long_one = best_pass(model, &mut cache, &tokens[..1])?;
    let long_many = best_pass(model, &mut cache, &tokens[..LONG_ROWS])?;
    let positions = (LONG - SHORT) as f64;
    Ok(ContextCost::from_slopes(
        (long_one - one) / positions,
        LONG_ROWS,
        (long_many - many) / positions,
    ))
}

/// The faster of two passes over `rows` after what `cache` holds, which is kept as it was.
fn best_pass(model: &Model, cache: &mut KvCache, rows: &[u32]) -> Result<f64> {
    let len = cache.len();
    let mut best = f64::INFINITY;
    for _ in 0..2 {
        let t = Instant::now();
        model.forward(&mut [BatchItem {
            tokens: rows,
            cache,
            all_logits: true,
            parents: &[],
        }])?;
        best = best.min(t.elapsed().as_secs_f64());
        cache.truncate(len);
    }
    Ok(best)
}
