//! AVX2 and AVX-512 VNNI versions of `quant::dot_rows_scalar`: quantized products over weights in
//! their GGUF layout, chosen at run time.
//!
//! Each weight block is decoded once into registers of small integers and applied to up to `MR`
//! activation rows before the next block is read. Every row keeps its own accumulators and sees
//! exactly the same operations in the same order whatever tile it is computed in, so a row's result
//! does not depend on how many rows share the pass.

// The tiles address several arrays and pointers by row (or column) index. They keep their index
// loops: iterator forms change the code generated for these kernels.
#![allow(clippy::needless_range_loop)]

use super::{hsum, MXFP4, Q4K, Q4_0, Q4_1, Q5_0, Q6K, Q8_0};
use crate::kernels::format::{mxfp4, q4_0, q4_1, q4k, q4k_scales_mins, q5_0, q6k, q8_0, Format};
use crate::kernels::quant::QuantizedActs;
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn nibbles_16(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let hi = _mm_srli_epi16(q, 4);
    _mm256_and_si256(_mm256_set_m128i(hi, q), _mm256_set1_epi8(0x0F))
}

/// 0xFF in byte k where bit k of `bits` is set.
#[inline(always)]
unsafe fn bits_to_bytes(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    let shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let sel = _mm256_and_si256(_mm256_shuffle_epi8(v, shuf), mask);
    _mm256_cmpeq_epi8(sel, mask)
}

