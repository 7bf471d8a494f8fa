//! AVX-512 products over weights in the interleaved layout of `kernels::packed`: one `vpdpbusd`
//! advances sixteen rows' dot products by four products each. CPUs with AVX-512 BW but without
//! VNNI run the same kernels with `vpmaddubsw` + `vpmaddwd` in its place (`dp4`); the integer sums,
//! and so every result, are the same bit for bit.

// The tiles address several arrays and pointers by row (or column) index. They keep their index
// loops: iterator forms change the code generated for these kernels.
#![allow(clippy::needless_range_loop)]

use super::{Q4_0, Q4_1, Q5_0, Q8_0};
use crate::kernels::format::{q4_1, q4k, q5_0, q6k, Format, PACKED_D};
use crate::kernels::packed::Packed;
use crate::kernels::quant::QuantizedActs;
use std::arch::x86_64::*;

/// Prefetches the `n` cache lines from `p`, which may lie past the data (prefetches never fault).
#[inline(always)]
unsafe fn prefetch_lines(p: *const u8, n: usize) {
    for i in 0..n {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * i) as *const i8);
    }
}

/// Four activation bytes at `p`, broadcast to every lane.
#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m512i {
    _mm512_set1_epi32((p as *const i32).read_unaligned())
}

/// `acc + ` the sums of four products `w * x` per 32-bit lane (`w` unsigned, `x` signed bytes):
/// one `vpdpbusd` with VNNI, else `vpmaddubsw` and `vpmaddwd`. The pairs `vpmaddubsw` adds stay in
/// 16 bits for every weight below 128 (the 4-, 5- and 6-bit values) against activations within
/// +-127, so both give the same integers. (Q8_0's bytes, up to 255, take `dp4_signed` instead.)
#[inline(always)]
unsafe fn dp4<const VNNI: bool>(acc: __m512i, w: __m512i, x: __m512i) -> __m512i {
    if VNNI {
        _mm512_dpbusd_epi32(acc, w, x)
    } else {
        let pairs = _mm512_maddubs_epi16(w, x);
        _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))
    }
}

/// Without VNNI: `acc + ` the sums of four products of signed bytes `w * x` per lane, given `|w|`
/// and the lanes where `w` is negative: `x` takes `w`'s sign, so that `vpmaddubsw` multiplies the
/// unsigned `|w|` (at most 128) by it and no pair leaves 16 bits.
#[inline(always)]
unsafe fn dp4_signed(acc: __m512i, w_abs: __m512i, w_neg: __mmask64, x: __m512i) -> __m512i {
    let x = _mm512_mask_sub_epi8(x, w_neg, _mm512_setzero_si512(), x);
    let pairs = _mm512_maddubs_epi16(w_abs, x);
    _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))
}

/// Sixteen f16 values at `p` as floats.
#[inline(always)]
unsafe fn f16x16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// Integer sums of one sub-block: with fewer than four activation rows the low and high nibbles
/// go to two accumulators, so that the `vpdpbusd` chains overlap. Integer addition is exact, so the
/// sums are the same either way.
#[inline(always)]
const fn split_chains<const MR: usize>() -> bool {
    MR < 4
}

/// One step of eight columns: `lo` holds each lane's first four columns, `hi` the next four;
/// activation row `r`'s eight bytes are at `x + r * k`.
#[inline(always)]
unsafe fn nibble_step<const VNNI: bool, const MR: usize>(
    a: &mut [__m512i; MR],
    a2: &mut [__m512i; MR],
    lo: __m512i,
    hi: __m512i,
    x: *const i8,
    k: usize,
) {
    for r in 0..MR {
        let xp = x.add(r * k);
        a[r] = dp4::<VNNI>(a[r], lo, bcast4(xp));
        if split_chains::<MR>() {
            a2[r] = dp4::<VNNI>(a2[r], hi, bcast4(xp.add(4)));
        } else {
            a[r] = dp4::<VNNI>(a[r], hi, bcast4(xp.add(4)));
        }
    }
}

