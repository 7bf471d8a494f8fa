//! The packed kernels of every SIMD class against the plain references, and against each other.

use super::*;

/// The interleaved layout (`packed`): its plain reference against the natural-layout scalar
/// kernel, and every SIMD kernel against that reference, at every activation row count from 1 to
/// 80 (tiles of up to 8 or 4 rows in every split, and more than one block of rows); a row alone
/// gives bit-identical results to the row in a batch, and every implementation the same bits (for
/// the K-quants, the reference's bits too).
#[test]
fn packed_kernels_match_the_natural_layout() {
    for (ti, &dtype) in OWN.iter().enumerate() {
        let f = format::Format::from_type(dtype).unwrap();
        let (rows, cols) = (48, 768);
        let w = random_vec(rows * cols, 400 + ti as u64);
        let bytes = quantize(dtype, &w);
        let plain = QMatrix::new(dtype, rows, cols, Bytes::owned(&bytes)).unwrap();
        let p = packed::Packed::new(f, rows, cols, &bytes).expect("packable");
        assert!(packed::Packed::new(f, rows - 1, cols, &bytes[..0]).is_none());
        let odd_cols = cols - f.act_block();
        if !odd_cols.is_multiple_of(f.unit_cols()) {
            let b = quantize(dtype, &w[..rows * odd_cols]);
            assert!(packed::Packed::new(f, rows, odd_cols, &b).is_none());
        }
        let wf = plain.dequantize();
        for m in 1usize..=80 {
            let x = random_vec(m * cols, 500 + m as u64);
            let mut acts = quant::QuantizedActs::default();
            acts.quantize(&x, m, cols, f.act_block());
            let mut natural = vec![0f32; m * rows];
            matmul_with(Isa::Scalar, &x, m, &plain, &mut natural);
            let mut reference = vec![0f32; m * rows];
            for i in 0..m {
                for g in 0..rows / packed::ROWS {
                    let o = packed::dot_group_scalar(&p, g, &acts, i);
                    reference[i * rows + g * 16..][..16].copy_from_slice(&o);
                }
            }
            let mags: Vec<f32> = (0..m * rows)
                .map(|o| product_magnitude(&x, &wf, cols, o / rows, o % rows))
                .collect();
            // `got` agrees with `want` to within float rounding of each output's products.
            let assert_close = |got: &[f32], want: &[f32], what: &str| {
                for i in 0..m {
                    for j in 0..rows {
                        let mag = mags[i * rows + j];
                        let (a, b) = (got[i * rows + j], want[i * rows + j]);
                        assert!(
                            (a - b).abs() <= 1e-5 * mag + 1e-6,
                            "{dtype:?} m={m} ({i},{j}): {what}: {a} vs {b}"
                        );
                    }
                }
            };
            assert_close(&reference, &natural, "packed reference vs natural");
            // Every packed kernel the CPU runs (AVX2 and AVX-512, with and without VNNI) against
            // the reference, bit-identical to each other and a row alone to the row in a batch.
            let mut first: Option<(Isa, Vec<f32>)> = None;
            for isa in Isa::available().into_iter().filter(|i| i.packs()) {
                let mat = plain.clone().packed_for(isa);
                assert!(mat.packed.is_some());
                let mut out = vec![0f32; m * rows];
                matmul_with(isa, &x, m, &mat, &mut out);
                // The K-quants sum each super-block in integers, the other formats each block
                // with its integer offset (Q4_1's minimum after, in floats), and take it to floats
                // with the reference's fused steps: the same bits.
                assert_eq!(out, reference, "{isa:?} {dtype:?} m={m} vs reference");
                // The first, a middle and the last row: over every m, rows at every place of a
                // tile and of a block of rows.
                for i in [0, m / 2, m - 1] {
                    let mut one = vec![0f32; rows];
                    matmul_with(isa, &x[i * cols..(i + 1) * cols], 1, &mat, &mut one);
                    assert_eq!(
                        one,
                        out[i * rows..(i + 1) * rows],
                        "{isa:?} {dtype:?} m={m} row {i}"
                    );
                }
                match &first {
                    Some((other, o)) => {
                        assert_eq!(o, &out, "{dtype:?} m={m}: {isa:?} vs {other:?}")
                    }
                    None => first = Some((isa, out)),
                }
            }
        }
    }
}

