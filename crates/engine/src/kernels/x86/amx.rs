//! The packed products on AMX tiles (Intel Sapphire Rapids and later), for passes over many
//! activation rows.
//!
//! A tile multiply-add (`tdpbsud`: signed activations by unsigned weights; `tdpbssd`: both
//! signed) takes sixteen activation rows (tile A) against sixteen weight rows (tile B, four
//! consecutive columns of each weight row per 64-byte tile row: a step of the interleaved layout
//! of `kernels::packed`) and adds their 16 x 16 dot products over up to 64 columns into 32-bit
//! sums (tile C). Every output is bit-identical to the VNNI kernels', because the integers are
//! the same exact sums and the float steps after them are theirs, in their order:
//! - Q4_K and Q6_K: a super-block's integer is the sum over sub-blocks of the scale times the
//!   sub-block's products (Q6_K's values less 32). Each weight times its sub-block's scale fits
//!   in 16 bits, so per call the unit's weights are unpacked scaled and split into a low byte
//!   (unsigned) and a high byte (signed): two tile products over all 256 columns, low plus 256
//!   times high, give that integer directly (`unpack_kquant`, `kquant_unit`). Q4_K's minimums
//!   and both formats' float scales then follow as in `packed_q4k` / `packed_q6k`.
//! - The 32-column formats: one tile product per block of 32 (each block has its own float
//!   scales), plus the format's integer offset, then the scales as in `packed32`. The 4-bit
//!   values (Q5_0's fifth bits, MXFP4's looked-up values) are unpacked per call; Q8_0's packed
//!   bytes are tile rows already.
//!
//! Weights come from the packed copy (no second copy is kept), unpacked one unit of a group at a
//! time into a small scratch that every tile of activation rows then reads. Activations are read
//! in tile order (`QuantizedActs::tile`: sixteen rows' 64 bytes in a row), as rows `k` bytes
//! apart would fall on a few cache sets.
//!
//! Tiles need, on Linux, the process's permission for the tile data state (`arch_prctl`, asked
//! once in `permission`), and a tile configuration in each thread that runs them: every kernel
//! call loads its own and releases the tiles when it returns, so the pool's threads hold no tile
//! state between products.

// Tiles and sums are indexed by row and sub-block, as in the VNNI kernels.
#![allow(clippy::needless_range_loop)]

use super::packed::{q5_high, q6_values, FAR_BYTES, MXFP4_TABLE};
use super::width::{Width, Zmm};
use crate::kernels::format::{q4_1, q4k, q5_0, q6k, Format, PACKED_D};
use crate::kernels::packed::{Packed, ROWS};
use crate::kernels::quant::{QuantizedActs, OFFSET_MXFP4, OFFSET_Q4_0, OFFSET_Q5_0, OFFSET_Q8_0};
use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Activation rows per tile (and weight rows: a packed group).
pub(crate) const TILE_ROWS: usize = 16;

/// Whether this process may use AMX int8 tiles: the CPU has them and, on Linux, the kernel
/// granted the tile data state. The reason why not otherwise. Asked once.
pub(crate) fn permission() -> Result<(), &'static str> {
    static PERMISSION: OnceLock<Result<(), &'static str>> = OnceLock::new();
    *PERMISSION.get_or_init(|| {
        // SAFETY: CPUID leaf 7 exists on every x86-64 CPU with AVX-512, which `Isa::Amx` also
        // requires; on older ones it reads as zeros (no AMX).
        #[allow(unused_unsafe)]
        let leaf7 = unsafe { __cpuid_count(7, 0) };
        let (tile, int8) = ((leaf7.edx >> 24) & 1 == 1, (leaf7.edx >> 25) & 1 == 1);
        if !(tile && int8) {
            return Err("the CPU has no AMX-INT8");
        }
        request_tile_data()
    })
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: without it the first tile instruction
/// of the process faults.
#[cfg(target_os = "linux")]
fn request_tile_data() -> Result<(), &'static str> {
    const SYS_ARCH_PRCTL: isize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let ret: isize;
    // SAFETY: the system call only changes this process's permitted extended states; it reads and
    // writes no memory of ours. `syscall` clobbers rcx and r11, declared here.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    if ret == 0 {
        Ok(())
    } else {
        Err("the kernel refused the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM)")
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> Result<(), &'static str> {
    Err("AMX is only enabled on Linux")
}

