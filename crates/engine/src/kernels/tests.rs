use super::*;
use candle_core::quantized::GgmlDType;
use half::f16;

/// Whether the Amx class's kernels can run here (the OS granted the tile state and the CPU has
/// AVX-512 VNNI besides); where not, the calling test says why as one that cannot run.
fn amx_runs_here() -> bool {
    let why = match isa::amx_status() {
        Err(why) => why,
        Ok(()) if Isa::Amx.is_available() => return true,
        Ok(()) => "the CPU has AMX but not AVX-512 VNNI",
    };
    crate::cannot_run::cannot_run(why);
    false
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

const TYPES: [TensorType; 13] = [
    TensorType::Ggml(GgmlDType::F32),
    TensorType::Ggml(GgmlDType::F16),
    TensorType::Ggml(GgmlDType::Q4_0),
    TensorType::Ggml(GgmlDType::Q4_1),
    TensorType::Ggml(GgmlDType::Q5_0),
    TensorType::Ggml(GgmlDType::Q5_1),
    TensorType::Ggml(GgmlDType::Q8_0),
    TensorType::Ggml(GgmlDType::Q2K),
    TensorType::Ggml(GgmlDType::Q3K),
    TensorType::Ggml(GgmlDType::Q4K),
    TensorType::Ggml(GgmlDType::Q5K),
    TensorType::Ggml(GgmlDType::Q6K),
    TensorType::Mxfp4,
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
    for dtype in [
        TensorType::Ggml(GgmlDType::Q4_1),
        TensorType::Ggml(GgmlDType::Q5_0),
        TensorType::Ggml(GgmlDType::Q4K),
        TensorType::Ggml(GgmlDType::Q6K),
        TensorType::Mxfp4,
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

const OWN: [TensorType; 7] = [
    TensorType::Ggml(GgmlDType::Q4_0),
    TensorType::Ggml(GgmlDType::Q4_1),
    TensorType::Ggml(GgmlDType::Q5_0),
    TensorType::Ggml(GgmlDType::Q8_0),
    TensorType::Ggml(GgmlDType::Q4K),
    TensorType::Ggml(GgmlDType::Q6K),
    TensorType::Mxfp4,
];

/// Our sub-block decoding gives exactly candle's dequantized values (MXFP4, which candle has not
/// got: our decoding against our dequantization, which `mxfp4_dequantizes_as_gguf_py` checks).
#[test]
fn own_decoding_equals_candle_dequantization() {
    for (ti, &dtype) in OWN.iter().enumerate() {
        let f = format::Format::from_type(dtype).unwrap();
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

/// Rows long enough that the 32-element kernels apply weight offsets in several runs of blocks
/// (and an odd block count, so the last block is handled on its own).
#[test]
fn long_rows_match_the_scalar_reference() {
    for (ti, &dtype) in [
        TensorType::Ggml(GgmlDType::Q4_0),
        TensorType::Ggml(GgmlDType::Q4_1),
        TensorType::Ggml(GgmlDType::Q5_0),
        TensorType::Ggml(GgmlDType::Q8_0),
        TensorType::Mxfp4,
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

/// A hand-built MXFP4 block (code `j` low and `15 - j` high in byte `j`) at exponents across the
/// range, against the values gguf-py (llama.cpp's Python package) dequantizes it to, as f32 bits:
/// the scale `2^(e - 128)` from the subnormal 2^-128 up (12 * 2^126 and above overflow to -inf,
/// in ggml as here), and the whole block at e = 127.
#[test]
fn mxfp4_dequantizes_as_gguf_py() {
    // Per exponent: the values of elements 1, 15, 16, 17 and 31 (codes 1, 15, 15, 14, 0).
    #[rustfmt::skip]
    let table: [(u8, [u32; 5]); 8] = [
        (0, [0x0020_0000, 0x8140_0000, 0x8140_0000, 0x8100_0000, 0]),
        (1, [0x0040_0000, 0x81c0_0000, 0x81c0_0000, 0x8180_0000, 0]),
        (2, [0x0080_0000, 0x8240_0000, 0x8240_0000, 0x8200_0000, 0]),
        (127, [0x3f00_0000, 0xc0c0_0000, 0xc0c0_0000, 0xc080_0000, 0]),
        (128, [0x3f80_0000, 0xc140_0000, 0xc140_0000, 0xc100_0000, 0]),
        (200, [0x6380_0000, 0xe540_0000, 0xe540_0000, 0xe500_0000, 0]),
        (254, [0x7e80_0000, 0xff80_0000, 0xff80_0000, 0xff80_0000, 0]),
        (255, [0x7f00_0000, 0xff80_0000, 0xff80_0000, 0xff80_0000, 0]),
    ];
    let mut blk = [0u8; 17];
    for j in 0..16 {
        blk[1 + j] = j as u8 | ((15 - j as u8) << 4);
    }
    for (e, want) in table {
        blk[0] = e;
        let m = QMatrix::new(TensorType::Mxfp4, 1, 32, Bytes::owned(&blk)).unwrap();
        let v = m.dequantize();
        let got = [1, 15, 16, 17, 31].map(|i| v[i].to_bits());
        assert_eq!(got, want, "e = {e}");
        let f = format::Format::Mxfp4;
        let decoded: Vec<u32> = f
            .dequantize_super_block(&blk)
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(decoded, v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }
    blk[0] = 127;
    let whole = QMatrix::new(TensorType::Mxfp4, 1, 32, Bytes::owned(&blk))
        .unwrap()
        .dequantize();
    // As gguf-py prints them (code 8, "-0", is +0.0 there too).
    let codes = [
        0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    let want: Vec<f32> = codes.iter().chain(codes.iter().rev()).copied().collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&whole), bits(&want));
}

/// MXFP4 quantization (ggml's reference rule): the exponent puts the largest magnitude at 8..16
/// times the scale (past 12, the largest value, it clips), every other value takes its nearest
/// code, a block of zeros has exponent 0.
#[test]
fn mxfp4_quantization_round_trips() {
    let x = random_vec(64, 39);
    let q = quantize(TensorType::Mxfp4, &x);
    let back = QMatrix::new(TensorType::Mxfp4, 1, 64, Bytes::owned(&q))
        .unwrap()
        .dequantize();
    for b in 0..2 {
        let xs = &x[32 * b..32 * (b + 1)];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = format::mxfp4::scale(q[17 * b]);
        assert!(
            amax >= 8.0 * d && amax < 16.0 * d,
            "block {b}: {amax} at scale {d}"
        );
        for (v, w) in xs.iter().zip(&back[32 * b..]) {
            // Within the grid the widest gap is 4 (8 to 12), so half of it times the scale at
            // most; past 12 the clipping, under 4.
            let bound = if v.abs() > 12.0 * d { 4.0 } else { 2.0 } * d;
            assert!((v - w).abs() <= bound, "{v} -> {w} at scale {d}");
        }
    }
    assert_eq!(quantize(TensorType::Mxfp4, &[0.0; 32]), vec![0u8; 17]);
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
            // The integers are padded to a whole tile of 16 rows (AMX loads whole tiles).
            assert_eq!(one.q.len(), 16 * k, "block {block} row {r}: padding");
            assert_eq!(
                all.q[r * k..(r + 1) * k],
                one.q[..k],
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

/// SwiGLU over several rows at once gives each row the bits it gets alone, whatever the row's
/// length: the numbers past the last whole vector take the vector loop's arithmetic.
#[test]
fn swiglu_of_a_row_does_not_depend_on_its_neighbours() {
    for len in [1usize, 7, 13, 36, 61] {
        let rows = 3;
        let x: Vec<f32> = random_vec(rows * len, 70 + len as u64)
            .iter()
            .map(|v| v * 12.0)
            .collect();
        let up = random_vec(rows * len, 80 + len as u64);
        let mut together = x.clone();
        swiglu(&mut together, &up);
        for r in 0..rows {
            let span = r * len..(r + 1) * len;
            let mut alone = x[span.clone()].to_vec();
            swiglu(&mut alone, &up[span.clone()]);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&alone), bits(&together[span]), "row {r} of {len}");
        }
    }
}

/// An implementation the CPU lacks is refused before any of its instructions run (where there is
/// one to try).
#[test]
fn an_isa_the_cpu_lacks_is_refused() {
    let Some(&lacking) = [
        Isa::Amx,
        Isa::Avx512Vnni,
        Isa::Avx512,
        Isa::Avx2Vnni,
        Isa::Avx2,
    ]
    .iter()
    .find(|i| !i.is_available()) else {
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

mod attention;
mod packed_kernels;
mod prompt;
mod q8;
