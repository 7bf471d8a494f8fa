//! Attention over an f16 or bf16 cache in passes of many queries (a prompt's chunk, a batch of
//! drafts): each span of positions the sweep of `attention` takes (a block, or a tree row's last
//! two) is widened once into f32 rows in L1 (`spans`), and the f32 kernels run on them.
//!
//! Reading the cache where it lies, every tile of queries widens again each key and value it
//! reads (a shift or a mask per bf16 vector, a `vcvtph2ps` per f16 one), beside the tile's
//! multiply-adds: a pass of a thousand queries widens each number a hundred times or more.
//! Here each is widened once a pass. Widening is exact and the f32 kernels then perform the
//! same operations in the same order over the same numbers, so every row keeps its bits (those
//! of the plain loops), whichever way its pass went.
//!
//! The vector classes' attention over f32, f16 and bf16 heads enters here (`attend_rows_avx512`,
//! `attend_rows_avx2`), which widens or reads the cache where it lies (`spans::Whole`).

use super::attention::{attend_rows_wide, key_lanes, prefetch, read_lines, value_lanes};
use super::online_softmax::BlockWeights;
use super::spans::{room_len, room_view, Spans, Whole, AHEAD, BUFFERS, SPAN_STRIDE};
use super::width::{Width, Ymm, Zmm};
use crate::kernels::kv::{ElemKind, KvElem, KvOf, TreeMask};
use crate::kernels::on_lines;

/// The fewest queries in a pass (rows times the query heads of a key/value head) whose spans
/// are widened first; fewer read the cache where it lies. Measured with `abench` (bf16, head
/// size 128, keys and values out of cache and in L2, 512-bit registers, the room on a cache
/// line's start): 8 queries ran 0.88x widened, 12 level, 16 1.05-1.12x, 18 1.13-1.15x, 24 1.22x
/// (the kernel log, "Widened once a pass" and "A room on cache lines").
pub(crate) const WIDEN_FROM: usize = 16;

/// Whether a pass of `queries` queries over a cache of type `E` widens its spans first.
#[inline(always)]
fn widens<E: KvElem>(queries: usize) -> bool {
    E::KIND != ElemKind::F32 && queries >= WIDEN_FROM
}

/// An f16 or bf16 head read through its widened spans.
struct Widened<'a, W, E> {
    head: KvOf<'a, E>,
    room: &'a mut [f32],
    width: std::marker::PhantomData<W>,
}

/// How a width widens a span: in the sweep's own code on 512-bit registers; apart from it on
/// 256-bit ones, whose sixteen registers the widening's constants would otherwise share with
/// the sweep's accumulators (inlined, they pushed two of a score tile's accumulators to the
/// stack: a store and a load beside every multiply-add, 25 against 34 G multiply-adds/s for f32
/// read in place, `abench 64 16384 8 128 6 bf16`, `PLD_KERNEL=avx2`).
trait Widen: Width {
    /// `widen_keys` on this width.
    ///
    /// # Safety
    /// As `widen_keys`.
    unsafe fn keys<E: KvElem>(h: &KvOf<'_, E>, span: (usize, usize), keys: &mut [f32]);
    /// `widen_values` on this width.
    ///
    /// # Safety
    /// As `widen_values`.
    unsafe fn values<E: KvElem>(h: &KvOf<'_, E>, span: (usize, usize), values: &mut [f32]);
}

impl Widen for Zmm {
    #[inline(always)]
    unsafe fn keys<E: KvElem>(h: &KvOf<'_, E>, span: (usize, usize), keys: &mut [f32]) {
        widen_keys::<Zmm, E>(h, span, keys)
    }
    #[inline(always)]
    unsafe fn values<E: KvElem>(h: &KvOf<'_, E>, span: (usize, usize), values: &mut [f32]) {
        widen_values::<Zmm, E>(h, span, values)
    }
}

impl Widen for Ymm<false> {
    #[inline(always)]
    unsafe fn keys<E: KvElem>(h: &KvOf<'_, E>, span: (usize, usize), keys: &mut [f32]) {
        widen_keys_ymm(h, span, keys)
    }
    #[inline(always)]
    unsafe fn values<E: KvElem>(h: &KvOf<'_, E>, span: (usize, usize), values: &mut [f32]) {
        widen_values_ymm(h, span, values)
    }
}

/// `widen_keys` on 256-bit registers, compiled apart from the sweep (`Widen`).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; as `widen_keys`.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_keys_ymm<E: KvElem>(h: &KvOf<'_, E>, span: (usize, usize), keys: &mut [f32]) {
    widen_keys::<Ymm<false>, E>(h, span, keys)
}

/// `widen_values` on 256-bit registers, compiled apart from the sweep (`Widen`).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; as `widen_values`.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_values_ymm<E: KvElem>(h: &KvOf<'_, E>, span: (usize, usize), values: &mut [f32]) {
    widen_values::<Ymm<false>, E>(h, span, values)
}

impl<W: Widen, E: KvElem> Spans<f32> for Widened<'_, W, E> {
    fn shape(&self) -> (usize, usize) {
        (self.head.hd, self.head.len)
    }

    #[inline(always)]
    unsafe fn keys(&mut self, from: usize, to: usize) -> (KvOf<'_, f32>, usize) {
        W::keys(&self.head, (from, to), self.room);
        room_view(self.room, self.head.hd, (from, to))
    }

    #[inline(always)]
    unsafe fn values(&mut self, from: usize, to: usize) -> (KvOf<'_, f32>, usize) {
        W::values(&self.head, (from, to), self.room);
        room_view(self.room, self.head.hd, (from, to))
    }
}

