//! Prompt rows' products (`matmul_many_rows` with `RowKind::Prompt`) against generated rows' on
//! the same matrix, alternating (developer tool):
//! `cargo run --release --example prompt_bench -- THREADS [ROWS [COLS N]]`. Prints the fastest of
//! 7 runs of each in ms and G multiply-adds per second.
use candle_core::quantized::GgmlDType;
use engine::kernels::*;
use std::time::Instant;
fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let threads: usize = arg(1).map_or(2, |s| s.parse().unwrap());
    let m: usize = arg(2).map_or(256, |s| s.parse().unwrap());
    pool::init(threads);
    let shapes: Vec<(usize, usize)> = match (arg(3), arg(4)) {
        (Some(c), Some(r)) => vec![(c.parse().unwrap(), r.parse().unwrap())],
        _ => vec![(1536, 8960), (8960, 1536)],
    };
    println!(
        "{threads} threads, {m} rows, kernels {:?}, prompt arithmetic {}; int8 peak {:.0}, \
         int8 tiles' {:.0} GMAC/s",
        isa(),
        prompt_arithmetic(),
        int8_peak_gmacs().unwrap_or(0.0),
        amx_int8_peak_gmacs().unwrap_or(0.0)
    );
    for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
        for &(cols, rows) in &shapes {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0)
                .collect();
            let q = quantize(dtype, &w);
            let mat = QMatrix::new(dtype, rows, cols, Bytes::owned(&q))
                .unwrap()
                .packed_for(isa());
            let x: Vec<f32> = (0..m * cols)
                .map(|i| ((i * 31 % 997) as f32 - 498.0) / 498.0)
                .collect();
            let mut out = vec![0f32; m * rows];
            let mut best = [f64::INFINITY; 2];
            for _ in 0..7 {
                for (k, kind) in [RowKind::Prompt, RowKind::Generated]
                    .into_iter()
                    .enumerate()
                {
                    let t = Instant::now();
                    matmul_many_rows(kind, &x, m, &mut [(&mat, &mut out)]);
                    best[k] = best[k].min(t.elapsed().as_secs_f64());
                }
            }
            let macs = (m * rows * cols) as f64;
            println!(
                "{dtype:?} {cols}x{rows}: prompt {:.2} ms ({:.0} GMAC/s), generated {:.2} ms ({:.0} GMAC/s)",
                best[0] * 1e3, macs / best[0] / 1e9, best[1] * 1e3, macs / best[1] / 1e9
            );
        }
    }
}
