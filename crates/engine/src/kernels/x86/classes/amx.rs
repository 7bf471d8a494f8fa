//! The Amx class: AVX-512 VNNI with AMX tiles (Intel Sapphire Rapids and later), where the OS
//! grants the tile state. Passes over many generated rows take int8 tiles (`x86::amx`), the
//! same bits as Avx512Vnni; with AMX-BF16, attention over a bf16 cache takes bf16 tiles
//! (`x86::amx_attention`), and with AVX-512 VBMI besides, a prompt's rows take bf16 tiles over
//! Q4_K and Q6_K weights (`x86::amx_prompt`), or with `PLD_PROMPT_ROWS=int8` rotated int8 tiles
//! over a copy made at load (`x86::amx_prompt_int8`), arithmetics of their own. Everything else
//! as Avx512Vnni.

use super::super::{
    attend_rows_amx, bf16_tiles, packed_rows_amx, peak_amx, peak_amx_bf16, prompt_products,
    prompt_to_line, prompt_to_tiles, rotated_products, rotated_to_tiles, TileLine, PROMPT_STRIP,
    TILE_ROWS,
};
use super::avx512::ATTENTION;
use super::avx512_vnni::AVX512_VNNI;
use crate::kernels::format::Format;
use crate::kernels::matrix::QMatrix;
use crate::kernels::parallel::{par_chunks_mut, OutPtr};
use crate::kernels::prompt::GatedFfn;
use crate::kernels::rotated::{Line as Int8Line, RotatedInt8, STEP as INT8_STEP};
use crate::kernels::table::{Attend, Attention, Kernels, PromptRows};
use crate::kernels::{pool, AMX_MIN_ROWS};
use std::sync::OnceLock;

/// Int8 tiles only.
const AMX: Kernels = Kernels {
    name: "amx",
    tile_rows: Some((AMX_MIN_ROWS, packed_rows_amx)),
    tile_int8_peak: Some(peak_amx),
    ..AVX512_VNNI
};

/// With AMX-BF16: attention over a bf16 cache on tiles for heads of a multiple of 32.
const AMX_BF16: Kernels = Kernels {
    attention: Attention {
        bf16: &[
            Attend {
                multiple: 32,
                // Blocks of 256 positions and `exp_tile` since 2026-12-05 (blocks of 64 and the
                // vector kernels' exponential before).
                tiles: Some("bf16 tiles 2"),
                run: attend_rows_amx,
            },
            ATTENTION.bf16[0],
            ATTENTION.bf16[1],
        ],
        ..ATTENTION
    },
    tile_bf16_peak: Some(peak_amx_bf16),
    ..AMX
};

/// With AVX-512 VBMI besides: prompt rows on bf16 tiles.
const AMX_BF16_PROMPT: Kernels = Kernels {
    prompt_rows: Some(PromptRows {
        // Changes whenever the prompt rows' bits do.
        name: "bf16 tiles 1",
        takes: on_tiles,
        run: on_bf16_tiles,
        ffn: Some(ffn_on_bf16_tiles),
        prepare: None,
        int8: false,
    }),
    ..AMX_BF16
};

/// With `PLD_PROMPT_ROWS=int8`: prompt rows on int8 tiles in the rotated arithmetic
/// (`kernels::rotated`), over a copy of the weights made at load (one byte a weight).
const AMX_INT8_PROMPT: Kernels = Kernels {
    prompt_rows: Some(PromptRows {
        // Changes whenever the prompt rows' bits do.
        name: "rotated int8 1",
        takes: on_rotated,
        run: on_int8_tiles,
        ffn: None,
        prepare: Some(|w| {
            rotated_copy(w);
        }),
        int8: true,
    }),
    ..AMX_BF16
};