#[inline(always)]
unsafe fn f16_fast(p: &[u8], at: usize) -> f32 {
    let h = u16::from_le_bytes([p[at], p[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// Sum of unsigned-by-signed byte products in eight i32 lanes (four bytes each).
#[inline(always)]
unsafe fn udot<const VNNI: bool>(u: __m256i, s: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
}

/// How far ahead of the weights being decoded to prefetch: the hardware prefetcher alone leaves
/// the loop waiting on memory.
const PREFETCH_BYTES: usize = 1024;

#[inline(always)]
unsafe fn prefetch(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES) as *const i8);
}

#[inline(always)]
unsafe fn load(p: *const i8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// Whether format `F`'s natural-layout kernels take its weights as signed bytes (by magnitude and
/// sign): Q8_0's bytes and MXFP4's values; the others' are unsigned with a float offset.
const fn signed(f: u8) -> bool {
    f == Q8_0 || f == MXFP4
}

/// The float scale of the 32-element block at `blk`: an f16, or MXFP4's `2^(e - 128)`.
#[inline(always)]
unsafe fn scale32<const F: u8>(blk: &[u8]) -> f32 {
    if F == MXFP4 {
        mxfp4::scale(blk[mxfp4::E])
    } else {
        f16_fast(blk, Format::from_code(F).d_at())
    }
}

/// 32-element formats: one float scale per block.
#[inline(always)]
unsafe fn tile32<const F: u8, const MR: usize, const VNNI: bool>(
    wrow: &[u8],
    acts: &QuantizedActs,
    r0: usize,
    first_block: usize,
    out: &mut [f32],
) {
    let bytes = const { Format::from_code(F).super_block().1 };
    let nb = wrow.len() / bytes;
    let mut acc = [_mm256_setzero_ps(); MR];
    let mut macc = [0f32; MR];
    let qbase = acts.q.as_ptr();
    for b in first_block..nb {
        let blk = wrow.get_unchecked(b * bytes..(b + 1) * bytes);
        let p = blk.as_ptr();
        prefetch(p);
        let d = scale32::<F>(blk);
        // Unsigned weights `u` (or |w| for Q8_0 and MXFP4) and the offset per unit of
        // activation sum.
        let w = unpack_block::<F>(p);
        let (u, signs, offset) = match F {
            Q4_0 => (w, None, -8.0 * d),
            Q4_1 => (w, None, f16_fast(blk, q4_1::M)),
            Q5_0 => (w, None, -16.0 * d),
            _ => (_mm256_sign_epi8(w, w), Some(w), 0.0),
        };
        for r in 0..MR {
            let bi = (r0 + r) * acts.k / 32 + b;
            let x = load(qbase.add(bi * 32));
            let x = match signs {
                Some(w) => _mm256_sign_epi8(x, w),
                None => x,
            };
            let dot = udot::<VNNI>(u, x);
            let dx = *acts.d.get_unchecked(bi);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * dx), acc[r]);
            if !signed(F) {
                macc[r] += offset * *acts.ds.get_unchecked(bi);
            }
        }
    }
    for r in 0..MR {
        out[r] = hsum(acc[r]) + macc[r];
    }
}

/// Q4_K: 256-element super-blocks, 6-bit integer scales and mins per 32.
#[inline(always)]
unsafe fn tile_q4k<const MR: usize>(wrow: &[u8], acts: &QuantizedActs, r0: usize, out: &mut [f32]) {
    let nsb = wrow.len() / q4k::BYTES;
    let mut acc = [_mm256_setzero_ps(); MR];
    let qbase = acts.q.as_ptr();
    let low = _mm256_set1_epi8(0x0F);
    for s in 0..nsb {
        let sb = wrow.get_unchecked(s * q4k::BYTES..(s + 1) * q4k::BYTES);
        prefetch(sb.as_ptr());
        prefetch(sb.as_ptr().add(64));
        prefetch(sb.as_ptr().add(128));
        let (d, dmin) = (f16_fast(sb, q4k::D), f16_fast(sb, q4k::DMIN));
        let (sc, m) = q4k_scales_mins(&sb[q4k::SCALES..q4k::QS]);
        let mut isum = [_mm256_setzero_si256(); MR];
        for p in 0..4 {
            let q = _mm256_loadu_si256(sb.as_ptr().add(q4k::QS + 32 * p) as *const __m256i);
            let lo = _mm256_and_si256(q, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            let s_lo = _mm256_set1_epi16(sc[2 * p] as i16);
            let s_hi = _mm256_set1_epi16(sc[2 * p + 1] as i16);
            for r in 0..MR {
                let xp = qbase.add((r0 + r) * acts.k + s * 256 + 64 * p);
                let a = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load(xp)), s_lo);
                let b = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load(xp.add(32))), s_hi);
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(a, b));
            }
        }
        let mins = _mm256_setr_epi16(
            m[0] as i16,
            m[0] as i16,
            m[1] as i16,
            m[1] as i16,
            m[2] as i16,
            m[2] as i16,
            m[3] as i16,
            m[3] as i16,
            m[4] as i16,
            m[4] as i16,
            m[5] as i16,
            m[5] as i16,
            m[6] as i16,
            m[6] as i16,
            m[7] as i16,
            m[7] as i16,
        );
        for r in 0..MR {
            let bi = (r0 + r) * acts.k / 256 + s;
            let bs = _mm256_loadu_si256(acts.bsums.as_ptr().add(bi * 16) as *const __m256i);
            let msum = _mm256_madd_epi16(bs, mins);
            let dx = *acts.d.get_unchecked(bi);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(d * dx), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(dmin * dx), acc[r]);
        }
    }
    for r in 0..MR {
        out[r] = hsum(acc[r]);
    }
}