/// A tile configuration (`ldtilecfg`'s 64 bytes, palette 1): tmm0 and tmm3 hold activation tiles
/// (16 rows of `k` bytes), tmm1, tmm4, tmm6 and tmm7 weight tiles (`k / 4` rows of 64 bytes),
/// tmm2 and tmm5 16 x 16 sums. With `k` = 64 every tile is 16 rows of 64 bytes, as the K-quants'
/// products (`kquant_unit`) and attention's (`amx_attention`) take them.
#[repr(C, align(64))]
pub(super) struct Config([u8; 64]);

impl Config {
    pub(super) const fn new(k: usize) -> Config {
        let mut c = [0u8; 64];
        c[0] = 1;
        let shapes = [(16, k), (k / 4, 64), (16, 64)];
        let mut t = 0;
        while t < 8 {
            let (rows, bytes) = shapes[if t < 6 { t % 3 } else { 1 }];
            let le = (bytes as u16).to_le_bytes();
            (c[16 + 2 * t], c[17 + 2 * t]) = (le[0], le[1]);
            c[48 + t] = rows as u8;
            t += 1;
        }
        Config(c)
    }
}

/// Loads `cfg` into this thread's tile configuration (zeroing the tiles).
///
/// # Safety
/// The process has tile permission (`permission`) and the CPU AMX.
#[inline(always)]
pub(super) unsafe fn load_config(cfg: &Config) {
    asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
}

/// Releases this thread's tiles (back to the init state, so a context switch saves none).
#[inline(always)]
pub(super) unsafe fn release() {
    asm!("tilerelease", options(nostack, nomem));
}

/// Two tile products: `c0 = a0 x b0` and `c1 = a1 x b1`, each the 16 x 16 dot products over the
/// configured K of 16 signed activation rows (`stride` bytes apart) and 16 unsigned weight rows
/// (`k / 4` tile rows of 64 bytes), stored as 16 rows of 16 `i32`.
///
/// # Safety
/// A configuration is loaded; every tile row read and written lies inside its buffer.
#[inline(always)]
unsafe fn dot_pair(
    a0: *const i8,
    a1: *const i8,
    stride: usize,
    b0: *const u8,
    b1: *const u8,
    c0: *mut i32,
    c1: *mut i32,
) {
    asm!(
        "tileloadd tmm0, [{a0} + {sa}*1]",
        "tileloadd tmm1, [{b0} + {sb}*1]",
        "tileloadd tmm3, [{a1} + {sa}*1]",
        "tileloadd tmm4, [{b1} + {sb}*1]",
        "tilezero tmm2",
        "tilezero tmm5",
        "tdpbsud tmm2, tmm0, tmm1",
        "tdpbsud tmm5, tmm3, tmm4",
        "tilestored [{c0} + {sb}*1], tmm2",
        "tilestored [{c1} + {sb}*1], tmm5",
        a0 = in(reg) a0,
        a1 = in(reg) a1,
        b0 = in(reg) b0,
        b1 = in(reg) b1,
        c0 = in(reg) c0,
        c1 = in(reg) c1,
        sa = in(reg) stride,
        sb = in(reg) 64usize,
        options(nostack),
    );
}

/// 64-byte aligned scratch.
#[repr(C, align(64))]
struct Aligned<T>(T);

/// A call's scratch: one unit's weights of a group as tile rows (the K-quants': 64 rows of low
/// bytes then 64 of high bytes, `unpack_kquant`; the 32-column formats': two blocks of 8 rows),
/// and two tiles of activation rows' 32-bit sums (the K-quants' low and high products, or the two
/// blocks).
struct Scratch {
    w: Aligned<[u8; 8192]>,
    sums: Aligned<[Sums; 2]>,
}

/// One tile of activation rows' sums: `[product][row][lane]`.
type Sums = [[[i32; 16]; 16]; 2];

/// Where the high bytes start in `Scratch::w`.
const HIGH: usize = 4096;

/// Unpacks a step of eight columns (`v`: low nibbles the first four, high the next) to two tile
/// rows at `out`.
#[inline(always)]
unsafe fn put_nibbles(v: __m512i, lo_bits: __m512i, hi_bits: __m512i, out: *mut u8) {
    let low = Zmm::bytes(0x0F);
    let lo = Zmm::or(Zmm::and(v, low), lo_bits);
    let hi = Zmm::or(Zmm::and(Zmm::shr16::<4>(v), low), hi_bits);
    Zmm::store(out as *mut f32, _mm512_castsi512_ps(lo));
    Zmm::store(out.add(64) as *mut f32, _mm512_castsi512_ps(hi));
}

