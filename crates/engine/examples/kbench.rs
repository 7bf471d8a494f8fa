use candle_core::quantized::GgmlDType;
use engine::kernels::*;
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
    for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_1, GgmlDType::Q4K] {
        let (rows, cols) = (49152 * 4, 576);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let mat = QMatrix::new(
            dtype,
            rows,
            cols.max(256) / 256 * 256 * 0 + cols,
            Bytes::owned(&quantize(dtype, &w)),
        );
        let Ok(mat) = mat else { continue };
        let bytes = mat.bytes.as_slice().len();
        for m in [1usize, 8] {
            let x = vec![0.3f32; m * cols];
            let mut out = vec![0f32; m * rows];
            let isa = Isa::detect();
            let t = Instant::now();
            let n = 10;
            for _ in 0..n {
                matmul_with(isa, &x, m, &mat, &mut out);
            }
            let s = t.elapsed().as_secs_f64() / n as f64;
            println!(
                "{dtype:?} {}MB m={m} {isa:?} {threads}t: {:.3} ms, {:.1} GB/s",
                bytes >> 20,
                s * 1e3,
                bytes as f64 / s / 1e9
            );
        }
    }
    // plain streaming read
    let big = vec![1u64; 1 << 27];
    let t = Instant::now();
    let s: u64 = big.iter().sum();
    println!(
        "stream sum 1GB 1 thread: {:.1} GB/s ({s})",
        (8u64 << 27) as f64 / t.elapsed().as_secs_f64() / 1e9
    );
}
