//! The Avx2 class: AVX2, FMA and F16C (Intel Haswell and later, AMD Zen). The packed products on
//! 256-bit registers with `vpmaddubsw` + `vpmaddwd`, attention on 256-bit registers.

use super::super::{
    attend_rows_avx2, attend_rows_q8_avx2, dot_rows_avx2_of, fma_peak_avx2, packed_rows_avx2,
    peak_avx2,
};
use crate::kernels::quant::quantize_block_avx2;
use crate::kernels::table::{Attend, Attention, Kernels};

/// The attention of every class on 256-bit registers: heads of a multiple of 8 dimensions.
pub(super) const ATTENTION: Attention = Attention {
    f32: &[Attend {
        multiple: 8,
        tiles: None,
        run: attend_rows_avx2::<f32>,
    }],
    f16: &[Attend {
        multiple: 8,
        tiles: None,
        run: attend_rows_avx2::<half::f16>,
    }],
    bf16: &[Attend {
        multiple: 8,
        tiles: None,
        run: attend_rows_avx2::<half::bf16>,
    }],
    q8: Some(attend_rows_q8_avx2),
    // On an AVX-512 Xeon's 256-bit path bf16 ran 1.05-1.38x f32 at every width over 16k
    // positions (`abench`, 2026-12-07, the kernel log), but no CPU of this class has been
    // measured: f32 until one is.
    bf16_by_default: 0,
};

pub(crate) const AVX2: Kernels = Kernels {
    name: "avx2",
    quantize_block: Some(quantize_block_avx2),
    packed_rows: Some(packed_rows_avx2),
    tile_rows: None,
    dot_rows: Some((dot_rows_avx2_of, false)),
    attention: ATTENTION,
    prompt_rows: None,
    int8_peak: Some(peak_avx2),
    f32_peak: Some(fma_peak_avx2),
    tile_int8_peak: None,
    tile_bf16_peak: None,
};
