//! The steps of the prompt rows' tile loops (`amx_prompt`, bf16, and `amx_prompt_int8`, int8):
//! two tiles of activation rows against a strip's two B tiles, each operand of the next step
//! loaded as soon as the last product reading its register is issued, and the sums' tiles
//! loaded from and stored to where they wait between blocks of columns. `$op` names the tile
//! product (`tdpbf16ps`, `tdpbssd`); every tile is sixteen rows of 64 bytes, tmm0-3 sums,
//! tmm4-5 activations, tmm6-7 weights.

/// One step of a tile row's columns (32 bf16 or 64 int8) with the tile product `$op` for two
/// tiles of activation rows against the strip's two B tiles, the step's tiles already in tmm4 (rows `a0`), tmm5 (rows `a1`), tmm6 and tmm7 (weights);
/// each operand of the next step (`na0`, `na1`, `nb`) is loaded as soon as this step's last
/// product reading its register is issued, so the loads overlap the products.
macro_rules! step2 {
    ($op:literal, $na0:expr, $na1:expr, $nb:expr) => {
        ::std::arch::asm!(
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm4, tmm7"),
            "tileloadd tmm4, [{a0} + {s}*1]",
            concat!($op, " tmm2, tmm5, tmm6"),
            "tileloadd tmm6, [{b} + {s}*1]",
            concat!($op, " tmm3, tmm5, tmm7"),
            "tileloadd tmm5, [{a1} + {s}*1]",
            "tileloadd tmm7, [{b} + {s}*1 + 1024]",
            a0 = in(reg) $na0,
            a1 = in(reg) $na1,
            b = in(reg) $nb,
            s = in(reg) 64usize,
            options(nostack, readonly),
        )
    };
}

/// Loads a step's operands for `step2`.
macro_rules! load2 {
    ($a0:expr, $a1:expr, $b:expr) => {
        ::std::arch::asm!(
            "tileloadd tmm4, [{a0} + {s}*1]",
            "tileloadd tmm6, [{b} + {s}*1]",
            "tileloadd tmm7, [{b} + {s}*1 + 1024]",
            "tileloadd tmm5, [{a1} + {s}*1]",
            a0 = in(reg) $a0,
            a1 = in(reg) $a1,
            b = in(reg) $b,
            s = in(reg) 64usize,
            options(nostack, readonly),
        )
    };
}

/// As `step2` for one tile of activation rows.
macro_rules! step1 {
    ($op:literal, $a0:expr, $b:expr) => {
        ::std::arch::asm!(
            "tileloadd tmm4, [{a0} + {s}*1]",
            "tileloadd tmm6, [{b} + {s}*1]",
            "tileloadd tmm7, [{b} + {s}*1 + 1024]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm4, tmm7"),
            a0 = in(reg) $a0,
            b = in(reg) $b,
            s = in(reg) 64usize,
            options(nostack, readonly),
        )
    };
}

/// Loads (or, on the first block of columns, zeroes) a tile of rows' sums of the strip's two
/// column tiles from `c` (`Sums`).
macro_rules! sums_in {
    ($first:expr, $c:expr, $t0:literal, $t1:literal) => {
        if $first {
            ::std::arch::asm!(concat!("tilezero ", $t0), concat!("tilezero ", $t1), options(nostack, nomem));
        } else {
            ::std::arch::asm!(
                concat!("tileloadd ", $t0, ", [{p} + {s}*1]"),
                concat!("tileloadd ", $t1, ", [{p} + {s}*1 + 64]"),
                p = in(reg) $c.at,
                s = in(reg) $c.stride,
                options(nostack, readonly),
            );
        }
    };
}

macro_rules! sums_out {
    ($c:expr, $t0:literal, $t1:literal) => {
        ::std::arch::asm!(
            concat!("tilestored [{p} + {s}*1], ", $t0),
            concat!("tilestored [{p} + {s}*1 + 64], ", $t1),
            p = in(reg) $c.at,
            s = in(reg) $c.stride,
            options(nostack),
        )
    };
}

/// Where a tile of rows' sums of a strip waits between blocks of columns: in the output
/// (`stride` bytes between rows) or, for a last tile of fewer than sixteen rows, in a side buffer.
#[derive(Clone, Copy)]
pub(super) struct Sums {
    pub(super) at: *mut f32,
    pub(super) stride: usize,
}

/// Sums per row of a strip: two tiles of sixteen columns.
const STRIP: usize = 2 * ROWS;

impl Sums {
    /// A tile of rows' sums of a strip in a side buffer at `at`: sixteen rows of 32, packed.
    pub(super) fn packed(at: *mut f32) -> Sums {
        Sums {
            at,
            stride: STRIP * 4,
        }
    }

    /// Where tile of rows `t` (of `tiles`) of the call's strip `j` waits: the output's rows
    /// (`n` floats apart, the call's strips from column 0), or, for the last tile where `m`
    /// leaves it `partial`, strip `j`'s part of `tail`.
    ///
    /// # Safety
    /// `out` holds `tiles * 16` rows of `n` floats (`tiles * 16 - 1` where `partial`) and
    /// `tail` the call's strips' side buffers where `partial`.
    pub(super) unsafe fn waiting(
        (out, n): (*mut f32, usize),
        tail: *mut f32,
        (j, t): (usize, usize),
        (tiles, partial): (usize, bool),
    ) -> Sums {
        match partial && t == tiles - 1 {
            true => Sums::packed(tail.add(j * ROWS * STRIP)),
            false => Sums {
                at: out.add(t * ROWS * n + j * STRIP),
                stride: n * 4,
            },
        }
    }
}

use crate::kernels::packed::ROWS;

pub(super) use {load2, step1, step2, sums_in, sums_out};
