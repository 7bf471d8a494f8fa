//! Attention of the query heads that share one key/value head of the cache (keys stored
//! transposed): the plain loops, and one tiled kernel for one or several rows at once on 256-bit
//! (AVX2) or 512-bit (AVX-512) registers. Keys and values are f32, f16 or bf16 (`KvElem`);
//! every product and sum is in f32, a 16-bit number widened exactly as it is loaded. A bf16
//! cache on AMX takes its own kernel (`x86::amx_attention`), whose products are bf16 tiles.

use super::elementwise::exp_lane;
use super::isa::{assert_available, isa, Isa};
use super::q8;
#[cfg(target_arch = "x86_64")]
use super::x86;
use half::{bf16, f16};

/// How a cached number is widened to f32 as the vector kernels load it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemKind {
    F32,
    F16,
    Bf16,
}

/// How a cache lays out the numbers of one key/value head: keys transposed (rows of positions,
/// `key_stride` apart), values one position after another (`value_stride` apart). Every cache
/// type, and the bytes of a q8 cache (`q8`), whose rows also hold each block's scale.
pub trait KvStored: Copy + Send + Sync + bytemuck::Pod + 'static {
    /// Whether a head's numbers lie in pairs, as AMX's bf16 tiles take them (bf16): dimensions
    /// `2p` and `2p + 1` of a key side by side along one row of positions, and positions `2k`
    /// and `2k + 1` of the values side by side along one row of dimensions.
    const PAIRED: bool = false;

    /// Where dimension `i` of key `t` lies among a head's keys (rows `key_stride` apart):
    /// `i * key_stride + t`, or paired, `(i / 2) * 2 * key_stride + 2 * t + i % 2`.
    #[inline(always)]
    fn key_at(i: usize, t: usize, key_stride: usize) -> usize {
        if Self::PAIRED {
            (i / 2) * 2 * key_stride + 2 * t + i % 2
        } else {
            i * key_stride + t
        }
    }

    /// Where dimension `d` of value `t` lies among a head's values (`value_stride` per
    /// position): `t * value_stride + d`, or paired, `(t / 2) * 2 * value_stride + 2 * d + t % 2`.
    #[inline(always)]
    fn value_at(t: usize, d: usize, value_stride: usize) -> usize {
        if Self::PAIRED {
            (t / 2) * 2 * value_stride + 2 * d + t % 2
        } else {
            t * value_stride + d
        }
    }
}

impl KvStored for f32 {}
impl KvStored for f16 {}
impl KvStored for bf16 {
    const PAIRED: bool = true;
}
impl KvStored for u8 {}

/// A number type the KV cache stores keys and values in, one number per element: f32, f16 or
/// bf16, no other (the vector kernels load by `KIND`). A q8 cache's blocks are not numbers of
/// their own; its heads are dequantized for the kernels (`q8`).
pub trait KvElem: KvStored + sealed::OneOfOurs {
    /// The cache's zero.
    const ZERO: Self;
    /// Which of the three it is.
    const KIND: ElemKind;

    /// `v` rounded to the nearest number of the type (f16 and bf16: out-of-range values saturate
    /// to the largest finite one, so a cache never holds an infinity its attention would turn to
    /// NaN).
    fn from_f32(v: f32) -> Self;
    /// The number, exactly, as f32.
    fn to_f32(self) -> f32;
    /// A head's keys and values of this type, as `KvHead` holds them.
    fn elems<'a>(keys: &'a [Self], values: &'a [Self]) -> KvElems<'a>;
}

mod sealed {
    pub trait OneOfOurs {}
    impl OneOfOurs for f32 {}
    impl OneOfOurs for half::f16 {}
    impl OneOfOurs for half::bf16 {}
}

