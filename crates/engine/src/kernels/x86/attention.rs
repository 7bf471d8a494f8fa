//! Attention of query heads over one key/value head: AVX2 for one row, AVX-512 for several
//! consecutive rows of a sequence at once.

// The tiles address several arrays and pointers by row (or column) index. They keep their index
// loops: iterator forms change the code generated for these kernels.
#![allow(clippy::needless_range_loop)]

use crate::kernels::attention::{softmax_visible, TreeMask, Visible};
use crate::kernels::KvHead;
use std::arch::x86_64::*;

/// Scores of query `pq` against the `8 V` positions whose transposed keys start at `pk` (row `i`
/// at `pk + i * ks`), scaled, to `sc`: one fused multiply-add chain per lane over the dimensions.
#[inline(always)]
unsafe fn scores_avx2<const V: usize>(
    pq: *const f32,
    pk: *const f32,
    ks: usize,
    hd: usize,
    sc: *mut f32,
    scale: __m256,
) {
    let mut acc = [_mm256_setzero_ps(); V];
    for i in 0..hd {
        let qi = _mm256_set1_ps(*pq.add(i));
        let k = pk.add(i * ks);
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k.add(8 * j)), *a);
        }
    }
    for (j, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(sc.add(8 * j), _mm256_mul_ps(*a, scale));
    }
}

/// `kernels::attend` for head sizes that are a multiple of 8. Scores go eight positions at a
/// time down the transposed keys (one broadcast query element per row of keys, no horizontal
/// sums); the value sum keeps up to 64 output floats of a head in registers while it walks the
/// positions.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `hd % 8 == 0`; the bounds are those `kernels::attend` checks.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn attend_avx2(
    q: &[f32],
    kv: KvHead<'_>,
    scale: f32,
    visible: Option<Visible>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let KvHead {
        keys,
        values,
        key_stride: ks,
        value_stride: stride,
        hd,
        len,
    } = kv;
    let group = q.len() / hd;
    let (pk, pv) = (keys.as_ptr(), values.as_ptr());
    let vscale = _mm256_set1_ps(scale);
    for g in 0..group {
        let pq = q.as_ptr().add(g * hd);
        let sc = scores.as_mut_ptr().add(g * len);
        // Each score is one fused multiply-add chain over the dimensions, in order, in its own
        // lane (or in the scalar tail): the same arithmetic wherever the position falls.
        let mut t = 0;
        while t + 32 <= len {
            scores_avx2::<4>(pq, pk.add(t), ks, hd, sc.add(t), vscale);
            t += 32;
        }
        while t + 8 <= len {
            scores_avx2::<1>(pq, pk.add(t), ks, hd, sc.add(t), vscale);
            t += 8;
        }
        while t < len {
            let mut acc = 0f32;
            for i in 0..hd {
                acc = (*pq.add(i)).mul_add(*pk.add(i * ks + t), acc);
            }
            *sc.add(t) = acc * scale;
            t += 1;
        }
        softmax_visible(&mut scores[g * len..(g + 1) * len], visible);
        let sc = scores.as_ptr().add(g * len);
        let po = out.as_mut_ptr().add(g * hd);
        for i0 in (0..hd).step_by(64) {
            let width = (hd - i0).min(64) / 8;
            let mut acc = [_mm256_setzero_ps(); 8];
            for t in 0..len {
                let w = _mm256_set1_ps(*sc.add(t));
                let v = pv.add(t * stride + i0);
                for (c, a) in acc.iter_mut().enumerate().take(width) {
                    *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(v.add(8 * c)), *a);
                }
            }
            for (c, a) in acc.iter().enumerate().take(width) {
                _mm256_storeu_ps(po.add(i0 + 8 * c), *a);
            }
        }
    }
}

/// Positions per block of the AVX-512 attention: four vectors of scores, and the keys and values
/// of a block (`hd` x 64 floats each) stay in L1 while every query of the job uses them.
const ATT_BLOCK: usize = 64;

