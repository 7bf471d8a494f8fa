use super::*;
use candle_core::quantized::GgmlDType;
use half::f16;

/// `v` as a KV cache of number type `E` stores it (rounded once).
fn cached<E: KvElem>(v: Vec<f32>) -> Vec<E> {
    v.into_iter().map(E::from_f32).collect()
}

/// Deterministic pseudo-random floats in [-1, 1) (no extra dependency needed for a few tests).
fn random_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

const TYPES: [GgmlDType; 12] = [
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// Every format's matmul against the f64 product of the dequantized weights. The activations are
/// quantized to 8 bits (Q8_0 / Q8_1 / Q8_K) by the kernel, which bounds the error at a small
/// fraction of the product's magnitude; the tolerance is relative to the sum of |x * w|.
#[test]
fn matmul_matches_reference_for_every_format() {
    for (ti, &dtype) in TYPES.iter().enumerate() {
        let cols = if dtype.block_size() == 256 { 512 } else { 96 };
        for &(m, rows) in &[(1usize, 7usize), (3, 33), (9, 17)] {
            let w = random_vec(rows * cols, 1 + ti as u64);
            let q = quantize(dtype, &w);
            let mat = QMatrix::new(dtype, rows, cols, Bytes::owned(&q)).unwrap();
            let x = random_vec(m * cols, 100 + m as u64);
            let mut out = vec![0f32; m * rows];
            matmul(&x, m, &mat, &mut out);
            let reference = matmul_reference(&x, m, &mat);
            let wf = mat.dequantize();
            for i in 0..m {
                for j in 0..rows {
                    let mag = product_magnitude(&x, &wf, cols, i, j);
                    let (a, b) = (out[i * rows + j], reference[i * rows + j]);
                    assert!(
                        (a - b).abs() <= 0.02 * mag + 1e-4,
                        "{dtype:?} m={m} ({i},{j}): {a} vs {b} (magnitude {mag})"
                    );
                }
            }
        }
    }
}

/// A row's result must not depend on which other rows share the product.
#[test]
fn matmul_rows_are_independent_of_batch() {
    for &dtype in &[
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
    ] {
        let cols = 512;
        let rows = 40;
        let mat = QMatrix::new(
            dtype,
            rows,
            cols,
            Bytes::owned(&quantize(dtype, &random_vec(rows * cols, 7))),
        )
        .unwrap();
        let x = random_vec(5 * cols, 9);
        let mut all = vec![0f32; 5 * rows];
        matmul(&x, 5, &mat, &mut all);
        for i in 0..5 {
            let mut one = vec![0f32; rows];
            matmul(&x[i * cols..(i + 1) * cols], 1, &mat, &mut one);
            assert_eq!(one, all[i * rows..(i + 1) * rows], "{dtype:?} row {i}");
        }
    }
}

#[test]
fn matrix_shape_errors_are_reported() {
    let q = quantize(GgmlDType::Q8_0, &random_vec(64, 1));
    assert!(QMatrix::new(GgmlDType::Q8_0, 2, 48, Bytes::owned(&q)).is_err());
    assert!(QMatrix::new(GgmlDType::Q8_0, 3, 32, Bytes::owned(&q)).is_err());
    assert!(QMatrix::new(GgmlDType::Q8_0, 2, 32, Bytes::owned(&q)).is_ok());
}

#[test]
fn float_helpers_match_plain_loops() {
    for n in [1usize, 7, 8, 9, 63, 64, 130] {
        let a = random_vec(n, n as u64);
        let b = random_vec(n, 1000 + n as u64);
        let plain: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - plain).abs() < 1e-4, "dot n={n}");
        assert!(
            (dot_scalar(&a, &b) as f64 - plain).abs() < 1e-4,
            "dot_scalar n={n}"
        );
        let mut s = a.clone();
        softmax(&mut s);
        let total: f32 = s.iter().sum();
        assert!((total - 1.0).abs() < 1e-5);
        let w = vec![1.0f32; n];
        let mut o = vec![0f32; n];
        rms_norm(&a, &w, 1e-6, &mut o);
        let ms: f32 = o.iter().map(|v| v * v).sum::<f32>() / n as f32;
        assert!((ms - 1.0).abs() < 1e-3, "rms n={n}: {ms}");
    }
}

const OWN: [GgmlDType; 6] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q6K,
];