/// Q6_K: 256-element super-blocks, 6-bit values offset by 32, an 8-bit scale per 16.
#[inline(always)]
unsafe fn tile_q6k<const MR: usize>(wrow: &[u8], acts: &QuantizedActs, r0: usize, out: &mut [f32]) {
    let nsb = wrow.len() / q6k::BYTES;
    let mut acc = [_mm256_setzero_ps(); MR];
    let qbase = acts.q.as_ptr();
    let low = _mm256_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    for s in 0..nsb {
        let sb = wrow.get_unchecked(s * q6k::BYTES..(s + 1) * q6k::BYTES);
        prefetch(sb.as_ptr());
        prefetch(sb.as_ptr().add(64));
        prefetch(sb.as_ptr().add(128));
        prefetch(sb.as_ptr().add(192));
        let p = sb.as_ptr();
        let d = f16_fast(sb, q6k::D);
        let sc = |i: usize| sb[q6k::SCALES + i] as i8 as i16;
        let mut isum = [_mm256_setzero_si256(); MR];
        for chunk in 0..8 {
            let (half, quarter) = (chunk / 4, chunk % 4);
            let ql = p.add(q6k::QL + 64 * half + 32 * (quarter & 1));
            let ql = _mm256_loadu_si256(ql as *const __m256i);
            let lo = if quarter < 2 {
                ql
            } else {
                _mm256_srli_epi16(ql, 4)
            };
            let qh = _mm256_loadu_si256(p.add(q6k::QH + 32 * half) as *const __m256i);
            let h = match quarter {
                0 => qh,
                1 => _mm256_srli_epi16(qh, 2),
                2 => _mm256_srli_epi16(qh, 4),
                _ => _mm256_srli_epi16(qh, 6),
            };
            let u = _mm256_or_si256(
                _mm256_and_si256(lo, low),
                _mm256_slli_epi16(_mm256_and_si256(h, three), 4),
            );
            let g = 8 * half + 2 * quarter;
            let scv = _mm256_set_m128i(_mm_set1_epi16(sc(g + 1)), _mm_set1_epi16(sc(g)));
            for r in 0..MR {
                let xp = qbase.add((r0 + r) * acts.k + s * 256 + 32 * chunk);
                let v = _mm256_madd_epi16(_mm256_maddubs_epi16(u, load(xp)), scv);
                isum[r] = _mm256_add_epi32(isum[r], v);
            }
        }
        let scales = _mm256_setr_epi16(
            sc(0),
            sc(1),
            sc(2),
            sc(3),
            sc(4),
            sc(5),
            sc(6),
            sc(7),
            sc(8),
            sc(9),
            sc(10),
            sc(11),
            sc(12),
            sc(13),
            sc(14),
            sc(15),
        );
        for r in 0..MR {
            let bi = (r0 + r) * acts.k / 256 + s;
            let bs = _mm256_loadu_si256(acts.bsums.as_ptr().add(bi * 16) as *const __m256i);
            // The values are stored plus 32: take 32 * scale * sum(x) back out.
            let bias = _mm256_slli_epi32(_mm256_madd_epi16(bs, scales), 5);
            let total = _mm256_sub_epi32(isum[r], bias);
            let dx = *acts.d.get_unchecked(bi);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * dx), acc[r]);
        }
    }
    for r in 0..MR {
        out[r] = hsum(acc[r]);
    }
}

/// The 64 unsigned weights (or |w| for Q8_0 and MXFP4) of blocks at `p` and `p + bytes`, and for
/// those the signs as a mask.
#[inline(always)]
unsafe fn unpack_pair<const F: u8>(p: *const u8, bytes: usize) -> (__m512i, __mmask64) {
    let w = _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(unpack_block::<F>(p)),
        unpack_block::<F>(p.add(bytes)),
    );
    if signed(F) {
        (_mm512_abs_epi8(w), _mm512_movepi8_mask(w))
    } else {
        (w, 0)
    }
}

/// The 32 weights of the block at `p` as bytes (unsigned, or signed for Q8_0 and MXFP4).
#[inline(always)]
unsafe fn unpack_block<const F: u8>(p: *const u8) -> __m256i {
    match F {
        MXFP4 => {
            let table = _mm_loadu_si128(mxfp4::KVALUES.as_ptr() as *const __m128i);
            _mm256_shuffle_epi8(_mm256_set_m128i(table, table), nibbles_16(p.add(mxfp4::QS)))
        }
        Q4_0 => nibbles_16(p.add(q4_0::QS)),
        Q4_1 => nibbles_16(p.add(q4_1::QS)),
        Q5_0 => {
            let qh = u32::from_le_bytes(*(p.add(q5_0::QH) as *const [u8; 4]));
            let hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles_16(p.add(q5_0::QS)), hi)
        }
        _ => _mm256_loadu_si256(p.add(q8_0::QS) as *const __m256i),
    }
}

