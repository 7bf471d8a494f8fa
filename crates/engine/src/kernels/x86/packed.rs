//! Products over weights in the interleaved layout of `kernels::packed`, written once for every
//! register width and product instruction:
//! - 512-bit registers (`Zmm`) hold all sixteen rows of a group: one `vpdpbusd` advances sixteen
//!   rows' dot products by four products each;
//! - 256-bit registers (`Ymm`, AVX2) hold eight: a group is computed in two halves, the second
//!   reading from cache the lines the first brought in;
//! - with VNNI each step of four products is one `vpdpbusd` (AVX-512 VNNI on `Zmm`, AVX-VNNI on
//!   `Ymm`); without, one `vpmaddubsw` whose 16-bit pairs are summed in 16 bits for as many steps
//!   as the format's weights allow and widened by one `vpmaddwd` (`Sums`, in `sums.rs`).
//!
//! Every lane does the same integer and float operations in the same order on every width and
//! instruction, so all of them give the same results bit for bit.

// The tiles address several arrays and pointers by row (or column) index. They keep their index
// loops: iterator forms change the code generated for these kernels.
#![allow(clippy::needless_range_loop)]

use super::sums::{steps_in_16_bits, Sums};
use super::width::{Width, Ymm, Zmm};
use super::{MXFP4, Q4_0, Q4_1, Q5_0, Q8_0};
use crate::kernels::format::{mxfp4, q4_1, q4k, q5_0, q6k, Format, PACKED_D};
use crate::kernels::packed::{Packed, ROWS};
use crate::kernels::quant::{QuantizedActs, OFFSET_MXFP4, OFFSET_Q4_0, OFFSET_Q5_0, OFFSET_Q8_0};
use std::arch::x86_64::*;

/// How many activation rows share a pass over a register's weights, per width: each keeps its
/// sums in registers.
trait RowTiles: Width {
    /// The most rows in a tile.
    const TILE: usize;
    /// The tile of `n <= TILE` rows from `r`.
    unsafe fn tile<const VNNI: bool>(t: &Tile, r: usize, n: usize);
}

impl RowTiles for Zmm {
    const TILE: usize = 8;
    #[inline(always)]
    unsafe fn tile<const VNNI: bool>(t: &Tile, r: usize, n: usize) {
        match n {
            8 => t.run::<Self, VNNI, 8>(r),
            7 => t.run::<Self, VNNI, 7>(r),
            6 => t.run::<Self, VNNI, 6>(r),
            5 => t.run::<Self, VNNI, 5>(r),
            4 => t.run::<Self, VNNI, 4>(r),
            3 => t.run::<Self, VNNI, 3>(r),
            2 => t.run::<Self, VNNI, 2>(r),
            _ => t.run::<Self, VNNI, 1>(r),
        }
    }
}

impl<const EVEX: bool> RowTiles for Ymm<EVEX> {
    // Four rows: each keeps a float sum and two integer sums in registers (16-bit pairs and
    // 32-bit totals, or with VNNI the sub-block's and the super-block's), which with the weights,
    // the broadcast and the mask is the sixteen AVX2 has. Six were measured no faster for the
    // K-quants and slower for the 32-column formats.
    const TILE: usize = 4;
    #[inline(always)]
    unsafe fn tile<const VNNI: bool>(t: &Tile, r: usize, n: usize) {
        match n {
            4 => t.run::<Self, VNNI, 4>(r),
            3 => t.run::<Self, VNNI, 3>(r),
            2 => t.run::<Self, VNNI, 2>(r),
            _ => t.run::<Self, VNNI, 1>(r),
        }
    }
}

/// Bytes of a group's units each register's rows go over in turn, where a register holds fewer
/// than the sixteen rows (see `packed_rows`).
const CHUNK_BYTES: usize = 4096;

