//! The weight formats with our own kernels, each described once: where the parts of a block lie in
//! the GGUF bytes, where they lie in the unit of sixteen interleaved rows the packed kernels read
//! (see `packed`), and how a block decodes to integers and scales. The plain kernels, the packing
//! and the SIMD kernels all take their sizes and offsets from here.
//!
//! Offsets are in bytes from the start of a block (or packed unit); scales and minimums are f16,
//! except MXFP4's, which are powers of two f16 cannot hold (an E8M0 exponent byte in the GGUF block,
//! the exact f32 in the packed unit). Every packed unit starts with the scales of its sixteen rows
//! (`PACKED_D`), one group of sixteen per block for the 32-element formats, and is a whole number
//! of 64-byte lines.

use super::dtype::TensorType;
use half::f16;

/// Where a packed unit keeps its rows' scales `d`: `d[16]`, or `d[2][16]` for the two blocks of a
/// 32-element unit (f16; f32 for MXFP4).
pub const PACKED_D: usize = 0;

/// Q4_0: 32 values `d * (q - 8)`, `q` of 4 bits.
pub mod q4_0 {
    pub const ELEMS: usize = 32;
    pub const BYTES: usize = 18;
    pub const D: usize = 0;
    /// 16 bytes: value `j` in the low nibble of byte `j`, value `j + 16` in the high nibble.
    pub const QS: usize = 2;
    /// A packed unit: two blocks of sixteen rows.
    pub const PACKED_BYTES: usize = 576;
    /// The values of the two blocks, 256 bytes each.
    pub const PACKED_QS: usize = 64;
}

/// Q4_1: 32 values `d * q + m`, `q` of 4 bits.
pub mod q4_1 {
    pub const ELEMS: usize = 32;
    pub const BYTES: usize = 20;
    pub const D: usize = 0;
    pub const M: usize = 2;
    /// As Q4_0's.
    pub const QS: usize = 4;
    pub const PACKED_BYTES: usize = 640;
    /// `m[2][16]`.
    pub const PACKED_M: usize = 64;
    pub const PACKED_QS: usize = 128;
}

/// Q5_0: 32 values `d * (q - 16)`, `q` of 5 bits.
pub mod q5_0 {
    pub const ELEMS: usize = 32;
    pub const BYTES: usize = 22;
    pub const D: usize = 0;
    /// A little-endian u32: bit `j` is value `j`'s fifth bit.
    pub const QH: usize = 2;
    /// The low four bits, as Q4_0's.
    pub const QS: usize = 6;
    pub const PACKED_BYTES: usize = 704;
    /// The fifth bits, 64 bytes per block.
    pub const PACKED_QH: usize = 64;
    pub const PACKED_QS: usize = 192;
}

/// Q8_0: 32 values `d * q`, `q` a signed byte.
pub mod q8_0 {
    pub const ELEMS: usize = 32;
    pub const BYTES: usize = 34;
    pub const D: usize = 0;
    pub const QS: usize = 2;
    pub const PACKED_BYTES: usize = 1088;
    /// The values plus 128 as unsigned bytes, 512 bytes per block.
    pub const PACKED_QS: usize = 64;
}

/// MXFP4 (ggml type 39, gpt-oss's experts): 32 values `KVALUES[c] * 2^(e - 128)`, `c` a 4-bit
/// code and `e` an E8M0 exponent byte; `KVALUES` are the E2M1 values doubled (hence the exponent
/// bias of 128 rather than 127), as ggml decodes them.
pub mod mxfp4 {
    pub const ELEMS: usize = super::super::dtype::MXFP4_ELEMS;
    pub const BYTES: usize = super::super::dtype::MXFP4_BYTES;
    /// The E8M0 exponent byte.
    pub const E: usize = 0;
    /// 16 bytes of codes, laid out as Q4_0's values.
    pub const QS: usize = 1;
    /// The value of each code: the E2M1 numbers times two (ggml's `kvalues_mxfp4`).
    pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
    /// Added to every value by the packed kernels (and the natural-layout ones without sign
    /// handling), so that the weights are unsigned (0..24) against signed activations; minus it
    /// times the activation sum takes it back out (`OFFSET_MXFP4`).
    pub const BIAS: i8 = 12;
    /// A packed unit: `d[2][16]` as f32 (128 bytes), then the codes of the two blocks as Q4_0's
    /// values.
    pub const PACKED_BYTES: usize = 640;
    pub const PACKED_QS: usize = 128;

