//! Prompt rows in the rotated int8 arithmetic (`kernels::rotated`, `PLD_PROMPT_ROWS=int8`), as
//! the Amx class (on int8 tiles) and the Avx512Vnni class (with `vpdpbusd`) both run it: which
//! matrices take it, their copies, the activations rotated and rounded once per product, and
//! the runs of strips shared out to the threads. Both kernels give the definition's bits, so
//! both classes give a prompt row the same result.

use super::super::{rotated_products, rotated_round_row, rotated_to_tiles};
use super::super::{to_unsigned, vnni_rotated_products};
use super::super::{PROMPT_STRIP, TILE_ROWS};
use crate::kernels::format::Format;
use crate::kernels::matrix::QMatrix;
use crate::kernels::parallel::{par_chunks_mut, OutPtr};
use crate::kernels::pool;
use crate::kernels::rotated::{Line, RotatedInt8, STEP};
use crate::kernels::table::PromptRows;

/// The arithmetic's name (a prefix cache keeps keys and values under it): changes whenever its
/// bits do, in every class that runs it.
pub(super) const NAME: &str = "rotated int8 1";

/// What `PLD_PROMPT_ROWS` asks for: `Ok(true)` for `int8` (the rotated int8 arithmetic),
/// `Ok(false)` for `bf16` (the Amx class's default; other classes' prompt rows are generated
/// rows' then) or when unset or empty, an error naming any other value.
pub(crate) fn prompt_rows_requested(value: Option<&str>) -> Result<bool, String> {
    match value.unwrap_or("") {
        "" | "bf16" => Ok(false),
        "int8" => Ok(true),
        v => Err(format!("PLD_PROMPT_ROWS={v} is none of bf16, int8")),
    }
}

/// Whether prompt rows take the rotated int8 arithmetic (`PLD_PROMPT_ROWS=int8`); a value that
/// names neither is reported on stderr once and the default is used.
pub(super) fn int8_prompt_rows() -> bool {
    let value = std::env::var("PLD_PROMPT_ROWS").ok();
    prompt_rows_requested(value.as_deref()).unwrap_or_else(|e| {
        eprintln!("warning: {e}; using the default");
        false
    })
}

/// Whether `w`'s prompt rows take a tile-strip arithmetic: Q4_K and Q6_K packed in whole strips
/// of 32 rows.
pub(super) fn on_strips(w: &QMatrix) -> bool {
    w.packed.as_ref().is_some_and(|p| {
        matches!(p.format, Format::Q4K | Format::Q6K) && p.rows.is_multiple_of(PROMPT_STRIP)
    })
}

/// Whether `w`'s prompt rows take the rotated int8 arithmetic: `on_strips`, in whole blocks of
/// 256 columns.
fn on_rotated(w: &QMatrix) -> bool {
    on_strips(w) && RotatedInt8::fits(w.rows, w.cols)
}

/// `w`'s rotated copy, made on first use (on the pool's threads: not from inside a pool job),
/// each row rotated and rounded with AVX-512 (`plain_round`'s bits).
fn rotated_copy(w: &QMatrix) -> &RotatedInt8 {
    let p = w.packed.as_ref().expect("on_rotated: packed");
    // SAFETY: both classes that take this arithmetic have AVX-512 F and BW.
    let round = |v: &mut [f32], q: &mut [i8]| unsafe { rotated_round_row(v, q) };
    p.rotated.get_or_init(|| w.rotated_int8_by(&round))
}

