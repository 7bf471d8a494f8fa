//! Our quantized dot products for few activation rows, in plain Rust: the reference every SIMD path
//! is tested against, and the fallback on CPUs without AVX2.
//!
//! Activations are quantized to 8-bit integers with one float scale per block: 32 values for the
//! 32-element weight formats (Q4_0, Q4_1, Q5_0, Q8_0, MXFP4), 256 values for the K-quants (Q4_K, Q6_K),
//! whose integer scales are then applied in the integer domain across a whole super-block. Sums of
//! the activation integers (per 32-block, or per 16 inside a 256-block) carry the formats' offsets
//! and minimums, so weights are handled as small unsigned integers.
//!
//! The activations' quantization, plain and AVX2, lives here with the type every kernel reads, so
//! that this module needs nothing from `x86` (whose kernels read it).

use super::format::{f16_at, q4k, q4k_scales_mins, q6k, Format};

/// Activation rows quantized to 8 bits per block of `block` values. Only `quantize` fills it: the
/// SIMD kernels read it without bounds checks, trusting the lengths `quantize` gives.
#[derive(Default, Clone)]
pub struct QuantizedActs {
    pub(crate) rows: usize,
    pub(crate) k: usize,
    pub(crate) block: usize,
    pub(crate) q: Vec<i8>,
    /// Scale of each block.
    pub(crate) d: Vec<f32>,
    /// Per 32 elements: the block's scale times the sum of those 32 integers.
    pub(crate) ds: Vec<f32>,
    /// Sums of each 16 integers (256-blocks).
    pub(crate) bsums: Vec<i16>,
    /// 256-blocks: -32 times each of `bsums`, as i32 (Q6_K stores its values plus 32; the packed
    /// kernels with VNNI start each sub-block's integer sum from it).
    pub(crate) q6k_offsets: Vec<i32>,
    /// 32-blocks: each block's integer sum times -8, -16, -128 and -12, the offsets of the packed
    /// Q4_0, Q5_0, Q8_0 (stored plus 128) and MXFP4 (taken plus 12) values, from which the packed
    /// kernels start the block's integer sums (`OFFSET_Q4_0`, ...).
    pub(crate) offsets32: Vec<[i32; 4]>,
    /// Per 32 elements: the sum of those 32 integers (within +-32 * 127; the packed Q4_K kernel
    /// broadcasts them two at a time).
    pub(crate) isums: Vec<i16>,
    /// 32-blocks, for kernels that hold two blocks per vector: each block's scale eight times
    /// over. Filled by `spread`.
    pub(crate) spread_d: Vec<f32>,
    /// The integers again in AMX tile order, for passes on tiles: per tile of 16 rows and per 64
    /// columns, the 16 rows' 64 bytes one after the other (1 KB), so that each tile loads from
    /// consecutive lines (rows `k` bytes apart fall on a few cache sets). Filled by `tile`.
    pub(crate) tiled: Vec<i8>,
}

/// One block of activations to 8 bits (`quant::quantize_block`'s arithmetic): returns the scale.
///
/// # Safety
/// `xs.len()` is a multiple of 32 and `qs` as long.
pub(crate) type QuantizeBlock = unsafe fn(&[f32], &mut [i8]) -> f32;

impl QuantizedActs {
    /// Quantizes `rows` rows of `k` values in blocks of `block` (`k` a multiple of it).
    pub fn quantize(&mut self, x: &[f32], rows: usize, k: usize, block: usize) {
        self.quantize_with(super::isa(), x, rows, k, block)
    }

