//! The online softmax of one query over one block of attention's positions (`BlockWeights`),
//! on 256-bit and on 512-bit registers, both computing the same bits.

use super::elementwise::{exp16, exp8};
use super::hsum;
use super::width::{Ymm, Zmm};
use crate::kernels::online_softmax::ATTENTION_BLOCK as BLOCK;
use std::arch::x86_64::*;

/// The largest of the eight lanes.
#[inline(always)]
unsafe fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)))
}

/// One query's online softmax over a block, on a width's registers: turns the `n`
/// (1..=`BLOCK`) scores at `s` into weights e^(score - max) against the running maximum `max`
/// raised to the block's, writes them (and zeros up to `BLOCK`) in place, adds their sum to
/// `sum` and returns the factor by which the weights and outputs of earlier blocks shrink.
/// Every width computes the same bits: the exponential is `exp8`'s operations lane for lane, and
/// the sum runs in eight lanes by position, the lanes then added pairwise (`hsum`).
pub(super) trait BlockWeights {
    /// # Safety
    /// `s` is valid for `BLOCK` floats; called from a function compiled for the width's
    /// instructions and FMA.
    unsafe fn block_weights(s: *mut f32, n: usize, max: &mut f32, sum: &mut f32) -> f32;
}

/// The factor e^(old - new) by which a block whose maximum rose from `old` to `new` shrinks what
/// came before (a first block: `old` is minus infinity, and there is nothing before).
#[inline(always)]
unsafe fn shrink(old: f32, new: f32) -> f32 {
    _mm256_cvtss_f32(exp8(_mm256_set1_ps(old - new)))
}

impl<const EVEX: bool> BlockWeights for Ymm<EVEX> {
    #[inline(always)]
    unsafe fn block_weights(s: *mut f32, n: usize, max: &mut f32, sum: &mut f32) -> f32 {
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let visible = |k: usize| {
            let left = _mm256_set1_epi32(n as i32 - 8 * k as i32);
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(left, lane))
        };
        let below = _mm256_set1_ps(f32::NEG_INFINITY);
        let (whole, vectors) = (n / 8, n.div_ceil(8));
        let mut m = below;
        for k in 0..vectors {
            let x = _mm256_loadu_ps(s.add(8 * k));
            let x = if k < whole {
                x
            } else {
                _mm256_blendv_ps(below, x, visible(k))
            };
            m = _mm256_max_ps(m, x);
        }
        let new_max = (*max).max(hmax(m));
        let rescale = shrink(*max, new_max);
        let vmax = _mm256_set1_ps(new_max);
        let mut vsum = _mm256_setzero_ps();
        for k in 0..vectors {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s.add(8 * k)), vmax));
            let e = if k < whole {
                e
            } else {
                _mm256_and_ps(e, visible(k))
            };
            _mm256_storeu_ps(s.add(8 * k), e);
            vsum = _mm256_add_ps(vsum, e);
        }
        for k in vectors..BLOCK / 8 {
            _mm256_storeu_ps(s.add(8 * k), _mm256_setzero_ps());
        }
        *sum = (*sum).mul_add(rescale, hsum(vsum));
        *max = new_max;
        rescale
    }
}

impl BlockWeights for Zmm {
    #[inline(always)]
    unsafe fn block_weights(s: *mut f32, n: usize, max: &mut f32, sum: &mut f32) -> f32 {
        let visible = |k: usize| -> __mmask16 {
            let left = n - 16 * k;
            if left >= 16 {
                0xFFFF
            } else {
                (1u16 << left) - 1
            }
        };
        let vectors = n.div_ceil(16);
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        for k in 0..vectors {
            m = _mm512_mask_max_ps(m, visible(k), m, _mm512_loadu_ps(s.add(16 * k)));
        }
        let new_max = (*max).max(_mm512_reduce_max_ps(m));
        let rescale = shrink(*max, new_max);
        let vmax = _mm512_set1_ps(new_max);
        let mut vsum = _mm256_setzero_ps();
        for k in 0..vectors {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s.add(16 * k)), vmax));
            let e = _mm512_maskz_mov_ps(visible(k), e);
            _mm512_storeu_ps(s.add(16 * k), e);
            // The two halves in turn: the eight lanes' sums in the order of the positions.
            let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e));
            vsum = _mm256_add_ps(vsum, _mm512_castps512_ps256(e));
            vsum = _mm256_add_ps(vsum, _mm256_castpd_ps(high));
        }
        for k in vectors..BLOCK / 16 {
            _mm512_storeu_ps(s.add(16 * k), _mm512_setzero_ps());
        }
        *sum = (*sum).mul_add(rescale, hsum(vsum));
        *max = new_max;
        rescale
    }
}