    /// `2^(e - 128)`, exactly (`e` 0 and 1 give the subnormals 2^-128 and 2^-127).
    #[inline(always)]
    pub fn scale(e: u8) -> f32 {
        if e < 2 {
            f32::from_bits(0x0020_0000 << e)
        } else {
            f32::from_bits((e as u32 - 1) << 23)
        }
    }

    /// The 32 values of a block, each `KVALUES[c] * scale(e)` as ggml computes it.
    pub fn dequantize_block(blk: &[u8], out: &mut [f32]) {
        let d = scale(blk[E]);
        for j in 0..16 {
            let q = blk[QS + j];
            out[j] = KVALUES[(q & 0xF) as usize] as f32 * d;
            out[j + 16] = KVALUES[(q >> 4) as usize] as f32 * d;
        }
    }

    /// 32 values to one block, as ggml's reference quantizer does: the exponent puts the largest
    /// magnitude at 8..16 times the scale (`floor(log2(amax)) - 2` with the bias of 127, read
    /// from the float's exponent bits where it is normal), then each value takes the code nearest
    /// it (the first on a tie; past 12 times the scale, 12).
    pub fn quantize_block(x: &[f32], blk: &mut [u8]) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 {
            let log2 = if amax.is_normal() {
                ((amax.to_bits() >> 23) as i32 - 127) as f32
            } else {
                amax.log2().floor()
            };
            (log2 - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = scale(e);
        let best = |v: f32| {
            let err = |c: usize| (KVALUES[c] as f32 * d - v).abs();
            (1..16).fold(0, |b, c| if err(c) < err(b) { c } else { b }) as u8
        };
        blk[E] = e;
        for j in 0..16 {
            blk[QS + j] = best(x[j]) | (best(x[j + 16]) << 4);
        }
    }
}

/// Q4_K: super-blocks of 256 values in eight sub-blocks of 32, `d * scale * q - dmin * min` with
/// `q` of 4 bits and a 6-bit scale and min per sub-block.
pub mod q4k {
    pub const ELEMS: usize = 256;
    pub const BYTES: usize = 144;
    pub const D: usize = 0;
    pub const DMIN: usize = 2;
    /// 12 bytes of 6-bit scales and mins (see `q4k_scales_mins`).
    pub const SCALES: usize = 4;
    /// 128 bytes: per 64 values, 32 bytes whose low nibbles are the first 32, high nibbles the next.
    pub const QS: usize = 16;
    pub const PACKED_BYTES: usize = 2368;
    /// `dmin[16]`.
    pub const PACKED_DMIN: usize = 32;
    /// `scale[8][16]` as u8.
    pub const PACKED_SCALES: usize = 64;
    /// `min[8][16]` as u8.
    pub const PACKED_MINS: usize = 192;
    pub const PACKED_QS: usize = 320;
}

/// Q6_K: super-blocks of 256 values in sixteen sub-blocks of 16, `d * scale * (q - 32)` with `q`
/// of 6 bits and a signed 8-bit scale per sub-block.
pub mod q6k {
    pub const ELEMS: usize = 256;
    pub const BYTES: usize = 210;
    /// 128 bytes of the low four bits.
    pub const QL: usize = 0;
    /// 64 bytes of the top two bits.
    pub const QH: usize = 128;
    pub const SCALES: usize = 192;
    pub const D: usize = 208;
    pub const PACKED_BYTES: usize = 3392;
    /// `scale[16][16]` as i8 (after `d[16]` and 32 bytes of padding).
    pub const PACKED_SCALES: usize = 64;
    /// The low four bits, laid out as Q4_K's nibbles.
    pub const PACKED_QL: usize = 320;
    /// The top two bits, 64 bytes per sub-block.
    pub const PACKED_QH: usize = 2368;
}

/// The constant `$name` of the module of `$format`.
macro_rules! of_format {
    ($format:expr, $name:ident) => {
        match $format {
            Format::Q4_0 => q4_0::$name,
            Format::Q4_1 => q4_1::$name,
            Format::Q5_0 => q5_0::$name,
            Format::Q8_0 => q8_0::$name,
            Format::Q4K => q4k::$name,
            Format::Q6K => q6k::$name,
            Format::Mxfp4 => mxfp4::$name,
        }
    };
}

/// The weight formats with our own kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Format {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    Q4K,
    Q6K,
    Mxfp4,
}

