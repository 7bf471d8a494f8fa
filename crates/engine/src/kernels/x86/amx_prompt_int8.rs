//! The products of prompt rows on AMX int8 tiles in the rotated int8 arithmetic
//! (`kernels::rotated`, whose plain definition this gives bit for bit).
//!
//! - Activations: each row's blocks of 256 columns rotated in registers (`rotate_block`: the
//!   signs, then the butterflies in the same stages as `rotated::rotate`), rounded to int8 by
//!   the row's one scale and laid out in tile order (`to_tiles`).
//! - Weights: the matrix's `RotatedInt8` copy, already in the tiles' order: the products read
//!   their B tiles straight from it.
//! - Sums: exact 32-bit integers over every column; between blocks of columns they wait in the
//!   output and are loaded again; after the last block a tile of rows' sums goes to a small
//!   buffer, and from there (`finish`) each becomes `sum * (row scale * weight scale)` in the
//!   output.

use super::amx::{load_config, release, Config};
use super::tile_steps::{load2, step1, step2, sums_in, sums_out, Sums};
use crate::kernels::packed::ROWS;
use crate::kernels::rotated::{row_scale, Line, RotatedInt8, BLOCK, SIGNS, STEP, STRIP};
use std::arch::x86_64::*;

/// Bytes of activation tiles a block of columns keeps in L2 across the strips of a work item.
const ACT_BLOCK_BYTES: usize = 3 << 19;

/// Every tile here is sixteen rows of 64 bytes: tmm0-3 sums, tmm4-5 activations, tmm6-7
/// weights.
static TILES: Config = Config::new(64);

/// The lane a butterfly of distance `h` (1, 2, 4 or 8) pairs each lane with, and the sign its
/// own number takes (+1 where bit `h` of the lane is clear, -1 where set).
const fn pair_of(h: usize) -> ([i32; 16], [f32; 16]) {
    let mut idx = [0i32; 16];
    let mut sgn = [0f32; 16];
    let mut l = 0;
    while l < 16 {
        idx[l] = (l ^ h) as i32;
        sgn[l] = if l & h == 0 { 1.0 } else { -1.0 };
        l += 1;
    }
    (idx, sgn)
}

const PAIRS: [([i32; 16], [f32; 16]); 4] = [pair_of(1), pair_of(2), pair_of(4), pair_of(8)];

/// A row of `k` numbers (a multiple of 256) at `src` rotated into `dst`, block by block (in
/// place where `dst` is `src`: `rotate_block` loads a whole block before it stores); returns
/// `row_scale` of its largest magnitude, the inverse step (zero where every int8 is zero) and
/// the scale.
///
/// # Safety
/// The CPU has AVX-512 F; `src` and `dst` hold `k` floats.
#[inline(always)]
unsafe fn rotate_row(src: *const f32, dst: *mut f32, k: usize) -> (f32, f32) {
    let mut top = _mm512_setzero_ps();
    for b in (0..k).step_by(BLOCK) {
        top = _mm512_max_ps(top, rotate_block(src.add(b), dst.add(b)));
    }
    row_scale(_mm512_reduce_max_ps(top))
}

/// Sixteen numbers (a row's times its inverse step: within -127.5..127.5 but for NaNs) rounded
/// to the nearest integer, ties to even, as int8s; a NaN to zero, as `quantize_row`'s `as i8`.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn to_int8(v: __m512) -> __m128i {
    let numbers = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v);
    _mm512_cvtsepi32_epi8(_mm512_maskz_cvtps_epi32(numbers, v))
}

/// One block of 256 numbers at `src` rotated (`rotated::rotate`) into `dst`; returns the lanes'
/// largest magnitudes.
///
/// # Safety
/// The CPU has AVX-512 F; `src` and `dst` hold 256 floats.
#[inline(always)]
unsafe fn rotate_block(src: *const f32, dst: *mut f32) -> __m512 {
    let mut v = [_mm512_setzero_ps(); 16];
    for (i, r) in v.iter_mut().enumerate() {
        let s = _mm512_loadu_ps(SIGNS.as_ptr().add(16 * i));
        *r = _mm512_mul_ps(_mm512_loadu_ps(src.add(16 * i)), s);
    }
    for (idx, sgn) in &PAIRS {
        let idx = _mm512_loadu_si512(idx.as_ptr() as *const _);
        let sgn = _mm512_loadu_ps(sgn.as_ptr());
        for r in v.iter_mut() {
            // Lane j with bit h clear: x[j] + x[j + h]; set: x[j - h] - x[j], one rounding.
            *r = _mm512_fmadd_ps(sgn, *r, _mm512_permutexvar_ps(idx, *r));
        }
    }
    for d in [1, 2, 4, 8] {
        for i in 0..16 {
            if i & d == 0 {
                let (a, b) = (v[i], v[i + d]);
                v[i] = _mm512_add_ps(a, b);
                v[i + d] = _mm512_sub_ps(a, b);
            }
        }
    }
    let mut top = _mm512_setzero_ps();
    for (i, r) in v.iter().enumerate() {
        _mm512_storeu_ps(dst.add(16 * i), *r);
        // A NaN lane leaves `top` as it was, as `f32::max` in `quantize_row` does.
        top = _mm512_max_ps(_mm512_abs_ps(*r), top);
    }
    top
}

