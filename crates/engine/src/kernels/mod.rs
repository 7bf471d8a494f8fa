//! Compute kernels of the forward pass: quantized matrix products, attention over the KV cache,
//! and the float parts of the decoder layer (dot, RMSNorm, softmax, SwiGLU).
//!
//! The formats the models use (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, MXFP4) have our own kernels
//! (`quant` in plain Rust, `x86` with AVX2, AVX-VNNI, AVX-512, AVX-512 VNNI and AMX tiles chosen
//! at run time): activations are quantized once per product to 8 bits per 32 values, and every
//! weight sub-block is decoded once and applied to all activation rows while it is in registers.
//! Other formats (F32, F16, Q5_1, Q2_K, ...) go through candle's `GgmlType` dot products. Either
//! way each output element's value does not depend on how many rows share the pass, so plain and
//! speculative decoding produce bit-identical logits. A class may give a prompt's rows an
//! arithmetic of their own (`prompt`: AMX's bf16 tiles), the same for every pass they are in.
//!
//! Which kernels a class runs is its table (`table::Kernels`, one file per class: `table::SCALAR`,
//! `x86::classes`); `Isa::kernels` (here) hands out the table of the class in use, and every
//! dispatcher asks the table: this file for the products, `attention` for attention per KV type
//! (`kv`: the stored types, `q8`: the q8 cache's format, `online_softmax`: the scalar steps every
//! attention path shares), `prompt` for a prompt's rows, `bandwidth` for the peaks. `format`
//! describes each weight format once; `quant` quantizes activations and has the plain products;
//! `packed` interleaves weights for the SIMD kernels. Imports go from the dispatchers to the
//! tables to the kernels and the formats, never back (`tools/circles/circles.py`).
//!
//! # Where `unsafe` lives
//!
//! Everything public here is safe to call with any arguments; a wrong shape or an implementation
//! the CPU lacks panics. Inside:
//! - SIMD intrinsics: every function in `x86/`, and the AVX2 activation quantizer in `quant.rs`,
//!   is `unsafe` because it is compiled for instructions the CPU may not have and reads through
//!   raw pointers unchecked (each says what it needs under `# Safety`). Their callers (this file,
//!   `attention.rs`, `elementwise.rs`, `quant.rs`) make sure of it: they call a class's kernels
//!   through its table, which `Isa::kernels` hands out only for a class the CPU runs, the float
//!   loops ask `has_avx2`, and both check the shapes the kernel reads.
//! - Raw output pointers for parallel writers: `parallel.rs` hands disjoint pieces of one buffer
//!   to the pool's threads, and the products in this file write their own columns of a shared
//!   output; `pool.rs` lends a job's closure to the workers for no longer than `run` lasts.
//! - Memory: `matrix.rs` views owned words and GGUF bytes as blocks in place and drops the mapped
//!   pages of packed matrices (`madvise`). Outside the kernels, `gguf.rs` maps the model file.

use candle_core::quantized::k_quants::GgmlType;

mod attention;
mod bandwidth;
mod dtype;
mod elementwise;
pub mod format;
mod isa;
mod kv;
mod lines;
mod matrix;
mod online_softmax;
pub mod packed;
mod parallel;
pub mod pool;
mod prompt;
pub mod q8;
pub mod quant;
pub mod rotated;
mod table;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use attention::{
    attend, attend_rows, attend_with, attention_arithmetic, bf16_by_default, tiles_attend,
};
pub use bandwidth::{
    amx_bf16_peak_gmacs, amx_int8_peak_gmacs, f32_peak_gmacs, int8_peak_gmacs, read_bandwidth,
};
pub use dtype::TensorType;
pub use elementwise::{
    axpy_scalar, dot, dot_scalar, geglu, rms_norm, softmax, softmax_scalar, swiglu, swiglu_oai,
    swiglu_scalar,
};
pub use isa::{amx_status, isa, Isa};
pub use kv::{KvDtype, KvElem, KvElems, KvHead, KvStored, TreeMask, Visible};
pub use lines::on_lines;
pub use matrix::{is_supported, quantize, Bytes, QMatrix};
pub(crate) use online_softmax::ATTENTION_BLOCK;
pub use parallel::{par_chunks_mut, par_split_mut};
pub use prompt::{
    gated_ffn_rows, matmul_many_rows, prepare_prompt_rows, prompt_arithmetic,
    prompt_arithmetic_differs, prompt_copy_bytes, prompt_rows_on_int8, GatedFfn, RowKind,
};
pub use table::Kernels;

