//! The products of prompt rows on AMX bf16 tiles: the Amx class's prefill arithmetic.
//!
//! Generated rows (decoding, verifying drafts) keep the packed integer kernels, whose result
//! for a row never depends on the pass; prompt rows take this arithmetic in every pass they are
//! in, however many rows it has, so a prompt's keys and values depend only on its tokens.
//!
//! - Weights: a K-quant matrix's packed copy (Q4_K or Q6_K, `kernels::packed`) is decoded, one
//!   strip of 32 weight rows and one block of columns at a time, into `tdpbf16ps`'s B tiles (per
//!   tile row, two consecutive columns of each of sixteen weight rows), each value
//!   `d * scale * q - dmin * min` (Q6_K: `d * scale * (q - 32)`) computed in f32 with one
//!   rounding and then rounded to bf16. Every tile of activation rows then reads the strip.
//! - Activations: rounded once per product to bf16 (`to_tiles`), laid out in tile order.
//! - Sums: f32 in the tiles over all columns, in column order, with no finishing per block. Between
//!   blocks of columns the sums wait in the output and are loaded again, exactly, so a row's
//!   result depends on the row alone, never on the other rows of its pass.

use super::amx::{load_config, release, Config};
use super::packed::q6_values;
use super::tile_steps::{load2, step1, step2, sums_in, sums_out, Sums};
use super::width::{Width, Zmm};
use crate::kernels::format::{q4k, q6k, Format, PACKED_D};
use crate::kernels::packed::{Packed, ROWS};
use std::arch::asm;
use std::arch::x86_64::*;

/// Weight rows per strip: two B tiles.
pub(crate) const STRIP: usize = 2 * ROWS;

/// Columns per tile step (a tile row of 32 bf16).
const STEP: usize = 32;

/// Bytes of activation tiles a block of columns keeps in L2 across the strips of a work item.
const ACT_BLOCK_BYTES: usize = 3 << 19;

/// 64 bytes: one tile row.
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
pub(crate) struct Line([u16; 32]);

/// Every tile here is sixteen rows of 64 bytes: tmm0-3 sums, tmm4-5 activations, tmm6-7
/// weights.
static TILES: Config = Config::new(64);

/// Activation rows `r0..r0 + 16` of `x` (`k` columns, a multiple of 32; rows past `m` zero)
/// rounded to bf16 into their tile of rows `out` (`k / 32` tiles of 16 lines): line
/// `c * 16 + r % 16` holds row `r`'s columns `32c..32c + 32`.
///
/// # Safety
/// The CPU has AVX-512 F, BW and BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(crate) unsafe fn to_tiles(x: &[f32], m: usize, k: usize, r0: usize, out: &mut [Line]) {
    let steps = k / STEP;
    assert!(out.len() == steps * ROWS && x.len() >= m * k && r0 < m.next_multiple_of(ROWS));
    for i in 0..ROWS {
        let r = r0 + i;
        if r >= m {
            out.iter_mut()
                .skip(i)
                .step_by(ROWS)
                .for_each(|l| *l = Line::default());
            continue;
        }
        let row = x.as_ptr().add(r * k);
        for c in 0..steps {
            to_line(row.add(STEP * c), out.as_mut_ptr().add(c * ROWS + i));
        }
    }
}

/// 32 floats at `x` rounded to bf16 (to nearest, ties to even) into the tile row `line`: every
/// activation that reaches a tile goes through here, whoever made it.
///
/// # Safety
/// The CPU has AVX-512 F and BF16; `x` holds 32 floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(crate) unsafe fn to_line(x: *const f32, line: *mut Line) {
    let a = _mm512_loadu_ps(x);
    let b = _mm512_loadu_ps(x.add(16));
    let pair: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
    _mm512_store_si512(line as *mut _, pair);
}

/// The bytes of `x` for two tile rows: 128-bit lane 0 the first two bytes of each of lanes 0-7's
/// four, lane 1 those of lanes 8-15, lanes 2 and 3 the last two.
const PAIR_BYTES: [u8; 64] = {
    let mut idx = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let (quarter, j) = (i / 16, i % 16);
        let lane = (quarter % 2) * 8 + j / 2;
        idx[i] = (4 * lane + (quarter / 2) * 2 + j % 2) as u8;
        i += 1;
    }
    idx
};