/// Each row's integer sum of a sub-block from its one or two chains.
#[inline(always)]
unsafe fn chain_sum<const MR: usize>(a: &[__m512i; MR], a2: &[__m512i; MR], r: usize) -> __m512i {
    if split_chains::<MR>() {
        _mm512_add_epi32(a[r], a2[r])
    } else {
        a[r]
    }
}

/// End of a K-quant super-block: each row's scaled sum times its activation scale.
#[inline(always)]
unsafe fn add_super_block<const MR: usize>(
    acc: &mut [__m512; MR],
    sbacc: &[__m512; MR],
    acts: &QuantizedActs,
    r0: usize,
    s: usize,
) {
    for r in 0..MR {
        let dx = *acts.d.get_unchecked((r0 + r) * acts.k / 256 + s);
        acc[r] = _mm512_fmadd_ps(sbacc[r], _mm512_set1_ps(dx), acc[r]);
    }
}

#[inline(always)]
unsafe fn store_rows<const MR: usize>(acc: &[__m512; MR], out: *mut f32, stride: usize) {
    for (r, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.add(r * stride), *a);
    }
}

/// Packed Q4_K (see `packed`): the sixteen rows of one group against activation rows
/// `r0..r0 + MR`; row `r`'s sixteen results go to `out + r * stride`.
#[inline(always)]
unsafe fn packed_q4k<const VNNI: bool, const MR: usize>(
    group: &[u8],
    nsb: usize,
    acts: &QuantizedActs,
    r0: usize,
    out: *mut f32,
    stride: usize,
) {
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); MR];
    let q = acts.q.as_ptr();
    let k = acts.k;
    for s in 0..nsb {
        let blk = group.as_ptr().add(s * q4k::PACKED_BYTES);
        let d = f16x16(blk.add(PACKED_D));
        let dmin = f16x16(blk.add(q4k::PACKED_DMIN));
        let mut sbacc = [_mm512_setzero_ps(); MR];
        for j in 0..8 {
            let qs = blk.add(q4k::PACKED_QS + 256 * j);
            // The next super-block, spread over this one's eight steps (37 lines).
            prefetch_lines(blk.wrapping_add(q4k::PACKED_BYTES + 320 * j), 5);
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                blk.add(q4k::PACKED_SCALES + 16 * j) as *const __m128i,
            )));
            let mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                blk.add(q4k::PACKED_MINS + 16 * j) as *const __m128i,
            )));
            let mut a = [_mm512_setzero_si512(); MR];
            let mut a2 = [_mm512_setzero_si512(); MR];
            for u in 0..4 {
                let v = _mm512_loadu_si512(qs.add(64 * u) as *const _);
                let lo = _mm512_and_si512(v, low);
                let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                let x = q.add(r0 * k + s * 256 + 32 * j + 8 * u);
                nibble_step::<VNNI, MR>(&mut a, &mut a2, lo, hi, x, k);
            }
            let sc = _mm512_mul_ps(sc, d);
            let mn = _mm512_mul_ps(mn, dmin);
            for r in 0..MR {
                let sum = chain_sum::<MR>(&a, &a2, r);
                sbacc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sc, sbacc[r]);
                let ds = *acts.ds.get_unchecked(((r0 + r) * k + s * 256) / 32 + j);
                acc[r] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(ds), acc[r]);
            }
        }
        add_super_block::<MR>(&mut acc, &sbacc, acts, r0, s);
    }
    store_rows::<MR>(&acc, out, stride);
}

