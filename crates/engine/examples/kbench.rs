//! Throughput of the quantized matmul on a matrix larger than the caches, at m = 1 and 8 rows
//! (developer tool): `cargo run --release --example kbench -- THREADS`.
use candle_core::quantized::GgmlDType;
use engine::kernels::*;
use std::time::Instant;
fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(2);
    pool::init(threads);
    let (rows, cols) = (8960 * 8, 1536);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    for dtype in [
        GgmlDType::Q4K,
        GgmlDType::Q6K,
        GgmlDType::Q8_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
    ] {
        let mat = QMatrix::new(dtype, rows, cols, Bytes::owned(&quantize(dtype, &w))).unwrap();
        let bytes = mat.bytes.as_slice().len();
        let reps = 9;
        for m in [1usize, 8] {
            let x = vec![0.3f32; m * cols];
            let mut out = vec![0f32; m * rows];
            // The fastest of a few runs: the machine is shared and noisy.
            let mut s = f64::INFINITY;
            for _ in 0..reps {
                let t = Instant::now();
                matmul(&x, m, &mat, &mut out);
                s = s.min(t.elapsed().as_secs_f64());
            }
            println!(
                "{dtype:?} {}MB m={m} {threads}t: {:.2} ms, {:.1} GB/s",
                bytes >> 20,
                s * 1e3,
                bytes as f64 / s / 1e9
            );
        }
    }
}