    /// `quantize` with a chosen implementation (the SIMD one gives the same integers and scales).
    pub fn quantize_with(
        &mut self,
        isa: super::Isa,
        x: &[f32],
        rows: usize,
        k: usize,
        block: usize,
    ) {
        let quantizer = isa.kernels().quantize_block;
        // Whole blocks of whole 32s: the block quantizers write 32 values at a time.
        assert!(
            block > 0 && block.is_multiple_of(32) && k.is_multiple_of(block),
            "blocks of {block} in {k}"
        );
        self.rows = rows;
        self.k = k;
        self.block = block;
        let nb = rows * k / block;
        // Padded to whole tiles of 16 rows: the AMX kernels load sixteen rows at a time (the
        // padding rows' sums are never read).
        self.q.resize(rows.next_multiple_of(16) * k, 0);
        // Padded so that a SIMD load of 16 floats at any block stays inside.
        self.d.resize(nb + 16, 0.0);
        self.ds.resize(rows * k / 32 + 16, 0.0);
        self.isums.resize(rows * k / 32, 0);
        self.bsums.resize(rows * k / 16, 0);
        // Rows go to the pool in runs once there are enough of them (a prefill chunk): every
        // block is quantized on its own, so the split does not change a bit.
        let threads = super::pool::global().threads();
        let runs = if threads > 1 && rows >= 4 && rows * k >= 1 << 15 {
            (2 * threads).min(rows)
        } else {
            1
        };
        let mut rest = Blocks {
            x: &x[..rows * k],
            q: &mut self.q[..rows * k],
            d: &mut self.d[..nb],
            ds: &mut self.ds[..rows * k / 32],
            isums: &mut self.isums[..],
            bsums: &mut self.bsums[..],
        };
        let mut parts = Vec::with_capacity(runs);
        for i in 0..runs {
            let n = (rows * (i + 1) / runs - rows * i / runs) * k;
            let (run, after) = rest.split_at(n, block);
            parts.push(std::sync::Mutex::new(run));
            rest = after;
        }
        super::pool::global().run(runs, &|i| {
            let mut part = parts[i].lock().unwrap_or_else(|e| e.into_inner());
            part.quantize(quantizer, block);
        });
        self.q6k_offsets.clear();
        self.offsets32.clear();
        if block == 256 {
            self.q6k_offsets
                .extend(self.bsums.iter().map(|&b| -32 * b as i32));
        } else {
            let bias = -(super::format::mxfp4::BIAS as i32);
            let offsets = |&i: &i16| [-8, -16, -128, bias].map(|c| c * i as i32);
            self.offsets32.extend(self.isums.iter().map(offsets));
        }
    }

    /// Fills `spread_d` from `d` (32-blocks).
    pub fn spread(&mut self) {
        debug_assert_eq!(self.block, 32);
        let nb = self.rows * self.k / 32;
        self.spread_d.resize(nb * 8, 0.0);
        for b in 0..nb {
            self.spread_d[b * 8..b * 8 + 8].fill(self.d[b]);
        }
    }

    /// Fills `tiled` from the integers (rows padded to whole tiles of 16; `k` a multiple of 64).
    pub fn tile(&mut self) {
        let (k, tiles) = (self.k, self.rows.div_ceil(16));
        assert!(k.is_multiple_of(64), "{k} columns in tiles of 64");
        self.tiled.resize(tiles * 16 * k, 0);
        for (t, out) in self.tiled.chunks_exact_mut(16 * k).enumerate() {
            for (c, chunk) in out.chunks_exact_mut(1024).enumerate() {
                for (i, row) in chunk.chunks_exact_mut(64).enumerate() {
                    row.copy_from_slice(&self.q[(16 * t + i) * k + 64 * c..][..64]);
                }
            }
        }
    }

    /// The integers of `row`, blocks `b..`.
    #[inline(always)]
    pub fn q_at(&self, row: usize, elem: usize) -> &[i8] {
        &self.q[row * self.k + elem..]
    }

    #[inline(always)]
    pub fn block_index(&self, row: usize, b: usize) -> usize {
        row * (self.k / self.block) + b
    }
}

/// Where each format's offset sits in an entry of `QuantizedActs::offsets32`.
pub(crate) const OFFSET_Q4_0: usize = 0;
pub(crate) const OFFSET_Q5_0: usize = 1;
pub(crate) const OFFSET_Q8_0: usize = 2;
pub(crate) const OFFSET_MXFP4: usize = 3;

/// A run of whole rows: the values and their share of every output of `QuantizedActs`.
struct Blocks<'a> {
    x: &'a [f32],
    q: &'a mut [i8],
    d: &'a mut [f32],
    ds: &'a mut [f32],
    isums: &'a mut [i16],
    bsums: &'a mut [i16],
}

impl<'a> Blocks<'a> {
    /// The first `n` values (whole blocks of `block`) and the rest.
    fn split_at(self, n: usize, block: usize) -> (Blocks<'a>, Blocks<'a>) {
        let (x, x2) = self.x.split_at(n);
        let (q, q2) = self.q.split_at_mut(n);
        let (d, d2) = self.d.split_at_mut(n / block);
        let (ds, ds2) = self.ds.split_at_mut(n / 32);
        let (isums, isums2) = self.isums.split_at_mut(n / 32);
        let (bsums, bsums2) = self.bsums.split_at_mut(n / 16);
        (
            Blocks {
                x,
                q,
                d,
                ds,
                isums,
                bsums,
            },
            Blocks {
                x: x2,
                q: q2,
                d: d2,
                ds: ds2,
                isums: isums2,
                bsums: bsums2,
            },
        )
    }