impl Format {
    /// The format of a tensor type, if it is one of ours.
    pub fn from_type(t: impl Into<TensorType>) -> Option<Self> {
        use candle_core::quantized::GgmlDType as G;
        let d = match t.into() {
            TensorType::Mxfp4 => return Some(Format::Mxfp4),
            TensorType::Ggml(d) => d,
        };
        Some(match d {
            G::Q4_0 => Format::Q4_0,
            G::Q4_1 => Format::Q4_1,
            G::Q5_0 => Format::Q5_0,
            G::Q8_0 => Format::Q8_0,
            G::Q4K => Format::Q4K,
            G::Q6K => Format::Q6K,
            _ => return None,
        })
    }

    /// The format whose `Format::X as u8` is `code`: the SIMD kernels take the format as a const
    /// parameter, which an enum cannot be.
    pub const fn from_code(code: u8) -> Self {
        const ALL: [Format; 7] = [
            Format::Q4_0,
            Format::Q4_1,
            Format::Q5_0,
            Format::Q8_0,
            Format::Q4K,
            Format::Q6K,
            Format::Mxfp4,
        ];
        let f = ALL[code as usize];
        assert!(f as u8 == code, "not a format code");
        f
    }

    /// (elements, bytes) of one super-block.
    pub const fn super_block(self) -> (usize, usize) {
        (of_format!(self, ELEMS), of_format!(self, BYTES))
    }

    /// Where a block keeps its f16 scale `d` (MXFP4 has an exponent byte instead: `scale32`).
    pub const fn d_at(self) -> usize {
        match self {
            Format::Q4_0 => q4_0::D,
            Format::Q4_1 => q4_1::D,
            Format::Q5_0 => q5_0::D,
            Format::Q8_0 => q8_0::D,
            Format::Q4K => q4k::D,
            Format::Q6K => q6k::D,
            Format::Mxfp4 => panic!("MXFP4 has no f16 scale"),
        }
    }

    /// The float scale of one block of a 32-element format.
    #[inline(always)]
    pub fn scale32(self, blk: &[u8]) -> f32 {
        match self {
            Format::Mxfp4 => mxfp4::scale(blk[mxfp4::E]),
            _ => f16_at(blk, self.d_at()),
        }
    }

    /// The activation block size the format's kernel wants.
    pub const fn act_block(self) -> usize {
        self.super_block().0
    }

    /// Bytes of one packed unit of 16 rows.
    pub const fn packed_bytes(self) -> usize {
        of_format!(self, PACKED_BYTES)
    }

    /// Columns per packed unit: a super-block, or two 32-element blocks.
    pub const fn unit_cols(self) -> usize {
        match self {
            Format::Q4K | Format::Q6K => self.super_block().0,
            _ => 2 * self.super_block().0,
        }
    }

    /// Where a packed unit of a 32-element format keeps its values.
    pub const fn packed_values(self) -> usize {
        match self {
            Format::Q4_1 => q4_1::PACKED_QS,
            Format::Q5_0 => q5_0::PACKED_QS,
            Format::Q4_0 => q4_0::PACKED_QS,
            Format::Q8_0 => q8_0::PACKED_QS,
            Format::Mxfp4 => mxfp4::PACKED_QS,
            Format::Q4K | Format::Q6K => panic!("256-element format"),
        }
    }

    /// Decodes one block of a 32-element format into integers `w` with `value = scale * w + offset`.
    pub fn decode32(self, blk: &[u8], w: &mut [i8; 32]) -> (f32, f32) {
        let d = self.scale32(blk);
        match self {
            Format::Q4_0 | Format::Q4_1 => {
                let qs = &blk[if self == Format::Q4_0 {
                    q4_0::QS
                } else {
                    q4_1::QS
                }..][..16];
                for j in 0..16 {
                    w[j] = (qs[j] & 0xF) as i8;
                    w[j + 16] = (qs[j] >> 4) as i8;
                }
                let offset = if self == Format::Q4_0 {
                    -8.0 * d
                } else {
                    f16_at(blk, q4_1::M)
                };
                (d, offset)
            }
            Format::Q5_0 => {
                let h = q5_0::QH;
                let qh = u32::from_le_bytes([blk[h], blk[h + 1], blk[h + 2], blk[h + 3]]);
                let qs = &blk[q5_0::QS..q5_0::QS + 16];
                for j in 0..16 {
                    let h0 = ((qh >> j) & 1) as u8;
                    let h1 = ((qh >> (j + 16)) & 1) as u8;
                    w[j] = ((qs[j] & 0xF) | (h0 << 4)) as i8;
                    w[j + 16] = ((qs[j] >> 4) | (h1 << 4)) as i8;
                }
                (d, -16.0 * d)
            }
            Format::Q8_0 => {
                for j in 0..32 {
                    w[j] = blk[q8_0::QS + j] as i8;
                }
                (d, 0.0)
            }
            Format::Mxfp4 => {
                for (j, c) in mxfp4_codes(blk).iter().enumerate() {
                    w[j] = mxfp4::KVALUES[*c as usize];
                }
                (d, 0.0)
            }
            Format::Q4K | Format::Q6K => unreachable!("256-element format"),
        }
    }

