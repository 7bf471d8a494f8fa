//! The Avx2Vnni class: AVX2 with 256-bit `vpdpbusd`, in AVX-VNNI's encoding (Intel Alder Lake
//! and later client CPUs) or AVX-512 VL's (CPUs with AVX-512 VNNI, where it also runs); the rest
//! as Avx2.

use super::super::{
    packed_rows_avx_vnni, packed_rows_avx_vnni_evex, peak_avx_vnni, peak_avx_vnni_evex,
};
use super::avx2::AVX2;
use crate::kernels::table::Kernels;

/// In AVX-VNNI's encoding.
pub(crate) const AVX2_VNNI: Kernels = Kernels {
    name: "avx2vnni",
    packed_rows: Some(packed_rows_avx_vnni),
    int8_peak: Some(peak_avx_vnni),
    ..AVX2
};

/// In AVX-512 VL's encoding.
pub(crate) const AVX2_VNNI_EVEX: Kernels = Kernels {
    name: "avx2vnni",
    packed_rows: Some(packed_rows_avx_vnni_evex),
    int8_peak: Some(peak_avx_vnni_evex),
    ..AVX2
};