/// Our sub-block decoding gives exactly candle's dequantized values.
#[test]
fn own_decoding_equals_candle_dequantization() {
    for (ti, &dtype) in OWN.iter().enumerate() {
        let f = format::Format::from_ggml(dtype).unwrap();
        let (elems, bytes) = f.super_block();
        let cols = elems * 3;
        let data = random_vec(2 * cols, 50 + ti as u64);
        let q = quantize(dtype, &data);
        let mat = QMatrix::new(dtype, 2, cols, Bytes::owned(&q)).unwrap();
        let reference = mat.dequantize();
        for (s, sb) in q.chunks_exact(bytes).enumerate() {
            let values = f.dequantize_super_block(sb);
            for (e, v) in values.iter().enumerate() {
                let r = reference[s * elems + e];
                assert!(
                    (v - r).abs() <= 1e-6 * r.abs().max(1.0),
                    "{dtype:?} super-block {s} element {e}: {v} vs {r}"
                );
            }
        }
    }
}

/// Every implementation (scalar, AVX2, VNNI) of every own format, at awkward row counts, against
/// the plain f64 product of the dequantized weights and against each other.
#[test]
fn every_isa_matches_the_scalar_reference() {
    for (ti, &dtype) in OWN.iter().enumerate() {
        let cols = if dtype.block_size() == 256 { 768 } else { 96 };
        let rows = 37;
        let w = random_vec(rows * cols, 200 + ti as u64);
        let mat = QMatrix::new(dtype, rows, cols, Bytes::owned(&quantize(dtype, &w))).unwrap();
        let wf = mat.dequantize();
        for m in [1usize, 3, 5, 8, 13, 33] {
            let x = random_vec(m * cols, 300 + m as u64);
            let mut scalar = vec![0f32; m * rows];
            matmul_with(Isa::Scalar, &x, m, &mat, &mut scalar);
            let reference = matmul_reference(&x, m, &mat);
            for isa in Isa::available() {
                let mut out = vec![0f32; m * rows];
                matmul_with(isa, &x, m, &mat, &mut out);
                for i in 0..m {
                    for j in 0..rows {
                        let mag: f32 = (0..cols)
                            .map(|t| (x[i * cols + t] * wf[j * cols + t]).abs())
                            .sum();
                        let (a, s, r) = (
                            out[i * rows + j],
                            scalar[i * rows + j],
                            reference[i * rows + j],
                        );
                        assert!(
                            (a - s).abs() <= 1e-5 * mag + 1e-6,
                            "{isa:?} {dtype:?} m={m} ({i},{j}): {a} vs scalar {s}"
                        );
                        assert!(
                            (a - r).abs() <= 0.02 * mag + 1e-4,
                            "{isa:?} {dtype:?} m={m} ({i},{j}): {a} vs f64 reference {r}"
                        );
                    }
                }
                // Each row alone gives bit-identical results to the row inside the batch.
                for i in [0, m - 1] {
                    let mut one = vec![0f32; rows];
                    matmul_with(isa, &x[i * cols..(i + 1) * cols], 1, &mat, &mut one);
                    assert_eq!(
                        one,
                        out[i * rows..(i + 1) * rows],
                        "{isa:?} {dtype:?} m={m} row {i}"
                    );
                }
            }
        }
    }
}

/// The packed Q4_K scales and mins, unpacked four bytes at a time, equal the byte-by-byte rule.
#[test]
fn q4k_scales_and_mins_unpack_bytewise() {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..1000 {
        let mut bytes = [0u8; 12];
        for b in bytes.iter_mut() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *b = (s >> 32) as u8;
        }
        let (sc, m) = format::q4k_scales_mins(&bytes);
        for j in 0..8 {
            let (want_sc, want_m) = if j < 4 {
                (bytes[j] & 63, bytes[j + 4] & 63)
            } else {
                (
                    (bytes[j + 4] & 0xF) | ((bytes[j - 4] >> 6) << 4),
                    (bytes[j + 4] >> 4) | ((bytes[j] >> 6) << 4),
                )
            };
            assert_eq!((sc[j], m[j]), (want_sc, want_m), "{bytes:?} sub-block {j}");
        }
    }
}

/// Attention over a strided cache equals the plain version, for awkward head sizes and groups.
#[test]
fn attention_matches_the_scalar_reference() {
    attention_matches_the_scalar_reference_for::<f32>();
    attention_matches_the_scalar_reference_for::<f16>();
}

