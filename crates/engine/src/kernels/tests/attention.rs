//! Attention: every implementation the CPU has against the plain version (`Isa::Scalar`) bit for
//! bit, that one against the textbook formula in f64, and a row's result the same alone, in a
//! batch of rows and as a node of a draft tree.

use super::*;
use crate::kernels::kv::ElemKind;
use crate::kernels::online_softmax::{exp_lane, LN2_HI, LN2_LO};
use half::bf16;

/// The textbook attention of one query head over the positions `seen` of `kv`, in f64: scores
/// q.k scaled, their softmax (maximum subtracted), the weighted sum of the values.
fn textbook<E: KvElem>(
    qh: &[f32],
    keys: &[E],
    values: &[E],
    strides: (usize, usize),
    scale: f32,
    seen: &[usize],
) -> Vec<f64> {
    textbook_with_sink(qh, keys, values, strides, scale, None, seen)
}

/// `textbook` with an attention sink: one more logit in the softmax, whose weight multiplies no
/// value (gpt-oss's formula: the sink appended to the scores, softmax, the sink's share dropped).
fn textbook_with_sink<E: KvElem>(
    qh: &[f32],
    keys: &[E],
    values: &[E],
    (key_stride, value_stride): (usize, usize),
    scale: f32,
    sink: Option<f32>,
    seen: &[usize],
) -> Vec<f64> {
    let hd = qh.len();
    let scores: Vec<f64> = seen
        .iter()
        .map(|&t| {
            let dot: f64 = (0..hd)
                .map(|i| qh[i] as f64 * keys[E::key_at(i, t, key_stride)].to_f32() as f64)
                .sum();
            dot * scale as f64
        })
        .collect();
    let sink = sink.map(f64::from);
    let max = scores
        .iter()
        .chain(&sink)
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = weights.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
    (0..hd)
        .map(|i| {
            let dot: f64 = seen
                .iter()
                .zip(&weights)
                .map(|(&t, w)| w * values[E::value_at(t, i, value_stride)].to_f32() as f64)
                .sum();
            dot / sum
        })
        .collect()
}

/// One head's keys and values of type `E` over `len` positions, laid out as the cache lays out
/// that type (`KvElem::key_at`, `value_at`: bf16 paired), with room for the whole blocks the
/// tiles read: key `i` of position `t` is `key(i, t)`, value `d` of `t` is `value(t, d)`.
fn head_of<E: KvElem>(
    (hd, len): (usize, usize),
    (key_stride, value_stride): (usize, usize),
    key: impl Fn(usize, usize) -> f32,
    value: impl Fn(usize, usize) -> f32,
) -> (Vec<E>, Vec<E>) {
    let end = len.next_multiple_of(64) + 64;
    let mut keys = vec![E::ZERO; hd.next_multiple_of(2) * key_stride.max(end)];
    let mut values = vec![E::ZERO; end * value_stride.max(hd)];
    for t in 0..len {
        for i in 0..hd {
            keys[E::key_at(i, t, key_stride)] = E::from_f32(key(i, t));
            values[E::value_at(t, i, value_stride)] = E::from_f32(value(t, i));
        }
    }
    (keys, values)
}

/// A deterministic number in [-1, 1) for each (`seed`, `a`, `b`).
pub(super) fn noise(seed: u64, a: usize, b: usize) -> f32 {
    let mut x = seed
        ^ (a as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (b as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Asserts `got` is the textbook result within 1e-5.
fn assert_near(got: &[f32], want: &[f64], what: &str) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((*a as f64 - b).abs() <= 1e-5, "{what} [{i}]: {a} vs {b}");
    }
}

/// Whether `isa` computes attention over a cache of `E` on bf16 tiles (`tiles_attend`), which
/// gives other bits than the plain version: those are held to `tiles_plain` instead.
fn on_tiles<E: KvElem>(isa: Isa, hd: usize) -> bool {
    E::KIND == ElemKind::Bf16 && tiles_attend(isa, hd)
}

/// Asserts two implementations' outputs are the same bits.
fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    let bad = got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    assert!(bad.is_none(), "{what}: first difference at {bad:?}");
}