impl KvElem for f32 {
    const ZERO: f32 = 0.0;
    const KIND: ElemKind = ElemKind::F32;
    #[inline]
    fn from_f32(v: f32) -> f32 {
        v
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    fn elems<'a>(keys: &'a [f32], values: &'a [f32]) -> KvElems<'a> {
        KvElems::F32 { keys, values }
    }
}

impl KvElem for f16 {
    const ZERO: f16 = f16::ZERO;
    const KIND: ElemKind = ElemKind::F16;
    #[inline]
    fn from_f32(v: f32) -> f16 {
        f16::from_f32(v.clamp(f16::MIN.to_f32(), f16::MAX.to_f32()))
    }
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn elems<'a>(keys: &'a [f16], values: &'a [f16]) -> KvElems<'a> {
        KvElems::F16 { keys, values }
    }
}

impl KvElem for bf16 {
    const ZERO: bf16 = bf16::ZERO;
    const KIND: ElemKind = ElemKind::Bf16;
    #[inline]
    fn from_f32(v: f32) -> bf16 {
        bf16::from_f32(v.clamp(bf16::MIN.to_f32(), bf16::MAX.to_f32()))
    }
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn elems<'a>(keys: &'a [bf16], values: &'a [bf16]) -> KvElems<'a> {
        KvElems::Bf16 { keys, values }
    }
}

/// The keys and values of a `KvHead`, in the type its cache stores.
#[derive(Clone, Copy)]
pub enum KvElems<'a> {
    F32 {
        keys: &'a [f32],
        values: &'a [f32],
    },
    F16 {
        keys: &'a [f16],
        values: &'a [f16],
    },
    Bf16 {
        keys: &'a [bf16],
        values: &'a [bf16],
    },
    /// A q8 cache's bytes (`q8`): int8 numbers and each block's f16 scale.
    Q8 {
        keys: &'a [u8],
        values: &'a [u8],
    },
}

/// One key/value head of a cache over its first `len` positions. Keys are stored transposed, one
/// row per dimension: dimension `i` of key `t` is `keys[i * key_stride + t]`, so that the scores
/// of consecutive positions are one vector product away (no horizontal sums); value `t` is
/// `values[t * value_stride..][..hd]`. A bf16 head is paired (`KvElem::key_at`, `value_at`).
/// Position `t` is stored at `t + offset`: 0, or 1 where a paired head skipped an odd number of
/// positions (its values only split between pairs).
#[derive(Clone, Copy)]
pub struct KvHead<'a> {
    pub elems: KvElems<'a>,
    pub key_stride: usize,
    pub value_stride: usize,
    pub hd: usize,
    pub len: usize,
    pub offset: usize,
}

/// A `KvHead` over keys and values of one known type: what the kernels compute with.
#[derive(Clone, Copy)]
pub(crate) struct KvOf<'a, E> {
    pub keys: &'a [E],
    pub values: &'a [E],
    pub key_stride: usize,
    pub value_stride: usize,
    pub hd: usize,
    pub len: usize,
    pub offset: usize,
}

impl<'a> KvHead<'a> {
    /// The head over `keys` and `values` (laid out as above).
    pub fn new<E: KvElem>(
        keys: &'a [E],
        values: &'a [E],
        key_stride: usize,
        value_stride: usize,
        hd: usize,
        len: usize,
    ) -> KvHead<'a> {
        KvHead {
            elems: E::elems(keys, values),
            key_stride,
            value_stride,
            hd,
            len,
            offset: 0,
        }
    }

    /// The same head without its first `n` positions: position `n + t` becomes `t`. A paired
    /// head's values only split between pairs: an odd `n` drops one position fewer from the
    /// slices and offsets the rest by one.
    pub fn skip(self, n: usize) -> KvHead<'a> {
        assert!(n < self.len && self.offset == 0, "skipping every position");
        let (ks, vs) = (self.key_stride, self.value_stride);
        let (elems, dropped) = match self.elems {
            KvElems::F32 { keys, values } => skip_of(keys, values, n, (ks, vs)),
            KvElems::F16 { keys, values } => skip_of(keys, values, n, (ks, vs)),
            KvElems::Bf16 { keys, values } => skip_of(keys, values, n, (ks, vs)),
            KvElems::Q8 { keys, values } => {
                let (keys, values) = (&keys[n..], &values[n * vs..]);
                (KvElems::Q8 { keys, values }, n)
            }
        };
        KvHead {
            elems,
            len: self.len - n,
            offset: n - dropped,
            ..self
        }
    }

    /// The same head over `keys` and `values` of a known type.
    fn of<E>(&self, keys: &'a [E], values: &'a [E]) -> KvOf<'a, E> {
        KvOf {
            keys,
            values,
            key_stride: self.key_stride,
            value_stride: self.value_stride,
            hd: self.hd,
            len: self.len,
            offset: self.offset,
        }
    }
}

/// `KvHead::skip` over keys and values of one type: the slices without their first positions,
/// `n` of them (a paired type's values only split between pairs: `n` rounded down to even), and
/// how many were dropped.
fn skip_of<'a, E: KvElem>(
    keys: &'a [E],
    values: &'a [E],
    n: usize,
    (key_stride, value_stride): (usize, usize),
) -> (KvElems<'a>, usize) {
    let dropped = if E::PAIRED { n / 2 * 2 } else { n };
    let keys = &keys[E::key_at(0, dropped, key_stride)..];
    let values = &values[E::value_at(dropped, 0, value_stride)..];
    (E::elems(keys, values), dropped)
}

