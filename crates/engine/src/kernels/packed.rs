//! Weight matrices re-laid out for the SIMD kernels: sixteen output rows interleaved, so that one
//! 512-bit register holds four consecutive weights of each of sixteen rows (and a 256-bit one
//! those of eight, half of each 64-byte line).
//!
//! With that layout one `vpdpbusd` against four activation bytes (broadcast) advances sixteen dot
//! products by four products each. All sixteen lanes are in the same sub-block, so the sub-block
//! scales of the sixteen rows apply lane by lane once the sub-block's integer sums are done, and the
//! sixteen lanes end as sixteen outputs with no horizontal sum. The natural layout needs a
//! `vpmaddubsw` and a `vpdpwssd` per 64 products to apply its per-32 scales; this needs one
//! `vpdpbusd`, which is what makes passes over several tokens (verification, prefill) cheaper.
//! Without VNNI the same step is a `vpmaddubsw` whose 16-bit pairs add up in 16 bits over a whole
//! sub-block (or a quarter or half of it, by the format's width) before one `vpmaddwd` widens them.
//!
//! Packing is done once at load (every own format: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, MXFP4) when the
//! kernels in use are SIMD ones (AVX2 or AVX-512); the matrix keeps its GGUF bytes (memory-mapped, for
//! embedding lookups and the other implementations). Every pass over a packed matrix, whatever its
//! number of rows, goes through the packed kernel, so a row's logits never depend on how many rows
//! share the pass.
//!
//! Layout per group of 16 rows and unit of columns (`format` has each format's sizes and offsets;
//! every unit is a whole number of 64-byte lines):
//! - Q4_K, units of 256 columns: `d[16]` and `dmin[16]` as f16; `scale[8][16]` and `min[8][16]` as
//!   u8; then for each sub-block of 32 columns and each step of 8 columns, 64 bytes in which lane
//!   `l`'s four bytes hold row `l`'s columns `c..c + 4` in their low nibbles and `c + 4..c + 8` in
//!   their high nibbles.
//! - Q6_K, units of 256 columns: `d[16]` as f16 and 32 bytes of padding; `scale[16][16]` as i8; the
//!   low four bits of the 6-bit values laid out as Q4_K's nibbles; then for each sub-block of 16
//!   columns 64 bytes in which bits `2i..2i + 2` of lane `l`'s byte `b` are the top two bits of row
//!   `l`'s column `4i + b`.
//! - The 32-column formats in units of two blocks (64 columns): `d[2][16]` as f16; Q4_1 then
//!   `m[2][16]` as f16; Q5_0 then per block 64 bytes in which bits `2u` and `2u + 1` of lane `l`'s
//!   byte `b` are the fifth bits of columns `8u + b` and `8u + 4 + b`; then the 4-bit values of
//!   each block as Q4_K's nibbles, or for Q8_0 the bytes plus 128 (as unsigned), four columns per
//!   lane and step.
//! - MXFP4 in units of two blocks: `d[2][16]` as f32, each `2^(e - 128)` exactly (f16 cannot hold
//!   it; the exponent byte would cost the kernel a few operations per block to make the float);
//!   then the 4-bit codes of each block as Q4_K's nibbles. The kernels look each code's value up
//!   plus 12 (0..24, unsigned) and start the block's sum from -12 times the activation sum, as
//!   Q4_0 does with its 8.

use super::format::{
    f16_at, mxfp4, mxfp4_codes, q4_1, q4k, q4k_scales_mins, q5_0, q6k, Format, PACKED_D,
};
use super::quant::QuantizedActs;

/// Rows interleaved per group.
pub const ROWS: usize = 16;

/// A weight matrix in the interleaved layout.
pub struct Packed {
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    /// An anonymous mapping holding the packed bytes at `start..start + len`.
    map: memmap2::MmapMut,
    start: usize,
    len: usize,
    /// The rotated int8 copy prompt rows read in a class that computes them so, made at first use.
    pub rotated: std::sync::OnceLock<super::rotated::RotatedInt8>,
}

/// Transparent huge pages, where the kernel gives them: a decode step streams every weight once,
/// and with 4 KiB pages that is a TLB miss every 64 lines.
const HUGE_PAGE: usize = 2 << 20;