use format::Format;
use isa::assert_available;
use matrix::{blocks, dispatch};
use packed::Packed;
use parallel::OutPtr;
use quant::QuantizedActs;

impl Isa {
    /// The table of kernels of this class (panics unless the CPU runs it): the one place that
    /// maps a class to its kernels. Each class's table is in its own file (`x86::classes`).
    pub fn kernels(self) -> &'static Kernels {
        assert_available(self);
        #[cfg(target_arch = "x86_64")]
        return match self {
            Isa::Scalar => &table::SCALAR,
            Isa::Avx2 => &x86::classes::AVX2,
            Isa::Avx2Vnni if Isa::avx_vnni_encoding() => &x86::classes::AVX2_VNNI,
            Isa::Avx2Vnni => &x86::classes::AVX2_VNNI_EVEX,
            Isa::Avx512 => &x86::classes::AVX512,
            Isa::Avx512Vnni => x86::classes::avx512_vnni(),
            Isa::Amx => x86::classes::amx(),
        };
        #[cfg(not(target_arch = "x86_64"))]
        &table::SCALAR
    }
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

/// The fewest activation rows the Amx class takes to its int8 tiles; fewer go to the AVX-512
/// VNNI kernels (the same results, bit for bit), which are faster there: on qwen-coder-1.5b
/// (Intel Xeon with AMX, 2 threads, alone) a 16-row pass took 122-124 ms on tiles against
/// 105-110 ms on VNNI, a 32-row pass 162-165 ms against 188-191 ms.
pub const AMX_MIN_ROWS: usize = 32;

/// Activation rows handled together per pass over a chunk of weight rows (keeps them in L2).
const ROW_GROUP: usize = 32;

thread_local! {
    static ACTS: std::cell::RefCell<[QuantizedActs; 2]> = Default::default();
}

/// `matmul_many` with a chosen implementation (panics if the CPU cannot run it).
pub fn matmul_many_with(isa: Isa, x: &[f32], m: usize, jobs: &mut [(&QMatrix, &mut [f32])]) {
    let k = isa.kernels();
    if m == 0 {
        return;
    }
    let own = own_kernels(x, m, jobs, k);
    if own.is_empty() {
        return;
    }
    ACTS.with(|cell| {
        let mut acts = cell.borrow_mut();
        quantize_acts(isa, k, x, m, &own, &mut acts);
        let acts = &*acts;
        let work = work_items(&own, pool::global().threads());
        pool::global().run(work.len(), &|i| run_item(k, m, &own, acts, work[i]));
    });
}

/// One matrix of a product: its format, the matrix, where its output goes.
type Job<'a> = (Format, &'a QMatrix, OutPtr<f32>);