    fn quantize(&mut self, quantizer: Option<QuantizeBlock>, block: usize) {
        for (b, (xs, qs)) in self
            .x
            .chunks_exact(block)
            .zip(self.q.chunks_exact_mut(block))
            .enumerate()
        {
            let d = quantize_block(quantizer, xs, qs);
            self.d[b] = d;
            for (g, grp) in qs.chunks_exact(32).enumerate() {
                let sum: i32 = grp.iter().map(|&v| v as i32).sum();
                self.ds[b * block / 32 + g] = d * sum as f32;
                self.isums[b * block / 32 + g] = sum as i16;
            }
            for (g, grp) in qs.chunks_exact(16).enumerate() {
                let sum: i16 = grp.iter().map(|&v| v as i16).sum();
                self.bsums[b * block / 16 + g] = sum;
            }
        }
    }
}

/// One block to 8 bits: the scale `amax / 127`, and each value divided by it, rounded to nearest
/// even.
fn quantize_block(quantizer: Option<QuantizeBlock>, xs: &[f32], qs: &mut [i8]) -> f32 {
    if let Some(quantize) = quantizer {
        // SAFETY: the quantizer is from the table of a class the CPU runs (`Isa::kernels`); the
        // block is a multiple of 32 long and `qs` as long as `xs`.
        return unsafe { quantize(xs, qs) };
    }
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, v) in qs.iter_mut().zip(xs) {
        *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    d
}

/// Quantizes one block of activations to 8 bits: returns the scale `amax / 127` and writes
/// `round_ties_even(x / scale)` to `qs`, exactly as the plain version does (same product, same
/// rounding). `xs.len()` is a multiple of 32.
///
/// # Safety
/// The CPU must have AVX2; `qs.len() == xs.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize_block_avx2(xs: &[f32], qs: &mut [i8]) -> f32 {
    use std::arch::x86_64::*;
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

/// Plain-Rust dot products of one weight row with activation rows `r0..r0 + out.len()`.
pub fn dot_rows_scalar(f: Format, wrow: &[u8], acts: &QuantizedActs, r0: usize, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = dot_row_scalar(f, wrow, acts, r0 + i);
    }
}

fn idot(w: impl Iterator<Item = i32>, q: &[i8]) -> i32 {
    w.zip(q).map(|(a, &b)| a * b as i32).sum()
}

fn dot_row_scalar(f: Format, wrow: &[u8], acts: &QuantizedActs, r: usize) -> f32 {
    let (elems, bytes) = f.super_block();
    let mut acc = 0f32;
    for (s, sb) in wrow.chunks_exact(bytes).enumerate() {
        let bi = acts.block_index(r, s);
        let (dx, q) = (acts.d[bi], acts.q_at(r, s * elems));
        match f {
            Format::Q4K => {
                let mut w = [0u8; 256];
                let (d, dmin) = (f16_at(sb, q4k::D), f16_at(sb, q4k::DMIN));
                let (sc, m) = q4k_scales_mins(&sb[q4k::SCALES..q4k::QS]);
                Format::decode_q4k(sb, &mut w);
                let mut isum = 0i32;
                let mut msum = 0i32;
                for sub in 0..8 {
                    let e = sub * 32;
                    isum += sc[sub] as i32 * idot(w[e..e + 32].iter().map(|&v| v as i32), &q[e..]);
                    let b16 = &acts.bsums[bi * 16 + 2 * sub..];
                    msum += m[sub] as i32 * (b16[0] as i32 + b16[1] as i32);
                }
                acc += d * dx * isum as f32 - dmin * dx * msum as f32;
            }
            Format::Q6K => {
                let mut w = [0u8; 256];
                let sc = Format::decode_q6k(sb, &mut w);
                let mut isum = 0i32;
                for (g, &s) in sc.iter().enumerate() {
                    let e = g * 16;
                    let raw = idot(w[e..e + 16].iter().map(|&v| v as i32), &q[e..]);
                    isum += s as i32 * (raw - 32 * acts.bsums[bi * 16 + g] as i32);
                }
                acc += f16_at(sb, q6k::D) * dx * isum as f32;
            }
            _ => {
                let mut w = [0i8; 32];
                let (scale, offset) = f.decode32(sb, &mut w);
                let isum = idot(w.iter().map(|&v| v as i32), q);
                acc += scale * dx * isum as f32 + offset * acts.ds[bi];
            }
        }
    }
    acc
}