/// The keys of positions `from..to` (at most `2 * BLOCK`, `from` a multiple of the lanes) of
/// `h` into `keys` (rows `SPAN_STRIDE` apart), as f32: by whole vectors up to the head's last
/// whole vector, as the kernels read them, then one by one; the span `AHEAD` further prefetched.
///
/// # Safety
/// Compiled for `W`'s instructions and F16C; `h` holds its `len` positions (`KvOf::check`);
/// `to <= h.len`; `keys` holds `room_len(h.hd)` floats.
#[inline(always)]
unsafe fn widen_keys<W: Width, E: KvElem>(
    h: &KvOf<'_, E>,
    (from, to): (usize, usize),
    keys: &mut [f32],
) {
    let (hd, ks, pk) = (h.hd, h.key_stride, h.keys.as_ptr());
    let whole = (h.len / W::LANES * W::LANES).clamp(from, to);
    let ahead = from + AHEAD < h.len;
    for i in 0..hd {
        // A bf16 row holds two dimensions (pairs): prefetched once for both.
        if ahead && (i % 2 == 0 || !E::PAIRED) {
            let p = pk.wrapping_add(E::key_at(i, from + AHEAD, ks));
            prefetch(p, read_lines::<E>(to - from));
        }
        let out = keys.as_mut_ptr().add(i * SPAN_STRIDE);
        for t in (from..whole).step_by(W::LANES) {
            W::store(out.add(t - from), key_lanes::<W, E>(pk, ks, i, t));
        }
        for t in whole..to {
            *out.add(t - from) = (*pk.add(E::key_at(i, t, ks))).to_f32();
        }
    }
}

/// The values of positions `from..to` (at most `2 * BLOCK`) of `h` into `values` (`hd` each),
/// as f32, as `widen_keys`.
///
/// # Safety
/// As `widen_keys`, and `h.hd` a multiple of the lanes.
#[inline(always)]
unsafe fn widen_values<W: Width, E: KvElem>(
    h: &KvOf<'_, E>,
    (from, to): (usize, usize),
    values: &mut [f32],
) {
    let (hd, vs, pv) = (h.hd, h.value_stride, h.values.as_ptr());
    for t in from..to {
        if t + AHEAD < h.len && (t % 2 == 0 || !E::PAIRED) {
            let p = pv.wrapping_add(E::value_at(t + AHEAD, 0, vs));
            prefetch(p, read_lines::<E>(hd));
        }
        let out = values.as_mut_ptr().add((t - from) * hd);
        for d in (0..hd).step_by(W::LANES) {
            W::store(out.add(d), value_lanes::<W, E>(pv, vs, t, d));
        }
    }
}

/// `attend_rows_wide` on `W`'s registers (score tiles of `QS` queries, `ACC` accumulators for
/// the values) over the head's widened spans where the pass `widens`, else over the cache where
/// it lies; the widened spans in the thread's room, taken for the call.
///
/// # Safety
/// Called from a function compiled for `W`'s instructions, FMA and F16C; `hd % W::LANES == 0`;
/// the bounds are those `kernels::attend_rows` checks (`KvOf::check`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_rows_on<W: Widen + BlockWeights, E: KvElem, const QS: usize, const ACC: usize>(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    head: KvOf<'_, E>,
    scale: f32,
    sinks: Option<&[f32]>,
    tree: Option<TreeMask<'_>>,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    if !widens::<E>(out.len() / head.hd) {
        let kv = &mut Whole(head);
        return attend_rows_wide::<W, E, QS, 4, ACC>(
            q, q_stride, rows, kv, scale, sinks, tree, scratch, out,
        );
    }
    let mut buffers = BUFFERS.take();
    let mut kv = Widened::<W, E> {
        head,
        room: on_lines(&mut buffers.span, room_len(head.hd)),
        width: std::marker::PhantomData,
    };
    attend_rows_wide::<W, f32, QS, 4, ACC>(
        q, q_stride, rows, &mut kv, scale, sinks, tree, scratch, out,
    );
    BUFFERS.set(buffers);
}

/// `kernels::attend_rows` with 512-bit registers (score tiles of six queries, 24 accumulators).
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL (and AVX2, FMA, F16C); `hd % 16 == 0`; the bounds
/// are those `kernels::attend_rows` checks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn attend_rows_avx512<E: KvElem>(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    kv: KvOf<'_, E>,
    scale: f32,
    sinks: Option<&[f32]>,
    tree: Option<TreeMask<'_>>,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_rows_on::<Zmm, E, 6, 24>(q, q_stride, rows, kv, scale, sinks, tree, scratch, out)
}

/// `kernels::attend_rows` with 256-bit registers (score tiles of two queries by four vectors,
/// value tiles of 12 accumulators: sixteen registers in all).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `hd % 8 == 0`; the bounds are those
/// `kernels::attend_rows` checks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn attend_rows_avx2<E: KvElem>(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    kv: KvOf<'_, E>,
    scale: f32,
    sinks: Option<&[f32]>,
    tree: Option<TreeMask<'_>>,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_rows_on::<Ymm<false>, E, 2, 12>(q, q_stride, rows, kv, scale, sinks, tree, scratch, out)
}