fn attention_matches_the_scalar_reference_for<E: KvElem>() {
    for &(hd, group, len, stride) in &[
        (64usize, 3usize, 37usize, 192usize),
        (40, 7, 5, 80),
        (128, 1, 1, 256),
        (13, 2, 9, 13),
        (128, 6, 530, 256),
        (64, 7, 100, 128),
        (32, 2, 8, 32),
        (256, 3, 19, 256),
    ] {
        let q = random_vec(group * hd, hd as u64);
        // Key rows a little longer than the positions, at an odd stride.
        let key_stride = len + hd % 7;
        let keys: Vec<E> = cached(random_vec((hd - 1) * key_stride + len, 11 + len as u64));
        let values: Vec<E> = cached(random_vec((len - 1) * stride + hd, 12 + len as u64));
        let scale = 1.0 / (hd as f32).sqrt();
        let mut scores = vec![0f32; group * len];
        let mut want = vec![0f32; group * hd];
        let kv = KvHead::new(&keys, &values, key_stride, stride, hd, len);
        attend_scalar(&q, kv, scale, &mut scores, &mut want);
        let mut got = vec![0f32; group * hd];
        for isa in Isa::available() {
            attend_with(isa, &q, kv, scale, &mut Vec::new(), &mut got);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5,
                    "{isa:?} hd {hd} group {group} len {len} [{i}]: {a} vs {b}"
                );
            }
        }
        // Each output is a convex combination of the values: within their range.
        let (lo, hi) = values.iter().fold((f32::MAX, f32::MIN), |(l, h), v| {
            (l.min(v.to_f32()), h.max(v.to_f32()))
        });
        assert!(got.iter().all(|v| *v >= lo - 1e-5 && *v <= hi + 1e-5));
    }
}

/// Rows long enough that the 32-element kernels apply weight offsets in several runs of blocks
/// (and an odd block count, so the last block is handled on its own).
#[test]
fn long_rows_match_the_scalar_reference() {
    for (ti, &dtype) in [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q8_0,
    ]
    .iter()
    .enumerate()
    {
        let (rows, cols, m) = (3, 32 * 601, 2);
        let w = random_vec(rows * cols, 500 + ti as u64);
        let mat = QMatrix::new(dtype, rows, cols, Bytes::owned(&quantize(dtype, &w))).unwrap();
        let x = random_vec(m * cols, 600 + ti as u64);
        let mut scalar = vec![0f32; m * rows];
        matmul_with(Isa::Scalar, &x, m, &mat, &mut scalar);
        for isa in Isa::available() {
            let mut out = vec![0f32; m * rows];
            matmul_with(isa, &x, m, &mat, &mut out);
            for (a, s) in out.iter().zip(&scalar) {
                assert!(
                    (a - s).abs() <= 1e-4 * s.abs().max(1.0),
                    "{isa:?} {dtype:?}: {a} vs {s}"
                );
            }
        }
    }
}

/// The sum of |x[i, t] * w[j, t]| over the columns: the scale of output (i, j)'s rounding error.
fn product_magnitude(x: &[f32], wf: &[f32], cols: usize, i: usize, j: usize) -> f32 {
    (0..cols)
        .map(|t| (x[i * cols + t] * wf[j * cols + t]).abs())
        .sum()
}

/// The SIMD activation quantization gives exactly the plain version's integers and scales.
#[test]
fn activation_quantization_is_the_same_on_every_isa() {
    let (rows, k) = (3, 512);
    let mut x = random_vec(rows * k, 77);
    // A block of zeros, a block with huge and tiny values, values exactly halfway.
    x[32..64].fill(0.0);
    x[64] = 1e30;
    x[65] = -1e-30;
    for (i, v) in x[96..128].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 0.5;
    }
    for block in [32, 256] {
        let mut plain = quant::QuantizedActs::default();
        plain.quantize_with(Isa::Scalar, &x, rows, k, block);
        for isa in Isa::available() {
            let mut simd = quant::QuantizedActs::default();
            simd.quantize_with(isa, &x, rows, k, block);
            assert_eq!(simd.q, plain.q, "{isa:?} block {block}");
            assert_eq!(simd.d, plain.d, "{isa:?} block {block}");
            assert_eq!(simd.ds, plain.ds, "{isa:?} block {block}");
            assert_eq!(simd.bsums, plain.bsums, "{isa:?} block {block}");
        }
    }
}

/// Many rows at once (quantized in runs on the pool's threads) give every row exactly what
/// quantizing it alone gives.
#[test]
fn activation_quantization_of_many_rows_equals_each_row_alone() {
    let (rows, k) = (37, 1024);
    let x = random_vec(rows * k, 78);
    for block in [32, 256] {
        let mut all = quant::QuantizedActs::default();
        all.quantize(&x, rows, k, block);
        for r in 0..rows {
            let mut one = quant::QuantizedActs::default();
            one.quantize(&x[r * k..(r + 1) * k], 1, k, block);
            let (b, s32, s16) = (k / block, k / 32, k / 16);
            assert_eq!(
                all.q[r * k..(r + 1) * k],
                one.q[..],
                "block {block} row {r}"
            );
            assert_eq!(
                all.d[r * b..(r + 1) * b],
                one.d[..b],
                "block {block} row {r}"
            );
            assert_eq!(all.ds[r * s32..(r + 1) * s32], one.ds[..s32]);
            assert_eq!(all.isums[r * s32..(r + 1) * s32], one.isums[..]);
            assert_eq!(all.bsums[r * s16..(r + 1) * s16], one.bsums[..]);
        }
    }
}

