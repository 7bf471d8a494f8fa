//! Where the sweep of `attention` reads each span of positions it takes (a block, or a tree
//! row's last two): the cache itself (`Whole`), or a room in L1 where attention over a cache
//! that is not f32 (q8: `q8_attention`; f16 and bf16 in wide passes: `widened_attention`) put the
//! span as f32 rows for the f32 kernels to read: the keys of the span, then its values in the
//! same room, so that what the sweep reads stays within L1.

use crate::kernels::kv::{KvElem, KvOf};
use crate::kernels::online_softmax::ATTENTION_BLOCK as BLOCK;

/// Where the sweep reads the keys, then the values, of a span of positions: from the cache
/// itself (`Whole`), or from a room in L1 where they were put as f32 for it (a q8 cache's numbers
/// dequantized, `q8_attention`; an f16 or bf16 cache's widened, `widened_attention`): the keys
/// for the scores, then the values in the same room.
pub(super) trait Spans<E: KvElem> {
    /// The head's size and its positions: `(hd, len)`.
    fn shape(&self) -> (usize, usize);
    /// The keys of positions `from..to` (`from` a multiple of `BLOCK`), as a head whose keys
    /// only may be read, and the position its position 0 is: `(head, base)`.
    ///
    /// # Safety
    /// Called from a function compiled for the instructions the implementation uses.
    unsafe fn keys(&mut self, from: usize, to: usize) -> (KvOf<'_, E>, usize);
    /// The values of the same positions, as a head whose values only may be read.
    ///
    /// # Safety
    /// As `keys`.
    unsafe fn values(&mut self, from: usize, to: usize) -> (KvOf<'_, E>, usize);
}

/// A head read where it lies.
pub(super) struct Whole<'a, E>(pub KvOf<'a, E>);

impl<E: KvElem> Spans<E> for Whole<'_, E> {
    fn shape(&self) -> (usize, usize) {
        (self.0.hd, self.0.len)
    }
    #[inline(always)]
    unsafe fn keys(&mut self, _: usize, _: usize) -> (KvOf<'_, E>, usize) {
        (self.0, 0)
    }
    #[inline(always)]
    unsafe fn values(&mut self, _: usize, _: usize) -> (KvOf<'_, E>, usize) {
        (self.0, 0)
    }
}

/// Working space of one thread: the span's room and the sweep's own.
#[derive(Default)]
pub(super) struct SpanBuffers {
    pub span: Vec<f32>,
    pub sweep: Vec<f32>,
}

thread_local! {
    /// Taken out for a call and put back after it (no closure: it would not inherit the
    /// calling kernel's target features).
    pub(super) static BUFFERS: std::cell::RefCell<SpanBuffers> = Default::default();
}

/// Floats between the key rows of a span: room for the two blocks of a tree row's tail, and an
/// odd number of cache lines (9), so that a block's rows spread over L1's sets.
pub(super) const SPAN_STRIDE: usize = 2 * BLOCK + 16;

/// How far ahead (in positions) a span prefetches the cache's bytes into L2: two blocks.
pub(super) const AHEAD: usize = 2 * BLOCK;

/// Floats a room holds for `hd`-long heads: `hd` key rows `SPAN_STRIDE` apart, which is more
/// than the values of `2 * BLOCK` positions take.
pub(super) fn room_len(hd: usize) -> usize {
    hd * SPAN_STRIDE
}

/// The head over `room` (keys or values, whichever were last written there) for positions
/// `from..to` of an `hd`-long head, and the position its position 0 is.
pub(super) fn room_view(
    room: &[f32],
    hd: usize,
    (from, to): (usize, usize),
) -> (KvOf<'_, f32>, usize) {
    let kv = KvOf {
        keys: room,
        values: room,
        key_stride: SPAN_STRIDE,
        value_stride: hd,
        hd,
        len: to - from,
        offset: 0,
    };
    (kv, from)
}
