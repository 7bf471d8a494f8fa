//! AVX2 (and AVX-512 VNNI) versions of `quant::dot_rows_scalar`, chosen at run time.
//!
//! Each weight block is decoded once into registers of small integers and applied to up to `MR`
//! activation rows before the next block is read. Every row keeps its own accumulators and sees
//! exactly the same operations in the same order whatever tile it is computed in, so a row's result
//! does not depend on how many rows share the pass.

use super::quant::{q4k_scales_mins, QuantizedActs};
use std::arch::x86_64::*;

pub const Q4_0: u8 = 0;
pub const Q4_1: u8 = 1;
pub const Q5_0: u8 = 2;
pub const Q8_0: u8 = 3;
pub const Q4K: u8 = 4;
pub const Q6K: u8 = 5;

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

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
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

/// Bytes per block of a 32-element format.
const fn block_bytes(f: u8) -> usize {
    match f {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        _ => 34,
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
    let bytes = block_bytes(F);
    let nb = wrow.len() / bytes;
    let mut acc = [_mm256_setzero_ps(); MR];
    let mut macc = [0f32; MR];
    let qbase = acts.q.as_ptr();
    for b in first_block..nb {
        let blk = wrow.get_unchecked(b * bytes..(b + 1) * bytes);
        let p = blk.as_ptr();
        prefetch(p);
        let d = f16_fast(blk, 0);
        // Unsigned weights `u` (or |w| for Q8_0) and the offset per unit of activation sum.
        let w = unpack_block::<F>(p);
        let (u, signs, offset) = match F {
            Q4_0 => (w, None, -8.0 * d),
            Q4_1 => (w, None, f16_fast(blk, 2)),
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
            if F != Q8_0 {
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
    let nsb = wrow.len() / 144;
    let mut acc = [_mm256_setzero_ps(); MR];
    let qbase = acts.q.as_ptr();
    let low = _mm256_set1_epi8(0x0F);
    for s in 0..nsb {
        let sb = wrow.get_unchecked(s * 144..(s + 1) * 144);
        prefetch(sb.as_ptr());
        prefetch(sb.as_ptr().add(64));
        prefetch(sb.as_ptr().add(128));
        let (d, dmin) = (f16_fast(sb, 0), f16_fast(sb, 2));
        let (sc, m) = q4k_scales_mins(&sb[4..16]);
        let mut isum = [_mm256_setzero_si256(); MR];
        for p in 0..4 {
            let q = _mm256_loadu_si256(sb.as_ptr().add(16 + 32 * p) as *const __m256i);
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
    let nsb = wrow.len() / 210;
    let mut acc = [_mm256_setzero_ps(); MR];
    let qbase = acts.q.as_ptr();
    let low = _mm256_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    for s in 0..nsb {
        let sb = wrow.get_unchecked(s * 210..(s + 1) * 210);
        prefetch(sb.as_ptr());
        prefetch(sb.as_ptr().add(64));
        prefetch(sb.as_ptr().add(128));
        prefetch(sb.as_ptr().add(192));
        let p = sb.as_ptr();
        let d = f16_fast(sb, 208);
        let sc = |i: usize| sb[192 + i] as i8 as i16;
        let mut isum = [_mm256_setzero_si256(); MR];
        for chunk in 0..8 {
            let (half, quarter) = (chunk / 4, chunk % 4);
            let ql = _mm256_loadu_si256(p.add(64 * half + 32 * (quarter & 1)) as *const __m256i);
            let lo = if quarter < 2 {
                ql
            } else {
                _mm256_srli_epi16(ql, 4)
            };
            let qh = _mm256_loadu_si256(p.add(128 + 32 * half) as *const __m256i);
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

/// The 64 unsigned weights (or |w| for Q8_0) of blocks at `p` and `p + bytes`, and for Q8_0 the
/// signs as a mask.
#[inline(always)]
unsafe fn unpack_pair<const F: u8>(p: *const u8, bytes: usize) -> (__m512i, __mmask64) {
    let w = _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(unpack_block::<F>(p)),
        unpack_block::<F>(p.add(bytes)),
    );
    if F == Q8_0 {
        (_mm512_abs_epi8(w), _mm512_movepi8_mask(w))
    } else {
        (w, 0)
    }
}

/// The 32 weights of the block at `p` as bytes (unsigned, or signed for Q8_0).
#[inline(always)]
unsafe fn unpack_block<const F: u8>(p: *const u8) -> __m256i {
    match F {
        Q4_0 => nibbles_16(p.add(2)),
        Q4_1 => nibbles_16(p.add(4)),
        Q5_0 => {
            let qh = u32::from_le_bytes(*(p.add(2) as *const [u8; 4]));
            let hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles_16(p.add(6)), hi)
        }
        _ => _mm256_loadu_si256(p.add(2) as *const __m256i),
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
    let bytes = block_bytes(F);
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
            let wd = spread_f16(p, bytes);
            // Offset per unit of activation sum, one per block (lanes 0 and 8).
            let off = match F {
                Q4_0 => _mm512_mul_ps(wd, _mm512_set1_ps(-8.0)),
                Q4_1 => spread_f16(p.add(2), bytes),
                Q5_0 => _mm512_mul_ps(wd, _mm512_set1_ps(-16.0)),
                _ => _mm512_setzero_ps(),
            };
            if F != Q8_0 {
                _mm512_mask_compressstoreu_ps(
                    offs.as_mut_ptr().add(b - run_start) as *mut _,
                    0x0101,
                    off,
                );
            }
            for r in 0..MR {
                let bi = (r0 + r) * acts.k / 32 + b;
                let mut x = _mm512_loadu_si512(qbase.add(bi * 32) as *const _);
                if F == Q8_0 {
                    x = _mm512_mask_sub_epi8(x, signs, _mm512_setzero_si512(), x);
                }
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x);
                let scale = _mm512_mul_ps(wd, _mm512_loadu_ps(sd.add(bi * 8)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
            }
            b += 2;
        }
        if F != Q8_0 {
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
    let nsb = wrow.len() / 144;
    let mut acc = [_mm512_setzero_ps(); MR];
    let mut macc = [_mm256_setzero_ps(); MR];
    let qbase = acts.q.as_ptr();
    let low = _mm512_set1_epi8(0x0F);
    // Lane l of the scale vector for the j-th 64 weights of half h is scale 4h + 2j + l / 16.
    let idx = load_index(&Q4K_SCALE_INDEX);
    for s in 0..nsb {
        let sb = wrow.get_unchecked(s * 144..(s + 1) * 144);
        prefetch(sb.as_ptr());
        prefetch(sb.as_ptr().add(64));
        prefetch(sb.as_ptr().add(128));
        let (d, dmin) = (f16_fast(sb, 0), f16_fast(sb, 2));
        let (sc, m) = q4k_scales_mins(&sb[4..16]);
        let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(
            sc.as_ptr() as *const __m128i
        )));
        let mut isum = [_mm512_setzero_si512(); MR];
        for h in 0..2 {
            let q = _mm512_loadu_si512(sb.as_ptr().add(16 + 64 * h) as *const _);
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
    let nsb = wrow.len() / 210;
    let mut acc = [_mm256_setzero_ps(); MR];
    let qbase = acts.q.as_ptr();
    let low = _mm512_set1_epi8(0x0F);
    let three = _mm512_set1_epi8(3);
    // Lane l of the scale vector for the j-th 64 weights of half h is scale 8h + 4j + l / 8.
    let idx = load_index(&Q6K_SCALE_INDEX);
    for s in 0..nsb {
        let sb = wrow.get_unchecked(s * 210..(s + 1) * 210);
        prefetch(sb.as_ptr());
        prefetch(sb.as_ptr().add(64));
        prefetch(sb.as_ptr().add(128));
        prefetch(sb.as_ptr().add(192));
        let p = sb.as_ptr();
        let d = f16_fast(sb, 208);
        let sc8 = _mm_loadu_si128(p.add(192) as *const __m128i);
        let sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
        let mut isum = [_mm512_setzero_si512(); MR];
        for h in 0..2 {
            let ql = _mm512_loadu_si512(p.add(64 * h) as *const _);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
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
pub unsafe fn dot_rows_avx2<const F: u8>(
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
pub unsafe fn dot_rows_vnni<const F: u8>(
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

/// # Safety
/// The CPU must have AVX2 and FMA; `a` and `b` have the same length.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
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

/// Scores of query `pq` against the `8 V` positions whose transposed keys start at `pk` (row `i`
/// at `pk + i * ks`), scaled, to `sc`: one fused multiply-add chain per lane over the dimensions.
#[inline(always)]
unsafe fn scores_avx2<const V: usize>(
    pq: *const f32,
    pk: *const f32,
    ks: usize,
    hd: usize,
    sc: *mut f32,
    scale: __m256,
) {
    let mut acc = [_mm256_setzero_ps(); V];
    for i in 0..hd {
        let qi = _mm256_set1_ps(*pq.add(i));
        let k = pk.add(i * ks);
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k.add(8 * j)), *a);
        }
    }
    for (j, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(sc.add(8 * j), _mm256_mul_ps(*a, scale));
    }
}

/// `kernels::attend` for head sizes that are a multiple of 8. Scores go eight positions at a
/// time down the transposed keys (one broadcast query element per row of keys, no horizontal
/// sums); the value sum keeps up to 64 output floats of a head in registers while it walks the
/// positions.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `hd % 8 == 0`; the bounds are those `kernels::attend` checks.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn attend_avx2(
    q: &[f32],
    kv: super::KvHead<'_>,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let super::KvHead {
        keys,
        values,
        key_stride: ks,
        value_stride: stride,
        hd,
        len,
    } = kv;
    let group = q.len() / hd;
    let (pk, pv) = (keys.as_ptr(), values.as_ptr());
    let vscale = _mm256_set1_ps(scale);
    for g in 0..group {
        let pq = q.as_ptr().add(g * hd);
        let sc = scores.as_mut_ptr().add(g * len);
        // Each score is one fused multiply-add chain over the dimensions, in order, in its own
        // lane (or in the scalar tail): the same arithmetic wherever the position falls.
        let mut t = 0;
        while t + 32 <= len {
            scores_avx2::<4>(pq, pk.add(t), ks, hd, sc.add(t), vscale);
            t += 32;
        }
        while t + 8 <= len {
            scores_avx2::<1>(pq, pk.add(t), ks, hd, sc.add(t), vscale);
            t += 8;
        }
        while t < len {
            let mut acc = 0f32;
            for i in 0..hd {
                acc = (*pq.add(i)).mul_add(*pk.add(i * ks + t), acc);
            }
            *sc.add(t) = acc * scale;
            t += 1;
        }
        super::softmax(&mut scores[g * len..(g + 1) * len]);
        let sc = scores.as_ptr().add(g * len);
        let po = out.as_mut_ptr().add(g * hd);
        for i0 in (0..hd).step_by(64) {
            let width = (hd - i0).min(64) / 8;
            let mut acc = [_mm256_setzero_ps(); 8];
            for t in 0..len {
                let w = _mm256_set1_ps(*sc.add(t));
                let v = pv.add(t * stride + i0);
                for (c, a) in acc.iter_mut().enumerate().take(width) {
                    *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(v.add(8 * c)), *a);
                }
            }
            for (c, a) in acc.iter().enumerate().take(width) {
                _mm256_storeu_ps(po.add(i0 + 8 * c), *a);
            }
        }
    }
}

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
unsafe fn nibble_step<const MR: usize>(
    a: &mut [__m512i; MR],
    a2: &mut [__m512i; MR],
    lo: __m512i,
    hi: __m512i,
    x: *const i8,
    k: usize,
) {
    for r in 0..MR {
        let xp = x.add(r * k);
        a[r] = _mm512_dpbusd_epi32(a[r], lo, bcast4(xp));
        if split_chains::<MR>() {
            a2[r] = _mm512_dpbusd_epi32(a2[r], hi, bcast4(xp.add(4)));
        } else {
            a[r] = _mm512_dpbusd_epi32(a[r], hi, bcast4(xp.add(4)));
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
unsafe fn packed_q4k<const MR: usize>(
    group: &[u8],
    nsb: usize,
    acts: &QuantizedActs,
    r0: usize,
    out: *mut f32,
    stride: usize,
) {
    use super::packed::{Q4K_BYTES, Q4K_MINS, Q4K_QS, Q4K_SCALES};
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); MR];
    let q = acts.q.as_ptr();
    let k = acts.k;
    for s in 0..nsb {
        let blk = group.as_ptr().add(s * Q4K_BYTES);
        let d = f16x16(blk);
        let dmin = f16x16(blk.add(32));
        let mut sbacc = [_mm512_setzero_ps(); MR];
        for j in 0..8 {
            let qs = blk.add(Q4K_QS + 256 * j);
            // The next super-block, spread over this one's eight steps (37 lines).
            prefetch_lines(blk.wrapping_add(Q4K_BYTES + 320 * j), 5);
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                blk.add(Q4K_SCALES + 16 * j) as *const __m128i,
            )));
            let mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                blk.add(Q4K_MINS + 16 * j) as *const __m128i,
            )));
            let mut a = [_mm512_setzero_si512(); MR];
            let mut a2 = [_mm512_setzero_si512(); MR];
            for u in 0..4 {
                let v = _mm512_loadu_si512(qs.add(64 * u) as *const _);
                let lo = _mm512_and_si512(v, low);
                let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                let x = q.add(r0 * k + s * 256 + 32 * j + 8 * u);
                nibble_step::<MR>(&mut a, &mut a2, lo, hi, x, k);
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
unsafe fn packed_q6k<const MR: usize>(
    group: &[u8],
    nsb: usize,
    acts: &QuantizedActs,
    r0: usize,
    out: *mut f32,
    stride: usize,
) {
    use super::packed::{Q6K_BYTES, Q6K_QH, Q6K_QL, Q6K_SCALES};
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); MR];
    let q = acts.q.as_ptr();
    let k = acts.k;
    for s in 0..nsb {
        let blk = group.as_ptr().add(s * Q6K_BYTES);
        let d = f16x16(blk);
        let mut sbacc = [_mm512_setzero_ps(); MR];
        for t in 0..16 {
            let ql = blk.add(Q6K_QL + 128 * t);
            // The next super-block, spread over this one's sixteen steps (53 lines).
            prefetch_lines(blk.wrapping_add(Q6K_BYTES + 256 * t), 4);
            let h = _mm512_loadu_si512(blk.add(Q6K_QH + 64 * t) as *const _);
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                blk.add(Q6K_SCALES + 16 * t) as *const __m128i,
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
                nibble_step::<MR>(&mut a, &mut a2, lo, hi, x, k);
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
unsafe fn packed32<const F: u8, const MR: usize>(
    group: &[u8],
    units: usize,
    acts: &QuantizedActs,
    r0: usize,
    out: *mut f32,
    stride: usize,
) {
    use super::packed::{Packed, Q41_MINS, Q50_HIGH};
    let format = match F {
        Q4_0 => super::quant::Format::Q4_0,
        Q4_1 => super::quant::Format::Q4_1,
        Q5_0 => super::quant::Format::Q5_0,
        _ => super::quant::Format::Q8_0,
    };
    let bytes = Packed::block_bytes(format);
    let values = Packed::values_at(format);
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
            let dw = f16x16(blk.add(32 * h));
            let off = match F {
                Q4_0 => _mm512_mul_ps(dw, _mm512_set1_ps(-8.0)),
                Q4_1 => f16x16(blk.add(Q41_MINS + 32 * h)),
                Q5_0 => _mm512_mul_ps(dw, _mm512_set1_ps(-16.0)),
                _ => _mm512_setzero_ps(),
            };
            let mut a = [_mm512_setzero_si512(); MR];
            let mut a2 = [_mm512_setzero_si512(); MR];
            let x0 = 64 * s + 32 * h;
            if F == Q8_0 {
                for u in 0..8 {
                    let w = _mm512_loadu_si512(blk.add(values + 512 * h + 64 * u) as *const _);
                    for r in 0..MR {
                        let xp = q.add((r0 + r) * k + x0 + 4 * u);
                        if split_chains::<MR>() && u % 2 == 1 {
                            a2[r] = _mm512_dpbusd_epi32(a2[r], w, bcast4(xp));
                        } else {
                            a[r] = _mm512_dpbusd_epi32(a[r], w, bcast4(xp));
                        }
                    }
                }
            } else {
                let high = if F == Q5_0 {
                    _mm512_loadu_si512(blk.add(Q50_HIGH + 64 * h) as *const _)
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
                    nibble_step::<MR>(&mut a, &mut a2, lo, hi, x, k);
                }
            }
            for r in 0..MR {
                let bi = ((r0 + r) * k + x0) / 32;
                let mut sum = chain_sum::<MR>(&a, &a2, r);
                if F == Q8_0 {
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
unsafe fn packed_tile<const MR: usize>(
    p: &super::packed::Packed,
    g: usize,
    acts: &QuantizedActs,
    r0: usize,
    out: *mut f32,
    stride: usize,
) {
    use super::quant::Format;
    let group = p.group(g);
    let n = p.units();
    match p.format {
        Format::Q4K => packed_q4k::<MR>(group, n, acts, r0, out, stride),
        Format::Q6K => packed_q6k::<MR>(group, n, acts, r0, out, stride),
        Format::Q4_0 => packed32::<Q4_0, MR>(group, n, acts, r0, out, stride),
        Format::Q4_1 => packed32::<Q4_1, MR>(group, n, acts, r0, out, stride),
        Format::Q5_0 => packed32::<Q5_0, MR>(group, n, acts, r0, out, stride),
        Format::Q8_0 => packed32::<Q8_0, MR>(group, n, acts, r0, out, stride),
    }
}

/// The sixteen rows of group `g` of a packed matrix against activation rows `r0..r0 + m`: row
/// `r0 + r`'s results go to `out[r * stride..][..16]`. Up to eight activation rows share each pass
/// over the group's weights; every row sees the same operations whatever tile it is in.
///
/// # Safety
/// The CPU must have AVX-512 F, VL, BW and VNNI (and AVX2, FMA, F16C); `acts` holds rows
/// `r0..r0 + m` quantized over `p.cols` columns in the blocks the format wants; `out` is valid for writes of
/// `(m - 1) * stride + 16` floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub unsafe fn packed_rows(
    p: &super::packed::Packed,
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
            8 => packed_tile::<8>(p, g, acts, r0 + r, o, stride),
            7 => packed_tile::<7>(p, g, acts, r0 + r, o, stride),
            6 => packed_tile::<6>(p, g, acts, r0 + r, o, stride),
            5 => packed_tile::<5>(p, g, acts, r0 + r, o, stride),
            4 => packed_tile::<4>(p, g, acts, r0 + r, o, stride),
            3 => packed_tile::<3>(p, g, acts, r0 + r, o, stride),
            2 => packed_tile::<2>(p, g, acts, r0 + r, o, stride),
            _ => packed_tile::<1>(p, g, acts, r0 + r, o, stride),
        }
        r += n;
    }
}

/// Quantizes one block of activations to 8 bits: returns the scale `amax / 127` and writes
/// `round_ties_even(x / scale)` to `qs`, exactly as the plain version does (same product, same
/// rounding). `xs.len()` is a multiple of 32.
///
/// # Safety
/// The CPU must have AVX2; `qs.len() == xs.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn quantize_block_avx2(xs: &[f32], qs: &mut [i8]) -> f32 {
    let n = xs.len();
    let p = xs.as_ptr();
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut m = _mm256_setzero_ps();
    for i in (0..n).step_by(8) {
        m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(p.add(i)), abs));
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    let d = _mm_cvtss_f32(m) / 127.0;
    let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    // packs interleave 128-bit lanes; this puts the 32 bytes back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for i in (0..n).step_by(32) {
        // `cvtps` rounds to nearest even (the default rounding mode).
        let v = |o: usize| _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(i + o)), id));
        let (a, b, c, e) = (v(0), v(8), v(16), v(24));
        let w = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, e));
        let w = _mm256_permutevar8x32_epi32(w, order);
        _mm256_storeu_si256(qs.as_mut_ptr().add(i) as *mut __m256i, w);
    }
    d
}

