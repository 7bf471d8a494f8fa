//! Log-probabilities of generated tokens under the model, and the most likely alternatives.

use serde::Serialize;

/// The ids of the `k` largest logits of `row`, largest first.
pub(crate) fn top_ids(row: &[f32], k: usize) -> Vec<u32> {
    top_logits(row, k).into_iter().map(|(i, _)| i).collect()
}

/// The `k` largest logits of `row` with their ids, largest first.
fn top_logits(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    for (i, &l) in row.iter().enumerate() {
        if best.len() < k || l > best[best.len() - 1].1 {
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (i as u32, l));
            best.truncate(k);
        }
    }
    best
}

/// A generated token's log-probability, and the most likely tokens at its position.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// From the logits row that predicted `token`: a log-softmax over the whole vocabulary.
    pub fn from_logits(logits: &[f32], token: u32, top: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let norm = max + sum.ln() as f32;
        let best = top_logits(logits, top);
        TokenLogprob {
            token,
            logprob: logits[token as usize] - norm,
            top: best.into_iter().map(|(i, l)| (i, l - norm)).collect(),
        }
    }
}
