//! The q8 KV cache (`KvDtype::Q8`, llama.cpp's `q8_0` cache in spirit): each block of 32
//! numbers of a key or a value is stored as 32 int8s and one f16 scale, so that a number is its
//! int8 times its block's scale, 8.5 bits in all (bf16 and f16 take 16, f32 32).
//!
//! Layout, in bytes, per key/value head (`KvStored` for `u8`):
//! - keys transposed as in every cache: row `i < hd` holds dimension `i` of each position; then
//!   for each block `b` of 32 dimensions two rows, the low and the high byte of its scale for
//!   each position (rows `hd + 2b` and `hd + 2b + 1`), so that every row holds one byte per
//!   position and the cache's row copies (`KvCache::take_rows`, `keep_rows`) move scales with
//!   their numbers;
//! - values one position after another, `stored(hd)` bytes each: the `hd` int8s, then each
//!   block's scale, low byte first.
//!
//! Attention computes in f32 over the numbers exactly as stored: an int8 times an f16 scale is
//! exact in f32, so a q8 head dequantized to f32 and given to the f32 kernels (block by block in
//! `x86::attend_rows_q8_*`, whole here for the plain loops) gives the same bits everywhere, and a
//! row's result does not depend on what shares its pass.

use half::f16;

/// Numbers per block: one scale each.
pub const BLOCK: usize = 32;

/// Bytes one position of a head of `hd` dimensions takes, keys or values: the int8s and two
/// bytes of scale per block.
pub const fn stored(hd: usize) -> usize {
    hd + 2 * (hd / BLOCK)
}

/// Whether a head of `hd` dimensions can be cached in q8: whole blocks.
pub const fn fits(hd: usize) -> bool {
    hd > 0 && hd.is_multiple_of(BLOCK)
}

/// Quantizes one block: `q[i]` the int8 nearest to `x[i]` over the scale (ties to even), the
/// scale the f16 nearest to the block's largest magnitude over 127 (at most f16's largest number:
/// a block beyond saturates at +-127 of it). Returns the scale's bits.
pub fn quantize_block(x: &[f32], q: &mut [i8]) -> u16 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32((amax / 127.0).min(f16::MAX.to_f32()));
    let step = d.to_f32();
    // Adding and taking away 1.5 * 2^23 rounds a float of magnitude below 2^22 to the nearest
    // integer, ties to even (f32's own rounding), without a call to `roundf`.
    const ROUND: f32 = 12_582_912.0;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = if step > 0.0 {
            let r = (v / step).clamp(-127.0, 127.0);
            // A NaN stays NaN through both and becomes 0 (`as` maps NaN to zero).
            ((r + ROUND) - ROUND) as i8
        } else {
            0
        };
    }
    d.to_bits()
}

/// The f16 scale whose low and high bytes are `lo` and `hi`, as f32.
#[inline]
pub fn scale(lo: u8, hi: u8) -> f32 {
    f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

/// Quantizes one head's key or value of `hd` numbers into its `stored(hd)` bytes, byte `n`
/// going where `put(n, byte)` puts it: the int8s at `0..hd`, block `b`'s scale (low, high byte)
/// at `hd + 2b` and `hd + 2b + 1`.
fn write_head(x: &[f32], mut put: impl FnMut(usize, u8)) {
    let hd = x.len();
    let mut q = [0i8; BLOCK];
    for (b, block) in x.chunks_exact(BLOCK).enumerate() {
        let [lo, hi] = quantize_block(block, &mut q).to_le_bytes();
        for (j, &v) in q.iter().enumerate() {
            put(b * BLOCK + j, v as u8);
        }
        put(hd + 2 * b, lo);
        put(hd + 2 * b + 1, hi);
    }
}

/// Number `i` of one head's key or value, byte `n` of its stored bytes being `byte(n)` (laid out
/// as `write_head` puts them), as f32: exact.
#[inline]
fn number(byte: impl Fn(usize) -> u8, hd: usize, i: usize) -> f32 {
    let b = i / BLOCK;
    byte(i) as i8 as f32 * scale(byte(hd + 2 * b), byte(hd + 2 * b + 1))
}

/// Writes one head's key of `hd` numbers (`key`) at position `pos` of its transposed rows
/// (`keys`, rows `ks` apart), quantized.
pub fn write_key(keys: &mut [u8], ks: usize, pos: usize, key: &[f32]) {
    write_head(key, |n, byte| keys[n * ks + pos] = byte)
}

/// Writes one head's value of `hd` numbers at its place (`value_row`, `stored(hd)` bytes),
/// quantized.
pub fn write_value(value_row: &mut [u8], value: &[f32]) {
    write_head(value, |n, byte| value_row[n] = byte)
}

/// Dimension `i` of key `t` of a q8 head (`hd` dimensions, rows `ks` apart), as f32: exact.
#[inline]
pub fn key(keys: &[u8], hd: usize, ks: usize, i: usize, t: usize) -> f32 {
    number(|n| keys[n * ks + t], hd, i)
}

/// Dimension `d` of value `t` of a q8 head (`vs` bytes per position), as f32: exact.
#[inline]
pub fn value(values: &[u8], hd: usize, vs: usize, t: usize, d: usize) -> f32 {
    number(|n| values[t * vs + n], hd, d)
}

/// The keys and values of positions `from..to` of a q8 head, dequantized: keys transposed into
/// `keys` (rows `ks_out` apart, position `from` first), values one after another into `values`
/// (`hd` each). The plain loops; the vector kernels have their own (`x86::q8_attention`), with
/// the same products.
pub fn dequantize(
    (keys, values): (&[u8], &[u8]),
    (hd, ks, vs): (usize, usize, usize),
    (from, to): (usize, usize),
    (keys_out, ks_out): (&mut [f32], usize),
    values_out: &mut [f32],
) {
    for i in 0..hd {
        for t in from..to {
            keys_out[i * ks_out + t - from] = key(keys, hd, ks, i, t);
        }
    }
    for (t, out) in (from..to).zip(values_out.chunks_exact_mut(hd)) {
        for (d, o) in out.iter_mut().enumerate() {
            *o = value(values, hd, vs, t, d);
        }
    }
}