/// `attend_rows` over `rows` consecutive rows of `group` query heads each, under `tree` if given:
/// every row's outputs, in order.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_all(
    isa: Isa,
    q: &[f32],
    q_stride: usize,
    rows: usize,
    group: usize,
    kv: KvHead<'_>,
    scale: f32,
    tree: Option<TreeMask<'_>>,
) -> Vec<f32> {
    let mut out = vec![0f32; rows * group * kv.hd];
    let mut scratch = Vec::new();
    attend_rows(
        isa,
        q,
        q_stride,
        rows,
        kv,
        scale,
        None,
        tree,
        &mut scratch,
        &mut out,
    );
    out
}

/// Attention sinks (gpt-oss): sinks far below, near and far above the scores, over one block and
/// several, one row and several: every implementation gives the plain version's bits, which are
/// the textbook's values with the sink in the softmax, and a row in a batch equals it alone.
#[test]
fn attention_sinks_match_the_textbook() {
    for &(hd, group, len, rows) in &[
        (64usize, 2usize, 9usize, 1usize),
        (64, 4, 150, 5),
        (32, 8, 70, 3),
    ] {
        let q_stride = group * hd;
        let q = random_vec((rows - 1) * q_stride + group * hd, 41 + hd as u64);
        let key_stride = len.next_multiple_of(16);
        let keys: Vec<f32> = random_vec(hd * key_stride, 42 + len as u64);
        let values: Vec<f32> = random_vec(len * hd, 43 + len as u64);
        let scale = 1.0 / (hd as f32).sqrt();
        let kv = KvHead::new(&keys, &values, key_stride, hd, hd, len);
        let sinks: Vec<f32> = (0..group)
            .map(|g| [-30.0, 0.0, 0.5, 3.0, 60.0][g % 5])
            .collect();
        let run = |isa: Isa, rows: usize, kv: KvHead<'_>, q: &[f32]| {
            let mut out = vec![0f32; rows * group * hd];
            let sinks = Some(&sinks[..]);
            attend_rows(
                isa,
                q,
                q_stride,
                rows,
                kv,
                scale,
                sinks,
                None,
                &mut Vec::new(),
                &mut out,
            );
            out
        };
        let plain = run(Isa::Scalar, rows, kv, &q);
        for r in 0..rows {
            let seen: Vec<usize> = (0..len - (rows - 1 - r)).collect();
            for g in 0..group {
                let qh = &q[r * q_stride + g * hd..][..hd];
                let sink = Some(sinks[g]);
                let want =
                    textbook_with_sink(qh, &keys, &values, (key_stride, hd), scale, sink, &seen);
                let at = (r * group + g) * hd;
                let what = format!("plain hd {hd} len {len} row {r} head {g} sink {}", sinks[g]);
                assert_near(&plain[at..at + hd], &want, &what);
            }
        }
        let no_sinks = attend_all(Isa::Scalar, &q, q_stride, rows, group, kv, scale, None);
        assert_ne!(plain, no_sinks, "the sinks change the result");
        for isa in Isa::available() {
            let all = run(isa, rows, kv, &q);
            assert_same_bits(&all, &plain, &format!("{isa:?} sinks hd {hd} len {len}"));
            let last = KvHead {
                len: len - (rows - 1),
                ..kv
            };
            let alone = run(isa, 1, last, &q);
            assert_same_bits(&all[..group * hd], &alone, &format!("{isa:?} row 0 alone"));
        }
    }
}

/// One row over a strided cache, for awkward head sizes, groups and lengths (one block, several,
/// a partial last one), scores small and large (so that the running maximum moves from block to
/// block): every implementation gives the plain version's bits, which are the textbook's values.
#[test]
fn attention_matches_the_textbook() {
    attention_matches_the_textbook_for::<f32>();
    attention_matches_the_textbook_for::<f16>();
    attention_matches_the_textbook_for::<bf16>();
}

