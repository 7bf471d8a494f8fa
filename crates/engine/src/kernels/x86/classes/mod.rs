//! The x86-64 kernel classes' tables (`kernels::Kernels`), one file per class: which of the
//! x86 kernels each runs. A new class is a file here, an `Isa` variant and its line in
//! `Isa::kernels`. `int8_prompt` holds what two classes share: prompt rows in the rotated int8
//! arithmetic.

mod amx;
mod avx2;
mod avx2_vnni;
mod avx512;
mod avx512_vnni;
mod int8_prompt;

#[cfg(test)]
pub(crate) use amx::int8_prompt_table as amx_int8_prompt_table;
pub(crate) use amx::kernels as amx;
pub(crate) use avx2::AVX2;
pub(crate) use avx2_vnni::{AVX2_VNNI, AVX2_VNNI_EVEX};
pub(crate) use avx512::AVX512;
#[cfg(test)]
pub(crate) use avx512_vnni::int8_prompt_table as vnni_int8_prompt_table;
pub(crate) use avx512_vnni::kernels as avx512_vnni;
#[cfg(test)]
pub(crate) use int8_prompt::prompt_rows_requested;