/// Activation rows `r0..r0 + 16` of `x` (`k` columns, a multiple of 256; rows past `m` zero)
/// rotated and rounded to int8 into their tile of rows `out` (`k / 64` tiles of 16 lines: line
/// `c * 16 + r % 16` holds row `r`'s columns `64c..64c + 64`); `scales[i]` gets row `r0 + i`'s
/// scale (zero past `m`). `buf` is scratch.
///
/// # Safety
/// The CPU has AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn to_tiles(
    x: &[f32],
    (m, k): (usize, usize),
    r0: usize,
    out: &mut [Line],
    scales: &mut [f32],
    buf: &mut Vec<f32>,
) {
    let steps = k / STEP;
    assert!(out.len() == steps * ROWS && x.len() >= m * k && scales.len() == ROWS);
    assert!(k.is_multiple_of(BLOCK) && r0 < m.next_multiple_of(ROWS));
    buf.resize(k, 0.0);
    for (i, scale) in scales.iter_mut().enumerate() {
        let r = r0 + i;
        let mut inv = 0.0;
        *scale = 0.0;
        if r < m {
            (inv, *scale) = rotate_row(x.as_ptr().add(r * k), buf.as_mut_ptr(), k);
        }
        if inv == 0.0 {
            out.iter_mut()
                .skip(i)
                .step_by(ROWS)
                .for_each(|l| *l = Line::default());
            continue;
        }
        let inv = _mm512_set1_ps(inv);
        for c in 0..steps {
            let line = out.as_mut_ptr().add(c * ROWS + i) as *mut u8;
            for q in 0..4 {
                let v = _mm512_mul_ps(_mm512_loadu_ps(buf.as_ptr().add(STEP * c + 16 * q)), inv);
                let b = to_int8(v);
                _mm_storeu_si128(line.add(16 * q) as *mut __m128i, b);
            }
        }
    }
}

/// `v` (a multiple of 256 long) rotated in place and rounded to int8 into `q` by one scale,
/// which it returns: `rotated::plain_round`'s bits (the same steps as `to_tiles`), for the
/// weights' copy.
///
/// # Safety
/// The CPU has AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn round_row(v: &mut [f32], q: &mut [i8]) -> f32 {
    let k = v.len();
    assert!(k.is_multiple_of(BLOCK) && q.len() == k);
    let at = v.as_mut_ptr();
    let (inv, scale) = rotate_row(at, at, k);
    if inv == 0.0 {
        // Zeros, or a number that is not finite: every int8 zero, as `quantize_row` gives.
        q.fill(0);
        return scale;
    }
    let inv = _mm512_set1_ps(inv);
    for i in (0..k).step_by(16) {
        let b = to_int8(_mm512_mul_ps(_mm512_loadu_ps(at.add(i)), inv));
        _mm_storeu_si128(q.as_mut_ptr().add(i) as *mut __m128i, b);
    }
    scale
}