/// Two f16 values at `p` and `p + stride` as sixteen floats: the first eight times, then the
/// second.
#[inline(always)]
unsafe fn spread_f16(p: *const u8, stride: usize) -> __m512 {
    let a = u32::from(u16::from_le_bytes(*(p as *const [u8; 2])));
    let b = u32::from(u16::from_le_bytes(*(p.add(stride) as *const [u8; 2])));
    let both = _mm512_cvtph_ps(_mm256_set1_epi32((a | (b << 16)) as i32));
    let pick = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    _mm512_permutexvar_ps(pick, both)
}

/// 32-element formats with 512-bit registers, two blocks per vector: lanes 0..8 hold the first
/// block's partial sums, lanes 8..16 the second's, each scaled by its own weight and activation
/// scale. The activation scales come pre-spread (`QuantizedActs::spread`), so a row costs one
/// load and `vpdpbusd`, a convert, a multiply and an FMA per 64 products; the weight offsets
/// (Q4_0, Q4_1, Q5_0) are applied per run of blocks.
#[inline(always)]
unsafe fn tile32_512<const F: u8, const MR: usize>(
    wrow: &[u8],
    acts: &QuantizedActs,
    r0: usize,
    out: &mut [f32],
) {
    let bytes = const { Format::from_code(F).super_block().1 };
    let nb = wrow.len() / bytes;
    let mut acc = [_mm512_setzero_ps(); MR];
    let qbase = acts.q.as_ptr();
    let sd = acts.spread_d.as_ptr();
    // The weight offsets of a run of blocks, applied afterwards to each row's activation sums as
    // one dot product (sixteen blocks per instruction instead of a multiply per block and row).
    const RUN: usize = 64;
    let mut offs = [0f32; RUN + 16];
    let pairs_end = nb & !1;
    let mut b = 0;
    while b < pairs_end {
        let run_end = pairs_end.min(b + RUN);
        let run_start = b;
        while b < run_end {
            let p = wrow.as_ptr().add(b * bytes);
            prefetch(p);
            let (u, signs) = unpack_pair::<F>(p, bytes);
            let wd = if F == MXFP4 {
                let e = |b: usize| mxfp4::scale(*p.add(b * bytes + mxfp4::E));
                let both = _mm512_castps128_ps512(_mm_setr_ps(e(0), e(1), 0.0, 0.0));
                let pick = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
                _mm512_permutexvar_ps(pick, both)
            } else {
                spread_f16(p.add(Format::from_code(F).d_at()), bytes)
            };
            // Offset per unit of activation sum, one per block (lanes 0 and 8).
            let off = match F {
                Q4_0 => _mm512_mul_ps(wd, _mm512_set1_ps(-8.0)),
                Q4_1 => spread_f16(p.add(q4_1::M), bytes),
                Q5_0 => _mm512_mul_ps(wd, _mm512_set1_ps(-16.0)),
                _ => _mm512_setzero_ps(),
            };
            if !signed(F) {
                _mm512_mask_compressstoreu_ps(
                    offs.as_mut_ptr().add(b - run_start) as *mut _,
                    0x0101,
                    off,
                );
            }
            for r in 0..MR {
                let bi = (r0 + r) * acts.k / 32 + b;
                let mut x = _mm512_loadu_si512(qbase.add(bi * 32) as *const _);
                if signed(F) {
                    x = _mm512_mask_sub_epi8(x, signs, _mm512_setzero_si512(), x);
                }
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x);
                let scale = _mm512_mul_ps(wd, _mm512_loadu_ps(sd.add(bi * 8)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
            }
            b += 2;
        }
        if !signed(F) {
            let n = run_end - run_start;
            offs[n..n.next_multiple_of(16)].fill(0.0);
            for r in 0..MR {
                // `ds` is padded: a load past the last block reads zeros times zero offsets.
                let ds = acts.ds.as_ptr().add((r0 + r) * acts.k / 32 + run_start);
                for c in (0..n).step_by(16) {
                    let o = _mm512_loadu_ps(offs.as_ptr().add(c));
                    acc[r] = _mm512_fmadd_ps(o, _mm512_loadu_ps(ds.add(c)), acc[r]);
                }
            }
        }
    }
    let mut tail = [0f32; MR];
    if b < nb {
        tile32::<F, MR, true>(wrow, acts, r0, b, &mut tail);
    }
    for r in 0..MR {
        out[r] = _mm512_reduce_add_ps(acc[r]) + tail[r];
    }
}

/// Permutation indices that spread 16-bit scales over 32 lanes, `lanes` lanes per scale: the
/// `i`-th vector starts at scale `i * 32 / lanes`. Built at compile time.
const fn scale_index(lanes: usize) -> [[i16; 32]; 4] {
    let mut v = [[0i16; 32]; 4];
    let mut i = 0;
    while i < 4 {
        let mut l = 0;
        while l < 32 {
            v[i][l] = (i * 32 / lanes + l / lanes) as i16;
            l += 1;
        }
        i += 1;
    }
    v
}

const Q4K_SCALE_INDEX: [[i16; 32]; 4] = scale_index(16);
const Q6K_SCALE_INDEX: [[i16; 32]; 4] = scale_index(8);

#[inline(always)]
unsafe fn load_index(v: &[[i16; 32]; 4]) -> [__m512i; 4] {
    // Plain loads, no closure: a closure would not inherit the caller's target features.
    [
        _mm512_loadu_si512(v[0].as_ptr() as *const _),
        _mm512_loadu_si512(v[1].as_ptr() as *const _),
        _mm512_loadu_si512(v[2].as_ptr() as *const _),
        _mm512_loadu_si512(v[3].as_ptr() as *const _),
    ]
}

/// Q4_K with 512-bit registers: each 64-byte load of packed nibbles becomes two vectors of 64
/// weights in natural order, so one activation load, one `vpmaddubsw` and one `vpdpwssd` (scale
/// applied and summed) cover 64 products per row.
#[inline(always)]
unsafe fn tile_q4k_512<const MR: usize>(
    wrow: &[u8],
    acts: &QuantizedActs,
    r0: usize,
    out: &mut [f32],
) {
    let nsb = wrow.len() / q4k::BYTES;
    let mut acc = [_mm512_setzero_ps(); MR];
    let mut macc = [_mm256_setzero_ps(); MR];
    let qbase = acts.q.as_ptr();
    let low = _mm512_set1_epi8(0x0F);
    // Lane l of the scale vector for the j-th 64 weights of half h is scale 4h + 2j + l / 16.
    let idx = load_index(&Q4K_SCALE_INDEX);
    for s in 0..nsb {
        let sb = wrow.get_unchecked(s * q4k::BYTES..(s + 1) * q4k::BYTES);
        prefetch(sb.as_ptr());
        prefetch(sb.as_ptr().add(64));
        prefetch(sb.as_ptr().add(128));
        let (d, dmin) = (f16_fast(sb, q4k::D), f16_fast(sb, q4k::DMIN));
        let (sc, m) = q4k_scales_mins(&sb[q4k::SCALES..q4k::QS]);
        let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(
            sc.as_ptr() as *const __m128i
        )));
        let mut isum = [_mm512_setzero_si512(); MR];
        for h in 0..2 {
            let q = _mm512_loadu_si512(sb.as_ptr().add(q4k::QS + 64 * h) as *const _);
            let lo = _mm512_and_si512(q, low);
            let hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
            // Sub-blocks 4h, 4h+1 (elements 128h..128h+64) and 4h+2, 4h+3.
            let w = [
                _mm512_shuffle_i64x2::<0x44>(lo, hi),
                _mm512_shuffle_i64x2::<0xEE>(lo, hi),
            ];
            let sv = [
                _mm512_permutexvar_epi16(idx[2 * h], sc16),
                _mm512_permutexvar_epi16(idx[2 * h + 1], sc16),
            ];
            for r in 0..MR {
                let xp = qbase.add((r0 + r) * acts.k + s * 256 + 128 * h);
                for j in 0..2 {
                    let x = _mm512_loadu_si512(xp.add(64 * j) as *const _);
                    isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_maddubs_epi16(w[j], x), sv[j]);
                }
            }
        }
        // Mins: dmin * m[sub] against each row's per-32 scaled sums.
        let m8 = _mm_loadl_epi64(m.as_ptr() as *const __m128i);
        let wmin = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m8)),
            _mm256_set1_ps(dmin),
        );
        for r in 0..MR {
            let bi = (r0 + r) * acts.k / 256 + s;
            let ds = _mm256_loadu_ps(acts.ds.as_ptr().add(bi * 8));
            macc[r] = _mm256_fmadd_ps(wmin, ds, macc[r]);
            let dx = *acts.d.get_unchecked(bi);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_set1_ps(d * dx), acc[r]);
        }
    }
    for r in 0..MR {
        out[r] = _mm512_reduce_add_ps(acc[r]) - hsum(macc[r]);
    }
}

