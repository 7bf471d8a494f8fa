//! Attention over a bf16 cache on AMX tiles (Sapphire Rapids and later): the scores and the
//! weighted values are tile products (`tdpbf16ps`: bf16 pairs, f32 sums), the online softmax
//! between them runs on 512-bit registers.
//!
//! The sweep over the positions is that of the vector kernels (`x86::attention`) in blocks of
//! `BLOCK` (256) positions at multiples of it, four of theirs: a running maximum and sum per
//! query, earlier outputs rescaled when the maximum grows. Each output tile loaded then gathers
//! 256 positions' weighted values before it is stored (with 64, loading and storing the outputs
//! held the tiles up more than their products), and the maximum and sum are reduced once for
//! them. A bf16 cache holds its numbers in the tiles' pairs (`KvElem::PAIRED`: pairs of key
//! dimensions along the positions, pairs of positions along the value dimensions), so the tiles
//! load keys and values straight from it. For each block, only as far as the vector kernels'
//! blocks (64) that some query sees, as the cache holds those whole:
//! - per tile of sixteen queries (times the scale, in bf16, rounded once per call): the scores in
//!   four tile products per 32 dimensions and 64 positions; then per query the scores turned
//!   into weights (`amx_softmax::tile_weights`, for the tile's queries at once, with an
//!   exponential of its own, `exp_tile`: positions a query does not see weigh zero), rounded to
//!   bf16; then the 16 x `hd` weighted values of the block in tile products over its positions,
//!   added by the tiles to the outputs they load (rescaled first where a query's maximum grew).
//!   Up to `GROUP` tiles go through each phase together, two at a time where there are two, so
//!   that each tile of keys or values loaded serves both.
//!
//! A tile's rows are computed independently of one another (each output of a tile product reads
//! one row of A and one column of B), and a query's positions fall in the same blocks whatever
//! shares its pass, so a row's result is bit-identical alone or beside others: speculative
//! output equals plain output. A draft tree's rows see the committed cache and their own
//! ancestors: from the block holding the tree's first position on, a row's visible positions are
//! gathered in order (`gather`), as its path alone would hold them, and swept as a block.

// Tiles and buffers are addressed by row and column.
#![allow(clippy::needless_range_loop)]

use super::amx::{load_config, release, Config};
use super::amx_softmax::{store_bf16, tile_weights, BLOCK};
use crate::kernels::kv::{KvOf, KvStored, TreeMask};
use crate::kernels::on_lines;
use crate::kernels::online_softmax::{normalize, ATTENTION_BLOCK};
use half::bf16;
use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Query rows per tile.
const T: usize = 16;

/// Query tiles taken through a block together (`block_tiles`): two, whose scores (32 KB) and
/// weights (16 KB) stay near the first-level cache; four were 4% slower on 64-row passes at 16k.
const GROUP: usize = 2;

/// How many positions ahead a block's keys and values are prefetched: one block.
const AHEAD: usize = BLOCK;

/// Whether attention may run on bf16 tiles: the CPU has AMX-BF16 and AVX512_BF16 and the process
/// the tile state (`amx::permission`). Asked once.
pub(crate) fn bf16_tiles() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        // SAFETY: CPUID leaf 7 exists on every x86-64 CPU that `amx::permission` accepts, which
        // is asked first.
        super::amx::permission().is_ok() && {
            #[allow(unused_unsafe)]
            let leaf7 = unsafe { __cpuid_count(7, 0) };
            (leaf7.edx >> 22) & 1 == 1 && is_x86_feature_detected!("avx512bf16")
        }
    })
}

/// The tiles: every one sixteen rows of 64 bytes. tmm0-3 hold sums, tmm4-5 A operands (queries
/// or weights), tmm6-7 B operands (keys or values).
static TILES: Config = Config::new(64);

/// `tilezero` of sum tile `n` (0..4).
#[inline(always)]
unsafe fn zero(n: usize) {
    match n {
        0 => asm!("tilezero tmm0", options(nostack, nomem)),
        1 => asm!("tilezero tmm1", options(nostack, nomem)),
        2 => asm!("tilezero tmm2", options(nostack, nomem)),
        _ => asm!("tilezero tmm3", options(nostack, nomem)),
    }
}

/// Loads A tile `a` (0: tmm4, 1: tmm5): sixteen rows of 64 bytes, `stride` bytes apart, from
/// `p`. Two A tiles in turn, so that a load need not wait for the products reading the other.
#[inline(always)]
unsafe fn load_a(a: usize, p: *const u16, stride: usize) {
    if a == 0 {
        asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride,
            options(nostack, readonly));
    } else {
        asm!("tileloadd tmm5, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride,
            options(nostack, readonly));
    }
}

