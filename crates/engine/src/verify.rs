//! The verifier: given the logits of one pass over [last token, d1..dK], decide which drafted tokens
//! to keep and which token the model adds itself, so that the output is exactly what decoding one
//! token at a time would give (token for token under greedy, in distribution under sampling).
//!
//! Sampling uses rejection sampling for a point-mass draft: a drafted token d is accepted with
//! probability p(d); on rejection the token is drawn from p with d removed and renormalized. With
//! q = delta(d) this is the standard speculative sampling rule min(1, p/q) and residual
//! (p - q)+ / |p - q|+, so every emitted token is distributed exactly as p.

pub(crate) mod constrained;

use crate::sampling::{greedy, Distribution, SamplingParams};
use drafting::{pass_row, DraftTree, ROOT};
use rand::Rng;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The kept drafts followed by the model's own token: 1..=depth+1 tokens.
    pub tokens: Vec<u32>,
    /// The tree nodes of the kept drafts, root's child first (for a chain: 0, 1, ...).
    pub path: Vec<usize>,
}

impl Verdict {
    /// How many drafted tokens were kept (the length of the accepted path).
    pub fn accepted(&self) -> usize {
        self.path.len()
    }
}

/// `rows` holds K+1 rows of `vocab` logits: row i predicts the token after the i-th input of the
/// pass. `context` is every token before the pass's first input, that input included (used for
/// the repetition penalty). The chain `draft` is verified as a tree of one branch.
pub fn verify(
    rows: &[f32],
    vocab: usize,
    draft: &[u32],
    context: &[u32],
    params: &SamplingParams,
    rng: &mut impl Rng,
) -> Verdict {
    let tree = DraftTree::chain(draft, drafting::Source::Ngram);
    verify_tree(rows, vocab, &tree, context, params, rng)
}

/// Verifies a draft tree: `rows` holds one row of logits for the last committed token, then one
/// per node in tree order. From the root, the walk goes to the child the model agrees with and
/// stops where none does, adding the model's own token there.
///
/// Greedy follows the child equal to the model's choice. Sampling tries the children in order,
/// each as a point-mass draft: child `c` is accepted with probability `p(c)`, renormalized over
/// what the earlier rejected siblings left; after the last rejection the token is drawn from `p`
/// with every rejected child removed. Each child is then emitted with probability exactly `p(c)`
/// and every other token with `p(t)`, so the output is distributed as plain sampling's.
pub fn verify_tree(
    rows: &[f32],
    vocab: usize,
    tree: &DraftTree,
    context: &[u32],
    params: &SamplingParams,
    rng: &mut impl Rng,
) -> Verdict {
    assert_eq!(rows.len(), (tree.len() + 1) * vocab, "one row per input");
    let needs_context = params.repetition_penalty != 1.0;
    let mut prefix: Vec<u32> = if needs_context {
        context.to_vec()
    } else {
        Vec::new()
    };
    let mut tokens = Vec::new();
    let mut path = Vec::new();
    let mut at = ROOT;
    let mut rejected = Vec::new();
    loop {
        let r = pass_row(at);
        let row = &rows[r * vocab..(r + 1) * vocab];
        let next = if params.is_greedy() {
            let best = greedy(row, &prefix, params);
            tree.child(at, best).ok_or(best)
        } else {
            let dist = Distribution::new(row, &prefix, params);
            rejected.clear();
            let mut left = 1.0f64;
            let mut chosen = None;
            for c in tree.children(at) {
                let token = tree.tokens()[c];
                let p = dist.prob(token) as f64;
                if left > 0.0 && rng.random::<f64>() * left < p {
                    chosen = Some(c);
                    break;
                }
                rejected.push(token);
                left -= p;
            }
            chosen.ok_or_else(|| dist.sample_excluding(&rejected, rng))
        };
        match next {
            Ok(child) => {
                let t = tree.tokens()[child];
                tokens.push(t);
                path.push(child);
                if needs_context {
                    prefix.push(t);
                }
                at = child as u32;
            }
            Err(own) => {
                tokens.push(own);
                return Verdict { tokens, path };
            }
        }
    }
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
                tokens: vec![3, 1, 2],
                path: vec![0, 1],
            }
        );
        let v = verify(&rows, 4, &[3, 1, 2], &[0], &p, &mut rng);
        assert_eq!(
            v,
            Verdict {
                tokens: vec![3, 1, 2, 0],
                path: vec![0, 1, 2],
            }
        );
        let v = verify(&rows, 4, &[0, 1, 2], &[0], &p, &mut rng);
        assert_eq!(
            v,
            Verdict {
                tokens: vec![3],
                path: vec![],
            }
        );
        let v = verify(&rows[..4], 4, &[], &[0], &p, &mut rng);
        assert_eq!(
            v,
            Verdict {
                tokens: vec![3],
                path: vec![],
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

    #[test]
    fn greedy_walks_the_branch_the_model_agrees_with() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let p = SamplingParams::default();
        // Root's children 1 and 2; below 2: 3 and 0; below 3: 1.
        let mut tree = DraftTree::new();
        tree.insert_path(ROOT, &[1], drafting::Source::Ngram, 63);
        tree.insert_path(ROOT, &[2, 3, 1], drafting::Source::Model, 63);
        tree.insert_path(ROOT, &[2, 0], drafting::Source::Model, 63);
        // Nodes: 0 = 1, 1 = 2, 2 = 3 (under 1), 3 = 1 (under 2), 4 = 0 (under 1).
        // Model after each input: root -> 2, node0 -> 0, node1 -> 3, node2 -> 2, node3 -> 3,
        // node4 -> 1.
        let rows = one_hot(4, &[2, 0, 3, 2, 3, 1]);
        let v = verify_tree(&rows, 4, &tree, &[0], &p, &mut rng);
        // root -> 2 (node 1) -> 3 (node 2) -> the model says 2, which node 2 lacks: emitted.
        assert_eq!(v.tokens, vec![2, 3, 2]);
        assert_eq!(v.path, vec![1, 2]);
        assert_eq!(v.accepted(), 2);
        // A different model agreeing with the deeper branch through 0.
        let rows = one_hot(4, &[2, 0, 0, 2, 3, 1]);
        let v = verify_tree(&rows, 4, &tree, &[0], &p, &mut rng);
        assert_eq!((v.tokens, v.path), (vec![2, 0, 1], vec![1, 4]));
    }
}
