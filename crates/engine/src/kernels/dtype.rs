//! The type of a weight tensor: one of candle's `GgmlDType`s, or MXFP4 (ggml type 39, the experts
//! of gpt-oss), which candle 0.11 does not know. Candle's block types stay the home of the formats
//! it has (dequantization, its dot products for the formats without our own kernels); MXFP4 has
//! only our own code (`format::mxfp4`).

use candle_core::quantized::GgmlDType;

/// MXFP4's block: 32 values in 17 bytes (the exponent byte, 16 bytes of codes), kept here, below
/// the layout (`format::mxfp4`, which names these), so that the type knows its sizes without it.
pub(crate) const MXFP4_ELEMS: usize = 32;
pub(crate) const MXFP4_BYTES: usize = 17;

/// A weight tensor's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    Ggml(GgmlDType),
    /// 32 values `kvalues_mxfp4[code] * 2^(e - 128)`: an E8M0 exponent byte `e` and 4-bit codes.
    Mxfp4,
}

impl From<GgmlDType> for TensorType {
    fn from(d: GgmlDType) -> Self {
        TensorType::Ggml(d)
    }
}

impl TensorType {
    /// The type of ggml's type number `code` (as GGUF stores it), if pld knows it.
    pub fn from_ggml_code(code: u32) -> Option<Self> {
        use GgmlDType as G;
        Some(TensorType::Ggml(match code {
            0 => G::F32,
            1 => G::F16,
            2 => G::Q4_0,
            3 => G::Q4_1,
            6 => G::Q5_0,
            7 => G::Q5_1,
            8 => G::Q8_0,
            9 => G::Q8_1,
            10 => G::Q2K,
            11 => G::Q3K,
            12 => G::Q4K,
            13 => G::Q5K,
            14 => G::Q6K,
            15 => G::Q8K,
            30 => G::BF16,
            39 => return Some(TensorType::Mxfp4),
            _ => return None,
        }))
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            TensorType::Ggml(d) => d.block_size(),
            TensorType::Mxfp4 => MXFP4_ELEMS,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            TensorType::Ggml(d) => d.type_size(),
            TensorType::Mxfp4 => MXFP4_BYTES,
        }
    }

    /// The alignment the bytes need to be viewed in place: candle's block types hold f16 and f32
    /// (4 covers all of them); MXFP4 is read byte by byte.
    pub fn align(self) -> usize {
        match self {
            TensorType::Ggml(_) => 4,
            TensorType::Mxfp4 => 1,
        }
    }
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorType::Ggml(d) => write!(f, "{d:?}"),
            TensorType::Mxfp4 => f.write_str("MXFP4"),
        }
    }
}
