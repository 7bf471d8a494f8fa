//! Weight matrices as the kernels take them: a tensor's bytes in one of the GGUF block formats (a
//! window into the memory-mapped model file, or an owned buffer), checked once, with an optional
//! interleaved copy for the packed kernels.

use super::dtype::TensorType;
use super::format::{mxfp4, Format};
use super::isa::Isa;
use super::packed;
use candle_core::quantized::k_quants::GgmlType;
use candle_core::quantized::GgmlDType;
use std::sync::Arc;

/// Runs `$body` with the type alias `$t` bound to the block type of `$dtype`.
macro_rules! dispatch {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            candle_core::quantized::GgmlDType::F32 => {
                type $t = f32;
                $body
            }
            candle_core::quantized::GgmlDType::F16 => {
                type $t = half::f16;
                $body
            }
            candle_core::quantized::GgmlDType::BF16 => {
                type $t = half::bf16;
                $body
            }
            candle_core::quantized::GgmlDType::Q4_0 => {
                type $t = candle_core::quantized::k_quants::BlockQ4_0;
                $body
            }
            candle_core::quantized::GgmlDType::Q4_1 => {
                type $t = candle_core::quantized::k_quants::BlockQ4_1;
                $body
            }
            candle_core::quantized::GgmlDType::Q5_0 => {
                type $t = candle_core::quantized::k_quants::BlockQ5_0;
                $body
            }
            candle_core::quantized::GgmlDType::Q5_1 => {
                type $t = candle_core::quantized::k_quants::BlockQ5_1;
                $body
            }
            candle_core::quantized::GgmlDType::Q8_0 => {
                type $t = candle_core::quantized::k_quants::BlockQ8_0;
                $body
            }
            candle_core::quantized::GgmlDType::Q2K => {
                type $t = candle_core::quantized::k_quants::BlockQ2K;
                $body
            }
            candle_core::quantized::GgmlDType::Q3K => {
                type $t = candle_core::quantized::k_quants::BlockQ3K;
                $body
            }
            candle_core::quantized::GgmlDType::Q4K => {
                type $t = candle_core::quantized::k_quants::BlockQ4K;
                $body
            }
            candle_core::quantized::GgmlDType::Q5K => {
                type $t = candle_core::quantized::k_quants::BlockQ5K;
                $body
            }
            candle_core::quantized::GgmlDType::Q6K => {
                type $t = candle_core::quantized::k_quants::BlockQ6K;
                $body
            }
            candle_core::quantized::GgmlDType::Q8K => {
                type $t = candle_core::quantized::k_quants::BlockQ8K;
                $body
            }
            candle_core::quantized::GgmlDType::Q8_1 => unreachable!("rejected by QMatrix::new"),
        }
    };
}
pub(super) use dispatch;

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
            // Panics unless the window lies inside the map: dropping pages outside it would drop
            // memory that is not the model file's.
            self.as_slice();
            const PAGE: usize = 4096;
            let first = start.next_multiple_of(PAGE);
            let end = (start + len) / PAGE * PAGE;
            if end > first {
                // SAFETY: the map is a read-only private mapping of the model file that nothing
                // writes; MADV_DONTNEED only drops its resident pages, and the next read of them
                // gets the same bytes from the file. The range is page-aligned and inside the
                // window, which is inside the map (checked above).
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
                // SAFETY: the whole u32 buffer viewed as its bytes (any bytes are valid u8s).
                let all = unsafe {
                    std::slice::from_raw_parts(words.as_ptr() as *const u8, 4 * words.len())
                };
                &all[..*len]
            }
        }
    }
}

/// A weight matrix of `rows` output features by `cols` input features, row-major, in one of the
/// GGUF block formats.
#[derive(Clone)]
pub struct QMatrix {
    pub dtype: TensorType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: Bytes,
    /// The same weights interleaved for the AVX-512 kernels (`packed`), when packed.
    pub packed: Option<Arc<packed::Packed>>,
}

/// The block formats this module can compute with.
pub fn is_supported(dtype: TensorType) -> bool {
    !matches!(dtype, TensorType::Ggml(GgmlDType::Q8_1))
}

