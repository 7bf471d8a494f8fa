//! Rotated int8: an arithmetic for a prompt's rows on int8 tiles, with one scale per row on
//! both sides and integer sums over the whole row.
//!
//! One int8 scale per row loses too much where a row has a few large numbers (the inputs of a
//! layer's products have a largest-to-RMS ratio of 5-94): most of its numbers land a few steps
//! of the grid. A rotation spreads them first. Every block of 256 columns, of the weights' rows
//! and of the activations' rows alike, is multiplied by the same orthogonal matrix, a
//! Walsh-Hadamard transform after fixed signs per column (`rotate`); a product of two rows is
//! the product of their rotations, so the rotation changes no result but the rounding. Then
//! each row is rounded to int8 by one scale (`quantize_row`), the products summed exactly in
//! 32-bit integers, and each sum times the two rows' scales.
//!
//! The weights' rotation is made once per matrix, a copy of one byte per weight laid out as the
//! tiles read it (`RotatedInt8`); the activations' once per product. Every step is exact but
//! the rounding to int8 and the last multiply, and a row's scale is its own: a row's result
//! depends on the row alone. This module is the arithmetic's plain definition; the tile kernel
//! (`x86::amx_prompt_int8`) and the VNNI one (`x86::vnni_prompt_int8`) give the same bits.

/// Columns per rotated block.
pub const BLOCK: usize = 256;

/// Weight rows per strip of the copy (two tiles of 16).
pub const STRIP: usize = 32;

/// Columns per tile step (a tile row of 64 int8).
pub const STEP: usize = 64;

/// Factor between a rotated row's largest magnitude and its scale: 127 steps each side, and
/// the transform's normalisation (1/16 for blocks of 256) folded in, a power of two.
pub const SCALE_DIVISOR: f32 = 127.0 * 16.0;

/// The fixed sign of column `k` of a block (a hash of `k`: no pattern the data could share).
pub const fn sign(k: usize) -> f32 {
    let mut h = (k as u32).wrapping_mul(0x9E37_79B9) ^ 0x5BD1_E995;
    h ^= h >> 15;
    h = h.wrapping_mul(0x2C1B_3C6D);
    h ^= h >> 12;
    if h & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// `sign` of each column of a block.
pub const SIGNS: [f32; BLOCK] = {
    let mut s = [0f32; BLOCK];
    let mut k = 0;
    while k < BLOCK {
        s[k] = sign(k);
        k += 1;
    }
    s
};

/// Each block of 256 numbers of `v` (a multiple of 256 long) times its signs, then the
/// Walsh-Hadamard butterflies in stages of distance 1, 2, ..., 128 (unnormalised: the result is
/// 16 times the orthogonal rotation's, exactly). Each number of a stage is one sum or difference
/// of two numbers of the stage before, in this order.
pub fn rotate(v: &mut [f32]) {
    assert!(v.len().is_multiple_of(BLOCK));
    for blk in v.chunks_exact_mut(BLOCK) {
        for (x, s) in blk.iter_mut().zip(SIGNS) {
            *x *= s;
        }
        let mut h = 1;
        while h < BLOCK {
            for i in (0..BLOCK).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (blk[j], blk[j + h]);
                    blk[j] = a + b;
                    blk[j + h] = a - b;
                }
            }
            h *= 2;
        }
    }
}

/// A row's inverse step and scale from its largest magnitude (after `rotate`): the numbers
/// times `inv` rounded to the nearest integer (ties to even) are its int8s, and an int8 times
/// `scale` is the rotated number's share of the orthogonal rotation. Both zero for a row of
/// zeros or one with a number that is not finite.
pub fn row_scale(max: f32) -> (f32, f32) {
    if max > 0.0 && max.is_finite() {
        (127.0 / max, max / SCALE_DIVISOR)
    } else {
        (0.0, 0.0)
    }
}