    /// Q4_K: the 4-bit integers of the super-block and (d * scale, dmin * min) per 32.
    pub fn decode_q4k(sb: &[u8], w: &mut [u8; 256]) -> ([f32; 8], [f32; 8]) {
        let (d, dmin) = (f16_at(sb, q4k::D), f16_at(sb, q4k::DMIN));
        let (sc, m) = q4k_scales_mins(&sb[q4k::SCALES..q4k::QS]);
        for p in 0..4 {
            let qs = &sb[q4k::QS + 32 * p..q4k::QS + 32 * p + 32];
            for l in 0..32 {
                w[64 * p + l] = qs[l] & 0xF;
                w[64 * p + 32 + l] = qs[l] >> 4;
            }
        }
        (sc.map(|s| d * s as f32), m.map(|v| dmin * v as f32))
    }

    /// Q6_K: the 6-bit integers (0..63, value is scale * (q - 32)) and the integer scale per 16.
    pub fn decode_q6k(sb: &[u8], w: &mut [u8; 256]) -> [i8; 16] {
        for half in 0..2 {
            let ql = &sb[q6k::QL + 64 * half..];
            let qh = &sb[q6k::QH + 32 * half..];
            for l in 0..32 {
                let o = 128 * half + l;
                w[o] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                w[o + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                w[o + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                w[o + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        let mut sc = [0i8; 16];
        for (i, s) in sc.iter_mut().enumerate() {
            *s = sb[q6k::SCALES + i] as i8;
        }
        sc
    }

    /// The real values of one super-block (for tests against candle's dequantization).
    pub fn dequantize_super_block(self, sb: &[u8]) -> Vec<f32> {
        match self {
            Format::Q4K => {
                let mut w = [0u8; 256];
                let (s, m) = Self::decode_q4k(sb, &mut w);
                (0..256)
                    .map(|e| s[e / 32] * w[e] as f32 - m[e / 32])
                    .collect()
            }
            Format::Q6K => {
                let mut w = [0u8; 256];
                let sc = Self::decode_q6k(sb, &mut w);
                let d = f16_at(sb, q6k::D);
                (0..256)
                    .map(|e| d * sc[e / 16] as f32 * (w[e] as i32 - 32) as f32)
                    .collect()
            }
            Format::Mxfp4 => {
                let mut out = vec![0f32; 32];
                mxfp4::dequantize_block(sb, &mut out);
                out
            }
            _ => {
                let mut w = [0i8; 32];
                let (s, o) = self.decode32(sb, &mut w);
                w.iter().map(|&v| s * v as f32 + o).collect()
            }
        }
    }
}

/// The 4-bit codes of an MXFP4 block, in order.
pub fn mxfp4_codes(blk: &[u8]) -> [u8; 32] {
    let mut c = [0u8; 32];
    for j in 0..16 {
        c[j] = blk[mxfp4::QS + j] & 0xF;
        c[j + 16] = blk[mxfp4::QS + j] >> 4;
    }
    c
}

/// The f16 at `bytes[at..at + 2]` as f32.
#[inline(always)]
pub fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// The 6-bit scales and mins of the eight sub-blocks of a Q4_K super-block. The 12 packed bytes
/// hold scales 0..4 and mins 0..4 in the low 6 bits of bytes 0..4 and 4..8; scales and mins 4..8
/// have their low 4 bits in the nibbles of bytes 8..12 and their top 2 bits in the top bits of
/// bytes 0..4 and 4..8. Done four bytes at a time.
#[inline(always)]
pub fn q4k_scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    let six = 0x3f3f_3f3f;
    let sc_hi = (c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4);
    let m_hi = ((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4);
    let join = |lo: u32, hi: u32| (u64::from(lo) | (u64::from(hi) << 32)).to_le_bytes();
    (join(a & six, sc_hi), join(b & six, m_hi))
}