impl QMatrix {
    /// Checks that the bytes hold exactly `rows * cols` elements of `dtype`, rows made of whole
    /// blocks, and that they are aligned for in-place viewing. Returns a message naming the problem.
    pub fn new(
        dtype: impl Into<TensorType>,
        rows: usize,
        cols: usize,
        bytes: Bytes,
    ) -> Result<Self, String> {
        let dtype = dtype.into();
        if !is_supported(dtype) {
            return Err(format!("tensor type {dtype} is not supported"));
        }
        let bs = dtype.block_size();
        if !cols.is_multiple_of(bs) {
            return Err(format!(
                "row length {cols} is not a multiple of the {dtype} block size {bs}"
            ));
        }
        let expected = rows * (cols / bs) * dtype.type_size();
        let slice = bytes.as_slice();
        if slice.len() != expected {
            return Err(format!(
                "{} bytes where {rows}x{cols} {dtype} needs {expected}",
                slice.len()
            ));
        }
        if !(slice.as_ptr() as usize).is_multiple_of(dtype.align()) {
            return Err(format!("tensor data is not {}-byte aligned", dtype.align()));
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
    /// formats with whole groups of 16 rows and 64 columns, every SIMD implementation). From then
    /// on every product with this matrix under `isa` uses it.
    pub fn packed_for(mut self, isa: Isa) -> Self {
        if isa.packs() {
            if let Some(f) = Format::from_type(self.dtype) {
                self.packed = packed::Packed::new(f, self.rows, self.cols, self.bytes.as_slice())
                    .map(Arc::new);
                if self.packed.is_some() {
                    self.bytes.release_pages();
                }
            }
        }
        self
    }

    /// Rows `first..first + count` as a matrix of their own (the parts of a fused tensor), before
    /// packing: a window into the same mapped bytes where it stays aligned, else a copy.
    pub fn row_range(&self, first: usize, count: usize) -> Result<QMatrix, String> {
        if first + count > self.rows {
            return Err(format!(
                "rows {first}..{} of a matrix of {}",
                first + count,
                self.rows
            ));
        }
        let row_bytes = self.cols / self.dtype.block_size() * self.dtype.type_size();
        let (start, len) = (first * row_bytes, count * row_bytes);
        let window = &self.bytes.as_slice()[start..start + len];
        let bytes = match &self.bytes {
            Bytes::Mapped { map, start: s, .. }
                if (window.as_ptr() as usize).is_multiple_of(self.dtype.align()) =>
            {
                Bytes::Mapped {
                    map: map.clone(),
                    start: s + start,
                    len,
                }
            }
            _ => Bytes::owned(window),
        };
        QMatrix::new(self.dtype, count, self.cols, bytes)
    }

    /// Writes row `r` as f32 values into `out` (`out.len() == cols`): used for embedding lookup.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() == self.cols);
        match self.dtype {
            TensorType::Ggml(d) => dispatch!(d, T => dequantize_row_typed::<T>(self, r, out)),
            TensorType::Mxfp4 => {
                let row_bytes = self.cols / mxfp4::ELEMS * mxfp4::BYTES;
                let row = &self.bytes.as_slice()[r * row_bytes..(r + 1) * row_bytes];
                for (blk, o) in row
                    .chunks_exact(mxfp4::BYTES)
                    .zip(out.chunks_exact_mut(mxfp4::ELEMS))
                {
                    mxfp4::dequantize_block(blk, o);
                }
            }
        }
    }

    /// The matrix rotated and rounded to int8 per row in the tiles' order (`rotated::RotatedInt8`,
    /// what prompt rows read under `PLD_PROMPT_ROWS=int8`); whole strips and blocks only.
    pub fn rotated_int8(&self) -> super::rotated::RotatedInt8 {
        self.rotated_int8_by(&super::rotated::plain_round)
    }

    /// `rotated_int8` with each row rotated and rounded by `round` (a class's kernel for it,
    /// with `plain_round`'s bits).
    pub fn rotated_int8_by(&self, round: &super::rotated::Round) -> super::rotated::RotatedInt8 {
        let row = |r: usize, out: &mut [f32]| self.dequantize_row(r, out);
        super::rotated::RotatedInt8::of(self.rows, self.cols, &row, round)
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
pub(super) fn blocks<T: GgmlType>(bytes: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert!(bytes.len().is_multiple_of(size));
    assert!((bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()));
    // SAFETY: the block types are plain `repr(C)` data (integers and f16) for which every bit
    // pattern is valid; length and alignment are checked above; the lifetime is that of `bytes`.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) }
}

fn dequantize_row_typed<T: GgmlType>(w: &QMatrix, r: usize, out: &mut [f32]) {
    let per_row = w.cols / T::BLCK_SIZE;
    let all = blocks::<T>(w.bytes.as_slice());
    T::to_float(&all[r * per_row..(r + 1) * per_row], out);
}

/// Quantizes f32 data into `dtype` blocks (tests and tools).
pub fn quantize(dtype: impl Into<TensorType>, data: &[f32]) -> Vec<u8> {
    match dtype.into() {
        TensorType::Ggml(d) => dispatch!(d, T => quantize_typed::<T>(data)),
        TensorType::Mxfp4 => {
            assert!(data.len().is_multiple_of(mxfp4::ELEMS));
            let mut out = vec![0u8; data.len() / mxfp4::ELEMS * mxfp4::BYTES];
            for (x, blk) in data
                .chunks_exact(mxfp4::ELEMS)
                .zip(out.chunks_exact_mut(mxfp4::BYTES))
            {
                mxfp4::quantize_block(x, blk);
            }
            out
        }
    }
}

fn quantize_typed<T: GgmlType>(data: &[f32]) -> Vec<u8> {
    assert!(data.len().is_multiple_of(T::BLCK_SIZE));
    let mut q = vec![T::zeros(); data.len() / T::BLCK_SIZE];
    T::from_float(data, &mut q);
    let size = std::mem::size_of::<T>() * q.len();
    // SAFETY: plain data blocks viewed as their bytes.
    unsafe { std::slice::from_raw_parts(q.as_ptr() as *const u8, size) }.to_vec()
}
