//! Attention of query heads over one key/value head, for one or several consecutive rows of a
//! sequence at once, written once over the register width (`width::Width`): 512-bit registers on
//! AVX-512, 256-bit ones on AVX2. Keys and values are f32, f16 or bf16 (`KvElem`), widened to f32
//! lanes as they are loaded.
//!
//! One sweep over the positions in blocks of `ATTENTION_BLOCK` with an online softmax: for a few
//! queries at a time, a block's scores, their weights and the weighted values are computed while
//! they sit in L1, and the keys and values of the block are read from memory once for all the
//! queries. The operations and their order are those of `attention::attend_plain`.

// The tiles address several arrays and pointers by row (or column) index. They keep their index
// loops: iterator forms change the code generated for these kernels.
#![allow(clippy::needless_range_loop)]

use super::online_softmax::BlockWeights;
use super::spans::Spans;
use super::width::Width;
use crate::kernels::kv::{ElemKind, KvElem, KvOf, TreeMask, Visible};
use crate::kernels::on_lines;
use crate::kernels::online_softmax::{attend_plain, normalize, ATTENTION_BLOCK as BLOCK};
use std::arch::x86_64::*;

/// Queries whose scores, weights and values are computed together for a block: one score tile
/// of six on 512-bit registers, three of two on 256-bit ones.
const QUERIES: usize = 6;

/// `W::LANES` consecutive cached numbers from `p` in the f32 lanes of one register.
///
/// # Safety
/// `p` is valid for `W::LANES` numbers; called from a function compiled for `W`'s instructions
/// and F16C.
#[inline(always)]
unsafe fn lanes<W: Width, E: KvElem>(p: *const E) -> W::F {
    if E::KIND == ElemKind::F16 {
        W::f16s(p as *const u8)
    } else {
        W::loadf(p as *const f32)
    }
}

/// `W::LANES` consecutive positions from `t` of key dimension `i` of the head's keys at `pk`
/// (rows `ks` apart), in f32 lanes: from one row, or paired (bf16), the even or odd halves of
/// the row of pairs.
///
/// # Safety
/// As `lanes`, for the numbers read.
#[inline(always)]
pub(super) unsafe fn key_lanes<W: Width, E: KvElem>(
    pk: *const E,
    ks: usize,
    i: usize,
    t: usize,
) -> W::F {
    if E::PAIRED {
        W::bf16_half(pk.add(E::key_at(i & !1, t, ks)) as *const u8, i % 2 == 1)
    } else {
        lanes::<W, E>(pk.add(E::key_at(i, t, ks)))
    }
}

/// `W::LANES` consecutive dimensions from `d` of value `t` of the head's values at `pv`
/// (`vs` per position), in f32 lanes, as `key_lanes`.
///
/// # Safety
/// As `lanes`, for the numbers read.
#[inline(always)]
pub(super) unsafe fn value_lanes<W: Width, E: KvElem>(
    pv: *const E,
    vs: usize,
    t: usize,
    d: usize,
) -> W::F {
    if E::PAIRED {
        W::bf16_half(pv.add(E::value_at(t & !1, d, vs)) as *const u8, t % 2 == 1)
    } else {
        lanes::<W, E>(pv.add(E::value_at(t, d, vs)))
    }
}

/// Cache lines that `n` numbers of type `E` span where a vector reads them: twice as many for a
/// paired type, whose vector reads pairs.
#[inline(always)]
pub(super) fn read_lines<E: KvElem>(n: usize) -> usize {
    lines_of::<E>(n) * if E::PAIRED { 2 } else { 1 }
}

/// Cache lines that `n` numbers of type `E` span.
#[inline(always)]
fn lines_of<E>(n: usize) -> usize {
    (n * std::mem::size_of::<E>()).div_ceil(64)
}

/// How many positions ahead the first tile of a block prefetches keys and values (into L2). Each
/// block reads `hd` rows of transposed keys far apart, more streams than the hardware prefetchers
/// follow; measured on Zen 4 out of cache, 64 positions ahead is too late and 128 about right.
const PREFETCH_AHEAD: usize = 128;

