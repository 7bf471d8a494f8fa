//! Cycles per 64 bytes of weights of the packed kernel in use (`PLD_KERNEL` picks it) for m
//! activation rows against one group of sixteen weight rows, everything in L1 (developer tool):
//! `cargo run --release --example tbench -- [GHZ [M [FORMAT]]]` (FORMAT as GGUF names it: Q4K,
//! Q6K, Q8_0, ...).
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
    let dtype = match std::env::args().nth(3).as_deref() {
        Some("Q6K") => GgmlDType::Q6K,
        Some("Q8_0") => GgmlDType::Q8_0,
        Some("Q4_0") => GgmlDType::Q4_0,
        Some("Q4_1") => GgmlDType::Q4_1,
        Some("Q5_0") => GgmlDType::Q5_0,
        _ => GgmlDType::Q4K,
    };
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mat = QMatrix::new(dtype, rows, cols, Bytes::owned(&quantize(dtype, &w)))
        .unwrap()
        .packed_for(isa());
    let p = mat.packed.as_ref().expect("packed");
    let x: Vec<f32> = (0..m * cols)
        .map(|i| ((i * 31) % 100) as f32 / 50.0 - 1.0)
        .collect();
    let mut acts = quant::QuantizedActs::default();
    let block = if matches!(dtype, GgmlDType::Q4K | GgmlDType::Q6K) {
        256
    } else {
        32
    };
    acts.quantize(&x, m, cols, block);
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
    let lines = (n * p.bytes().len() / 64) as f64;
    println!(
        "{dtype:?} m={m} {:?}: {:.1} cycles per 64 bytes at {ghz} GHz ({:.1} G multiply-adds/s) {}",
        isa(),
        best / lines * ghz * 1e9,
        (n * m * rows * cols) as f64 / best / 1e9,
        out[3]
    );
}
