//! The scalar pieces every attention path shares, so that all give the same bits: the block of
//! positions the online softmax takes at a time, the exponential as one vector lane computes it,
//! the last division of a head's output (with or without an attention sink), and the plain loops
//! that do in one row what the vector kernels do in many (`attend_plain`).

use super::kv::{KvElem, KvOf};

/// Positions the attention kernels take at a time: scores of a block, their weights and the
/// weighted values are computed together while they sit in L1 (an online softmax, as in
/// FlashAttention: a running maximum and sum, and earlier outputs rescaled when the maximum
/// grows). Blocks start at multiples of this in the positions a row sees (a tree node's packed
/// first), so a row's result never depends on what shares its pass.
pub(crate) const ATTENTION_BLOCK: usize = 64;

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

/// ln 2 in two parts for the exponentials' range reduction (x - n ln 2 as x - n LN2_HI - n
/// LN2_LO): LN2_HI has few enough bits that n LN2_HI is exact for every n they see.
pub(crate) const LN2_HI: f32 = 0.693_145_75;
pub(crate) const LN2_LO: f32 = 1.428_606_8e-6;

/// e^x exactly as the vector kernels compute it (`x86::exp8`), for one number: the same
/// operations in the same order, so the same bits. x is clamped to [-87, 88]; x = n ln 2 + r,
/// e^r by its Taylor series to degree 7, times 2^n.
#[inline(always)]
#[allow(clippy::manual_clamp)] // as the vector max and min do, a NaN becomes -87 (clamp keeps it)
pub fn exp_lane(x: f32) -> f32 {
    let x = x.max(-87.0).min(88.0);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = 1.0f32 / 5040.0;
    for c in [720.0f32, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0] {
        p = p.mul_add(r, 1.0 / c);
    }
    p * f32::from_bits(((n as i32 + 127) << 23) as u32)
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
