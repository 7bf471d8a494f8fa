//! AMX against AVX-512 VNNI on the packed products, side by side in one process, runs alternating
//! so that machine noise hits both alike (developer tool):
//! `cargo run --release --example amxbench -- THREADS [FORMAT [COLS ROWS]]`. Prints the fastest
//! of 9 runs of each in ms, their ratio and AMX's G multiply-adds per second, per row count.
use candle_core::quantized::GgmlDType;
use engine::kernels::*;
use std::time::Instant;
fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let threads: usize = arg(1).map_or(2, |s| s.parse().unwrap());
    pool::init(threads);
    if let Err(why) = amx_status() {
        println!("no AMX here: {why}");
        return;
    }
    let only = arg(2);
    // Qwen2.5-1.5B's feed-forward shapes by default: 8960 x 1536 (gate, up), 1536 x 8960 (down).
    let shapes: Vec<(usize, usize)> = match (arg(3), arg(4)) {
        (Some(c), Some(r)) => vec![(c.parse().unwrap(), r.parse().unwrap())],
        _ => vec![(1536, 8960), (8960, 1536)],
    };
    println!("{threads} threads; fastest of 9 in ms: VNNI, AMX, VNNI/AMX, AMX GMAC/s");
    for dtype in [
        TensorType::Ggml(GgmlDType::Q4K),
        TensorType::Ggml(GgmlDType::Q6K),
        TensorType::Ggml(GgmlDType::Q8_0),
        TensorType::Ggml(GgmlDType::Q4_0),
        TensorType::Ggml(GgmlDType::Q4_1),
        TensorType::Ggml(GgmlDType::Q5_0),
        TensorType::Mxfp4,
    ] {
        if only.as_ref().is_some_and(|f| *f != format!("{dtype}")) {
            continue;
        }
        for &(cols, rows) in &shapes {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect();
            let mat = QMatrix::new(dtype, rows, cols, Bytes::owned(&quantize(dtype, &w)))
                .unwrap()
                .packed_for(Isa::Amx);
            for m in [8usize, 16, 32, 64, 128, 256, 512] {
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| ((i * 31) % 200) as f32 / 100.0 - 1.0)
                    .collect();
                let mut out = vec![0f32; m * rows];
                let mut best = [f64::INFINITY; 2];
                for _ in 0..9 {
                    for (i, isa) in [Isa::Avx512Vnni, Isa::Amx].into_iter().enumerate() {
                        let t = Instant::now();
                        matmul_with(isa, &x, m, &mat, &mut out);
                        best[i] = best[i].min(t.elapsed().as_secs_f64());
                    }
                }
                println!(
                    "{dtype} {cols}x{rows} m={m}: {:8.3} {:8.3} {:5.2}x {:6.0}",
                    best[0] * 1e3,
                    best[1] * 1e3,
                    best[0] / best[1],
                    (m * rows * cols) as f64 / best[1] / 1e9
                );
            }
        }
    }
}