/// Sum tile `n` (0..4) += A tile `a` x B, B loaded from `p` (sixteen rows `stride` bytes apart)
/// into tmm6 or tmm7 in turn, so that a load overlaps the product before it.
#[inline(always)]
unsafe fn dot(n: usize, a: usize, p: *const u16, stride: usize) {
    macro_rules! dot {
        ($c:literal, $a:literal, $b:literal) => {
            asm!(
                concat!("tileloadd ", $b, ", [{p} + {s}*1]"),
                concat!("tdpbf16ps ", $c, ", ", $a, ", ", $b),
                p = in(reg) p, s = in(reg) stride, options(nostack, readonly)
            )
        };
    }
    match (n, a) {
        (0, 0) => dot!("tmm0", "tmm4", "tmm6"),
        (1, 0) => dot!("tmm1", "tmm4", "tmm7"),
        (2, 0) => dot!("tmm2", "tmm4", "tmm6"),
        (_, 0) => dot!("tmm3", "tmm4", "tmm7"),
        (0, _) => dot!("tmm0", "tmm5", "tmm6"),
        (1, _) => dot!("tmm1", "tmm5", "tmm7"),
        (2, _) => dot!("tmm2", "tmm5", "tmm6"),
        (_, _) => dot!("tmm3", "tmm5", "tmm7"),
    }
}

/// Four tile products over two A and two B tiles: tmm0 += a0 x b0, tmm1 += a0 x b1,
/// tmm2 += a1 x b0, tmm3 += a1 x b1 (A rows `sa` bytes apart, B rows `sb`).
#[inline(always)]
unsafe fn quad(a: (*const u16, *const u16), sa: usize, b: (*const u16, *const u16), sb: usize) {
    asm!(
        "tileloadd tmm4, [{a0} + {sa}*1]",
        "tileloadd tmm6, [{b0} + {sb}*1]",
        "tdpbf16ps tmm0, tmm4, tmm6",
        "tileloadd tmm5, [{a1} + {sa}*1]",
        "tdpbf16ps tmm2, tmm5, tmm6",
        "tileloadd tmm7, [{b1} + {sb}*1]",
        "tdpbf16ps tmm1, tmm4, tmm7",
        "tdpbf16ps tmm3, tmm5, tmm7",
        a0 = in(reg) a.0, a1 = in(reg) a.1, b0 = in(reg) b.0, b1 = in(reg) b.1,
        sa = in(reg) sa, sb = in(reg) sb,
        options(nostack, readonly)
    );
}

/// Which A and B tile (0 or 1 each) sum tile `n` of `quad` multiplies, in the order of `n`.
const QUAD_SUMS: [(usize, usize); 4] = [(0, 0), (0, 1), (1, 0), (1, 1)];

/// Loads sum tile `n` (0..4) from `p`, rows `stride` bytes apart.
#[inline(always)]
unsafe fn load_sums(n: usize, p: *const f32, stride: usize) {
    macro_rules! ld {
        ($c:literal) => {
            asm!(concat!("tileloadd ", $c, ", [{p} + {s}*1]"), p = in(reg) p, s = in(reg) stride,
                options(nostack, readonly))
        };
    }
    match n {
        0 => ld!("tmm0"),
        1 => ld!("tmm1"),
        2 => ld!("tmm2"),
        _ => ld!("tmm3"),
    }
}

/// Stores sum tile `n` (0..4) to `p`, rows `stride` bytes apart.
#[inline(always)]
unsafe fn store(n: usize, p: *mut f32, stride: usize) {
    macro_rules! st {
        ($c:literal) => {
            asm!(concat!("tilestored [{p} + {s}*1], ", $c), p = in(reg) p, s = in(reg) stride,
                options(nostack))
        };
    }
    match n {
        0 => st!("tmm0"),
        1 => st!("tmm1"),
        2 => st!("tmm2"),
        _ => st!("tmm3"),
    }
}