/// How far ahead of the near prefetch (the next unit, into L1) the weights are also prefetched
/// into L2. One unit ahead (2-3.4 KB) is less than a core's share of memory bandwidth times the
/// memory latency, so without this a core busy computing kept too few lines in flight: eight
/// activation rows streamed about 17 GB/s where a plain read of memory gets 32-40. With it
/// (Zen 4, 2 threads, `kbench` at 8 rows out of the caches) VNNI went from 4.7-5.1 to 3.7-3.9 ms
/// on Q6_K and 6.8-7.2 to 4.4-4.5 on Q8_0, AVX2 from 6.1-7.2 to 4.9-5.2 on Q4_K; 6 to 24 KB
/// measured alike (README, "Prefetching far ahead").
pub(super) const FAR_BYTES: usize = 16 * 1024;

/// One step of eight columns: `lo` holds each lane's first four columns, `hi` the next four;
/// activation row `r`'s eight bytes are at `x + r * k`.
#[inline(always)]
unsafe fn nibble_step<W: Width, const VNNI: bool, const MR: usize>(
    s: &mut Sums<W, VNNI, MR>,
    lo: W::I,
    hi: W::I,
    x: *const i8,
    k: usize,
) {
    for r in 0..MR {
        let xp = x.add(r * k);
        s.step(r, false, lo, W::bcast4(xp));
        s.step(r, true, hi, W::bcast4(xp.add(4)));
    }
    s.pin();
}

/// What a tile computes: the weight rows `lane0..lane0 + W::LANES` of a group over its units
/// `s0..s1` against activation rows `r0..r0 + MR`, row `r`'s results to `out + r * stride` (and
/// taken from there to go on with when `s0 > 0`); `out` already points at column `lane0`.
#[derive(Clone, Copy)]
struct Tile<'a> {
    group: &'a [u8],
    format: Format,
    lane0: usize,
    s0: usize,
    s1: usize,
    acts: &'a QuantizedActs,
    r0: usize,
    out: *mut f32,
    stride: usize,
}

impl Tile<'_> {
    /// The kernel of the format over the `MR` rows from `r`.
    #[inline(always)]
    unsafe fn run<W: Width, const VNNI: bool, const MR: usize>(&self, r: usize) {
        let at = Tile {
            r0: self.r0 + r,
            out: self.out.add(r * self.stride),
            ..*self
        };
        match self.format {
            Format::Q4K => packed_q4k::<W, VNNI, MR>(&at),
            Format::Q6K => packed_q6k::<W, VNNI, MR>(&at),
            Format::Q4_0 => packed32::<W, VNNI, Q4_0, MR>(&at),
            Format::Q4_1 => packed32::<W, VNNI, Q4_1, MR>(&at),
            Format::Q5_0 => packed32::<W, VNNI, Q5_0, MR>(&at),
            Format::Q8_0 => packed32::<W, VNNI, Q8_0, MR>(&at),
            Format::Mxfp4 => packed32::<W, VNNI, MXFP4, MR>(&at),
        }
    }

    /// Prefetches the `n` lines from `p` into L1, on the first register's pass over a unit only
    /// (the later ones read what it brought in), and the `n` lines `FAR_BYTES` further on into
    /// L2, on the product's first tile of rows alone (the later tiles find them in cache). Either
    /// may lie past the data: prefetches never fault.
    #[inline(always)]
    unsafe fn prefetch(&self, p: *const u8, n: usize) {
        if self.lane0 != 0 {
            return;
        }
        for i in 0..n {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * i) as *const i8);
        }
        if self.r0 == 0 {
            for i in 0..n {
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(FAR_BYTES + 64 * i) as *const i8);
            }
        }
    }

    /// Each row's float sums to start from: zero, or where the units before `s0` left them.
    #[inline(always)]
    unsafe fn start<W: Width, const MR: usize>(&self) -> [W::F; MR] {
        let mut acc = [W::zero_f(); MR];
        if self.s0 > 0 {
            for r in 0..MR {
                acc[r] = W::loadf(self.out.add(r * self.stride));
            }
        }
        acc
    }

    #[inline(always)]
    unsafe fn store<W: Width, const MR: usize>(&self, acc: &[W::F; MR]) {
        for r in 0..MR {
            W::store(self.out.add(r * self.stride), acc[r]);
        }
    }
}

