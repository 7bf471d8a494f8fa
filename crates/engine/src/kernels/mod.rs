//! Compute kernels of the forward pass: quantized matrix products for few activation rows, and the
//! small float loops (dot, axpy, RMSNorm, softmax, SiLU) the decoder layer is built from.
//!
//! This module is the one place where `unsafe` lives in the engine: reinterpreting the GGUF bytes as
//! quantized blocks and letting worker threads write disjoint output columns.
//!
//! The block formats and their integer dot products come from candle (`GgmlType`): each weight
//! block type pairs with an activation block type (`VecDotType`, e.g. Q8_0 or Q8_K); the activations
//! are quantized once per product and every weight row is applied to all activation rows while it
//! is hot in cache. Each output element is one `vec_dot` of one weight row and one activation row,
//! so its value does not depend on how many rows share the pass: plain and speculative decoding
//! produce bit-identical logits.

use candle_core::quantized::k_quants::{self, GgmlType};
use candle_core::quantized::GgmlDType;
use half::f16;
use rayon::prelude::*;
use std::sync::Arc;

/// Runs `$body` with the type alias `$t` bound to the block type of `$dtype`.
macro_rules! dispatch {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            GgmlDType::F32 => {
                type $t = f32;
                $body
            }
            GgmlDType::F16 => {
                type $t = f16;
                $body
            }
            GgmlDType::BF16 => {
                type $t = half::bf16;
                $body
            }
            GgmlDType::Q4_0 => {
                type $t = k_quants::BlockQ4_0;
                $body
            }
            GgmlDType::Q4_1 => {
                type $t = k_quants::BlockQ4_1;
                $body
            }
            GgmlDType::Q5_0 => {
                type $t = k_quants::BlockQ5_0;
                $body
            }
            GgmlDType::Q5_1 => {
                type $t = k_quants::BlockQ5_1;
                $body
            }
            GgmlDType::Q8_0 => {
                type $t = k_quants::BlockQ8_0;
                $body
            }
            GgmlDType::Q2K => {
                type $t = k_quants::BlockQ2K;
                $body
            }
            GgmlDType::Q3K => {
                type $t = k_quants::BlockQ3K;
                $body
            }
            GgmlDType::Q4K => {
                type $t = k_quants::BlockQ4K;
                $body
            }
            GgmlDType::Q5K => {
                type $t = k_quants::BlockQ5K;
                $body
            }
            GgmlDType::Q6K => {
                type $t = k_quants::BlockQ6K;
                $body
            }
            GgmlDType::Q8K => {
                type $t = k_quants::BlockQ8K;
                $body
            }
            GgmlDType::Q8_1 => unreachable!("rejected by QMatrix::new"),
        }
    };
}

/// Bytes of one weight tensor: either a window into the memory-mapped model file (zero copy) or an
/// owned buffer (tests, small tensors). Owned storage is `u32`-backed so that every block type
/// (alignment at most 4) can be viewed in place.
#[derive(Clone)]
pub enum Bytes {
    Mapped {
        map: Arc<memmap2::Mmap>,
        start: usize,
        len: usize,
    },
    Owned {
        words: Arc<Vec<u32>>,
        len: usize,
    },
}

impl Bytes {
    pub fn owned(bytes: &[u8]) -> Self {
        let mut words = vec![0u32; bytes.len().div_ceil(4)];
        for (i, chunk) in bytes.chunks(4).enumerate() {
            let mut w = [0u8; 4];
            w[..chunk.len()].copy_from_slice(chunk);
            words[i] = u32::from_ne_bytes(w);
        }
        Bytes::Owned {
            words: Arc::new(words),
            len: bytes.len(),
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, start, len } => &map[*start..*start + *len],
            Bytes::Owned { words, len } => {
                // SAFETY: a u32 buffer viewed as bytes; `len` never exceeds 4 * words.len().
                unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, *len) }
            }
        }
    }
}

/// A weight matrix of `rows` output features by `cols` input features, row-major, in one of the
/// GGUF block formats.
#[derive(Clone)]
pub struct QMatrix {
    pub dtype: GgmlDType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: Bytes,
}

/// The block formats this module can compute with.
pub fn is_supported(dtype: GgmlDType) -> bool {
    !matches!(dtype, GgmlDType::Q8_1)
}

impl QMatrix {
    /// Checks that the bytes hold exactly `rows * cols` elements of `dtype`, rows made of whole
    /// blocks, and that they are aligned for in-place viewing. Returns a message naming the problem.
    pub fn new(dtype: GgmlDType, rows: usize, cols: usize, bytes: Bytes) -> Result<Self, String> {
        if !is_supported(dtype) {
            return Err(format!("tensor type {dtype:?} is not supported"));
        }
        let bs = dtype.block_size();
        if cols % bs != 0 {
            return Err(format!(
                "row length {cols} is not a multiple of the {dtype:?} block size {bs}"
            ));
        }
        let expected = rows * (cols / bs) * dtype.type_size();
        let slice = bytes.as_slice();
        if slice.len() != expected {
            return Err(format!(
                "{} bytes where {rows}x{cols} {dtype:?} needs {expected}",
                slice.len()
            ));
        }
        if (slice.as_ptr() as usize) % 4 != 0 {
            return Err("tensor data is not 4-byte aligned".into());
        }
        Ok(QMatrix {
            dtype,
            rows,
            cols,
            bytes,
        })
    }