/// The largest integer products the packed kernels meet: weights at the ends of their range with
/// activations of the same sign at +-127 (the case where `vpmaddubsw`, which the kernels without
/// VNNI use, would saturate if a pair left 16 bits, and where their 16-bit sums of pairs over a
/// sub-block would overflow if they were widened too late). Every packed kernel gives the plain
/// kernel's results.
#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "needs AVX2 (x86-64)")]
fn packed_kernels_exact_at_extreme_values() {
    let packed_isas: Vec<Isa> = Isa::available().into_iter().filter(|i| i.packs()).collect();
    if packed_isas.is_empty() {
        crate::cannot_run::cannot_run("this CPU has no AVX2");
        return;
    }
    for &dtype in OWN.iter() {
        let (rows, cols) = (32, 512);
        // Row j: every weight +-1 with a sign pattern; activations carry the pattern of row 0,
        // so row 0's products are all at the top of the range, row 1's mixed. Rows 2 and 3: one
        // weight of -1 or +1 per 32 and 0.9 or -0.9 for the rest, so that the rest quantize to
        // the top of the format's unsigned range, against activations all +1 or all -1.
        let weight = |j: usize, t: usize| match j {
            2 | 3 => {
                let s = if j == 2 { 1.0 } else { -1.0 };
                if t.is_multiple_of(32) {
                    -s
                } else {
                    0.9 * s
                }
            }
            _ if (t * 7 + j * (t % 3)) % 5 < 2 => -1.0,
            _ => 1.0,
        };
        // MXFP4's largest values (+-12, its codes 7 and 15) take a magnitude of 1.5 at the top
        // of a power of two.
        let top = if dtype == TensorType::Mxfp4 { 1.5 } else { 1.0 };
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| top * weight(i / cols, i % cols))
            .collect();
        let m = 4;
        let x: Vec<f32> = (0..m * cols)
            .map(|i| match i / cols {
                0 => weight(0, i % cols),
                1 => -weight(0, i % cols),
                2 => 1.0,
                _ => -1.0,
            })
            .collect();
        let mat = QMatrix::new(dtype, rows, cols, Bytes::owned(&quantize(dtype, &w))).unwrap();
        let mut scalar = vec![0f32; m * rows];
        matmul_with(Isa::Scalar, &x, m, &mat, &mut scalar);
        for &isa in &packed_isas {
            let p = mat.clone().packed_for(isa);
            assert!(p.packed.is_some(), "{dtype:?} packs");
            let mut out = vec![0f32; m * rows];
            matmul_with(isa, &x, m, &p, &mut out);
            for (j, (a, s)) in out.iter().zip(&scalar).enumerate() {
                assert!(
                    (a - s).abs() <= 1e-4 * s.abs().max(1.0),
                    "{isa:?} {dtype:?} output {j}: {a} vs {s}"
                );
            }
        }
    }
}

/// The AMX kernels against the packed reference (`dot_group_scalar`), bit for bit, for every
/// packed format and every activation row count from 1 to 80, called directly (`matmul` sends
/// only passes of `AMX_MIN_ROWS` or more to the tiles), from row 0 and from row 16 of the
/// activations (a second tile of rows), over all groups at once and over a range of groups. On a
/// CPU without AMX, or where the OS refuses the tile state, this says why and checks nothing.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore = "needs AMX-INT8: run with --ignored on a CPU that has it (.ci/run does)"]
fn amx_kernels_match_the_reference_bit_for_bit() {
    if !amx_runs_here() {
        return;
    }
    for (ti, &dtype) in OWN.iter().enumerate() {
        let f = format::Format::from_type(dtype).unwrap();
        let (rows, cols) = (48, 512);
        let groups = rows / packed::ROWS;
        let bytes = quantize(dtype, &random_vec(rows * cols, 700 + ti as u64));
        let p = packed::Packed::new(f, rows, cols, &bytes).expect("packable");
        for m in 1usize..=80 {
            let total = m + 16;
            let x = random_vec(total * cols, 800 + m as u64);
            let mut acts = quant::QuantizedActs::default();
            acts.quantize_with(Isa::Amx, &x, total, cols, f.act_block());
            acts.tile();
            for (r0, g0, g1) in [(0, 0, groups), (16, 1, groups)] {
                let mut out = vec![f32::NAN; m * rows];
                // SAFETY: `Amx` is available (checked above); `acts` holds rows r0..r0 + m over
                // the packed columns, its integers in tile order, r0 a multiple of 16; the writes, rows 0..m at columns 16 * g0..16 * g1, are inside
                // `out`.
                unsafe { x86::packed_rows_amx(&p, g0, g1, &acts, r0, m, out.as_mut_ptr(), rows) };
                for i in 0..m {
                    for g in 0..groups {
                        let got = &out[i * rows + 16 * g..][..16];
                        if g < g0 {
                            assert!(
                                got.iter().all(|v| v.is_nan()),
                                "{dtype:?} group {g} written"
                            );
                            continue;
                        }
                        let want = packed::dot_group_scalar(&p, g, &acts, r0 + i);
                        assert_eq!(got, want, "{dtype:?} m={m} r0={r0} row {i} group {g}");
                    }
                }
            }
        }
    }
}