/// Softmax and SwiGLU (vectorized exponential) against their plain versions, over lengths with
/// and without a tail and values from far below to far above zero.
#[test]
fn softmax_and_swiglu_match_their_plain_versions() {
    for n in [1usize, 7, 8, 9, 64, 515] {
        let x: Vec<f32> = random_vec(n, 900 + n as u64)
            .iter()
            .map(|v| v * 40.0)
            .collect();
        let (mut a, mut b) = (x.clone(), x.clone());
        softmax(&mut a);
        softmax_scalar(&mut b);
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert!(
                (p - q).abs() <= 1e-6 * q.abs() + 1e-30,
                "softmax n={n} [{i}]: {p} vs {q}"
            );
        }
        let up = random_vec(n, 950 + n as u64);
        let (mut a, mut b) = (x.clone(), x.clone());
        swiglu(&mut a, &up);
        swiglu_scalar(&mut b, &up);
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert!(
                (p - q).abs() <= 1e-6 * q.abs() + 1e-30,
                "swiglu n={n} [{i}] at {}: {p} vs {q}",
                x[i]
            );
        }
    }
}

/// `attend_rows` over `rows` consecutive rows of `group` query heads each, no tree mask: every
/// row's outputs, in order.
fn attend_all(
    isa: Isa,
    q: &[f32],
    q_stride: usize,
    rows: usize,
    group: usize,
    kv: KvHead<'_>,
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0f32; rows * group * kv.hd];
    attend_rows(
        isa,
        q,
        q_stride,
        rows,
        kv,
        scale,
        None,
        &mut Vec::new(),
        &mut out,
    );
    out
}

/// Several consecutive rows at once: each row bit-identical to `attend` on that row alone (same
/// implementation), and close to the plain loops.
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
    ] {
        let q_stride = group * hd + 16;
        let q = random_vec((rows - 1) * q_stride + group * hd, 31 + hd as u64);
        let key_stride = len.next_multiple_of(16) + 16;
        let keys: Vec<E> = cached(random_vec(hd * key_stride, 32 + len as u64));
        let values: Vec<E> = cached(random_vec((len - 1) * stride + hd, 33 + len as u64));
        let scale = 1.0 / (hd as f32).sqrt();
        let kv = KvHead::new(&keys, &values, key_stride, stride, hd, len);
        for isa in Isa::available() {
            let all = attend_all(isa, &q, q_stride, rows, group, kv, scale);
            for r in 0..rows {
                let row_kv = KvHead {
                    len: len - (rows - 1 - r),
                    ..kv
                };
                let qr = &q[r * q_stride..r * q_stride + group * hd];
                let mut one = vec![0f32; group * hd];
                attend_with(isa, qr, row_kv, scale, &mut Vec::new(), &mut one);
                let got = &all[r * group * hd..(r + 1) * group * hd];
                assert_eq!(got, &one[..], "{isa:?} hd {hd} rows {rows} row {r}");
                let mut plain = vec![0f32; group * hd];
                attend_scalar(
                    qr,
                    row_kv,
                    scale,
                    &mut vec![0.0; group * row_kv.len],
                    &mut plain,
                );
                for (a, b) in got.iter().zip(&plain) {
                    assert!((a - b).abs() <= 1e-5, "{isa:?} hd {hd} row {r}: {a} vs {b}");
                }
            }
        }
    }
}

/// A draft tree's rows: each row, seeing the committed positions and its ancestors only, gets
/// exactly (bit for bit) what `attend` gives over a cache holding just those positions in order,
/// which is what decoding the row's path one token at a time would have in its cache.
#[test]
fn tree_rows_equal_their_path_alone() {
    tree_rows_equal_their_path_alone_for::<f32>();
    tree_rows_equal_their_path_alone_for::<f16>();
}

