//! Compute kernels of the forward pass: quantized matrix products for few activation rows, and the
//! small float loops (dot, axpy, RMSNorm, softmax, SiLU) the decoder layer is built from.
//!
//! This module is the one place where `unsafe` lives in the engine: reinterpreting the GGUF bytes as
//! quantized blocks and letting worker threads write disjoint output columns.
//!
//! The formats the models use (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K) have our own kernels
//! (`quant` in plain Rust, `x86` with AVX2 or AVX-512 VNNI chosen at run time): activations are
//! quantized once per product to 8 bits per 32 values, and every weight sub-block is decoded once
//! and applied to all activation rows while it is in registers. Other formats (F32, F16, Q5_1,
//! Q2_K, ...) go through candle's `GgmlType` dot products. Either way each output element's value
//! does not depend on how many rows share the pass, so plain and speculative decoding produce
//! bit-identical logits.

use candle_core::quantized::k_quants::{self, GgmlType};
use candle_core::quantized::GgmlDType;
use half::f16;
use std::sync::{Arc, OnceLock};

pub mod packed;
pub mod pool;
pub mod quant;
#[cfg(target_arch = "x86_64")]
pub mod x86;

use quant::{Format, QuantizedActs};

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

    /// Tells the kernel that the pages of a mapped window are not needed now (after packing: the
    /// packed copy is what the kernels read). They stay valid: a later read (an embedding row)
    /// faults them back in from the file. Owned bytes are left alone.
    pub fn release_pages(&self) {
        if let Bytes::Mapped { map, start, len } = self {
            const PAGE: usize = 4096;
            let first = start.next_multiple_of(PAGE);
            let end = (start + len) / PAGE * PAGE;
            if end > first {
                // SAFETY: the map is a read-only private mapping of the model file that nothing
                // writes; MADV_DONTNEED only drops its resident pages, and the next read of them
                // gets the same bytes from the file. The range is page-aligned and inside the map.
                // A failure only means the pages stay resident.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        first,
                        end - first,
                    )
                };
            }
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
    /// The same weights interleaved for the AVX-512 kernels (`packed`), when packed.
    pub packed: Option<Arc<packed::Packed>>,
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
            packed: None,
        })
    }

    /// Adds the interleaved copy the kernels of `isa` compute with, where there is one (own
    /// formats with whole groups of 16 rows and 64 columns, AVX-512 VNNI). From then on every product with this matrix
    /// under `isa` uses it.
    pub fn packed_for(mut self, isa: Isa) -> Self {
        if isa == Isa::Avx512Vnni {
            if let Some(f) = Format::from_ggml(self.dtype) {
                self.packed = packed::Packed::new(f, self.rows, self.cols, self.bytes.as_slice())
                    .map(Arc::new);
                if self.packed.is_some() {
                    self.bytes.release_pages();
                }
            }
        }
        self
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

/// A raw pointer to the start of a buffer whose disjoint parts worker threads write.
struct OutPtr<T>(*mut T);
impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutPtr<T> {}
// SAFETY: every user has each worker write a disjoint set of indices (its own output columns or
// piece), and the buffer outlives the parallel loop, which joins before the caller returns.
unsafe impl<T: Send> Send for OutPtr<T> {}
unsafe impl<T: Send> Sync for OutPtr<T> {}

/// Calls `f(i, chunk_i)` for the consecutive `chunk`-long pieces of `data` on the pool's threads.
pub fn par_chunks_mut<T: Send>(data: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    assert!(chunk > 0 && data.len() % chunk == 0);
    let ptr = OutPtr(data.as_mut_ptr());
    pool::global().run(data.len() / chunk, &|i| {
        let ptr = ptr;
        // SAFETY: piece i covers [i * chunk, (i + 1) * chunk), inside `data` and disjoint from
        // every other piece; `data` stays borrowed until `run` has joined.
        let piece = unsafe { std::slice::from_raw_parts_mut(ptr.0.add(i * chunk), chunk) };
        f(i, piece);
    });
}

/// Calls `f(i, piece_i)` on the pool's threads for the pieces `data[bounds[i]..bounds[i + 1]]`
/// (`bounds` ascending, from 0 to `data.len()`).
pub fn par_split_mut<T: Send>(
    data: &mut [T],
    bounds: &[usize],
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    assert!(bounds.first() == Some(&0) && bounds.last() == Some(&data.len()));
    assert!(bounds.windows(2).all(|w| w[0] <= w[1]));
    let ptr = OutPtr(data.as_mut_ptr());
    pool::global().run(bounds.len() - 1, &|i| {
        let ptr = ptr;
        // SAFETY: the pieces are disjoint ranges inside `data` (bounds checked ascending and
        // within it); `data` stays borrowed until `run` has joined.
        let piece = unsafe {
            std::slice::from_raw_parts_mut(ptr.0.add(bounds[i]), bounds[i + 1] - bounds[i])
        };
        f(i, piece);
    });
}

/// Streaming-read bandwidth in GB/s: the best of a few passes over a buffer of `bytes` (make it
/// larger than the last-level cache), split over the pool's threads as the matmuls are. This is
/// what a decode step, which reads every weight once, can get at best.
pub fn read_bandwidth(bytes: usize) -> f64 {
    let words: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let pool = pool::global();
    let pieces = pool.threads() * 16;
    let piece = words.len().div_ceil(pieces);
    let mut best = f64::INFINITY;
    for _ in 0..4 {
        let start = std::time::Instant::now();
        pool.run(pieces, &|i| {
            let lo = (i * piece).min(words.len());
            let hi = ((i + 1) * piece).min(words.len());
            // Eight independent sums so that the loop is bound by loads, not by one add chain.
            let mut acc = [0u64; 8];
            for c in words[lo..hi].chunks_exact(8) {
                for (a, w) in acc.iter_mut().zip(c) {
                    *a = a.wrapping_add(*w);
                }
            }
            std::hint::black_box(acc);
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    (words.len() * 8) as f64 / best / 1e9
}

/// Which implementation of the quantized dot products runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512Vnni,
}

impl Isa {
    /// The best this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let base = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if base
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
            {
                return Isa::Avx512Vnni;
            }
            if base {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Every implementation this CPU can run (for tests).
    pub fn available() -> Vec<Isa> {
        let best = Isa::detect();
        [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni]
            .into_iter()
            .filter(|i| match i {
                Isa::Scalar => true,
                Isa::Avx2 => best != Isa::Scalar,
                Isa::Avx512Vnni => best == Isa::Avx512Vnni,
            })
            .collect()
    }
}

/// The implementation in use: the best the CPU has, or `PLD_KERNEL=scalar|avx2` to force one.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = Isa::detect();
        match std::env::var("PLD_KERNEL").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") if best != Isa::Scalar => Isa::Avx2,
            _ => best,
        }
    })
}