impl Packed {
    /// Packs `rows x cols` weights of `format` given as GGUF bytes; `None` when the format has no
    /// packed layout, the rows do not come in whole groups or no memory could be mapped for the
    /// copy (the matrix then stays in its natural layout).
    pub fn new(format: Format, rows: usize, cols: usize, bytes: &[u8]) -> Option<Packed> {
        let block = format.packed_bytes();
        let unit = format.unit_cols();
        let (elems, sb_bytes) = format.super_block();
        if !rows.is_multiple_of(ROWS)
            || !cols.is_multiple_of(unit)
            || bytes.len() != rows * cols / elems * sb_bytes
        {
            return None;
        }
        let nsb = cols / unit;
        let sb_bytes = sb_bytes * unit / elems;
        let total = rows / ROWS * nsb * block;
        // Matrices of a huge page or more start on a huge-page boundary of a mapping advised to
        // use them (pages are only committed as packing writes them, so the slack costs none).
        let slack = if total >= HUGE_PAGE { HUGE_PAGE } else { 0 };
        let mut map = memmap2::MmapMut::map_anon(total + slack).ok()?;
        let base = map.as_ptr() as usize;
        let start = if slack > 0 {
            // A refusal only means ordinary pages.
            let _ = map.advise(memmap2::Advice::HugePage);
            base.next_multiple_of(HUGE_PAGE) - base
        } else {
            0
        };
        let data = &mut map[start..start + total];
        let row_bytes = nsb * sb_bytes;
        super::par_chunks_mut(data, nsb * block, &|g, out_group| {
            for (s, out) in out_group.chunks_exact_mut(block).enumerate() {
                for l in 0..ROWS {
                    let r = g * ROWS + l;
                    let sb = &bytes[r * row_bytes + s * sb_bytes..][..sb_bytes];
                    match format {
                        Format::Q4K => pack_q4k_lane(sb, l, out),
                        Format::Q6K => pack_q6k_lane(sb, l, out),
                        _ => pack32_lane(format, sb, l, out),
                    }
                }
            }
        });
        Some(Packed {
            format,
            rows,
            cols,
            map,
            start,
            len: total,
            rotated: std::sync::OnceLock::new(),
        })
    }

    /// The packed bytes (64-byte aligned: mappings start on pages).
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }

    /// Packed units per row.
    pub fn units(&self) -> usize {
        self.cols / self.format.unit_cols()
    }

    /// The bytes of group `g` (rows `16g..16g + 16`), all units.
    pub fn group(&self, g: usize) -> &[u8] {
        let len = self.units() * self.format.packed_bytes();
        &self.bytes()[g * len..(g + 1) * len]
    }
}

/// Writes small integers of one row (lane `l`) as nibble pairs: per step of 8 columns, lane
/// `l`'s byte `b` holds column `c + b` low and `c + 4 + b` high.
fn put_nibbles(q: &[u8], l: usize, out: &mut [u8]) {
    for step in 0..q.len() / 8 {
        for b in 0..4 {
            let c = step * 8 + b;
            out[step * 64 + 4 * l + b] = (q[c] & 0xF) | ((q[c + 4] & 0xF) << 4);
        }
    }
}

fn pack_q4k_lane(sb: &[u8], l: usize, out: &mut [u8]) {
    out[PACKED_D + 2 * l..][..2].copy_from_slice(&sb[q4k::D..q4k::D + 2]);
    out[q4k::PACKED_DMIN + 2 * l..][..2].copy_from_slice(&sb[q4k::DMIN..q4k::DMIN + 2]);
    let (sc, m) = q4k_scales_mins(&sb[q4k::SCALES..q4k::QS]);
    for j in 0..8 {
        out[q4k::PACKED_SCALES + 16 * j + l] = sc[j];
        out[q4k::PACKED_MINS + 16 * j + l] = m[j];
    }
    let mut q = [0u8; 256];
    Format::decode_q4k(sb, &mut q);
    put_nibbles(&q, l, &mut out[q4k::PACKED_QS..]);
}