/// Lane `i / 2` of a vector, for the even and odd places of the first sixteen (`DUP_LO`) and
/// the last (`DUP_HI`).
const DUP_LO: [i32; 16] = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7];
const DUP_HI: [i32; 16] = [8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15];

/// A sub-block's scale and offset per weight row, each lane's twice (for a tile row's pairs).
struct Affine {
    s: [__m512; 2],
    o: [__m512; 2],
}

#[inline(always)]
unsafe fn affine(s: __m512, o: __m512) -> Affine {
    let lo = _mm512_loadu_si512(DUP_LO.as_ptr() as *const _);
    let hi = _mm512_loadu_si512(DUP_HI.as_ptr() as *const _);
    Affine {
        s: [_mm512_permutexvar_ps(lo, s), _mm512_permutexvar_ps(hi, s)],
        o: [_mm512_permutexvar_ps(lo, o), _mm512_permutexvar_ps(hi, o)],
    }
}

/// Two B tile rows at `out` from 64 bytes `x` holding four consecutive columns of each of
/// sixteen weight rows (lane `l`: bytes `4l..4l + 4`, small unsigned integers): the first gets
/// columns 0 and 1 of each row, the second columns 2 and 3, each value `s * x + o` of its row
/// rounded to bf16.
#[inline(always)]
unsafe fn put_pairs(x: __m512i, a: &Affine, out: *mut Line) {
    let p = _mm512_permutexvar_epi8(_mm512_loadu_si512(PAIR_BYTES.as_ptr() as *const _), x);
    let q = |v: __m128i, h: usize| {
        let f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
        _mm512_fmadd_ps(f, a.s[h], a.o[h])
    };
    let (l0, l1) = (_mm512_castsi512_si128(p), _mm512_extracti32x4_epi32::<1>(p));
    let (l2, l3) = (
        _mm512_extracti32x4_epi32::<2>(p),
        _mm512_extracti32x4_epi32::<3>(p),
    );
    let r0: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(q(l1, 1), q(l0, 0)));
    let r1: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(q(l3, 1), q(l2, 0)));
    _mm512_store_si512(out as *mut _, r0);
    _mm512_store_si512(out.add(1) as *mut _, r1);
}

/// B tile `j` (columns `32j..32j + 32`) of Q4_K unit `blk` (256 columns of sixteen rows) at
/// `tile`: sub-block `j`.
#[inline(always)]
unsafe fn decode_q4k(blk: *const u8, j: usize, tile: *mut Line) {
    let low = Zmm::bytes(0x0F);
    let d = Zmm::f16s(blk.add(PACKED_D));
    let dmin = Zmm::f16s(blk.add(q4k::PACKED_DMIN));
    let sc = Zmm::cvt(Zmm::u8s_i32(blk.add(q4k::PACKED_SCALES + 16 * j)));
    let mn = Zmm::cvt(Zmm::u8s_i32(blk.add(q4k::PACKED_MINS + 16 * j)));
    let a = affine(
        _mm512_mul_ps(d, sc),
        _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, mn)),
    );
    for u in 0..4 {
        let v = Zmm::load(blk.add(q4k::PACKED_QS + 64 * (4 * j + u)));
        put_pairs(Zmm::and(v, low), &a, tile.add(4 * u));
        put_pairs(Zmm::and(Zmm::shr16::<4>(v), low), &a, tile.add(4 * u + 2));
    }
}

/// B tile `j` of Q6_K unit `blk` at `tile`: sub-blocks `2j` and `2j + 1` (16 columns each).
#[inline(always)]
unsafe fn decode_q6k(blk: *const u8, j: usize, tile: *mut Line) {
    let d = Zmm::f16s(blk.add(PACKED_D));
    for t in 2 * j..2 * j + 2 {
        let s = _mm512_mul_ps(
            d,
            Zmm::cvt(Zmm::i8s_i32(blk.add(q6k::PACKED_SCALES + 16 * t))),
        );
        let a = affine(s, _mm512_mul_ps(s, _mm512_set1_ps(-32.0)));
        let h = Zmm::load(blk.add(q6k::PACKED_QH + 64 * t));
        let ql = blk.add(q6k::PACKED_QL + 128 * t);
        // Sub-block t is the tile's rows 8 (t % 2) .. 8 (t % 2) + 8.
        let rows = tile.add(8 * (t % 2));
        for u in 0..2 {
            let (lo, hi) = q6_values::<Zmm>(Zmm::load(ql.add(64 * u)), h, u);
            put_pairs(lo, &a, rows.add(4 * u));
            put_pairs(hi, &a, rows.add(4 * u + 2));
        }
    }
}

