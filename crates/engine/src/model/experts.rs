//! A layer's mixture of experts (Qwen3-MoE, Mixtral): the router scores every expert for each
//! row, each row runs its `used` best, and their outputs are added with the router's weights.
//!
//! The rows of a pass that chose an expert are gathered into one block and go through that
//! expert's gate, up and down products together, with the same kernels as a dense layer; an
//! expert no row chose is not read. Each product's value for a row does not depend on which other
//! rows share it, and a row's expert outputs are added in its own order (best expert first), so a
//! row's result is the same bits whatever else is in the pass: speculative decoding stays
//! bit-identical to plain decoding.

use super::forward::add_bias;
use crate::config::MoeConfig;
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::kernels::{self, Isa, QMatrix};
use crate::weights::{self, Precision};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One expert's feed-forward block: `down(act(gate(x)) * up(x))`, with gpt-oss's biases after
/// each product.
pub(super) struct Expert {
    pub(super) gate: QMatrix,
    pub(super) up: QMatrix,
    pub(super) down: QMatrix,
    pub(super) biases: Option<ExpertBiases>,
}

impl Expert {
    fn bytes(&self) -> usize {
        [&self.gate, &self.up, &self.down]
            .iter()
            .map(|m| m.bytes.as_slice().len())
            .sum()
    }
}

/// An expert's biases (gpt-oss: `ffn_{gate,up,down}_exps.bias`, one row per expert).
pub(super) struct ExpertBiases {
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

pub(super) struct Mixture {
    /// What the latest pass read: experts run, and their matrices' bytes (for `bench forward`).
    pub(super) last_read: (AtomicUsize, AtomicUsize),
    /// `count x d_model`: a score per expert (`ffn_gate_inp`).
    pub(super) router: QMatrix,
    /// Added to the scores (gpt-oss: `ffn_gate_inp.bias`).
    pub(super) router_bias: Option<Vec<f32>>,
    pub(super) experts: Vec<Expert>,
    pub(super) moe: MoeConfig,
}

/// The gate's activation applied in place over one row (`kernels::swiglu` or `geglu`).
pub(super) type ActivationFn = fn(&mut [f32], &[f32]);

impl Mixture {
    /// Layer `layer`'s router and experts (llama.cpp's names: `ffn_gate_inp`, and the 3-D
    /// `ffn_{gate,up,down}_exps`, one slice per expert, or in Mixtral files converted before
    /// llama.cpp merged them, one 2-D `ffn_{gate,up,down}.<e>.weight` per expert).
    pub(super) fn load(
        file: &GgufFile,
        layer: usize,
        d_model: usize,
        moe: MoeConfig,
        precision: Precision,
        isa: Isa,
    ) -> Result<Self> {
        let p = |s: &str| format!("blk.{layer}.{s}");
        let (d, ff, count) = (d_model, moe.d_ff, moe.count);
        let router =
            weights::product_matrix(file, &p("ffn_gate_inp.weight"), count, d, precision, isa)?;
        let router_bias = weights::optional_vector(file, &p("ffn_gate_inp.bias"), count)?;
        // One bias row per expert, where the file has them (all three or none).
        let bias_rows = |kind: &str, width: usize| -> Result<Option<Vec<Vec<f32>>>> {
            let name = p(&format!("ffn_{kind}_exps.bias"));
            let all = weights::optional_vector(file, &name, count * width)?;
            Ok(all.map(|v| v.chunks(width).map(<[f32]>::to_vec).collect()))
        };
        let biases: Vec<Option<ExpertBiases>> = match (
            bias_rows("gate", ff)?,
            bias_rows("up", ff)?,
            bias_rows("down", d)?,
        ) {
            (Some(g), Some(u), Some(dn)) => g
                .into_iter()
                .zip(u)
                .zip(dn)
                .map(|((gate, up), down)| Some(ExpertBiases { gate, up, down }))
                .collect(),
            (None, None, None) => (0..count).map(|_| None).collect(),
            _ => {
                return Err(crate::error::EngineError::BadMetadata(format!(
                    "layer {layer}: the experts' gate, up and down biases must come together"
                )))
            }
        };
        let one_per_expert = !file.has_tensor(&p("ffn_gate_exps.weight"))
            && file.has_tensor(&p("ffn_gate.0.weight"));
        let exps = |kind: &str, (rows, cols): (usize, usize)| -> Result<Vec<QMatrix>> {
            if one_per_expert {
                (0..count)
                    .map(|e| {
                        let name = p(&format!("ffn_{kind}.{e}.weight"));
                        weights::product_matrix(file, &name, rows, cols, precision, isa)
                    })
                    .collect()
            } else {
                let name = p(&format!("ffn_{kind}_exps.weight"));
                weights::expert_matrices(file, &name, count, (rows, cols), precision, isa)
            }
        };
        let gate = exps("gate", (ff, d))?;
        let up = exps("up", (ff, d))?;
        let down = exps("down", (d, ff))?;
        let experts = gate
            .into_iter()
            .zip(up)
            .zip(down)
            .zip(biases)
            .map(|(((gate, up), down), biases)| Expert {
                gate,
                up,
                down,
                biases,
            })
            .collect();
        Ok(Mixture {
            last_read: Default::default(),
            router,
            router_bias,
            experts,
            moe,
        })
    }