    /// Writes row `r` as f32 values into `out` (`out.len() == cols`): used for embedding lookup.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() == self.cols);
        dispatch!(self.dtype, T => dequantize_row_typed::<T>(self, r, out))
    }

    /// All of the matrix as f32 (tests and small tensors).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
        out
    }
}

/// Views `bytes` as blocks of `T`. Callers pass bytes checked by `QMatrix::new`.
fn blocks<T: GgmlType>(bytes: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert!(bytes.len() % size == 0);
    assert!((bytes.as_ptr() as usize) % std::mem::align_of::<T>() == 0);
    // SAFETY: the block types are plain `repr(C)` data (integers and f16) for which every bit
    // pattern is valid; length and alignment are checked above; the lifetime is that of `bytes`.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) }
}

fn dequantize_row_typed<T: GgmlType>(w: &QMatrix, r: usize, out: &mut [f32]) {
    let per_row = w.cols / T::BLCK_SIZE;
    let all = blocks::<T>(w.bytes.as_slice());
    T::to_float(&all[r * per_row..(r + 1) * per_row], out);
}

/// A raw pointer that worker threads use to write disjoint parts of one output buffer.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every worker writes a disjoint set of indices (its own output columns), and the buffer
// outlives the parallel loop, which joins before `matmul` returns.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `out[i, j] = sum_k x[i, k] * w[j, k]` for `m` activation rows: `x` is `m x w.cols`, `out` is
/// `m x w.rows`, both row-major.
pub fn matmul(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32]) {
    assert_eq!(x.len(), m * w.cols, "activation shape");
    assert_eq!(out.len(), m * w.rows, "output shape");
    if m == 0 {
        return;
    }
    dispatch!(w.dtype, T => matmul_typed::<T>(x, m, w, out))
}

fn matmul_typed<T: GgmlType>(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32]) {
    let k = w.cols;
    let n = w.rows;
    let kb = k / T::BLCK_SIZE;
    debug_assert_eq!(T::BLCK_SIZE, T::VecDotType::BLCK_SIZE);
    // Quantize every activation row once, for all weight rows.
    let mut xq = vec![T::VecDotType::zeros(); m * kb];
    for (row, q) in x.chunks_exact(k).zip(xq.chunks_exact_mut(kb)) {
        T::VecDotType::from_float(row, q);
    }
    let wb = blocks::<T>(w.bytes.as_slice());
    let out_ptr = OutPtr(out.as_mut_ptr());
    // Enough chunks to balance the threads, each a run of weight rows that stays in cache while
    // it is applied to every activation row.
    let threads = rayon::current_num_threads().max(1);
    let chunk = n.div_ceil(threads * 8).clamp(16, 1024);
    let xq = &xq;
    (0..n.div_ceil(chunk)).into_par_iter().for_each(move |c| {
        let out_ptr = out_ptr;
        let j0 = c * chunk;
        let j1 = (j0 + chunk).min(n);
        for j in j0..j1 {
            let wrow = &wb[j * kb..(j + 1) * kb];
            for i in 0..m {
                let v = T::vec_dot(k, wrow, &xq[i * kb..(i + 1) * kb]);
                // SAFETY: i < m and j < n, so the index is inside `out` (m * n elements); column j
                // belongs to this chunk alone.
                unsafe { *out_ptr.0.add(i * n + j) = v };
            }
        }
    });
}

/// Plain reference for `matmul`: dequantize the weights to f32 and multiply in f64. Used by the
/// tests to check every block format.
pub fn matmul_reference(x: &[f32], m: usize, w: &QMatrix) -> Vec<f32> {
    let wf = w.dequantize();
    let mut out = vec![0f32; m * w.rows];
    for i in 0..m {
        for j in 0..w.rows {
            let mut acc = 0f64;
            for t in 0..w.cols {
                acc += x[i * w.cols + t] as f64 * wf[j * w.cols + t] as f64;
            }
            out[i * w.rows + j] = acc as f32;
        }
    }
    out
}

/// Quantizes f32 data into `dtype` blocks (tests and tools).
pub fn quantize(dtype: GgmlDType, data: &[f32]) -> Vec<u8> {
    dispatch!(dtype, T => quantize_typed::<T>(data))
}

fn quantize_typed<T: GgmlType>(data: &[f32]) -> Vec<u8> {
    assert!(data.len() % T::BLCK_SIZE == 0);
    let mut q = vec![T::zeros(); data.len() / T::BLCK_SIZE];
    T::from_float(data, &mut q);
    let size = std::mem::size_of::<T>() * q.len();
    // SAFETY: plain data blocks viewed as their bytes.
    unsafe { std::slice::from_raw_parts(q.as_ptr() as *const u8, size) }.to_vec()
}

/// Dot product with eight independent accumulators (lets the compiler vectorize, and fixes the
/// summation order so results never depend on the caller).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = 0f32;
    for t in chunks * 8..a.len() {
        s += a[t] * b[t];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + s
}

/// `y += alpha * x`
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// RMSNorm of `x` scaled by `weight`, into `out`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ss = dot(x, x) / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    for ((o, xi), wi) in out.iter_mut().zip(x).zip(weight) {
        *o = xi * scale * wi;
    }
}

/// In-place softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `gate = silu(gate) * up`, the SwiGLU activation.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

#[cfg(test)]
mod tests;