/// e^x for eight floats: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor series to degree
/// 7 (truncation below 1e-8 relative), times 2^n. Inputs are clamped to [-87, 88], where 2^n is a
/// normal float; below that the result is about 1.6e-38 instead of smaller.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
        _mm256_set1_ps(88.0),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // ln 2 in two parts, so that n * LN2_HI is exact.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
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

/// `kernels::softmax` with `exp8`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax_avx2(x: &mut [f32]) {
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

/// `kernels::swiglu` with `exp8`: `gate = gate / (1 + e^-gate) * up`.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `up.len() >= gate.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
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
    super::swiglu_scalar(&mut gate[i..], &up[i..n]);
}

/// Positions per block of the AVX-512 attention: four vectors of scores, and the keys and values
/// of a block (`hd` x 64 floats each) stay in L1 while every query of the job uses them.
const ATT_BLOCK: usize = 64;

/// Scores of `Q` queries (element `i` of query `j` at `qs[j] + i`) against positions
/// `t0..t0 + 64` of the transposed keys at `pk` (row `i` at `pk + i * ks`), scaled, to
/// `outs[j] + t0..`; lanes whose mask bit is clear are neither read nor written. Each score is one
/// fused multiply-add chain over the dimensions in order, whatever else shares the tile.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_tile<const Q: usize>(
    qs: &[*const f32],
    outs: &[*mut f32],
    pk: *const f32,
    ks: usize,
    hd: usize,
    t0: usize,
    masks: [__mmask16; 4],
    scale: __m512,
) {
    let mut acc = [[_mm512_setzero_ps(); 4]; Q];
    for i in 0..hd {
        let k = pk.add(i * ks + t0);
        let kv = [
            _mm512_maskz_loadu_ps(masks[0], k),
            _mm512_maskz_loadu_ps(masks[1], k.add(16)),
            _mm512_maskz_loadu_ps(masks[2], k.add(32)),
            _mm512_maskz_loadu_ps(masks[3], k.add(48)),
        ];
        for (j, a) in acc.iter_mut().enumerate() {
            let qi = _mm512_set1_ps(*qs[j].add(i));
            for (p, a) in a.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(qi, kv[p], *a);
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        for (p, a) in a.iter().enumerate() {
            _mm512_mask_storeu_ps(outs[j].add(t0 + 16 * p), masks[p], _mm512_mul_ps(*a, scale));
        }
    }
}

/// Adds `sum_t w[j][t] * value_t[i0..i0 + 16 W]` over `t0..t1` to `outs[j] + i0..` for `Q`
/// queries (weights of query `j` at `ws[j]`; value `t` at `pv + t * stride`); `first` starts the
/// sums from zero instead of reading them. Each output lane is one multiply-add chain over the
/// positions in order, whatever else shares the tile.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values_tile<const Q: usize, const W: usize>(
    ws: &[*const f32],
    outs: &[*mut f32],
    pv: *const f32,
    stride: usize,
    i0: usize,
    t0: usize,
    t1: usize,
    first: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); W]; Q];
    if !first {
        for (j, a) in acc.iter_mut().enumerate() {
            for (c, a) in a.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(outs[j].add(i0 + 16 * c));
            }
        }
    }
    for t in t0..t1 {
        let v = pv.add(t * stride + i0);
        let mut w = [_mm512_setzero_ps(); Q];
        for (j, w) in w.iter_mut().enumerate() {
            *w = _mm512_set1_ps(*ws[j].add(t));
        }
        for c in 0..W {
            let x = _mm512_loadu_ps(v.add(16 * c));
            for j in 0..Q {
                acc[j][c] = _mm512_fmadd_ps(w[j], x, acc[j][c]);
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        for (c, a) in a.iter().enumerate() {
            _mm512_storeu_ps(outs[j].add(i0 + 16 * c), *a);
        }
    }
}

/// `values_tile` for `q.len()` (1..=6) queries, `W` vectors wide.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values_tiles<const W: usize>(
    ws: &[*const f32],
    outs: &[*mut f32],
    pv: *const f32,
    stride: usize,
    i0: usize,
    t0: usize,
    t1: usize,
    first: bool,
) {
    // Up to 24 accumulators: three queries of 128 floats, six of 64 or less.
    let most = if W > 4 { 3 } else { 6 };
    for j0 in (0..ws.len()).step_by(most) {
        let j1 = (j0 + most).min(ws.len());
        let (w, o) = (&ws[j0..j1], &outs[j0..j1]);
        match j1 - j0 {
            1 => values_tile::<1, W>(w, o, pv, stride, i0, t0, t1, first),
            2 => values_tile::<2, W>(w, o, pv, stride, i0, t0, t1, first),
            3 => values_tile::<3, W>(w, o, pv, stride, i0, t0, t1, first),
            4 => values_tile::<4, W>(w, o, pv, stride, i0, t0, t1, first),
            5 => values_tile::<5, W>(w, o, pv, stride, i0, t0, t1, first),
            _ => values_tile::<6, W>(w, o, pv, stride, i0, t0, t1, first),
        }
    }
}