/// `out[i, j] = sum_k x[i, k] * w[j, k]` for `m` activation rows: `x` is `m x w.cols`, `out` is
/// `m x w.rows`, both row-major.
pub fn matmul(x: &[f32], m: usize, w: &QMatrix, out: &mut [f32]) {
    matmul_with(isa(), x, m, w, out)
}

/// `matmul` with a chosen implementation.
pub fn matmul_with(isa: Isa, x: &[f32], m: usize, w: &QMatrix, out: &mut [f32]) {
    matmul_many_with(isa, x, m, &mut [(w, out)])
}

/// Several products of the same activations (q/k/v, gate/up): the activations are quantized once
/// and all weight rows are shared out to the threads in one go.
pub fn matmul_many(x: &[f32], m: usize, jobs: &mut [(&QMatrix, &mut [f32])]) {
    matmul_many_with(isa(), x, m, jobs)
}

/// Bytes of quantized activation rows the packed kernels take per pass over a work item's
/// weights (a block that stays in L2 with them).
const PACKED_ACT_BYTES: usize = 512 * 1024;

/// Activation rows handled together per pass over a chunk of weight rows (keeps them in L2).
const ROW_GROUP: usize = 32;

thread_local! {
    static ACTS: std::cell::RefCell<[QuantizedActs; 2]> = Default::default();
}