/// The top two bits of four columns, from bits `2i..2i + 2` of each byte of `h`, moved to bits 4
/// and 5.
#[inline(always)]
unsafe fn q6_high<const I: u32>(h: __m512i) -> __m512i {
    let m = _mm512_set1_epi8(0x30);
    match I {
        0 => _mm512_and_si512(_mm512_slli_epi16(h, 4), m),
        1 => _mm512_and_si512(_mm512_slli_epi16(h, 2), m),
        2 => _mm512_and_si512(h, m),
        _ => _mm512_and_si512(_mm512_srli_epi16(h, 2), m),
    }
}

/// Packed Q6_K (see `packed`), as `packed_q4k`.
#[inline(always)]
unsafe fn packed_q6k<const VNNI: bool, const MR: usize>(
    group: &[u8],
    nsb: usize,
    acts: &QuantizedActs,
    r0: usize,
    out: *mut f32,
    stride: usize,
) {
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); MR];
    let q = acts.q.as_ptr();
    let k = acts.k;
    for s in 0..nsb {
        let blk = group.as_ptr().add(s * q6k::PACKED_BYTES);
        let d = f16x16(blk.add(PACKED_D));
        let mut sbacc = [_mm512_setzero_ps(); MR];
        for t in 0..16 {
            let ql = blk.add(q6k::PACKED_QL + 128 * t);
            // The next super-block, spread over this one's sixteen steps (53 lines).
            prefetch_lines(blk.wrapping_add(q6k::PACKED_BYTES + 256 * t), 4);
            let h = _mm512_loadu_si512(blk.add(q6k::PACKED_QH + 64 * t) as *const _);
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                blk.add(q6k::PACKED_SCALES + 16 * t) as *const __m128i,
            )));
            let mut a = [_mm512_setzero_si512(); MR];
            let mut a2 = [_mm512_setzero_si512(); MR];
            for u in 0..2 {
                let v = _mm512_loadu_si512(ql.add(64 * u) as *const _);
                let (hl, hh) = if u == 0 {
                    (q6_high::<0>(h), q6_high::<1>(h))
                } else {
                    (q6_high::<2>(h), q6_high::<3>(h))
                };
                let lo = _mm512_or_si512(_mm512_and_si512(v, low), hl);
                let hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), hh);
                let x = q.add(r0 * k + s * 256 + 16 * t + 8 * u);
                nibble_step::<VNNI, MR>(&mut a, &mut a2, lo, hi, x, k);
            }
            let sc = _mm512_mul_ps(sc, d);
            for r in 0..MR {
                // The values are stored plus 32: take 32 times the activation sum back out.
                let off = *acts
                    .bsums_x32
                    .get_unchecked(((r0 + r) * k + s * 256) / 16 + t);
                let sum = _mm512_sub_epi32(chain_sum::<MR>(&a, &a2, r), _mm512_set1_epi32(off));
                sbacc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sc, sbacc[r]);
            }
        }
        add_super_block::<MR>(&mut acc, &sbacc, acts, r0, s);
    }
    store_rows::<MR>(&acc, out, stride);
}

/// Q5_0's fifth bits for step `u` of a block: bits `2u` (low nibbles) or `2u + 1` (high) of
/// each byte of `h`, moved to bit 4.
#[inline(always)]
unsafe fn q5_high(h: __m512i, bit: u32) -> __m512i {
    let m = _mm512_set1_epi8(0x10);
    let v = match bit {
        0 => _mm512_slli_epi16(h, 4),
        1 => _mm512_slli_epi16(h, 3),
        2 => _mm512_slli_epi16(h, 2),
        3 => _mm512_slli_epi16(h, 1),
        4 => h,
        5 => _mm512_srli_epi16(h, 1),
        6 => _mm512_srli_epi16(h, 2),
        _ => _mm512_srli_epi16(h, 3),
    };
    _mm512_and_si512(v, m)
}