/// Packed Q4_K (see `packed`). Per super-block and row, all in integers: the sum over sub-blocks
/// of the scale times the sub-block's products, and of the minimum times the sub-block's
/// activation sum; then `d` and `dmin` times the activation scale take each to floats once.
#[inline(always)]
unsafe fn packed_q4k<W: Width, const VNNI: bool, const MR: usize>(at: &Tile) {
    let low = W::bytes(0x0F);
    let mut acc = at.start::<W, MR>();
    let (acts, l0) = (at.acts, at.lane0);
    let q = acts.q.as_ptr();
    let k = acts.k;
    for s in at.s0..at.s1 {
        let blk = at.group.as_ptr().add(s * q4k::PACKED_BYTES);
        let mut sums = Sums::<W, VNNI, MR>::new();
        for j in 0..8 {
            let qs = blk.add(q4k::PACKED_QS + 256 * j + 4 * l0);
            // The next super-block, spread over this one's eight steps (37 lines).
            at.prefetch(blk.wrapping_add(q4k::PACKED_BYTES + 320 * j), 5);
            const { assert!(steps_in_16_bits(15) >= 8) };
            for u in 0..4 {
                let v = W::load(qs.add(64 * u));
                let lo = W::and(v, low);
                let hi = W::and(W::shr16::<4>(v), low);
                let x = q.add(at.r0 * k + s * 256 + 32 * j + 8 * u);
                nibble_step(&mut sums, lo, hi, x, k);
            }
            let sc = W::u8s_i32(blk.add(q4k::PACKED_SCALES + 16 * j + l0));
            sums.flush_scaled(W::pair16(sc, sc));
            sums.end_sub_block(sc);
        }
        // The minimums, two sub-blocks to a `vpmaddwd` against two activation sums.
        let mins = blk.add(q4k::PACKED_MINS + l0);
        let mn: [W::I; 4] = std::array::from_fn(|i| {
            W::pair16(
                W::u8s_i32(mins.add(32 * i)),
                W::u8s_i32(mins.add(32 * i + 16)),
            )
        });
        let d = W::f16s(blk.add(PACKED_D + 2 * l0));
        let dmin = W::f16s(blk.add(q4k::PACKED_DMIN + 2 * l0));
        for r in 0..MR {
            let sums16 = acts.isums.as_ptr().add(((at.r0 + r) * k + s * 256) / 32) as *const i8;
            let mut m = W::madd16(mn[0], W::bcast4(sums16));
            for i in 1..4 {
                m = W::add32(m, W::madd16(mn[i], W::bcast4(sums16.add(4 * i))));
            }
            let dx = W::splat(*acts.d.get_unchecked((at.r0 + r) * k / 256 + s));
            acc[r] = W::fmadd(W::cvt(sums.scaled_total(r)), W::mul(d, dx), acc[r]);
            acc[r] = W::fnmadd(W::cvt(m), W::mul(dmin, dx), acc[r]);
        }
    }
    at.store::<W, MR>(&acc);
}

/// The top two bits of four columns, from bits `2i..2i + 2` of each byte of `h`, moved to bits 4
/// and 5.
#[inline(always)]
pub(super) unsafe fn q6_high<W: Width, const I: u32>(h: W::I) -> W::I {
    let m = W::bytes(0x30);
    match I {
        0 => W::and(W::shl16::<4>(h), m),
        1 => W::and(W::shl16::<2>(h), m),
        2 => W::and(h, m),
        _ => W::and(W::shr16::<2>(h), m),
    }
}