/// How far ahead a block of positions from `t0` prefetches: `PREFETCH_AHEAD`, or 0 near the end
/// of the `len` positions.
#[inline(always)]
fn prefetch_ahead(t0: usize, len: usize) -> usize {
    if t0 + PREFETCH_AHEAD < len {
        PREFETCH_AHEAD
    } else {
        0
    }
}

/// Prefetches the `lines` cache lines from `p` into L2.
#[inline(always)]
pub(super) unsafe fn prefetch<E>(p: *const E, lines: usize) {
    for l in 0..lines {
        _mm_prefetch::<_MM_HINT_T1>((p as *const i8).wrapping_add(64 * l));
    }
}

/// Scores of `Q` queries (element `i` of query `j` at `qs[j] + i`) against `P` vectors of
/// positions from `t` of the transposed keys at `pk` (rows `ks` apart), scaled, to `outs[j]`.
/// Each score is one fused multiply-add chain over the dimensions in order, whatever else shares
/// the tile. `ahead`: the positions ahead to prefetch, 0 for none.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_tile<W: Width, E: KvElem, const Q: usize, const P: usize>(
    qs: &[*const f32; 6],
    outs: &[*mut f32; 6],
    pk: *const E,
    t: usize,
    ks: usize,
    hd: usize,
    scale: W::F,
    ahead: usize,
) {
    let mut acc = [[W::zero_f(); P]; Q];
    for i in 0..hd {
        if ahead > 0 {
            let k = pk.wrapping_add(E::key_at(i, t + ahead, ks));
            prefetch(k, read_lines::<E>(P * W::LANES));
        }
        // The query elements broadcast once, then one key vector at a time: Q broadcasts, one
        // key and the accumulators in registers.
        let mut qi = [W::zero_f(); Q];
        for j in 0..Q {
            qi[j] = W::splat(*qs[j].add(i));
        }
        for p in 0..P {
            let key = key_lanes::<W, E>(pk, ks, i, t + W::LANES * p);
            for j in 0..Q {
                acc[j][p] = W::fmadd(qi[j], key, acc[j][p]);
            }
        }
    }
    for j in 0..Q {
        for p in 0..P {
            W::store(outs[j].add(W::LANES * p), W::mul(acc[j][p], scale));
        }
    }
}

/// `scores_tile` for `n` (1..=6) queries.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_tiles<W: Width, E: KvElem, const P: usize>(
    n: usize,
    qs: &[*const f32; 6],
    outs: &[*mut f32; 6],
    pk: *const E,
    t: usize,
    ks: usize,
    hd: usize,
    scale: W::F,
    ahead: usize,
) {
    match n {
        1 => scores_tile::<W, E, 1, P>(qs, outs, pk, t, ks, hd, scale, ahead),
        2 => scores_tile::<W, E, 2, P>(qs, outs, pk, t, ks, hd, scale, ahead),
        3 => scores_tile::<W, E, 3, P>(qs, outs, pk, t, ks, hd, scale, ahead),
        4 => scores_tile::<W, E, 4, P>(qs, outs, pk, t, ks, hd, scale, ahead),
        5 => scores_tile::<W, E, 5, P>(qs, outs, pk, t, ks, hd, scale, ahead),
        _ => scores_tile::<W, E, 6, P>(qs, outs, pk, t, ks, hd, scale, ahead),
    }
}

