//! Attention of the query heads that share one key/value head of the cache (keys stored
//! transposed): the plain loops, and one tiled kernel for one or several rows at once on 256-bit
//! (AVX2) or 512-bit (AVX-512) registers. Keys and values are f32 or f16 (`KvElem`); every
//! product and sum is in f32, an f16 number widened exactly as it is loaded.

use super::elementwise::softmax;
use super::isa::{assert_available, isa, Isa};
#[cfg(target_arch = "x86_64")]
use super::x86;
use half::f16;

/// A number type the KV cache stores keys and values in: f32 or f16, no other (the vector kernels
/// load by `HALF`).
pub trait KvElem: sealed::OneOfOurs + Copy + Send + Sync + bytemuck::Pod + 'static {
    /// The cache's zero.
    const ZERO: Self;
    /// Half precision (else f32).
    const HALF: bool;
    /// `v` rounded to the nearest number of the type (f16: out-of-range values saturate to the
    /// largest finite one, so a cache never holds an infinity its attention would turn to NaN).
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
}

impl KvElem for f32 {
    const ZERO: f32 = 0.0;
    const HALF: bool = false;
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
    const HALF: bool = true;
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

/// The keys and values of a `KvHead`, in the type its cache stores.
#[derive(Clone, Copy)]
pub enum KvElems<'a> {
    F32 { keys: &'a [f32], values: &'a [f32] },
    F16 { keys: &'a [f16], values: &'a [f16] },
}

/// One key/value head of a cache over its first `len` positions. Keys are stored transposed, one
/// row per dimension: dimension `i` of key `t` is `keys[i * key_stride + t]`, so that the scores
/// of consecutive positions are one vector product away (no horizontal sums); value `t` is
/// `values[t * value_stride..][..hd]`.
#[derive(Clone, Copy)]
pub struct KvHead<'a> {
    pub elems: KvElems<'a>,
    pub key_stride: usize,
    pub value_stride: usize,
    pub hd: usize,
    pub len: usize,
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
        }
    }

    /// The same head without its first `n` positions: position `n + t` becomes `t`.
    pub fn skip(self, n: usize) -> KvHead<'a> {
        assert!(n < self.len, "skipping every position");
        let vs = n * self.value_stride;
        let elems = match self.elems {
            KvElems::F32 { keys, values } => KvElems::F32 {
                keys: &keys[n..],
                values: &values[vs..],
            },
            KvElems::F16 { keys, values } => KvElems::F16 {
                keys: &keys[n..],
                values: &values[vs..],
            },
        };
        KvHead {
            elems,
            len: self.len - n,
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
        }
    }
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
        }
    }};
}