/// `$body` with `$kv` bound to the `KvOf` of the `KvHead` `$head`, whichever type its keys and
/// values have: one generic body, compiled for each.
macro_rules! with_typed {
    ($head:expr, $kv:ident => $body:expr) => {{
        let head: KvHead<'_> = $head;
        match head.elems {
            KvElems::F32 { keys, values } => {
                let $kv = head.of(keys, values);
                $body
            }
            KvElems::F16 { keys, values } => {
                let $kv = head.of(keys, values);
                $body
            }
            KvElems::Bf16 { keys, values } => {
                let $kv = head.of(keys, values);
                $body
            }
            KvElems::Q8 { .. } => unreachable!("a q8 head is dequantized first"),
        }
    }};
}

impl<E: KvElem> KvOf<'_, E> {
    /// Panics unless every key and value of the `len` positions lies inside the slices.
    fn check(&self) {
        let (hd, len) = (self.hd, self.len + self.offset);
        assert!(
            hd > 0 && len > 0 && len <= self.key_stride,
            "key rows too short"
        );
        assert!(
            hd % 2 == 0 || !E::PAIRED,
            "a paired head of {hd} dimensions"
        );
        let (ks, vs) = (self.key_stride, self.value_stride);
        assert!(
            self.keys.len() > E::key_at(hd - 1, len - 1, ks)
                && self.values.len() > E::value_at(len - 1, hd - 1, vs),
            "cache too short"
        );
    }

    /// Panics unless the tiles' reads lie inside the slices: every key row and value up to the
    /// end of the block holding the last position.
    #[cfg(target_arch = "x86_64")]
    fn check_whole_blocks(&self) {
        let (ks, vs) = (self.key_stride, self.value_stride);
        let end = self.len.next_multiple_of(ATTENTION_BLOCK);
        assert!(
            self.keys.len() >= E::key_at(self.hd - 2, end, ks)
                && self.values.len() >= E::value_at(end, 0, vs),
            "a bf16 head on tiles must hold whole blocks"
        );
    }
}

/// Which positions one query row sees: every position before `start`, and from `start` on those
/// whose bit is set in `bits` (bit `i` is position `start + i`). A draft tree's node sees the
/// committed cache and its own ancestors (itself included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Visible {
    pub start: usize,
    pub bits: u64,
}

impl Visible {
    #[inline]
    pub(crate) fn sees(&self, t: usize) -> bool {
        t < self.start || (t - self.start < 64 && (self.bits >> (t - self.start)) & 1 == 1)
    }
}

/// The tree mask of consecutive rows of one pass: row `r` sees what `Visible { start, bits:
/// rows[r] }` says.
#[derive(Clone, Copy, Debug)]
pub struct TreeMask<'a> {
    pub start: usize,
    pub rows: &'a [u64],
}

impl TreeMask<'_> {
    /// What row `r` sees.
    pub(crate) fn row(&self, r: usize) -> Visible {
        Visible {
            start: self.start,
            bits: self.rows[r],
        }
    }
}

/// Positions the attention kernels take at a time: scores of a block, their weights and the
/// weighted values are computed together while they sit in L1 (an online softmax, as in
/// FlashAttention: a running maximum and sum, and earlier outputs rescaled when the maximum
/// grows). Blocks start at multiples of this in the positions a row sees (a tree node's packed
/// first), so a row's result never depends on what shares its pass.
pub(crate) const ATTENTION_BLOCK: usize = 64;

/// Attention of the `q.len() / hd` query heads in `q` that share the key/value head `kv`.
/// `scratch` is working space; `out` gets one `hd`-long output per query head.
pub fn attend(q: &[f32], kv: KvHead<'_>, scale: f32, scratch: &mut Vec<f32>, out: &mut [f32]) {
    attend_with(isa(), q, kv, scale, scratch, out)
}

/// `attend` with a chosen implementation (512-bit registers for head sizes that are a multiple of
/// 16 on AVX-512, 256-bit ones for multiples of 8, the plain loops otherwise): every one gives
/// the same bits.
pub fn attend_with(
    isa: Isa,
    q: &[f32],
    kv: KvHead<'_>,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    assert_eq!(out.len(), q.len(), "one output per query element");
    attend_rows(isa, q, q.len(), 1, kv, scale, None, None, scratch, out)
}

