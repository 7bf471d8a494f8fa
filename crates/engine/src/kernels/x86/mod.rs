//! The x86-64 kernels, by family: `products` (quantized products over weights in their GGUF
//! layout), `packed` (the same over the interleaved layout, its integer sums in `sums`),
//! `amx` (the packed products on AMX int8 tiles, for many generated rows),
//! `amx_prompt` (prompt rows' products on bf16 tiles; `amx_prompt_int8` on rotated int8 tiles,
//! their steps shared in `tile_steps`; `vnni_prompt_int8` the same arithmetic with `vpdpbusd`), `attention` (with `online_softmax`, its
//! weights of a block; `q8_attention` over a q8 cache and `widened_attention` over an f16 or
//! bf16 one in wide passes, both through f32 spans in L1 (`spans`); `amx_attention` over a bf16
//! cache on tiles, its softmax in `amx_softmax`), and `elementwise` (dot, softmax, SwiGLU). `classes`
//! says which of them each x86 class runs (its table). All are `unsafe`: they may only run on a CPU with the features their
//! `#[target_feature]` names, which their callers in `kernels` check first.

use super::format::Format;
use std::arch::x86_64::*;

mod amx;
mod amx_attention;
mod amx_prompt;
mod amx_prompt_int8;
mod amx_softmax;
mod attention;
pub(crate) mod classes;
mod elementwise;
mod online_softmax;
mod packed;
mod peak;
mod products;
mod q8_attention;
mod spans;
mod sums;
mod tile_steps;
mod vnni_prompt_int8;
mod widened_attention;
mod width;

pub(crate) use amx::{packed_rows_amx, peak_amx, permission as amx_permission, TILE_ROWS};
pub(crate) use amx_attention::{attend_rows_amx, bf16_tiles};
pub(crate) use amx_prompt::{
    peak_bf16 as peak_amx_bf16, products as prompt_products, to_line as prompt_to_line,
    to_tiles as prompt_to_tiles, Line as TileLine, STRIP as PROMPT_STRIP,
};
pub(crate) use amx_prompt_int8::{
    products as rotated_products, round_row as rotated_round_row, to_tiles as rotated_to_tiles,
};
#[cfg(test)]
pub(crate) use amx_softmax::BLOCK as TILE_BLOCK;
#[cfg(test)]
pub(crate) use amx_softmax::{exp_tile_of, sums_at_once_and_alone};
pub(crate) use attention::attend_plain_fma;
pub(crate) use elementwise::{dot_f32, softmax_avx2, swiglu_avx2};
pub(crate) use packed::{
    packed_rows_avx2, packed_rows_avx512, packed_rows_avx_vnni, packed_rows_avx_vnni_evex,
    packed_rows_vnni,
};
pub(crate) use peak::{
    fma_peak_avx2, fma_peak_avx512, peak_avx2, peak_avx512, peak_avx512_vnni, peak_avx_vnni,
    peak_avx_vnni_evex,
};
pub(crate) use products::{dot_rows_avx2_of, dot_rows_vnni_of};
pub(crate) use q8_attention::{attend_rows_q8_avx2, attend_rows_q8_avx512};
pub(crate) use vnni_prompt_int8::{products as vnni_rotated_products, to_unsigned};
#[cfg(test)]
pub(crate) use widened_attention::WIDEN_FROM;
pub(crate) use widened_attention::{attend_rows_avx2, attend_rows_avx512};

// The formats as the kernels' const parameters (see `Format::from_code`).
pub(crate) const Q4_0: u8 = Format::Q4_0 as u8;
pub(crate) const Q4_1: u8 = Format::Q4_1 as u8;
pub(crate) const Q5_0: u8 = Format::Q5_0 as u8;
pub(crate) const Q8_0: u8 = Format::Q8_0 as u8;
pub(crate) const Q4K: u8 = Format::Q4K as u8;
pub(crate) const Q6K: u8 = Format::Q6K as u8;
pub(crate) const MXFP4: u8 = Format::Mxfp4 as u8;

/// The sum of the eight lanes.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}
