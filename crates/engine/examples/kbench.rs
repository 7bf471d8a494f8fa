//! Throughput of the quantized matmul on a matrix larger than the caches, next to a plain
//! streaming read of the same bytes, at m = 1 and 8 rows (developer tool).
use candle_core::quantized::GgmlDType;
use engine::kernels::*;
use rayon::prelude::*;
use std::time::Instant;
fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(2);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .unwrap();
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
        // streaming read of the same bytes, same threads
        let data = mat.bytes.as_slice();
        let t = Instant::now();
        let reps = 5;
        let mut sink = 0u64;
        for _ in 0..reps {
            sink += data
                .par_chunks(1 << 16)
                .map(|c| {
                    c.chunks_exact(8)
                        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                        .fold(0u64, |a, b| a ^ b)
                })
                .reduce(|| 0, |a, b| a ^ b);
        }
        let stream = bytes as f64 * reps as f64 / t.elapsed().as_secs_f64() / 1e9;
        for m in [1usize, 8] {
            let x = vec![0.3f32; m * cols];
            let mut out = vec![0f32; m * rows];
            let t = Instant::now();
            for _ in 0..reps {
                matmul(&x, m, &mat, &mut out);
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            println!("{dtype:?} {}MB m={m} {threads}t: {:.2} ms, {:.1} GB/s (stream read {:.1} GB/s) {sink}", bytes >> 20, s * 1e3, bytes as f64 / s / 1e9, stream);
        }
    }
}
