//! What a kernel class runs, as one table (`Kernels`) per class: the products, the attention of
//! each KV type, the arithmetic of a prompt's rows, and the loops that measure its peaks. Each
//! class fills its table in its own file (`scalar` here; `x86::class::*`); `Isa::kernels`
//! (`kernels/mod.rs`) hands out the table of a class the CPU runs, and every caller asks it.
//!
//! The entries are `unsafe fn`s: a class's kernels are compiled for instructions the CPU may
//! lack. Holding a `&Kernels` from `Isa::kernels` is the promise that the CPU runs them; each
//! entry says what else its caller must check.

use super::format::Format;
use super::kv::{KvOf, Q8Head, TreeMask};
use super::matrix::QMatrix;
use super::packed::Packed;
use super::parallel::OutPtr;
use super::prompt::GatedFfn;
use super::quant::{QuantizeBlock, QuantizedActs};
use half::{bf16, f16};

/// Weight rows `16g..16g + 16` of a packed matrix against activation rows `r0..r0 + m`: row
/// `r0 + r`'s sixteen results go to `out + r * stride`.
///
/// # Safety
/// `acts` holds rows `r0..r0 + m` quantized over `p.cols` columns in the format's blocks; `out`
/// is valid for writes of `(m - 1) * stride + 16` floats.
pub(super) type PackedRows =
    unsafe fn(&Packed, usize, &QuantizedActs, usize, usize, *mut f32, usize);

/// Groups `g0..g1` of a packed matrix against activation rows `r0..r0 + m` on tiles.
///
/// # Safety
/// As `PackedRows`, the integers also in tile order (`QuantizedActs::tile`), `r0` a multiple of
/// 16; `out` valid for `(m - 1) * stride + 16 * g1` floats.
pub(super) type TileRows =
    unsafe fn(&Packed, usize, usize, &QuantizedActs, usize, usize, *mut f32, usize);

/// One weight row in its GGUF layout, of the format given, against activation rows
/// `r0..r0 + out.len()`.
///
/// # Safety
/// `acts` holds those rows quantized in the format's blocks over the row's columns.
pub(super) type DotRows = unsafe fn(Format, &[u8], &QuantizedActs, usize, &mut [f32]);

/// A loop of `iters` steps on registers or tiles that returns the multiply-adds it did.
///
/// # Safety
/// None beyond the table's.
pub(super) type Peak = unsafe fn(usize) -> u64;

/// `kernels::attend_rows` over a head of one type (queries, their stride, rows, the head, the
/// scale, sinks, a tree mask, scratch, the outputs).
///
/// # Safety
/// The head's size suits the kernel (`Attend::multiple`); the bounds are those `attend_rows`
/// checks (and `Attend::whole_blocks`).
pub(super) type AttendFn<E> = unsafe fn(
    &[f32],
    usize,
    usize,
    KvOf<'_, E>,
    f32,
    Option<&[f32]>,
    Option<TreeMask<'_>>,
    &mut Vec<f32>,
    &mut [f32],
);

/// One attention kernel for heads of one type.
#[derive(Clone, Copy)]
pub(super) struct Attend<E: 'static> {
    /// The head sizes it takes: multiples of this.
    pub multiple: usize,
    /// Where it computes on tiles, rounding queries and weights to bf16: the name of that
    /// arithmetic (`attention_arithmetic`; it changes whenever the bits do). It reads keys and
    /// values in whole blocks of `x86::TILE_BLOCK` positions (the cache holds them).
    pub tiles: Option<&'static str>,
    pub run: AttendFn<E>,
}

/// `kernels::attend_rows` over a q8 head: queries, their stride, rows, the head's bytes (keys,
/// values), its dimensions, positions and key stride, the scale, sinks, a tree mask, outputs.
///
/// # Safety
/// `hd % 32 == 0`; the bytes hold the positions; the bounds are those `attend_rows` checks.
pub(super) type AttendQ8 = unsafe fn(
    &[f32],
    usize,
    usize,
    Q8Head<'_>,
    f32,
    Option<&[f32]>,
    Option<TreeMask<'_>>,
    &mut [f32],
);

/// The attention kernels of a class per KV type, each a list tried in order (the first whose
/// `multiple` divides the head size runs; none: the plain loops, which every class shares).
pub(super) struct Attention {
    pub f32: &'static [Attend<f32>],
    pub f16: &'static [Attend<f16>],
    pub bf16: &'static [Attend<bf16>],
    pub q8: Option<AttendQ8>,
    /// The head sizes (multiples of this; 0: none) whose cache is bf16 unless told otherwise
    /// (`KvDtype::auto`): where the class's kernels over a bf16 head ran faster than over an f32
    /// one at every pass width, reading half the bytes.
    pub bf16_by_default: usize,
}

