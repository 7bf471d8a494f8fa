//! `Sums`: the integer sums of one sub-block for a tile of activation rows, as the packed kernels
//! (`packed`) keep them: `vpdpbusd` into 32 bits with VNNI, or `vpmaddubsw` pairs summed in 16
//! bits and widened by `vpmaddwd` without, exact and the same either way.

// The sums are kept per row in arrays indexed by row, as in the kernels that call them: index loops
// keep the code generated for these kernels.
#![allow(clippy::needless_range_loop)]

use super::width::Width;

/// Integer sums of one sub-block for `MR` activation rows. With VNNI each step of four products is
/// one `vpdpbusd` into 32-bit sums (in two chains below four rows, so that they overlap). Without,
/// it is one `vpmaddubsw`, whose 16-bit pairs are added in 16 bits (`pending`) and widened to 32 by
/// one `vpmaddwd` at each `flush`: every format flushes before its pairs could leave 16 bits, so
/// the sums are exact and the same as with VNNI.
///
/// The K-quants apply each sub-block's integer scale to its integer sums before any float (see
/// `flush_scaled`), so a super-block ends as one exact integer per row and lane (`scaled_total`).
pub(super) struct Sums<W: Width, const VNNI: bool, const MR: usize> {
    a: [W::I; MR],
    a2: [W::I; MR],
    pending: [W::I; MR],
    /// With VNNI: the scaled sums of the sub-blocks done (without, `a` holds them).
    scaled: [W::I; MR],
}

/// Steps of `vpmaddubsw` pairs that fit in 16 bits for weights up to `max_weight` against
/// activations within +-127.
pub(super) const fn steps_in_16_bits(max_weight: i32) -> usize {
    (i16::MAX as i32 / (2 * max_weight * 127)) as usize
}

impl<W: Width, const VNNI: bool, const MR: usize> Sums<W, VNNI, MR> {
    const SPLIT: bool = VNNI && MR < 4;

    #[inline(always)]
    pub(super) unsafe fn new() -> Self {
        Sums {
            a: [W::zero(); MR],
            a2: [W::zero(); MR],
            pending: [W::zero(); MR],
            scaled: [W::zero(); MR],
        }
    }

    /// Row `r` advanced by the products of unsigned weights `w` (at most 127) and activations `x`;
    /// `second` picks the second chain where there are two.
    #[inline(always)]
    pub(super) unsafe fn step(&mut self, r: usize, second: bool, w: W::I, x: W::I) {
        if !VNNI {
            self.pending[r] = W::add16(self.pending[r], W::maddubs(w, x));
        } else if second && Self::SPLIT {
            self.a2[r] = W::dpbusd(self.a2[r], w, x);
        } else {
            self.a[r] = W::dpbusd(self.a[r], w, x);
        }
    }

    /// Without VNNI: the products of signed weights given as `|w|` and their signs, widened at
    /// once (a pair of them can take all 16 bits). Its 32-bit sum is pinned here (`Width::pin`):
    /// these steps have no 16-bit sums for `pin` to hold.
    #[inline(always)]
    pub(super) unsafe fn step_signed(&mut self, r: usize, w_abs: W::I, sign: W::Sign, x: W::I) {
        let pairs = W::maddubs(w_abs, W::with_sign(x, sign));
        self.a[r] = W::add32(self.a[r], W::widen_pairs(pairs));
        W::pin(&mut self.a[r]);
    }

    /// Without VNNI, every row's 16-bit sums pinned (`Width::pin`): the step before is done.
    /// (Pinning the 32-bit sums as well, or pinning with VNNI, measured slower for these steps.)
    #[inline(always)]
    pub(super) unsafe fn pin(&mut self) {
        if !VNNI {
            for r in 0..MR {
                W::pin(&mut self.pending[r]);
            }
        }
    }

    #[inline(always)]
    pub(super) unsafe fn flush(&mut self) {
        if !VNNI {
            for r in 0..MR {
                self.a[r] = W::add32(self.a[r], W::widen_pairs(self.pending[r]));
                self.pending[r] = W::zero();
            }
        }
    }

    /// Row `r`'s sum (after the last `flush`).
    #[inline(always)]
    pub(super) unsafe fn total(&self, r: usize) -> W::I {
        if Self::SPLIT {
            W::add32(self.a[r], self.a2[r])
        } else {
            self.a[r]
        }
    }
    /// Without VNNI: the pending pairs times the sub-block's scale `sc16` (as `pair16(sc, sc)`),
    /// widened into the running sum by the one `vpmaddwd` that `flush` would use.
    #[inline(always)]
    pub(super) unsafe fn flush_scaled(&mut self, sc16: W::I) {
        if !VNNI {
            for r in 0..MR {
                self.a[r] = W::add32(self.a[r], W::madd16(self.pending[r], sc16));
                self.pending[r] = W::zero();
            }
        }
    }

    /// End of a sub-block of scale `sc` (32-bit lanes): with VNNI its sums times `sc` join the
    /// scaled total and start again from zero; without, `flush_scaled` did it already.
    #[inline(always)]
    pub(super) unsafe fn end_sub_block(&mut self, sc: W::I) {
        if VNNI {
            for r in 0..MR {
                self.scaled[r] = W::add32(self.scaled[r], W::mullo32(self.total(r), sc));
                self.a[r] = W::zero();
                self.a2[r] = W::zero();
            }
        }
    }

    /// With VNNI: row `r`'s sums of the next block or sub-block start from `v` instead of zero.
    #[inline(always)]
    pub(super) unsafe fn start_from(&mut self, r: usize, v: W::I) {
        if VNNI {
            self.a[r] = v;
        }
    }

    /// Row `r`'s sum of every sub-block's scaled sums so far.
    #[inline(always)]
    pub(super) unsafe fn scaled_total(&self, r: usize) -> W::I {
        if VNNI {
            self.scaled[r]
        } else {
            self.a[r]
        }
    }

    /// Adds `v` to row `r`'s scaled total.
    #[inline(always)]
    pub(super) unsafe fn add_scaled(&mut self, r: usize, v: W::I) {
        if VNNI {
            self.scaled[r] = W::add32(self.scaled[r], v);
        } else {
            self.a[r] = W::add32(self.a[r], v);
        }
    }
}
