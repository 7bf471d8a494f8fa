//! The Avx512Vnni class (`PLD_KERNEL=vnni`): AVX-512 with VNNI's `vpdpbusd`. The packed products
//! and the products over GGUF-layout weights on 512-bit registers (the latter reading the
//! activations' scales spread over the lanes), the rest as Avx512. With `PLD_PROMPT_ROWS=int8`,
//! a prompt's rows take the rotated int8 arithmetic over a copy made at load
//! (`x86::vnni_prompt_int8`, the Amx class's int8 prompt rows' bits); by default they take the
//! generated rows' arithmetic.

use super::super::{dot_rows_vnni_of, packed_rows_vnni, peak_avx512_vnni};
use super::avx512::AVX512;
use super::int8_prompt::{self, int8_prompt_rows, on_int8_vnni};
use crate::kernels::table::Kernels;
use std::sync::OnceLock;

pub(crate) const AVX512_VNNI: Kernels = Kernels {
    name: "vnni",
    packed_rows: Some(packed_rows_vnni),
    dot_rows: Some((dot_rows_vnni_of, true)),
    int8_peak: Some(peak_avx512_vnni),
    ..AVX512
};

/// With `PLD_PROMPT_ROWS=int8`: prompt rows in the rotated int8 arithmetic.
const AVX512_VNNI_INT8_PROMPT: Kernels = Kernels {
    prompt_rows: Some(int8_prompt::prompt_rows(on_int8_vnni)),
    ..AVX512_VNNI
};

/// The class's table for what `PLD_PROMPT_ROWS` asks.
pub(crate) fn kernels() -> &'static Kernels {
    static WHICH: OnceLock<&'static Kernels> = OnceLock::new();
    WHICH.get_or_init(|| match int8_prompt_rows() {
        true => &AVX512_VNNI_INT8_PROMPT,
        false => &AVX512_VNNI,
    })
}

/// The int8 prompt rows' table entry of the class (tests).
#[cfg(test)]
pub(crate) fn int8_prompt_table() -> &'static crate::kernels::table::PromptRows {
    AVX512_VNNI_INT8_PROMPT
        .prompt_rows
        .as_ref()
        .expect("int8 prompt rows")
}
