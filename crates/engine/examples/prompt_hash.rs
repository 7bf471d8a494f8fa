//! A hash of every logit of a prompt's rows, fed in prefill chunks as generation feeds them
//! (developer tool): `cargo run --release --example prompt_hash -- PATH [TOKENS [THREADS]]`. Two
//! builds that print the same hash computed the same bits for the prompt.
use engine::gguf::GgufFile;
use engine::kernels::pool;
use engine::model::{BatchItem, Model};
use std::hash::{DefaultHasher, Hasher};
fn main() {
    let arg = |i: usize, d: usize| -> usize {
        std::env::args()
            .nth(i)
            .map(|s| s.parse().unwrap())
            .unwrap_or(d)
    };
    let path = std::env::args().nth(1).expect("model path");
    let (n, threads) = (arg(2, 700), arg(3, 2));
    pool::init(threads);
    let model = Model::load(&GgufFile::open(std::path::Path::new(&path)).unwrap()).unwrap();
    let tokens: Vec<u32> = (0..n).map(|i| 100 + (i as u32 * 37) % 5000).collect();
    let mut cache = model.new_cache(n);
    let mut hash = DefaultHasher::new();
    for chunk in tokens.chunks(engine::step::PREFILL_CHUNK) {
        let logits = model
            .forward(&mut [BatchItem {
                tokens: chunk,
                cache: &mut cache,
                all_logits: true,
                prompt: true,
                parents: &[],
            }])
            .unwrap();
        logits.iter().for_each(|v| hash.write_u32(v.to_bits()));
    }
    println!(
        "{} prompt rows, kernels {:?}, prompt arithmetic {}: {:016x}",
        n,
        engine::kernels::isa(),
        engine::kernels::prompt_arithmetic(),
        hash.finish()
    );
}