fn attention_matches_the_textbook_for<E: KvElem>() {
    for &(hd, group, len, stride, sharp) in &[
        (64usize, 3usize, 37usize, 192usize, 1f32),
        (40, 7, 5, 80, 1.0),
        (128, 1, 1, 256, 1.0),
        (13, 2, 9, 13, 1.0),
        (128, 6, 530, 256, 1.0),
        (64, 7, 100, 128, 8.0),
        (32, 2, 8, 32, 1.0),
        (256, 3, 19, 256, 1.0),
        (64, 2, 1000, 64, 6.0),
        (128, 2, 129, 128, 1.0),
    ] {
        if E::PAIRED && hd % 2 == 1 {
            continue; // a paired cache pairs dimensions
        }
        let q = random_vec(group * hd, hd as u64);
        // Key rows a little longer than the positions, at an odd stride; later keys a little
        // larger, so that later blocks raise the maximum.
        let key_stride = len + hd % 7;
        let key = |i: usize, t: usize| {
            let x = noise(11 + len as u64, i, t);
            x + (t as f32 / len as f32) * x.signum()
        };
        let (keys, values) = head_of::<E>((hd, len), (key_stride, stride), key, |t, d| {
            noise(12 + len as u64, t, d)
        });
        let scale = sharp / (hd as f32).sqrt();
        let kv = KvHead::new(&keys, &values, key_stride, stride, hd, len);
        let mut plain = vec![0f32; group * hd];
        attend_with(Isa::Scalar, &q, kv, scale, &mut Vec::new(), &mut plain);
        let seen: Vec<usize> = (0..len).collect();
        for (g, qh) in q.chunks(hd).enumerate() {
            let want = textbook(qh, &keys, &values, (key_stride, stride), scale, &seen);
            let what = format!("plain hd {hd} group {group} len {len} head {g}");
            assert_near(&plain[g * hd..(g + 1) * hd], &want, &what);
        }
        for isa in Isa::available()
            .into_iter()
            .filter(|&i| !on_tiles::<E>(i, hd))
        {
            let mut got = vec![0f32; group * hd];
            attend_with(isa, &q, kv, scale, &mut Vec::new(), &mut got);
            assert_same_bits(
                &got,
                &plain,
                &format!("{isa:?} hd {hd} group {group} len {len}"),
            );
        }
    }
}

/// Several consecutive rows at once, including more rows than a block has positions and rows
/// that start mid-block: each row bit-identical to `attend` on that row alone, on every
/// implementation, and to the plain version.
#[test]
fn attention_over_rows_equals_each_row_alone() {
    attention_over_rows_equals_each_row_alone_for::<f32>();
    attention_over_rows_equals_each_row_alone_for::<f16>();
    attention_over_rows_equals_each_row_alone_for::<bf16>();
}

fn attention_over_rows_equals_each_row_alone_for<E: KvElem>() {
    for &(hd, group, len, rows, stride) in &[
        (64usize, 3usize, 70usize, 16usize, 192usize),
        (128, 6, 530, 5, 256),
        (32, 1, 9, 9, 32),
        (40, 2, 12, 3, 80),
        (24, 7, 45, 4, 24),
        (64, 7, 300, 8, 128),
        (64, 2, 300, 100, 64),
        (128, 6, 200, 70, 128),
        (128, 6, 1100, 40, 128),
    ] {
        let q_stride = group * hd + 16;
        let q = random_vec((rows - 1) * q_stride + group * hd, 31 + hd as u64);
        let key_stride = len.next_multiple_of(16) + 16;
        let (keys, values) = head_of::<E>(
            (hd, len),
            (key_stride, stride),
            |i, t| noise(32 + len as u64, i, t),
            |t, d| noise(33 + len as u64, t, d),
        );
        let scale = 1.0 / (hd as f32).sqrt();
        let kv = KvHead::new(&keys, &values, key_stride, stride, hd, len);
        let plain = attend_all(Isa::Scalar, &q, q_stride, rows, group, kv, scale, None);
        for isa in Isa::available() {
            let all = attend_all(isa, &q, q_stride, rows, group, kv, scale, None);
            let what = format!("{isa:?} hd {hd} len {len} rows {rows}");
            if !on_tiles::<E>(isa, hd) {
                assert_same_bits(&all, &plain, &what);
            }
            for r in 0..rows {
                let row_kv = KvHead {
                    len: len - (rows - 1 - r),
                    ..kv
                };
                let qr = &q[r * q_stride..r * q_stride + group * hd];
                let mut one = vec![0f32; group * hd];
                attend_with(isa, qr, row_kv, scale, &mut Vec::new(), &mut one);
                let got = &all[r * group * hd..(r + 1) * group * hd];
                assert_same_bits(got, &one, &format!("{what} row {r}"));
            }
        }
    }
}