/// Q6_K's 6-bit values of step `u` (0 or 1: eight columns) of a sub-block, from that step's 64
/// bytes of low nibbles `v` and the sub-block's top bits `h`: the first four columns of each row
/// (`lo`) and the next four (`hi`), as bytes.
#[inline(always)]
pub(super) unsafe fn q6_values<W: Width>(v: W::I, h: W::I, u: usize) -> (W::I, W::I) {
    let low = W::bytes(0x0F);
    let (hl, hh) = if u == 0 {
        (q6_high::<W, 0>(h), q6_high::<W, 1>(h))
    } else {
        (q6_high::<W, 2>(h), q6_high::<W, 3>(h))
    };
    (
        W::or(W::and(v, low), hl),
        W::or(W::and(W::shr16::<4>(v), low), hh),
    )
}

/// Packed Q6_K (see `packed`). As Q4_K, a super-block's sums are one integer per row and lane
/// before any float: the scale times each sub-block's products, less 32 times the scale times its
/// activation sum (the values are stored plus 32). With VNNI each sub-block's sums start from -32
/// times its activation sum (`q6k_offsets`), so one multiply by the scale covers both; without,
/// the offsets are added at the end, two sub-blocks to a `vpmaddwd`.
#[inline(always)]
unsafe fn packed_q6k<W: Width, const VNNI: bool, const MR: usize>(at: &Tile) {
    let mut acc = at.start::<W, MR>();
    let (acts, l0) = (at.acts, at.lane0);
    let q = acts.q.as_ptr();
    let k = acts.k;
    for s in at.s0..at.s1 {
        let blk = at.group.as_ptr().add(s * q6k::PACKED_BYTES);
        let scales = blk.add(q6k::PACKED_SCALES + l0);
        let mut sums = Sums::<W, VNNI, MR>::new();
        for t in 0..16 {
            let ql = blk.add(q6k::PACKED_QL + 128 * t + 4 * l0);
            // The next super-block, spread over this one's sixteen steps (53 lines).
            at.prefetch(blk.wrapping_add(q6k::PACKED_BYTES + 256 * t), 4);
            let h = W::load(blk.add(q6k::PACKED_QH + 64 * t + 4 * l0));
            let sc = W::i8s_i32(scales.add(16 * t));
            let sc16 = W::pair16(sc, sc);
            if VNNI {
                for r in 0..MR {
                    let o = acts.q6k_offsets.as_ptr();
                    let o = o.add(((at.r0 + r) * k + s * 256) / 16 + t);
                    sums.start_from(r, W::bcast4(o as *const i8));
                }
            }
            // Values up to 63: two steps to a flush.
            const { assert!(steps_in_16_bits(63) >= 2) };
            for u in 0..2 {
                let (lo, hi) = q6_values::<W>(W::load(ql.add(64 * u)), h, u);
                let x = q.add(at.r0 * k + s * 256 + 16 * t + 8 * u);
                nibble_step(&mut sums, lo, hi, x, k);
                sums.flush_scaled(sc16);
            }
            sums.end_sub_block(sc);
        }
        // Without VNNI, the offsets: -32 times the scale, two sub-blocks to a `vpmaddwd`
        // against two activation sums.
        if !VNNI {
            for i in 0..8 {
                let neg = |o: usize| W::sub32(W::zero(), W::shl32::<5>(W::i8s_i32(scales.add(o))));
                let sc = W::pair16(neg(32 * i), neg(32 * i + 16));
                for r in 0..MR {
                    let b = acts
                        .bsums
                        .as_ptr()
                        .add(((at.r0 + r) * k + s * 256) / 16 + 2 * i);
                    sums.add_scaled(r, W::madd16(sc, W::bcast4(b as *const i8)));
                }
            }
        }
        let d = W::f16s(blk.add(PACKED_D + 2 * l0));
        for r in 0..MR {
            let dx = W::splat(*acts.d.get_unchecked((at.r0 + r) * k / 256 + s));
            acc[r] = W::fmadd(W::cvt(sums.scaled_total(r)), W::mul(d, dx), acc[r]);
        }
    }
    at.store::<W, MR>(&acc);
}