    /// The block's output for the `n` normalized rows `h` (`n x d_model`) into `out` (the same
    /// shape): for each row, the sum over its chosen experts, best first, of weight times output.
    pub(super) fn forward(&self, h: &[f32], n: usize, activation: ActivationFn, out: &mut [f32]) {
        let (d, ff, k) = (self.router.cols, self.moe.d_ff, self.moe.used);
        let mut scores = vec![0f32; n * self.moe.count];
        kernels::matmul(h, n, &self.router, &mut scores);
        add_bias(&mut scores, self.router_bias.as_deref());
        let mut routes = Vec::with_capacity(n * k);
        let mut order = Vec::new();
        for s in scores.chunks(self.moe.count) {
            route(s, k, self.moe.renormalize, &mut order, &mut routes);
        }
        // Each expert's rows, in row order: (row, the expert's place in the row's choice).
        let mut members: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.experts.len()];
        for (i, &(e, _)) in routes.iter().enumerate() {
            members[e].push((i / k, i % k));
        }
        let read = self
            .experts
            .iter()
            .zip(&members)
            .filter(|(_, m)| !m.is_empty());
        let (count, bytes) = read.fold((0, 0), |(n, b), (e, _)| (n + 1, b + e.bytes()));
        self.last_read.0.store(count, Ordering::Relaxed);
        self.last_read.1.store(bytes, Ordering::Relaxed);
        // Every row's expert outputs, in the row's order of choice.
        let mut outputs = vec![0f32; n * k * d];
        let (mut x, mut gate, mut up, mut y) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (expert, rows) in self.experts.iter().zip(&members) {
            if rows.is_empty() {
                continue;
            }
            let m = rows.len();
            x.clear();
            for &(r, _) in rows {
                x.extend_from_slice(&h[r * d..(r + 1) * d]);
            }
            gate.resize(m * ff, 0f32);
            up.resize(m * ff, 0f32);
            y.resize(m * d, 0f32);
            kernels::matmul_many(
                &x,
                m,
                &mut [(&expert.gate, &mut gate), (&expert.up, &mut up)],
            );
            let biases = expert.biases.as_ref();
            add_bias(&mut gate, biases.map(|b| &b.gate[..]));
            add_bias(&mut up, biases.map(|b| &b.up[..]));
            for (g, u) in gate.chunks_mut(ff).zip(up.chunks(ff)) {
                activation(g, u);
            }
            kernels::matmul(&gate, m, &expert.down, &mut y);
            add_bias(&mut y, biases.map(|b| &b.down[..]));
            for (&(r, slot), yr) in rows.iter().zip(y.chunks(d)) {
                outputs[(r * k + slot) * d..][..d].copy_from_slice(yr);
            }
        }
        for ((o, ys), chosen) in out
            .chunks_mut(d)
            .zip(outputs.chunks(k * d))
            .zip(routes.chunks(k))
        {
            o.fill(0.0);
            for (yr, &(_, w)) in ys.chunks(d).zip(chosen) {
                for (a, b) in o.iter_mut().zip(yr) {
                    *a += w * b;
                }
            }
        }
    }

    /// Bytes of weights one token reads on average: the router, and `used` of the experts.
    pub(super) fn bytes_per_token(&self) -> usize {
        self.per_token(|m| m.bytes.as_slice().len())
    }

    /// Multiply-adds of one token: the router's and its `used` experts'.
    pub(super) fn macs_per_token(&self) -> usize {
        self.per_token(|m| m.rows * m.cols)
    }

    /// Bytes of every expert's matrices.
    pub(super) fn expert_bytes(&self) -> usize {
        self.experts.iter().map(Expert::bytes).sum()
    }

    /// (experts run, bytes of their matrices) in the latest pass.
    pub(super) fn last_read(&self) -> (usize, usize) {
        let (n, b) = &self.last_read;
        (n.load(Ordering::Relaxed), b.load(Ordering::Relaxed))
    }

    fn per_token(&self, size: impl Fn(&QMatrix) -> usize) -> usize {
        let all: usize = self
            .experts
            .iter()
            .map(|e| size(&e.gate) + size(&e.up) + size(&e.down))
            .sum();
        size(&self.router) + all * self.moe.used / self.moe.count.max(1)
    }
}

/// One row's choice: the `k` best-scored experts, best first (equal scores: the lower index
/// first), each with its softmax probability over all the experts, divided by the chosen ones'
/// sum when `renormalize`; pushed onto `routes`. Plain f32 arithmetic in a fixed order, so the
/// same scores give the same choice and weights on every machine and in every batch.
fn route(
    scores: &[f32],
    k: usize,
    renormalize: bool,
    order: &mut Vec<usize>,
    routes: &mut Vec<(usize, f32)>,
) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = scores.iter().map(|s| (s - max).exp()).sum();
    order.clear();
    order.extend(0..scores.len());
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let first = routes.len();
    routes.extend(
        order[..k]
            .iter()
            .map(|&e| (e, (scores[e] - max).exp() / sum)),
    );
    if renormalize {
        let chosen = &mut routes[first..];
        let total: f32 = chosen.iter().map(|&(_, w)| w).sum();
        chosen.iter_mut().for_each(|(_, w)| *w /= total);
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn routes_pick_the_best_scores_with_softmax_weights() {
        let scores = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let (mut order, mut routes) = (Vec::new(), Vec::new());
        route(&scores, 3, false, &mut order, &mut routes);
        let ids: Vec<usize> = routes.iter().map(|r| r.0).collect();
        assert_eq!(ids, [1, 3, 4], "best first, ties to the lower index");
        let z: f64 = scores.iter().map(|&s| (s as f64).exp()).sum();
        for &(e, w) in &routes {
            assert!((w as f64 - (scores[e] as f64).exp() / z).abs() < 1e-6);
        }
        routes.clear();
        route(&scores, 2, true, &mut order, &mut routes);
        assert_eq!(routes, [(1, 0.5), (3, 0.5)]);
    }
}
