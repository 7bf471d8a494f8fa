//! The x86-64 kernel classes' tables (`kernels::Kernels`), one file per class: which of the
//! x86 kernels each runs. A new class is a file here, an `Isa` variant and its line in
//! `Isa::kernels`.

mod amx;
mod avx2;
mod avx2_vnni;
mod avx512;
mod avx512_vnni;

pub(crate) use amx::kernels as amx;
#[cfg(test)]
pub(crate) use amx::{int8_prompt_table, prompt_rows_requested};
pub(crate) use avx2::AVX2;
pub(crate) use avx2_vnni::{AVX2_VNNI, AVX2_VNNI_EVEX};
pub(crate) use avx512::AVX512;
pub(crate) use avx512_vnni::AVX512_VNNI;