/// An f16 or bf16 head in a pass of at least `WIDEN_FROM` queries (rows times the group) is
/// widened into L1 a block at a time (`x86::widened_attention`), in a smaller one read where it
/// lies: on either side of the threshold and well past it, at lengths that end mid-vector and
/// mid-block, every implementation gives the plain loops' bits.
#[cfg(target_arch = "x86_64")]
#[test]
fn widened_spans_keep_the_plain_bits() {
    widened_spans_keep_the_plain_bits_for::<f16>();
    widened_spans_keep_the_plain_bits_for::<bf16>();
}

#[cfg(target_arch = "x86_64")]
fn widened_spans_keep_the_plain_bits_for<E: KvElem>() {
    let from = crate::kernels::x86::WIDEN_FROM;
    for &(hd, group, len, rows) in &[
        (128usize, 6usize, 1001usize, from / 6),
        (128, 6, 1001, from.div_ceil(6)),
        (64, 1, 77, from - 1),
        (64, 1, 77, from),
        (32, 4, 300, 3 * from),
        (128, 2, 2053, 200),
    ] {
        let q_stride = group * hd + 8;
        let q = random_vec((rows - 1) * q_stride + group * hd, 60 + len as u64);
        let key_stride = len.next_multiple_of(16) + 48;
        let value_stride = hd + 16;
        let (keys, values) = head_of::<E>(
            (hd, len),
            (key_stride, value_stride),
            |i, t| noise(61 + len as u64, i, t),
            |t, d| noise(62 + len as u64, t, d),
        );
        let scale = 1.0 / (hd as f32).sqrt();
        let kv = KvHead::new(&keys, &values, key_stride, value_stride, hd, len);
        let plain = attend_all(Isa::Scalar, &q, q_stride, rows, group, kv, scale, None);
        for isa in Isa::available() {
            if on_tiles::<E>(isa, hd) {
                continue;
            }
            let all = attend_all(isa, &q, q_stride, rows, group, kv, scale, None);
            let what = format!("{isa:?} {:?} hd {hd} len {len} rows {rows}", E::KIND);
            assert_same_bits(&all, &plain, &what);
        }
    }
}

/// A draft tree's rows, its first position anywhere in a block (so that the positions a node
/// sees, packed, fill one block or spill into the next): each row, seeing the committed positions
/// and its ancestors only, gets exactly (bit for bit) what `attend` gives over a cache holding
/// just those positions in order, which is what decoding the row's path one token at a time
/// would have in its cache; on every implementation, the plain version's bits.
#[test]
fn tree_rows_equal_their_path_alone() {
    tree_rows_equal_their_path_alone_for::<f32>();
    tree_rows_equal_their_path_alone_for::<f16>();
    tree_rows_equal_their_path_alone_for::<bf16>();
}

