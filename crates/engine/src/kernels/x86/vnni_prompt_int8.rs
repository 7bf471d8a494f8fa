//! The products of prompt rows with AVX-512 VNNI in the rotated int8 arithmetic
//! (`kernels::rotated`, whose plain definition this gives bit for bit, as the tiles do).
//!
//! - Activations: rotated and rounded as for the tiles (`amx_prompt_int8::to_tiles`, tile
//!   order), then each byte offset by 128 (`to_unsigned`): `vpdpbusd` multiplies unsigned bytes
//!   by signed ones.
//! - Weights: the matrix's `RotatedInt8` copy. A line of a B tile is what one `vpdpbusd` reads:
//!   four columns of each of sixteen weight rows.
//! - Sums: exact 32-bit integers over every column, in registers for eight activation rows by
//!   a strip's 32 weight rows over a block of 512 columns (whose weights stay in L1 while every
//!   group of rows passes), waiting in memory between blocks; the offset's share (128 times the weight row's sum of int8s) is
//!   taken away, then `sum * (row scale * weight scale)` goes to the output.

use crate::kernels::packed::ROWS;
use crate::kernels::rotated::{Line, RotatedInt8, STEP, STRIP};
use std::arch::x86_64::*;

/// Activation rows whose sums stay in registers together (two 16-lane sums each): half a tile
/// of rows, so that a group's lines are consecutive.
const GROUP: usize = 8;

/// Steps of 64 columns per block: a strip's weights of a block (16 KB) stay in L1 while every
/// group of rows passes over them.
const BLOCK_STEPS: usize = 8;

/// Activation lines from `amx_prompt_int8::to_tiles` turned to the unsigned operand: every
/// byte plus 128 (modulo 256, which maps -127..=127 to 1..=255 and zero to 128).
///
/// # Safety
/// The CPU has AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn to_unsigned(lines: &mut [Line]) {
    let top = _mm512_set1_epi32(0x8080_8080u32 as i32);
    for l in lines {
        let p = l.0.as_mut_ptr() as *mut __m512i;
        _mm512_store_si512(p, _mm512_xor_si512(_mm512_load_si512(p), top));
    }
}

/// Weight rows `32 s0..32 s1` of `w` against activation rows `0..m` (`acts`: `to_tiles` then
/// `to_unsigned`, their scales `act_scales`): row `r`'s result for weight row `32 s0 + j` to
/// `out[r * n + j]`.
///
/// # Safety
/// The CPU has AVX-512 F and VNNI; `s1 <= w.rows / 32`; `acts` holds `m` rows (rounded up to a
/// tile of 16) over `w.cols` columns in tile order; `act_scales` holds `m` scales; `out` is
/// valid for writes of `m * n` floats, `n >= 32 (s1 - s0)`, and columns `0..32 (s1 - s0)` of
/// every row belong to this call alone.
#[target_feature(enable = "avx512f,avx512vnni")]
pub(crate) unsafe fn products(
    w: &RotatedInt8,
    (s0, s1): (usize, usize),
    acts: &[Line],
    (m, act_scales): (usize, &[f32]),
    out: *mut f32,
    n: usize,
) {
    let steps = w.cols / STEP;
    assert!(acts.len() >= m.div_ceil(ROWS) * steps * ROWS && act_scales.len() >= m);
    assert!(s1 <= w.rows / STRIP && n >= (s1 - s0) * STRIP);
    // Per strip and group of rows, its sums between blocks of columns.
    let groups = m.div_ceil(GROUP);
    let mut waiting = vec![[[_mm512_setzero_si512(); 2]; GROUP]; (s1 - s0) * groups];
    for c0 in (0..steps).step_by(BLOCK_STEPS) {
        let c1 = (c0 + BLOCK_STEPS).min(steps);
        for s in s0..s1 {
            let b = w.lines.as_ptr().add((s * steps + c0) * 2 * ROWS) as *const u8;
            for (g, sums) in waiting[(s - s0) * groups..][..groups]
                .iter_mut()
                .enumerate()
            {
                let r0 = g * GROUP;
                // The group's lines of step c0: rows r0.. of their tile, one line each.
                let a = acts
                    .as_ptr()
                    .add((r0 / ROWS * steps + c0) * ROWS + r0 % ROWS);
                group(sums, a as *const u8, b, c1 - c0);
                if c1 == steps {
                    let rows = (m - r0).min(GROUP);
                    let at = out.add(r0 * n + (s - s0) * STRIP);
                    finish(&sums[..rows], (w, s), &act_scales[r0..r0 + rows], at, n);
                }
            }
        }
    }
}

/// A group's sums (`sums`, one pair per row) of strip `s` of `w`, finished into `out` (rows `n`
/// apart): the offset's share taken away, then times the row's and the weight row's scales.
///
/// # Safety
/// The CPU has AVX-512 F; `out` is valid for `sums.len()` rows of 32 floats, `n` apart;
/// `acts` holds a scale per row of `sums`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn finish(
    sums: &[[__m512i; 2]],
    (w, s): (&RotatedInt8, usize),
    acts: &[f32],
    out: *mut f32,
    n: usize,
) {
    let mut offset = [_mm512_setzero_si512(); 2];
    let mut scale = [_mm512_setzero_ps(); 2];
    for h in 0..2 {
        let at = s * STRIP + 16 * h;
        let row_sums = _mm512_loadu_si512(w.sums.as_ptr().add(at) as *const _);
        offset[h] = _mm512_slli_epi32::<7>(row_sums);
        scale[h] = _mm512_loadu_ps(w.scale.as_ptr().add(at));
    }
    for (r, (pair, &sa)) in sums.iter().zip(acts).enumerate() {
        let sa = _mm512_set1_ps(sa);
        for h in 0..2 {
            let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(pair[h], offset[h]));
            let v = _mm512_mul_ps(v, _mm512_mul_ps(sa, scale[h]));
            _mm512_storeu_ps(out.add(r * n + 16 * h), v);
        }
    }
}

/// `GROUP` activation rows' integer sums (`sums`) plus their products with a strip's two B
/// tiles per step (`b`, 32 lines a step) over `steps` steps of 64 columns (the rows' lines at
/// `a`, 64 bytes apart, the next step's `ROWS` lines on).
///
/// # Safety
/// The CPU has AVX-512 F and VNNI; both pointers hold `steps` steps.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn group(sums: &mut [[__m512i; 2]; GROUP], a: *const u8, b: *const u8, steps: usize) {
    let mut acc = *sums;
    for c in 0..steps {
        let wl = b.add(c * 2 * ROWS * 64);
        let al = a.add(c * ROWS * 64);
        for i in 0..16 {
            let w0 = _mm512_load_si512(wl.add(64 * i) as *const _);
            let w1 = _mm512_load_si512(wl.add(64 * (16 + i)) as *const _);
            for (r, sums) in acc.iter_mut().enumerate() {
                let four = (al.add(64 * r + 4 * i) as *const i32).read_unaligned();
                let x = _mm512_set1_epi32(four);
                sums[0] = _mm512_dpbusd_epi32(sums[0], x, w0);
                sums[1] = _mm512_dpbusd_epi32(sums[1], x, w1);
            }
        }
    }
    *sums = acc;
}
