//! The Amx class: AVX-512 VNNI with AMX tiles (Intel Sapphire Rapids and later), where the OS
//! grants the tile state. Passes over many generated rows take int8 tiles (`x86::amx`), the
//! same bits as Avx512Vnni; with AMX-BF16, attention over a bf16 cache takes bf16 tiles
//! (`x86::amx_attention`), and with AVX-512 VBMI besides, a prompt's rows take bf16 tiles over
//! Q4_K and Q6_K weights (`x86::amx_prompt`), arithmetics of their own. Everything else as
//! Avx512Vnni.

use super::super::{
    attend_rows_amx, bf16_tiles, packed_rows_amx, peak_amx, peak_amx_bf16, prompt_products,
    prompt_to_tiles, TileLine, PROMPT_STRIP, TILE_ROWS,
};
use super::avx512::ATTENTION;
use super::avx512_vnni::AVX512_VNNI;
use crate::kernels::format::Format;
use crate::kernels::matrix::QMatrix;
use crate::kernels::parallel::{par_chunks_mut, OutPtr};
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
    }),
    ..AMX_BF16
};

/// The class's table for what this CPU has beyond the int8 tiles.
pub(crate) fn kernels() -> &'static Kernels {
    static WHICH: OnceLock<&'static Kernels> = OnceLock::new();
    WHICH.get_or_init(
        || match (bf16_tiles(), is_x86_feature_detected!("avx512vbmi")) {
            (true, true) => &AMX_BF16_PROMPT,
            (true, false) => &AMX_BF16,
            (false, _) => &AMX,
        },
    )
}

/// Whether `w`'s prompt rows take the bf16 tiles: Q4_K and Q6_K packed in whole strips.
fn on_tiles(w: &QMatrix) -> bool {
    w.packed.as_ref().is_some_and(|p| {
        matches!(p.format, Format::Q4K | Format::Q6K) && p.rows.is_multiple_of(PROMPT_STRIP)
    })
}

thread_local! {
    static ACTS: std::cell::RefCell<Vec<TileLine>> = const { std::cell::RefCell::new(Vec::new()) };
    static SCRATCH: std::cell::RefCell<(Vec<TileLine>, Vec<f32>)> =
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
        par_chunks_mut(&mut acts, lines, &|t, tile| {
            // SAFETY: the CPU has AVX-512 BF16 (the caller's promise); `tile` is tile t's
            // k / 32 * 16 lines, t < m / 16 rounded up.
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
                // (the caller's promise); `p` is Q4_K or Q6_K in whole strips (`on_tiles`) and
                // its strips s0..s1 exist; `acts` holds the m rows over p.cols = k columns;
                // `out` holds m x p.rows floats, whose columns of strips s0..s1 are this work
                // item's alone.
                unsafe { prompt_products(p, (s0, s1), acts, m, out.get(), p.rows, scratch, tail) }
            });
        });
    });
}