pub fn matmul_many_with(isa: Isa, x: &[f32], m: usize, jobs: &mut [(&QMatrix, &mut [f32])]) {
    if m == 0 {
        return;
    }
    let mut own = Vec::new();
    for (w, out) in jobs.iter_mut() {
        assert_eq!(x.len(), m * w.cols, "activation shape");
        assert_eq!(out.len(), m * w.rows, "output shape");
        match Format::from_ggml(w.dtype) {
            Some(f) if w.cols % f.act_block() == 0 => own.push((f, &**w, OutPtr(out.as_mut_ptr()))),
            _ => dispatch!(w.dtype, T => matmul_typed::<T>(x, m, w, out)),
        }
    }
    if own.is_empty() {
        return;
    }
    ACTS.with(|cell| {
        let mut acts = cell.borrow_mut();
        let k = own[0].1.cols;
        for (slot, block) in [(0usize, 32usize), (1, 256)] {
            if own.iter().any(|(f, _, _)| f.act_block() == block) {
                acts[slot].quantize_with(isa, x, m, k, block);
                // Only the natural-layout 512-bit tiles (unpacked matrices) read the spread
                // scales.
                if block == 32
                    && isa == Isa::Avx512Vnni
                    && own
                        .iter()
                        .any(|(f, w, _)| f.act_block() == 32 && w.packed.is_none())
                {
                    acts[slot].spread();
                }
            }
        }
        let acts = &*acts;
        // Work items: runs of weight rows of one matrix.
        let pool = pool::global();
        let threads = pool.threads();
        let total: usize = own.iter().map(|(_, w, _)| w.rows).sum();
        // Whole groups of 16 rows, for the packed matrices.
        let chunk = total
            .div_ceil(threads * 4)
            .clamp(8, 512)
            .next_multiple_of(packed::ROWS);
        let mut work = Vec::new();
        for (ji, (_, w, _)) in own.iter().enumerate() {
            for j0 in (0..w.rows).step_by(chunk) {
                work.push((ji, j0, (j0 + chunk).min(w.rows)));
            }
        }
        let run = |&(ji, j0, j1): &(usize, usize, usize)| {
            let (f, w, out_ptr) = own[ji];
            let a = &acts[if f.act_block() == 32 { 0 } else { 1 }];
            #[cfg(target_arch = "x86_64")]
            if let (Some(p), Isa::Avx512Vnni) = (&w.packed, isa) {
                // Blocks of activation rows small enough to stay in L2 while every weight group
                // of the work item passes over them; prefill-sized products go eight rows at a
                // time over every group of the item (whose weights then stay in L2), so that each
                // row's outputs are written in order, not sixteen floats to a page per group.
                let block = if m > 64 {
                    8
                } else {
                    (PACKED_ACT_BYTES / w.cols).max(8).next_multiple_of(8)
                };
                for r0 in (0..m).step_by(block) {
                    let rows = block.min(m - r0);
                    for g in j0 / packed::ROWS..j1 / packed::ROWS {
                        let at = r0 * w.rows + g * packed::ROWS;
                        // SAFETY: the CPU has AVX-512 VNNI (`isa`); `a` holds the m rows
                        // quantized in the format's blocks; the writes, rows r0..r0 + rows at
                        // columns 16g..16g + 16, stay inside `out` (m * n) and belong to this
                        // work item alone.
                        unsafe { x86::packed_rows(p, g, a, r0, rows, out_ptr.0.add(at), w.rows) };
                    }
                }
                return;
            }
            let (elems, bytes) = f.super_block();
            let row_bytes = w.cols / elems * bytes;
            let wb = w.bytes.as_slice();
            let n = w.rows;
            let mut tmp = [0f32; ROW_GROUP];
            for g0 in (0..m).step_by(ROW_GROUP) {
                let g = (m - g0).min(ROW_GROUP);
                for j in j0..j1 {
                    dot_rows(
                        isa,
                        f,
                        &wb[j * row_bytes..(j + 1) * row_bytes],
                        a,
                        g0,
                        &mut tmp[..g],
                    );
                    for (i, v) in tmp[..g].iter().enumerate() {
                        // SAFETY: g0 + i < m and j < n; rows j0..j1 of this matrix belong to
                        // this work item alone, and the output outlives the loop.
                        unsafe { *out_ptr.0.add((g0 + i) * n + j) = *v };
                    }
                }
            }
        };
        pool.run(work.len(), &|i| run(&work[i]));
    });
}

