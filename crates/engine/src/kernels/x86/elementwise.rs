//! The float loops around the products: dot product, and softmax and SwiGLU with a vectorized
//! exponential.

use super::hsum;
use crate::kernels::online_softmax::{LN2_HI, LN2_LO};
use std::arch::x86_64::*;

/// # Safety
/// The CPU must have AVX2 and FMA; `a` and `b` have the same length.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
        acc1 = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i + 8)),
            _mm256_loadu_ps(pb.add(i + 8)),
            acc1,
        );
        i += 16;
    }
    if i + 8 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(acc0, acc1));
    while i < n {
        s += a[i] * b[i];
        i += 1;
    }
    s
}

/// e^x for eight floats: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor series to degree
/// 7 (truncation below 1e-8 relative), times 2^n. Inputs are clamped to [-87, 88], where 2^n is a
/// normal float; below that the result is about 1.6e-38 instead of smaller.
#[inline(always)]
pub(super) unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
        _mm256_set1_ps(88.0),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // ln 2 in two parts, so that n * LN2_HI is exact.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    for c in [720.0f32, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / c));
    }
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(p, _mm256_castsi256_ps(scale))
}

/// `exp8` on sixteen floats: the same operations, lane for lane, so the same bits.
#[inline(always)]
pub(super) unsafe fn exp16(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.0)),
        _mm512_set1_ps(88.0),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(1.0 / 5040.0);
    for c in [720.0f32, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / c));
    }
    let scale = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    _mm512_mul_ps(p, _mm512_castsi512_ps(scale))
}

/// `kernels::softmax` with `exp8`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn softmax_avx2(x: &mut [f32]) {
    let n = x.len();
    let p = x.as_mut_ptr();
    // The maximum, in four independent lanes of vectors (the order does not change a maximum).
    let mut m = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, m) in m.iter_mut().enumerate() {
            *m = _mm256_max_ps(*m, _mm256_loadu_ps(p.add(i + 8 * j)));
        }
        i += 32;
    }
    let m = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m);
    let max = lanes
        .iter()
        .chain(&x[i..])
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    let vmax = _mm256_set1_ps(max);
    let mut vsum = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vmax));
        _mm256_storeu_ps(p.add(i), e);
        vsum = _mm256_add_ps(vsum, e);
        i += 8;
    }
    let mut sum = hsum(vsum);
    if i < n {
        let mut tail = [f32::NEG_INFINITY; 8];
        tail[..n - i].copy_from_slice(&x[i..]);
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), vmax));
        _mm256_storeu_ps(tail.as_mut_ptr(), e);
        for (j, v) in tail[..n - i].iter().enumerate() {
            x[i + j] = *v;
            sum += v;
        }
    }
    let inv = _mm256_set1_ps(1.0 / sum);
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv));
        i += 8;
    }
    for v in &mut x[i..] {
        *v *= 1.0 / sum;
    }
}

/// `kernels::swiglu` with `exp8`: `gate = gate / (1 + e^-gate) * up`, over the whole multiples of
/// eight at the start; returns how many it did (the caller does the rest).
///
/// # Safety
/// The CPU must have AVX2 and FMA; `up.len() >= gate.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) -> usize {
    let n = gate.len();
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_loadu_ps(g.add(i));
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.add(i))));
        i += 8;
    }
    i
}