fn pack_q6k_lane(sb: &[u8], l: usize, out: &mut [u8]) {
    out[PACKED_D + 2 * l..][..2].copy_from_slice(&sb[q6k::D..q6k::D + 2]);
    let mut q = [0u8; 256];
    let sc = Format::decode_q6k(sb, &mut q);
    for (t, &s) in sc.iter().enumerate() {
        out[q6k::PACKED_SCALES + 16 * t + l] = s as u8;
    }
    put_nibbles(&q, l, &mut out[q6k::PACKED_QL..]);
    for t in 0..16 {
        for b in 0..4 {
            let mut byte = 0u8;
            for i in 0..4 {
                byte |= (q[16 * t + 4 * i + b] >> 4) << (2 * i);
            }
            out[q6k::PACKED_QH + 64 * t + 4 * l + b] = byte;
        }
    }
}

/// Two 32-column blocks of one row (`sb`, GGUF bytes) into lane `l` of a packed unit.
fn pack32_lane(format: Format, sb: &[u8], l: usize, out: &mut [u8]) {
    let bytes = format.super_block().1;
    let values = format.packed_values();
    for h in 0..2 {
        let blk = &sb[h * bytes..(h + 1) * bytes];
        if format == Format::Mxfp4 {
            let d = format.scale32(blk).to_le_bytes();
            out[PACKED_D + 64 * h + 4 * l..][..4].copy_from_slice(&d);
            put_nibbles(&mxfp4_codes(blk), l, &mut out[values + 256 * h..]);
            continue;
        }
        let d = format.d_at();
        out[PACKED_D + 32 * h + 2 * l..][..2].copy_from_slice(&blk[d..d + 2]);
        let mut w = [0i8; 32];
        format.decode32(blk, &mut w);
        match format {
            Format::Q8_0 => {
                for step in 0..8 {
                    for b in 0..4 {
                        out[values + 512 * h + 64 * step + 4 * l + b] =
                            (w[4 * step + b] as u8) ^ 0x80;
                    }
                }
            }
            _ => {
                let u = w.map(|v| v as u8);
                put_nibbles(&u, l, &mut out[values + 256 * h..]);
                if format == Format::Q4_1 {
                    let at = q4_1::PACKED_M + 32 * h + 2 * l;
                    out[at..at + 2].copy_from_slice(&blk[q4_1::M..q4_1::M + 2]);
                }
                if format == Format::Q5_0 {
                    for b in 0..4 {
                        let mut byte = 0u8;
                        for step in 0..4 {
                            byte |= (u[8 * step + b] >> 4) << (2 * step);
                            byte |= (u[8 * step + 4 + b] >> 4) << (2 * step + 1);
                        }
                        out[q5_0::PACKED_QH + 64 * h + 4 * l + b] = byte;
                    }
                }
            }
        }
    }
}

/// Row `l`'s 64 integers of a packed 32-column unit, as `Format::decode32` gives them (MXFP4's
/// plus 12, as its kernels take them).
fn lane_values32(format: Format, blk: &[u8], l: usize) -> [i8; 64] {
    let mut w = [0i8; 64];
    let values = format.packed_values();
    for h in 0..2 {
        for step in 0..8 {
            for b in 0..4 {
                let e = 32 * h + 4 * step + b;
                w[e] = if format == Format::Q8_0 {
                    (blk[values + 512 * h + 64 * step + 4 * l + b] ^ 0x80) as i8
                } else {
                    let byte = blk[values + 256 * h + 64 * (step / 2) + 4 * l + b];
                    let mut v = if step % 2 == 0 { byte & 0xF } else { byte >> 4 };
                    if format == Format::Q5_0 {
                        let high = blk[q5_0::PACKED_QH + 64 * h + 4 * l + b];
                        v |= ((high >> (2 * (step / 2) + step % 2)) & 1) << 4;
                    }
                    if format == Format::Mxfp4 {
                        v = (mxfp4::KVALUES[v as usize] + mxfp4::BIAS) as u8;
                    }
                    v as i8
                };
            }
        }
    }
    w
}

