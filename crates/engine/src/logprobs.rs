//! Log-probabilities of generated tokens under the model, and the most likely alternatives;
//! `ContentLogprobs` keeps a reply's to the tokens of its content.

use crate::tokenizer::Tokenizer;
use serde::Serialize;
use std::collections::VecDeque;
use std::ops::Range;

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

/// A reply's log-probabilities kept to the tokens of its content. Each token is placed in the
/// reply's text by its bytes (the text is its tokens' bytes, end token aside) and kept when any
/// of them became content, which the reply's reader reports (`tools::ReplyStream::take_content`):
/// so a format's markup (harmony's markers and headers, `<tool_call>` blocks), the model's
/// reasoning and its calls are left out, as the end token is.
#[derive(Default)]
pub struct ContentLogprobs {
    /// Tokens not yet decided: their bytes' range in the reply, and their log-probability.
    waiting: VecDeque<(Range<usize>, TokenLogprob)>,
    /// Where the next token's bytes start.
    end: usize,
    /// The content's ranges reported and not yet passed by every token.
    content: Vec<Range<usize>>,
}

impl ContentLogprobs {
    /// The next tokens' log-probabilities, in order.
    pub fn push(&mut self, logprobs: Vec<TokenLogprob>, tok: &Tokenizer) {
        for lp in logprobs {
            let start = self.end;
            self.end += tok.token_bytes(lp.token).len();
            self.waiting.push_back((start..self.end, lp));
        }
    }

    /// The log-probabilities of the content's tokens among those whose bytes all lie before
    /// `decided`, given the content's ranges reported since the last call. At the end, `decided`
    /// is `usize::MAX`: every token is decided (those past a stop string's cut are not content).
    pub fn take(&mut self, decided: usize, content: Vec<Range<usize>>) -> Vec<TokenLogprob> {
        self.content.extend(content);
        let mut out = Vec::new();
        while self.waiting.front().is_some_and(|(r, _)| r.end <= decided) {
            let (r, lp) = self.waiting.pop_front().expect("checked");
            if self
                .content
                .iter()
                .any(|c| c.start < r.end && r.start < c.end)
            {
                out.push(lp);
            }
            let next = self.waiting.front().map_or(r.end, |(n, _)| n.start);
            self.content.retain(|c| c.end > next);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(token: u32) -> TokenLogprob {
        TokenLogprob {
            token,
            logprob: -1.0,
            top: Vec::new(),
        }
    }

    #[test]
    fn only_the_contents_tokens_are_kept() {
        // Tokens of 3, 2 and 4 bytes: 0..3, 3..5, 5..9.
        let mut c = ContentLogprobs::default();
        let lens = [3usize, 2, 4];
        c.waiting = lens
            .iter()
            .scan(0, |at, &n| {
                *at += n;
                Some(*at - n..*at)
            })
            .zip([lp(1), lp(2), lp(3)])
            .collect();
        c.end = 9;
        // Only the second token's bytes are content, and only the first two are decided.
        assert_eq!(c.take(5, vec![Range { start: 3, end: 5 }]), vec![lp(2)]);
        assert_eq!(c.take(5, vec![]), vec![]);
        // A token partly content is kept.
        let past_the_end = Range { start: 8, end: 12 };
        assert_eq!(c.take(usize::MAX, vec![past_the_end]), vec![lp(3)]);
    }
}