/// The class's table for what this CPU has beyond the int8 tiles.
pub(crate) fn kernels() -> &'static Kernels {
    static WHICH: OnceLock<&'static Kernels> = OnceLock::new();
    WHICH.get_or_init(
        || match (bf16_tiles(), is_x86_feature_detected!("avx512vbmi")) {
            (true, true) if int8_prompt_rows() => &AMX_INT8_PROMPT,
            (true, true) => &AMX_BF16_PROMPT,
            (true, false) => &AMX_BF16,
            (false, _) => &AMX,
        },
    )
}

/// What `PLD_PROMPT_ROWS` asks for: `Ok(true)` for `int8` (the rotated int8 tiles), `Ok(false)`
/// for `bf16` or when unset or empty, an error naming any other value.
pub(crate) fn prompt_rows_requested(value: Option<&str>) -> Result<bool, String> {
    match value.unwrap_or("") {
        "" | "bf16" => Ok(false),
        "int8" => Ok(true),
        v => Err(format!("PLD_PROMPT_ROWS={v} is none of bf16, int8")),
    }
}

/// Whether prompt rows take the rotated int8 tiles (`PLD_PROMPT_ROWS=int8`); a value that names
/// neither arithmetic is reported on stderr once and the default (bf16 tiles) is used.
fn int8_prompt_rows() -> bool {
    let value = std::env::var("PLD_PROMPT_ROWS").ok();
    prompt_rows_requested(value.as_deref()).unwrap_or_else(|e| {
        eprintln!("warning: {e}; using bf16");
        false
    })
}

/// The int8 prompt rows' arithmetic, whichever the class uses (tests).
#[cfg(test)]
pub(crate) fn int8_prompt_table() -> &'static PromptRows {
    AMX_INT8_PROMPT
        .prompt_rows
        .as_ref()
        .expect("int8 prompt rows")
}

/// Whether `w`'s prompt rows take the bf16 tiles: Q4_K and Q6_K packed in whole strips.
fn on_tiles(w: &QMatrix) -> bool {
    w.packed.as_ref().is_some_and(|p| {
        matches!(p.format, Format::Q4K | Format::Q6K) && p.rows.is_multiple_of(PROMPT_STRIP)
    })
}

/// Whether `w`'s prompt rows take the rotated int8 tiles: Q4_K and Q6_K packed, in whole strips
/// and blocks of 256 columns.
fn on_rotated(w: &QMatrix) -> bool {
    on_tiles(w) && RotatedInt8::fits(w.rows, w.cols)
}

/// `w`'s rotated copy, made on first use (on the pool's threads: not from inside a pool job).
fn rotated_copy(w: &QMatrix) -> &RotatedInt8 {
    let p = w.packed.as_ref().expect("on_rotated: packed");
    p.rotated.get_or_init(|| w.rotated_int8())
}

