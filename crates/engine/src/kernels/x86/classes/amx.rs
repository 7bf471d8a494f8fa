//! The Amx class: AVX-512 VNNI with AMX tiles (Intel Sapphire Rapids and later), where the OS
//! grants the tile state. Passes over many generated rows take int8 tiles (`x86::amx`), the
//! same bits as Avx512Vnni; with AMX-BF16, attention over a bf16 cache takes bf16 tiles
//! (`x86::amx_attention`), and with AVX-512 VBMI besides, a prompt's rows take bf16 tiles over
//! Q4_K and Q6_K weights (`x86::amx_prompt`), or with `PLD_PROMPT_ROWS=int8` rotated int8 tiles
//! over a copy made at load (`x86::amx_prompt_int8`), arithmetics of their own. Everything else
//! as Avx512Vnni.

use super::super::{
    attend_rows_amx, bf16_tiles, packed_rows_amx, peak_amx, peak_amx_bf16, prompt_products,
    prompt_to_line, prompt_to_tiles, TileLine, PROMPT_STRIP, TILE_ROWS,
};
use super::avx512::ATTENTION;
use super::avx512_vnni::AVX512_VNNI;
use super::int8_prompt::{self, int8_prompt_rows, on_int8_tiles, on_strips, strip_runs};
use crate::kernels::matrix::QMatrix;
use crate::kernels::parallel::{par_chunks_mut, OutPtr};
use crate::kernels::prompt::GatedFfn;
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
        takes: on_strips,
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
    prompt_rows: Some(int8_prompt::prompt_rows(on_int8_tiles)),
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

/// The int8 prompt rows' table entry of the class (tests).
#[cfg(test)]
pub(crate) fn int8_prompt_table() -> &'static PromptRows {
    AMX_INT8_PROMPT
        .prompt_rows
        .as_ref()
        .expect("int8 prompt rows")
}

thread_local! {
    static ACTS: std::cell::RefCell<Vec<TileLine>> = const { std::cell::RefCell::new(Vec::new()) };
    static HIDDEN: std::cell::RefCell<Vec<TileLine>> = const { std::cell::RefCell::new(Vec::new()) };
    static SCRATCH: std::cell::RefCell<(Vec<TileLine>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    static GATE_UP: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The products of `jobs` (each `on_strips`, its output `m x rows` at the pointer) over the same
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

/// `on_bf16_tiles` over activations already in tiles.
///
/// # Safety
/// As `on_bf16_tiles`; `acts` holds `m` rows over the matrices' columns in tile order.
unsafe fn tile_products(acts: &[TileLine], m: usize, jobs: &[(&QMatrix, OutPtr<f32>)]) {
    let work = strip_runs(jobs);
    pool::global().run(work.len(), &|i| {
        let (ji, s0, s1) = work[i];
        let (w, out) = jobs[ji];
        let p = w.packed.as_ref().expect("on_strips: packed");
        SCRATCH.with(|cell| {
            let (scratch, tail) = &mut *cell.borrow_mut();
            // SAFETY: the CPU has AMX-BF16 with the tile permission, AVX-512 BF16 and VBMI (the
            // caller's promise); `p` is Q4_K or Q6_K in whole strips (`on_strips`) and its
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
/// `on_strips`; `out` holds `m * down.rows` floats.
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
                            let p = w.packed.as_ref().expect("on_strips: packed");
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
