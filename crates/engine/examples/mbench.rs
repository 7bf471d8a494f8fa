//! Times the matrix products of one decoder layer and the output head of a real model at m = 1
//! and 8 rows, with the achieved bandwidth (developer tool): `cargo run --release --example mbench -- PATH`.
use engine::gguf::GgufFile;
use engine::kernels::*;
use std::time::Instant;
fn main() {
    let path = std::env::args().nth(1).expect("model path");
    let f = GgufFile::open(std::path::Path::new(&path)).unwrap();
    let names = [
        "blk.3.attn_q.weight",
        "blk.3.attn_k.weight",
        "blk.3.attn_v.weight",
        "blk.3.attn_output.weight",
        "blk.3.ffn_gate.weight",
        "blk.3.ffn_up.weight",
        "blk.3.ffn_down.weight",
        "output.weight",
        "token_embd.weight",
    ];
    for name in names {
        let Ok(w) = engine::weights::matrix(&f, name) else {
            continue;
        };
        let bytes = w.bytes.as_slice().len();
        for m in [1usize, 8] {
            let x = vec![0.1f32; m * w.cols];
            let mut out = vec![0f32; m * w.rows];
            matmul(&x, m, &w, &mut out);
            let reps = 20;
            let t = Instant::now();
            for _ in 0..reps {
                matmul(&x, m, &w, &mut out);
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{name:28} {} {}x{} m={m}: {:.3} ms {:.1} GB/s",
                w.dtype,
                w.rows,
                w.cols,
                s * 1e3,
                bytes as f64 / s / 1e9
            );
        }
    }
}
