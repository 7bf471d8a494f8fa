//! The Avx512 class: AVX-512 F, VL and BW without VNNI. The packed products on 512-bit registers
//! with `vpmaddubsw` + `vpmaddwd`, attention on 512-bit registers (256-bit ones for heads of a
//! multiple of 8 but not 16 dimensions), the products over GGUF-layout weights as Avx2.

use super::super::{
    attend_rows_avx2, attend_rows_avx512, attend_rows_q8_avx512, fma_peak_avx512,
    packed_rows_avx512, peak_avx512,
};
use super::avx2::AVX2;
use crate::kernels::table::{Attend, Attention, Kernels};
use half::{bf16, f16};

/// The attention of every class with AVX-512: 512-bit registers for heads of a multiple of 16
/// dimensions, 256-bit ones for multiples of 8.
pub(super) const ATTENTION: Attention = Attention {
    f32: &[
        Attend {
            multiple: 16,
            tiles: None,
            run: attend_rows_avx512::<f32>,
        },
        Attend {
            multiple: 8,
            tiles: None,
            run: attend_rows_avx2::<f32>,
        },
    ],
    f16: &[
        Attend {
            multiple: 16,
            tiles: None,
            run: attend_rows_avx512::<f16>,
        },
        Attend {
            multiple: 8,
            tiles: None,
            run: attend_rows_avx2::<f16>,
        },
    ],
    bf16: &[
        Attend {
            multiple: 16,
            tiles: None,
            run: attend_rows_avx512::<bf16>,
        },
        Attend {
            multiple: 8,
            tiles: None,
            run: attend_rows_avx2::<bf16>,
        },
    ],
    q8: Some(attend_rows_q8_avx512),
    // Over 16k positions, bf16 ran 1.05-1.74x f32 from one row to 256 (`abench`, widened a
    // block at a time from 16 queries, the kernel log, "A room on cache lines").
    bf16_by_default: 16,
};

pub(crate) const AVX512: Kernels = Kernels {
    name: "avx512",
    packed_rows: Some(packed_rows_avx512),
    attention: ATTENTION,
    int8_peak: Some(peak_avx512),
    f32_peak: Some(fma_peak_avx512),
    ..AVX2
};
