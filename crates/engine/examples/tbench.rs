//! Cycles per 32-column sub-block of the packed Q4_K kernel for eight activation rows against one
//! group of sixteen weight rows, everything in L1 (developer tool):
//! `cargo run --release --example tbench -- [GHZ]`.
use candle_core::quantized::GgmlDType;
use engine::kernels::*;
use std::time::Instant;
fn main() {
    let ghz: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(2.95);
    let (rows, cols) = (16usize, 1536usize);
    let m: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(8);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mat = QMatrix::new(
        GgmlDType::Q4K,
        rows,
        cols,
        Bytes::owned(&quantize(GgmlDType::Q4K, &w)),
    )
    .unwrap()
    .packed_for(Isa::Avx2);
    let p = mat.packed.as_ref().expect("packed");
    let x: Vec<f32> = (0..m * cols)
        .map(|i| ((i * 31) % 100) as f32 / 50.0 - 1.0)
        .collect();
    let mut acts = quant::QuantizedActs::default();
    acts.quantize(&x, m, cols, 256);
    let mut out = vec![0f32; m * rows];
    let n = 80_000 / m;
    let mut best = f64::INFINITY;
    for _ in 0..60 {
        let t = Instant::now();
        for _ in 0..n {
            packed_rows(p, 0, &acts, 0, m, &mut out, rows);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    let subblocks = (n * cols / 32 * m.div_ceil(8)) as f64;
    println!(
        "{:.1} cycles per sub-block at {ghz} GHz ({:.1} G multiply-adds/s) {}",
        best / subblocks * ghz * 1e9,
        (n * m * rows * cols) as f64 / best / 1e9,
        out[3]
    );
}
