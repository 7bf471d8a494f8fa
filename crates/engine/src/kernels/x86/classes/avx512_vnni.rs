//! The Avx512Vnni class (`PLD_KERNEL=vnni`): AVX-512 with VNNI's `vpdpbusd`. The packed products
//! and the products over GGUF-layout weights on 512-bit registers (the latter reading the
//! activations' scales spread over the lanes), the rest as Avx512.

use super::super::{dot_rows_vnni_of, packed_rows_vnni, peak_avx512_vnni};
use super::avx512::AVX512;
use crate::kernels::table::Kernels;

pub(crate) const AVX512_VNNI: Kernels = Kernels {
    name: "vnni",
    packed_rows: Some(packed_rows_vnni),
    dot_rows: Some((dot_rows_vnni_of, true)),
    int8_peak: Some(peak_avx512_vnni),
    ..AVX512
};
