//! The model's own earlier predictions as a draft source (the idea of Token Recycling).
//!
//! Every row of a verification pass yields logits for the token after that row's input, whether
//! or not the row ends up on the accepted path. The engine hands the top few candidate ids of each
//! row to [`PredictionTable::record`], keyed by the row's input token, so the table holds, for each
//! token seen as an input, what the model most recently thought could follow it. Expanding the
//! table breadth-first from the last token gives a draft tree at no model cost. The table grows
//! only with the distinct tokens actually seen (a few KB for a typical generation).

use std::collections::HashMap;

use crate::spec_config::MAX_TREE_TOP_K;

/// Marks an unused candidate slot.
const EMPTY: u32 = u32::MAX;

/// For each token, the `k` most likely next tokens the model gave the last time it was an input.
#[derive(Clone, Debug)]
pub struct PredictionTable {
    k: usize,
    table: HashMap<u32, [u32; MAX_TREE_TOP_K]>,
}

impl PredictionTable {
    /// A table keeping `k` candidates per token (clamped to 1..=MAX_TREE_TOP_K).
    pub fn new(k: usize) -> Self {
        PredictionTable {
            k: k.clamp(1, MAX_TREE_TOP_K),
            table: HashMap::new(),
        }
    }

    /// Candidates kept per token.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Replaces what follows `token` with `top` (most likely first; at most `k` are kept).
    pub fn record(&mut self, token: u32, top: &[u32]) {
        let mut row = [EMPTY; MAX_TREE_TOP_K];
        for (slot, &t) in row.iter_mut().zip(top.iter().take(self.k)) {
            *slot = t;
        }
        self.table.insert(token, row);
    }

    /// The candidates after `token`, most likely first (empty if it was never an input).
    pub fn get(&self, token: u32) -> &[u32] {
        match self.table.get(&token) {
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
        assert!(t.get(5).is_empty());
        t.record(5, &[1, 2, 3]);
        assert_eq!(t.get(5), [1, 2]);
        t.record(5, &[9]);
        assert_eq!(t.get(5), [9], "a newer row replaces the old one");
        assert_eq!(t.len(), 1);
        assert_eq!(PredictionTable::new(99).k(), MAX_TREE_TOP_K);
    }
}