/// The decoding of one strip's block of columns (units `u0..u1` of groups `g` and `g + 1`) into
/// `w`, a B tile at a time, so that it can be spread between the tile products of the strip
/// before it: the B tiles of column step `c` (from `u0`) go to `w + 32c` (group `g`'s) and
/// `w + 32c + 16` (group `g + 1`'s).
struct StripDecode {
    g: usize,
    u0: usize,
    units: usize,
    w: *mut Line,
    /// B tiles decoded so far, of `2 * 8 * units`.
    done: usize,
}

impl StripDecode {
    fn new(g: usize, (u0, u1): (usize, usize), w: *mut Line) -> Self {
        StripDecode {
            g,
            u0,
            units: u1 - u0,
            w,
            done: 0,
        }
    }

    fn tiles(&self) -> usize {
        16 * self.units
    }

    /// Decodes the next `n` B tiles (fewer at the end).
    #[inline(always)]
    unsafe fn advance(&mut self, p: &Packed, n: usize) {
        let bytes = p.format.packed_bytes();
        let end = self.done.saturating_add(n).min(self.tiles());
        while self.done < end {
            let i = self.done;
            let (half, u, j) = (i / (8 * self.units), i / 8 % self.units, i % 8);
            let blk = p.group(self.g + half).as_ptr().add((self.u0 + u) * bytes);
            let tile = self.w.add(2 * ROWS * (8 * u + j) + ROWS * half);
            match p.format {
                Format::Q4K => decode_q4k(blk, j, tile),
                _ => decode_q6k(blk, j, tile),
            }
            self.done += 1;
        }
    }

    #[inline(always)]
    unsafe fn finish(&mut self, p: &Packed) {
        self.advance(p, usize::MAX);
    }
}