impl<E> KvOf<'_, E> {
    /// Panics unless every key and value of the `len` positions lies inside the slices.
    fn check(&self) {
        let Self { hd, len, .. } = *self;
        assert!(
            hd > 0 && len > 0 && len <= self.key_stride,
            "key rows too short"
        );
        assert!(
            self.keys.len() >= (hd - 1) * self.key_stride + len
                && self.values.len() >= (len - 1) * self.value_stride + hd,
            "cache too short"
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
    fn sees(&self, t: usize) -> bool {
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

/// Softmax over the positions of `x` that `visible` lets the row see, with zero weight at the
/// others. The visible scores are first packed together in order, so the softmax runs on exactly
/// the values, in exactly the lanes, that a row holding only those positions would use: a tree
/// node's weights are bit-identical to those of the same token decoded on its own. The weighted
/// sum of values that follows adds a zero for every hidden position, which changes nothing.
pub(crate) fn softmax_visible(x: &mut [f32], visible: Option<Visible>) {
    let Some(v) = visible else {
        return softmax(x);
    };
    let start = v.start.min(x.len());
    let mut n = start;
    for t in start..x.len() {
        if v.sees(t) {
            x[n] = x[t];
            n += 1;
        }
    }
    softmax(&mut x[..n]);
    // Spread back from the end: a packed entry never lies after its own position.
    for t in (start..x.len()).rev() {
        if v.sees(t) {
            n -= 1;
            x[t] = x[n];
        } else {
            x[t] = 0.0;
        }
    }
}

/// Attention of the `q.len() / hd` query heads in `q` that share the key/value head `kv`.
/// `scores` is scratch; `out` gets one `hd`-long output per query head.
pub fn attend(q: &[f32], kv: KvHead<'_>, scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend_with(isa(), q, kv, scale, scores, out)
}

/// `attend` with a chosen implementation (512-bit registers for head sizes that are a multiple of
/// 16 on AVX-512, 256-bit ones for multiples of 8, the plain loops otherwise).
pub fn attend_with(
    isa: Isa,
    q: &[f32],
    kv: KvHead<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_visible(isa, q, kv, scale, None, scores, out)
}

/// `attend_with` for a row that sees only the positions `visible` allows.
fn attend_visible(
    isa: Isa,
    q: &[f32],
    kv: KvHead<'_>,
    scale: f32,
    visible: Option<Visible>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    assert_available(isa);
    let KvHead { hd, len, .. } = kv;
    let group = q.len() / hd;
    assert!(group * hd == q.len() && out.len() == q.len());
    // The vector kernels take one row as a pass of one (its mask, if any, as a one-row tree).
    if isa != Isa::Scalar && hd % 8 == 0 && cfg!(target_arch = "x86_64") {
        let bits = [visible.map_or(0, |v| v.bits)];
        let mask = visible.map(|v| TreeMask {
            start: v.start,
            rows: &bits,
        });
        return attend_rows(isa, q, q.len(), 1, kv, scale, mask, scores, out);
    }
    scores.clear();
    scores.resize(group * len, 0.0);
    with_typed!(kv, kv => {
        kv.check();
        scalar_visible(q, kv, scale, visible, scores, out)
    })
}

/// Causal attention of `rows` consecutive positions of one sequence, for the query heads that share
/// the key/value head `kv`: row `r`'s query heads are `q[r * q_stride..][..group * hd]`, it sees the
/// first `kv.len - (rows - 1 - r)` positions (of those, with a `tree` mask, only the ones its mask
/// lets it see), and its outputs go to `out[r * group * hd..]`. Each row's result is bit-identical
/// to `attend` on that row alone over the positions it sees; the vector versions read each key
/// and value once for all the rows.
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    isa: Isa,
    q: &[f32],
    q_stride: usize,
    rows: usize,
    kv: KvHead<'_>,
    scale: f32,
    tree: Option<TreeMask<'_>>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let KvHead { hd, len, .. } = kv;
    assert!(rows > 0 && rows <= len && out.len().is_multiple_of(rows));
    assert_available(isa);
    let gw = out.len() / rows;
    assert!(hd > 0 && gw.is_multiple_of(hd) && (rows - 1) * q_stride + gw <= q.len());
    assert!(
        tree.is_none_or(|m| m.rows.len() == rows),
        "one mask per row"
    );
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && hd % 8 == 0 {
        scores.clear();
        scores.resize(rows * (gw / hd) * len, 0.0);
        return with_typed!(kv, kv => {
            kv.check();
            // SAFETY: the CPU has what `isa` names (asserted above): AVX-512 F with AVX2, FMA
            // and F16C for the 512-bit version, AVX2, FMA and F16C for any other vector class;
            // hd is a multiple of their lanes; keys and values lie inside the checked span,
            // queries inside `q`, scores and outputs are sized above.
            unsafe {
                if isa.avx512() && hd % 16 == 0 {
                    x86::attend_rows_avx512(q, q_stride, rows, kv, scale, tree, scores, out)
                } else {
                    x86::attend_rows_avx2(q, q_stride, rows, kv, scale, tree, scores, out)
                }
            }
        });
    }
    for (r, o) in out.chunks_mut(gw).enumerate() {
        let row_kv = KvHead {
            len: len - (rows - 1 - r),
            ..kv
        };
        attend_visible(
            isa,
            &q[r * q_stride..r * q_stride + gw],
            row_kv,
            scale,
            tree.map(|m| m.row(r)),
            scores,
            o,
        );
    }
}

/// The plain version of `attend`, one dot product and one scaled sum per head and position.
pub fn attend_scalar(q: &[f32], kv: KvHead<'_>, scale: f32, scores: &mut [f32], out: &mut [f32]) {
    with_typed!(kv, kv => {
        kv.check();
        scalar_visible(q, kv, scale, None, scores, out)
    })
}

/// `attend_scalar` for a row that sees only the positions `visible` allows.
fn scalar_visible<E: KvElem>(
    q: &[f32],
    kv: KvOf<'_, E>,
    scale: f32,
    visible: Option<Visible>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let KvOf {
        keys,
        values,
        key_stride,
        value_stride,
        hd,
        len,
    } = kv;
    let group = q.len() / hd;
    for g in 0..group {
        // Along the rows of keys: every score sums its products in the order of the dimensions.
        let sc = &mut scores[g * len..(g + 1) * len];
        sc.fill(0.0);
        for (i, qi) in q[g * hd..(g + 1) * hd].iter().enumerate() {
            for (s, k) in sc
                .iter_mut()
                .zip(&keys[i * key_stride..i * key_stride + len])
            {
                *s += qi * k.to_f32();
            }
        }
        for s in sc.iter_mut() {
            *s *= scale;
        }
        softmax_visible(sc, visible);
    }
    out.fill(0.0);
    for t in 0..len {
        let value = &values[t * value_stride..t * value_stride + hd];
        for g in 0..group {
            let w = scores[g * len + t];
            for (o, v) in out[g * hd..(g + 1) * hd].iter_mut().zip(value) {
                *o += w * v.to_f32();
            }
        }
    }
}