thread_local! {
    static INT8_ACTS: std::cell::RefCell<(Vec<Int8Line>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    static ROTATE_BUF: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    static ACTS: std::cell::RefCell<Vec<TileLine>> = const { std::cell::RefCell::new(Vec::new()) };
    static HIDDEN: std::cell::RefCell<Vec<TileLine>> = const { std::cell::RefCell::new(Vec::new()) };
    static SCRATCH: std::cell::RefCell<(Vec<TileLine>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    static GATE_UP: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The products of `jobs` (each `on_tiles`, its output `m x rows` at the pointer) over the same
/// `m` activation rows: the activations rounded to bf16 once, then runs of strips shared out to
/// the threads, about four per thread.
///
/// # Safety
/// The CPU has AMX-BF16 with the tile permission, AVX-512 BF16 and VBMI (the table this is in);
/// `x` is `m x cols` of every matrix; each output holds `m * rows` floats, no other job's.
unsafe fn on_bf16_tiles(x: &[f32], m: usize, jobs: &[(&QMatrix, OutPtr<f32>)]) {
    ACTS.with(|cell| {
        let mut acts = cell.borrow_mut();
        to_activation_tiles(x, m, jobs[0].0.cols, &mut acts);
        tile_products(&acts, m, jobs);
    });
}

/// The products of `jobs` (each `on_rotated`) over the same `m` activation rows in the rotated
/// int8 arithmetic: the activations rotated and rounded once, then runs of strips shared out to
/// the threads, as `on_bf16_tiles`.
///
/// # Safety
/// The CPU has AMX-INT8 with the tile permission and AVX-512 BW (the table this is in); `x` is
/// `m x cols` of every matrix; each output holds `m * rows` floats, no other job's.
unsafe fn on_int8_tiles(x: &[f32], m: usize, jobs: &[(&QMatrix, OutPtr<f32>)]) {
    let copies: Vec<&RotatedInt8> = jobs.iter().map(|(w, _)| rotated_copy(w)).collect();
    let k = jobs[0].0.cols;
    INT8_ACTS.with(|cell| {
        let (acts, scales) = &mut *cell.borrow_mut();
        let tiles = m.div_ceil(TILE_ROWS);
        let lines = k / INT8_STEP * TILE_ROWS;
        acts.clear();
        acts.resize(tiles * lines, Int8Line::default());
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
                    rotated_to_tiles(x, (m, k), t * TILE_ROWS, tile, own, &mut buf.borrow_mut())
                }
            })
        });
        let (acts, scales) = (&*acts, &*scales);
        let work = strip_runs(jobs);
        pool::global().run(work.len(), &|i| {
            let (ji, s0, s1) = work[i];
            let (w, out) = (copies[ji], jobs[ji].1);
            SCRATCH.with(|cell| {
                let (_, tail) = &mut *cell.borrow_mut();
                // SAFETY: the CPU has AMX-INT8 with the tile permission and AVX-512 F (the
                // caller's promise); strips s0..s1 exist; `acts` holds the m rows over w.cols
                // columns; `out` holds m x w.rows floats, whose columns of strips s0..s1 are
                // this work item's alone.
                unsafe {
                    let at = out.get().add(s0 * PROMPT_STRIP);
                    rotated_products(w, (s0, s1), acts, (m, scales), at, w.rows, tail)
                }
            });
        });
    });
}

/// `x` (`m x k`) rounded to bf16 into `acts`, in tile order (`x86::amx_prompt::to_tiles`), the
/// tiles of rows shared out to the threads.
///
/// # Safety
/// The CPU has AVX-512 BF16; `x` is `m x k`, `k` a multiple of 32.
unsafe fn to_activation_tiles(x: &[f32], m: usize, k: usize, acts: &mut Vec<TileLine>) {
    let lines = k / 32 * TILE_ROWS;
    acts.clear();
    acts.resize(m.div_ceil(TILE_ROWS) * lines, TileLine::default());
    par_chunks_mut(acts, lines, &|t, tile| {
        // SAFETY: the CPU has AVX-512 BF16 (the caller's promise); `tile` is tile t's
        // k / 32 * 16 lines, t < m / 16 rounded up.
        unsafe { prompt_to_tiles(x, m, k, t * TILE_ROWS, tile) }
    });
}

