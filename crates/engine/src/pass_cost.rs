//! Timing the model for [`PassCost`]: what a forward pass over 1, 2, 4, ... 32 rows costs on this
//! machine, measured once at start-up by the server (and refined from its real passes).

use crate::error::Result;
use crate::model::{BatchItem, Model};
use drafting::pass_cost::{PassCost, MAX_ROWS};
use std::time::Instant;

/// Row counts timed; the table covers the rest by interpolation.
const ANCHORS: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// Times passes over 1, 2, 4, ... 32 rows of one scratch sequence (a few hundred milliseconds
/// for a small model), the best of two runs each.
pub fn measure(model: &Model) -> Result<PassCost> {
    let mut cache = model.new_cache(64 + MAX_ROWS);
    let tokens: Vec<u32> = (0..32u32 + MAX_ROWS as u32)
        .map(|i| (i * 7919) % model.config.vocab_size as u32)
        .collect();
    model.forward(&mut [BatchItem {
        tokens: &tokens[..32],
        cache: &mut cache,
        all_logits: false,
        parents: &[],
    }])?;
    let mut points = Vec::new();
    for &r in &ANCHORS {
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let t = Instant::now();
            model.forward(&mut [BatchItem {
                tokens: &tokens[32..32 + r],
                cache: &mut cache,
                all_logits: true,
                parents: &[],
            }])?;
            best = best.min(t.elapsed().as_secs_f64());
            cache.truncate(32);
        }
        points.push((r, best));
    }
    // Costs never fall as rows are added (timing noise aside).
    for i in 1..points.len() {
        points[i].1 = points[i].1.max(points[i - 1].1);
    }
    Ok(PassCost::from_points(&points))
}