/// `v` rounded to the nearest integer, ties to even, for `|v| < 2^22` (every number
/// `quantize_row` rounds): adding and taking away 1.5 * 2^23 leaves no fraction, and the IEEE
/// default rounds that sum to nearest even. The same result as `f32::round_ties_even`, which
/// the baseline x86-64 target calls a library function for, once per weight of a copy.
#[inline(always)]
fn nearest(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// `v` (rotated) rounded to int8 into `out` by one scale, which it returns (`row_scale`).
pub fn quantize_row(v: &[f32], out: &mut [i8]) -> f32 {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let (inv, scale) = row_scale(max);
    for (q, &x) in out.iter_mut().zip(v) {
        *q = nearest(x * inv).clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// A row rotated in place and rounded to int8 (the second slice), returning its scale.
pub type Round = dyn Fn(&mut [f32], &mut [i8]) -> f32 + Sync;

/// `rotate`, then `quantize_row`: the definition of a row's int8s and scale.
pub fn plain_round(v: &mut [f32], q: &mut [i8]) -> f32 {
    rotate(v);
    quantize_row(v, q)
}

/// A weight matrix rotated and rounded to int8 per row, in tile order: per strip of 32 rows,
/// per step of 64 columns, two tiles (rows 0-15 and 16-31 of the strip) of sixteen lines; line
/// `i` of a tile holds columns `4i..4i + 4` of the step for each of its sixteen rows (bytes
/// `4l..4l + 4` row `l`), as `tdpbssd` reads its second operand.
pub struct RotatedInt8 {
    pub rows: usize,
    pub cols: usize,
    /// `rows * cols` bytes in 64-byte lines.
    pub lines: Vec<Line>,
    /// Per row, its scale.
    pub scale: Vec<f32>,
    /// Per row, the sum of its int8s (what an unsigned operand's offset of 128 adds to a
    /// product, 128 times this: `vpdpbusd` multiplies unsigned bytes by signed ones).
    pub sums: Vec<i32>,
}

/// 64 bytes, aligned as a tile row.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct Line(pub [i8; 64]);

impl Default for Line {
    fn default() -> Self {
        Line([0; 64])
    }
}

impl RotatedInt8 {
    /// Whether a matrix of this shape has a rotated copy: whole strips and blocks.
    pub fn fits(rows: usize, cols: usize) -> bool {
        rows.is_multiple_of(STRIP) && cols.is_multiple_of(BLOCK) && cols > 0
    }

    /// The copy of a `rows x cols` matrix (`fits`) whose row `r` `row(r, out)` writes as f32
    /// (`QMatrix::dequantize_row`), its strips made on the pool's threads; each row rotated and
    /// rounded by `round(row, int8s)`, which returns its scale: `plain_round`, or a class's
    /// kernel with the same bits.
    pub fn of(
        rows: usize,
        cols: usize,
        row: &(dyn Fn(usize, &mut [f32]) + Sync),
        round: &Round,
    ) -> RotatedInt8 {
        assert!(Self::fits(rows, cols), "{rows} x {cols}");
        let steps = cols / STEP;
        let mut lines = vec![Line::default(); rows * cols / 64];
        let per_row = std::sync::Mutex::new((vec![0f32; rows], vec![0i32; rows]));
        let strip_lines = steps * 2 * 16;
        super::par_chunks_mut(&mut lines, strip_lines, &|s, out| {
            let mut v = vec![0f32; cols];
            let mut q = vec![0i8; cols];
            let mut scales = [0f32; STRIP];
            let mut sums = [0i32; STRIP];
            for (j, (sc, sum)) in scales.iter_mut().zip(&mut sums).enumerate() {
                row(s * STRIP + j, &mut v);
                *sc = round(&mut v, &mut q);
                *sum = q.iter().map(|&b| b as i32).sum();
                let (h, l) = (j / 16, j % 16);
                for (c, chunk) in q.chunks_exact(STEP).enumerate() {
                    for (i, four) in chunk.chunks_exact(4).enumerate() {
                        let line = &mut out[(c * 2 + h) * 16 + i];
                        line.0[4 * l..4 * l + 4].copy_from_slice(four);
                    }
                }
            }
            let mut all = per_row.lock().unwrap_or_else(|e| e.into_inner());
            all.0[s * STRIP..(s + 1) * STRIP].copy_from_slice(&scales);
            all.1[s * STRIP..(s + 1) * STRIP].copy_from_slice(&sums);
        });
        let (scale, sums) = per_row.into_inner().unwrap_or_else(|e| e.into_inner());
        RotatedInt8 {
            rows,
            cols,
            lines,
            scale,
            sums,
        }
    }

    /// Bytes the copy holds.
    pub fn bytes(&self) -> usize {
        self.lines.len() * 64 + self.scale.len() * 4 + self.sums.len() * 4
    }

    /// Row `r`'s int8s (tests).
    pub fn row(&self, r: usize) -> Vec<i8> {
        let steps = self.cols / STEP;
        let (s, h, l) = (r / STRIP, r % STRIP / 16, r % 16);
        (0..self.cols)
            .map(|col| {
                let (c, i, b) = (col / STEP, col % STEP / 4, col % 4);
                self.lines[((s * steps + c) * 2 + h) * 16 + i].0[4 * l + b]
            })
            .collect()
    }
}

/// The plain definition of the products: `m` rows of `x` with the copy `w`, into `out`
/// (`m x w.rows`).
pub fn products_scalar(x: &[f32], m: usize, w: &RotatedInt8, out: &mut [f32]) {
    let k = w.cols;
    assert!(x.len() == m * k && out.len() == m * w.rows);
    let rows: Vec<Vec<i8>> = (0..w.rows).map(|r| w.row(r)).collect();
    let mut v = vec![0f32; k];
    let mut q = vec![0i8; k];
    for r in 0..m {
        v.copy_from_slice(&x[r * k..(r + 1) * k]);
        rotate(&mut v);
        let sa = quantize_row(&v, &mut q);
        for (c, wr) in rows.iter().enumerate() {
            let sum: i32 = q.iter().zip(wr).map(|(&a, &b)| a as i32 * b as i32).sum();
            out[r * w.rows + c] = sum as f32 * (sa * w.scale[c]);
        }
    }
}