/// Runs of strips of every job, about four per thread: (job, first strip, end strip).
fn strip_runs(jobs: &[(&QMatrix, OutPtr<f32>)]) -> Vec<(usize, usize, usize)> {
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

/// `on_bf16_tiles` over activations already in tiles.
///
/// # Safety
/// As `on_bf16_tiles`; `acts` holds `m` rows over the matrices' columns in tile order.
unsafe fn tile_products(acts: &[TileLine], m: usize, jobs: &[(&QMatrix, OutPtr<f32>)]) {
    let work = strip_runs(jobs);
    pool::global().run(work.len(), &|i| {
        let (ji, s0, s1) = work[i];
        let (w, out) = jobs[ji];
        let p = w.packed.as_ref().expect("on_tiles: packed");
        SCRATCH.with(|cell| {
            let (scratch, tail) = &mut *cell.borrow_mut();
            // SAFETY: the CPU has AMX-BF16 with the tile permission, AVX-512 BF16 and VBMI (the
            // caller's promise); `p` is Q4_K or Q6_K in whole strips (`on_tiles`) and its
            // strips s0..s1 exist; `acts` holds the m rows over p.cols columns; `out` holds
            // m x p.rows floats, whose columns of strips s0..s1 are this work item's alone.
            unsafe {
                let at = out.get().add(s0 * PROMPT_STRIP);
                prompt_products(p, (s0, s1), acts, m, at, p.rows, scratch, tail)
            }
        });
    });
}

/// The gated feed-forward of `m` prompt rows on bf16 tiles: per run of strips of the gate and
/// up matrices (the same hidden columns), both products into the thread's scratch, the
/// activation over them, and its rows rounded to bf16 straight into the down product's tiles;
/// then the down product. The gate and up products never reach memory as whole rows, nor do
/// the activation's results in f32; each number gets the bits that the products, the
/// activation and `to_tiles` in turn would give it.
///
/// # Safety
/// As `on_bf16_tiles`; `x` is `m x gate.cols`; gate and up are `f x k`, down `n x f`, all
/// `on_tiles`; `out` holds `m * down.rows` floats.
unsafe fn ffn_on_bf16_tiles(x: &[f32], m: usize, ffn: &GatedFfn<'_>, out: OutPtr<f32>) {
    let (gate, up) = (ffn.gate, ffn.up);
    let (f, k) = (gate.rows, gate.cols);
    let steps = f / PROMPT_STRIP;
    let runs: Vec<(usize, usize, usize)> = strip_runs(&[(gate, out)]);
    ACTS.with(|acts| {
        HIDDEN.with(|hidden| {
            let mut acts = acts.borrow_mut();
            to_activation_tiles(x, m, k, &mut acts);
            let acts = &*acts;
            let mut hidden = hidden.borrow_mut();
            hidden.clear();
            // Rows past `m` stay zero, as `to_tiles` leaves them.
            hidden.resize(
                m.div_ceil(TILE_ROWS) * steps * TILE_ROWS,
                TileLine::default(),
            );
            let lines = OutPtr(hidden.as_mut_ptr());
            pool::global().run(runs.len(), &|i| {
                let (_, s0, s1) = runs[i];
                let width = (s1 - s0) * PROMPT_STRIP;
                GATE_UP.with(|cell| {
                    let (g, u) = &mut *cell.borrow_mut();
                    g.clear();
                    g.resize(m * width, 0.0);
                    u.clear();
                    u.resize(m * width, 0.0);
                    SCRATCH.with(|cell| {
                        let (scratch, tail) = &mut *cell.borrow_mut();
                        for (w, sums) in [(gate, &mut *g), (up, &mut *u)] {
                            let p = w.packed.as_ref().expect("on_tiles: packed");
                            let at = sums.as_mut_ptr();
                            // SAFETY: as in `tile_products`, the output this run's own
                            // m x width scratch.
                            unsafe {
                                prompt_products(p, (s0, s1), acts, m, at, width, scratch, tail)
                            };
                        }
                    });
                    for r in 0..m {
                        let gr = &mut g[r * width..][..width];
                        (ffn.activation)(gr, &u[r * width..][..width]);
                        for s in s0..s1 {
                            let at = ((r / TILE_ROWS) * steps + s) * TILE_ROWS + r % TILE_ROWS;
                            // SAFETY: the CPU has AVX-512 BF16; 32 floats of row r; line `at`
                            // (row r's hidden columns 32s..32s + 32) is inside `hidden` and
                            // this run's alone (its strips).
                            unsafe {
                                prompt_to_line(
                                    gr.as_ptr().add((s - s0) * PROMPT_STRIP),
                                    lines.get().add(at),
                                )
                            };
                        }
                    }
                });
            });
            tile_products(&hidden, m, &[(ffn.down, out)]);
        });
    });
}