/// Scaled scores of the queries `qs` against positions `t_a..t_b` (`t_a` a multiple of the
/// lanes) to `outs[j][t - t_a]`, in tiles of `QS` queries by `P` vectors of positions, then
/// single vectors, then one scalar fused chain per position past the cache's last whole vector.
/// Positions from `t_b` to the end of its vector may be written too.
#[inline(always)]
unsafe fn scores_span<W: Width, E: KvElem, const QS: usize, const P: usize>(
    qs: &[*const f32],
    outs: &[*mut f32],
    kv: &KvOf<'_, E>,
    (t_a, t_b): (usize, usize),
    scale: f32,
    ahead: usize,
) {
    let (pk, ks, hd) = (kv.keys.as_ptr(), kv.key_stride, kv.hd);
    let vector_end = t_b
        .next_multiple_of(W::LANES)
        .min(kv.len / W::LANES * W::LANES);
    let vscale = W::splat(scale);
    // Positions outside, query groups inside: each tile's keys are read from memory by the first
    // group and from L1 by the others.
    let group = |j0: usize, t: usize| {
        let n = (qs.len() - j0).min(QS);
        let mut q6 = [std::ptr::null::<f32>(); 6];
        q6[..n].copy_from_slice(&qs[j0..j0 + n]);
        let mut o6 = [std::ptr::null_mut::<f32>(); 6];
        for j in 0..n {
            o6[j] = outs[j0 + j].add(t - t_a);
        }
        (n, q6, o6)
    };
    let mut t = t_a;
    while t + P * W::LANES <= vector_end {
        for j0 in (0..qs.len()).step_by(QS) {
            let (n, q6, o6) = group(j0, t);
            let pf = if j0 == 0 { ahead } else { 0 };
            scores_tiles::<W, E, P>(n, &q6, &o6, pk, t, ks, hd, vscale, pf);
        }
        t += P * W::LANES;
    }
    while t < vector_end {
        for j0 in (0..qs.len()).step_by(QS) {
            let (n, q6, o6) = group(j0, t);
            scores_tiles::<W, E, 1>(n, &q6, &o6, pk, t, ks, hd, vscale, 0);
        }
        t += W::LANES;
    }
    for (&pq, &po) in qs.iter().zip(outs) {
        for t in vector_end.max(t_a)..t_b {
            let mut acc = 0f32;
            for i in 0..hd {
                acc = (*pq.add(i)).mul_add((*pk.add(E::key_at(i, t, ks))).to_f32(), acc);
            }
            *po.add(t - t_a) = acc * scale;
        }
    }
}

/// For `Q` queries: `outs[j][i0..i0 + V lanes]`, first scaled by `rescale[j]`, plus the sum over
/// `k < n` of `ws[j][k]` times the value of position `at(k)` (`stride` per position).
/// Each output lane is one multiply-add chain over the positions in order, whatever else shares
/// the tile. `ahead`: positions ahead to prefetch.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values_tile<W: Width, E: KvElem, const Q: usize, const V: usize>(
    ws: &[*mut f32],
    outs: &[*mut f32],
    rescale: &[f32],
    pv: *const E,
    stride: usize,
    i0: usize,
    n: usize,
    at: impl Fn(usize) -> usize,
    ahead: usize,
) {
    let mut acc = [[W::zero_f(); V]; Q];
    for j in 0..Q {
        let r = W::splat(rescale[j]);
        for c in 0..V {
            acc[j][c] = W::mul(W::loadf(outs[j].add(i0 + W::LANES * c)), r);
        }
    }
    for k in 0..n {
        let t = at(k);
        if ahead > 0 {
            let v = pv.wrapping_add(E::value_at(t + ahead, i0, stride));
            prefetch(v, read_lines::<E>(V * W::LANES));
        }
        let mut w = [W::zero_f(); Q];
        for j in 0..Q {
            w[j] = W::splat(*ws[j].add(k));
        }
        for c in 0..V {
            let x = value_lanes::<W, E>(pv, stride, t, i0 + W::LANES * c);
            for j in 0..Q {
                acc[j][c] = W::fmadd(w[j], x, acc[j][c]);
            }
        }
    }
    for j in 0..Q {
        for c in 0..V {
            W::store(outs[j].add(i0 + W::LANES * c), acc[j][c]);
        }
    }
}

/// `values_tile` for `ws.len()` queries, `V` vectors wide, in tiles of at most `ACC / V` queries
/// (`ACC`: the accumulators the width's registers hold beside a value and the weights).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values_tiles<W: Width, E: KvElem, const ACC: usize, const V: usize>(
    ws: &[*mut f32],
    outs: &[*mut f32],
    rescale: &[f32],
    kv: &KvOf<'_, E>,
    i0: usize,
    n: usize,
    at: impl Fn(usize) -> usize + Copy,
    ahead: usize,
) {
    let (pv, stride) = (kv.values.as_ptr(), kv.value_stride);
    let most = (ACC / V).clamp(1, 6);
    for j0 in (0..ws.len()).step_by(most) {
        let j1 = (j0 + most).min(ws.len());
        let (w, o, r) = (&ws[j0..j1], &outs[j0..j1], &rescale[j0..j1]);
        let ahead = if j0 == 0 { ahead } else { 0 };
        match j1 - j0 {
            1 => values_tile::<W, E, 1, V>(w, o, r, pv, stride, i0, n, at, ahead),
            2 => values_tile::<W, E, 2, V>(w, o, r, pv, stride, i0, n, at, ahead),
            3 => values_tile::<W, E, 3, V>(w, o, r, pv, stride, i0, n, at, ahead),
            4 => values_tile::<W, E, 4, V>(w, o, r, pv, stride, i0, n, at, ahead),
            5 => values_tile::<W, E, 5, V>(w, o, r, pv, stride, i0, n, at, ahead),
            _ => values_tile::<W, E, 6, V>(w, o, r, pv, stride, i0, n, at, ahead),
        }
    }
}