/// Causal attention of `rows` consecutive positions of one sequence, for the query heads that share
/// the key/value head `kv`: row `r`'s query heads are `q[r * q_stride..][..group * hd]`, it sees the
/// first `kv.len - (rows - 1 - r)` positions (of those, with a `tree` mask, only the ones its mask
/// lets it see), and its outputs go to `out[r * group * hd..]`. Each row's result is bit-identical
/// to `attend` on that row alone over the positions it sees, on every implementation; the vector
/// versions read each key and value once for all the rows.
///
/// With `sinks` (gpt-oss's attention sinks: one logit per query head of the group, no value),
/// each head's softmax also counts `e^sink` in its denominator (`normalizer`).
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    isa: Isa,
    q: &[f32],
    q_stride: usize,
    rows: usize,
    kv: KvHead<'_>,
    scale: f32,
    sinks: Option<&[f32]>,
    tree: Option<TreeMask<'_>>,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    let KvHead { hd, len, .. } = kv;
    assert!(rows > 0 && rows <= len && out.len().is_multiple_of(rows));
    assert_available(isa);
    let gw = out.len() / rows;
    assert!(hd > 0 && gw.is_multiple_of(hd) && (rows - 1) * q_stride + gw <= q.len());
    assert!(
        tree.is_none_or(|m| m.rows.len() == rows && m.start < len && len - m.start <= 64),
        "one mask per row, a tree of at most 64 positions at the end of the cache"
    );
    assert!(
        sinks.is_none_or(|s| s.len() * hd == gw),
        "one sink per query head"
    );
    if let KvElems::Q8 { .. } = kv.elems {
        return q8::attend_rows_q8(isa, q, q_stride, rows, kv, scale, sinks, tree, out);
    }
    #[cfg(target_arch = "x86_64")]
    if let (KvElems::Bf16 { keys, values }, true) =
        (kv.elems, tiles_attend(isa, hd) && kv.offset == 0)
    {
        let kv = kv.of(keys, values);
        kv.check();
        kv.check_whole_blocks();
        // SAFETY: `tiles_attend` checked the CPU's AMX-BF16 and AVX512_BF16 and the tile
        // permission, and that hd is a multiple of 32; keys and values lie inside the checked
        // span, queries inside `q`, a tree's rows inside the cache, outputs sized as checked.
        return unsafe {
            x86::attend_rows_amx(q, q_stride, rows, kv, scale, sinks, tree, scratch, out)
        };
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && hd % 8 == 0 && kv.offset == 0 {
        return with_typed!(kv, kv => {
            kv.check();
            // SAFETY: the CPU has what `isa` names (asserted above): AVX-512 F with AVX2, FMA
            // and F16C for the 512-bit version, AVX2, FMA and F16C for any other vector class;
            // hd is a multiple of their lanes; keys and values lie inside the checked span,
            // queries inside `q`, a tree's rows inside the cache, outputs sized as checked.
            unsafe {
                if isa.avx512() && hd % 16 == 0 {
                    x86::attend_rows_avx512(q, q_stride, rows, kv, scale, sinks, tree, scratch, out)
                } else {
                    x86::attend_rows_avx2(q, q_stride, rows, kv, scale, sinks, tree, scratch, out)
                }
            }
        });
    }
    let _ = scratch;
    with_typed!(kv, kv => {
        kv.check();
        let mut seen = Vec::with_capacity(len);
        for (r, o) in out.chunks_mut(gw).enumerate() {
            let n = len - (rows - 1 - r);
            seen.clear();
            // Where the positions are stored (offset by an odd skip of a paired head: every
            // implementation comes here for it, so that a row's bits stay those of its path).
            let at = |t: usize| t + kv.offset;
            match tree.map(|m| m.row(r)) {
                None => seen.extend((0..n).map(at)),
                Some(v) => seen.extend((0..n).filter(|&t| v.sees(t)).map(at)),
            }
            let qr = &q[r * q_stride..r * q_stride + gw];
            for (h, (qh, oh)) in qr.chunks(hd).zip(o.chunks_mut(hd)).enumerate() {
                let sink = sinks.map(|s| s[h]);
                attend_plain_fused(qh, kv, scale, sink, &seen, oh);
            }
        }
    })
}