/// The jobs our own kernels run, their shapes checked; the others (formats without our kernels,
/// or rows not in whole activation blocks) are run here by candle's.
fn own_kernels<'a>(
    x: &[f32],
    m: usize,
    jobs: &'a mut [(&QMatrix, &mut [f32])],
    k: &Kernels,
) -> Vec<Job<'a>> {
    let mut own = Vec::new();
    for (w, out) in jobs.iter_mut() {
        assert_eq!(x.len(), m * w.cols, "activation shape");
        assert_eq!(out.len(), m * w.rows, "output shape");
        match Format::from_type(w.dtype) {
            Some(f) if w.cols % f.act_block() == 0 => {
                if let (Some(p), true) = (&w.packed, k.packed_rows.is_some()) {
                    // The packed kernel reads the activations over the packed copy's columns.
                    assert!(
                        p.format == f && p.rows == w.rows && p.cols == w.cols,
                        "packed copy of another matrix"
                    );
                }
                own.push((f, &**w, OutPtr(out.as_mut_ptr())))
            }
            _ => match w.dtype {
                TensorType::Ggml(d) => dispatch!(d, T => matmul_typed::<T>(x, m, w, out)),
                // Always whole 32-blocks (`QMatrix::new`), so always our own kernels.
                TensorType::Mxfp4 => unreachable!("MXFP4 takes its own kernels"),
            },
        }
    }
    own
}

