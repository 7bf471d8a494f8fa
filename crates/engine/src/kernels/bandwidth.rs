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

/// The int8 multiply-add peak of the implementation in use, in G multiply-adds per second over
/// the pool's threads: every thread runs a register-resident loop of the step the packed kernels
/// sum products with (`vpdpbusd` where the CPU has VNNI, else `vpmaddubsw` + `vpaddw`), the
/// best of a few runs. `None` for the plain implementation. With `bandwidth`, the physical limit
/// of a pass over n rows is max(weight bytes / bandwidth, n x multiply-adds per row / this).
pub fn int8_peak_gmacs() -> Option<f64> {
    peak(super::isa().kernels().int8_peak, 1)
}

/// The AMX int8 multiply-add peak over the pool's threads, in G multiply-adds per second, when
/// the implementation in use is `Amx`: every thread runs a tile-resident loop of `tdpbssd` on full
/// tiles (16 x 16 sums over 64 bytes), measured as `int8_peak_gmacs` is. The products of passes
/// over at least `AMX_MIN_ROWS` rows run on tiles (of 32 or 16 columns per product: half or a
/// quarter of this); `int8_peak_gmacs` stays the peak of the one-row passes' VNNI kernels.
pub fn amx_int8_peak_gmacs() -> Option<f64> {
    peak(super::isa().kernels().tile_int8_peak, 4)
}

/// With AMX-BF16 (the Amx class's prompt rows and attention over a bf16 cache): the bf16 peak
/// of tiles over the pool's threads, G multiply-adds per second, measured as
/// `amx_int8_peak_gmacs` is.
pub fn amx_bf16_peak_gmacs() -> Option<f64> {
    peak(super::isa().kernels().tile_bf16_peak, 4)
}

/// The f32 multiply-add peak of the attention kernels in use, in G multiply-adds per second over
/// the pool's threads: a register-resident loop of fused multiply-adds on the registers they use
/// (512-bit on AVX-512, 256-bit otherwise), measured as `int8_peak_gmacs` is. `None` for the
/// plain implementation. Attention's scores and weighted values are f32 multiply-adds: this is
/// their compute limit, as the int8 peak is the products'.
pub fn f32_peak_gmacs() -> Option<f64> {
    peak(super::isa().kernels().f32_peak, 1)
}

/// The rate of the class's loop `run` (`None`: it has none) over the pool's threads, a
/// `per`-th of the iterations per call (tile loops take longer a step).
fn peak(run: Option<super::table::Peak>, per: usize) -> Option<f64> {
    let run = run?;
    // SAFETY: the loop is from the table of a class the CPU runs (`Isa::kernels`).
    Some(per_thread_peak(&|iters| unsafe { run(iters / per) }))
}

/// The sum over the pool's threads of each one's best rate (G per second) of `run(iters)`, which
/// returns the operations it did. Each thread times its own loop, so that one that starts late
/// does not count against the others; the rates add up.
fn per_thread_peak(run: &(dyn Fn(usize) -> u64 + Sync)) -> f64 {
    let pool = pool::global();
    let threads = pool.threads();
    let iters = 2_000_000;
    let rates: Vec<std::sync::Mutex<f64>> =
        (0..threads).map(|_| std::sync::Mutex::new(0.0)).collect();
    for _ in 0..5 {
        pool.run(threads, &|i| {
            let start = std::time::Instant::now();
            let ops = run(iters);
            let rate = ops as f64 / start.elapsed().as_secs_f64() / 1e9;
            let mut best = rates[i].lock().unwrap_or_else(|e| e.into_inner());
            *best = best.max(rate);
        });
    }
    rates
        .iter()
        .map(|r| *r.lock().unwrap_or_else(|e| e.into_inner()))
        .sum()
}
