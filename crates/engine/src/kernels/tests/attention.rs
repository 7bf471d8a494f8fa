//! Attention: every implementation the CPU has against the plain version (`Isa::Scalar`) bit for
//! bit, that one against the textbook formula in f64, and a row's result the same alone, in a
//! batch of rows and as a node of a draft tree.

use super::*;
use crate::kernels::elementwise::exp_lane;

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
                .map(|i| qh[i] as f64 * keys[i * key_stride + t].to_f32() as f64)
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
                .map(|(&t, w)| w * values[t * value_stride + i].to_f32() as f64)
                .sum();
            dot / sum
        })
        .collect()
}

/// Asserts `got` is the textbook result within 1e-5.
fn assert_near(got: &[f32], want: &[f64], what: &str) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((*a as f64 - b).abs() <= 1e-5, "{what} [{i}]: {a} vs {b}");
    }
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
fn attend_all(
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
        let q = random_vec(group * hd, hd as u64);
        // Key rows a little longer than the positions, at an odd stride; later keys a little
        // larger, so that later blocks raise the maximum.
        let key_stride = len + hd % 7;
        let ramp = |v: Vec<f32>| -> Vec<f32> {
            let at = |k: usize| (k % key_stride) as f32 / len as f32;
            v.iter()
                .enumerate()
                .map(|(k, x)| x + at(k) * x.signum())
                .collect()
        };
        let keys: Vec<E> = cached(ramp(random_vec(
            (hd - 1) * key_stride + len,
            11 + len as u64,
        )));
        let values: Vec<E> = cached(random_vec((len - 1) * stride + hd, 12 + len as u64));
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
        for isa in Isa::available() {
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
    ] {
        let q_stride = group * hd + 16;
        let q = random_vec((rows - 1) * q_stride + group * hd, 31 + hd as u64);
        let key_stride = len.next_multiple_of(16) + 16;
        let keys: Vec<E> = cached(random_vec(hd * key_stride, 32 + len as u64));
        let values: Vec<E> = cached(random_vec((len - 1) * stride + hd, 33 + len as u64));
        let scale = 1.0 / (hd as f32).sqrt();
        let kv = KvHead::new(&keys, &values, key_stride, stride, hd, len);
        let plain = attend_all(Isa::Scalar, &q, q_stride, rows, group, kv, scale, None);
        for isa in Isa::available() {
            let all = attend_all(isa, &q, q_stride, rows, group, kv, scale, None);
            let what = format!("{isa:?} hd {hd} len {len} rows {rows}");
            assert_same_bits(&all, &plain, &what);
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

/// A draft tree's rows, its first position anywhere in a block (so that the positions a node
/// sees, packed, fill one block or spill into the next): each row, seeing the committed positions
/// and its ancestors only, gets exactly (bit for bit) what `attend` gives over a cache holding
/// just those positions in order, which is what decoding the row's path one token at a time
/// would have in its cache; on every implementation, the plain version's bits.
#[test]
fn tree_rows_equal_their_path_alone() {
    tree_rows_equal_their_path_alone_for::<f32>();
    tree_rows_equal_their_path_alone_for::<f16>();
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
    ] {
        let len = start + rows;
        let stride = hd + 8;
        let q_stride = group * hd + 16;
        let q = random_vec((rows - 1) * q_stride + group * hd, 50 + seed);
        let key_stride = len.next_multiple_of(16) + 16;
        let keys: Vec<E> = cached(random_vec(hd * key_stride, 51 + seed));
        let values: Vec<E> = cached(random_vec((len - 1) * stride + hd, 52 + seed));
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
            assert_same_bits(&all, &plain, &what);
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
                let mut pk = vec![E::ZERO; hd * ks];
                let mut pv = vec![E::ZERO; n * stride];
                for (j, &t) in seen.iter().enumerate() {
                    for i in 0..hd {
                        pk[i * ks + j] = keys[i * key_stride + t];
                    }
                    pv[j * stride..j * stride + hd]
                        .copy_from_slice(&values[t * stride..t * stride + hd]);
                }
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