/// Whether `attend_rows` on `isa` computes over a bf16 cache on AMX tiles
/// (`x86::amx_attention`), whose products round the queries and the weights to bf16, rather
/// than in f32 as every other implementation does: on `Isa::Amx` where the CPU has AMX-BF16, for
/// head sizes that are a multiple of 32.
pub fn tiles_attend(isa: Isa, hd: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa == Isa::Amx && hd.is_multiple_of(32) && x86::bf16_tiles();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The arithmetic `attend_rows` computes with on `isa` over a cache of `hd`-long heads (bf16 or
/// not), by name: the keys and values a prefix cache keeps on disk were computed with it, and
/// are used again only under the same name. Every implementation but the tiles gives the plain
/// version's bits; the name of the tiles' arithmetic changes whenever their bits do.
pub fn attention_arithmetic(isa: Isa, hd: usize, bf16_cache: bool) -> &'static str {
    match bf16_cache && tiles_attend(isa, hd) {
        // Blocks of 256 positions and `exp_tile` since 2026-12-05 (blocks of 64 and the vector
        // kernels' exponential before).
        true => "bf16 tiles 2",
        false => "plain",
    }
}

/// `attend_plain` with the CPU's fused multiply-add instruction where it has one: the same bits
/// as the library's `mul_add` without it, many times faster.
fn attend_plain_fused<E: KvElem>(
    qh: &[f32],
    kv: KvOf<'_, E>,
    scale: f32,
    sink: Option<f32>,
    seen: &[usize],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA.
        return unsafe { x86::attend_plain_fma(qh, kv, scale, sink, seen, out) };
    }
    attend_plain(qh, kv, scale, sink, seen, out)
}

/// What a head's weighted values (summed against its running maximum `max`, with weights summing
/// to `sum`) are multiplied by at the end: `1 / sum`, or with an attention sink, the share the
/// positions keep beside `e^sink`: `e^max / (sum e^max + e^sink)`, computed against the larger
/// of `max` and `sink` so that nothing overflows. Plain f32 arithmetic, used by every
/// implementation, so all give the same bits.
#[inline]
pub(crate) fn normalizer(max: f32, sum: f32, sink: Option<f32>) -> f32 {
    match sink {
        None => 1.0 / sum,
        Some(s) => {
            let top = max.max(s);
            let kept = exp_lane(max - top);
            kept / sum.mul_add(kept, exp_lane(s - top))
        }
    }
}

/// Every query's output (`hd` each in `out`, query `j` head `j % group` of its row) divided as
/// `normalizer` says by its running maximum and sum: the last step of the kernels' sweeps.
pub(crate) fn normalize(
    out: &mut [f32],
    hd: usize,
    (max, sum): (&[f32], &[f32]),
    sinks: Option<&[f32]>,
) {
    let group = sinks.map_or(1, |s| s.len());
    for (j, o) in out.chunks_mut(hd).enumerate() {
        let inv = normalizer(max[j], sum[j], sinks.map(|k| k[j % group]));
        for x in o {
            *x *= inv;
        }
    }
}

/// The plain version of the vector kernels: one query head over the positions `seen`, in order,
/// by blocks of `ATTENTION_BLOCK` with the online softmax, every float operation the one the
/// kernels perform, in their order (each score a fused chain over the dimensions, scaled; a
/// block's weights summed in eight lanes by position, the lanes added pairwise; each output a
/// fused chain over the positions from the earlier blocks' output rescaled).
#[inline(always)]
pub(crate) fn attend_plain<E: KvElem>(
    qh: &[f32],
    kv: KvOf<'_, E>,
    scale: f32,
    sink: Option<f32>,
    seen: &[usize],
    out: &mut [f32],
) {
    let KvOf {
        keys,
        values,
        key_stride,
        value_stride,
        hd,
        ..
    } = kv;
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    let mut w = [0f32; ATTENTION_BLOCK];
    out.fill(0.0);
    for block in seen.chunks(ATTENTION_BLOCK) {
        for (wk, &t) in w.iter_mut().zip(block) {
            let dot = (0..hd).fold(0f32, |a, i| {
                qh[i].mul_add(keys[E::key_at(i, t, key_stride)].to_f32(), a)
            });
            *wk = dot * scale;
        }
        let w = &mut w[..block.len()];
        let block_max = w.iter().copied().fold(max, f32::max);
        let rescale = exp_lane(max - block_max);
        let mut lanes = [0f32; 8];
        for (k, wk) in w.iter_mut().enumerate() {
            *wk = exp_lane(*wk - block_max);
            lanes[k % 8] += *wk;
        }
        let l = &lanes;
        let block_sum = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
        sum = sum.mul_add(rescale, block_sum);
        max = block_max;
        for (i, o) in out.iter_mut().enumerate() {
            *o = w.iter().zip(block).fold(*o * rescale, |a, (wk, &t)| {
                wk.mul_add(values[E::value_at(t, i, value_stride)].to_f32(), a)
            });
        }
    }
    let inv = normalizer(max, sum, sink);
    for o in out.iter_mut() {
        *o *= inv;
    }
}