/// One weight row against activation rows `r0..r0 + out.len()`.
#[inline]
fn dot_rows(isa: Isa, f: Format, wrow: &[u8], acts: &QuantizedActs, r0: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        use x86::*;
        macro_rules! call {
            ($code:expr) => {
                // SAFETY: `isa` is only Avx2 / Avx512Vnni when the CPU has those features
                // (`Isa::detect`), and `acts` holds rows r0..r0 + out.len() of whole blocks.
                unsafe {
                    if isa == Isa::Avx512Vnni {
                        dot_rows_vnni::<{ $code }>(wrow, acts, r0, out)
                    } else {
                        dot_rows_avx2::<{ $code }>(wrow, acts, r0, out)
                    }
                }
            };
        }
        match f {
            Format::Q4_0 => call!(Q4_0),
            Format::Q4_1 => call!(Q4_1),
            Format::Q5_0 => call!(Q5_0),
            Format::Q8_0 => call!(Q8_0),
            Format::Q4K => call!(Q4K),
            Format::Q6K => call!(Q6K),
        }
        return;
    }
    let _ = isa;
    quant::dot_rows_scalar(f, wrow, acts, r0, out)
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
    let pool = pool::global();
    let chunk = n.div_ceil(pool.threads() * 8).clamp(16, 1024);
    let xq = &xq;
    pool.run(n.div_ceil(chunk), &move |c| {
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

pub(crate) fn has_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| isa() != Isa::Scalar)
}

/// Dot product of two f32 slices. Every call on a machine takes the same path (AVX2 with FMA when
/// the CPU has it), so results never depend on the caller.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are present (checked by `isa`), lengths are equal.
        return unsafe { x86::dot_f32(a, b) };
    }
    dot_scalar(a, b)
}

/// The plain version of `dot`, eight independent accumulators.
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
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
pub fn axpy_scalar(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// One key/value head of a cache over its first `len` positions. Keys are stored transposed, one
/// row per dimension: dimension `i` of key `t` is `keys[i * key_stride + t]`, so that the scores
/// of consecutive positions are one vector product away (no horizontal sums); value `t` is
/// `values[t * value_stride..][..hd]`.
#[derive(Clone, Copy)]
pub struct KvHead<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub key_stride: usize,
    pub value_stride: usize,
    pub hd: usize,
    pub len: usize,
}

impl KvHead<'_> {
    /// Panics unless every key and value of the `len` positions lies inside the slices.
    fn check(&self) {
        let Self { hd, len, .. } = *self;
        assert!(
            hd > 0 && len > 0 && len <= self.key_stride,
            "key rows too short"
        );
        assert!(
            self.keys.len() >= (hd - 1) * self.key_stride + len
                && self.values.len() >= (len - 1) * self.value_stride + hd,
            "cache too short"
        );
    }
}

/// Attention of the `q.len() / hd` query heads in `q` that share the key/value head `kv`.
/// `scores` is scratch; `out` gets one `hd`-long output per query head.
pub fn attend(q: &[f32], kv: KvHead<'_>, scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend_with(isa(), q, kv, scale, scores, out)
}

