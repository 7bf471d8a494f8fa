//! Times causal attention of ROWS rows over a cache of LEN positions for one key/value head
//! (head size HD, GROUP query heads per key/value head: qwen-coder-1.5b's 128 and 6 by default),
//! keys and values stored as DTYPE (f16, bf16, f32 or q8_0, f16 by default; bf16 on `Amx` runs on tiles), every vector implementation the
//! CPU has (`PLD_KERNEL` names one to time alone), one thread (developer tool):
//! `cargo run --release --example abench -- [ROWS [LEN [COPIES [HD [GROUP [DTYPE]]]]]]`.
//! COPIES heads, each with its own keys and values, are attended in turn, so that with enough of
//! them (more than the last-level cache holds) the keys and values come from memory, as they do
//! in a forward pass at long context.
use engine::kernels::*;
use std::time::Instant;

/// What one run measures.
struct Shape {
    rows: usize,
    len: usize,
    copies: usize,
    hd: usize,
    group: usize,
}

fn main() {
    let arg = |i: usize, d: usize| -> usize {
        std::env::args()
            .nth(i)
            .map(|s| s.parse().unwrap())
            .unwrap_or(d)
    };
    let shape = Shape {
        rows: arg(1, 8),
        len: arg(2, 512),
        copies: arg(3, 1),
        hd: arg(4, 128),
        group: arg(5, 6),
    };
    match std::env::args().nth(6).as_deref() {
        Some("f32") => run::<f32>(&shape, "f32"),
        Some("bf16") => run::<half::bf16>(&shape, "bf16"),
        None | Some("f16") => run::<half::f16>(&shape, "f16"),
        Some("q8_0") => run_q8(&shape),
        Some(other) => panic!("DTYPE is f16, bf16, f32 or q8_0, not {other}"),
    }
}

/// The numbers the heads hold: `n` of them, a pattern for each `k`.
fn fill(n: usize, k: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * k) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// `run` over q8_0 heads (`kernels::q8`'s bytes).
fn run_q8(s: &Shape) {
    let Shape {
        rows,
        len,
        copies,
        hd,
        group,
    } = *s;
    let q_stride = 2 * group * hd;
    let (ks, vs) = (64 * (len.div_ceil(64) | 1), q8::stored(hd));
    let heads: Vec<(Vec<u8>, Vec<u8>)> = (0..copies)
        .map(|c| {
            let (mut keys, mut values) = (vec![0u8; vs * ks], vec![0u8; len * vs]);
            let (kf, vf) = (fill(len * hd, 7919 + c), fill(len * hd, 7907 + c));
            for t in 0..len {
                q8::write_key(&mut keys, ks, t, &kf[t * hd..(t + 1) * hd]);
                q8::write_value(&mut values[t * vs..(t + 1) * vs], &vf[t * hd..(t + 1) * hd]);
            }
            (keys, values)
        })
        .collect();
    let q = fill(rows * q_stride, 31);
    let mut out = vec![0f32; rows * group * hd];
    let bytes = (2 * len * vs) as f64;
    let chosen = std::env::var("PLD_KERNEL").is_ok().then(isa);
    let timed = Isa::available()
        .into_iter()
        .filter(|&i| i != Isa::Scalar && chosen.is_none_or(|c| c == i));
    for isa in timed {
        let mut best = f64::INFINITY;
        for _ in 0..(200 / copies).max(5) {
            let t = Instant::now();
            for (keys, values) in &heads {
                let kv = KvHead {
                    elems: KvElems::Q8 { keys, values },
                    key_stride: ks,
                    value_stride: vs,
                    hd,
                    len,
                    offset: 0,
                };
                let scale = 1.0 / (hd as f32).sqrt();
                let mut scratch = Vec::new();
                attend_rows(
                    isa,
                    &q,
                    q_stride,
                    rows,
                    kv,
                    scale,
                    None,
                    None,
                    &mut scratch,
                    &mut out,
                );
            }
            best = best.min(t.elapsed().as_secs_f64() / copies as f64);
        }
        let macs = (rows * group * len * hd * 2) as f64;
        println!(
            "{isa:?} rows {rows} len {len} q8_0: {:.1} us per kv head ({:.1} G multiply-adds/s, \
             {:.1} GB/s)",
            best * 1e6,
            macs / best / 1e9,
            bytes / best / 1e9,
        );
    }
}

fn run<E: KvElem>(s: &Shape, dtype: &str) {
    let Shape {
        rows,
        len,
        copies,
        hd,
        group,
    } = *s;
    let q_stride = 2 * group * hd;
    let size = std::mem::size_of::<E>();
    let per_line = 64 / size;
    // Room for the whole blocks that bf16 tiles read, as the cache has.
    let room = len.next_multiple_of(64) + 64;
    let key_stride = per_line * (room.div_ceil(per_line) | 1);
    let stored = |v: Vec<f32>| -> Vec<E> { v.into_iter().map(E::from_f32).collect() };
    let heads: Vec<(Vec<E>, Vec<E>)> = (0..copies)
        .map(|c| {
            let keys = stored(fill(hd * key_stride, 7919 + c));
            (keys, stored(fill(room * hd, 7907 + c)))
        })
        .collect();
    let q = fill(rows * q_stride, 31);
    let mut out = vec![0f32; rows * group * hd];
    let mut scores = Vec::new();
    let bytes = (2 * len * hd * size) as f64;
    let mb = copies as f64 * bytes / 1e6;
    // The plain version is the reference the others are tested against, not a speed target.
    let chosen = std::env::var("PLD_KERNEL").is_ok().then(isa);
    let timed = Isa::available()
        .into_iter()
        .filter(|&i| i != Isa::Scalar && chosen.is_none_or(|c| c == i));
    for isa in timed {
        let mut best = f64::INFINITY;
        let runs = (200 / copies).max(5);
        for _ in 0..runs {
            let t = Instant::now();
            for (keys, values) in &heads {
                let kv = KvHead::new(keys, values, key_stride, hd, hd, len);
                let scale = 1.0 / (hd as f32).sqrt();
                attend_rows(
                    isa,
                    &q,
                    q_stride,
                    rows,
                    kv,
                    scale,
                    None,
                    None,
                    &mut scores,
                    &mut out,
                );
            }
            best = best.min(t.elapsed().as_secs_f64() / copies as f64);
        }
        let macs = (rows * group * len * hd * 2) as f64;
        println!(
            "{isa:?} rows {rows} len {len} {dtype} ({mb:.0} MB over {copies} heads): {:.1} us per \
             kv head ({:.1} G multiply-adds/s, {:.1} GB/s)",
            best * 1e6,
            macs / best / 1e9,
            bytes / best / 1e9,
        );
    }
}