/// Q5_0's fifth bits for step `u` of a block: bits `2u` (low nibbles) or `2u + 1` (high) of
/// each byte of `h`, moved to bit 4.
#[inline(always)]
pub(super) unsafe fn q5_high<W: Width>(h: W::I, bit: u32) -> W::I {
    let v = match bit {
        0 => W::shl16::<4>(h),
        1 => W::shl16::<3>(h),
        2 => W::shl16::<2>(h),
        3 => W::shl16::<1>(h),
        4 => h,
        5 => W::shr16::<1>(h),
        6 => W::shr16::<2>(h),
        _ => W::shr16::<3>(h),
    };
    W::and(v, W::bytes(0x10))
}

/// MXFP4's values by code, plus 12 (0..24): what `W::lookup` turns the packed codes into.
pub(super) const MXFP4_TABLE: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut c = 0;
    while c < 16 {
        t[c] = (mxfp4::KVALUES[c] + mxfp4::BIAS) as u8;
        c += 1;
    }
    t
};

/// Q8_0's half of a unit (its values at `values`) into `sums`: eight steps of four columns.
#[inline(always)]
unsafe fn q8_0_sums<W: Width, const VNNI: bool, const MR: usize>(
    at: &Tile<'_>,
    values: *const u8,
    x0: usize,
    sums: &mut Sums<W, VNNI, MR>,
) {
    let (q, k, l0) = (at.acts.q.as_ptr(), at.acts.k, at.lane0);
    for u in 0..8 {
        let w = W::load(values.add(64 * u + 4 * l0));
        // Without VNNI: the signed bytes (stored plus 128), as |w| and sign.
        let signed = W::xor(w, W::bytes(-128));
        let (w_abs, sign) = (W::abs8(signed), W::sign_of(signed));
        for r in 0..MR {
            let x = W::bcast4(q.add((at.r0 + r) * k + x0 + 4 * u));
            if VNNI {
                sums.step(r, u % 2 == 1, w, x);
            } else {
                sums.step_signed(r, w_abs, sign, x);
            }
        }
    }
}

/// A four-bit format's (Q4_0, Q4_1, Q5_0 with its fifth bits, MXFP4 looked up in `table`) half
/// `h` of the unit at `blk` into `sums`: four steps of eight columns, flushed before the 16-bit
/// sums can overflow.
#[inline(always)]
unsafe fn nibble_sums<W: Width, const VNNI: bool, const F: u8, const MR: usize>(
    at: &Tile<'_>,
    blk: *const u8,
    h: usize,
    x0: usize,
    low: W::I,
    table: W::I,
    sums: &mut Sums<W, VNNI, MR>,
) {
    let values = const { Format::from_code(F).packed_values() };
    let (q, k, l0) = (at.acts.q.as_ptr(), at.acts.k, at.lane0);
    let high = if F == Q5_0 {
        W::load(blk.add(q5_0::PACKED_QH + 64 * h + 4 * l0))
    } else {
        W::zero()
    };
    const {
        assert!(steps_in_16_bits(15) >= 8 && steps_in_16_bits(31) >= 4 && steps_in_16_bits(24) >= 4)
    };
    for u in 0..4 {
        let v = W::load(blk.add(values + 256 * h + 64 * u + 4 * l0));
        let mut lo = W::and(v, low);
        let mut hi = W::and(W::shr16::<4>(v), low);
        if F == Q5_0 {
            lo = W::or(lo, q5_high::<W>(high, 2 * u as u32));
            hi = W::or(hi, q5_high::<W>(high, 2 * u as u32 + 1));
        }
        if F == MXFP4 {
            lo = W::lookup(table, lo);
            hi = W::lookup(table, hi);
        }
        let x = q.add(at.r0 * k + x0 + 8 * u);
        nibble_step(sums, lo, hi, x, k);
        // Four-bit values: eight steps to a flush; Q5_0's five bits and MXFP4's values up to
        // 24: four.
        if (F == Q5_0 || F == MXFP4) && u % 2 == 1 {
            sums.flush();
        }
    }
    if F != Q5_0 && F != MXFP4 {
        sums.flush();
    }
}