/// A 32-column unit's two blocks as tile rows in column order (`out`: four columns of each
/// weight row per 64 bytes), the values the VNNI kernels multiply.
#[inline(always)]
unsafe fn unpack32(format: Format, blk: *const u8, out: *mut u8) {
    let zero = Zmm::zero();
    let values = format.packed_values();
    let table = Zmm::table16(MXFP4_TABLE.as_ptr());
    for h in 0..2 {
        let high = if format == Format::Q5_0 {
            Zmm::load(blk.add(q5_0::PACKED_QH + 64 * h))
        } else {
            zero
        };
        for u in 0..4 {
            let v = Zmm::load(blk.add(values + 256 * h + 64 * u));
            let o = out.add(512 * h + 128 * u);
            if format == Format::Mxfp4 {
                let low = Zmm::bytes(0x0F);
                let lo = Zmm::lookup(table, Zmm::and(v, low));
                let hi = Zmm::lookup(table, Zmm::and(Zmm::shr16::<4>(v), low));
                Zmm::store(o as *mut f32, _mm512_castsi512_ps(lo));
                Zmm::store(o.add(64) as *mut f32, _mm512_castsi512_ps(hi));
            } else if format == Format::Q5_0 {
                let (b0, b1) = (2 * u as u32, 2 * u as u32 + 1);
                put_nibbles(v, q5_high::<Zmm>(high, b0), q5_high::<Zmm>(high, b1), o);
            } else {
                put_nibbles(v, zero, zero, o);
            }
        }
    }
}

/// Tile row `row` of a K-quant unit: four columns `x` of each weight row (bytes: unsigned, or
/// with `SIGNED` signed) times the row's sub-block scale `sc16` (in both 16-bit halves of each
/// lane), each product (within +-2^15) split into its low byte (unsigned, at `w`) and the rest
/// (signed, at `w + HIGH`): the product is the low byte plus 256 times the high.
#[inline(always)]
unsafe fn put_scaled<const SIGNED: bool>(x: __m512i, sc16: __m512i, row: usize, w: *mut u8) {
    const ODD_BYTES: u64 = 0xAAAA_AAAA_AAAA_AAAA;
    let (even, odd) = if SIGNED {
        let even = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(x));
        (even, _mm512_srai_epi16::<8>(x))
    } else {
        let even = _mm512_and_si512(x, _mm512_set1_epi16(0xFF));
        (even, _mm512_srli_epi16::<8>(x))
    };
    let (pe, po) = (
        _mm512_mullo_epi16(even, sc16),
        _mm512_mullo_epi16(odd, sc16),
    );
    let lo = _mm512_mask_blend_epi8(ODD_BYTES, pe, _mm512_slli_epi16::<8>(po));
    let hi = _mm512_mask_blend_epi8(ODD_BYTES, _mm512_srli_epi16::<8>(pe), po);
    _mm512_store_si512(w.add(64 * row) as *mut _, lo);
    _mm512_store_si512(w.add(HIGH + 64 * row) as *mut _, hi);
}

/// A Q4_K or Q6_K unit (256 columns) as 64 tile rows of low bytes and 64 of high bytes (see
/// `put_scaled`) of each weight times its sub-block's scale (Q6_K's weights less 32 first). The
/// tile products over all 256 columns then give each pair of rows the integer the VNNI kernels
/// build sub-block by sub-block: the sum of the scales times the sub-blocks' products (Q6_K's
/// with the offset of 32 included).
#[inline(always)]
unsafe fn unpack_kquant(format: Format, blk: *const u8, w: *mut u8) {
    let low = Zmm::bytes(0x0F);
    if format == Format::Q4K {
        for j in 0..8 {
            let sc = Zmm::u8s_i32(blk.add(q4k::PACKED_SCALES + 16 * j));
            let sc16 = Zmm::pair16(sc, sc);
            for u in 0..4 {
                let step = 4 * j + u;
                let v = Zmm::load(blk.add(q4k::PACKED_QS + 64 * step));
                put_scaled::<false>(Zmm::and(v, low), sc16, 2 * step, w);
                put_scaled::<false>(Zmm::and(Zmm::shr16::<4>(v), low), sc16, 2 * step + 1, w);
            }
        }
        return;
    }
    let m32 = Zmm::bytes(32);
    for t in 0..16 {
        let h = Zmm::load(blk.add(q6k::PACKED_QH + 64 * t));
        let ql = blk.add(q6k::PACKED_QL + 128 * t);
        let sc = Zmm::i8s_i32(blk.add(q6k::PACKED_SCALES + 16 * t));
        let sc16 = Zmm::pair16(sc, sc);
        for u in 0..2 {
            let (lo, hi) = q6_values::<Zmm>(Zmm::load(ql.add(64 * u)), h, u);
            put_scaled::<true>(_mm512_sub_epi8(lo, m32), sc16, 4 * t + 2 * u, w);
            put_scaled::<true>(_mm512_sub_epi8(hi, m32), sc16, 4 * t + 2 * u + 1, w);
        }
    }
}