/// Q6_K with 512-bit registers: 64 weights per vector in natural order, a 16-bit scale per lane
/// pair, `vpmaddubsw` + `vpdpwssd` per 64 products and row.
#[inline(always)]
unsafe fn tile_q6k_512<const MR: usize>(
    wrow: &[u8],
    acts: &QuantizedActs,
    r0: usize,
    out: &mut [f32],
) {
    let nsb = wrow.len() / q6k::BYTES;
    let mut acc = [_mm256_setzero_ps(); MR];
    let qbase = acts.q.as_ptr();
    let low = _mm512_set1_epi8(0x0F);
    let three = _mm512_set1_epi8(3);
    // Lane l of the scale vector for the j-th 64 weights of half h is scale 8h + 4j + l / 8.
    let idx = load_index(&Q6K_SCALE_INDEX);
    for s in 0..nsb {
        let sb = wrow.get_unchecked(s * q6k::BYTES..(s + 1) * q6k::BYTES);
        prefetch(sb.as_ptr());
        prefetch(sb.as_ptr().add(64));
        prefetch(sb.as_ptr().add(128));
        prefetch(sb.as_ptr().add(192));
        let p = sb.as_ptr();
        let d = f16_fast(sb, q6k::D);
        let sc8 = _mm_loadu_si128(p.add(q6k::SCALES) as *const __m128i);
        let sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
        let mut isum = [_mm512_setzero_si512(); MR];
        for h in 0..2 {
            let ql = _mm512_loadu_si512(p.add(q6k::QL + 64 * h) as *const _);
            let qh = _mm256_loadu_si256(p.add(q6k::QH + 32 * h) as *const __m256i);
            let qh = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2));
            let u = [
                _mm512_or_si512(
                    _mm512_and_si512(ql, low),
                    _mm512_slli_epi16(_mm512_and_si512(qh, three), 4),
                ),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16(ql, 4), low),
                    _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4), three), 4),
                ),
            ];
            let sv = [
                _mm512_permutexvar_epi16(idx[2 * h], sc16),
                _mm512_permutexvar_epi16(idx[2 * h + 1], sc16),
            ];
            for r in 0..MR {
                let xp = qbase.add((r0 + r) * acts.k + s * 256 + 128 * h);
                for j in 0..2 {
                    let x = _mm512_loadu_si512(xp.add(64 * j) as *const _);
                    isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_maddubs_epi16(u[j], x), sv[j]);
                }
            }
        }
        let scales = _mm512_castsi512_si256(sc16);
        for r in 0..MR {
            let bi = (r0 + r) * acts.k / 256 + s;
            let bs = _mm256_loadu_si256(acts.bsums.as_ptr().add(bi * 16) as *const __m256i);
            // The values are stored plus 32: take 32 * scale * sum(x) back out.
            let bias = _mm256_slli_epi32(_mm256_madd_epi16(bs, scales), 5);
            let isum = _mm256_add_epi32(
                _mm512_castsi512_si256(isum[r]),
                _mm512_extracti64x4_epi64::<1>(isum[r]),
            );
            let total = _mm256_sub_epi32(isum, bias);
            let dx = *acts.d.get_unchecked(bi);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * dx), acc[r]);
        }
    }
    for r in 0..MR {
        out[r] = hsum(acc[r]);
    }
}