/// Packed 32-column formats (see `packed`), units of two blocks: per block and row, the exact
/// integer sum of the block (the integer offsets of Q4_0, Q5_0, MXFP4 and, with VNNI, Q8_0
/// included: `QuantizedActs::offsets32`) times the weight scale times the activation scale; Q4_1
/// then adds its float minimum times the activation block's scaled sum.
#[inline(always)]
unsafe fn packed32<W: Width, const VNNI: bool, const F: u8, const MR: usize>(at: &Tile) {
    let bytes = const { Format::from_code(F).packed_bytes() };
    let values = const { Format::from_code(F).packed_values() };
    let lines = bytes / 64;
    let low = W::bytes(0x0F);
    let table = if F == MXFP4 {
        W::table16(MXFP4_TABLE.as_ptr())
    } else {
        W::zero()
    };
    let mut acc = at.start::<W, MR>();
    let (acts, l0) = (at.acts, at.lane0);
    let k = acts.k;
    for s in at.s0..at.s1 {
        let blk = at.group.as_ptr().add(s * bytes);
        // The unit after next, half per block.
        at.prefetch(blk.wrapping_add(2 * bytes), lines / 2);
        at.prefetch(
            blk.wrapping_add(2 * bytes + 64 * (lines / 2)),
            lines - lines / 2,
        );
        for h in 0..2 {
            let dw = if F == MXFP4 {
                W::loadf(blk.add(PACKED_D + 64 * h + 4 * l0) as *const f32)
            } else {
                W::f16s(blk.add(PACKED_D + 32 * h + 2 * l0))
            };
            // Q4_1's minimum is a float: times each activation block's scaled sum at the end.
            let min = if F == Q4_1 {
                W::f16s(blk.add(q4_1::PACKED_M + 32 * h + 2 * l0))
            } else {
                W::zero_f()
            };
            let mut sums = Sums::<W, VNNI, MR>::new();
            let x0 = 64 * s + 32 * h;
            // The values are stored plus 8, 16, (MXFP4) 12 or (Q8_0 with VNNI) 128: that times minus the
            // activation sum makes each row's sum the exact product. With VNNI the sums start
            // from it; without, it is added at the end (on 256-bit registers an early start
            // holds one more register per row through the block, which AVX2 has not got).
            let offset = match F {
                Q4_0 => Some(OFFSET_Q4_0),
                Q5_0 => Some(OFFSET_Q5_0),
                MXFP4 => Some(OFFSET_MXFP4),
                Q8_0 if VNNI => Some(OFFSET_Q8_0),
                _ => None,
            };
            let offset_at = |r: usize, o: usize| {
                let bi = ((at.r0 + r) * k + x0) / 32;
                W::bcast4((acts.offsets32.as_ptr().add(bi) as *const i32).add(o) as *const i8)
            };
            if let (Some(o), true) = (offset, VNNI) {
                for r in 0..MR {
                    sums.start_from(r, offset_at(r, o));
                }
            }
            if F == Q8_0 {
                q8_0_sums(at, blk.add(values + 512 * h), x0, &mut sums);
            } else {
                nibble_sums::<W, VNNI, F, MR>(at, blk, h, x0, low, table, &mut sums);
            }
            for r in 0..MR {
                let bi = ((at.r0 + r) * k + x0) / 32;
                let mut sum = sums.total(r);
                if let (Some(o), false) = (offset, VNNI) {
                    sum = W::add32(sum, offset_at(r, o));
                }
                let scale = W::mul(dw, W::splat(*acts.d.get_unchecked(bi)));
                acc[r] = W::fmadd(W::cvt(sum), scale, acc[r]);
                if F == Q4_1 {
                    let ds = W::splat(*acts.ds.get_unchecked(bi));
                    acc[r] = W::fmadd(min, ds, acc[r]);
                }
            }
        }
    }
    at.store::<W, MR>(&acc);
}