/// Scores of `Q` queries (element `i` of query `j` at `qs[j] + i`) against positions
/// `t0..t0 + 64` of the transposed keys at `pk` (row `i` at `pk + i * ks`), scaled, to
/// `outs[j] + t0..`; lanes whose mask bit is clear are neither read nor written. Each score is one
/// fused multiply-add chain over the dimensions in order, whatever else shares the tile.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_tile<const Q: usize>(
    qs: &[*const f32],
    outs: &[*mut f32],
    pk: *const f32,
    ks: usize,
    hd: usize,
    t0: usize,
    masks: [__mmask16; 4],
    scale: __m512,
) {
    let mut acc = [[_mm512_setzero_ps(); 4]; Q];
    for i in 0..hd {
        let k = pk.add(i * ks + t0);
        let kv = [
            _mm512_maskz_loadu_ps(masks[0], k),
            _mm512_maskz_loadu_ps(masks[1], k.add(16)),
            _mm512_maskz_loadu_ps(masks[2], k.add(32)),
            _mm512_maskz_loadu_ps(masks[3], k.add(48)),
        ];
        for (j, a) in acc.iter_mut().enumerate() {
            let qi = _mm512_set1_ps(*qs[j].add(i));
            for (p, a) in a.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(qi, kv[p], *a);
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        for (p, a) in a.iter().enumerate() {
            _mm512_mask_storeu_ps(outs[j].add(t0 + 16 * p), masks[p], _mm512_mul_ps(*a, scale));
        }
    }
}

/// Adds `sum_t w[j][t] * value_t[i0..i0 + 16 W]` over `t0..t1` to `outs[j] + i0..` for `Q`
/// queries (weights of query `j` at `ws[j]`; value `t` at `pv + t * stride`); `first` starts the
/// sums from zero instead of reading them. Each output lane is one multiply-add chain over the
/// positions in order, whatever else shares the tile.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values_tile<const Q: usize, const W: usize>(
    ws: &[*const f32],
    outs: &[*mut f32],
    pv: *const f32,
    stride: usize,
    i0: usize,
    t0: usize,
    t1: usize,
    first: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); W]; Q];
    if !first {
        for (j, a) in acc.iter_mut().enumerate() {
            for (c, a) in a.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(outs[j].add(i0 + 16 * c));
            }
        }
    }
    for t in t0..t1 {
        let v = pv.add(t * stride + i0);
        let mut w = [_mm512_setzero_ps(); Q];
        for (j, w) in w.iter_mut().enumerate() {
            *w = _mm512_set1_ps(*ws[j].add(t));
        }
        for c in 0..W {
            let x = _mm512_loadu_ps(v.add(16 * c));
            for j in 0..Q {
                acc[j][c] = _mm512_fmadd_ps(w[j], x, acc[j][c]);
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        for (c, a) in a.iter().enumerate() {
            _mm512_storeu_ps(outs[j].add(i0 + 16 * c), *a);
        }
    }
}

/// `values_tile` for `q.len()` (1..=6) queries, `W` vectors wide.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values_tiles<const W: usize>(
    ws: &[*const f32],
    outs: &[*mut f32],
    pv: *const f32,
    stride: usize,
    i0: usize,
    t0: usize,
    t1: usize,
    first: bool,
) {
    // Up to 24 accumulators: three queries of 128 floats, six of 64 or less.
    let most = if W > 4 { 3 } else { 6 };
    for j0 in (0..ws.len()).step_by(most) {
        let j1 = (j0 + most).min(ws.len());
        let (w, o) = (&ws[j0..j1], &outs[j0..j1]);
        match j1 - j0 {
            1 => values_tile::<1, W>(w, o, pv, stride, i0, t0, t1, first),
            2 => values_tile::<2, W>(w, o, pv, stride, i0, t0, t1, first),
            3 => values_tile::<3, W>(w, o, pv, stride, i0, t0, t1, first),
            4 => values_tile::<4, W>(w, o, pv, stride, i0, t0, t1, first),
            5 => values_tile::<5, W>(w, o, pv, stride, i0, t0, t1, first),
            _ => values_tile::<6, W>(w, o, pv, stride, i0, t0, t1, first),
        }
    }
}

