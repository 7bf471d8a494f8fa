//! Which arithmetic a product's rows take. A class may compute a prompt's rows (prefill) with
//! another arithmetic than generated rows (decoding, verifying drafts), its table's
//! `prompt_rows`: the Amx class computes them on bf16 tiles (`x86::amx_prompt`), wherever a
//! matrix is Q4_K or Q6_K in whole strips of 32 rows, and everything else as Avx512Vnni; with
//! `PLD_PROMPT_ROWS=int8` the Amx and Avx512Vnni classes take the rotated int8 arithmetic
//! (`kernels::rotated`) on those matrices instead. In every class a row's result depends only on
//! the row and its kind, never on the other rows of its pass.

use super::matrix::QMatrix;
use super::parallel::OutPtr;
use super::{isa, matmul_many_with};

/// What a row of a pass is: one of a prompt's tokens, or a generated one (or a draft of one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    Prompt,
    Generated,
}

/// Whether the kernels in use compute prompt rows with an arithmetic of their own (the Amx
/// class where the CPU has AMX-BF16 and VBMI; `PLD_PROMPT_ROWS=int8` in it or Avx512Vnni): the keys and values of a generated row then
/// differ from those the same token gets as a prompt row, which a prefix cache must not mix up.
pub fn prompt_arithmetic_differs() -> bool {
    isa().kernels().prompt_rows.is_some()
}

/// The name of the arithmetic prompt rows take (a prefix cache keeps keys and values only under
/// the names they were computed with): changes whenever its bits do.
pub fn prompt_arithmetic() -> &'static str {
    isa()
        .kernels()
        .prompt_rows
        .as_ref()
        .map_or("as generated", |p| p.name)
}

/// Makes what the class's prompt rows read beside `w`'s packed weights, where they read a copy
/// of their own (`PLD_PROMPT_ROWS=int8`): at load, for the matrices prompt rows multiply (a
/// layer's attention and dense feed-forward; not a mixture's experts nor the output head, which
/// take the generated rows' arithmetic), so that the first prompt does not wait for it.
pub fn prepare_prompt_rows(w: &QMatrix) {
    let Some(p) = isa().kernels().prompt_rows.as_ref() else {
        return;
    };
    if let Some(prepare) = p.prepare.filter(|_| (p.takes)(w)) {
        prepare(w);
        // The copy read the file's bytes again; the products read the packed ones.
        w.bytes.release_pages();
    }
}

/// Bytes of `w`'s copy for prompt rows (`prepare_prompt_rows`), zero where it has none.
pub fn prompt_copy_bytes(w: &QMatrix) -> usize {
    let copy = w.packed.as_ref().and_then(|p| p.rotated.get());
    copy.map_or(0, |c| c.bytes())
}

/// Whether prompt rows take the rotated int8 arithmetic (`kernels::rotated`): an int8 peak is
/// their limit (the tiles', or the vector loop's where the class has no tiles), not the bf16 one.
pub fn prompt_rows_on_int8() -> bool {
    isa().kernels().prompt_rows.as_ref().is_some_and(|p| p.int8)
}

/// A gated feed-forward block's matrices and activation: `down(activation(gate(x), up(x)))`,
/// where `activation(g, u)` overwrites `g` with its result number by number.
pub struct GatedFfn<'a> {
    pub gate: &'a QMatrix,
    pub up: &'a QMatrix,
    pub down: &'a QMatrix,
    pub activation: fn(&mut [f32], &[f32]),
}

/// The gated feed-forward of `m` rows of one kind into `out` (`m x down.rows`) in one go, where
/// the class fuses it for that kind and matrices (the Amx class's prompt rows: the activation
/// applied to the gate and up products while they are in cache, and rounded straight into the
/// down product's tiles); false, `out` untouched, where it does not, and the caller takes the
/// products and the activation in turn. Either way the bits are the same.
pub fn gated_ffn_rows(kind: RowKind, x: &[f32], m: usize, ffn: &GatedFfn, out: &mut [f32]) -> bool {
    let Some(prompt_rows) = isa().kernels().prompt_rows.as_ref() else {
        return false;
    };
    let Some(run) = prompt_rows.ffn else {
        return false;
    };
    let (gate, up, down) = (ffn.gate, ffn.up, ffn.down);
    let fits = gate.rows == up.rows && gate.cols == up.cols && down.cols == gate.rows;
    if kind != RowKind::Prompt || m == 0 || !fits {
        return false;
    }
    if ![gate, up, down].into_iter().all(|w| (prompt_rows.takes)(w)) {
        return false;
    }
    assert_eq!(x.len(), m * gate.cols, "activation shape");
    assert_eq!(out.len(), m * down.rows, "output shape");
    // SAFETY: the table is of a class the CPU runs (`Isa::kernels`); `x` is m x cols of the
    // gate and up matrices and `out` m x down.rows (asserted above); the three take the
    // class's prompt arithmetic.
    unsafe { run(x, m, ffn, OutPtr(out.as_mut_ptr())) };
    true
}

/// `matmul_many` over rows of one kind.
pub fn matmul_many_rows(kind: RowKind, x: &[f32], m: usize, jobs: &mut [(&QMatrix, &mut [f32])]) {
    let isa = isa();
    let prompt_rows = isa.kernels().prompt_rows.as_ref();
    let Some(prompt_rows) = prompt_rows.filter(|_| kind == RowKind::Prompt && m > 0) else {
        return matmul_many_with(isa, x, m, jobs);
    };
    let mut own = Vec::new();
    let mut rest = Vec::new();
    for (w, out) in jobs.iter_mut() {
        assert_eq!(x.len(), m * w.cols, "activation shape");
        assert_eq!(out.len(), m * w.rows, "output shape");
        if (prompt_rows.takes)(w) {
            own.push((&**w, OutPtr(out.as_mut_ptr())));
        } else {
            rest.push((&**w, &mut **out));
        }
    }
    if !rest.is_empty() {
        matmul_many_with(isa, x, m, &mut rest);
    }
    if !own.is_empty() {
        // SAFETY: the table is of a class the CPU runs (`Isa::kernels`); `x` is m x cols of
        // every matrix and each output m x rows (both asserted above), its own.
        unsafe { (prompt_rows.run)(x, m, &own) };
    }
}
