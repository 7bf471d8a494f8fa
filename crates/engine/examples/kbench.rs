//! Throughput of the quantized matmul on a matrix larger than the caches, at m = 1, 4 and 8 rows,
//! every implementation the CPU has side by side, runs interleaved so that machine noise hits all
//! alike (developer tool): `cargo run --release --example kbench -- THREADS [FORMAT [M [COLS [ROWS]]]]`.
use candle_core::quantized::GgmlDType;
use engine::kernels::*;
use std::time::Instant;
fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(2);
    pool::init(threads);
    // `-- THREADS FORMAT M COLS`: a matrix of COLS columns (default 1536) and the same size.
    let cols: usize = std::env::args()
        .nth(4)
        .map(|s| s.parse().unwrap())
        .unwrap_or(1536);
    // `ROWS` (fifth argument): a smaller matrix, to time the kernels out of the caches.
    let rows = std::env::args()
        .nth(5)
        .map(|s| s.parse().unwrap())
        .unwrap_or(8960 * 8 * 1536 / cols / 16 * 16);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let only_format = std::env::args().nth(2);
    let only_m: Option<usize> = std::env::args().nth(3).map(|s| s.parse().unwrap());
    let isas = Isa::available();
    println!(
        "{threads} threads; fastest of 9 runs in ms (GB/s of weights read); last column GMAC/s; \
         int8 peak of {:?}: {:.0} GMAC/s",
        isa(),
        int8_peak_gmacs().unwrap_or(0.0)
    );
    // Natural layout: AVX2 and AVX-512 VNNI have kernels of their own there (the other classes
    // run the AVX2 ones).
    let natural: Vec<Isa> = isas
        .iter()
        .copied()
        .filter(|&i| matches!(i, Isa::Scalar | Isa::Avx2 | Isa::Avx512Vnni))
        .collect();
    let packing: Vec<Isa> = isas.iter().copied().filter(|i| i.packs()).collect();
    println!("format m {natural:?} (then {packing:?} on the interleaved layout)");
    for dtype in [
        TensorType::Ggml(GgmlDType::Q4K),
        TensorType::Ggml(GgmlDType::Q6K),
        TensorType::Ggml(GgmlDType::Q8_0),
        TensorType::Ggml(GgmlDType::Q4_0),
        TensorType::Ggml(GgmlDType::Q4_1),
        TensorType::Ggml(GgmlDType::Q5_0),
        TensorType::Mxfp4,
    ] {
        if only_format
            .as_ref()
            .is_some_and(|f| *f != format!("{dtype}"))
        {
            continue;
        }
        let mat = QMatrix::new(dtype, rows, cols, Bytes::owned(&quantize(dtype, &w))).unwrap();
        // The interleaved copy, where the format has one: an extra column.
        let packed = mat.clone().packed_for(Isa::Avx2);
        let variants: Vec<(Isa, &QMatrix)> = natural
            .iter()
            .map(|&i| (i, &mat))
            .chain(
                packing
                    .iter()
                    .filter(|_| packed.packed.is_some())
                    .map(|&i| (i, &packed)),
            )
            .collect();
        let bytes = mat.bytes.as_slice().len();
        for m in [1usize, 4, 8, 16, 32, 64, 256] {
            if only_m.is_some_and(|o| o != m) {
                continue;
            }
            let x = vec![0.3f32; m * cols];
            let mut out = vec![0f32; m * rows];
            let mut best = vec![f64::INFINITY; variants.len()];
            for _ in 0..9 {
                for (i, &(isa, mat)) in variants.iter().enumerate() {
                    if isa == Isa::Scalar && m > 1 {
                        continue;
                    }
                    let t = Instant::now();
                    matmul_with(isa, &x, m, mat, &mut out);
                    best[i] = best[i].min(t.elapsed().as_secs_f64());
                }
            }
            let cells: Vec<String> = best
                .iter()
                .map(|s| format!("{:8.2} ({:4.1})", s * 1e3, bytes as f64 / s / 1e9))
                .collect();
            let fastest = best.iter().copied().fold(f64::INFINITY, f64::min);
            let gmacs = (m * rows * cols) as f64 / fastest / 1e9;
            println!("{dtype} {m} {} {gmacs:6.1}", cells.join(" "));
        }
    }
}