/// `attend` with a chosen implementation (AVX-512 for head sizes that are a multiple of 16, AVX2
/// for multiples of 8, the plain loops otherwise).
pub fn attend_with(
    isa: Isa,
    q: &[f32],
    kv: KvHead<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let KvHead { hd, len, .. } = kv;
    kv.check();
    let group = q.len() / hd;
    assert!(group * hd == q.len() && out.len() == q.len());
    scores.clear();
    scores.resize(group * len, 0.0);
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512Vnni && hd % 16 == 0 {
            // SAFETY: AVX-512 F, AVX2 and FMA are present (`Isa::detect`), hd is a multiple of
            // 16; every key and value read lies inside the checked span; one row.
            return unsafe { x86::attend_rows_avx512(q, q.len(), 1, kv, scale, scores, out) };
        }
        if isa != Isa::Scalar && hd % 8 == 0 {
            // SAFETY: AVX2 and FMA are present, hd is a multiple of 8; as above.
            return unsafe { x86::attend_avx2(q, kv, scale, scores, out) };
        }
    }
    let _ = isa;
    attend_scalar(q, kv, scale, scores, out)
}

/// Causal attention of `rows` consecutive positions of one sequence, for the query heads that share
/// the key/value head `kv`: row `r`'s query heads are `q[r * q_stride..][..group * hd]`, it sees the
/// first `kv.len - (rows - 1 - r)` positions, and its outputs go to `out[r * group * hd..]`. Each
/// row's result is bit-identical to `attend` on that row alone; the AVX-512 version reads each
/// key and value once for all the rows.
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    isa: Isa,
    q: &[f32],
    q_stride: usize,
    rows: usize,
    kv: KvHead<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let KvHead { hd, len, .. } = kv;
    assert!(rows > 0 && rows <= len && out.len() % rows == 0);
    let gw = out.len() / rows;
    assert!(hd > 0 && gw % hd == 0 && (rows - 1) * q_stride + gw <= q.len());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni && hd % 16 == 0 {
        kv.check();
        scores.clear();
        scores.resize(rows * (gw / hd) * len, 0.0);
        // SAFETY: AVX-512 F, AVX2 and FMA are present (`Isa::detect`), hd is a multiple of 16;
        // keys and values lie inside the checked span, queries inside `q`, scores and outputs
        // are sized above.
        return unsafe { x86::attend_rows_avx512(q, q_stride, rows, kv, scale, scores, out) };
    }
    for (r, o) in out.chunks_mut(gw).enumerate() {
        let row_kv = KvHead {
            len: len - (rows - 1 - r),
            ..kv
        };
        attend_with(
            isa,
            &q[r * q_stride..r * q_stride + gw],
            row_kv,
            scale,
            scores,
            o,
        );
    }
}

/// The plain version of `attend`, one dot product and one scaled sum per head and position.
pub fn attend_scalar(q: &[f32], kv: KvHead<'_>, scale: f32, scores: &mut [f32], out: &mut [f32]) {
    let KvHead {
        keys,
        values,
        key_stride,
        value_stride,
        hd,
        len,
    } = kv;
    let group = q.len() / hd;
    for g in 0..group {
        // Along the rows of keys: every score sums its products in the order of the dimensions.
        let sc = &mut scores[g * len..(g + 1) * len];
        sc.fill(0.0);
        for (i, qi) in q[g * hd..(g + 1) * hd].iter().enumerate() {
            for (s, k) in sc
                .iter_mut()
                .zip(&keys[i * key_stride..i * key_stride + len])
            {
                *s += qi * k;
            }
        }
        for s in sc.iter_mut() {
            *s *= scale;
        }
        softmax(sc);
    }
    out.fill(0.0);
    for t in 0..len {
        let value = &values[t * value_stride..t * value_stride + hd];
        for g in 0..group {
            axpy_scalar(scores[g * len + t], value, &mut out[g * hd..(g + 1) * hd]);
        }
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

/// In-place softmax (a vectorized exponential where the CPU has AVX2; both within a few units in
/// the last place of `f32::exp`).
pub fn softmax(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are present.
        return unsafe { x86::softmax_avx2(x) };
    }
    softmax_scalar(x)
}

/// The plain version of `softmax`.
pub fn softmax_scalar(x: &mut [f32]) {
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
    assert_eq!(gate.len(), up.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are present; the lengths are equal.
        return unsafe { x86::swiglu_avx2(gate, up) };
    }
    swiglu_scalar(gate, up)
}

/// The plain version of `swiglu`.
pub fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

#[cfg(test)]
mod tests;