fn tree_rows_equal_their_path_alone_for<E: KvElem>() {
    for &(hd, group, start, rows, seed) in &[
        (64usize, 3usize, 40usize, 12usize, 1u64),
        (32, 2, 7, 30, 2),
        (128, 1, 100, 64, 3),
        (40, 2, 3, 5, 4),
        (64, 7, 127, 64, 5),
        (64, 2, 64, 20, 6),
        (128, 6, 250, 9, 7),
        (128, 2, 700, 40, 8),
    ] {
        let len = start + rows;
        let stride = hd + 8;
        let q_stride = group * hd + 16;
        let q = random_vec((rows - 1) * q_stride + group * hd, 50 + seed);
        let key_stride = len.next_multiple_of(16) + 16;
        let (keys, values) = head_of::<E>(
            (hd, len),
            (key_stride, stride),
            |i, t| noise(51 + seed, i, t),
            |t, d| noise(52 + seed, t, d),
        );
        let scale = 1.0 / (hd as f32).sqrt();
        // Row 0 is the root; every later row hangs below a random earlier row.
        let mut masks = vec![1u64];
        let mut x = seed;
        for r in 1..rows {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let parent = (x >> 33) as usize % r;
            masks.push(masks[parent] | 1 << r);
        }
        let kv = KvHead::new(&keys, &values, key_stride, stride, hd, len);
        let tree = TreeMask {
            start,
            rows: &masks,
        };
        let attend_tree = |isa| attend_all(isa, &q, q_stride, rows, group, kv, scale, Some(tree));
        let plain = attend_tree(Isa::Scalar);
        for isa in Isa::available() {
            let all = attend_tree(isa);
            let what = format!("{isa:?} hd {hd} start {start} rows {rows}");
            if !on_tiles::<E>(isa, hd) {
                assert_same_bits(&all, &plain, &what);
            }
            for r in 0..rows {
                // The row's path alone: the committed positions, then its ancestors in order.
                let seen: Vec<usize> = (0..start)
                    .chain(
                        (0..rows)
                            .filter(|&i| masks[r] >> i & 1 == 1)
                            .map(|i| start + i),
                    )
                    .collect();
                let n = seen.len();
                let ks = n.next_multiple_of(16) + 16;
                let (pk, pv) = head_of::<E>(
                    (hd, n),
                    (ks, stride),
                    |i, j| keys[E::key_at(i, seen[j], key_stride)].to_f32(),
                    |j, d| values[E::value_at(seen[j], d, stride)].to_f32(),
                );
                let path_kv = KvHead::new(&pk, &pv, ks, stride, hd, n);
                let qr = &q[r * q_stride..r * q_stride + group * hd];
                let mut one = vec![0f32; group * hd];
                attend_with(isa, qr, path_kv, scale, &mut Vec::new(), &mut one);
                let got = &all[r * group * hd..(r + 1) * group * hd];
                assert_same_bits(got, &one, &format!("{what} row {r}"));
                if isa == Isa::Scalar {
                    for (g, qh) in qr.chunks(hd).enumerate() {
                        let want = textbook(qh, &keys, &values, (key_stride, stride), scale, &seen);
                        assert_near(
                            &got[g * hd..(g + 1) * hd],
                            &want,
                            &format!("{what} row {r}"),
                        );
                    }
                }
            }
        }
    }
}

/// The exponential of the weights (`exp_lane`, the vector kernels' own, which the tests above
/// hold to the same bits) is e^x within a few units in the last place where the weights live,
/// and never zero, infinite or NaN where the kernels clamp.
#[test]
fn the_weights_exponential_is_accurate() {
    let x: Vec<f32> = random_vec(4096, 77).iter().map(|v| v * 80.0).collect();
    for v in x.into_iter().chain([0.0, -0.0, 1e-30, -1e-30, 88.0]) {
        let (got, want) = (exp_lane(v) as f64, (v as f64).exp());
        assert!(((got - want) / want).abs() < 1e-6, "e^{v}: {got} vs {want}");
    }
    for v in [-87.0f32, -88.0, -1e6, f32::NEG_INFINITY] {
        let got = exp_lane(v);
        assert!(got > 0.0 && got < 1e-37, "e^{v} clamped: {got}");
    }
}

/// The tiles' exponential (`amx_softmax::exp_tile`) is e^x within a few units in the last place
/// for the x <= 0 it is given, the same as its plain spelling in `tiles_plain` to a unit in the
/// last place, and a small positive number, never NaN, from -87 down to -inf.
#[test]
#[cfg(target_arch = "x86_64")]
#[ignore = "needs AMX-BF16: run with --ignored on a CPU that has it (.ci/run does)"]
fn the_tiles_exponential_is_accurate() {
    if !tiles_attend(Isa::Amx, 64) {
        crate::cannot_run::cannot_run("no AMX-BF16 here");
        return;
    }
    let mut x: Vec<f32> = random_vec(4096, 78)
        .iter()
        .map(|v| -(v.abs()) * 87.0)
        .collect();
    x.extend([0.0, -0.0, -1e-30, -0.3465, -0.3466, -86.9]);
    x.resize(x.len().next_multiple_of(16), -1.0);
    for chunk in x.chunks(16) {
        // SAFETY: `tiles_attend` holds, so the CPU has AVX-512 F.
        let got = unsafe { crate::kernels::x86::exp_tile_of(chunk.try_into().unwrap()) };
        for (&v, &g) in chunk.iter().zip(&got) {
            let want = (v as f64).exp();
            assert!(
                ((g as f64 - want) / want).abs() < 4e-7,
                "e^{v}: {g} vs {want}"
            );
            let plain = exp_tile(v);
            assert!(
                (g - plain).abs() <= f32::EPSILON * plain,
                "e^{v}: {g} vs plain {plain}"
            );
        }
    }
    let low = [-87.0f32, -88.0, -1e6, f32::NEG_INFINITY].repeat(4);
    // SAFETY: as above.
    for g in unsafe { crate::kernels::x86::exp_tile_of(low.as_slice().try_into().unwrap()) } {
        assert!(g > 0.0 && g < 1e-37, "clamped: {g}");
    }
}

