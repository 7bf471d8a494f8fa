//! What a forward pass costs as a function of the rows in it, and from that what one more drafted
//! row costs a sequence in a batch.
//!
//! A decode pass over few rows is bound by reading the weights, so rows are nearly free; past some
//! batch size the pass becomes compute-bound and every row costs about as much as a sequence's own
//! token. A batch of `n` sequences pays `cost(n)` for `n` tokens; drafting roughly doubles the rows,
//! so the price of a drafted row relative to a plain token is `cost(2n) / cost(n) - 1`: small for a
//! lone sequence on a CPU, near 1 once eight sequences share the pass, where no draft can pay. The
//! engine's scheduler hands that price to each sequence's [`Drafter`](crate::Drafter); the
//! drafting study reads relative costs from the same table.
//!
//! The points come from timing the model (the engine measures them at start-up; `pld bench forward`
//! records them), so this type holds numbers only.

/// Row counts the table covers exactly; past it, cost grows in proportion to rows.
pub const MAX_ROWS: usize = 64;
/// Weight of a new observation in the running average of a row count's cost.
const EMA: f64 = 0.1;

/// Seconds (or any unit) per forward pass by number of rows.
#[derive(Clone, Debug, PartialEq)]
pub struct PassCost {
    /// Cost of a pass over `r` rows at index `r` (index 0 unused).
    seconds: Vec<f64>,
}

impl PassCost {
    /// From pass costs at some row counts (ascending, at least one point): piecewise-linear in
    /// between, extended linearly past the last point (proportionally when there is only one).
    ///
    /// # Panics
    /// If `points` is empty.
    pub fn from_points(points: &[(usize, f64)]) -> Self {
        assert!(!points.is_empty(), "a pass cost needs at least one point");
        let mut seconds = vec![0.0; MAX_ROWS + 1];
        for (r, s) in seconds.iter_mut().enumerate().skip(1) {
            let hi = points
                .iter()
                .position(|&(p, _)| p >= r)
                .unwrap_or(points.len() - 1)
                .max(1)
                .min(points.len() - 1);
            let lo = hi.saturating_sub(1);
            let ((r0, s0), (r1, s1)) = (points[lo], points[hi]);
            *s = if r1 == r0 {
                s0 * r as f64 / r0 as f64
            } else {
                s0 + (s1 - s0) * (r as f64 - r0 as f64) / (r1 as f64 - r0 as f64)
            };
            *s = s.max(f64::MIN_POSITIVE);
        }
        PassCost { seconds }
    }

    /// Every pass costs the same whatever its rows (the acceptance-only view of drafting).
    pub fn flat() -> Self {
        PassCost::from_points(&[(1, 1.0), (2, 1.0)])
    }

    /// A pass over one row costs 1, each further row `per_row`.
    pub fn linear(per_row: f64) -> Self {
        PassCost::from_points(&[(1, 1.0), (MAX_ROWS, 1.0 + per_row * (MAX_ROWS - 1) as f64)])
    }

    /// Cost of a pass over `rows` rows.
    pub fn seconds(&self, rows: usize) -> f64 {
        let r = rows.clamp(1, MAX_ROWS);
        self.seconds[r] * rows.max(1) as f64 / r as f64
    }

    /// Cost of a pass over `rows` rows relative to a pass over one.
    pub fn relative(&self, rows: usize) -> f64 {
        self.seconds(rows) / self.seconds(1)
    }

    /// The price of one drafted row, in plain tokens, for each of `n` sequences in a pass.
    pub fn price(&self, n: usize) -> f64 {
        let n = n.max(1);
        (self.seconds(2 * n) / self.seconds(n) - 1.0).max(0.0)
    }

    /// Folds in a measured pass.
    pub fn observe(&mut self, rows: usize, seconds: f64) {
        if (1..=MAX_ROWS).contains(&rows) && seconds.is_finite() && seconds > 0.0 {
            let s = &mut self.seconds[rows];
            *s += EMA * (seconds - *s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_and_prices_drafts_by_batch_size() {
        // Flat up to 4 rows, then linear: a bandwidth-bound pass turning compute-bound.
        let c = PassCost::from_points(&[(1, 10.0), (2, 10.5), (4, 11.0), (8, 22.0), (16, 44.0)]);
        assert_eq!(c.seconds(3), 10.75);
        assert_eq!(c.seconds(12), 33.0);
        assert_eq!(c.seconds(32), 88.0, "linear past the last point");
        assert!(c.price(1) < 0.1, "a lone sequence drafts almost for free");
        assert!(
            (c.price(8) - 1.0).abs() < 1e-9,
            "compute-bound: a row per row"
        );
        assert!(c.price(2) < c.price(4));
    }

    #[test]
    fn relative_costs_interpolate_and_extrapolate() {
        let c = PassCost::from_points(&[(1, 1.0), (2, 1.2), (4, 1.6), (8, 3.0)]);
        assert!((c.relative(1) - 1.0).abs() < 1e-9);
        assert!((c.relative(3) - 1.4).abs() < 1e-9);
        assert!(
            (c.relative(16) - 5.8).abs() < 1e-9,
            "extrapolates the last segment"
        );
        let flat = PassCost::flat();
        assert_eq!((flat.relative(1), flat.relative(9)), (1.0, 1.0));
        assert!((PassCost::linear(0.5).relative(3) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn observations_move_the_estimate() {
        let mut c = PassCost::from_points(&[(1, 10.0), (2, 20.0)]);
        for _ in 0..100 {
            c.observe(2, 12.0);
        }
        assert!((c.seconds(2) - 12.0).abs() < 0.01);
        c.observe(0, 1.0);
        c.observe(2, f64::NAN);
        assert!((c.seconds(2) - 12.0).abs() < 0.01);
    }
}
