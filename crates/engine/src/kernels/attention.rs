//! Attention of the query heads that share one key/value head of the cache (keys stored
//! transposed): the plain loops, and one tiled kernel for one or several rows at once on 256-bit
//! (AVX2) or 512-bit (AVX-512) registers. Keys and values are f32, f16 or bf16 (`KvElem`);
//! every product and sum is in f32, a 16-bit number widened exactly as it is loaded. A bf16
//! cache on AMX takes its own kernel (`x86::amx_attention`), whose products are bf16 tiles.

use super::isa::{isa, Isa};
use super::kv::{KvElem, KvElems, KvHead, KvOf, Q8Head, TreeMask};
use super::online_softmax::{attend_plain, ATTENTION_BLOCK};
use super::q8;
use super::table::{Attend, Kernels};
#[cfg(target_arch = "x86_64")]
use super::x86;

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
    let k = isa.kernels();
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
    let query = Query {
        q,
        q_stride,
        rows,
        scale,
        sinks,
        tree,
    };
    let done = match kv.elems {
        KvElems::F32 { keys, values } => {
            on_kernel(k.attention.f32, kv.of(keys, values), query, scratch, out)
        }
        KvElems::F16 { keys, values } => {
            on_kernel(k.attention.f16, kv.of(keys, values), query, scratch, out)
        }
        KvElems::Bf16 { keys, values } => {
            on_kernel(k.attention.bf16, kv.of(keys, values), query, scratch, out)
        }
        KvElems::Q8 { .. } => return attend_rows_q8(k, query, kv, out),
    };
    if done {
        return;
    }
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

/// The arguments of `attend_rows` besides the head, the scratch and the outputs.
#[derive(Clone, Copy)]
struct Query<'a> {
    q: &'a [f32],
    q_stride: usize,
    rows: usize,
    scale: f32,
    sinks: Option<&'a [f32]>,
    tree: Option<TreeMask<'a>>,
}

/// `attend_rows` on the first of the class's kernels for the head's type (`list`) that takes
/// its size; `false` where none does (or the head is offset), for the plain loops to do.
fn on_kernel<E: KvElem>(
    list: &'static [Attend<E>],
    kv: KvOf<'_, E>,
    query: Query<'_>,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) -> bool {
    let Some(kernel) = Kernels::attend_for(list, kv.hd).filter(|_| kv.offset == 0) else {
        return false;
    };
    kv.check();
    if kernel.tiles.is_some() {
        kv.check_whole_blocks();
    }
    let Query {
        q,
        q_stride,
        rows,
        scale,
        sinks,
        tree,
    } = query;
    // SAFETY: the kernel is from the table of a class the CPU runs (`Isa::kernels`) and takes
    // heads of this size (`attend_for`); keys and values lie inside the checked span (and whole
    // blocks where it reads them), queries inside `q`, a tree's rows inside the cache, outputs
    // sized as `attend_rows` checked.
    unsafe { (kernel.run)(q, q_stride, rows, kv, scale, sinks, tree, scratch, out) };
    true
}

/// `attend_rows` over a q8 head: on a class with a q8 kernel, block by block dequantized into L1
/// for its f32 kernels (`x86::q8_attention`); otherwise the whole head dequantized and given to
/// the plain loops. Every path computes on the same f32 numbers, so every one gives the bits of
/// the plain loops over an f32 cache holding them.
fn attend_rows_q8(k: &Kernels, query: Query<'_>, kv: KvHead<'_>, out: &mut [f32]) {
    let KvElems::Q8 { keys, values } = kv.elems else {
        unreachable!("a q8 head")
    };
    let KvHead {
        hd,
        len,
        key_stride: ks,
        value_stride: vs,
        ..
    } = kv;
    assert!(
        q8::fits(hd) && vs == q8::stored(hd),
        "a q8 head of {hd} dimensions"
    );
    assert!(
        len <= ks && keys.len() >= (q8::stored(hd) - 1) * ks + len && values.len() >= len * vs,
        "q8 cache too short"
    );
    let Query {
        q,
        q_stride,
        rows,
        scale,
        sinks,
        tree,
    } = query;
    if let Some(kernel) = k.attention.q8 {
        let head = Q8Head {
            keys,
            values,
            hd,
            ks,
            len,
        };
        // SAFETY: the kernel is from the table of a class the CPU runs (`Isa::kernels`);
        // `attend_rows` checked the shapes of queries and outputs; the head's bytes were
        // checked just above; hd is a multiple of 32.
        return unsafe { kernel(q, q_stride, rows, head, scale, sinks, tree, out) };
    }
    let (mut kf, mut vf) = (vec![0f32; hd * len], vec![0f32; len * hd]);
    q8::dequantize(
        (keys, values),
        (hd, ks, vs),
        (0, len),
        (&mut kf, len),
        &mut vf,
    );
    let f32_head = KvHead::new(&kf, &vf, len, hd, hd, len);
    let mut scratch = Vec::new();
    attend_rows(
        Isa::Scalar,
        q,
        q_stride,
        rows,
        f32_head,
        scale,
        sinks,
        tree,
        &mut scratch,
        out,
    );
}

/// Whether `attend_rows` on `isa` computes over a bf16 cache of `hd`-long heads on tiles
/// (`x86::amx_attention`, the Amx class with AMX-BF16, heads of a multiple of 32), whose products
/// round the queries and the weights to bf16, rather than in f32 as every other kernel does.
/// False for a class this CPU does not run.
pub fn tiles_attend(isa: Isa, hd: usize) -> bool {
    isa.is_available() && isa.kernels().tiles_attend(hd)
}

/// Whether `isa`'s cache of `hd`-long heads is bf16 unless told otherwise (`KvDtype::auto`):
/// where its attention over bf16 heads ran faster than over f32 heads at every pass width (on
/// AMX tiles; on 512-bit registers, widened a block at a time). False for a class this CPU does
/// not run.
pub fn bf16_by_default(isa: Isa, hd: usize) -> bool {
    let m = isa.kernels().attention.bf16_by_default;
    isa.is_available() && m > 0 && hd.is_multiple_of(m)
}

/// The arithmetic `attend_rows` computes with on `isa` over a cache of `hd`-long heads (bf16 or
/// not), by name: the keys and values a prefix cache keeps on disk were computed with it, and
/// are used again only under the same name. Every kernel but the tiles gives the plain loops'
/// bits ("plain"); the tiles' name changes whenever their bits do (`Attend::tiles`).
pub fn attention_arithmetic(isa: Isa, hd: usize, bf16_cache: bool) -> &'static str {
    let tiles = bf16_cache
        .then(|| Kernels::attend_for(isa.kernels().attention.bf16, hd))
        .flatten()
        .and_then(|a| a.tiles);
    tiles.unwrap_or("plain")
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
