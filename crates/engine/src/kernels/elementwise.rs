//! The small float loops of the decoder layer (dot product, RMSNorm, softmax, SwiGLU, GeGLU), each
//! with its plain version.

use super::online_softmax::exp_lane;
#[cfg(target_arch = "x86_64")]
use super::{isa::has_avx2, x86};

/// Dot product of two f32 slices. Every call on a machine takes the same path (AVX2 with FMA when
/// the CPU has it), so results never depend on the caller.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2 and FMA (`has_avx2`); the lengths are equal.
        return unsafe { x86::dot_f32(a, b) };
    }
    dot_scalar(a, b)
}

/// The plain version of `dot`, eight independent accumulators.
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = 0f32;
    for t in chunks * 8..a.len() {
        s += a[t] * b[t];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + s
}

/// `y += alpha * x`
pub fn axpy_scalar(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// RMSNorm of `x` scaled by `weight`, into `out`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ss = dot(x, x) / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    for ((o, xi), wi) in out.iter_mut().zip(x).zip(weight) {
        *o = xi * scale * wi;
    }
}

/// In-place softmax (a vectorized exponential where the CPU has AVX2; both within a few units in
/// the last place of `f32::exp`).
pub fn softmax(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2 and FMA (`has_avx2`).
        return unsafe { x86::softmax_avx2(x) };
    }
    softmax_scalar(x)
}

/// The plain version of `softmax`.
pub fn softmax_scalar(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `gate = silu(gate) * up`, the SwiGLU activation.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2 and FMA (`has_avx2`); the lengths are equal.
        let done = unsafe { x86::swiglu_avx2(gate, up) };
        return swiglu_lanes(&mut gate[done..], &up[done..]);
    }
    swiglu_lanes(gate, up)
}

/// `swiglu` one number at a time with the vector loop's arithmetic (`exp_lane`, then the same
/// division and product), so that a number gets the same bits whether a vector or this loop
/// takes it: a row's activation does not depend on where the row lies in a batch of rows.
fn swiglu_lanes(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp_lane(-*g)) * u;
    }
}

/// The plain version of `swiglu`.
pub fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// gpt-oss's clamped SwiGLU: `gate = (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g)` with
/// `g = min(gate, 7)` (transformers' `GptOssExperts`, llama.cpp's `swiglu_oai`; the constants are
/// the model's, which its GGUF files do not record). One plain loop, as `geglu`.
pub fn swiglu_oai(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for (g, u) in gate.iter_mut().zip(up) {
        let x = g.min(LIMIT);
        let glu = x / (1.0 + (-ALPHA * x).exp());
        *g = (u.clamp(-LIMIT, LIMIT) + 1.0) * glu;
    }
}

/// `gate = gelu(gate) * up` with GELU's tanh approximation, the GeGLU activation (Gemma). One
/// plain loop: the tanh is a small part of a pass next to the products around it.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        *g = 0.5 * x * (1.0 + inner.tanh()) * u;
    }
}