/// The 64-byte aligned working space of one call, carved from the caller's scratch vector:
/// queries in bf16 (`rows` of `hd`), a tree row's gathered keys (`hd / 2` rows of `BLOCK`
/// position pairs) and values (`BLOCK / 2` rows of `hd` dimension pairs), `GROUP` tiles' scores
/// (16 x `BLOCK` f32 each) and weights (16 x `BLOCK` bf16), the outputs of a tile of fewer than
/// sixteen queries (16 x `hd` f32), and each query's running maximum and sum.
struct Scratch {
    queries: *mut u16,
    keys: *mut u16,
    values: *mut u16,
    scores: *mut f32,
    weights: *mut u16,
    result: *mut f32,
    max: *mut f32,
    sum: *mut f32,
}

impl Scratch {
    fn new(v: &mut Vec<f32>, queries: usize, hd: usize) -> Scratch {
        // Sizes in f32s, each a multiple of 16 (64 bytes).
        let parts = [
            (queries + T) * hd / 2,
            hd * BLOCK / 2,
            hd * BLOCK / 2,
            GROUP * T * BLOCK,
            GROUP * T * BLOCK / 2,
            T * hd,
            queries.next_multiple_of(16),
            queries.next_multiple_of(16),
        ];
        let v = on_lines(v, parts.iter().sum());
        v.fill(0.0);
        let mut at = v.as_mut_ptr();
        let mut next = |n: usize| {
            let p = at;
            // SAFETY: the parts lie inside `v`, which holds their sum.
            at = unsafe { at.add(n) };
            p
        };
        let queries_p = next(parts[0]) as *mut u16;
        let keys = next(parts[1]) as *mut u16;
        let values = next(parts[2]) as *mut u16;
        let scores = next(parts[3]);
        let weights = next(parts[4]) as *mut u16;
        let result = next(parts[5]);
        let (max, sum) = (next(parts[6]), next(parts[7]));
        // SAFETY: as above; `max` holds `queries` floats.
        unsafe { std::slice::from_raw_parts_mut(max, queries).fill(f32::NEG_INFINITY) };
        Scratch {
            queries: queries_p,
            keys,
            values,
            scores,
            weights,
            result,
            max,
            sum,
        }
    }
}

/// The prefetches of the block `AHEAD` positions after the one being computed, issued a few
/// lines at a time between its tile products (`some`) and the rest at its end (`rest`). Each
/// block reads `hd / 2` rows of key pairs far apart, more streams than the hardware prefetchers
/// follow, and its values, one run, are read by tile loads, which do not seem to start those
/// prefetchers. Issued all at once, a block's 2,048 prefetches (at 128 dimensions) wait on the
/// few line-fill buffers and hold up the products: streaming memory under a block's worth of
/// arithmetic measured 1.25x faster with them spread out.
struct Ahead {
    keys: *const i8,
    key_row: usize,
    key_lines: usize,
    values: *const i8,
    lines: usize,
    next: usize,
}

/// Prefetches issued at each point of a block where `Ahead::some` is called.
const DRIP: usize = 16;

impl Ahead {
    /// Nothing to prefetch (a tree's gathered blocks, the end of the head).
    const NONE: Ahead = Ahead {
        keys: std::ptr::null(),
        key_row: 0,
        key_lines: 0,
        values: std::ptr::null(),
        lines: 0,
        next: 0,
    };

    /// The keys and values of the block `AHEAD` positions after `t0`, if the head has it.
    fn of(kv: &KvOf<'_, bf16>, t0: usize) -> Ahead {
        let t = t0 + AHEAD;
        if t + BLOCK > kv.len {
            return Ahead::NONE;
        }
        // Keys: `hd / 2` pair rows of `BLOCK / 16` lines from position t's pair; values:
        // positions t..t + BLOCK of a paired head, BLOCK * value_stride numbers from t's.
        let key_lines = kv.hd / 2 * (BLOCK / 16);
        Ahead {
            keys: kv.keys.as_ptr().wrapping_add(2 * t) as *const i8,
            key_row: 4 * kv.key_stride,
            key_lines,
            values: kv.values.as_ptr().wrapping_add(t * kv.value_stride) as *const i8,
            lines: key_lines + BLOCK * kv.value_stride * 2 / 64,
            next: 0,
        }
    }

    /// The next `n` lines, keys first.
    #[inline(always)]
    unsafe fn issue(&mut self, n: usize) {
        let end = (self.next + n).min(self.lines);
        for l in self.next..end {
            let p = if l < self.key_lines {
                let per_row = BLOCK / 16;
                self.keys
                    .wrapping_add((l / per_row) * self.key_row + 64 * (l % per_row))
            } else {
                self.values.wrapping_add(64 * (l - self.key_lines))
            };
            _mm_prefetch::<_MM_HINT_T1>(p);
        }
        self.next = end;
    }