/// The tiles' softmax reduces sixteen queries' sums at once, each in its own lane with the bits
/// `_mm512_reduce_add_ps` gives that query's sum alone (so a row's result still does not depend
/// on the rows beside it).
#[test]
#[cfg(target_arch = "x86_64")]
#[ignore = "needs AVX-512: run with --ignored on a CPU that has it (.ci/run does)"]
fn sums_reduced_together_equal_each_alone() {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        crate::cannot_run::cannot_run("no AVX-512 here");
        return;
    }
    for seed in 0..20u64 {
        let x = random_vec(256, 90 + seed);
        // Magnitudes far apart, so that the order of the additions shows in the bits.
        let rows: [[f32; 16]; 16] = std::array::from_fn(|i| {
            std::array::from_fn(|l| x[16 * i + l] * 10f32.powi((l % 7) as i32 - 3))
        });
        // SAFETY: AVX-512 F is available (checked above).
        let (together, alone) = unsafe { crate::kernels::x86::sums_at_once_and_alone(&rows) };
        for i in 0..16 {
            assert_eq!(
                together[i].to_bits(),
                alone[i].to_bits(),
                "seed {seed} row {i}"
            );
        }
    }
}

/// The arithmetic of attention on bf16 tiles, plainly: the query times the scale rounded to
/// bf16, each score a sum of exact bf16 products in f32, the online softmax of `attend_plain`
/// over the tiles' blocks (`TILE_BLOCK` positions) with the tiles' exponential (`exp_tile`), each
/// block's weights rounded to bf16, the output rescaled and its weighted values added to it in
/// f32. The tiles add their products in an order of their own, so the kernel agrees with this
/// to rounding, not bit for bit.
#[cfg(target_arch = "x86_64")]
fn tiles_plain(
    qh: &[f32],
    (keys, values): (&[bf16], &[bf16]),
    strides: (usize, usize),
    scale: f32,
    len: usize,
) -> Vec<f32> {
    let (key_stride, value_stride) = strides;
    let hd = qh.len();
    let q: Vec<f32> = qh
        .iter()
        .map(|&x| bf16::from_f32(x * scale).to_f32())
        .collect();
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    let mut out = vec![0f32; hd];
    let step = crate::kernels::x86::TILE_BLOCK;
    for b0 in (0..len).step_by(step) {
        let block: Vec<usize> = (b0..len.min(b0 + step)).collect();
        let mut w: Vec<f32> = block
            .iter()
            .map(|&t| {
                (0..hd).fold(0f32, |a, i| {
                    a + q[i] * keys[bf16::key_at(i, t, key_stride)].to_f32()
                })
            })
            .collect();
        let block_max = w.iter().copied().fold(max, f32::max);
        let rescale = exp_tile(max - block_max);
        for x in w.iter_mut() {
            *x = exp_tile(*x - block_max);
        }
        sum = sum.mul_add(rescale, w.iter().sum::<f32>());
        max = block_max;
        for (i, o) in out.iter_mut().enumerate() {
            let rescaled = if rescale == 1.0 { *o } else { *o * rescale };
            *o = block.iter().zip(&w).fold(rescaled, |a, (&t, &x)| {
                a + bf16::from_f32(x).to_f32() * values[bf16::value_at(t, i, value_stride)].to_f32()
            });
        }
    }
    out.iter().map(|o| o / sum).collect()
}

