//! Repeats one forward pass of N new tokens over a cache of C tokens, for profiling with `perf`
//! (developer tool): `cargo run --release --example pbench -- PATH N [REPEATS [CONTEXT [THREADS
//! [last]]]]]`; with `last`, logits of the last row only, as in prefill (else every row's, as in
//! verification).
use engine::gguf::GgufFile;
use engine::kernels::pool;
use engine::model::{BatchItem, Model};
use std::time::Instant;
fn main() {
    let arg = |i: usize, d: usize| -> usize {
        std::env::args()
            .nth(i)
            .map(|s| s.parse().unwrap())
            .unwrap_or(d)
    };
    let path = std::env::args().nth(1).expect("model path");
    let (n, repeats, context, threads) = (arg(2, 16), arg(3, 20), arg(4, 512), arg(5, 2));
    let all_logits = std::env::args().nth(6).as_deref() != Some("last");
    pool::init(threads);
    let model = Model::load(&GgufFile::open(std::path::Path::new(&path)).unwrap()).unwrap();
    let tokens: Vec<u32> = (0..context + n)
        .map(|i| 100 + (i as u32 * 37) % 5000)
        .collect();
    let mut cache = model.new_cache(context + n);
    for chunk in tokens[..context].chunks(256) {
        model
            .forward(&mut [BatchItem {
                tokens: chunk,
                cache: &mut cache,
                all_logits: false,
                prompt: true,
                parents: &[],
            }])
            .unwrap();
    }
    let mut times = Vec::new();
    for _ in 0..repeats {
        let t = Instant::now();
        model
            .forward(&mut [BatchItem {
                tokens: &tokens[context..],
                cache: &mut cache,
                all_logits,
                prompt: !all_logits,
                parents: &[],
            }])
            .unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        cache.truncate(context);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{n} rows over {context}: median {:.2} ms, fastest {:.2} ms",
        times[times.len() / 2],
        times[0]
    );
}