/// `kernels::attend_rows` with 512-bit registers, for head sizes that are a multiple of 16: a
/// small matrix product in blocks of 64 positions. Scores: tiles of up to six queries (of any
/// rows) times 64 positions, 24 accumulators, each row of transposed keys loaded once per tile
/// and each query element broadcast. Values: tiles of up to six query heads of a row times up to
/// 128 output floats, each value loaded once per tile. Every score and output is the same chain
/// of operations whatever shares the call, so a row's result does not depend on the batch.
///
/// # Safety
/// The CPU must have AVX-512 F (and AVX2, FMA); `hd % 16 == 0`; the bounds are those
/// `kernels::attend_rows` checks.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
pub unsafe fn attend_rows_avx512(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    kv: super::KvHead<'_>,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let super::KvHead {
        keys,
        values,
        key_stride: ks,
        value_stride: stride,
        hd,
        len,
    } = kv;
    let gw = out.len() / rows;
    let group = gw / hd;
    let nq = rows * group;
    let row_len = |r: usize| len - (rows - 1 - r);
    let (pk, pv) = (keys.as_ptr(), values.as_ptr());
    let vscale = _mm512_set1_ps(scale);
    // Query `j` is head `j % group` of row `j / group`; its scores take `len` floats at
    // `scores[j * len..]` (a row with fewer positions leaves the end of its scores unused).
    let sp = scores.as_mut_ptr();
    for t0 in (0..len).step_by(ATT_BLOCK) {
        let lanes = |p: usize| -> __mmask16 {
            let n = len.saturating_sub(t0 + 16 * p).min(16);
            ((1u32 << n) - 1) as __mmask16
        };
        let masks = [lanes(0), lanes(1), lanes(2), lanes(3)];
        for j0 in (0..nq).step_by(6) {
            let j1 = (j0 + 6).min(nq);
            // Past the last position any query of the tile sees (the tile's last row sees most).
            if t0 >= row_len((j1 - 1) / group) {
                continue;
            }
            let mut qs = [std::ptr::null::<f32>(); 6];
            let mut os = [std::ptr::null_mut::<f32>(); 6];
            for j in j0..j1 {
                qs[j - j0] = q.as_ptr().add((j / group) * q_stride + (j % group) * hd);
                os[j - j0] = sp.add(j * len);
            }
            let (qs, os) = (&qs[..j1 - j0], &os[..j1 - j0]);
            match j1 - j0 {
                1 => scores_tile::<1>(qs, os, pk, ks, hd, t0, masks, vscale),
                2 => scores_tile::<2>(qs, os, pk, ks, hd, t0, masks, vscale),
                3 => scores_tile::<3>(qs, os, pk, ks, hd, t0, masks, vscale),
                4 => scores_tile::<4>(qs, os, pk, ks, hd, t0, masks, vscale),
                5 => scores_tile::<5>(qs, os, pk, ks, hd, t0, masks, vscale),
                _ => scores_tile::<6>(qs, os, pk, ks, hd, t0, masks, vscale),
            }
        }
    }
    for j in 0..nq {
        let n = row_len(j / group);
        super::softmax(&mut scores[j * len..j * len + n]);
    }
    // Values, in blocks of positions; the partial sums wait in `out` between blocks.
    let sp = scores.as_ptr();
    let po = out.as_mut_ptr();
    for t0 in (0..len).step_by(ATT_BLOCK) {
        for r in 0..rows {
            let t1 = (t0 + ATT_BLOCK).min(row_len(r));
            if t0 >= t1 {
                continue;
            }
            let first = t0 == 0;
            for g0 in (0..group).step_by(6) {
                let g1 = (g0 + 6).min(group);
                let mut ws = [std::ptr::null::<f32>(); 6];
                let mut os = [std::ptr::null_mut::<f32>(); 6];
                for g in g0..g1 {
                    ws[g - g0] = sp.add((r * group + g) * len);
                    os[g - g0] = po.add(r * gw + g * hd);
                }
                let (ws, os) = (&ws[..g1 - g0], &os[..g1 - g0]);
                let mut i0 = 0;
                while i0 < hd {
                    let w = (hd - i0) / 16;
                    if w >= 8 {
                        values_tiles::<8>(ws, os, pv, stride, i0, t0, t1, first);
                        i0 += 128;
                    } else if w >= 4 {
                        values_tiles::<4>(ws, os, pv, stride, i0, t0, t1, first);
                        i0 += 64;
                    } else if w >= 2 {
                        values_tiles::<2>(ws, os, pv, stride, i0, t0, t1, first);
                        i0 += 32;
                    } else {
                        values_tiles::<1>(ws, os, pv, stride, i0, t0, t1, first);
                        i0 += 16;
                    }
                }
            }
        }
    }
}
