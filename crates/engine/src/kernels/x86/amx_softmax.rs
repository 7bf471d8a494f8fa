//! The online softmax of a tile of sixteen queries over one block of scores, for attention on
//! AMX tiles (`amx_attention`): each query's maximum and sum over the block's positions found
//! for all sixteen at once, by a transposed reduction that leaves query `i`'s result in lane `i`
//! of one register, instead of one horizontal reduction per query. Each lane's additions run in
//! the order of `_mm512_reduce_add_ps` (halves of 256, of 128, then pairs), so a query's sum has
//! the same bits as one reduced alone, whatever the other lanes hold.

// Queries and vectors are indexed by lane.
#![allow(clippy::needless_range_loop)]

use crate::kernels::online_softmax::{ATTENTION_BLOCK, LN2_HI, LN2_LO};
use std::arch::x86_64::*;

/// Positions taken at a time on tiles: four of the vector kernels' blocks, so that each output
/// tile loaded gathers the weighted values of 256 positions before it is stored, and each
/// query's maximum and sum are reduced once for them. Blocks start at multiples of this in the
/// positions a row sees, so a row's result never depends on what shares its pass.
pub(crate) const BLOCK: usize = 4 * ATTENTION_BLOCK;

/// Queries per tile.
const T: usize = 16;

/// The slot a query's vector takes in `reduce16`'s input so that its result lands in its own lane
/// (the reduction leaves slot `s` in lane `4 * (s % 4) + s / 4`; this is its own inverse).
const fn slot(i: usize) -> usize {
    4 * (i % 4) + i / 4
}

/// Reduces sixteen vectors at once: lane `slot(s)` of the result is `op` over the sixteen lanes of
/// `v[s]`, combined as `_mm512_reduce_add_ps` combines them (blocks 0 and 2 with 1 and 3, then
/// the halves, then elements 0 and 2 with 1 and 3).
#[inline(always)]
unsafe fn reduce16(v: &[__m512; T], op: impl Fn(__m512, __m512) -> __m512) -> __m512 {
    // 256-bit halves: pairs of vectors, each result holding two half-reduced vectors.
    let w: [__m512; 8] = std::array::from_fn(|p| {
        let (a, b) = (v[2 * p], v[2 * p + 1]);
        op(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        )
    });
    // 128-bit halves: block k of u[p] holds four lanes of v[4p + k].
    let u: [__m512; 4] = std::array::from_fn(|p| {
        let (a, b) = (w[2 * p], w[2 * p + 1]);
        op(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
        )
    });
    // Elements 0 and 2 with 1 and 3 of each block.
    let z: [__m512; 2] = std::array::from_fn(|p| {
        let (a, b) = (u[2 * p], u[2 * p + 1]);
        op(
            _mm512_shuffle_ps::<0x44>(a, b),
            _mm512_shuffle_ps::<0xEE>(a, b),
        )
    });
    op(
        _mm512_shuffle_ps::<0x88>(z[0], z[1]),
        _mm512_shuffle_ps::<0xDD>(z[0], z[1]),
    )
}

/// Which of the 16 positions from `16 * k` a query seeing `n` positions of the block sees.
#[inline(always)]
fn visible(n: usize, k: usize) -> __mmask16 {
    let left = n.saturating_sub(16 * k);
    if left >= 16 {
        0xFFFF
    } else {
        (1u16 << left) - 1
    }
}

/// e^x for x <= 0 (-inf included) in eleven operations, accurate to about a unit in the last
/// place: x clamped to -87 (below which e^x is zero for the weights' bf16), n = x log2(e)
/// rounded, r = x - n ln 2 in two parts, e^r by its Taylor polynomial of degree 6 (|r| <= 0.35:
/// error below 2e-7 of the result), times 2^n by `vscalefps`. `tiles_plain` in the kernel tests
/// spells the same steps.
#[inline(always)]
pub(super) unsafe fn exp_tile(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in [120.0f32, 24.0, 6.0, 2.0, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / c));
    }
    _mm512_scalef_ps(p, n)
}

/// The 32 numbers of `a` then `b` rounded to bf16 (to the nearest), to `to`.
#[inline(always)]
pub(super) unsafe fn store_bf16(a: __m512, b: __m512, to: *mut u16) {
    let pair: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
    _mm512_storeu_si512(to as *mut _, pair);
}