/// A K-quant unit's tile products for sixteen activation rows at `a` (in tile order: four tiles
/// of 16 rows of 64 bytes, 1 KB apart): over its 256 columns in four steps of 64, the products
/// with the low bytes (`tdpbsud`) to `c[0..256]` and with the high bytes (`tdpbssd`) to
/// `c[256..512]`, as 16 rows of 16 `i32`.
///
/// # Safety
/// A configuration of 16 x 64-byte tiles is loaded; the 4096 bytes at `a`, the 8192 at `w` and
/// the 2048 at `c` are valid.
#[inline(always)]
unsafe fn kquant_unit(a: *const i8, w: *const u8, c: *mut i32) {
    asm!(
        "tilezero tmm4",
        "tilezero tmm5",
        "tileloadd tmm0, [{a} + {sb}*1]",
        "tileloadd tmm1, [{w} + {sb}*1]",
        "tileloadd tmm2, [{w} + {sb}*1 + 4096]",
        "tdpbsud tmm4, tmm0, tmm1",
        "tdpbssd tmm5, tmm0, tmm2",
        "tileloadd tmm3, [{a} + {sb}*1 + 1024]",
        "tileloadd tmm6, [{w} + {sb}*1 + 1024]",
        "tileloadd tmm7, [{w} + {sb}*1 + 5120]",
        "tdpbsud tmm4, tmm3, tmm6",
        "tdpbssd tmm5, tmm3, tmm7",
        "tileloadd tmm0, [{a} + {sb}*1 + 2048]",
        "tileloadd tmm1, [{w} + {sb}*1 + 2048]",
        "tileloadd tmm2, [{w} + {sb}*1 + 6144]",
        "tdpbsud tmm4, tmm0, tmm1",
        "tdpbssd tmm5, tmm0, tmm2",
        "tileloadd tmm3, [{a} + {sb}*1 + 3072]",
        "tileloadd tmm6, [{w} + {sb}*1 + 3072]",
        "tileloadd tmm7, [{w} + {sb}*1 + 7168]",
        "tdpbsud tmm4, tmm3, tmm6",
        "tdpbssd tmm5, tmm3, tmm7",
        "tilestored [{c} + {sb}*1], tmm4",
        "tilestored [{c} + {sb}*1 + 1024], tmm5",
        a = in(reg) a,
        w = in(reg) w,
        c = in(reg) c,
        sb = in(reg) 64usize,
        options(nostack),
    );
}

