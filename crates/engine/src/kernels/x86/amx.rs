//! The packed products on AMX tiles (Intel Sapphire Rapids and later), for passes over many
//! activation rows.
//!
//! A tile multiply-add `tdpbsud` takes sixteen activation rows (signed bytes, tile A) against
//! sixteen weight rows (unsigned bytes, tile B, four consecutive columns of each weight row per
//! 64-byte tile row: exactly a step of the interleaved layout of `kernels::packed`) and adds the
//! 16 x 16 dot products over K columns into 32-bit sums (tile C). Each product here spans one
//! block or sub-block of the format (K = 32, or 16 for Q6_K), so that the tile holds, for every
//! pair of rows, the same exact integer sum the VNNI kernels build with `vpdpbusd`. The sums are
//! stored and finished on 512-bit registers with the VNNI kernels' own integer and float steps
//! in their order (offsets, sub-block scales, minimums, then the float scales), so every output
//! is bit-identical to theirs.
//!
//! Weights come from the packed copy: the 4-bit formats' nibbles (and Q5_0's and Q6_K's high
//! bits, MXFP4's values) are unpacked per call, one unit of a group at a time, into a small
//! scratch of tile rows, which every tile of activation rows then reads; Q8_0's packed bytes are
//! tile rows already. Activation tiles are read in place from `QuantizedActs`, whose integers are
//! padded to whole tiles of sixteen rows.
//!
//! Tiles need, on Linux, the process's permission for the tile data state (`arch_prctl`, asked
//! once in `permission`), and a tile configuration in each thread that runs them: every kernel
//! call loads its own and releases the tiles when it returns, so the pool's threads hold no tile
//! state between products.

// Tiles and sums are indexed by row and sub-block, as in the VNNI kernels.
#![allow(clippy::needless_range_loop)]

use super::packed::{q5_high, q6_high, MXFP4_TABLE};
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
/// (16 rows of `k` bytes), tmm1 and tmm4 weight tiles (`k / 4` rows of 64 bytes), tmm2 and tmm5
/// their 16 x 16 sums.
#[repr(C, align(64))]
struct Config([u8; 64]);

impl Config {
    fn new(k: usize) -> Config {
        let mut c = [0u8; 64];
        c[0] = 1;
        let shapes = [(16, k), (k / 4, 64), (16, 64)];
        for t in 0..6 {
            let (rows, bytes) = shapes[t % 3];
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&(bytes as u16).to_le_bytes());
            c[48 + t] = rows as u8;
        }
        Config(c)
    }
}

/// Loads `cfg` into this thread's tile configuration (zeroing the tiles).
///
/// # Safety
/// The process has tile permission (`permission`) and the CPU AMX.
#[inline(always)]
unsafe fn load_config(cfg: &Config) {
    asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
}