#[inline(always)]
unsafe fn tile<const F: u8, const MR: usize, const VNNI: bool>(
    wrow: &[u8],
    acts: &QuantizedActs,
    r0: usize,
    out: &mut [f32],
) {
    match F {
        Q4K if VNNI => tile_q4k_512::<MR>(wrow, acts, r0, out),
        Q6K if VNNI => tile_q6k_512::<MR>(wrow, acts, r0, out),
        Q4K => tile_q4k::<MR>(wrow, acts, r0, out),
        Q6K => tile_q6k::<MR>(wrow, acts, r0, out),
        _ if VNNI => tile32_512::<F, MR>(wrow, acts, r0, out),
        _ => tile32::<F, MR, VNNI>(wrow, acts, r0, 0, out),
    }
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C; `acts` must hold rows `r0..r0 + out.len()` quantized in
/// the blocks format `F` wants, and `wrow` one weight row of the same length.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows_avx2<const F: u8>(
    wrow: &[u8],
    acts: &QuantizedActs,
    r0: usize,
    out: &mut [f32],
) {
    let mut r = 0;
    while r + 4 <= out.len() {
        tile::<F, 4, false>(wrow, acts, r0 + r, &mut out[r..r + 4]);
        r += 4;
    }
    if r + 2 <= out.len() {
        tile::<F, 2, false>(wrow, acts, r0 + r, &mut out[r..r + 2]);
        r += 2;
    }
    while r < out.len() {
        tile::<F, 1, false>(wrow, acts, r0 + r, &mut out[r..r + 1]);
        r += 1;
    }
}