/// `kquant_unit` for two tiles of activation rows, at `a0` and `a1`: each step's weight tiles
/// serve both, and the four sums are independent. The first tile's products go to
/// `c[0..512]`, the second's to `c[512..1024]`.
///
/// # Safety
/// As `kquant_unit`, with 4096 bytes valid at `a0` and at `a1` and 4096 at `c`.
#[inline(always)]
unsafe fn kquant_pair(a0: *const i8, a1: *const i8, w: *const u8, c: *mut i32) {
    macro_rules! step {
        ($a:literal, $lo:literal, $hi:literal) => {
            concat!(
                "tileloadd tmm0, [{a0} + {sb}*1 + ",
                $a,
                "]\n",
                "tileloadd tmm1, [{a1} + {sb}*1 + ",
                $a,
                "]\n",
                "tileloadd tmm2, [{w} + {sb}*1 + ",
                $lo,
                "]\n",
                "tileloadd tmm3, [{w} + {sb}*1 + ",
                $hi,
                "]\n",
                "tdpbsud tmm4, tmm0, tmm2\n",
                "tdpbssd tmm5, tmm0, tmm3\n",
                "tdpbsud tmm6, tmm1, tmm2\n",
                "tdpbssd tmm7, tmm1, tmm3",
            )
        };
    }
    asm!(
        "tilezero tmm4",
        "tilezero tmm5",
        "tilezero tmm6",
        "tilezero tmm7",
        step!("0", "0", "4096"),
        step!("1024", "1024", "5120"),
        step!("2048", "2048", "6144"),
        step!("3072", "3072", "7168"),
        "tilestored [{c} + {sb}*1], tmm4",
        "tilestored [{c} + {sb}*1 + 1024], tmm5",
        "tilestored [{c} + {sb}*1 + 2048], tmm6",
        "tilestored [{c} + {sb}*1 + 3072], tmm7",
        a0 = in(reg) a0,
        a1 = in(reg) a1,
        w = in(reg) w,
        c = in(reg) c,
        sb = in(reg) 64usize,
        options(nostack),
    );
}

/// What one call computes: groups of `p` against activation rows `r0..r0 + m`, each row's
/// float sums of a group in `acc` (16 per row) until the group is done.
struct Job<'a> {
    p: &'a Packed,
    acts: &'a QuantizedActs,
    r0: usize,
    m: usize,
    acc: *mut f32,
}

/// Group `g`'s sixteen outputs of every row into `job.acc`, unit by unit: the unit's weights
/// unpacked once, then each tile of sixteen activation rows multiplied and finished.
#[inline(always)]
unsafe fn group(job: &Job, g: usize, scratch: &mut Scratch) {
    let (p, acts) = (job.p, job.acts);
    let format = p.format;
    let kquant = matches!(format, Format::Q4K | Format::Q6K);
    let bytes = format.packed_bytes();
    let cols = format.unit_cols();
    let k = acts.k;
    let group = p.group(g).as_ptr();
    for s in 0..p.units() {
        let blk = group.add(s * bytes);
        // The next unit into L1 and the one `FAR_BYTES` on into L2, as the VNNI kernels do:
        // groups lie one after another, so past the group's last unit this reads the next
        // group's first (or past the matrix: prefetches never fault). Without it the unpacking
        // waited on memory at every unit.
        let next = blk.wrapping_add(bytes);
        for l in 0..bytes.div_ceil(64) {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * l) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(FAR_BYTES + 64 * l) as *const i8);
        }
        let w = scratch.w.0.as_mut_ptr();
        // Q8_0's packed bytes are its tile rows.
        let wrows = match format {
            Format::Q8_0 => blk.add(format.packed_values()),
            Format::Q4K | Format::Q6K => {
                unpack_kquant(format, blk, w);
                w
            }
            _ => {
                unpack32(format, blk, w);
                w
            }
        };
        let tiles = job.m.div_ceil(TILE_ROWS);
        let mut t = 0;
        while t < tiles {
            // The K-quants take two tiles of rows at a time where there are two: four
            // independent sums keep the tile unit busy.
            let n = if kquant && t + 1 < tiles { 2 } else { 1 };
            let r = job.r0 + TILE_ROWS * t;
            // The unit's columns of the tile of rows from r, in tile order.
            let a = acts.tiled.as_ptr().add(r * k + 16 * s * cols);
            let c = scratch.sums.0.as_mut_ptr() as *mut i32;
            if n == 2 {
                kquant_pair(a, a.add(16 * k), wrows, c);
            } else if kquant {
                kquant_unit(a, wrows, c);
            } else {
                dot_pair(a, a.add(32), 64, wrows, wrows.add(512), c, c.add(256));
            }
            for u in 0..n {
                let (r, t) = (r + TILE_ROWS * u, t + u);
                let rows = TILE_ROWS.min(job.m - TILE_ROWS * t);
                let acc = job.acc.add(16 * TILE_ROWS * t);
                let sums = &scratch.sums.0[u];
                match format {
                    Format::Q4K => finish_q4k(acts, blk, s, r, rows, sums, acc),
                    Format::Q6K => finish_q6k(acts, blk, s, r, rows, sums, acc),
                    _ => finish32(format, acts, blk, s, r, rows, sums, acc),
                }
            }
            t += n;
        }
    }
}

