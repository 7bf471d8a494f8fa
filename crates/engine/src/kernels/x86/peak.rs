//! The int8 peak of one core: a register-resident loop of the step the packed kernels build their
//! sums from, eight independent chains so that the loop is bound by throughput, not latency. With
//! VNNI the step is `vpdpbusd` (four u8 x s8 products into each 32-bit sum); without, it is what
//! the kernels do per step, `vpmaddubsw` + `vpaddw` (pairs of products summed in 16 bits; the
//! kernels' one `vpmaddwd` per sub-block that widens them is left out, as it is a small share of
//! their work). Written in assembly so that the compiler can neither hoist the loop-invariant products
//! nor fold the chains. Each function returns the multiply-adds it did.

use std::arch::asm;

/// A loop of `iters` times eight steps of `$bytes` products each.
macro_rules! peak_fn {
    ($name:ident, $features:literal, $class:ident, $bytes:expr, $step:ident) => {
        /// # Safety
        /// The CPU must have the features named in `#[target_feature]`.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(iters: usize) -> u64 {
            let n = iters.max(1);
            // SAFETY: only registers are read and written (the caller promises the features).
            unsafe {
                asm!(
                    "vpxor {a0:x}, {a0:x}, {a0:x}",
                    "vpxor {a1:x}, {a1:x}, {a1:x}",
                    "vpxor {a2:x}, {a2:x}, {a2:x}",
                    "vpxor {a3:x}, {a3:x}, {a3:x}",
                    "vpxor {a4:x}, {a4:x}, {a4:x}",
                    "vpxor {a5:x}, {a5:x}, {a5:x}",
                    "vpxor {a6:x}, {a6:x}, {a6:x}",
                    "vpxor {a7:x}, {a7:x}, {a7:x}",
                    // Bytes of 1 for the weights and activations (and a spare register).
                    "vpcmpeqb {w:x}, {w:x}, {w:x}",
                    "vpxor {t:x}, {t:x}, {t:x}",
                    "vpsrlw {ones:x}, {w:x}, 15",
                    "vpabsb {x:x}, {w:x}",
                    "vpbroadcastw {ones}, {ones:x}",
                    "vpbroadcastb {x}, {x:x}",
                    "vpbroadcastb {w}, {x:x}",
                    "2:",
                    $step!("a0"),
                    $step!("a1"),
                    $step!("a2"),
                    $step!("a3"),
                    $step!("a4"),
                    $step!("a5"),
                    $step!("a6"),
                    $step!("a7"),
                    "dec {n}",
                    "jnz 2b",
                    n = inout(reg) n => _,
                    w = out($class) _,
                    x = out($class) _,
                    ones = out($class) _,
                    t = out($class) _,
                    a0 = out($class) _,
                    a1 = out($class) _,
                    a2 = out($class) _,
                    a3 = out($class) _,
                    a4 = out($class) _,
                    a5 = out($class) _,
                    a6 = out($class) _,
                    a7 = out($class) _,
                    options(nomem, nostack),
                );
            }
            (n * 8 * $bytes) as u64
        }
    };
}

macro_rules! madd_step {
    ($a:literal) => {
        concat!(
            "vpmaddubsw {t}, {w}, {x}\n",
            "vpaddw {",
            $a,
            "}, {",
            $a,
            "}, {t}"
        )
    };
}

macro_rules! dp_step {
    ($a:literal) => {
        concat!("vpdpbusd {", $a, "}, {w}, {x}")
    };
}

/// AVX-VNNI's encoding of the same instruction.
macro_rules! vex_dp_step {
    ($a:literal) => {
        concat!("{{vex}} vpdpbusd {", $a, "}, {w}, {x}")
    };
}

peak_fn!(peak_avx2, "avx2", ymm_reg, 32, madd_step);
peak_fn!(peak_avx_vnni, "avx2,avxvnni", ymm_reg, 32, vex_dp_step);
peak_fn!(
    peak_avx_vnni_evex,
    "avx2,avx512f,avx512vl,avx512vnni",
    ymm_reg,
    32,
    dp_step
);
peak_fn!(peak_avx512, "avx2,avx512f,avx512bw", zmm_reg, 64, madd_step);
peak_fn!(
    peak_avx512_vnni,
    "avx2,avx512f,avx512bw,avx512vnni",
    zmm_reg,
    64,
    dp_step
);

/// The f32 peak of one core for the attention kernels: ten independent chains of
/// `vfmadd231ps` over 256-bit (`ymm_reg`, 8 lanes) or 512-bit (`zmm_reg`, 16 lanes) registers, in
/// assembly for the same reason as the int8 loops. Returns the multiply-adds it did.
macro_rules! fma_peak_fn {
    ($name:ident, $features:literal, $class:ident, $lanes:expr) => {
        /// # Safety
        /// The CPU must have the features named in `#[target_feature]`.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(iters: usize) -> u64 {
            let n = iters.max(1);
            // SAFETY: only registers are read and written (the caller promises the features).
            // The chains start at zero and multiply zeros: no denormals, no overflow.
            unsafe {
                asm!(
                    "vxorps {a0:x}, {a0:x}, {a0:x}",
                    "vxorps {a1:x}, {a1:x}, {a1:x}",
                    "vxorps {a2:x}, {a2:x}, {a2:x}",
                    "vxorps {a3:x}, {a3:x}, {a3:x}",
                    "vxorps {a4:x}, {a4:x}, {a4:x}",
                    "vxorps {a5:x}, {a5:x}, {a5:x}",
                    "vxorps {a6:x}, {a6:x}, {a6:x}",
                    "vxorps {a7:x}, {a7:x}, {a7:x}",
                    "vxorps {a8:x}, {a8:x}, {a8:x}",
                    "vxorps {a9:x}, {a9:x}, {a9:x}",
                    "vxorps {w:x}, {w:x}, {w:x}",
                    "2:",
                    "vfmadd231ps {a0}, {w}, {w}",
                    "vfmadd231ps {a1}, {w}, {w}",
                    "vfmadd231ps {a2}, {w}, {w}",
                    "vfmadd231ps {a3}, {w}, {w}",
                    "vfmadd231ps {a4}, {w}, {w}",
                    "vfmadd231ps {a5}, {w}, {w}",
                    "vfmadd231ps {a6}, {w}, {w}",
                    "vfmadd231ps {a7}, {w}, {w}",
                    "vfmadd231ps {a8}, {w}, {w}",
                    "vfmadd231ps {a9}, {w}, {w}",
                    "dec {n}",
                    "jnz 2b",
                    n = inout(reg) n => _,
                    w = out($class) _,
                    a0 = out($class) _,
                    a1 = out($class) _,
                    a2 = out($class) _,
                    a3 = out($class) _,
                    a4 = out($class) _,
                    a5 = out($class) _,
                    a6 = out($class) _,
                    a7 = out($class) _,
                    a8 = out($class) _,
                    a9 = out($class) _,
                    options(nomem, nostack),
                );
            }
            (n * 10 * $lanes) as u64
        }
    };
}

fma_peak_fn!(fma_peak_avx2, "avx2,fma", ymm_reg, 8);
fma_peak_fn!(fma_peak_avx512, "avx2,fma,avx512f", zmm_reg, 16);