/// Every output of the queries (`outs`, `hd` each) rescaled and given the weighted values of the
/// `n` positions `at(0..n)`: the head split into runs of 8, 4, 2 or 1 vectors.
#[inline(always)]
unsafe fn values_block<W: Width, E: KvElem, const ACC: usize>(
    ws: &[*mut f32],
    outs: &[*mut f32],
    rescale: &[f32],
    kv: &KvOf<'_, E>,
    n: usize,
    at: impl Fn(usize) -> usize + Copy,
    ahead: usize,
) {
    let mut i0 = 0;
    while i0 < kv.hd {
        let w = (kv.hd - i0) / W::LANES;
        let pf = if i0 == 0 { ahead } else { 0 };
        let v = if w >= 8 && ACC >= 24 {
            values_tiles::<W, E, ACC, 8>(ws, outs, rescale, kv, i0, n, at, pf);
            8
        } else if w >= 4 {
            values_tiles::<W, E, ACC, 4>(ws, outs, rescale, kv, i0, n, at, pf);
            4
        } else if w >= 2 {
            values_tiles::<W, E, ACC, 2>(ws, outs, rescale, kv, i0, n, at, pf);
            2
        } else {
            values_tiles::<W, E, ACC, 1>(ws, outs, rescale, kv, i0, n, at, pf);
            1
        };
        i0 += v * W::LANES;
    }
}

/// The rows of one call (query `j` is head `j % group` of row `j / group`). Row `r` sees the
/// first `row_len(r)` of the `len` positions; `swept(r)` of them go through the sweep over
/// blocks, the rest of a tree row through `tree_tail`.
#[derive(Clone, Copy)]
struct Shape<'a> {
    rows: usize,
    len: usize,
    tree: Option<TreeMask<'a>>,
}

impl Shape<'_> {
    fn row_len(&self, r: usize) -> usize {
        self.len - (self.rows - 1 - r)
    }

    fn swept(&self, r: usize) -> usize {
        match self.tree {
            Some(m) => m.start / BLOCK * BLOCK,
            None => self.row_len(r),
        }
    }
}

/// Working space of one call: each query's weights of a block, the tail of a tree row for
/// `QUERIES` queries, and each query's running maximum, sum and latest rescaling factor.
struct Scratch<'a> {
    weights: &'a mut [f32],
    tail: &'a mut [f32],
    max: &'a mut [f32],
    sum: &'a mut [f32],
    rescale: &'a mut [f32],
}