/// The activations quantized once for every job, in each block size a job's format takes
/// (slot 0: 32, slot 1: 256).
fn quantize_acts(
    isa: Isa,
    kernels: &Kernels,
    x: &[f32],
    m: usize,
    own: &[Job<'_>],
    acts: &mut [QuantizedActs; 2],
) {
    let k = own[0].1.cols;
    for (slot, block) in [(0usize, 32usize), (1, 256)] {
        if own.iter().any(|(f, _, _)| f.act_block() == block) {
            acts[slot].quantize_with(isa, x, m, k, block);
            // Passes on tiles read the integers in tile order.
            if kernels.tile_rows.is_some_and(|(min, _)| m >= min)
                && k.is_multiple_of(64)
                && own
                    .iter()
                    .any(|(f, w, _)| f.act_block() == block && w.packed.is_some())
            {
                acts[slot].tile();
            }
            // Only some kernels over unpacked matrices read the spread scales.
            if block == 32
                && kernels.dot_rows.is_some_and(|(_, spread)| spread)
                && own
                    .iter()
                    .any(|(f, w, _)| f.act_block() == 32 && w.packed.is_none())
            {
                acts[slot].spread();
            }
        }
    }
}

/// Work items: runs of weight rows of one matrix `(job, first row, end row)`, whole groups of 16
/// rows (for the packed matrices), about four per thread.
fn work_items(own: &[Job<'_>], threads: usize) -> Vec<(usize, usize, usize)> {
    let total: usize = own.iter().map(|(_, w, _)| w.rows).sum();
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
    work
}

/// One work item: rows `j0..j1` of job `ji`'s matrix against every activation row, by the
/// packed kernel where the matrix has a packed copy the CPU can run, else row by row.
fn run_item(
    kernels: &Kernels,
    m: usize,
    own: &[Job<'_>],
    acts: &[QuantizedActs; 2],
    (ji, j0, j1): (usize, usize, usize),
) {
    let (f, w, out_ptr) = own[ji];
    let a = &acts[if f.act_block() == 32 { 0 } else { 1 }];
    if let (Some(p), Some(packed_rows)) = (&w.packed, kernels.packed_rows) {
        if let Some((_, tile_rows)) = kernels.tile_rows.filter(|(min, _)| m >= *min) {
            // Whole tiles of rows, as many as stay in L2 with a group's weights; each call
            // unpacks a group's weights once for all of its rows.
            let block = (PACKED_ACT_BYTES / w.cols).next_multiple_of(16);
            for r0 in (0..m).step_by(block) {
                let rows = block.min(m - r0);
                // SAFETY: the table is of a class the CPU runs (`Isa::kernels`); `a` holds the
                // m rows quantized over
                // w.cols = p.cols columns in the format's blocks (a multiple of 64: the packed
                // unit), its integers padded to whole tiles of 16 rows and in tile order
                // (`quantize_acts`), and r0 is a multiple of 16; the writes, rows r0..r0 + rows
                // at columns j0..j1, stay inside `out` (m * n) and belong to this work item
                // alone.
                unsafe {
                    tile_rows(
                        p,
                        j0 / packed::ROWS,
                        j1 / packed::ROWS,
                        a,
                        r0,
                        rows,
                        out_ptr.get().add(r0 * w.rows),
                        w.rows,
                    )
                };
            }
            return;
        }
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
                // SAFETY: the table is of a class the CPU runs (`Isa::kernels`); `a` holds the
                // m rows quantized over w.cols = p.cols columns in the format's blocks; the
                // writes, rows r0..r0 + rows at columns 16g..16g + 16, stay inside `out`
                // (m * n) and belong to this work item alone.
                unsafe { packed_rows(p, g, a, r0, rows, out_ptr.get().add(at), w.rows) };
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
                kernels,
                f,
                &wb[j * row_bytes..(j + 1) * row_bytes],
                a,
                g0,
                &mut tmp[..g],
            );
            for (i, v) in tmp[..g].iter().enumerate() {
                // SAFETY: g0 + i < m and j < n; rows j0..j1 of this matrix belong to
                // this work item alone, and the output outlives the loop.
                unsafe { *out_ptr.get().add((g0 + i) * n + j) = *v };
            }
        }
    }
}

/// One weight row against activation rows `r0..r0 + out.len()`.
#[inline]
fn dot_rows(k: &Kernels, f: Format, wrow: &[u8], acts: &QuantizedActs, r0: usize, out: &mut [f32]) {
    match k.dot_rows {
        // SAFETY: the table is of a class the CPU runs (`Isa::kernels`), and `acts` holds rows
        // r0..r0 + out.len() of whole blocks over the row's columns.
        Some((dot_rows, _)) => unsafe { dot_rows(f, wrow, acts, r0, out) },
        None => quant::dot_rows_scalar(f, wrow, acts, r0, out),
    }
}

/// The packed kernel alone (for timing it), with the implementation in use: weight rows
/// `16g..16g + 16` of the packed matrix `p` against activation rows `r0..r0 + m` of `acts`,
/// quantized over `p.cols` columns in the format's activation blocks; row `r0 + r`'s sixteen
/// results go to `out[r * stride..][..16]`. Panics unless the implementation in use packs and the
/// shapes agree.
pub fn packed_rows(
    p: &Packed,
    g: usize,
    acts: &QuantizedActs,
    r0: usize,
    m: usize,
    out: &mut [f32],
    stride: usize,
) {
    let isa = isa();
    let Some(kernel) = isa.kernels().packed_rows else {
        panic!("the packed kernels need SIMD ({isa:?} in use)")
    };
    assert!(g < p.rows / packed::ROWS, "no group {g}");
    assert!(
        acts.k == p.cols && acts.block == p.format.act_block() && m <= acts.rows.saturating_sub(r0),
        "activations of another shape"
    );
    let last_end = (m.max(1) - 1)
        .checked_mul(stride)
        .and_then(|at| at.checked_add(packed::ROWS));
    assert!(
        m == 0 || last_end.is_some_and(|end| end <= out.len()),
        "output too short"
    );
    // SAFETY: the table is of a class the CPU runs (`Isa::kernels`); `acts` holds rows
    // r0..r0 + m over the packed columns in the format's blocks; every write, 16 floats at
    // r * stride for r < m, is inside `out` (checked above).
    unsafe { kernel(p, g, acts, r0, m, out.as_mut_ptr(), stride) };
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
        let j0 = c * chunk;
        let j1 = (j0 + chunk).min(n);
        for j in j0..j1 {
            let wrow = &wb[j * kb..(j + 1) * kb];
            for i in 0..m {
                let v = T::vec_dot(k, wrow, &xq[i * kb..(i + 1) * kb]);
                // SAFETY: i < m and j < n, so the index is inside `out` (m * n elements); column j
                // belongs to this chunk alone.
                unsafe { *out_ptr.get().add(i * n + j) = v };
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

#[cfg(test)]
mod tests;