/// # Safety
/// As `dot_rows_avx2`, and the CPU must have AVX-512 F, VL, BW and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot_rows_vnni<const F: u8>(
    wrow: &[u8],
    acts: &QuantizedActs,
    r0: usize,
    out: &mut [f32],
) {
    let mut r = 0;
    while r + 8 <= out.len() {
        tile::<F, 8, true>(wrow, acts, r0 + r, &mut out[r..r + 8]);
        r += 8;
    }
    if r + 4 <= out.len() {
        tile::<F, 4, true>(wrow, acts, r0 + r, &mut out[r..r + 4]);
        r += 4;
    }
    if r + 2 <= out.len() {
        tile::<F, 2, true>(wrow, acts, r0 + r, &mut out[r..r + 2]);
        r += 2;
    }
    while r < out.len() {
        tile::<F, 1, true>(wrow, acts, r0 + r, &mut out[r..r + 1]);
        r += 1;
    }
}

/// `$call` with `$code` the const parameter of the format `$f` (`Format::from_code`).
macro_rules! by_format {
    ($f:expr, $code:ident => $call:expr) => {
        match $f {
            Format::Q4_0 => {
                const $code: u8 = Q4_0;
                $call
            }
            Format::Q4_1 => {
                const $code: u8 = Q4_1;
                $call
            }
            Format::Q5_0 => {
                const $code: u8 = Q5_0;
                $call
            }
            Format::Q8_0 => {
                const $code: u8 = Q8_0;
                $call
            }
            Format::Q4K => {
                const $code: u8 = Q4K;
                $call
            }
            Format::Q6K => {
                const $code: u8 = Q6K;
                $call
            }
            Format::Mxfp4 => {
                const $code: u8 = MXFP4;
                $call
            }
        }
    };
}

/// `dot_rows_avx2` for a format given at run time.
///
/// # Safety
/// As `dot_rows_avx2` for that format.
pub(crate) unsafe fn dot_rows_avx2_of(
    f: Format,
    wrow: &[u8],
    acts: &QuantizedActs,
    r0: usize,
    out: &mut [f32],
) {
    by_format!(f, F => dot_rows_avx2::<F>(wrow, acts, r0, out))
}

/// `dot_rows_vnni` for a format given at run time.
///
/// # Safety
/// As `dot_rows_vnni` for that format.
pub(crate) unsafe fn dot_rows_vnni_of(
    f: Format,
    wrow: &[u8],
    acts: &QuantizedActs,
    r0: usize,
    out: &mut [f32],
) {
    by_format!(f, F => dot_rows_vnni::<F>(wrow, acts, r0, out))
}