/// The arithmetic's table entry with the products `run` (a class's kernel).
pub(super) const fn prompt_rows(run: unsafe fn(&[f32], usize, &[Job<'_>])) -> PromptRows {
    PromptRows {
        name: NAME,
        takes: on_rotated,
        run,
        ffn: None,
        prepare: Some(|w| {
            rotated_copy(w);
        }),
        int8: true,
    }
}

/// A matrix of the product and where its output goes.
type Job<'a> = (&'a QMatrix, OutPtr<f32>);

thread_local! {
    static ACTS: std::cell::RefCell<(Vec<Line>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    static ROTATE_BUF: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    static TAIL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The products of `jobs` (each `on_rotated`) over the same `m` rows of `x` on AMX int8 tiles.
///
/// # Safety
/// The CPU has AMX-INT8 with the tile permission and AVX-512 BW; `x` is `m x cols` of every
/// matrix; each output holds `m * rows` floats, no other job's.
pub(super) unsafe fn on_int8_tiles(x: &[f32], m: usize, jobs: &[Job<'_>]) {
    with_rotated(x, m, jobs, false, &|w, (s0, s1), acts, (m, scales), at| {
        TAIL.with(|tail| {
            // SAFETY: the CPU has AMX-INT8 with the tile permission and AVX-512 F (the
            // caller's promise); the rest is `with_rotated`'s.
            unsafe {
                rotated_products(
                    w,
                    (s0, s1),
                    acts,
                    (m, scales),
                    at,
                    w.rows,
                    &mut tail.borrow_mut(),
                )
            }
        })
    });
}

/// The products of `jobs` (each `on_rotated`) over the same `m` rows of `x` with AVX-512 VNNI.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; `x` is `m x cols` of every matrix; each output holds
/// `m * rows` floats, no other job's.
pub(super) unsafe fn on_int8_vnni(x: &[f32], m: usize, jobs: &[Job<'_>]) {
    with_rotated(x, m, jobs, true, &|w, (s0, s1), acts, (m, scales), at| {
        // SAFETY: the CPU has AVX-512 F and VNNI (the caller's promise); the rest is
        // `with_rotated`'s.
        unsafe { vnni_rotated_products(w, (s0, s1), acts, (m, scales), at, w.rows) }
    });
}

/// A kernel's products of strips `s0..s1` of a copy against the rows in tile order and their
/// scales, to the output of strip `s0`'s first column (rows `w.rows` apart).
type Strips = dyn Fn(&RotatedInt8, (usize, usize), &[Line], (usize, &[f32]), *mut f32) + Sync;

/// The activations rotated and rounded once (in tile order; `unsigned`: each byte plus 128 for
/// `vpdpbusd`), on the pool's threads a tile of rows each; then runs of strips of every job
/// shared out to the threads (`strip_runs`), each through `products`. Its promise to
/// `products`: the strips exist, the activations hold the `m` rows over the copy's columns, and
/// the output's columns of those strips are the call's alone.
///
/// # Safety
/// The CPU has AVX-512 BW; `x` is `m x cols` of every matrix; each output holds `m * rows`
/// floats, no other job's.
unsafe fn with_rotated(x: &[f32], m: usize, jobs: &[Job<'_>], unsigned: bool, products: &Strips) {
    let copies: Vec<&RotatedInt8> = jobs.iter().map(|(w, _)| rotated_copy(w)).collect();
    let k = jobs[0].0.cols;
    ACTS.with(|cell| {
        let (acts, scales) = &mut *cell.borrow_mut();
        let tiles = m.div_ceil(TILE_ROWS);
        let lines = k / STEP * TILE_ROWS;
        acts.clear();
        acts.resize(tiles * lines, Line::default());
        scales.clear();
        scales.resize(tiles * TILE_ROWS, 0.0);
        let at = OutPtr(scales.as_mut_ptr());
        par_chunks_mut(acts, lines, &|t, tile| {
            ROTATE_BUF.with(|buf| {
                // SAFETY: scales t * 16..t * 16 + 16 are tile t's alone, inside `scales`; the
                // CPU has AVX-512 BW (the caller's promise); `tile` is tile t's lines.
                unsafe {
                    let own =
                        std::slice::from_raw_parts_mut(at.get().add(t * TILE_ROWS), TILE_ROWS);
                    rotated_to_tiles(x, (m, k), t * TILE_ROWS, tile, own, &mut buf.borrow_mut());
                    if unsigned {
                        to_unsigned(tile);
                    }
                }
            })
        });
        let (acts, scales) = (&*acts, &*scales);
        let work = strip_runs(jobs);
        pool::global().run(work.len(), &|i| {
            let (ji, s0, s1) = work[i];
            let (w, out) = (copies[ji], jobs[ji].1);
            // SAFETY: strip s0's first column of an output of m x w.rows floats.
            let at = unsafe { out.get().add(s0 * PROMPT_STRIP) };
            products(w, (s0, s1), acts, (m, scales), at);
        });
    });
}

/// Runs of strips of every job, about four per thread: (job, first strip, end strip).
pub(super) fn strip_runs(jobs: &[Job<'_>]) -> Vec<(usize, usize, usize)> {
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
    work
}
