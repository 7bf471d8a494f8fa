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
/// the products through several blocks of columns, and 300 is not a multiple of 16; 2048 weight
/// rows give each thread several strips, each decoded during the one before, and 37 rows a pair
/// of tiles and a part tile.
const CASES: [(GgmlDType, usize, usize, usize); 6] = [
    (GgmlDType::Q4K, 2048, 512, 37),
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

/// The gated feed-forward in one go (`gated_ffn_rows`) against its products and activation in
/// turn: bit for bit where the class fuses it, and declined (output untouched) where it does
/// not, for any number of rows.
#[test]
fn fused_feed_forward_equals_its_steps() {
    let (k, f, n) = (512, 1024, 256);
    let gate = matrix(GgmlDType::Q4K, f, k, 80);
    let up = matrix(GgmlDType::Q6K, f, k, 81);
    let down = matrix(GgmlDType::Q4K, n, f, 82);
    let fuses = isa()
        .kernels()
        .prompt_rows
        .as_ref()
        .is_some_and(|p| p.ffn.is_some());
    for m in [1, 5, 16, 37, 300] {
        let x = random_vec(m * k, 90 + m as u64);
        let mut g = prompt_product(&x, m, &gate);
        let u = prompt_product(&x, m, &up);
        swiglu(&mut g, &u);
        let want = prompt_product(&g, m, &down);
        let ffn = GatedFfn {
            gate: &gate,
            up: &up,
            down: &down,
            activation: swiglu,
        };
        let mut got = vec![f32::NAN; m * n];
        let fused = gated_ffn_rows(RowKind::Prompt, &x, m, &ffn, &mut got);
        assert_eq!(fused, fuses, "{m} rows: fused where the class fuses");
        if fused {
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "{m} rows: {differ} of {} outputs differ", m * n);
        } else {
            assert!(
                got.iter().all(|v| v.is_nan()),
                "{m} rows: declined, untouched"
            );
        }
        // Generated rows are never fused.
        assert!(!gated_ffn_rows(RowKind::Generated, &x, m, &ffn, &mut got));
    }
}