/// Releases this thread's tiles (back to the init state, so a context switch saves none).
#[inline(always)]
unsafe fn release() {
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

/// One unit's weights of a group as tile rows: 256 columns of 16 rows (two 32-column blocks use
/// the first quarter).
type WeightRows = Aligned<[u8; 4096]>;

/// The sums of every sub-block of a unit for one tile of activation rows: `[sub-block][row][lane]`.
type UnitSums = Aligned<[[[i32; 16]; 16]; 16]>;

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

/// Unit `blk`'s weights as tile rows in column order (`out`: four columns of each weight row per
/// 64 bytes), the values the VNNI kernels multiply.
#[inline(always)]
unsafe fn unpack_unit(format: Format, blk: *const u8, out: *mut u8) {
    let zero = Zmm::zero();
    match format {
        Format::Q4K => {
            for step in 0..32 {
                let v = Zmm::load(blk.add(q4k::PACKED_QS + 64 * step));
                put_nibbles(v, zero, zero, out.add(128 * step));
            }
        }
        Format::Q6K => {
            for t in 0..16 {
                let h = Zmm::load(blk.add(q6k::PACKED_QH + 64 * t));
                let ql = blk.add(q6k::PACKED_QL + 128 * t);
                let o = out.add(256 * t);
                put_nibbles(Zmm::load(ql), q6_high::<Zmm, 0>(h), q6_high::<Zmm, 1>(h), o);
                let v = Zmm::load(ql.add(64));
                put_nibbles(v, q6_high::<Zmm, 2>(h), q6_high::<Zmm, 3>(h), o.add(128));
            }
        }
        Format::Q8_0 => unreachable!("Q8_0's packed bytes are tile rows"),
        _ => {
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
    }
}

/// What one call computes: groups `g0..g1` of `p` against activation rows `r0..r0 + m`, row
/// `r0 + r`'s outputs at `out + r * stride` (column 0).
struct Job<'a> {
    p: &'a Packed,
    acts: &'a QuantizedActs,
    r0: usize,
    m: usize,
    out: *mut f32,
    stride: usize,
}

/// Group `g`'s sixteen outputs of every row, unit by unit: the unit's weights unpacked once, then
/// each tile of sixteen activation rows multiplied and finished; each row's float sums wait in
/// `out` between units.
#[inline(always)]
unsafe fn group(job: &Job, g: usize, w: &mut WeightRows, sums: &mut UnitSums) {
    let (p, acts) = (job.p, job.acts);
    let format = p.format;
    let bytes = format.packed_bytes();
    let cols = format.unit_cols();
    let k = acts.k;
    let group = p.group(g).as_ptr();
    // Columns per tile product: a sub-block (Q6_K's 16, Q4_K's 32) or a block.
    let sub = if format == Format::Q6K { 16 } else { 32 };
    for s in 0..p.units() {
        let blk = group.add(s * bytes);
        let wrows = if format == Format::Q8_0 {
            blk.add(format.packed_values())
        } else {
            unpack_unit(format, blk, w.0.as_mut_ptr());
            w.0.as_ptr()
        };
        for t in 0..job.m.div_ceil(TILE_ROWS) {
            let r = job.r0 + TILE_ROWS * t;
            let a = acts.q.as_ptr().add(r * k + s * cols);
            let c = sums.0.as_mut_ptr() as *mut i32;
            let wstep = sub * 16;
            for j in (0..cols / sub).step_by(2) {
                dot_pair(
                    a.add(sub * j),
                    a.add(sub * (j + 1)),
                    k,
                    wrows.add(wstep * j),
                    wrows.add(wstep * (j + 1)),
                    c.add(256 * j),
                    c.add(256 * (j + 1)),
                );
            }
            let rows = TILE_ROWS.min(job.m - TILE_ROWS * t);
            let out = job.out.add(TILE_ROWS * t * job.stride + ROWS * g);
            let first = s == 0;
            match format {
                Format::Q4K => finish_q4k(acts, blk, s, r, rows, sums, out, job.stride, first),
                Format::Q6K => finish_q6k(acts, blk, s, r, rows, sums, out, job.stride, first),
                _ => finish32(format, acts, blk, s, r, rows, sums, out, job.stride, first),
            }
        }
    }
}

/// Row `r`'s float sums so far: zero at the first unit, else where the last unit left them.
#[inline(always)]
unsafe fn start(out: *mut f32, first: bool) -> __m512 {
    if first {
        Zmm::zero_f()
    } else {
        Zmm::loadf(out)
    }
}

/// Q4_K's unit for `rows` activation rows from `r`: as `packed_q4k` with VNNI, each sub-block's
/// sums times its scale, the minimums times the activation sums, then `d` and `dmin` times the
/// activation scale.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn finish_q4k(
    acts: &QuantizedActs,
    blk: *const u8,
    s: usize,
    r: usize,
    rows: usize,
    sums: &UnitSums,
    out: *mut f32,
    stride: usize,
    first: bool,
) {
    let k = acts.k;
    let sc: [__m512i; 8] =
        std::array::from_fn(|j| Zmm::u8s_i32(blk.add(q4k::PACKED_SCALES + 16 * j)));
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
        let mut scaled = Zmm::zero();
        for j in 0..8 {
            let c = Zmm::load(sums.0[j][i].as_ptr() as *const u8);
            scaled = Zmm::add32(scaled, Zmm::mullo32(c, sc[j]));
        }
        let sums16 = acts.isums.as_ptr().add(((r + i) * k + s * 256) / 32) as *const i8;
        let mut m = Zmm::madd16(mn[0], Zmm::bcast4(sums16));
        for q in 1..4 {
            m = Zmm::add32(m, Zmm::madd16(mn[q], Zmm::bcast4(sums16.add(4 * q))));
        }
        let dx = Zmm::splat(*acts.d.get_unchecked((r + i) * k / 256 + s));
        let o = out.add(i * stride);
        let mut acc = start(o, first);
        acc = Zmm::fmadd(Zmm::cvt(scaled), Zmm::mul(d, dx), acc);
        acc = Zmm::fnmadd(Zmm::cvt(m), Zmm::mul(dmin, dx), acc);
        Zmm::store(o, acc);
    }
}