/// Packed 32-column formats (see `packed`), units of two blocks, as `packed_q4k`: per block and
/// row, the integer sum of the block times the weight scale times the activation scale, plus the
/// format's offset per unit of activation sum (Q8_0, stored plus 128, takes 128 times the integer
/// activation sum out before scaling).
#[inline(always)]
unsafe fn packed32<const VNNI: bool, const F: u8, const MR: usize>(
    group: &[u8],
    units: usize,
    acts: &QuantizedActs,
    r0: usize,
    out: *mut f32,
    stride: usize,
) {
    let bytes = const { Format::from_code(F).packed_bytes() };
    let values = const { Format::from_code(F).packed_values() };
    let lines = bytes / 64;
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); MR];
    let q = acts.q.as_ptr();
    let k = acts.k;
    for s in 0..units {
        let blk = group.as_ptr().add(s * bytes);
        // The unit after next, half per block.
        prefetch_lines(blk.wrapping_add(2 * bytes), lines / 2);
        prefetch_lines(
            blk.wrapping_add(2 * bytes + 64 * (lines / 2)),
            lines - lines / 2,
        );
        for h in 0..2 {
            let dw = f16x16(blk.add(PACKED_D + 32 * h));
            let off = match F {
                Q4_0 => _mm512_mul_ps(dw, _mm512_set1_ps(-8.0)),
                Q4_1 => f16x16(blk.add(q4_1::PACKED_M + 32 * h)),
                Q5_0 => _mm512_mul_ps(dw, _mm512_set1_ps(-16.0)),
                _ => _mm512_setzero_ps(),
            };
            let mut a = [_mm512_setzero_si512(); MR];
            let mut a2 = [_mm512_setzero_si512(); MR];
            let x0 = 64 * s + 32 * h;
            if F == Q8_0 {
                for u in 0..8 {
                    let w = _mm512_loadu_si512(blk.add(values + 512 * h + 64 * u) as *const _);
                    // Without VNNI: the signed bytes (stored plus 128), as |w| and sign.
                    let (w_abs, w_neg) = if VNNI {
                        (w, 0)
                    } else {
                        let signed = _mm512_xor_si512(w, _mm512_set1_epi8(-128));
                        (_mm512_abs_epi8(signed), _mm512_movepi8_mask(signed))
                    };
                    for r in 0..MR {
                        let xp = q.add((r0 + r) * k + x0 + 4 * u);
                        let chain = if split_chains::<MR>() && u % 2 == 1 {
                            &mut a2[r]
                        } else {
                            &mut a[r]
                        };
                        *chain = if VNNI {
                            dp4::<VNNI>(*chain, w, bcast4(xp))
                        } else {
                            dp4_signed(*chain, w_abs, w_neg, bcast4(xp))
                        };
                    }
                }
            } else {
                let high = if F == Q5_0 {
                    _mm512_loadu_si512(blk.add(q5_0::PACKED_QH + 64 * h) as *const _)
                } else {
                    _mm512_setzero_si512()
                };
                for u in 0..4 {
                    let v = _mm512_loadu_si512(blk.add(values + 256 * h + 64 * u) as *const _);
                    let mut lo = _mm512_and_si512(v, low);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                    if F == Q5_0 {
                        lo = _mm512_or_si512(lo, q5_high(high, 2 * u as u32));
                        hi = _mm512_or_si512(hi, q5_high(high, 2 * u as u32 + 1));
                    }
                    let x = q.add(r0 * k + x0 + 8 * u);
                    nibble_step::<VNNI, MR>(&mut a, &mut a2, lo, hi, x, k);
                }
            }
            for r in 0..MR {
                let bi = ((r0 + r) * k + x0) / 32;
                let mut sum = chain_sum::<MR>(&a, &a2, r);
                if F == Q8_0 && VNNI {
                    // The unsigned products counted each activation 128 times too often.
                    let bias = *acts.isums.get_unchecked(bi) << 7;
                    sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(bias));
                }
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*acts.d.get_unchecked(bi)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[r]);
                if F != Q8_0 {
                    let ds = _mm512_set1_ps(*acts.ds.get_unchecked(bi));
                    acc[r] = _mm512_fmadd_ps(off, ds, acc[r]);
                }
            }
        }
    }
    store_rows::<MR>(&acc, out, stride);
}

