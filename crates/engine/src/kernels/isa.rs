//! Which implementation of the kernels runs: the best the CPU has, found at run time, or a simpler
//! one forced with `PLD_KERNEL`.

use std::sync::OnceLock;

/// Which implementation of the quantized dot products runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    /// AVX-512 F, VL and BW without VNNI: the packed products and the AVX-512 attention, with
    /// `vpmaddubsw` + `vpmaddwd` where VNNI has `vpdpbusd`.
    Avx512,
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
            {
                return if is_x86_feature_detected!("avx512vnni") {
                    Isa::Avx512Vnni
                } else {
                    Isa::Avx512
                };
            }
            if base {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Whether this CPU can run the kernels of `self`.
    pub fn is_available(self) -> bool {
        let best = best();
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => best != Isa::Scalar,
            Isa::Avx512 => best.avx512(),
            Isa::Avx512Vnni => best == Isa::Avx512Vnni,
        }
    }

    /// Whether the kernels of `self` use AVX-512: the packed (interleaved) weight layout and the
    /// AVX-512 attention.
    pub fn avx512(self) -> bool {
        matches!(self, Isa::Avx512 | Isa::Avx512Vnni)
    }

    /// Every implementation this CPU can run (for tests).
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni]
            .into_iter()
            .filter(|i| i.is_available())
            .collect()
    }
}

/// `Isa::detect`, once.
fn best() -> Isa {
    static BEST: OnceLock<Isa> = OnceLock::new();
    *BEST.get_or_init(Isa::detect)
}

/// Panics unless this CPU can run the kernels of `isa`. Every safe function that takes a chosen
/// implementation calls this before any of its SIMD code can run: that code is only sound on a CPU
/// with the instructions it was compiled for.
pub(super) fn assert_available(isa: Isa) {
    assert!(
        isa.is_available(),
        "this CPU cannot run the {isa:?} kernels"
    );
}

/// The implementation in use: the best the CPU has, or `PLD_KERNEL=scalar|avx2|avx512` to force a
/// simpler one (`avx512`: no VNNI).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = best();
        match std::env::var("PLD_KERNEL").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") if best != Isa::Scalar => Isa::Avx2,
            Ok("avx512") if best.avx512() => Isa::Avx512,
            _ => best,
        }
    })
}

/// Whether the float loops (`dot`, `softmax`, `swiglu`) take their AVX2 versions: whenever the
/// implementation in use is not the plain one.
pub(super) fn has_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| isa() != Isa::Scalar)
}