/// `kernels::attend_rows` with 512-bit registers, for head sizes that are a multiple of 16: a
/// small matrix product in blocks of 64 positions. Scores: tiles of up to six queries (of any
/// rows) times 64 positions, 24 accumulators, each row of transposed keys loaded once per tile
/// and each query element broadcast. Values: tiles of up to six query heads of a row times up to
/// 128 output floats, each value loaded once per tile. Every score and output is the same chain
/// of operations whatever shares the call, so a row's result does not depend on the batch.
///
/// # Safety
/// The CPU must have AVX-512 F (and AVX2, FMA); `hd % 16 == 0`; the bounds are those
/// `kernels::attend_rows` checks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
pub(crate) unsafe fn attend_rows_avx512(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    kv: KvHead<'_>,
    scale: f32,
    tree: Option<TreeMask<'_>>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let KvHead {
        keys,
        values,
        key_stride: ks,
        value_stride: stride,
        hd,
        len,
    } = kv;
    let gw = out.len() / rows;
    let group = gw / hd;
    let nq = rows * group;
    let row_len = |r: usize| len - (rows - 1 - r);
    let (pk, pv) = (keys.as_ptr(), values.as_ptr());
    let vscale = _mm512_set1_ps(scale);
    // Query `j` is head `j % group` of row `j / group`; its scores take `len` floats at
    // `scores[j * len..]` (a row with fewer positions leaves the end of its scores unused).
    let sp = scores.as_mut_ptr();
    for t0 in (0..len).step_by(ATT_BLOCK) {
        let lanes = |p: usize| -> __mmask16 {
            let n = len.saturating_sub(t0 + 16 * p).min(16);
            ((1u32 << n) - 1) as __mmask16
        };
        let masks = [lanes(0), lanes(1), lanes(2), lanes(3)];
        for j0 in (0..nq).step_by(6) {
            let j1 = (j0 + 6).min(nq);
            // Past the last position any query of the tile sees (the tile's last row sees most).
            if t0 >= row_len((j1 - 1) / group) {
                continue;
            }
            let mut qs = [std::ptr::null::<f32>(); 6];
            let mut os = [std::ptr::null_mut::<f32>(); 6];
            for j in j0..j1 {
                qs[j - j0] = q.as_ptr().add((j / group) * q_stride + (j % group) * hd);
                os[j - j0] = sp.add(j * len);
            }
            let (qs, os) = (&qs[..j1 - j0], &os[..j1 - j0]);
            match j1 - j0 {
                1 => scores_tile::<1>(qs, os, pk, ks, hd, t0, masks, vscale),
                2 => scores_tile::<2>(qs, os, pk, ks, hd, t0, masks, vscale),
                3 => scores_tile::<3>(qs, os, pk, ks, hd, t0, masks, vscale),
                4 => scores_tile::<4>(qs, os, pk, ks, hd, t0, masks, vscale),
                5 => scores_tile::<5>(qs, os, pk, ks, hd, t0, masks, vscale),
                _ => scores_tile::<6>(qs, os, pk, ks, hd, t0, masks, vscale),
            }
        }
    }
    for j in 0..nq {
        let n = row_len(j / group);
        softmax_visible(
            &mut scores[j * len..j * len + n],
            tree.map(|m| m.row(j / group)),
        );
    }
    // Values, in blocks of positions; the partial sums wait in `out` between blocks.
    let sp = scores.as_ptr();
    let po = out.as_mut_ptr();
    for t0 in (0..len).step_by(ATT_BLOCK) {
        for r in 0..rows {
            let t1 = (t0 + ATT_BLOCK).min(row_len(r));
            if t0 >= t1 {
                continue;
            }
            let first = t0 == 0;
            for g0 in (0..group).step_by(6) {
                let g1 = (g0 + 6).min(group);
                let mut ws = [std::ptr::null::<f32>(); 6];
                let mut os = [std::ptr::null_mut::<f32>(); 6];
                for g in g0..g1 {
                    ws[g - g0] = sp.add((r * group + g) * len);
                    os[g - g0] = po.add(r * gw + g * hd);
                }
                let (ws, os) = (&ws[..g1 - g0], &os[..g1 - g0]);
                let mut i0 = 0;
                while i0 < hd {
                    let w = (hd - i0) / 16;
                    if w >= 8 {
                        values_tiles::<8>(ws, os, pv, stride, i0, t0, t1, first);
                        i0 += 128;
                    } else if w >= 4 {
                        values_tiles::<4>(ws, os, pv, stride, i0, t0, t1, first);
                        i0 += 64;
                    } else if w >= 2 {
                        values_tiles::<2>(ws, os, pv, stride, i0, t0, t1, first);
                        i0 += 32;
                    } else {
                        values_tiles::<1>(ws, os, pv, stride, i0, t0, t1, first);
                        i0 += 16;
                    }
                }
            }
        }
    }
}
