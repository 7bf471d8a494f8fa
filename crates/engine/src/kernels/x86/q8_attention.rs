//! Attention over a q8 cache (`kernels::q8`) on the vector classes: each span of positions the
//! sweep of `attention` takes (a block, or a tree row's last two) is dequantized into f32 rows
//! that stay in L1, and the f32 kernels run on them. Dequantizing is exact (an int8 times an f16
//! scale), so the result is the f32 kernels' over those numbers, bit for bit the plain loops'.
//! The cache is read once per pass, at a quarter of f32's bytes (8.5 bits a number).

use super::attention::attend_rows_wide;
use super::online_softmax::BlockWeights;
use super::spans::{room_len, room_view, Spans, AHEAD, BUFFERS, SPAN_STRIDE};
use super::width::{Width, Ymm, Zmm};
use crate::kernels::kv::{KvOf, Q8Head, TreeMask};
use crate::kernels::on_lines;
use crate::kernels::online_softmax::ATTENTION_BLOCK as BLOCK;
use crate::kernels::q8;
use std::arch::x86_64::*;

/// A q8 head read through its dequantized spans.
struct Dequantized<'a, W> {
    head: Q8Head<'a>,
    room: &'a mut [f32],
    width: std::marker::PhantomData<W>,
}

impl<W: Width> Spans<f32> for Dequantized<'_, W> {
    fn shape(&self) -> (usize, usize) {
        (self.head.hd, self.head.len)
    }

    #[inline(always)]
    unsafe fn keys(&mut self, from: usize, to: usize) -> (KvOf<'_, f32>, usize) {
        dequantize_keys::<W>(&self.head, (from, to), self.room);
        room_view(self.room, self.head.hd, (from, to))
    }

    #[inline(always)]
    unsafe fn values(&mut self, from: usize, to: usize) -> (KvOf<'_, f32>, usize) {
        dequantize_values::<W>(&self.head, (from, to), self.room);
        room_view(self.room, self.head.hd, (from, to))
    }
}

/// The f16 with bits `bits`, as f32 (`vcvtph2ps`: exact, as `q8::scale`).
///
/// # Safety
/// Compiled for F16C.
#[inline(always)]
unsafe fn f16_bits(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The keys of positions `from..to` (at most `2 * BLOCK`) of `h` into `keys` (rows
/// `SPAN_STRIDE` apart), each number its int8 times its block's scale; the key bytes of the span
/// `AHEAD` further prefetched.
///
/// # Safety
/// Compiled for `W`'s instructions and F16C; `h`'s bytes hold its `len` positions (as
/// `q8::attend_rows_q8` checks); `to <= h.len`; `keys` holds `hd * SPAN_STRIDE` floats.
#[inline(always)]
unsafe fn dequantize_keys<W: Width>(h: &Q8Head<'_>, (from, to): (usize, usize), keys: &mut [f32]) {
    let (hd, ks, n) = (h.hd, h.ks, to - from);
    let whole = n / W::LANES * W::LANES;
    let pk = h.keys.as_ptr();
    let ahead = from + AHEAD < h.len;
    let mut scales = [0f32; 2 * BLOCK];
    let sc = scales.as_mut_ptr();
    for b in 0..hd / q8::BLOCK {
        let lo = pk.add((hd + 2 * b) * ks + from);
        let hi = lo.add(ks);
        for p in (0..whole).step_by(W::LANES) {
            W::store(sc.add(p), W::f16_planes(lo.add(p), hi.add(p)));
        }
        for p in whole..n {
            *sc.add(p) = f16_bits(u16::from_le_bytes([*lo.add(p), *hi.add(p)]));
        }
        if ahead {
            for r in [hd + 2 * b, hd + 2 * b + 1] {
                _mm_prefetch::<_MM_HINT_T1>(pk.wrapping_add(r * ks + from + AHEAD) as *const i8);
            }
        }
        for i in b * q8::BLOCK..(b + 1) * q8::BLOCK {
            let row = pk.add(i * ks + from);
            if ahead {
                _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(AHEAD) as *const i8);
            }
            let out = keys.as_mut_ptr().add(i * SPAN_STRIDE);
            for p in (0..whole).step_by(W::LANES) {
                let x = W::cvt(W::i8s_i32(row.add(p)));
                W::store(out.add(p), W::mul(x, W::loadf(sc.add(p))));
            }
            for p in whole..n {
                *out.add(p) = *row.add(p) as i8 as f32 * *sc.add(p);
            }
        }
    }
}

/// The values of positions `from..to` (at most `2 * BLOCK`) of `h` into `values` (`hd` each),
/// as `dequantize_keys`.
///
/// # Safety
/// As `dequantize_keys`; `values` holds `2 * BLOCK * hd` floats.
#[inline(always)]
unsafe fn dequantize_values<W: Width>(
    h: &Q8Head<'_>,
    (from, to): (usize, usize),
    values: &mut [f32],
) {
    let (hd, pv, vs) = (h.hd, h.values.as_ptr(), q8::stored(h.hd));
    let ahead = from + AHEAD < h.len;
    for t in from..to {
        let row = pv.add(t * vs);
        if ahead {
            let next = row.wrapping_add(AHEAD * vs);
            for l in (0..vs).step_by(64) {
                _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(l) as *const i8);
            }
        }
        let out = values.as_mut_ptr().add((t - from) * hd);
        for b in 0..hd / q8::BLOCK {
            let s = W::splat(f16_bits(
                (row.add(hd + 2 * b) as *const u16).read_unaligned(),
            ));
            for v in (b * q8::BLOCK..(b + 1) * q8::BLOCK).step_by(W::LANES) {
                W::store(out.add(v), W::mul(W::cvt(W::i8s_i32(row.add(v))), s));
            }
        }
    }
}

