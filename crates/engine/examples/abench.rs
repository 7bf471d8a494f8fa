//! Times causal attention of 1 to 16 rows over a cache of LEN positions for one key/value head of
//! qwen-coder-1.5b's shape (head size 128, six query heads per key/value head), every
//! implementation the CPU has, one thread (developer tool):
//! `cargo run --release --example abench -- [ROWS [LEN]]`.
use engine::kernels::*;
use std::time::Instant;
fn main() {
    let arg = |i: usize, d: usize| -> usize {
        std::env::args()
            .nth(i)
            .map(|s| s.parse().unwrap())
            .unwrap_or(d)
    };
    let (rows, len) = (arg(1, 8), arg(2, 512));
    let (hd, group) = (128usize, 6usize);
    let q_stride = 12 * hd;
    let key_stride = 16 * (len.div_ceil(16) | 1);
    let fill = |n: usize, k: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * k) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    };
    let keys = fill(hd * key_stride, 7919);
    let values = fill(len * hd, 7907);
    let q = fill(rows * q_stride, 31);
    let mut out = vec![0f32; rows * group * hd];
    let mut scores = Vec::new();
    for isa in Isa::available() {
        let mut best = f64::INFINITY;
        let runs = if isa == Isa::Scalar { 5 } else { 200 };
        for _ in 0..runs {
            let t = Instant::now();
            let kv = KvHead {
                keys: &keys,
                values: &values,
                key_stride,
                value_stride: hd,
                hd,
                len,
            };
            let scale = 1.0 / (hd as f32).sqrt();
            attend_rows(
                isa,
                &q,
                q_stride,
                rows,
                kv,
                scale,
                None,
                &mut scores,
                &mut out,
            );
            best = best.min(t.elapsed().as_secs_f64());
        }
        let macs = (rows * group * len * hd * 2) as f64;
        println!(
            "{isa:?} rows {rows} len {len}: {:.1} us per kv head ({:.1} G multiply-adds/s); \
             x 2 heads x 28 layers = {:.2} ms",
            best * 1e6,
            macs / best / 1e9,
            best * 56.0 * 1e3
        );
    }
}