/// Row `l`'s 256 integers of a packed super-block (Q4_K: 0..15; Q6_K: 0..63).
fn lane_values(format: Format, blk: &[u8], l: usize) -> [u8; 256] {
    let mut q = [0u8; 256];
    let nib = if format == Format::Q4K {
        q4k::PACKED_QS
    } else {
        q6k::PACKED_QL
    };
    for step in 0..32 {
        for b in 0..4 {
            let byte = blk[nib + step * 64 + 4 * l + b];
            q[step * 8 + b] = byte & 0xF;
            q[step * 8 + 4 + b] = byte >> 4;
        }
    }
    if format == Format::Q6K {
        for t in 0..16 {
            for b in 0..4 {
                let byte = blk[q6k::PACKED_QH + 64 * t + 4 * l + b];
                for i in 0..4 {
                    q[16 * t + 4 * i + b] |= ((byte >> (2 * i)) & 3) << 4;
                }
            }
        }
    }
    q
}

/// Plain reference of the packed kernels: the sixteen outputs of group `g` for activation row
/// `row`, computed from the packed bytes with the same integer sums and scale order.
pub fn dot_group_scalar(p: &Packed, g: usize, acts: &QuantizedActs, row: usize) -> [f32; 16] {
    let block = p.format.packed_bytes();
    let group = p.group(g);
    let mut out = [0f32; 16];
    for (l, o) in out.iter_mut().enumerate() {
        let mut acc = 0f32;
        for s in 0..p.units() {
            let blk = &group[s * block..(s + 1) * block];
            if !matches!(p.format, Format::Q4K | Format::Q6K) {
                let w = lane_values32(p.format, blk, l);
                for h in 0..2 {
                    let bi = row * acts.k / 32 + 2 * s + h;
                    let xq = acts.q_at(row, 64 * s + 32 * h);
                    // Q4_0 and Q5_0 decode to their values plus 8 and 16: the integer offset
                    // makes the sum exact before any float.
                    let a: i32 = (0..32).map(|e| w[32 * h + e] as i32 * xq[e] as i32).sum();
                    let a = a - acts.isums[bi] as i32
                        * match p.format {
                            Format::Q4_0 => 8,
                            Format::Q5_0 => 16,
                            Format::Mxfp4 => mxfp4::BIAS as i32,
                            _ => 0,
                        };
                    let d = if p.format == Format::Mxfp4 {
                        let at = PACKED_D + 64 * h + 4 * l;
                        f32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]])
                    } else {
                        f16_at(blk, PACKED_D + 32 * h + 2 * l)
                    };
                    acc = (a as f32).mul_add(d * acts.d[bi], acc);
                    if p.format == Format::Q4_1 {
                        let m = f16_at(blk, q4_1::PACKED_M + 32 * h + 2 * l);
                        acc = m.mul_add(acts.ds[bi], acc);
                    }
                }
                continue;
            }
            let q = lane_values(p.format, blk, l);
            let xq = acts.q_at(row, s * 256);
            let dot = |c: usize, n: usize| -> i32 {
                (c..c + n).map(|e| q[e] as i32 * xq[e] as i32).sum()
            };
            let bi = row * acts.k / 256 + s;
            let dx = acts.d[bi];
            // Each super-block in integers (scales times sub-block sums), then floats once.
            let d = f16_at(blk, PACKED_D + 2 * l);
            match p.format {
                Format::Q4K => {
                    let dmin = f16_at(blk, q4k::PACKED_DMIN + 2 * l);
                    let (mut isum, mut msum) = (0i32, 0i32);
                    for j in 0..8 {
                        isum += blk[q4k::PACKED_SCALES + 16 * j + l] as i32 * dot(32 * j, 32);
                        let sum = acts.isums[(row * acts.k + s * 256) / 32 + j] as i32;
                        msum += blk[q4k::PACKED_MINS + 16 * j + l] as i32 * sum;
                    }
                    acc = (isum as f32).mul_add(d * dx, acc);
                    acc = (-(msum as f32)).mul_add(dmin * dx, acc);
                }
                _ => {
                    let mut isum = 0i32;
                    for t in 0..16 {
                        let sc = blk[q6k::PACKED_SCALES + 16 * t + l] as i8 as i32;
                        isum += sc * (dot(16 * t, 16) - 32 * acts.bsums[bi * 16 + t] as i32);
                    }
                    acc = (isum as f32).mul_add(d * dx, acc);
                }
            }
        }
        *o = acc;
    }
    out
}