/// One tile's online softmax over a block: query `i` (at most 16) sees the first `seen[i]`
/// positions of its scores (already scaled) at `scores + i * BLOCK`, of which the first `reach`
/// (a multiple of 32, at least every `seen[i]`) are read and written. Each seeing query's
/// running maximum (`max[i]`) is raised to its scores', its weights e^(score - max) (the rest zero)
/// written in bf16 to `weights + i * BLOCK`, their sum (in f32, before rounding) added to its
/// running sum (`sum[i]`, earlier blocks' shrunk by the factor), and the factor by which its
/// earlier weights and outputs shrink written to `rescale[i]`. A query that sees nothing gets
/// zero weights and keeps its maximum, sum and factor.
///
/// # Safety
/// AVX-512 F and AVX512_BF16; `scores` and `weights` hold `seen.len()` rows of `BLOCK`, `max`,
/// `sum` and `rescale` `seen.len()` floats.
#[inline(always)]
pub(super) unsafe fn tile_weights(
    scores: *const f32,
    weights: *mut u16,
    seen: &[usize],
    reach: usize,
    (max, sum): (*mut f32, *mut f32),
    rescale: &mut [f32],
) {
    let n = seen.len();
    let lanes: __mmask16 = seen
        .iter()
        .enumerate()
        .fold(0, |m, (i, &s)| if s > 0 { m | 1 << i } else { m });
    // A query's scores (scaled with the queries), loaded again in the second pass rather than
    // held: sixteen queries' would take 256 registers.
    let scaled = |i: usize, k: usize| _mm512_loadu_ps(scores.add(i * BLOCK + 16 * k));
    // Each query's block maximum.
    let mut m = [_mm512_set1_ps(f32::NEG_INFINITY); T];
    for i in 0..n {
        let v = &mut m[slot(i)];
        for k in 0..reach / 16 {
            *v = _mm512_mask_max_ps(*v, visible(seen[i], k), *v, scaled(i, k));
        }
    }
    let old_max = _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), lanes, max);
    let new_max = _mm512_max_ps(old_max, reduce16(&m, |a, b| _mm512_max_ps(a, b)));
    let factor = exp_tile(_mm512_sub_ps(old_max, new_max));
    _mm512_mask_storeu_ps(max, lanes, new_max);
    let mut new_maxes = [0f32; T];
    let mut factors = [0f32; T];
    _mm512_storeu_ps(new_maxes.as_mut_ptr(), new_max);
    _mm512_storeu_ps(factors.as_mut_ptr(), factor);
    // Each query's weights and their total.
    let mut totals = [_mm512_setzero_ps(); T];
    for i in 0..n {
        let w = weights.add(i * BLOCK);
        if seen[i] == 0 {
            std::ptr::write_bytes(w, 0, reach);
            continue;
        }
        rescale[i] = factors[i];
        let vmax = _mm512_set1_ps(new_maxes[i]);
        let mut x = [_mm512_setzero_ps(); BLOCK / 16];
        let mut total = _mm512_setzero_ps();
        for k in 0..reach / 16 {
            x[k] = _mm512_maskz_mov_ps(
                visible(seen[i], k),
                exp_tile(_mm512_sub_ps(scaled(i, k), vmax)),
            );
            total = _mm512_add_ps(total, x[k]);
        }
        for k in 0..reach / 32 {
            store_bf16(x[2 * k], x[2 * k + 1], w.add(32 * k));
        }
        totals[slot(i)] = total;
    }
    let old_sum = _mm512_mask_loadu_ps(_mm512_setzero_ps(), lanes, sum);
    let block_sum = reduce16(&totals, |a, b| _mm512_add_ps(a, b));
    _mm512_mask_storeu_ps(sum, lanes, _mm512_fmadd_ps(old_sum, factor, block_sum));
}

/// `reduce16` with addition on sixteen vectors given as rows of 16 floats, and each row reduced
/// alone by `_mm512_reduce_add_ps` (for the tests).
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(test)]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn sums_at_once_and_alone(rows: &[[f32; T]; T]) -> ([f32; T], [f32; T]) {
    let mut v = [_mm512_setzero_ps(); T];
    let mut alone = [0f32; T];
    for i in 0..T {
        v[slot(i)] = _mm512_loadu_ps(rows[i].as_ptr());
        alone[i] = _mm512_reduce_add_ps(v[slot(i)]);
    }
    (
        std::mem::transmute::<__m512, [f32; T]>(reduce16(&v, |a, b| _mm512_add_ps(a, b))),
        alone,
    )
}

/// `exp_tile` on sixteen numbers (for the tests).
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(test)]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp_tile_of(x: &[f32; T]) -> [f32; T] {
    std::mem::transmute::<__m512, [f32; T]>(exp_tile(_mm512_loadu_ps(x.as_ptr())))
}