/// A K-quant unit's integer for row `i` of the tile: the low bytes' products plus 256 times the
/// high bytes'.
#[inline(always)]
unsafe fn kquant_sum(sums: &Sums, i: usize) -> __m512i {
    let lo = Zmm::load(sums[0][i].as_ptr() as *const u8);
    let hi = Zmm::load(sums[1][i].as_ptr() as *const u8);
    Zmm::add32(lo, Zmm::shl32::<8>(hi))
}

/// Q4_K's unit for `rows` activation rows from `r`: as `packed_q4k` with VNNI, the sub-blocks'
/// scaled sums (here from the tiles), the minimums times the activation sums, then `d` and `dmin`
/// times the activation scale into each row's float sums at `acc`.
#[inline(always)]
unsafe fn finish_q4k(
    acts: &QuantizedActs,
    blk: *const u8,
    s: usize,
    r: usize,
    rows: usize,
    sums: &Sums,
    acc: *mut f32,
) {
    let k = acts.k;
    let mins = blk.add(q4k::PACKED_MINS);
    let mn: [__m512i; 4] = std::array::from_fn(|i| {
        Zmm::pair16(
            Zmm::u8s_i32(mins.add(32 * i)),
            Zmm::u8s_i32(mins.add(32 * i + 16)),
        )
    });
    let d = Zmm::f16s(blk.add(PACKED_D));
    let dmin = Zmm::f16s(blk.add(q4k::PACKED_DMIN));
    for i in 0..rows {
        let scaled = kquant_sum(sums, i);
        let sums16 = acts.isums.as_ptr().add(((r + i) * k + s * 256) / 32) as *const i8;
        let mut m = Zmm::madd16(mn[0], Zmm::bcast4(sums16));
        for q in 1..4 {
            m = Zmm::add32(m, Zmm::madd16(mn[q], Zmm::bcast4(sums16.add(4 * q))));
        }
        let dx = Zmm::splat(*acts.d.get_unchecked((r + i) * k / 256 + s));
        let o = acc.add(16 * i);
        let mut a = Zmm::loadf(o);
        a = Zmm::fmadd(Zmm::cvt(scaled), Zmm::mul(d, dx), a);
        a = Zmm::fnmadd(Zmm::cvt(m), Zmm::mul(dmin, dx), a);
        Zmm::store(o, a);
    }
}

/// Q6_K's unit: as `packed_q6k` with VNNI, the scaled sums (offsets included, here from the
/// tiles), then `d` times the activation scale.
#[inline(always)]
unsafe fn finish_q6k(
    acts: &QuantizedActs,
    blk: *const u8,
    s: usize,
    r: usize,
    rows: usize,
    sums: &Sums,
    acc: *mut f32,
) {
    let k = acts.k;
    let d = Zmm::f16s(blk.add(PACKED_D));
    for i in 0..rows {
        let dx = Zmm::splat(*acts.d.get_unchecked((r + i) * k / 256 + s));
        let o = acc.add(16 * i);
        let a = Zmm::fmadd(
            Zmm::cvt(kquant_sum(sums, i)),
            Zmm::mul(d, dx),
            Zmm::loadf(o),
        );
        Zmm::store(o, a);
    }
}

/// A unit of a 32-column format: as `packed32` with VNNI, per block the sums plus the format's
/// integer offset, times the weight and activation scales; Q4_1 then its minimum times the
/// activation block's scaled sum.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn finish32(
    format: Format,
    acts: &QuantizedActs,
    blk: *const u8,
    s: usize,
    r: usize,
    rows: usize,
    sums: &Sums,
    acc: *mut f32,
) {
    let k = acts.k;
    let offset = match format {
        Format::Q4_0 => Some(OFFSET_Q4_0),
        Format::Q5_0 => Some(OFFSET_Q5_0),
        Format::Mxfp4 => Some(OFFSET_MXFP4),
        Format::Q8_0 => Some(OFFSET_Q8_0),
        _ => None,
    };
    let dw: [__m512; 2] = std::array::from_fn(|h| {
        if format == Format::Mxfp4 {
            Zmm::loadf(blk.add(PACKED_D + 64 * h) as *const f32)
        } else {
            Zmm::f16s(blk.add(PACKED_D + 32 * h))
        }
    });
    for i in 0..rows {
        let o = acc.add(16 * i);
        let mut a = Zmm::loadf(o);
        for h in 0..2 {
            let bi = ((r + i) * k + 64 * s + 32 * h) / 32;
            let mut sum = Zmm::load(sums[h][i].as_ptr() as *const u8);
            if let Some(off) = offset {
                let at = (acts.offsets32.as_ptr().add(bi) as *const i32).add(off);
                sum = Zmm::add32(Zmm::bcast4(at as *const i8), sum);
            }
            let scale = Zmm::mul(dw[h], Zmm::splat(*acts.d.get_unchecked(bi)));
            a = Zmm::fmadd(Zmm::cvt(sum), scale, a);
            if format == Format::Q4_1 {
                let min = Zmm::f16s(blk.add(q4_1::PACKED_M + 32 * h));
                a = Zmm::fmadd(min, Zmm::splat(*acts.ds.get_unchecked(bi)), a);
            }
        }
        Zmm::store(o, a);
    }
}

