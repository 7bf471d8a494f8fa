//! Prompt rows' products (`matmul_many_rows` with `RowKind::Prompt`): where the class computes
//! them on bf16 tiles, each output agrees with the plain sum of the bf16-rounded activations
//! times the bf16-rounded weights, and its bits never depend on the other rows of the product
//! (one row, a part tile, many rows in several blocks of columns); elsewhere they are the
//! generated rows' bits.

use super::*;
use candle_core::quantized::GgmlDType;
use half::bf16;

fn matrix(dtype: GgmlDType, rows: usize, cols: usize, seed: u64) -> QMatrix {
    let w = random_vec(rows * cols, seed);
    QMatrix::new(dtype, rows, cols, Bytes::owned(&quantize(dtype, &w)))
        .unwrap()
        .packed_for(isa())
}

fn prompt_product(x: &[f32], m: usize, w: &QMatrix) -> Vec<f32> {
    let mut out = vec![0f32; m * w.rows];
    matmul_many_rows(RowKind::Prompt, x, m, &mut [(w, &mut out)]);
    out
}

/// The cases: (format, weight rows, columns, activation rows). 300 rows over 2048 columns take
/// the products through several blocks of columns, and 300 is not a multiple of 16.
const CASES: [(GgmlDType, usize, usize, usize); 5] = [
    (GgmlDType::Q4K, 64, 512, 1),
    (GgmlDType::Q4K, 96, 1536, 37),
    (GgmlDType::Q6K, 64, 512, 20),
    (GgmlDType::Q6K, 32, 2048, 300),
    (GgmlDType::Q4K, 32, 2048, 300),
];

#[test]
fn prompt_rows_match_their_arithmetic() {
    for (ci, &(dtype, rows, cols, m)) in CASES.iter().enumerate() {
        let w = matrix(dtype, rows, cols, 40 + ci as u64);
        let x = random_vec(m * cols, 50 + ci as u64);
        let got = prompt_product(&x, m, &w);
        if !prompt_arithmetic_differs() {
            // The generated rows' arithmetic, bit for bit.
            let mut want = vec![0f32; m * rows];
            matmul(&x, m, &w, &mut want);
            assert_eq!(got, want, "{dtype:?} case {ci}");
            continue;
        }
        let round = |v: f32| bf16::from_f32(v).to_f32() as f64;
        let wf = w.dequantize();
        for i in 0..m {
            for j in 0..rows {
                let (xr, wr) = (&x[i * cols..][..cols], &wf[j * cols..][..cols]);
                let want: f64 = xr.iter().zip(wr).map(|(&a, &b)| round(a) * round(b)).sum();
                let mag: f64 = xr.iter().zip(wr).map(|(&a, &b)| (a * b).abs() as f64).sum();
                let g = got[i * rows + j] as f64;
                // f32 sums over `cols` terms, and a weight whose f32 value lies on a bf16 tie may
                // round the other way from the dequantized one: a few units of bf16 in one term.
                assert!(
                    (g - want).abs() <= 1e-4 * mag + 1e-5,
                    "{dtype:?} case {ci} ({i},{j}): {g} vs {want} (magnitude {mag})"
                );
            }
        }
    }
}

#[test]
fn prompt_rows_do_not_depend_on_their_pass() {
    for (ci, &(dtype, rows, cols, m)) in CASES.iter().enumerate() {
        let w = matrix(dtype, rows, cols, 60 + ci as u64);
        let x = random_vec(m * cols, 70 + ci as u64);
        let all = prompt_product(&x, m, &w);
        for i in [0, m / 2, m - 1] {
            let one = prompt_product(&x[i * cols..][..cols], 1, &w);
            assert_eq!(one, all[i * rows..][..rows], "{dtype:?} case {ci} row {i}");
            // The row among others: rows i.. (another tile position, another part tile).
            let rest = m - i;
            let tail = prompt_product(&x[i * cols..], rest, &w);
            assert_eq!(
                tail[..rows],
                all[i * rows..][..rows],
                "{dtype:?} case {ci} row {i} at 0"
            );
        }
    }
}
