//! The model's own earlier predictions as a draft source (the idea of Token Recycling).
//!
//! Every row of a verification pass yields logits for the token after that row's input, whether
//! or not the row ends up on the accepted path. The engine hands the top few candidate ids of each
//! row to [`PredictionTable::record`], keyed by the row's input token and by the pair of it and the
//! token before it, so the table holds, for each token (and pair) seen as an input, what the model
//! most recently thought could follow. A lookup prefers the pair, which pins the context down
//! much better than one token, and falls back to the token alone. Expanding the table
//! breadth-first from the last token gives a draft tree at no model cost. The table grows only
//! with the distinct tokens and pairs actually seen (a few KB for a typical generation).

use std::collections::HashMap;

use crate::spec_config::MAX_TREE_TOP_K;

/// Marks an unused candidate slot.
const EMPTY: u32 = u32::MAX;

/// Most token pairs kept (about 40 MB); past it the pairs start over (the single tokens stay).
/// A table shared by a server's tenant lives as long as the server.
const MAX_PAIRS: usize = 1 << 20;

/// For each token, the `k` most likely next tokens the model gave the last time it was an input.
#[derive(Clone, Debug)]
pub struct PredictionTable {
    k: usize,
    table: HashMap<u32, [u32; MAX_TREE_TOP_K]>,
    pairs: HashMap<u64, [u32; MAX_TREE_TOP_K]>,
}

fn pair(prev: u32, token: u32) -> u64 {
    u64::from(prev) << 32 | u64::from(token)
}

impl PredictionTable {
    /// A table keeping `k` candidates per token (clamped to 1..=MAX_TREE_TOP_K).
    pub fn new(k: usize) -> Self {
        PredictionTable {
            k: k.clamp(1, MAX_TREE_TOP_K),
            table: HashMap::new(),
            pairs: HashMap::new(),
        }
    }

    /// Candidates kept per token.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Replaces what follows `token` (preceded by `prev`, where known) with `top` (most likely
    /// first; at most `k` are kept).
    pub fn record(&mut self, prev: Option<u32>, token: u32, top: &[u32]) {
        let mut row = [EMPTY; MAX_TREE_TOP_K];
        for (slot, &t) in row.iter_mut().zip(top.iter().take(self.k)) {
            *slot = t;
        }
        self.table.insert(token, row);
        if let Some(p) = prev {
            if self.pairs.len() >= MAX_PAIRS {
                self.pairs.clear();
            }
            self.pairs.insert(pair(p, token), row);
        }
    }

    /// The candidates after `token` preceded by `prev`, most likely first: those recorded for the
    /// pair, else those for `token` alone (empty if it was never an input).
    pub fn get(&self, prev: Option<u32>, token: u32) -> &[u32] {
        let row = prev
            .and_then(|p| self.pairs.get(&pair(p, token)))
            .or_else(|| self.table.get(&token));
        match row {
            Some(row) => {
                let n = row.iter().take(self.k).take_while(|&&t| t != EMPTY).count();
                &row[..n]
            }
            None => &[],
        }
    }

    /// Tokens with an entry.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_top_k() {
        let mut t = PredictionTable::new(2);
        assert!(t.get(None, 5).is_empty());
        t.record(None, 5, &[1, 2, 3]);
        assert_eq!(t.get(None, 5), [1, 2]);
        t.record(None, 5, &[9]);
        assert_eq!(t.get(Some(4), 5), [9], "a newer row replaces the old one");
        assert_eq!(t.len(), 1);
        // A pair seen before wins over the token alone.
        t.record(Some(7), 5, &[6]);
        t.record(Some(8), 5, &[3]);
        assert_eq!(t.get(Some(7), 5), [6]);
        assert_eq!(t.get(Some(8), 5), [3]);
        assert_eq!(
            t.get(Some(1), 5),
            [3],
            "unknown pair: the token's latest row"
        );
        assert_eq!(PredictionTable::new(99).k(), MAX_TREE_TOP_K);
    }
}