/// Weight rows `32 s0..32 s1` of `w` against activation rows `0..m` (`acts` from `to_tiles`,
/// their scales `act_scales`): row `r`'s result for weight row `32 s0 + j` to `out[r * n + j]`.
/// `tail` is the call's scratch.
///
/// # Safety
/// The CPU has AMX-INT8 (with the tile permission) and AVX-512 F; `s1 <= w.rows / 32`; `acts`
/// holds `m` rows over `w.cols` columns in tile order; `out` is valid for writes of `m * n`
/// floats, `n >= 32 (s1 - s0)`, and columns `0..32 (s1 - s0)` of every row belong to this call
/// alone.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn products(
    w: &RotatedInt8,
    (s0, s1): (usize, usize),
    acts: &[Line],
    (m, act_scales): (usize, &[f32]),
    out: *mut f32,
    n: usize,
    tail: &mut Vec<f32>,
) {
    let steps = w.cols / STEP;
    let tiles = m.div_ceil(ROWS);
    // Steps per block of columns: the block's activation tiles stay in L2 across the strips.
    let block = (ACT_BLOCK_BYTES / (tiles * ROWS * STEP)).clamp(1, steps);
    let partial = !m.is_multiple_of(ROWS);
    // Sums of a part tile wait between blocks in `tail`, not in the output (whose rows past `m`
    // do not exist).
    tail.resize(
        if partial && block < steps {
            (s1 - s0) * ROWS * STRIP
        } else {
            0
        },
        0.0,
    );
    let tail_at = tail.as_mut_ptr();
    let mut fin = [Line::default(); 2 * ROWS * STRIP * 4 / 64];
    load_config(&TILES);
    for c0 in (0..steps).step_by(block) {
        let first = c0 == 0;
        let block_steps = (c0 + block).min(steps) - c0;
        let last = c0 + block_steps == steps;
        // The next strip's B tiles are prefetched into L2 a few lines per step, spread over this
        // strip's steps: its first tile of rows would otherwise wait on memory for every step.
        let pf_lines = block_steps * 2 * ROWS;
        let pf_per = pf_lines.div_ceil(tiles.div_ceil(2) * block_steps);
        for s in s0..s1 {
            let b = w.lines.as_ptr().add((s * steps + c0) * 2 * ROWS);
            // The last strip of the call prefetches nothing (and points at its own tiles).
            let (next, mut pf) = match s + 1 < s1 {
                true => (w.lines.as_ptr().add(((s + 1) * steps + c0) * 2 * ROWS), 0),
                false => (b, pf_lines),
            };
            let sums = |t: usize| Sums::waiting((out, n), tail_at, (s - s0, t), (tiles, partial));
            // On the last block the sums go to `fin`, a tile of rows at a time, and are
            // finished from there into the output: they never wait in the output as integers.
            let fin_at = fin.as_mut_ptr() as *mut f32;
            let to = |t: usize, i: usize| match last {
                true => Sums::packed(fin_at.add(i * ROWS * STRIP)),
                false => sums(t),
            };
            let done = |t: usize, i: usize| {
                if last {
                    let rows = (m - t * ROWS).min(ROWS);
                    let at = out.add(t * ROWS * n + (s - s0) * STRIP);
                    let acts = &act_scales[t * ROWS..t * ROWS + rows];
                    finish(
                        fin_at.add(i * ROWS * STRIP),
                        at,
                        n,
                        acts,
                        &w.scale[s * STRIP..][..STRIP],
                    );
                }
            };
            let mut t = 0;
            while t < tiles {
                let a0 = acts.as_ptr().add((t * steps + c0) * ROWS);
                sums_in!(first, sums(t), "tmm0", "tmm1");
                if t + 1 < tiles {
                    sums_in!(first, sums(t + 1), "tmm2", "tmm3");
                    let a1 = a0.add(steps * ROWS);
                    load2!(a0, a1, b);
                    for c in 1..=block_steps {
                        // The step after the last loads the last again (in bounds, unused).
                        let c = c.min(block_steps - 1);
                        step2!(
                            "tdpbssd",
                            a0.add(c * ROWS),
                            a1.add(c * ROWS),
                            b.add(c * 2 * ROWS)
                        );
                        let end = (pf + pf_per).min(pf_lines);
                        while pf < end {
                            _mm_prefetch::<_MM_HINT_T1>(next.add(pf) as *const i8);
                            pf += 1;
                        }
                    }
                    sums_out!(to(t, 0), "tmm0", "tmm1");
                    sums_out!(to(t + 1, 1), "tmm2", "tmm3");
                    done(t, 0);
                    done(t + 1, 1);
                    t += 2;
                } else {
                    for c in 0..block_steps {
                        step1!("tdpbssd", a0.add(c * ROWS), b.add(c * 2 * ROWS));
                    }
                    sums_out!(to(t, 0), "tmm0", "tmm1");
                    done(t, 0);
                    t += 1;
                }
            }
        }
    }
    release();
}

/// One tile of rows' integer sums of a strip, `ROWS x 32` at `sums` (their bits, rows 32 apart),
/// finished into `out` (rows `n` floats apart): row `r`, column `c` becomes
/// `sum * (acts[r] * weights[c])`, for the rows of `acts` (the tile's rows below `m`).
///
/// # Safety
/// The CPU has AVX-512 F; `sums` holds `ROWS * 32` values; `out` is valid for `acts.len()` rows
/// of 32 floats, `n` apart; `weights` holds 32 scales.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn finish(sums: *const f32, out: *mut f32, n: usize, acts: &[f32], weights: &[f32]) {
    let w = [
        _mm512_loadu_ps(weights.as_ptr()),
        _mm512_loadu_ps(weights.as_ptr().add(16)),
    ];
    for (r, &a) in acts.iter().enumerate() {
        let a = _mm512_set1_ps(a);
        for (h, &wh) in w.iter().enumerate() {
            let at = sums.add(r * STRIP + 16 * h);
            let v = _mm512_cvtepi32_ps(_mm512_loadu_si512(at as *const _));
            _mm512_storeu_ps(
                out.add(r * n + 16 * h),
                _mm512_mul_ps(v, _mm512_mul_ps(a, wh)),
            );
        }
    }
}