/// A matrix of a prompt rows' product and where its output goes.
pub(super) type PromptJob<'a> = (&'a QMatrix, OutPtr<f32>);

/// A class's fused gated feed-forward over prompt rows (`PromptRows::ffn`).
pub(super) type PromptFfn = unsafe fn(&[f32], usize, &GatedFfn<'_>, OutPtr<f32>);

/// The arithmetic a class gives a prompt's rows where it has one of its own (`prompt`): its name
/// (a prefix cache keys its entries by it), which matrices take it, and the products of those.
pub(super) struct PromptRows {
    pub name: &'static str,
    pub takes: fn(&QMatrix) -> bool,
    /// The products of `m` rows of `x` with each matrix of `jobs` (each one `takes`), its
    /// output `m x rows` at the pointer.
    ///
    /// # Safety
    /// `x` is `m x cols` of every matrix; each output holds `m * rows` floats, no other job's.
    pub run: unsafe fn(&[f32], usize, &[PromptJob<'_>]),
    /// The gated feed-forward of `m` rows of `x` in one go, where the class fuses it: the same
    /// bits as `run` over the gate and up matrices, the activation, and `run` over the down one,
    /// its output `m x down.rows` at the pointer.
    ///
    /// # Safety
    /// `x` is `m x cols` of the gate and up matrices; the three `takes`; the output holds
    /// `m * down.rows` floats.
    pub ffn: Option<PromptFfn>,
    /// Makes what the products read beside the packed weights (a copy of its own), for a
    /// matrix that `takes` it (`kernels::prepare_prompt_rows`, at load).
    pub prepare: Option<fn(&QMatrix)>,
    /// Whether the products run on int8 tiles (else bf16): the peak they are held to.
    pub int8: bool,
}

/// What one kernel class runs.
pub struct Kernels {
    /// As `PLD_KERNEL` names the class.
    pub name: &'static str,
    /// The activations' 8-bit blocks (`None`: the plain loop).
    pub(super) quantize_block: Option<QuantizeBlock>,
    /// The products over packed (interleaved) weights; `None`: the class keeps the GGUF layout.
    pub(super) packed_rows: Option<PackedRows>,
    /// The products of passes over at least `.0` rows on tiles, over packed weights.
    pub(super) tile_rows: Option<(usize, TileRows)>,
    /// The products over weights in their GGUF layout (`None`: the plain loops), and whether
    /// they read the activations' scales spread over 512-bit lanes (`QuantizedActs::spread`).
    pub(super) dot_rows: Option<(DotRows, bool)>,
    pub(super) attention: Attention,
    pub(super) prompt_rows: Option<PromptRows>,
    /// The int8 multiply-add loop of the packed products' step.
    pub(super) int8_peak: Option<Peak>,
    /// The f32 fused multiply-add loop on attention's registers.
    pub(super) f32_peak: Option<Peak>,
    /// Tile loops: int8 (`tdpbssd`) and bf16 (`tdpbf16ps`), a quarter of the iterations asked.
    pub(super) tile_int8_peak: Option<Peak>,
    pub(super) tile_bf16_peak: Option<Peak>,
}

/// The plain class: every kernel in plain Rust, the GGUF layout, no peaks.
pub(super) static SCALAR: Kernels = Kernels {
    name: "scalar",
    quantize_block: None,
    packed_rows: None,
    tile_rows: None,
    dot_rows: None,
    attention: Attention {
        f32: &[],
        f16: &[],
        bf16: &[],
        q8: None,
        bf16_by_default: 0,
    },
    prompt_rows: None,
    int8_peak: None,
    f32_peak: None,
    tile_int8_peak: None,
    tile_bf16_peak: None,
};

impl Kernels {
    /// The attention kernel for `hd`-long heads of one type, if the class has one.
    pub(super) fn attend_for<E>(
        list: &'static [Attend<E>],
        hd: usize,
    ) -> Option<&'static Attend<E>> {
        list.iter().find(|a| hd.is_multiple_of(a.multiple))
    }

    /// Whether attention over a bf16 cache of `hd`-long heads runs on tiles.
    pub fn tiles_attend(&self, hd: usize) -> bool {
        Kernels::attend_for(self.attention.bf16, hd).is_some_and(|a| a.tiles.is_some())
    }
}
