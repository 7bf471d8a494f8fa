//! Attention of query heads over one key/value head, for one or several consecutive rows of a
//! sequence at once, written once over the register width (`width::Width`): 512-bit registers on
//! AVX-512, 256-bit ones on AVX2. Keys and values are f32 or f16 (`KvElem`), widened to f32
//! lanes as they are loaded.

// The tiles address several arrays and pointers by row (or column) index. They keep their index
// loops: iterator forms change the code generated for these kernels.
#![allow(clippy::needless_range_loop)]

use super::width::{Width, Ymm, Zmm};
use crate::kernels::attention::{softmax_visible, KvElem, KvOf, TreeMask};
use std::arch::x86_64::*;

/// `W::LANES` consecutive cached numbers from `p` in the f32 lanes of one register.
///
/// # Safety
/// `p` is valid for `W::LANES` numbers; called from a function compiled for `W`'s instructions
/// and F16C.
#[inline(always)]
unsafe fn lanes<W: Width, E: KvElem>(p: *const E) -> W::F {
    if E::HALF {
        W::f16s(p as *const u8)
    } else {
        W::loadf(p as *const f32)
    }
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
unsafe fn prefetch<E>(p: *const E, lines: usize) {
    for l in 0..lines {
        _mm_prefetch::<_MM_HINT_T1>((p as *const i8).wrapping_add(64 * l));
    }
}

/// Scores of `Q` queries (element `i` of query `j` at `qs[j] + i`) against the `P` vectors of
/// positions from `t0` of the transposed keys at `pk` (row `i` at `pk + i * ks`), scaled, to
/// `outs[j] + t0..`. Each score is one fused multiply-add chain over the dimensions in order,
/// whatever else shares the tile. `ahead`: the positions ahead to prefetch, 0 for none.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_tile<W: Width, E: KvElem, const Q: usize, const P: usize>(
    qs: &[*const f32; 6],
    outs: &[*mut f32; 6],
    pk: *const E,
    ks: usize,
    hd: usize,
    t0: usize,
    scale: W::F,
    ahead: usize,
) {
    let mut acc = [[W::zero_f(); P]; Q];
    for i in 0..hd {
        let k = pk.add(i * ks + t0);
        if ahead > 0 {
            prefetch(k.wrapping_add(ahead), lines_of::<E>(P * W::LANES));
        }
        // The query elements broadcast once, then one key vector at a time: Q broadcasts, one
        // key and the accumulators in registers.
        let mut qi = [W::zero_f(); Q];
        for j in 0..Q {
            qi[j] = W::splat(*qs[j].add(i));
        }
        for p in 0..P {
            let key = lanes::<W, E>(k.add(W::LANES * p));
            for j in 0..Q {
                acc[j][p] = W::fmadd(qi[j], key, acc[j][p]);
            }
        }
    }
    for j in 0..Q {
        for p in 0..P {
            W::store(outs[j].add(t0 + W::LANES * p), W::mul(acc[j][p], scale));
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
    ks: usize,
    hd: usize,
    t0: usize,
    scale: W::F,
    ahead: usize,
) {
    match n {
        1 => scores_tile::<W, E, 1, P>(qs, outs, pk, ks, hd, t0, scale, ahead),
        2 => scores_tile::<W, E, 2, P>(qs, outs, pk, ks, hd, t0, scale, ahead),
        3 => scores_tile::<W, E, 3, P>(qs, outs, pk, ks, hd, t0, scale, ahead),
        4 => scores_tile::<W, E, 4, P>(qs, outs, pk, ks, hd, t0, scale, ahead),
        5 => scores_tile::<W, E, 5, P>(qs, outs, pk, ks, hd, t0, scale, ahead),
        _ => scores_tile::<W, E, 6, P>(qs, outs, pk, ks, hd, t0, scale, ahead),
    }
}

/// Adds `sum_t w[j][t] * value_t[i0..i0 + V lanes]` over `t0..t1` to `outs[j] + i0..` for `Q`
/// queries (weights of query `j` at `ws[j]`; value `t` at `pv + t * stride`); `first` starts the
/// sums from zero instead of reading them. Each output lane is one multiply-add chain over the
/// positions in order, whatever else shares the tile. `ahead`: positions ahead to prefetch.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values_tile<W: Width, E: KvElem, const Q: usize, const V: usize>(
    ws: &[*const f32],
    outs: &[*mut f32],
    pv: *const E,
    stride: usize,
    i0: usize,
    (t0, t1): (usize, usize),
    first: bool,
    ahead: usize,
) {
    let mut acc = [[W::zero_f(); V]; Q];
    if !first {
        for j in 0..Q {
            for c in 0..V {
                acc[j][c] = W::loadf(outs[j].add(i0 + W::LANES * c));
            }
        }
    }
    for t in t0..t1 {
        let v = pv.add(t * stride + i0);
        if ahead > 0 {
            prefetch(v.wrapping_add(ahead * stride), lines_of::<E>(V * W::LANES));
        }
        let mut w = [W::zero_f(); Q];
        for j in 0..Q {
            w[j] = W::splat(*ws[j].add(t));
        }
        for c in 0..V {
            let x = lanes::<W, E>(v.add(W::LANES * c));
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
    ws: &[*const f32],
    outs: &[*mut f32],
    pv: *const E,
    stride: usize,
    i0: usize,
    span: (usize, usize),
    first: bool,
    ahead: usize,
) {
    let most = (ACC / V).clamp(1, 6);
    for j0 in (0..ws.len()).step_by(most) {
        let j1 = (j0 + most).min(ws.len());
        let (w, o) = (&ws[j0..j1], &outs[j0..j1]);
        let ahead = if j0 == 0 { ahead } else { 0 };
        match j1 - j0 {
            1 => values_tile::<W, E, 1, V>(w, o, pv, stride, i0, span, first, ahead),
            2 => values_tile::<W, E, 2, V>(w, o, pv, stride, i0, span, first, ahead),
            3 => values_tile::<W, E, 3, V>(w, o, pv, stride, i0, span, first, ahead),
            4 => values_tile::<W, E, 4, V>(w, o, pv, stride, i0, span, first, ahead),
            5 => values_tile::<W, E, 5, V>(w, o, pv, stride, i0, span, first, ahead),
            _ => values_tile::<W, E, 6, V>(w, o, pv, stride, i0, span, first, ahead),
        }
    }
}

/// `kernels::attend_rows` for head sizes that are a multiple of the width's lanes: a small matrix
/// product in blocks of `P` vectors of positions. Scores (`scores_of`): tiles of up to `QS`
/// queries (of any rows) times a block, each row of transposed keys loaded once per tile and each
/// query element broadcast; the positions past the last whole vector are one scalar fused chain
/// each. Values (`values_of`): tiles of several query heads of a row times a few vectors of
/// output, each value loaded once per tile. Every score and output is the same chain of
/// operations whatever shares the call, so a row's result does not depend on the batch (nor on the
/// width).
///
/// # Safety
/// Called from a function compiled for `W`'s instructions and FMA; `hd % W::LANES == 0`; the
/// bounds are those `kernels::attend_rows` checks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_rows_wide<
    W: Width,
    E: KvElem,
    const QS: usize,
    const P: usize,
    const ACC: usize,
>(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    kv: KvOf<'_, E>,
    scale: f32,
    tree: Option<TreeMask<'_>>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let shape = Shape {
        rows,
        group: out.len() / rows / kv.hd,
        len: kv.len,
    };
    scores_of::<W, E, QS, P>(q, q_stride, shape, kv, scale, scores);
    for j in 0..rows * shape.group {
        let r = j / shape.group;
        let n = shape.row_len(r);
        softmax_visible(
            &mut scores[j * kv.len..j * kv.len + n],
            tree.map(|m| m.row(r)),
        );
    }
    values_of::<W, E, P, ACC>(shape, kv, scores, out);
}

/// The rows of one call: `group` query heads each; row `r` sees the first `row_len(r)` of the
/// `len` positions. Query `j` is head `j % group` of row `j / group`; its scores take `len`
/// floats at `scores[j * len..]` (a row with fewer positions leaves the end of its scores unused).
#[derive(Clone, Copy)]
struct Shape {
    rows: usize,
    group: usize,
    len: usize,
}

impl Shape {
    fn row_len(&self, r: usize) -> usize {
        self.len - (self.rows - 1 - r)
    }
}

/// Every query's scaled scores against the positions its row sees, into `scores`.
#[inline(always)]
unsafe fn scores_of<W: Width, E: KvElem, const QS: usize, const P: usize>(
    q: &[f32],
    q_stride: usize,
    shape: Shape,
    kv: KvOf<'_, E>,
    scale: f32,
    scores: &mut [f32],
) {
    let Shape { group, len, .. } = shape;
    let (pk, ks, hd) = (kv.keys.as_ptr(), kv.key_stride, kv.hd);
    let nq = shape.rows * group;
    let block = P * W::LANES;
    let vscale = W::splat(scale);
    let sp = scores.as_mut_ptr();
    let query = |j: usize| q.as_ptr().add((j / group) * q_stride + (j % group) * hd);
    let whole = len / W::LANES * W::LANES;
    for t0 in (0..whole).step_by(block) {
        let vectors = ((whole - t0) / W::LANES).min(P);
        for j0 in (0..nq).step_by(QS) {
            let j1 = (j0 + QS).min(nq);
            // Past the last position any query of the tile sees (the tile's last row sees most).
            if t0 >= shape.row_len((j1 - 1) / group) {
                continue;
            }
            let mut qs = [std::ptr::null::<f32>(); 6];
            let mut os = [std::ptr::null_mut::<f32>(); 6];
            for j in j0..j1 {
                qs[j - j0] = query(j);
                os[j - j0] = sp.add(j * len);
            }
            let pf = if j0 == 0 { prefetch_ahead(t0, len) } else { 0 };
            if vectors == P {
                scores_tiles::<W, E, P>(j1 - j0, &qs, &os, pk, ks, hd, t0, vscale, pf);
            } else {
                for v in 0..vectors {
                    let t = t0 + v * W::LANES;
                    scores_tiles::<W, E, 1>(j1 - j0, &qs, &os, pk, ks, hd, t, vscale, 0);
                }
            }
        }
    }
    for j in 0..nq {
        let pq = query(j);
        for t in whole..shape.row_len(j / group) {
            let mut acc = 0f32;
            for i in 0..hd {
                acc = (*pq.add(i)).mul_add((*pk.add(i * ks + t)).to_f32(), acc);
            }
            *sp.add(j * len + t) = acc * scale;
        }
    }
}

/// Every query's weighted sum of the values (weights in `scores`), into `out`: in blocks of
/// positions, the partial sums waiting in `out` between blocks.
#[inline(always)]
unsafe fn values_of<W: Width, E: KvElem, const P: usize, const ACC: usize>(
    shape: Shape,
    kv: KvOf<'_, E>,
    scores: &[f32],
    out: &mut [f32],
) {
    let Shape { rows, group, len } = shape;
    let (pv, stride, hd) = (kv.values.as_ptr(), kv.value_stride, kv.hd);
    let gw = group * hd;
    let block = P * W::LANES;
    let sp = scores.as_ptr();
    let po = out.as_mut_ptr();
    for t0 in (0..len).step_by(block) {
        for r in 0..rows {
            let t1 = (t0 + block).min(shape.row_len(r));
            if t0 >= t1 {
                continue;
            }
            let mut ws = [std::ptr::null::<f32>(); 16];
            let mut os = [std::ptr::null_mut::<f32>(); 16];
            for g0 in (0..group).step_by(16) {
                let g1 = (g0 + 16).min(group);
                for g in g0..g1 {
                    ws[g - g0] = sp.add((r * group + g) * len);
                    os[g - g0] = po.add(r * gw + g * hd);
                }
                let (ws, os) = (&ws[..g1 - g0], &os[..g1 - g0]);
                // The first tile of the block's first row prefetches the values ahead.
                let pf = if r == 0 && g0 == 0 {
                    prefetch_ahead(t0, len)
                } else {
                    0
                };
                let (span, first) = ((t0, t1), t0 == 0);
                let mut i0 = 0;
                while i0 < hd {
                    let w = (hd - i0) / W::LANES;
                    let pf = if i0 == 0 { pf } else { 0 };
                    if w >= 8 && ACC >= 24 {
                        values_tiles::<W, E, ACC, 8>(ws, os, pv, stride, i0, span, first, pf);
                        i0 += 8 * W::LANES;
                    } else if w >= 4 {
                        values_tiles::<W, E, ACC, 4>(ws, os, pv, stride, i0, span, first, pf);
                        i0 += 4 * W::LANES;
                    } else if w >= 2 {
                        values_tiles::<W, E, ACC, 2>(ws, os, pv, stride, i0, span, first, pf);
                        i0 += 2 * W::LANES;
                    } else {
                        values_tiles::<W, E, ACC, 1>(ws, os, pv, stride, i0, span, first, pf);
                        i0 += W::LANES;
                    }
                }
            }
        }
    }
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
    tree: Option<TreeMask<'_>>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    attend_rows_wide::<Zmm, E, 6, 4, 24>(q, q_stride, rows, kv, scale, tree, scores, out)
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
    tree: Option<TreeMask<'_>>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    attend_rows_wide::<Ymm<false>, E, 2, 4, 12>(q, q_stride, rows, kv, scale, tree, scores, out)
}