/// Groups `g0..g1` (rows `16g..16g + 16`) of the packed matrix `p` against activation rows
/// `r0..r0 + m` on AMX tiles: row `r0 + r`'s outputs of group `g` go to
/// `out[r * stride + 16g..][..16]`. The same results, bit for bit, as `packed_rows_vnni`.
///
/// # Safety
/// The CPU must have AMX-INT8 and AVX-512 F, VL, BW and VNNI (and AVX2, FMA, F16C), and this
/// process the tile permission (`permission` returned `Ok`); `acts` holds rows `r0..r0 + m`
/// quantized over `p.cols` columns in the blocks the format wants, its integers also in tile
/// order (`QuantizedActs::tile`) and `r0` a multiple of 16; `out` is valid for writes of
/// `(m - 1) * stride + 16 * g1` floats.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) unsafe fn packed_rows_amx(
    p: &Packed,
    g0: usize,
    g1: usize,
    acts: &QuantizedActs,
    r0: usize,
    m: usize,
    out: *mut f32,
    stride: usize,
) {
    if m == 0 || g0 >= g1 {
        return;
    }
    // The K-quants' products span 64 columns (four to a unit), the others' a block of 32.
    let k = if matches!(p.format, Format::Q4K | Format::Q6K) {
        64
    } else {
        32
    };
    let mut acc = vec![0f32; 16 * m.next_multiple_of(TILE_ROWS)];
    let job = Job {
        p,
        acts,
        r0,
        m,
        acc: acc.as_mut_ptr(),
    };
    let mut scratch = Scratch {
        w: Aligned([0u8; 8192]),
        sums: Aligned([[[[0i32; 16]; 16]; 2]; 2]),
    };
    load_config(&Config::new(k));
    for g in g0..g1 {
        group(&job, g, &mut scratch);
        // Each row's sixteen outputs of the group, and its sums back to zero for the next.
        for (i, a) in acc.chunks_exact_mut(16).take(m).enumerate() {
            std::ptr::copy_nonoverlapping(a.as_ptr(), out.add(i * stride + ROWS * g), 16);
            a.fill(0.0);
        }
    }
    release();
}

/// The AMX int8 peak of one core: a register-resident loop of `tdpbssd` on full tiles (16 x 16
/// sums over 64 bytes), four independent sums so that it is bound by throughput. Returns the
/// multiply-adds it did.
///
/// # Safety
/// The CPU must have AMX-INT8 and this process the tile permission.
pub(crate) unsafe fn peak_amx(iters: usize) -> u64 {
    let n = iters.max(1);
    let cfg = Config::new(64);
    let zeros = Aligned([0u8; 1024]);
    load_config(&cfg);
    asm!(
        "tileloadd tmm0, [{a} + {s}*1]",
        "tileloadd tmm1, [{a} + {s}*1]",
        "tilezero tmm2",
        "tilezero tmm3",
        "tilezero tmm4",
        "tilezero tmm5",
        "2:",
        "tdpbssd tmm2, tmm0, tmm1",
        "tdpbssd tmm3, tmm0, tmm1",
        "tdpbssd tmm4, tmm0, tmm1",
        "tdpbssd tmm5, tmm0, tmm1",
        "dec {n}",
        "jnz 2b",
        a = in(reg) zeros.0.as_ptr(),
        s = in(reg) 64usize,
        n = inout(reg) n => _,
        options(nostack, readonly),
    );
    release();
    (n * 4 * 16 * 16 * 64) as u64
}