/// `attend_rows_wide` over a q8 head's dequantized spans.
///
/// # Safety
/// As `dequantize_keys`, and the bounds `kernels::attend_rows` checks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_rows_q8<W: Width + BlockWeights, const QS: usize, const ACC: usize>(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    head: Q8Head<'_>,
    scale: f32,
    sinks: Option<&[f32]>,
    tree: Option<TreeMask<'_>>,
    out: &mut [f32],
) {
    // The thread's buffers, taken out for the call (no closure: it would not inherit the
    // calling kernel's target features).
    let mut buffers = BUFFERS.take();
    let mut kv = Dequantized::<W> {
        head,
        room: on_lines(&mut buffers.span, room_len(head.hd)),
        width: std::marker::PhantomData,
    };
    let sweep = &mut buffers.sweep;
    attend_rows_wide::<W, f32, QS, 4, ACC>(
        q, q_stride, rows, &mut kv, scale, sinks, tree, sweep, out,
    );
    BUFFERS.set(buffers);
}

/// `kernels::attend_rows` over a q8 head with 512-bit registers.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL (and AVX2, FMA, F16C); `hd % 32 == 0`; `head`'s bytes
/// hold its positions; the bounds are those `kernels::attend_rows` checks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn attend_rows_q8_avx512(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    head: Q8Head<'_>,
    scale: f32,
    sinks: Option<&[f32]>,
    tree: Option<TreeMask<'_>>,
    out: &mut [f32],
) {
    attend_rows_q8::<Zmm, 6, 24>(q, q_stride, rows, head, scale, sinks, tree, out)
}

/// `kernels::attend_rows` over a q8 head with 256-bit registers.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `hd % 32 == 0`; as `attend_rows_q8_avx512` otherwise.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn attend_rows_q8_avx2(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    head: Q8Head<'_>,
    scale: f32,
    sinks: Option<&[f32]>,
    tree: Option<TreeMask<'_>>,
    out: &mut [f32],
) {
    attend_rows_q8::<Ymm<false>, 2, 12>(q, q_stride, rows, head, scale, sinks, tree, out)
}
