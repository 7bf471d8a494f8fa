//! The verifier: given the logits of one pass over [last token, d1..dK], decide which drafted tokens
//! to keep and which token the model adds itself, so that the output is exactly what decoding one
//! token at a time would give (token for token under greedy, in distribution under sampling).
//!
//! Sampling uses rejection sampling for a point-mass draft: a drafted token d is accepted with
//! probability p(d); on rejection the token is drawn from p with d removed and renormalized. With
//! q = delta(d) this is the standard speculative sampling rule min(1, p/q) and residual
//! (p - q)+ / |p - q|+, so every emitted token is distributed exactly as p.

use crate::sampling::{greedy, Distribution, SamplingParams};
use rand::Rng;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// How many drafted tokens were kept (a prefix of the draft).
    pub accepted: usize,
    /// The kept drafts followed by the model's own token: 1..=K+1 tokens.
    pub tokens: Vec<u32>,
}

/// `rows` holds K+1 rows of `vocab` logits: row i predicts the token after the i-th input of the
/// pass. `context` is every token before the pass's first input, that input included (used for
/// the repetition penalty).
pub fn verify(
    rows: &[f32],
    vocab: usize,
    draft: &[u32],
    context: &[u32],
    params: &SamplingParams,
    rng: &mut impl Rng,
) -> Verdict {
    assert_eq!(rows.len(), (draft.len() + 1) * vocab, "one row per input");
    let needs_context = params.repetition_penalty != 1.0;
    let mut prefix: Vec<u32> = if needs_context {
        context.to_vec()
    } else {
        Vec::new()
    };
    let mut tokens = Vec::with_capacity(draft.len() + 1);
    for (i, row) in rows.chunks_exact(vocab).enumerate() {
        let drafted = draft.get(i).copied();
        let chosen = if params.is_greedy() {
            let best = greedy(row, &prefix, params);
            if drafted == Some(best) {
                None
            } else {
                Some(best)
            }
        } else {
            let dist = Distribution::new(row, &prefix, params);
            match drafted {
                Some(d) if rng.random::<f32>() < dist.prob(d) => None,
                Some(d) => Some(dist.sample_excluding(Some(d), rng)),
                None => Some(dist.sample(rng)),
            }
        };
        match chosen {
            None => {
                let d = drafted.expect("acceptance needs a draft");
                tokens.push(d);
                if needs_context {
                    prefix.push(d);
                }
            }
            Some(t) => {
                tokens.push(t);
                return Verdict {
                    accepted: i,
                    tokens,
                };
            }
        }
    }
    unreachable!("the last row always yields a token")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn one_hot(vocab: usize, hot: &[usize]) -> Vec<f32> {
        hot.iter()
            .flat_map(|&h| (0..vocab).map(move |i| if i == h { 5.0 } else { 0.0 }))
            .collect()
    }

    #[test]
    fn greedy_keeps_the_agreeing_prefix_and_adds_one() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let p = SamplingParams::default();
        // Model says 3, 1, 2, 0 after each input.
        let rows = one_hot(4, &[3, 1, 2, 0]);
        let v = verify(&rows, 4, &[3, 1, 1], &[0], &p, &mut rng);
        assert_eq!(
            v,
            Verdict {
                accepted: 2,
                tokens: vec![3, 1, 2]
            }
        );
        let v = verify(&rows, 4, &[3, 1, 2], &[0], &p, &mut rng);
        assert_eq!(
            v,
            Verdict {
                accepted: 3,
                tokens: vec![3, 1, 2, 0]
            }
        );
        let v = verify(&rows, 4, &[0, 1, 2], &[0], &p, &mut rng);
        assert_eq!(
            v,
            Verdict {
                accepted: 0,
                tokens: vec![3]
            }
        );
        let v = verify(&rows[..4], 4, &[], &[0], &p, &mut rng);
        assert_eq!(
            v,
            Verdict {
                accepted: 0,
                tokens: vec![3]
            }
        );
    }

    #[test]
    fn penalty_sees_accepted_drafts() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let p = SamplingParams {
            repetition_penalty: 10.0,
            ..Default::default()
        };
        // Both rows prefer 1 slightly over 2; once 1 has been accepted it is penalized.
        let rows = vec![0.0, 2.0, 1.9, 0.0, 2.0, 1.9];
        let v = verify(&rows, 3, &[1], &[0], &p, &mut rng);
        assert_eq!(v.tokens, vec![1, 2]);
    }
}
