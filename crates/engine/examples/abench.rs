//! Times causal attention of ROWS rows over a cache of LEN positions for one key/value head
//! (head size HD, GROUP query heads per key/value head: qwen-coder-1.5b's 128 and 6 by default),
//! keys and values stored as DTYPE (f16, bf16, f32 or q8_0, f16 by default; bf16 on `Amx` runs on tiles), every vector implementation the
//! CPU has (`PLD_KERNEL` names one to time alone), one thread, or `ABENCH_THREADS` at once, each
//! over its own heads, as a pass's layers run (developer tool):
//! `cargo run --release --example abench -- [ROWS [LEN [COPIES [HD [GROUP [DTYPE]]]]]]`.
//! COPIES heads, each with its own keys and values, are attended in turn, so that with enough of
//! them (more than the last-level cache holds: `lscpu`; 480 MiB on some Xeons) the keys and
//! values come from memory, as they do in a forward pass at long context.
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

/// Times attention over each of `heads` (`head(i)` the i-th, `n` of them) on every vector class
/// (or the one `PLD_KERNEL` names) and prints the best time per head, `label` naming the cache
/// and `bytes` what one head's keys and values take.
fn time_heads<'a>(
    s: &Shape,
    n: usize,
    head: impl Fn(usize) -> KvHead<'a> + Sync,
    label: &str,
    bytes: f64,
) {
    let Shape {
        rows,
        len,
        hd,
        group,
        ..
    } = *s;
    let q_stride = 2 * group * hd;
    let q = fill(rows * q_stride, 31);
    // ABENCH_THREADS=N: N threads at once, thread k over heads k, k + N, ... (as the model's
    // layers run one key/value head per thread), timed together.
    let threads: usize = std::env::var("ABENCH_THREADS").map_or(1, |t| t.parse().unwrap());
    // The plain version is the reference the others are tested against, not a speed target.
    let chosen = std::env::var("PLD_KERNEL").is_ok().then(isa);
    let timed = Isa::available()
        .into_iter()
        .filter(|&i| i != Isa::Scalar && chosen.is_none_or(|c| c == i));
    let scale = 1.0 / (hd as f32).sqrt();
    for isa in timed {
        // One head's attention on `isa` into `out`.
        let attend = |kv: KvHead<'a>, scratch: &mut Vec<f32>, out: &mut [f32]| {
            attend_rows(isa, &q, q_stride, rows, kv, scale, None, None, scratch, out)
        };
        let mut best = f64::INFINITY;
        // One thread: the calling one, its buffers made once, so that neither a spawn nor an
        // allocation is timed with spans short enough to stay in L1 or L2.
        let (mut out, mut scratch) = (vec![0f32; rows * group * hd], Vec::new());
        for _ in 0..(200 / n).max(5) {
            let t = Instant::now();
            if threads == 1 {
                for i in 0..n {
                    attend(head(i), &mut scratch, &mut out);
                }
                best = best.min(t.elapsed().as_secs_f64() / n as f64);
                continue;
            }
            std::thread::scope(|sc| {
                for k in 0..threads {
                    let (attend, head) = (&attend, &head);
                    sc.spawn(move || {
                        let mut out = vec![0f32; rows * group * hd];
                        let mut scratch = Vec::new();
                        for i in (k..n).step_by(threads) {
                            attend(head(i), &mut scratch, &mut out);
                        }
                    });
                }
            });
            best = best.min(t.elapsed().as_secs_f64() * threads as f64 / n as f64);
        }
        let macs = (rows * group * len * hd * 2) as f64;
        // The bits of the first head's outputs, to tell whether two builds compute the same.
        let mut out = vec![0f32; rows * group * hd];
        attend(head(0), &mut Vec::new(), &mut out);
        let bits = out.iter().fold(0xcbf29ce484222325u64, |h, x| {
            (h ^ x.to_bits() as u64).wrapping_mul(0x100000001b3)
        });
        println!(
            "{isa:?} rows {rows} len {len} {label} ({:.1} MB over {n} heads): {:.1} us per kv \
             head ({:.1} G multiply-adds/s, {:.1} GB/s), outputs {bits:016x}",
            n as f64 * bytes / 1e6,
            best * 1e6,
            macs / best / 1e9,
            bytes / best / 1e9,
        );
    }
}

/// `run` over q8_0 heads (`kernels::q8`'s bytes).
fn run_q8(s: &Shape) {
    let Shape {
        len, copies, hd, ..
    } = *s;
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
    let head = |i: usize| {
        let (keys, values) = (&heads[i].0, &heads[i].1);
        KvHead {
            elems: KvElems::Q8 { keys, values },
            key_stride: ks,
            value_stride: vs,
            hd,
            len,
            offset: 0,
        }
    };
    time_heads(s, copies, head, "q8_0", (2 * len * vs) as f64);
}

fn run<E: KvElem>(s: &Shape, dtype: &str) {
    let Shape {
        len, copies, hd, ..
    } = *s;
    let size = std::mem::size_of::<E>();
    let per_line = 64 / size;
    // Room for the whole blocks that bf16 tiles read, as the cache has.
    let room = len.next_multiple_of(64) + 64;
    let key_stride = per_line * (room.div_ceil(per_line) | 1);
    let stored = |v: Vec<f32>| in_huge_pages(v.into_iter().map(E::from_f32));
    let heads: Vec<(Numbers, Numbers)> = (0..copies)
        .map(|c| {
            let keys = stored(fill(hd * key_stride, 7919 + c));
            (keys, stored(fill(room * hd, 7907 + c)))
        })
        .collect();
    let head = |i: usize| {
        let (keys, values) = (heads[i].0.as_slice::<E>(), heads[i].1.as_slice::<E>());
        KvHead::new(keys, values, key_stride, hd, hd, len)
    };
    time_heads(s, copies, head, dtype, (2 * len * hd * size) as f64);
}

/// Numbers in an anonymous mapping advised to huge pages, as the model's KV cache holds them (at
/// long context a block's key rows lie a row of positions apart: with 4 KiB pages each would
/// take its own translation).
struct Numbers(memmap2::MmapMut);

impl Numbers {
    fn as_slice<E: bytemuck::Pod>(&self) -> &[E] {
        bytemuck::cast_slice(&self.0[..])
    }
}

fn in_huge_pages<E: bytemuck::Pod>(numbers: impl ExactSizeIterator<Item = E>) -> Numbers {
    let mut map = memmap2::MmapMut::map_anon(numbers.len() * std::mem::size_of::<E>()).unwrap();
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    for (to, x) in bytemuck::cast_slice_mut::<u8, E>(&mut map[..])
        .iter_mut()
        .zip(numbers)
    {
        *to = x;
    }
    Numbers(map)
}