/// The rows of group `g` against activation rows `r0..r0 + m`, a register's worth of weight rows
/// (`W::LANES`) at a time. Narrow registers take the group's units a few kilobytes at a time,
/// every register's rows over those before the next: the later registers read the lines the first
/// brought in while they are still in L1, and the first keeps memory busy for all.
#[inline(always)]
unsafe fn packed_rows<W: RowTiles, const VNNI: bool>(
    p: &Packed,
    g: usize,
    acts: &QuantizedActs,
    r0: usize,
    m: usize,
    out: *mut f32,
    stride: usize,
) {
    let units = p.units();
    let chunk = if W::LANES == ROWS {
        units
    } else {
        (CHUNK_BYTES / p.format.packed_bytes()).clamp(1, units)
    };
    for s0 in (0..units).step_by(chunk) {
        for lane0 in (0..ROWS).step_by(W::LANES) {
            let tile = Tile {
                group: p.group(g),
                format: p.format,
                lane0,
                s0,
                s1: (s0 + chunk).min(units),
                acts,
                r0,
                out: out.add(lane0),
                stride,
            };
            // As few tiles as the rows need, of sizes as even as they can be (9 rows on 512-bit
            // registers are tiles of 5 and 4, not 8 and 1).
            let tiles = m.div_ceil(W::TILE);
            let mut r = 0;
            for t in 0..tiles {
                let n = m / tiles + usize::from(t < m % tiles);
                W::tile::<VNNI>(&tile, r, n);
                r += n;
            }
        }
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
    packed_rows::<Zmm, true>(p, g, acts, r0, m, out, stride)
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
    packed_rows::<Zmm, false>(p, g, acts, r0, m, out, stride)
}

/// `packed_rows_vnni` on 256-bit registers with `vpmaddubsw` + `vpmaddwd`: the same results, bit
/// for bit, up to four activation rows per pass over each half of the group.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; otherwise as `packed_rows_vnni`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn packed_rows_avx2(
    p: &Packed,
    g: usize,
    acts: &QuantizedActs,
    r0: usize,
    m: usize,
    out: *mut f32,
    stride: usize,
) {
    packed_rows::<Ymm<false>, false>(p, g, acts, r0, m, out, stride)
}

/// `packed_rows_avx2` with AVX-VNNI's 256-bit `vpdpbusd`: the same results, bit for bit.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-VNNI; otherwise as `packed_rows_vnni`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(crate) unsafe fn packed_rows_avx_vnni(
    p: &Packed,
    g: usize,
    acts: &QuantizedActs,
    r0: usize,
    m: usize,
    out: *mut f32,
    stride: usize,
) {
    packed_rows::<Ymm<false>, true>(p, g, acts, r0, m, out, stride)
}

/// `packed_rows_avx_vnni` with the AVX-512 VL encoding of the 256-bit `vpdpbusd`, for CPUs with
/// AVX-512 VNNI but not AVX-VNNI.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C, AVX-512 F, VL and VNNI; otherwise as `packed_rows_vnni`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(crate) unsafe fn packed_rows_avx_vnni_evex(
    p: &Packed,
    g: usize,
    acts: &QuantizedActs,
    r0: usize,
    m: usize,
    out: *mut f32,
    stride: usize,
) {
    packed_rows::<Ymm<true>, true>(p, g, acts, r0, m, out, stride)
}
