//! The register widths the packed kernels (`packed`), attention (`attention`, `q8_attention`,
//! `online_softmax`) and the peaks (`peak`) are written over: the handful of integer and float
//! operations they use, on 512-bit (`Zmm`) or 256-bit (`Ymm`)
//! registers. Every method is `unsafe` and inlined: it may only run inside a function compiled
//! for the instructions it uses, which its caller's `#[target_feature]` names.

use std::arch::x86_64::*;

/// One register width of the packed kernels: the handful of operations they are made of.
pub(super) trait Width {
    type I: Copy;
    type F: Copy;
    /// What `with_sign` needs of a signed weight vector.
    type Sign: Copy;
    /// Weight rows per register (of the sixteen in a group).
    const LANES: usize;
    unsafe fn zero() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    /// `LANES * 4` bytes.
    unsafe fn load(p: *const u8) -> Self::I;
    /// Four activation bytes at `p`, broadcast to every lane.
    unsafe fn bcast4(p: *const i8) -> Self::I;
    unsafe fn bytes(v: i8) -> Self::I;
    /// Sixteen bytes at `p` repeated in every 128-bit lane (a table for `lookup`).
    unsafe fn table16(p: *const u8) -> Self::I;
    /// `vpshufb`: each byte `i` (0..16) of `idx` replaced by byte `i` of its lane of `table`.
    unsafe fn lookup(table: Self::I, idx: Self::I) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn xor(a: Self::I, b: Self::I) -> Self::I;
    /// Shifts of each 16-bit lane by `N` (a constant count, which the compiler turns into an
    /// immediate).
    unsafe fn shr16<const N: u32>(a: Self::I) -> Self::I;
    unsafe fn shl16<const N: u32>(a: Self::I) -> Self::I;
    /// Shift of each 32-bit lane left by `N`.
    unsafe fn shl32<const N: u32>(a: Self::I) -> Self::I;
    unsafe fn add32(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn sub32(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn add16(a: Self::I, b: Self::I) -> Self::I;
    /// `vpmaddubsw`: unsigned `w` by signed `x`, adjacent pairs summed to i16 (saturating).
    unsafe fn maddubs(w: Self::I, x: Self::I) -> Self::I;
    /// `vpmaddwd` by ones: adjacent i16 pairs summed to i32.
    unsafe fn widen_pairs(p: Self::I) -> Self::I;
    /// `vpdpbusd`: `acc` plus the four products of unsigned `w` by signed `x` per 32-bit lane.
    unsafe fn dpbusd(acc: Self::I, w: Self::I, x: Self::I) -> Self::I;
    /// Where registers are few: `v` computed by this point of the program, and no load moved
    /// across it, so that a kernel's steps run one after the other. Left to itself the compiler
    /// hoists the weights of every step of a block (or sinks the products to group them by row)
    /// and spills what no longer fits in sixteen registers: on AVX2, `tbench` at 8 rows in L1 ran
    /// Q8_0 at 48 and Q5_0 at 70 G multiply-adds/s per core with 40% and 14% of its time on
    /// spilled registers, against 60 and 79 with the steps pinned (Zen 4).
    unsafe fn pin(v: &mut Self::I);
    unsafe fn abs8(w: Self::I) -> Self::I;
    unsafe fn sign_of(w: Self::I) -> Self::Sign;
    /// `x` negated where the weight is negative (zero or unchanged where it is zero).
    unsafe fn with_sign(x: Self::I, s: Self::Sign) -> Self::I;
    /// `LANES` f16 values.
    unsafe fn f16s(p: *const u8) -> Self::F;
    /// The even (`odd` false) or odd bf16 numbers of `LANES` pairs from `p`, as f32 (exactly: a
    /// bf16 is an f32's high half).
    unsafe fn bf16_half(p: *const u8, odd: bool) -> Self::F;
    /// `LANES` f16 numbers given as their low bytes at `lo` and high bytes at `hi`, as f32.
    unsafe fn f16_planes(lo: *const u8, hi: *const u8) -> Self::F;
    /// `LANES` unsigned or signed bytes as 32-bit integers.
    unsafe fn u8s_i32(p: *const u8) -> Self::I;
    unsafe fn i8s_i32(p: *const u8) -> Self::I;
    /// Each 32-bit lane of two vectors of small integers (within i16) as an i16 pair: `lo`'s value
    /// low, `hi`'s high (the operand `madd16` multiplies an i16 pair by).
    unsafe fn pair16(lo: Self::I, hi: Self::I) -> Self::I;
    /// `vpmaddwd`: adjacent i16 pairs multiplied lane by lane and summed to i32.
    unsafe fn madd16(a: Self::I, b: Self::I) -> Self::I;
    /// The low 32 bits of each lane's product (`vpmulld`).
    unsafe fn mullo32(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn cvt(a: Self::I) -> Self::F;
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `c - a * b`.
    unsafe fn fnmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn splat(v: f32) -> Self::F;
    unsafe fn store(p: *mut f32, v: Self::F);
    unsafe fn loadf(p: *const f32) -> Self::F;
}

/// 512-bit registers: the sixteen rows of a group in one.
pub(super) struct Zmm;

/// 256-bit registers: eight rows of a group in one. `EVEX`: `vpdpbusd` in its AVX-512 VL encoding
/// instead of AVX-VNNI's (the same instruction, on CPUs that have AVX-512 VNNI, so that the AVX-VNNI
/// kernels run and are tested there too).
pub(super) struct Ymm<const EVEX: bool>;

impl Width for Zmm {
    type I = __m512i;
    type F = __m512;
    type Sign = __mmask64;
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p as *const _)
    }
    #[inline(always)]
    unsafe fn bcast4(p: *const i8) -> __m512i {
        _mm512_set1_epi32((p as *const i32).read_unaligned())
    }
    #[inline(always)]
    unsafe fn bytes(v: i8) -> __m512i {
        _mm512_set1_epi8(v)
    }
    #[inline(always)]
    unsafe fn table16(p: *const u8) -> __m512i {
        _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn lookup(table: __m512i, idx: __m512i) -> __m512i {
        _mm512_shuffle_epi8(table, idx)
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        _mm512_and_si512(a, b)
    }
    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        _mm512_or_si512(a, b)
    }
    #[inline(always)]
    unsafe fn xor(a: __m512i, b: __m512i) -> __m512i {
        _mm512_xor_si512(a, b)
    }
    #[inline(always)]
    unsafe fn shr16<const N: u32>(a: __m512i) -> __m512i {
        _mm512_srl_epi16(a, _mm_set_epi64x(0, N as i64))
    }
    #[inline(always)]
    unsafe fn shl16<const N: u32>(a: __m512i) -> __m512i {
        _mm512_sll_epi16(a, _mm_set_epi64x(0, N as i64))
    }
    #[inline(always)]
    unsafe fn shl32<const N: u32>(a: __m512i) -> __m512i {
        _mm512_sll_epi32(a, _mm_set_epi64x(0, N as i64))
    }
    #[inline(always)]
    unsafe fn add32(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn sub32(a: __m512i, b: __m512i) -> __m512i {
        _mm512_sub_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn add16(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi16(a, b)
    }
    #[inline(always)]
    unsafe fn maddubs(w: __m512i, x: __m512i) -> __m512i {
        _mm512_maddubs_epi16(w, x)
    }
    #[inline(always)]
    unsafe fn widen_pairs(p: __m512i) -> __m512i {
        _mm512_madd_epi16(p, _mm512_set1_epi16(1))
    }
    /// Nothing: with 32 registers pinning was measured slower (Q5_0 and Q4_0 by 8-10% without
    /// VNNI), the compiler's own order spilling little.
    #[inline(always)]
    unsafe fn pin(_: &mut __m512i) {}
    #[inline(always)]
    unsafe fn dpbusd(acc: __m512i, w: __m512i, x: __m512i) -> __m512i {
        _mm512_dpbusd_epi32(acc, w, x)
    }
    #[inline(always)]
    unsafe fn abs8(w: __m512i) -> __m512i {
        _mm512_abs_epi8(w)
    }
    #[inline(always)]
    unsafe fn sign_of(w: __m512i) -> __mmask64 {
        _mm512_movepi8_mask(w)
    }
    #[inline(always)]
    unsafe fn with_sign(x: __m512i, s: __mmask64) -> __m512i {
        _mm512_mask_sub_epi8(x, s, _mm512_setzero_si512(), x)
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn bf16_half(p: *const u8, odd: bool) -> __m512 {
        let pairs = _mm512_loadu_si512(p as *const _);
        _mm512_castsi512_ps(if odd {
            _mm512_and_si512(pairs, _mm512_set1_epi32(-65536))
        } else {
            _mm512_slli_epi32::<16>(pairs)
        })
    }
    #[inline(always)]
    unsafe fn f16_planes(lo: *const u8, hi: *const u8) -> __m512 {
        let (l, h) = (
            _mm_loadu_si128(lo as *const _),
            _mm_loadu_si128(hi as *const _),
        );
        let halves = _mm256_set_m128i(_mm_unpackhi_epi8(l, h), _mm_unpacklo_epi8(l, h));
        _mm512_cvtph_ps(halves)
    }
    #[inline(always)]
    unsafe fn u8s_i32(p: *const u8) -> __m512i {
        _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn i8s_i32(p: *const u8) -> __m512i {
        _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn pair16(lo: __m512i, hi: __m512i) -> __m512i {
        let low = _mm512_and_si512(lo, _mm512_set1_epi32(0xFFFF));
        _mm512_or_si512(low, _mm512_slli_epi32::<16>(hi))
    }
    #[inline(always)]
    unsafe fn madd16(a: __m512i, b: __m512i) -> __m512i {
        _mm512_madd_epi16(a, b)
    }
    #[inline(always)]
    unsafe fn mullo32(a: __m512i, b: __m512i) -> __m512i {
        _mm512_mullo_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn cvt(a: __m512i) -> __m512 {
        _mm512_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fnmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        _mm512_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn loadf(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl<const EVEX: bool> Width for Ymm<EVEX> {
    type I = __m256i;
    type F = __m256;
    type Sign = __m256i;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p as *const __m256i)
    }
    #[inline(always)]
    unsafe fn bcast4(p: *const i8) -> __m256i {
        _mm256_set1_epi32((p as *const i32).read_unaligned())
    }
    #[inline(always)]
    unsafe fn bytes(v: i8) -> __m256i {
        _mm256_set1_epi8(v)
    }
    #[inline(always)]
    unsafe fn table16(p: *const u8) -> __m256i {
        _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn lookup(table: __m256i, idx: __m256i) -> __m256i {
        _mm256_shuffle_epi8(table, idx)
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        _mm256_and_si256(a, b)
    }
    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        _mm256_or_si256(a, b)
    }
    #[inline(always)]
    unsafe fn xor(a: __m256i, b: __m256i) -> __m256i {
        _mm256_xor_si256(a, b)
    }
    #[inline(always)]
    unsafe fn shr16<const N: u32>(a: __m256i) -> __m256i {
        _mm256_srl_epi16(a, _mm_set_epi64x(0, N as i64))
    }
    #[inline(always)]
    unsafe fn shl16<const N: u32>(a: __m256i) -> __m256i {
        _mm256_sll_epi16(a, _mm_set_epi64x(0, N as i64))
    }
    #[inline(always)]
    unsafe fn shl32<const N: u32>(a: __m256i) -> __m256i {
        _mm256_sll_epi32(a, _mm_set_epi64x(0, N as i64))
    }
    #[inline(always)]
    unsafe fn add32(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn sub32(a: __m256i, b: __m256i) -> __m256i {
        _mm256_sub_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn add16(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi16(a, b)
    }
    #[inline(always)]
    unsafe fn maddubs(w: __m256i, x: __m256i) -> __m256i {
        _mm256_maddubs_epi16(w, x)
    }
    #[inline(always)]
    unsafe fn widen_pairs(p: __m256i) -> __m256i {
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }
    /// An empty `asm!` that takes and gives back `v` in a register and may touch memory. (Plain
    /// `#[inline]`: a function with `target_feature` may not be `inline(always)`; the kernels,
    /// compiled for AVX2, inline it.)
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn pin(v: &mut __m256i) {
        std::arch::asm!(
            "/* {0} */",
            inout(ymm_reg) * v,
            options(nostack, preserves_flags)
        );
    }
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        if EVEX {
            _mm256_dpbusd_epi32(acc, w, x)
        } else {
            _mm256_dpbusd_avx_epi32(acc, w, x)
        }
    }
    #[inline(always)]
    unsafe fn abs8(w: __m256i) -> __m256i {
        _mm256_abs_epi8(w)
    }
    #[inline(always)]
    unsafe fn sign_of(w: __m256i) -> __m256i {
        w
    }
    #[inline(always)]
    unsafe fn with_sign(x: __m256i, s: __m256i) -> __m256i {
        _mm256_sign_epi8(x, s)
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn f16_planes(lo: *const u8, hi: *const u8) -> __m256 {
        let (l, h) = (
            _mm_loadl_epi64(lo as *const _),
            _mm_loadl_epi64(hi as *const _),
        );
        _mm256_cvtph_ps(_mm_unpacklo_epi8(l, h))
    }
    #[inline(always)]
    unsafe fn bf16_half(p: *const u8, odd: bool) -> __m256 {
        let pairs = _mm256_loadu_si256(p as *const __m256i);
        _mm256_castsi256_ps(if odd {
            _mm256_and_si256(pairs, _mm256_set1_epi32(-65536))
        } else {
            _mm256_slli_epi32::<16>(pairs)
        })
    }
    #[inline(always)]
    unsafe fn u8s_i32(p: *const u8) -> __m256i {
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn i8s_i32(p: *const u8) -> __m256i {
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn pair16(lo: __m256i, hi: __m256i) -> __m256i {
        let low = _mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF));
        _mm256_or_si256(low, _mm256_slli_epi32::<16>(hi))
    }
    #[inline(always)]
    unsafe fn madd16(a: __m256i, b: __m256i) -> __m256i {
        _mm256_madd_epi16(a, b)
    }
    #[inline(always)]
    unsafe fn mullo32(a: __m256i, b: __m256i) -> __m256i {
        _mm256_mullo_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn cvt(a: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fnmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn loadf(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
}