    /// A few more lines, between two tile products.
    #[inline(always)]
    unsafe fn some(&mut self) {
        if self.next < self.lines {
            self.issue(DRIP);
        }
    }

    /// Whatever is left, at the end of a block.
    #[inline(always)]
    unsafe fn rest(&mut self) {
        self.issue(self.lines);
    }
}

/// The keys and values of the positions `at` (at most `BLOCK`, in order; zeros after them to
/// the end of their last vector-kernel block, past which the tiles read nothing) paired as the
/// cache pairs them, as if they were one block: key pair rows `2 * BLOCK` numbers apart, value
/// pair rows `2 * hd` apart.
unsafe fn gather(kv: &KvOf<'_, bf16>, at: &[usize], keys: *mut u16, values: *mut u16) {
    let hd = kv.hd;
    let (k_in, v_in) = (
        kv.keys.as_ptr() as *const u16,
        kv.values.as_ptr() as *const u16,
    );
    // As far as the tiles read: the vector kernels' blocks that hold the positions.
    let end = at.len().next_multiple_of(ATTENTION_BLOCK);
    for i in 0..hd {
        for k in 0..end {
            let x = at
                .get(k)
                .map_or(0, |&t| *k_in.add(bf16::key_at(i, t, kv.key_stride)));
            *keys.add(bf16::key_at(i, k, BLOCK)) = x;
        }
    }
    for k in 0..end {
        for d in 0..hd {
            let x = at
                .get(k)
                .map_or(0, |&t| *v_in.add(bf16::value_at(t, d, kv.value_stride)));
            *values.add(bf16::value_at(k, d, hd)) = x;
        }
    }
}

/// Where a block's paired keys and values are read from: the first pair row of each, and the
/// bytes between consecutive pair rows.
#[derive(Clone, Copy)]
struct Block {
    keys: *const u16,
    key_row: usize,
    values: *const u16,
    value_row: usize,
}

/// One block (`b`) for the queries `j0..j0 + seen.len()` (at most `GROUP` tiles; query `j` in
/// bf16 at `s.queries + j * hd`, its output at `out + j * hd`), query `j0 + i` seeing the
/// block's first `seen[i]` positions. In phases over all the tiles, so that the tiles and the
/// vector registers hand over through memory three times a block, whatever the queries: every
/// tile's scores, every query's weights, every tile's weighted values, every output rescaled
/// and added to.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block_tiles(
    s: &Scratch,
    b: Block,
    hd: usize,
    j0: usize,
    seen: &[usize],
    out: *mut f32,
    ahead: &mut Ahead,
) {
    let tiles = seen.len().div_ceil(T);
    // The positions computed: the vector kernels' blocks that some query sees (the cache holds
    // whole ones of those).
    let reach = seen
        .iter()
        .max()
        .map_or(0, |&n| n.next_multiple_of(ATTENTION_BLOCK));
    // Each query's factor for what earlier blocks left in its output.
    let mut rescale = [0f32; GROUP * T];
    scores(s, b, hd, j0, tiles, reach, ahead);
    for q in 0..tiles {
        let (i0, i1) = (q * T, seen.len().min(q * T + T));
        let j = j0 + i0;
        tile_weights(
            s.scores.add(i0 * BLOCK),
            s.weights.add(i0 * BLOCK),
            &seen[i0..i1],
            reach,
            (s.max.add(j), s.sum.add(j)),
            &mut rescale[i0..i1],
        );
        ahead.some();
    }
    // Earlier blocks' outputs rescaled where a query's maximum grew (at its first block, where
    // they are zero, by about e^-87).
    for (i, &n) in seen.iter().enumerate() {
        if n > 0 && rescale[i] != 1.0 {
            let (o, factor) = (out.add((j0 + i) * hd), _mm512_set1_ps(rescale[i]));
            for d in (0..hd).step_by(16) {
                _mm512_storeu_ps(o.add(d), _mm512_mul_ps(_mm512_loadu_ps(o.add(d)), factor));
            }
        }
    }
    weighted_values(s, b, hd, j0, (seen.len(), reach), out, ahead);
}

