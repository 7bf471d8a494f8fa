//! How fast this machine streams memory: the ceiling of a decode step, which reads every weight once.

use super::pool;

/// Streaming-read bandwidth in GB/s: the best of a few passes over a buffer of `bytes` (make it
/// larger than the last-level cache), split over the pool's threads as the matmuls are. This is
/// what a decode step, which reads every weight once, can get at best.
pub fn read_bandwidth(bytes: usize) -> f64 {
    let words: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let pool = pool::global();
    let pieces = pool.threads() * 16;
    let piece = words.len().div_ceil(pieces);
    let mut best = f64::INFINITY;
    for _ in 0..4 {
        let start = std::time::Instant::now();
        pool.run(pieces, &|i| {
            let lo = (i * piece).min(words.len());
            let hi = ((i + 1) * piece).min(words.len());
            // Eight independent sums so that the loop is bound by loads, not by one add chain.
            let mut acc = [0u64; 8];
            for c in words[lo..hi].chunks_exact(8) {
                for (a, w) in acc.iter_mut().zip(c) {
                    *a = a.wrapping_add(*w);
                }
            }
            std::hint::black_box(acc);
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    (words.len() * 8) as f64 / best / 1e9
}
