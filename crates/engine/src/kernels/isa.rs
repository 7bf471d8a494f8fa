//! Which implementation of the kernels runs: the best the CPU has, found at run time, or a simpler
//! one forced with `PLD_KERNEL`.

use std::sync::OnceLock;

/// A kernel class: which implementation of the kernels runs (`Isa::kernels`, its table). Every
/// one but `Scalar` computes products with the packed (interleaved) weight layout. Within a class
/// a row's results never depend on what shares its pass; classes may differ from one another
/// where their tables name an arithmetic of their own (the Amx class's tiles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2, FMA and F16C: the packed products on 256-bit registers with `vpmaddubsw` +
    /// `vpmaddwd`.
    Avx2,
    /// AVX2 with AVX-VNNI's 256-bit `vpdpbusd` (Intel Alder Lake and later client CPUs); also run
    /// on CPUs with AVX-512 VNNI, whose VL encoding of the same instruction it then uses.
    Avx2Vnni,
    /// AVX-512 F, VL and BW without VNNI: the packed products on 512-bit registers and the AVX-512
    /// attention, with `vpmaddubsw` + `vpmaddwd` where VNNI has `vpdpbusd`.
    Avx512,
    Avx512Vnni,
    /// AVX-512 VNNI with AMX int8 tiles (Intel Sapphire Rapids and later): the packed products of
    /// passes over many rows on tiles (`x86/amx.rs`), everything else as `Avx512Vnni`. Only where
    /// the OS grants the tile state (`amx_status`).
    Amx,
}

/// The CPU features the kernels use, read once.
#[derive(Clone, Copy)]
struct Features {
    avx2: bool,
    avx_vnni: bool,
    avx512: bool,
    avx512_vnni: bool,
    amx: bool,
}

fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            let avx512 = avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw");
            Features {
                avx2,
                avx_vnni: avx2 && is_x86_feature_detected!("avxvnni"),
                avx512,
                avx512_vnni: avx512 && is_x86_feature_detected!("avx512vnni"),
                amx: avx512 && is_x86_feature_detected!("avx512vnni") && amx_status().is_ok(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Features {
            avx2: false,
            avx_vnni: false,
            avx512: false,
            avx512_vnni: false,
            amx: false,
        }
    })
}

/// Whether this process can run AMX int8 tiles, or why not: the CPU lacks them, or the OS refused
/// the tile state (on Linux, `arch_prctl`; asked once, the first time this is called).
pub fn amx_status() -> Result<(), &'static str> {
    #[cfg(target_arch = "x86_64")]
    return super::x86::amx_permission();
    #[cfg(not(target_arch = "x86_64"))]
    Err("not an x86-64 CPU")
}

/// Every implementation, simplest first.
const ALL: [Isa; 6] = [
    Isa::Scalar,
    Isa::Avx2,
    Isa::Avx2Vnni,
    Isa::Avx512,
    Isa::Avx512Vnni,
    Isa::Amx,
];

impl Isa {
    /// The best this CPU supports.
    pub fn detect() -> Isa {
        *ALL.iter()
            .rev()
            .find(|i| i.is_available())
            .unwrap_or(&Isa::Scalar)
    }

    /// Whether this CPU can run the kernels of `self`.
    pub fn is_available(self) -> bool {
        let f = features();
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => f.avx2,
            Isa::Avx2Vnni => f.avx_vnni || f.avx512_vnni,
            Isa::Avx512 => f.avx512,
            Isa::Avx512Vnni => f.avx512_vnni,
            Isa::Amx => f.amx,
        }
    }

    /// Whether the 256-bit VNNI kernels use AVX-VNNI's encoding (else AVX-512 VL's).
    pub(super) fn avx_vnni_encoding() -> bool {
        features().avx_vnni
    }

    /// Whether products go through the packed (interleaved) weight layout: every SIMD class
    /// (its table has packed products).
    pub fn packs(self) -> bool {
        self != Isa::Scalar
    }

    /// The name `PLD_KERNEL` takes for it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx2Vnni => "avx2vnni",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "vnni",
            Isa::Amx => "amx",
        }
    }

    /// Every implementation this CPU can run (for tests).
    pub fn available() -> Vec<Isa> {
        ALL.into_iter().filter(|i| i.is_available()).collect()
    }
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

/// What `PLD_KERNEL` asks for: `Ok(None)` when unset or empty, an error naming the value when it
/// names no implementation or one this CPU cannot run.
fn requested(value: Option<&str>) -> Result<Option<Isa>, String> {
    let Some(v) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let isa = match v {
        "avx512vnni" => Isa::Avx512Vnni,
        _ => *ALL.iter().find(|i| i.name() == v).ok_or_else(|| {
            let names: Vec<_> = ALL.iter().map(|i| i.name()).collect();
            format!("PLD_KERNEL={v} is none of {}", names.join(", "))
        })?,
    };
    if !isa.is_available() {
        return Err(format!("PLD_KERNEL={v}: this CPU cannot run it"));
    }
    Ok(Some(isa))
}

/// The implementation in use: the best the CPU has, or the one `PLD_KERNEL` names
/// (`scalar|avx2|avx2vnni|avx512|vnni|amx`) to force a simpler one. A value that names none, or one
/// this CPU lacks, is reported on stderr once and the best is used.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let value = std::env::var("PLD_KERNEL").ok();
        match requested(value.as_deref()) {
            Ok(Some(isa)) => isa,
            Ok(None) => Isa::detect(),
            Err(e) => {
                let best = Isa::detect();
                eprintln!("warning: {e}; using {}", best.name());
                best
            }
        }
    })
}

/// Whether the float loops (`dot`, `softmax`, `swiglu`) take their AVX2 versions: whenever the
/// implementation in use is not the plain one.
pub(super) fn has_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| isa() != Isa::Scalar)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_parse_and_bad_ones_are_named() {
        assert_eq!(requested(None), Ok(None));
        assert_eq!(requested(Some("")), Ok(None));
        assert_eq!(requested(Some("scalar")), Ok(Some(Isa::Scalar)));
        for isa in Isa::available() {
            assert_eq!(requested(Some(isa.name())), Ok(Some(isa)));
        }
        let e = requested(Some("avx9")).unwrap_err();
        assert!(e.contains("avx9") && e.contains("avx2vnni"), "{e}");
        if let Some(lacking) = ALL.iter().find(|i| !i.is_available()) {
            let e = requested(Some(lacking.name())).unwrap_err();
            assert!(e.contains("cannot run"), "{e}");
        }
    }

    #[test]
    fn each_class_has_its_own_table() {
        for isa in Isa::available() {
            let k = isa.kernels();
            assert_eq!(k.name, isa.name());
            assert_eq!(isa.packs(), k.packed_rows.is_some(), "{isa:?}");
            // Only a class that runs tiles has their loops.
            assert_eq!(k.tile_rows.is_some(), isa == Isa::Amx, "{isa:?}");
            assert!(k.prompt_rows.is_none() || isa == Isa::Amx, "{isa:?}");
        }
    }
}
