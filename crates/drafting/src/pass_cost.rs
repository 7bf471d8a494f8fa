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
//! Attention adds a cost that grows with the context: every row of a sequence reads and multiplies
//! all of its cached positions. Measured on qwen-coder-1.5b (2 threads, AVX-512 VNNI), 8 rows cost
//! 1.18x one row at 512 tokens of context but 1.95x at 16,000, so a price read at a short context
//! over-drafts an agent's 20k-token prompt. The table is therefore the cost at no context, and
//! [`ContextCost`] adds, per sequence and cached position, a part paid once per pass (reading the
//! keys and values) and a part paid per row (the products).
//!
//! The points come from timing the model (the engine measures them at start-up; `pld bench forward`
//! records them), so this type holds numbers only.

/// Row counts the table covers exactly; past it, cost grows in proportion to rows.
pub const MAX_ROWS: usize = 64;
/// Weight of a new observation in the running average of a row count's cost.
const EMA: f64 = 0.1;

/// What attention over the cache adds to a pass, per sequence and per cached position it attends
/// to: `shared + per_row * rows` for a sequence with `rows` rows in the pass.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ContextCost {
    pub shared: f64,
    pub per_row: f64,
}

impl ContextCost {
    /// From the extra cost per cached position of a pass over one row and over `rows` rows (a
    /// line through the two; negative parts, which only noise makes, become zero).
    pub fn from_slopes(one: f64, rows: usize, at_rows: f64) -> Self {
        let per_row = if rows > 1 {
            ((at_rows - one) / (rows - 1) as f64).max(0.0)
        } else {
            0.0
        };
        let shared = (one - per_row).max(0.0);
        if shared.is_finite() && per_row.is_finite() {
            ContextCost { shared, per_row }
        } else {
            ContextCost::default()
        }
    }

    /// What a sequence with `rows` rows over `context` cached positions adds to a pass.
    pub fn seconds(&self, rows: usize, context: usize) -> f64 {
        (self.shared + self.per_row * rows as f64) * context as f64
    }
}

