//! Which implementation of the kernels runs: the best the CPU has, found at run time, or a simpler
//! one forced with `PLD_KERNEL`.

use std::sync::OnceLock;

/// Which implementation of the quantized dot products runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512Vnni,
}

impl Isa {
    /// The best this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let base = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if base
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
            {
                return Isa::Avx512Vnni;
            }
            if base {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Every implementation this CPU can run (for tests).
    pub fn available() -> Vec<Isa> {
        let best = Isa::detect();
        [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni]
            .into_iter()
            .filter(|i| match i {
                Isa::Scalar => true,
                Isa::Avx2 => best != Isa::Scalar,
                Isa::Avx512Vnni => best == Isa::Avx512Vnni,
            })
            .collect()
    }
}

/// The implementation in use: the best the CPU has, or `PLD_KERNEL=scalar|avx2` to force one.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = Isa::detect();
        match std::env::var("PLD_KERNEL").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") if best != Isa::Scalar => Isa::Avx2,
            _ => best,
        }
    })
}

pub(super) fn has_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| isa() != Isa::Scalar)
}
