//! Prompt rows' products (`matmul_many_rows` with `RowKind::Prompt`): where the class computes
//! them on bf16 tiles, each output agrees with the plain sum of the bf16-rounded activations
//! times the bf16-rounded weights (on the rotated int8 tiles, `PLD_PROMPT_ROWS=int8`, with
//! `rotated::products_scalar` bit for bit), and its bits never depend on the other rows of the product
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
        if prompt_rows_on_int8() {
            // `PLD_PROMPT_ROWS=int8`: the rotated arithmetic's plain definition, bit for bit.
            let mut want = vec![0f32; m * rows];
            rotated::products_scalar(&x, m, &w.rotated_int8(), &mut want);
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(differ.count(), 0, "{dtype:?} case {ci}");
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

/// The rotated int8 arithmetic (`PLD_PROMPT_ROWS=int8`) on tiles gives its plain definition's
/// bits (`rotated::products_scalar`) on the pool's threads: one row, part tiles, several blocks
/// of columns; and a row's bits are those it gets alone.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore = "needs AMX-INT8: run with --ignored on a CPU that has it (.ci/run does)"]
fn rotated_int8_tiles_match_their_plain_definition() {
    if amx_runs_here() {
        rotated_int8_matches_its_definition(super::x86::classes::amx_int8_prompt_table());
    }
}

/// As `rotated_int8_tiles_match_their_plain_definition`, with AVX-512 VNNI's `vpdpbusd` (the
/// Avx512Vnni class): the same bits.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore = "needs AVX-512 VNNI: run with --ignored on a CPU that has it (.ci/run does)"]
fn rotated_int8_vnni_matches_its_plain_definition() {
    if !Isa::Avx512Vnni.is_available() {
        crate::cannot_run::cannot_run("no AVX-512 VNNI here");
        return;
    }
    rotated_int8_matches_its_definition(super::x86::classes::vnni_int8_prompt_table());
}

/// A class's rotated int8 products (`table.run`, which the CPU runs) against the definition.
#[cfg(target_arch = "x86_64")]
fn rotated_int8_matches_its_definition(table: &super::table::PromptRows) {
    let more = [
        (GgmlDType::Q4K, 32, 8960, 300),
        (GgmlDType::Q6K, 64, 256, 17),
    ];
    for (ci, &(dtype, rows, cols, m)) in CASES.iter().chain(&more).enumerate() {
        let w = matrix(dtype, rows, cols, 140 + ci as u64);
        assert!((table.takes)(&w), "case {ci} takes the int8 tiles");
        let mut x = random_vec(m * cols, 150 + ci as u64);
        // A few columns far larger than the rest, as a layer's inputs have.
        for (i, v) in x.iter_mut().enumerate() {
            if (i % cols) % 97 == 5 {
                *v *= 60.0;
            }
        }
        let run = |x: &[f32], m: usize| {
            let mut out = vec![f32::NAN; m * rows];
            // SAFETY: the CPU runs the table's class (the caller checked); `x` is m x cols and
            // `out` m x rows, the only job.
            unsafe { (table.run)(x, m, &[(&w, parallel::OutPtr(out.as_mut_ptr()))]) };
            out
        };
        let got = run(&x, m);
        let copy = w.rotated_int8();
        // The class made its copy with its own rotation and rounding: the definition's bytes.
        let made = w
            .packed
            .as_ref()
            .and_then(|p| p.rotated.get())
            .expect("copy made");
        assert!(
            made.lines.iter().zip(&copy.lines).all(|(a, b)| a.0 == b.0)
                && made.scale == copy.scale
                && made.sums == copy.sums,
            "{dtype:?} case {ci}: the class's copy against the definition's"
        );
        let mut want = vec![0f32; m * rows];
        rotated::products_scalar(&x, m, &copy, &mut want);
        let differ = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            differ.count(),
            0,
            "{dtype:?} case {ci}: the kernel against the definition"
        );
        let last = (m - 1) * cols;
        let alone = run(&x[last..], 1);
        assert_eq!(
            alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            got[(m - 1) * rows..]
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            "{dtype:?} case {ci}: the last row alone"
        );
    }
}