/// Weight rows `32 s0..32 s1` of `p` against activation rows `0..m` (`acts`, from `to_tiles`
/// over `p.cols` columns): row `r`'s sums for weight row `32 s0 + j` to `out[r * n + j]`. `w` and
/// `tail` are the call's scratch.
///
/// Blocks of columns whose activation tiles fit in L2 go one after another; within one, each
/// strip's weights are decoded, then every tile of rows goes over them, its sums loaded from and
/// stored to the output between blocks.
///
/// # Safety
/// The CPU has AMX-BF16 (with the tile permission), AVX-512 F, BW, BF16 and VBMI; `p` is Q4_K or
/// Q6_K with `2 s1` groups at most; `acts` holds `m` rows over `p.cols` columns in tile order;
/// `out` is valid for writes of `m * n` floats, `n >= 32 (s1 - s0)`, and columns
/// `0..32 (s1 - s0)` of every row belong to this call alone.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512bf16,avx512vl,f16c,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn products(
    p: &Packed,
    (s0, s1): (usize, usize),
    acts: &[Line],
    m: usize,
    out: *mut f32,
    n: usize,
    w: &mut Vec<Line>,
    tail: &mut Vec<f32>,
) {
    let format = p.format;
    let steps = p.cols / STEP;
    let unit_steps = format.unit_cols() / STEP;
    let units = p.units();
    let tiles = m.div_ceil(ROWS);
    // Units per block of columns: the block's activation tiles stay in L2 across the strips.
    let per_unit = tiles * ROWS * format.unit_cols() * 2;
    let block = (ACT_BLOCK_BYTES / per_unit).clamp(1, units);
    // Two strips' blocks of B tiles: the one the products read and the next, decoded between them.
    let half = block * unit_steps * 2 * ROWS;
    // Every line the products read is decoded first, and the side buffer's rows are stored
    // before they are read: neither needs clearing.
    w.resize(2 * half, Line::default());
    let partial = !m.is_multiple_of(ROWS);
    tail.resize(if partial { (s1 - s0) * ROWS * STRIP } else { 0 }, 0.0);
    let tail_at = tail.as_mut_ptr();
    let w = w.as_mut_ptr();
    load_config(&TILES);
    for u0 in (0..units).step_by(block) {
        let u1 = (u0 + block).min(units);
        let first = u0 == 0;
        let block_steps = (u1 - u0) * unit_steps;
        let buffer = |s: usize| w.add((s - s0) % 2 * half);
        let mut next = StripDecode::new(2 * s0, (u0, u1), buffer(s0));
        next.finish(p);
        // B tiles of the next strip decoded after each step of two row tiles, so that every tile
        // of the next strip is done within this strip's products.
        let pairs = tiles.div_ceil(2);
        let every = (pairs * block_steps).div_ceil(next.tiles()).max(1);
        for s in s0..s1 {
            let b = buffer(s) as *const Line;
            next = StripDecode::new(2 * (s + 1), (u0, u1), buffer(s + 1));
            let more = s + 1 < s1;
            let sums = |t: usize| Sums::waiting((out, n), tail_at, (s - s0, t), (tiles, partial));
            let mut t = 0;
            let mut k = 0;
            while t < tiles {
                let a0 = acts.as_ptr().add((t * steps + u0 * unit_steps) * ROWS);
                let c0 = sums(t);
                sums_in!(first, c0, "tmm0", "tmm1");
                if t + 1 < tiles {
                    let c1 = sums(t + 1);
                    sums_in!(first, c1, "tmm2", "tmm3");
                    let a1 = a0.add(steps * ROWS);
                    load2!(a0, a1, b);
                    for c in 1..=block_steps {
                        // The step after the last loads the last again (in bounds, unused).
                        let c = c.min(block_steps - 1);
                        step2!(
                            "tdpbf16ps",
                            a0.add(c * ROWS),
                            a1.add(c * ROWS),
                            b.add(c * 2 * ROWS)
                        );
                        k += 1;
                        if more && k % every == 0 {
                            next.advance(p, 1);
                        }
                    }
                    sums_out!(c0, "tmm0", "tmm1");
                    sums_out!(c1, "tmm2", "tmm3");
                    t += 2;
                } else {
                    for c in 0..block_steps {
                        step1!("tdpbf16ps", a0.add(c * ROWS), b.add(c * 2 * ROWS));
                    }
                    sums_out!(c0, "tmm0", "tmm1");
                    t += 1;
                }
            }
            if more {
                next.finish(p);
            }
        }
    }
    release();
    if partial {
        let t = tiles - 1;
        for s in s0..s1 {
            for r in 0..m - t * ROWS {
                let from = tail_at.add(((s - s0) * ROWS + r) * STRIP);
                let to = out.add((t * ROWS + r) * n + (s - s0) * STRIP);
                std::ptr::copy_nonoverlapping(from, to, STRIP);
            }
        }
    }
}

/// `iters` rounds of four bf16 tile products (16 x 16 sums over 32 columns each) on tiles
/// already loaded, four independent sums so that it is bound by throughput: the rate the
/// prompt rows' products (and attention on tiles) cannot pass. Returns the multiply-adds done.
///
/// # Safety
/// The CPU must have AMX-BF16 and this process the tile permission.
pub(crate) unsafe fn peak_bf16(iters: usize) -> u64 {
    let n = iters.max(1);
    let zeros = [Line::default(); ROWS];
    load_config(&TILES);
    asm!(
        "tileloadd tmm4, [{a} + {s}*1]",
        "tileloadd tmm6, [{a} + {s}*1]",
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        "2:",
        "tdpbf16ps tmm0, tmm4, tmm6",
        "tdpbf16ps tmm1, tmm4, tmm6",
        "tdpbf16ps tmm2, tmm4, tmm6",
        "tdpbf16ps tmm3, tmm4, tmm6",
        "dec {n}",
        "jnz 2b",
        a = in(reg) zeros.as_ptr(),
        s = in(reg) 64usize,
        n = inout(reg) n => _,
        options(nostack, readonly),
    );
    release();
    (n * 4 * ROWS * ROWS * STEP) as u64
}