/// The steps of the tiles' exponential (`amx_softmax::exp_tile`) on one number.
#[cfg(target_arch = "x86_64")]
fn exp_tile(x: f32) -> f32 {
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let p = [120.0f32, 24.0, 6.0, 2.0, 1.0, 1.0]
        .iter()
        .fold(1.0f32 / 720.0, |p, c| p.mul_add(r, 1.0 / c));
    p * 2f32.powi(n as i32)
}

/// Where attention runs on bf16 tiles: every row of a pass agrees with `tiles_plain` to within
/// f32 rounding, and with the f32 arithmetic of the plain version over the same cache to within
/// bf16's rounding of the queries and weights; several rows, each a different length, one block
/// and several, head sizes of 64, 128 and 256.
#[test]
#[cfg(target_arch = "x86_64")]
#[ignore = "needs AMX-BF16: run with --ignored on a CPU that has it (.ci/run does)"]
fn bf16_tiles_match_their_plain_arithmetic() {
    if !tiles_attend(Isa::Amx, 64) {
        crate::cannot_run::cannot_run("no AMX-BF16 here");
        return;
    }
    for &(hd, group, len, rows) in &[
        (64usize, 3usize, 37usize, 1usize),
        (128, 6, 530, 8),
        (128, 6, 64, 3),
        (256, 4, 200, 2),
        (64, 7, 1000, 20),
        (32, 2, 70, 5),
    ] {
        let q_stride = group * hd;
        let q = random_vec(rows * q_stride, 70 + hd as u64);
        let key_stride = len.next_multiple_of(32) + 32;
        let (keys, values) = head_of::<bf16>(
            (hd, len),
            (key_stride, hd),
            |i, t| noise(71 + len as u64, i, t),
            |t, d| noise(72 + len as u64, t, d),
        );
        let scale = 2.0 / (hd as f32).sqrt();
        let kv = KvHead::new(&keys, &values, key_stride, hd, hd, len);
        let tiles = attend_all(Isa::Amx, &q, q_stride, rows, group, kv, scale, None);
        let plain = attend_all(Isa::Scalar, &q, q_stride, rows, group, kv, scale, None);
        for r in 0..rows {
            for g in 0..group {
                let qh = &q[r * q_stride + g * hd..][..hd];
                let n = len - (rows - 1 - r);
                let want = tiles_plain(qh, (&keys, &values), (key_stride, hd), scale, n);
                let at = (r * group + g) * hd;
                let what = format!("hd {hd} len {len} row {r} head {g}");
                for i in 0..hd {
                    let (got, w, f) = (tiles[at + i], want[i], plain[at + i]);
                    assert!((got - w).abs() <= 2e-5, "{what} [{i}]: {got} vs {w}");
                    assert!((got - f).abs() <= 2e-2, "{what} [{i}]: {got} vs f32's {f}");
                }
            }
        }
    }
}

/// A head skipping an odd number of positions (a sliding window's rows): on a paired (bf16)
/// head the kept positions are stored one place on; every implementation gives the
/// textbook's values over the kept positions, and f32's too.
#[test]
fn a_paired_head_skips_an_odd_number_of_positions() {
    fn check<E: KvElem>() {
        let (hd, group, len, skip) = (64usize, 3usize, 150usize, 37usize);
        let key_stride = len + 32;
        let (keys, values) = head_of::<E>(
            (hd, len),
            (key_stride, hd),
            |i, t| noise(90, i, t),
            |t, d| noise(91, t, d),
        );
        let q = random_vec(group * hd, 92);
        let scale = 1.0 / (hd as f32).sqrt();
        let kv = KvHead::new(&keys, &values, key_stride, hd, hd, len).skip(skip);
        let seen: Vec<usize> = (skip..len).collect();
        for isa in Isa::available() {
            let mut got = vec![0f32; group * hd];
            attend_with(isa, &q, kv, scale, &mut Vec::new(), &mut got);
            for (g, qh) in q.chunks(hd).enumerate() {
                let want = textbook(qh, &keys, &values, (key_stride, hd), scale, &seen);
                let what = format!("{isa:?} {:?} head {g}", E::KIND);
                assert_near(&got[g * hd..(g + 1) * hd], &want, &what);
            }
        }
    }
    check::<f32>();
    check::<bf16>();
}