/// The rotation keeps products (the copy's rows and the activations' rotate alike, so each
/// product is 256 times the plain one) and the rotated int8 products stay close to the f32 ones;
/// the copy holds each row's int8s where the tiles read them.
#[test]
fn rotated_int8_keeps_the_products() {
    let (a, b) = (random_vec(512, 160), random_vec(512, 161));
    let (mut ra, mut rb) = (a.clone(), b.clone());
    rotated::rotate(&mut ra);
    rotated::rotate(&mut rb);
    let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| (p * q) as f64).sum::<f64>();
    let (plain, turned) = (dot(&a, &b), dot(&ra, &rb) / 256.0);
    assert!((plain - turned).abs() < 1e-4 * dot(&a, &a).sqrt() * dot(&b, &b).sqrt());
    let (rows, cols, m) = (64, 1024, 9);
    let w = matrix(GgmlDType::Q4K, rows, cols, 162);
    let copy = w.rotated_int8();
    let x = random_vec(m * cols, 163);
    let mut got = vec![0f32; m * rows];
    rotated::products_scalar(&x, m, &copy, &mut got);
    let wf = w.dequantize();
    let mut err = 0f64;
    let mut norm = 0f64;
    for i in 0..m {
        for j in 0..rows {
            let want = dot(&x[i * cols..][..cols], &wf[j * cols..][..cols]);
            err += (got[i * rows + j] as f64 - want).powi(2);
            norm += want * want;
        }
    }
    // int8 on both sides after the rotation: about a percent of the products' size.
    assert!(
        (err / norm).sqrt() < 0.02,
        "relative error {}",
        (err / norm).sqrt()
    );
    let mut turned = vec![0f32; cols];
    w.dequantize_row(37, &mut turned);
    rotated::rotate(&mut turned);
    let mut q = vec![0i8; cols];
    let scale = rotated::quantize_row(&turned, &mut q);
    assert_eq!(copy.row(37), q);
    assert_eq!(copy.scale[37], scale);
    assert_eq!(copy.sums[37], q.iter().map(|&b| b as i32).sum::<i32>());
}

#[test]
fn prompt_rows_setting_parses_and_names_bad_values() {
    use super::x86::classes::prompt_rows_requested as parse;
    assert_eq!(parse(None), Ok(false));
    assert_eq!(parse(Some("")), Ok(false));
    assert_eq!(parse(Some("bf16")), Ok(false));
    assert_eq!(parse(Some("int8")), Ok(true));
    let e = parse(Some("fp8")).unwrap_err();
    assert!(e.contains("fp8") && e.contains("int8"), "{e}");
}

/// `quantize_row`'s rounding is `round_ties_even` over the range it rounds, ties included.
#[test]
fn rotated_rounding_is_to_nearest_even() {
    let mut v: Vec<f32> = (-1280..=1280).map(|i| i as f32 / 10.0).collect();
    v.extend((-255..=255).map(|i| i as f32 / 2.0 + 0.0001 * (i % 3) as f32));
    v.push(127.0);
    let mut q = vec![0i8; v.len()];
    let scale = rotated::quantize_row(&v, &mut q);
    let (inv, want_scale) = rotated::row_scale(128.0);
    assert_eq!(scale, want_scale);
    for (&x, &got) in v.iter().zip(&q) {
        let want = (x * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
        assert_eq!(got, want, "{x}");
    }
}

/// The AVX-512 rotation and rounding the classes make their copies with gives `plain_round`'s
/// int8s and scale: ordinary rows, a column far larger than the rest, zeros, a row with an
/// infinity and one with a NaN.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore = "needs AVX-512: run with --ignored on a CPU that has it (.ci/run does)"]
fn rotated_rounding_kernel_matches_the_definition() {
    if !Isa::Avx512.is_available() {
        crate::cannot_run::cannot_run("no AVX-512 here");
        return;
    }
    let k = 768;
    let mut rows: Vec<Vec<f32>> = (0..6).map(|i| random_vec(k, 170 + i)).collect();
    rows[1][300] = 5000.0;
    rows[2].fill(0.0);
    rows[3][7] = f32::INFINITY;
    rows[4][500] = f32::NAN;
    rows[5].iter_mut().for_each(|v| *v *= 1e-30);
    for (i, row) in rows.iter().enumerate() {
        let (mut a, mut b) = (row.clone(), row.clone());
        let (mut qa, mut qb) = (vec![1i8; k], vec![1i8; k]);
        let want = rotated::plain_round(&mut a, &mut qa);
        // SAFETY: the CPU has AVX-512 F and BW (checked above); 768 is a multiple of 256.
        let got = unsafe { super::x86::rotated_round_row(&mut b, &mut qb) };
        assert_eq!(got.to_bits(), want.to_bits(), "row {i}: scale");
        assert_eq!(qb, qa, "row {i}: int8s");
    }
}