fn tree_rows_equal_their_path_alone_for<E: KvElem>() {
    use crate::kernels::TreeMask;
    for &(hd, group, start, rows, seed) in &[
        (64usize, 3usize, 40usize, 12usize, 1u64),
        (32, 2, 7, 30, 2),
        (128, 1, 100, 64, 3),
        (40, 2, 3, 5, 4),
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
        for isa in Isa::available() {
            let mut all = vec![0f32; rows * group * hd];
            let tree = TreeMask {
                start,
                rows: &masks,
            };
            attend_rows(
                isa,
                &q,
                q_stride,
                rows,
                kv,
                scale,
                Some(tree),
                &mut Vec::new(),
                &mut all,
            );
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
                assert_eq!(got, &one[..], "{isa:?} hd {hd} rows {rows} row {r}");
                let mut plain = vec![0f32; group * hd];
                attend_scalar(qr, path_kv, scale, &mut vec![0.0; group * n], &mut plain);
                for (a, b) in got.iter().zip(&plain) {
                    assert!((a - b).abs() <= 1e-5, "{isa:?} hd {hd} row {r}: {a} vs {b}");
                }
            }
        }
    }
}

/// An implementation the CPU lacks is refused before any of its instructions run (where there is
/// one to try).
#[test]
fn an_isa_the_cpu_lacks_is_refused() {
    let Some(&lacking) = [Isa::Avx512Vnni, Isa::Avx512, Isa::Avx2Vnni, Isa::Avx2]
        .iter()
        .find(|i| !i.is_available())
    else {
        return;
    };
    let mat = QMatrix::new(
        GgmlDType::Q4K,
        16,
        256,
        Bytes::owned(&quantize(GgmlDType::Q4K, &random_vec(16 * 256, 1))),
    )
    .unwrap();
    let x = random_vec(256, 2);
    let product = std::panic::catch_unwind(|| matmul_with(lacking, &x, 1, &mat, &mut [0f32; 16]));
    assert!(product.is_err(), "{lacking:?} product ran");
    let kv = KvHead::new(&x, &x, 16, 16, 16, 16);
    let attention = std::panic::catch_unwind(|| {
        attend_with(lacking, &x[..16], kv, 1.0, &mut Vec::new(), &mut [0f32; 16])
    });
    assert!(attention.is_err(), "{lacking:?} attention ran");
}

mod packed_kernels;

/// The vector attention kernels are the fused chains they claim to be: every score is a fused
/// multiply-add chain over the dimensions in order, then scaled; every output a fused chain over
/// the positions in order. A plain loop of `mul_add`s in those orders (with the kernels' own
/// softmax) gives the same bits on every vector class, for one row or several (row `r` of `rows`
/// sees all but the last `rows - 1 - r` positions), whatever the tiles, tails and blocks.
#[test]
fn attention_kernels_are_the_fused_chains_they_claim() {
    attention_kernels_are_the_fused_chains_they_claim_for::<f32>();
    attention_kernels_are_the_fused_chains_they_claim_for::<f16>();
}

fn attention_kernels_are_the_fused_chains_they_claim_for<E: KvElem>() {
    let shapes = [
        (64usize, 7usize, 300usize, 1usize),
        (64, 7, 300, 9),
        (128, 6, 77, 5),
        (24, 3, 45, 4),
        (64, 2, 1, 1),
        (64, 2, 70, 70),
    ];
    for &(hd, group, len, rows) in &shapes {
        let key_stride = len.next_multiple_of(16) + 16;
        let q_stride = group * hd;
        let q = random_vec(rows * q_stride, 71 + hd as u64);
        let keys: Vec<E> = cached(random_vec(hd * key_stride, 72 + len as u64));
        let values: Vec<E> = cached(random_vec(len * hd, 73 + len as u64));
        let scale = 1.0 / (hd as f32).sqrt();
        let mut want = vec![0f32; rows * group * hd];
        for r in 0..rows {
            let seen = len - (rows - 1 - r);
            for g in 0..group {
                let qg = &q[r * q_stride + g * hd..][..hd];
                let mut sc: Vec<f32> = (0..seen)
                    .map(|t| {
                        let dot = (0..hd).fold(0f32, |a, i| {
                            qg[i].mul_add(keys[i * key_stride + t].to_f32(), a)
                        });
                        dot * scale
                    })
                    .collect();
                softmax(&mut sc);
                for d in 0..hd {
                    want[(r * group + g) * hd + d] =
                        (0..seen).fold(0f32, |a, t| sc[t].mul_add(values[t * hd + d].to_f32(), a));
                }
            }
        }
        let kv = KvHead::new(&keys, &values, key_stride, hd, hd, len);
        for isa in Isa::available().into_iter().filter(|&i| i != Isa::Scalar) {
            let got = attend_all(isa, &q, q_stride, rows, group, kv, scale);
            let bad = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert!(
                bad.is_none(),
                "{isa:?} hd {hd} group {group} len {len} rows {rows}: {bad:?}"
            );
        }
    }
}