/// The block's scores of the query tiles `0..tiles` from `j0` into `s.scores` (16 x `BLOCK` per
/// tile).
#[inline(always)]
unsafe fn scores(
    s: &Scratch,
    b: Block,
    hd: usize,
    j0: usize,
    tiles: usize,
    reach: usize,
    ahead: &mut Ahead,
) {
    // Four tiles of sixteen positions, over the dimensions 32 at a time; two tiles of queries
    // at a time where there are two, so that each tile of keys serves both.
    let mut q = 0;
    while q < tiles {
        let queries = s.queries.add((j0 + q * T) * hd);
        let scores = s.scores.add(q * T * BLOCK);
        if q + 1 < tiles {
            for n0 in (0..reach / 16).step_by(2) {
                for n in 0..4 {
                    zero(n);
                }
                for c in 0..hd / 32 {
                    let k = b.keys.add(16 * c * b.key_row / 2 + 32 * n0);
                    let a = queries.add(32 * c);
                    quad((a, a.add(T * hd)), 2 * hd, (k, k.add(32)), b.key_row);
                    ahead.some();
                }
                for (n, (u, h)) in QUAD_SUMS.into_iter().enumerate() {
                    store(n, scores.add(u * T * BLOCK + 16 * (n0 + h)), 4 * BLOCK);
                }
            }
            q += 2;
            continue;
        }
        for n0 in (0..reach / 16).step_by(4) {
            for n in 0..4 {
                zero(n);
            }
            for c in 0..hd / 32 {
                load_a(c % 2, queries.add(32 * c), 2 * hd);
                for n in 0..4 {
                    dot(
                        n,
                        c % 2,
                        b.keys.add(16 * c * b.key_row / 2 + 32 * (n0 + n)),
                        b.key_row,
                    );
                    ahead.some();
                }
            }
            for n in 0..4 {
                store(n, scores.add(16 * (n0 + n)), 4 * BLOCK);
            }
        }
        q += 1;
    }
}

/// The block's weighted values (weights in `s.weights`) of the queries `j0..j0 + queries` over
/// its first `reach` positions, added to their outputs at `out`.
#[inline(always)]
unsafe fn weighted_values(
    s: &Scratch,
    b: Block,
    hd: usize,
    j0: usize,
    (queries, reach): (usize, usize),
    out: *mut f32,
    ahead: &mut Ahead,
) {
    // Weighted values: up to four tiles of sixteen output dimensions at a time, over the
    // block's positions 32 at a time, added by the tiles to the outputs they load. A tile of
    // fewer than sixteen queries goes through `s.result`, its outputs copied in and back (the
    // tile rows past the last query are not outputs), the same arithmetic.
    let out_tiles = hd / 16;
    let tiles = queries.div_ceil(T);
    let mut q = 0;
    while q < tiles {
        // Two tiles of queries at a time where there are two: each tile of values loaded then
        // serves both.
        let pair = q + 1 < tiles;
        let n_q = if pair { 2 } else { 1 };
        let rows = queries.min((q + n_q) * T) - q * T;
        let first = out.add((j0 + q * T) * hd);
        // The outputs of the last tile pass through scratch when it has fewer than 16 queries.
        let last = rows - (n_q - 1) * T;
        let last_first = first.add((n_q - 1) * T * hd);
        let last_sums = if last == T {
            last_first
        } else {
            std::ptr::copy_nonoverlapping(last_first, s.result, last * hd);
            s.result
        };
        let weights = s.weights.add(q * T * BLOCK);
        if pair {
            let c = [first, last_sums];
            for g in (0..out_tiles).step_by(2) {
                for (n, (u, h)) in QUAD_SUMS.into_iter().enumerate() {
                    load_sums(n, c[u].add(16 * (g + h)), 4 * hd);
                }
                for k in 0..reach / 32 {
                    let v = b.values.add(16 * k * b.value_row / 2 + 32 * g);
                    quad(
                        (weights.add(32 * k), weights.add(T * BLOCK + 32 * k)),
                        2 * BLOCK,
                        (v, v.add(32)),
                        b.value_row,
                    );
                    ahead.some();
                }
                for (n, (u, h)) in QUAD_SUMS.into_iter().enumerate() {
                    store(n, c[u].add(16 * (g + h)), 4 * hd);
                }
            }
        } else {
            for g in (0..out_tiles).step_by(4) {
                let m = (out_tiles - g).min(4);
                for n in 0..m {
                    load_sums(n, last_sums.add(16 * (g + n)), 4 * hd);
                }
                for k in 0..reach / 32 {
                    load_a(k % 2, weights.add(32 * k), 2 * BLOCK);
                    for n in 0..m {
                        let v = b.values.add(16 * k * b.value_row / 2 + 32 * (g + n));
                        dot(n, k % 2, v, b.value_row);
                        ahead.some();
                    }
                }
                for n in 0..m {
                    store(n, last_sums.add(16 * (g + n)), 4 * hd);
                }
            }
        }
        if last < T {
            std::ptr::copy_nonoverlapping(s.result, last_first, last * hd);
        }
        q += n_q;
    }
}