impl<'a> Scratch<'a> {
    fn new(v: &'a mut Vec<f32>, queries: usize) -> Scratch<'a> {
        let v = on_lines(v, (BLOCK + 3) * queries + QUERIES * 2 * BLOCK);
        v.fill(0.0);
        let (weights, rest) = v.split_at_mut(queries * BLOCK);
        let (tail, rest) = rest.split_at_mut(QUERIES * 2 * BLOCK);
        let (max, rest) = rest.split_at_mut(queries);
        let (sum, rescale) = rest.split_at_mut(queries);
        max.fill(f32::NEG_INFINITY);
        Scratch {
            weights,
            tail,
            max,
            sum,
            rescale,
        }
    }
}

/// `kernels::attend_rows` for head sizes that are a multiple of the width's lanes. The sweep
/// over blocks of positions (`sweep_block`), a tree row's last blocks (`tree_tail`), then every
/// output divided by its sum.
///
/// # Safety
/// Called from a function compiled for `W`'s instructions and FMA; `hd % W::LANES == 0`; the
/// bounds are those `kernels::attend_rows` checks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_rows_wide<
    W: Width + BlockWeights,
    E: KvElem,
    const QS: usize,
    const P: usize,
    const ACC: usize,
>(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    kv: &mut impl Spans<E>,
    scale: f32,
    sinks: Option<&[f32]>,
    tree: Option<TreeMask<'_>>,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (hd, len) = kv.shape();
    let group = out.len() / rows / hd;
    let shape = Shape { rows, len, tree };
    let nq = rows * group;
    let mut s = Scratch::new(scratch, nq);
    out.fill(0.0);
    let query = |j: usize| q.as_ptr().add((j / group) * q_stride + (j % group) * hd);
    let po = out.as_mut_ptr();
    let sweep = Sweep {
        query: &query,
        out: po,
        group,
        shape,
    };
    for t0 in (0..shape.swept(rows - 1)).step_by(BLOCK) {
        let span = (t0, (t0 + BLOCK).min(len));
        sweep_block::<W, E, QS, P, ACC>(&sweep, kv, scale, span, &mut s);
    }
    if let Some(m) = tree {
        for r in 0..rows {
            for g0 in (0..group).step_by(QUERIES) {
                let heads = r * group + g0..r * group + (g0 + QUERIES).min(group);
                let (sees, end) = (m.row(r), shape.row_len(r));
                tree_tail::<W, E, QS, P, ACC>(&sweep, heads, &mut s, kv, scale, sees, end);
            }
        }
    }
    normalize(out, hd, (s.max, s.sum), sinks);
}

/// What every block of the sweep needs: where query `j` and its output are, the group size and
/// the rows' shape.
struct Sweep<'a, F> {
    query: &'a F,
    out: *mut f32,
    group: usize,
    shape: Shape<'a>,
}

/// One block of positions from `t0` for every query that sees some of it (a suffix of the
/// queries, rows seeing more the later they are): first, `QUERIES` queries at a time, scores in
/// tiles of `QS` queries by `P` vectors of positions and the block's weights (`block_weights`,
/// positions a row does not see weighing zero), the block's keys staying in L1 for all; then the
/// weighted values into every output, in tiles of queries by vectors of output (`ACC`
/// accumulators), the block's values staying in L1 for all.
#[inline(always)]
unsafe fn sweep_block<
    W: Width + BlockWeights,
    E: KvElem,
    const QS: usize,
    const P: usize,
    const ACC: usize,
>(
    sweep: &Sweep<'_, impl Fn(usize) -> *const f32>,
    src: &mut impl Spans<E>,
    scale: f32,
    (t0, end): (usize, usize),
    s: &mut Scratch<'_>,
) {
    let (group, hd) = (sweep.group, src.shape().0);
    let nq = sweep.shape.rows * group;
    let first = (0..nq)
        .find(|&j| sweep.shape.swept(j / group) > t0)
        .unwrap_or(nq);
    let seen = |j: usize| (sweep.shape.swept(j / group) - t0).min(BLOCK);
    let weights = s.weights.as_mut_ptr();
    // The first tiles of each phase prefetch the keys, then the values, ahead.
    let (keys, base) = src.keys(t0, end);
    let kv = &keys;
    let ahead = prefetch_ahead(t0 - base, kv.len);
    // Scores for up to `SCORED` queries at once, so that each tile of keys is read from memory
    // once for all of them (a query's scores past what it sees are computed and not used).
    const SCORED: usize = 8 * QUERIES;
    for c0 in (first..nq).step_by(SCORED) {
        let c1 = (c0 + SCORED).min(nq);
        let (mut qs, mut ws) = ([std::ptr::null(); SCORED], [weights; SCORED]);
        for j in c0..c1 {
            (qs[j - c0], ws[j - c0]) = ((sweep.query)(j), weights.add(j * BLOCK));
        }
        let (a, n) = (c1 - c0, seen(c1 - 1));
        let pf = if c0 == first { ahead } else { 0 };
        let span = (t0 - base, t0 - base + n);
        scores_span::<W, E, QS, P>(&qs[..a], &ws[..a], kv, span, scale, pf);
    }
    for j in first..nq {
        let (max, sum) = (&mut s.max[j], &mut s.sum[j]);
        s.rescale[j] = W::block_weights(weights.add(j * BLOCK), seen(j), max, sum);
    }
    let mut ws = [weights; QUERIES];
    let mut os = [sweep.out; QUERIES];
    let (kv, base) = src.values(t0, end);
    let kv = &kv;
    for (pass, j0) in (first..nq).step_by(QUERIES).enumerate() {
        let j1 = (j0 + QUERIES).min(nq);
        for j in j0..j1 {
            (ws[j - j0], os[j - j0]) = (weights.add(j * BLOCK), sweep.out.add(j * hd));
        }
        let a = j1 - j0;
        let pf = if pass == 0 { ahead } else { 0 };
        let (ws, os, rescale) = (&ws[..a], &os[..a], &s.rescale[j0..j1]);
        values_block::<W, E, ACC>(ws, os, rescale, kv, seen(j1 - 1), |k| t0 - base + k, pf);
    }
}