#[inline(always)]
unsafe fn packed_tile<const VNNI: bool, const MR: usize>(
    p: &Packed,
    g: usize,
    acts: &QuantizedActs,
    r0: usize,
    out: *mut f32,
    stride: usize,
) {
    let group = p.group(g);
    let n = p.units();
    match p.format {
        Format::Q4K => packed_q4k::<VNNI, MR>(group, n, acts, r0, out, stride),
        Format::Q6K => packed_q6k::<VNNI, MR>(group, n, acts, r0, out, stride),
        Format::Q4_0 => packed32::<VNNI, Q4_0, MR>(group, n, acts, r0, out, stride),
        Format::Q4_1 => packed32::<VNNI, Q4_1, MR>(group, n, acts, r0, out, stride),
        Format::Q5_0 => packed32::<VNNI, Q5_0, MR>(group, n, acts, r0, out, stride),
        Format::Q8_0 => packed32::<VNNI, Q8_0, MR>(group, n, acts, r0, out, stride),
    }
}

/// `packed_rows_vnni` / `packed_rows_avx512` with the product step as a parameter.
#[inline(always)]
unsafe fn packed_rows<const VNNI: bool>(
    p: &Packed,
    g: usize,
    acts: &QuantizedActs,
    r0: usize,
    m: usize,
    out: *mut f32,
    stride: usize,
) {
    let mut r = 0;
    while r < m {
        let o = out.add(r * stride);
        let n = (m - r).min(8);
        match n {
            8 => packed_tile::<VNNI, 8>(p, g, acts, r0 + r, o, stride),
            7 => packed_tile::<VNNI, 7>(p, g, acts, r0 + r, o, stride),
            6 => packed_tile::<VNNI, 6>(p, g, acts, r0 + r, o, stride),
            5 => packed_tile::<VNNI, 5>(p, g, acts, r0 + r, o, stride),
            4 => packed_tile::<VNNI, 4>(p, g, acts, r0 + r, o, stride),
            3 => packed_tile::<VNNI, 3>(p, g, acts, r0 + r, o, stride),
            2 => packed_tile::<VNNI, 2>(p, g, acts, r0 + r, o, stride),
            _ => packed_tile::<VNNI, 1>(p, g, acts, r0 + r, o, stride),
        }
        r += n;
    }
}

/// The sixteen rows of group `g` of a packed matrix against activation rows `r0..r0 + m`: row
/// `r0 + r`'s results go to `out[r * stride..][..16]`. Up to eight activation rows share each pass
/// over the group's weights; every row sees the same operations whatever tile it is in.
///
/// # Safety
/// The CPU must have AVX-512 F, VL, BW and VNNI (and AVX2, FMA, F16C); `acts` holds rows
/// `r0..r0 + m` quantized over `p.cols` columns in the blocks the format wants; `out` is valid for
/// writes of `(m - 1) * stride + 16` floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) unsafe fn packed_rows_vnni(
    p: &Packed,
    g: usize,
    acts: &QuantizedActs,
    r0: usize,
    m: usize,
    out: *mut f32,
    stride: usize,
) {
    packed_rows::<true>(p, g, acts, r0, m, out, stride)
}

/// `packed_rows_vnni` for CPUs with AVX-512 BW but without VNNI: the same results, bit for bit.
///
/// # Safety
/// The CPU must have AVX-512 F, VL and BW (and AVX2, FMA, F16C); otherwise as `packed_rows_vnni`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
pub(crate) unsafe fn packed_rows_avx512(
    p: &Packed,
    g: usize,
    acts: &QuantizedActs,
    r0: usize,
    m: usize,
    out: *mut f32,
    stride: usize,
) {
    packed_rows::<false>(p, g, acts, r0, m, out, stride)
}