/// Seconds (or any unit) per forward pass by number of rows, and what the context adds.
#[derive(Clone, Debug, PartialEq)]
pub struct PassCost {
    /// Cost of a pass over `r` rows at no context at index `r` (index 0 unused).
    seconds: Vec<f64>,
    context: ContextCost,
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
        PassCost {
            seconds,
            context: ContextCost::default(),
        }
    }

    /// The same table with what attention over the cache adds.
    pub fn with_context(mut self, context: ContextCost) -> Self {
        self.context = context;
        self
    }

    pub fn context(&self) -> ContextCost {
        self.context
    }

    /// Every pass costs the same whatever its rows (the acceptance-only view of drafting).
    pub fn flat() -> Self {
        PassCost::from_points(&[(1, 1.0), (2, 1.0)])
    }

    /// A pass over one row costs 1, each further row `per_row`.
    pub fn linear(per_row: f64) -> Self {
        PassCost::from_points(&[(1, 1.0), (MAX_ROWS, 1.0 + per_row * (MAX_ROWS - 1) as f64)])
    }

    /// Cost of a pass over `rows` rows at no context.
    pub fn seconds(&self, rows: usize) -> f64 {
        let r = rows.clamp(1, MAX_ROWS);
        self.seconds[r] * rows.max(1) as f64 / r as f64
    }

    /// Cost of a pass over `rows` rows relative to a pass over one.
    pub fn relative(&self, rows: usize) -> f64 {
        self.seconds(rows) / self.seconds(1)
    }

    /// The price of one drafted row, in plain tokens, for each of `n` sequences in a pass at no
    /// context.
    pub fn price(&self, n: usize) -> f64 {
        self.prices(&vec![0; n.max(1)])[0]
    }

    /// The price of one drafted row, in plain tokens, for each sequence of a batch whose
    /// sequences have `contexts` cached positions: the row's share of the rows a drafting batch
    /// adds, plus its attention over its own context, over what a plain token costs in the
    /// undrafted pass (which pays every sequence's attention once).
    pub fn prices(&self, contexts: &[usize]) -> Vec<f64> {
        let n = contexts.len().max(1);
        let c = self.context;
        let plain = self.seconds(n) + contexts.iter().map(|&ctx| c.seconds(1, ctx)).sum::<f64>();
        let rows = (self.seconds(2 * n) - self.seconds(n)).max(0.0) / n as f64;
        let per_token = plain / n as f64;
        contexts
            .iter()
            .map(|&ctx| (rows + c.per_row * ctx as f64) / per_token)
            .collect()
    }

    /// Folds in a measured pass over sequences of `(rows, context)`: what the context model
    /// accounts for is taken off before the rest refines the table.
    pub fn observe_batch(&mut self, batch: &[(usize, usize)], seconds: f64) {
        let rows = batch.iter().map(|&(r, _)| r).sum();
        let context: f64 = batch
            .iter()
            .map(|&(r, ctx)| self.context.seconds(r, ctx))
            .sum();
        if seconds > context {
            self.observe(rows, seconds - context);
        }
    }

    /// The drafts of a whole batch chosen together: for each decoding sequence (`drafts`: the
    /// estimated probability that each token of its candidate chain and every token before it
    /// are accepted, and its cached positions), how many of its candidate tokens to send, so
    /// that the pass buys the most expected tokens per second. `base_rows` is the pass's rows
    /// without drafts (each sequence's last token, and prompt chunks riding along).
    ///
    /// The candidate tokens are taken best first (probability over what a row of that sequence
    /// costs at its context, which keeps each chain's tokens in order), and the pass is priced at
    /// each count of rows from this table: it is not linear in rows (vector kernels, then tiles
    /// once a pass is wide enough), so a price per row fixed beforehand can send too few drafts
    /// where more rows cost little more, or too many. The best count is kept only if it gains at
    /// least `MIN_GAIN` tokens per one-row pass's time over no drafts at all (a lone sequence
    /// then drafts as [`DraftLength`](crate::DraftLength) does at the same price).
    pub fn choose_drafts(&self, drafts: &[(&[f64], usize)], base_rows: usize) -> Vec<usize> {
        let mut ks = vec![0; drafts.len()];
        let total: usize = drafts.iter().map(|(p, _)| p.len()).sum();
        if total == 0 {
            return ks;
        }
        let c = self.context;
        let base_rows = base_rows.max(drafts.len());
        // Attention over each sequence's context for its own row, paid with or without drafts.
        let attention: f64 = drafts.iter().map(|&(_, ctx)| c.seconds(1, ctx)).sum();
        // A drafted row's cost: the table's average slope over the candidates, plus attention
        // over its own context.
        let slope = (self.seconds(base_rows + total) - self.seconds(base_rows)) / total as f64;
        let mut order: Vec<(f64, usize, usize)> = (drafts.iter().enumerate())
            .flat_map(|(i, &(paths, ctx))| {
                let row = slope + c.per_row * ctx as f64;
                paths.iter().enumerate().map(move |(j, &p)| (p / row, i, j))
            })
            .collect();
        order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let plain = drafts.len() as f64 / (self.seconds(base_rows) + attention);
        let (mut tokens, mut extra) = (drafts.len() as f64, 0.0);
        let mut best = (plain, 0);
        for (r, &(_, i, j)) in order.iter().enumerate() {
            let (paths, ctx) = drafts[i];
            tokens += paths[j];
            extra += c.per_row * ctx as f64;
            let rate = tokens / (self.seconds(base_rows + r + 1) + attention + extra);
            if rate > best.0 {
                best = (rate, r + 1);
            }
        }
        if (best.0 - plain) * self.seconds(1) < crate::length::MIN_GAIN {
            return ks;
        }
        for &(_, i, _) in &order[..best.1] {
            ks[i] += 1;
        }
        ks
    }

    /// Folds in a measured pass at no context.
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
    fn context_raises_the_price_of_a_row() {
        // qwen-coder-1.5b, 2 threads: one row 29.7 ms and 8 rows 35.1 ms at 512 positions; 54.7
        // and 106.5 ms at 16,000. Per position: 1.61 us (one row), 4.60 us (8 rows).
        let context = ContextCost::from_slopes(1.61e-6, 8, 4.60e-6);
        assert!((context.per_row - 0.427e-6).abs() < 1e-9);
        assert!((context.shared - 1.183e-6).abs() < 1e-9);
        let base = |rows: usize, ms: f64| (rows, ms * 1e-3 - context.seconds(rows, 512));
        let c = PassCost::from_points(&[base(1, 29.7), base(8, 35.1)]).with_context(context);
        let at = |rows: usize, ctx: usize| c.seconds(rows) + c.context().seconds(rows, ctx);
        assert!((at(8, 16_000) / at(1, 16_000) - 1.95).abs() < 0.03);
        let short = c.prices(&[512])[0];
        let long = c.prices(&[16_000])[0];
        assert!(short < 0.03 && long > 0.1, "{short} {long}");
        // In a batch, each sequence pays for its own context.
        let mixed = c.prices(&[512, 16_000]);
        assert!(mixed[0] < mixed[1]);
        assert_eq!(c.price(1), c.prices(&[0])[0]);
    }

    #[test]
    fn observations_take_off_the_context_part() {
        let context = ContextCost {
            shared: 1e-6,
            per_row: 1e-6,
        };
        let mut c = PassCost::from_points(&[(1, 10.0), (2, 20.0)]).with_context(context);
        for _ in 0..200 {
            c.observe_batch(&[(1, 1_000_000), (1, 0)], 16.0);
        }
        // Two rows: 16 s, of which the first sequence's context accounts for 2 s.
        assert!((c.seconds(2) - 14.0).abs() < 0.01, "{}", c.seconds(2));
        assert_eq!(ContextCost::from_slopes(2.0, 4, 1.0).per_row, 0.0);
    }

    #[test]
    fn a_lone_sequence_drafts_as_its_own_controller_would() {
        // A row costs a tenth of a pass: the controller's prior price.
        let c = PassCost::linear(0.1);
        let good = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4];
        let k = c.choose_drafts(&[(&good, 0)], 1)[0];
        let lone = crate::DraftLength::new(0.1);
        assert_eq!(k, lone.choose_from_paths(0.1, 4, good.iter().copied()));
        assert!(k >= 4, "{k}");
        assert_eq!(c.choose_drafts(&[(&[0.05, 0.01], 0)], 1), vec![0]);
        assert_eq!(c.choose_drafts(&[(&[], 0)], 1), vec![0]);
    }

    #[test]
    fn a_batch_sends_its_best_tokens_where_wide_passes_are_cheap() {
        // Eight rows cost 1.5 one-row passes, sixteen 2.7, thirty-two 4 (vector kernels up to
        // 16, tiles from 32): qwen-coder-1.5b's shape on 2 cores.
        let c = PassCost::from_points(&[(1, 1.0), (8, 1.5), (16, 2.7), (32, 4.0), (64, 5.7)]);
        let sure = [0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65];
        let none: [f64; 0] = [];
        // Four sequences copying well, four with nothing to copy.
        let mut batch: Vec<(&[f64], usize)> = vec![(&sure, 0); 4];
        batch.extend([(&none[..], 0); 4]);
        let ks = c.choose_drafts(&batch, 8);
        let rows: usize = ks.iter().sum();
        assert!(rows >= 16, "{ks:?}");
        assert!(ks[4..].iter().all(|&k| k == 0));
        // Each chain is sent from its start: its best tokens first.
        let rate = |ks: &[usize]| {
            let tokens: f64 = 8.0
                + ks[..4]
                    .iter()
                    .map(|&k| sure[..k].iter().sum::<f64>())
                    .sum::<f64>();
            tokens / c.seconds(8 + ks.iter().sum::<usize>())
        };
        assert!(rate(&ks) > rate(&[0; 8]) && rate(&ks) >= rate(&[1, 1, 1, 1, 0, 0, 0, 0]));
        // The per-row price of this batch (from 8 rows to 16) sends a draft only where a token
        // lands 88 times in 100 or more.
        let price = c.price(8);
        assert!(price > 0.6, "{price}");
        // Weak chains everywhere: nothing pays.
        let weak = [0.3, 0.1];
        assert_eq!(c.choose_drafts(&[(&weak[..], 0); 8], 8), vec![0; 8]);
    }

    #[test]
    fn long_contexts_make_their_rows_dearer() {
        let context = ContextCost {
            shared: 0.0,
            per_row: 1e-4,
        };
        let c = PassCost::linear(0.2).with_context(context);
        let p = [0.7, 0.6];
        let ks = c.choose_drafts(&[(&p, 100), (&p, 20_000)], 2);
        assert!(ks[0] >= ks[1], "{ks:?}");
        assert_eq!(ks[1], 0, "{ks:?}");
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
