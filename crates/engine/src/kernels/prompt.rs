//! Which arithmetic a product's rows take. A class may compute a prompt's rows (prefill) with
//! another arithmetic than generated rows (decoding, verifying drafts): the Amx class computes
//! them on bf16 tiles (`x86::amx_prompt`), wherever a matrix is Q4_K or Q6_K in whole strips of
//! 32 rows, and everything else as Avx512Vnni. In every class a row's result depends only on the
//! row and its kind, never on the other rows of its pass.

use super::matrix::QMatrix;
use super::parallel::OutPtr;
use super::{isa, matmul_many_with, pool, Isa};

/// What a row of a pass is: one of a prompt's tokens, or a generated one (or a draft of one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    Prompt,
    Generated,
}

/// Whether the kernels in use compute prompt rows with an arithmetic of their own (the Amx
/// class where the CPU has AMX-BF16): the keys and values of a generated row then differ from
/// those the same token gets as a prompt row, which a prefix cache must not mix up.
pub fn prompt_arithmetic_differs() -> bool {
    prompt_tiles(isa())
}

/// The name of the arithmetic prompt rows take (a prefix cache keeps keys and values only under
/// the names they were computed with): changes whenever its bits do.
pub fn prompt_arithmetic() -> &'static str {
    if prompt_arithmetic_differs() {
        "bf16 tiles 1"
    } else {
        "as generated"
    }
}

fn prompt_tiles(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa == Isa::Amx && super::x86::bf16_tiles() && is_x86_feature_detected!("avx512vbmi");
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Whether `w`'s prompt rows take the bf16 tiles.
fn on_tiles(w: &QMatrix) -> bool {
    #[cfg(target_arch = "x86_64")]
    return w.packed.as_ref().is_some_and(|p| {
        matches!(
            p.format,
            super::format::Format::Q4K | super::format::Format::Q6K
        ) && p.rows.is_multiple_of(super::x86::PROMPT_STRIP)
    });
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = w;
        false
    }
}

/// `matmul_many` over rows of one kind.
pub fn matmul_many_rows(kind: RowKind, x: &[f32], m: usize, jobs: &mut [(&QMatrix, &mut [f32])]) {
    let isa = isa();
    if kind == RowKind::Generated || !prompt_tiles(isa) || m == 0 {
        return matmul_many_with(isa, x, m, jobs);
    }
    let mut tiles = Vec::new();
    let mut rest = Vec::new();
    for (w, out) in jobs.iter_mut() {
        assert_eq!(x.len(), m * w.cols, "activation shape");
        assert_eq!(out.len(), m * w.rows, "output shape");
        if on_tiles(w) {
            tiles.push((&**w, OutPtr(out.as_mut_ptr())));
        } else {
            rest.push((&**w, &mut **out));
        }
    }
    if !rest.is_empty() {
        matmul_many_with(isa, x, m, &mut rest);
    }
    #[cfg(target_arch = "x86_64")]
    if !tiles.is_empty() {
        on_bf16_tiles(x, m, &tiles);
    }
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    static ACTS: std::cell::RefCell<Vec<super::x86::TileLine>> = const { std::cell::RefCell::new(Vec::new()) };
    static SCRATCH: std::cell::RefCell<(Vec<super::x86::TileLine>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The products of `jobs` (each on tiles, its output `m x rows` at the pointer) over the same
/// `m` activation rows: the activations rounded to bf16 once, then runs of strips shared out to
/// the threads, about four per thread.
#[cfg(target_arch = "x86_64")]
fn on_bf16_tiles(x: &[f32], m: usize, jobs: &[(&QMatrix, OutPtr<f32>)]) {
    use super::x86::{prompt_products, prompt_to_tiles, TileLine, PROMPT_STRIP, TILE_ROWS};
    let k = jobs[0].0.cols;
    let threads = pool::global().threads();
    let total: usize = jobs.iter().map(|(w, _)| w.rows / PROMPT_STRIP).sum();
    let per = total.div_ceil(threads * 4).max(1);
    let mut work = Vec::new();
    for (ji, (w, _)) in jobs.iter().enumerate() {
        let strips = w.rows / PROMPT_STRIP;
        for s0 in (0..strips).step_by(per) {
            work.push((ji, s0, (s0 + per).min(strips)));
        }
    }
    ACTS.with(|cell| {
        let mut acts = cell.borrow_mut();
        let lines = k / 32 * TILE_ROWS;
        acts.clear();
        acts.resize(m.div_ceil(TILE_ROWS) * lines, TileLine::default());
        super::par_chunks_mut(&mut acts, lines, &|t, tile| {
            // SAFETY: `prompt_tiles` found AVX-512 BF16 (and the rest of the Amx class's
            // AVX-512); `tile` is tile t's k / 32 * 16 lines, t < m / 16 rounded up.
            unsafe { prompt_to_tiles(x, m, k, t * TILE_ROWS, tile) }
        });
        let acts = &*acts;
        pool::global().run(work.len(), &|i| {
            let (ji, s0, s1) = work[i];
            let (w, out) = jobs[ji];
            let p = w.packed.as_ref().expect("on_tiles: packed");
            SCRATCH.with(|cell| {
                let (scratch, tail) = &mut *cell.borrow_mut();
                // SAFETY: the CPU has AMX-BF16 with the tile permission, AVX-512 BF16 and VBMI
                // (`prompt_tiles`); `p` is Q4_K or Q6_K in whole strips (`on_tiles`) and its
                // strips s0..s1 exist; `acts` holds the m rows over p.cols = k columns; `out`
                // holds m x p.rows floats (checked in `matmul_many_rows`), whose columns of
                // strips s0..s1 are this work item's alone.
                unsafe { prompt_products(p, (s0, s1), acts, m, out.get(), p.rows, scratch, tail) }
            });
        });
    });
}