/// Q6_K's unit: as `packed_q6k` with VNNI, each sub-block's sums from -32 times its activation
/// sum, times its scale, then `d` times the activation scale.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn finish_q6k(
    acts: &QuantizedActs,
    blk: *const u8,
    s: usize,
    r: usize,
    rows: usize,
    sums: &UnitSums,
    out: *mut f32,
    stride: usize,
    first: bool,
) {
    let k = acts.k;
    let d = Zmm::f16s(blk.add(PACKED_D));
    for i in 0..rows {
        let offsets = acts.q6k_offsets.as_ptr().add(((r + i) * k + s * 256) / 16);
        let mut scaled = Zmm::zero();
        for t in 0..16 {
            let sc = Zmm::i8s_i32(blk.add(q6k::PACKED_SCALES + 16 * t));
            let c = Zmm::load(sums.0[t][i].as_ptr() as *const u8);
            let total = Zmm::add32(Zmm::bcast4(offsets.add(t) as *const i8), c);
            scaled = Zmm::add32(scaled, Zmm::mullo32(total, sc));
        }
        let dx = Zmm::splat(*acts.d.get_unchecked((r + i) * k / 256 + s));
        let o = out.add(i * stride);
        let acc = Zmm::fmadd(Zmm::cvt(scaled), Zmm::mul(d, dx), start(o, first));
        Zmm::store(o, acc);
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
    sums: &UnitSums,
    out: *mut f32,
    stride: usize,
    first: bool,
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
        let o = out.add(i * stride);
        let mut acc = start(o, first);
        for h in 0..2 {
            let bi = ((r + i) * k + 64 * s + 32 * h) / 32;
            let mut sum = Zmm::load(sums.0[h][i].as_ptr() as *const u8);
            if let Some(off) = offset {
                let at = (acts.offsets32.as_ptr().add(bi) as *const i32).add(off);
                sum = Zmm::add32(Zmm::bcast4(at as *const i8), sum);
            }
            let scale = Zmm::mul(dw[h], Zmm::splat(*acts.d.get_unchecked(bi)));
            acc = Zmm::fmadd(Zmm::cvt(sum), scale, acc);
            if format == Format::Q4_1 {
                let min = Zmm::f16s(blk.add(q4_1::PACKED_M + 32 * h));
                acc = Zmm::fmadd(min, Zmm::splat(*acts.ds.get_unchecked(bi)), acc);
            }
        }
        Zmm::store(o, acc);
    }
}

/// Groups `g0..g1` (rows `16g..16g + 16`) of the packed matrix `p` against activation rows
/// `r0..r0 + m` on AMX tiles: row `r0 + r`'s outputs of group `g` go to
/// `out[r * stride + 16g..][..16]`. The same results, bit for bit, as `packed_rows_vnni`.
///
/// # Safety
/// The CPU must have AMX-INT8 and AVX-512 F, VL, BW and VNNI (and AVX2, FMA, F16C), and this
/// process the tile permission (`permission` returned `Ok`); `acts` holds rows `r0..r0 + m`
/// quantized over `p.cols` columns in the blocks the format wants, with its integers padded so
/// that whole tiles of sixteen rows from `r0` lie inside them; `out` is valid for writes of
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
    let k = if p.format == Format::Q6K { 16 } else { 32 };
    load_config(&Config::new(k));
    let job = Job {
        p,
        acts,
        r0,
        m,
        out,
        stride,
    };
    let mut w = Aligned([0u8; 4096]);
    let mut sums = Aligned([[[0i32; 16]; 16]; 16]);
    for g in g0..g1 {
        group(&job, g, &mut w, &mut sums);
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
