//! The model's weights as the kernels take them: tensor views of the GGUF file checked into
//! `QMatrix`es (still windows into the mapped file) and packed for the kernels in use; norms and
//! biases read out as floats; embedding rows looked up.

use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::kernels::{self, Bytes, Isa, QMatrix};
use candle_core::quantized::GgmlDType;

/// A 2-D weight (`rows` outputs by `cols` inputs; a 1-D tensor is one row), viewed in the mapped
/// file.
pub fn matrix(file: &GgufFile, name: &str) -> Result<QMatrix> {
    let tensor = file.tensor(name)?;
    let (rows, cols) = match tensor.dims {
        [r, c] => (*r, *c),
        [c] => (1, *c),
        dims => {
            return Err(EngineError::BadMetadata(format!(
                "tensor '{name}' has shape {dims:?}, expected a matrix"
            )))
        }
    };
    if !kernels::is_supported(tensor.dtype) {
        return Err(EngineError::UnsupportedTensorType {
            name: name.into(),
            dtype: tensor.dtype.to_string(),
        });
    }
    QMatrix::new(tensor.dtype, rows, cols, tensor.bytes).map_err(|reason| {
        EngineError::BadModelFile {
            path: file.path.clone(),
            reason: format!("tensor '{name}': {reason}"),
        }
    })
}

/// The `count` experts' matrices of a 3-D tensor (llama.cpp's `*_exps`: one `rows x cols` slice
/// per expert, the slices one after another), each its own matrix held at `precision`, so that a
/// product reads only the experts it is given rows for.
pub fn expert_matrices(
    file: &GgufFile,
    name: &str,
    count: usize,
    (rows, cols): (usize, usize),
    precision: Precision,
    isa: Isa,
) -> Result<Vec<QMatrix>> {
    let tensor = file.tensor(name)?;
    if tensor.dims != [count, rows, cols] {
        return Err(EngineError::BadMetadata(format!(
            "tensor '{name}' has shape {:?}, expected {:?} ({count} experts of {rows}x{cols})",
            tensor.dims,
            [count, rows, cols]
        )));
    }
    if !kernels::is_supported(tensor.dtype) {
        return Err(EngineError::UnsupportedTensorType {
            name: name.into(),
            dtype: tensor.dtype.to_string(),
        });
    }
    let bad = |reason: String| EngineError::BadModelFile {
        path: file.path.clone(),
        reason: format!("tensor '{name}': {reason}"),
    };
    let all = QMatrix::new(tensor.dtype, count * rows, cols, tensor.bytes).map_err(bad)?;
    (0..count)
        .map(|e| {
            let part = all.row_range(e * rows, rows).map_err(bad)?;
            Ok(for_products(part, precision, isa))
        })
        .collect()
}

/// How the weight matrices of the products are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// As the file stores them (quantized, packed for the kernels in use), activations quantized
    /// to 8 bits per block for each product: the fast path every use of pld takes.
    #[default]
    Stored,
    /// Dequantized to f32 at load, products in f32 without quantizing activations: 4 bytes a
    /// weight and slow, for checking an architecture's arithmetic against a float reference
    /// without the noise of 8-bit activations.
    F32,
}

/// A weight of `rows x cols` for the products, held at `precision` (with the packed copy the
/// kernels of `isa` compute with where they have one).
pub fn product_matrix(
    file: &GgufFile,
    name: &str,
    rows: usize,
    cols: usize,
    precision: Precision,
    isa: Isa,
) -> Result<QMatrix> {
    let m = matrix(file, name)?;
    if m.rows != rows || m.cols != cols {
        return Err(EngineError::BadMetadata(format!(
            "tensor '{name}' is {}x{}, expected {rows}x{cols}",
            m.rows, m.cols
        )));
    }
    Ok(for_products(m, precision, isa))
}

/// A matrix made ready for the products at `precision`.
pub fn for_products(m: QMatrix, precision: Precision, isa: Isa) -> QMatrix {
    match precision {
        Precision::Stored => m.packed_for(isa),
        Precision::F32 => {
            let bytes: Vec<u8> = m
                .dequantize()
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect();
            QMatrix::new(GgmlDType::F32, m.rows, m.cols, Bytes::owned(&bytes))
                .expect("f32 bytes of the matrix's own shape")
        }
    }
}

/// A 1-D tensor (norm weights, biases) as f32 values.
pub fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let m = matrix(file, name)?;
    if m.rows * m.cols != len {
        return Err(EngineError::BadMetadata(format!(
            "tensor '{name}' has {} elements, expected {len}",
            m.rows * m.cols
        )));
    }
    Ok(m.dequantize())
}

/// `vector` for a tensor the model may leave out (biases).
pub fn optional_vector(file: &GgufFile, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
    if file.has_tensor(name) {
        vector(file, name, len).map(Some)
    } else {
        Ok(None)
    }
}

/// The rows of the embedding table for `tokens`, one after another into `out`.
pub fn embed(table: &QMatrix, tokens: impl Iterator<Item = u32>, out: &mut [f32]) {
    for (row, t) in out.chunks_mut(table.cols).zip(tokens) {
        table.dequantize_row(t as usize, row);
    }
}