/// The positions of a tree row from the block holding its tree's first one, for the query
/// `heads` (at most `QUERIES`, of one row): their scores, the ones the row sees (below `end`)
/// packed in order, as the row's path alone would hold them, then the online softmax and the
/// values over those in blocks (at most two).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tree_tail<
    W: Width + BlockWeights,
    E: KvElem,
    const QS: usize,
    const P: usize,
    const ACC: usize,
>(
    sweep: &Sweep<'_, impl Fn(usize) -> *const f32>,
    heads: std::ops::Range<usize>,
    s: &mut Scratch<'_>,
    src: &mut impl Spans<E>,
    scale: f32,
    sees: Visible,
    end: usize,
) {
    let from = sees.start / BLOCK * BLOCK;
    let hd = src.shape().0;
    // At most BLOCK - 1 committed positions, then at most 64 of the tree.
    let cap = 2 * BLOCK;
    let h = heads.len();
    debug_assert!(end - from <= cap && h * cap <= s.tail.len());
    let (mut qs, mut os) = ([std::ptr::null(); QUERIES], [sweep.out; QUERIES]);
    let mut ws = [s.tail.as_mut_ptr(); QUERIES];
    for (i, j) in heads.clone().enumerate() {
        (qs[i], os[i]) = ((sweep.query)(j), sweep.out.add(j * hd));
        ws[i] = s.tail.as_mut_ptr().add(i * cap);
    }
    let (kv, base) = src.keys(from, end);
    scores_span::<W, E, QS, P>(&qs[..h], &ws[..h], &kv, (from - base, end - base), scale, 0);
    let mut at = [0usize; 2 * BLOCK];
    let mut n = 0;
    for t in from..end {
        if sees.sees(t) {
            at[n] = t;
            n += 1;
        }
    }
    for &w in &ws[..h] {
        for k in 0..n {
            *w.add(k) = *w.add(at[k] - from);
        }
    }
    let (max, sum) = (&mut s.max[heads.clone()], &mut s.sum[heads]);
    let (kv, base) = src.values(from, end);
    for b0 in (0..n).step_by(BLOCK) {
        let seen = (n - b0).min(BLOCK);
        let (mut wb, mut rescale) = (ws, [0f32; QUERIES]);
        for i in 0..h {
            wb[i] = ws[i].add(b0);
            rescale[i] = W::block_weights(wb[i], seen, &mut max[i], &mut sum[i]);
        }
        values_block::<W, E, ACC>(
            &wb[..h],
            &os[..h],
            &rescale[..h],
            &kv,
            seen,
            |k| at[b0 + k] - base,
            0,
        );
    }
}

/// `attention::attend_plain` compiled with FMA, so that its `mul_add`s are single instructions
/// (the same bits).
///
/// # Safety
/// The CPU must have FMA.
#[target_feature(enable = "fma")]
pub(crate) unsafe fn attend_plain_fma<E: KvElem>(
    qh: &[f32],
    kv: KvOf<'_, E>,
    scale: f32,
    sink: Option<f32>,
    seen: &[usize],
    out: &mut [f32],
) {
    attend_plain(qh, kv, scale, sink, seen, out)
}
