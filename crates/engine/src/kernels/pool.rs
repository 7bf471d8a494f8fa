//! A persistent thread pool for the forward pass. A decode step runs a few hundred small parallel
//! loops (every matrix product of every layer); waking parked threads for each costs tens of
//! microseconds, as much as a small product itself. Workers here spin for a while after each job,
//! so the next one starts within a microsecond, and park only when the engine goes idle.
//!
//! A job is a closure over item indices `0..n`; the calling thread works on it too, items are
//! claimed from a shared counter, and `run` returns only after every worker has checked out of the
//! job (which is what lets the closure borrow from the caller's stack).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_millis(2);

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    epoch: AtomicUsize,
    job: UnsafeCell<Option<(Job, usize)>>,
    next: AtomicUsize,
    checked_in: AtomicUsize,
    sleepers: AtomicUsize,
    /// Set by a worker whose part of the job panicked; `run` panics in its stead.
    panicked: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread inside `Pool::run` while no worker reads it (all
// workers have checked out of the previous job), and read by workers only after they observe the
// new epoch (Acquire pairs with the Release store in `run`).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct Pool {
    shared: Arc<Shared>,
    workers: usize,
    run_lock: Mutex<()>,
}

impl Pool {
    /// A pool that runs jobs on `threads` threads (the caller included).
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            next: AtomicUsize::new(0),
            checked_in: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = threads.max(1) - 1;
        for i in 0..workers {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("pld-worker-{i}"))
                .spawn(move || worker(&s))
                .expect("spawn a worker thread");
        }
        Pool {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    pub fn threads(&self) -> usize {
        self.workers + 1
    }

    /// Calls `f(i)` for every `i` in `0..n`, spread over the pool's threads.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.workers == 0 || n <= 1 {
            (0..n).for_each(f);
            return;
        }
        // One job at a time (the server and tests may call from several threads).
        let _guard = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: erasing the closure's lifetime is sound because this function does not return
        // before every worker has checked out of the job (the wait below).
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        // SAFETY: no worker reads `job` now: all checked out of the previous job.
        unsafe { *s.job.get() = Some((job, n)) };
        s.next.store(0, Ordering::Relaxed);
        s.checked_in.store(0, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let checkout = CheckOut {
            s,
            workers: self.workers,
        };
        work(s, f, n);
        drop(checkout);
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a job panicked on a worker thread");
        }
    }
}

/// Waits, when dropped, until every worker has checked out of the job: also when the job panics on
/// the calling thread, since the workers may still be running the closure, which borrows from the
/// caller's stack.
struct CheckOut<'a> {
    s: &'a Shared,
    workers: usize,
}

impl Drop for CheckOut<'_> {
    fn drop(&mut self) {
        while self.s.checked_in.load(Ordering::Acquire) < self.workers {
            std::hint::spin_loop();
        }
    }
}

fn work(s: &Shared, f: &(dyn Fn(usize) + Sync), n: usize) {
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        f(i);
    }
}

fn worker(s: &Shared) {
    // The epoch starts at 0: a job posted before this thread got going is still seen as new.
    let mut seen = 0;
    loop {
        // Wait for the next job: spin, then park.
        let start = Instant::now();
        let mut spins = 0u32;
        while s.epoch.load(Ordering::Acquire) == seen {
            if s.shutdown.load(Ordering::Relaxed) {
                return;
            }
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(256) && start.elapsed() > SPIN {
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                while s.epoch.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
                    l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
                }
                drop(l);
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
        }
        seen = s.epoch.load(Ordering::Acquire);
        // SAFETY: the job was stored before the epoch was bumped and stays valid until this
        // worker checks in below.
        if let Some((job, n)) = unsafe { *s.job.get() } {
            let f: &(dyn Fn(usize) + Sync) = unsafe { &*job };
            // A panic in the job must not keep this worker from checking out: `run` waits for it.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(s, f, n)));
            if ran.is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.checked_in.fetch_add(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.wake.notify_all();
    }
}

static POOL: OnceLock<Pool> = OnceLock::new();

/// Sets the number of compute threads; only the first call counts. Returns the number in use.
pub fn init(threads: usize) -> usize {
    POOL.get_or_init(|| Pool::new(threads)).threads()
}

/// The engine's pool (all cores unless `init` chose otherwise).
pub fn global() -> &'static Pool {
    POOL.get_or_init(|| {
        Pool::new(
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_item_runs_once() {
        let pool = Pool::new(3);
        for n in [0usize, 1, 2, 7, 1000] {
            let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n={n}");
        }
        // After the workers have parked, jobs still run.
        std::thread::sleep(SPIN * 3);
        let sum = AtomicU64::new(0);
        pool.run(100, &|i| {
            sum.fetch_add(i as u64, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }

    #[test]
    fn a_panicking_job_panics_in_run_once_every_item_is_done() {
        let pool = Pool::new(3);
        let sum = AtomicU64::new(0);
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(1000, &|i| {
                assert!(i != 500, "item 500");
                sum.fetch_add(i as u64, Ordering::Relaxed);
            })
        }));
        assert!(ran.is_err());
        // Every other item ran before `run` returned, on whichever thread.
        assert_eq!(sum.load(Ordering::Relaxed), 499_500 - 500);
        let hits = AtomicU64::new(0);
        pool.run(100, &|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 100);
    }
}