/// The queries of the call times `scale` (so that the tiles give scaled scores) in bf16, one row
/// of `hd` each (query `j` is head `j % group` of row `j / group`), then `T` rows of zeros.
#[inline(always)]
unsafe fn round_queries(
    (q, q_stride): (&[f32], usize),
    group: usize,
    nq: usize,
    hd: usize,
    scale: f32,
    to: *mut u16,
) {
    let scale = _mm512_set1_ps(scale);
    for j in 0..nq {
        let from = q.as_ptr().add((j / group) * q_stride + (j % group) * hd);
        for c in (0..hd).step_by(32) {
            let (a, b) = (
                _mm512_mul_ps(_mm512_loadu_ps(from.add(c)), scale),
                _mm512_mul_ps(_mm512_loadu_ps(from.add(c + 16)), scale),
            );
            store_bf16(a, b, to.add(j * hd + c));
        }
    }
    std::ptr::write_bytes(to.add(nq * hd), 0, T * hd);
}

/// `kernels::attend_rows` over a bf16 cache on tiles (see the module's notes).
///
/// # Safety
/// `bf16_tiles()` holds; `hd % 32 == 0`; the bounds are those `kernels::attend_rows` checks.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
pub(crate) unsafe fn attend_rows_amx(
    q: &[f32],
    q_stride: usize,
    rows: usize,
    kv: KvOf<'_, bf16>,
    scale: f32,
    sinks: Option<&[f32]>,
    tree: Option<TreeMask<'_>>,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = kv.hd;
    let group = out.len() / rows / hd;
    let nq = rows * group;
    let s = Scratch::new(scratch, nq, hd);
    round_queries((q, q_stride), group, nq, hd, scale, s.queries);
    out.fill(0.0);
    let po = out.as_mut_ptr();
    let row_len = |r: usize| kv.len - (rows - 1 - r);
    let swept = |r: usize| match tree {
        Some(m) => m.start / BLOCK * BLOCK,
        None => row_len(r),
    };
    load_config(&TILES);
    let mut seen = [0usize; GROUP * T];
    let (keys, values) = (
        kv.keys.as_ptr() as *const u16,
        kv.values.as_ptr() as *const u16,
    );
    for t0 in (0..swept(rows - 1)).step_by(BLOCK) {
        let mut ahead = Ahead::of(&kv, t0);
        let b = Block {
            keys: keys.add(2 * t0),
            key_row: 4 * kv.key_stride,
            values: values.add(t0 * kv.value_stride),
            value_row: 4 * kv.value_stride,
        };
        let first = (0..nq).find(|&j| swept(j / group) > t0).unwrap_or(nq);
        for j0 in (first..nq).step_by(GROUP * T) {
            let n = (nq - j0).min(GROUP * T);
            for i in 0..n {
                seen[i] = (swept((j0 + i) / group) - t0).min(BLOCK);
            }
            block_tiles(&s, b, hd, j0, &seen[..n], po, &mut ahead);
        }
        ahead.rest();
    }
    if let Some(m) = tree {
        let from = m.start / BLOCK * BLOCK;
        let mut at = Vec::with_capacity(2 * BLOCK);
        // A tree's gathered blocks are in scratch: nothing to prefetch.
        let mut no_ahead = Ahead::NONE;
        let gathered = Block {
            keys: s.keys,
            key_row: 4 * BLOCK,
            values: s.values,
            value_row: 4 * hd,
        };
        for r in 0..rows {
            let sees = m.row(r);
            at.clear();
            at.extend((from..row_len(r)).filter(|&t| sees.sees(t)));
            for b in at.chunks(BLOCK) {
                gather(&kv, b, s.keys, s.values);
                for h0 in (0..group).step_by(GROUP * T) {
                    let n = (group - h0).min(GROUP * T);
                    seen[..n].fill(b.len());
                    let j0 = r * group + h0;
                    block_tiles(&s, gathered, hd, j0, &seen[..n], po, &mut no_ahead);
                }
            }
        }
    }
    release();
    let max = std::slice::from_raw_parts(s.max, nq);
    let sum = std::slice::from_raw_parts(s.sum, nq);
    normalize(out, hd, (max, sum), sinks);
}
