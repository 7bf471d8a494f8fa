//! Loops whose iterations each write their own piece of one output buffer, on the pool's threads.

use super::pool;

/// A raw pointer to the start of a buffer whose disjoint parts worker threads write.
pub(super) struct OutPtr<T>(pub(super) *mut T);
impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutPtr<T> {}
impl<T> OutPtr<T> {
    /// The pointer. Closures that call this capture the whole `OutPtr`, which may be shared
    /// between threads, where `self.0` alone would capture the raw pointer, which may not.
    #[inline(always)]
    pub(super) fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: every user has each worker write a disjoint set of indices (its own output columns or
// piece), and the buffer outlives the parallel loop, which joins before the caller returns.
unsafe impl<T: Send> Send for OutPtr<T> {}
unsafe impl<T: Send> Sync for OutPtr<T> {}

/// Calls `f(i, chunk_i)` for the consecutive `chunk`-long pieces of `data` on the pool's threads.
pub fn par_chunks_mut<T: Send>(data: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    assert!(chunk > 0 && data.len().is_multiple_of(chunk));
    let ptr = OutPtr(data.as_mut_ptr());
    pool::global().run(data.len() / chunk, &|i| {
        // SAFETY: piece i covers [i * chunk, (i + 1) * chunk), inside `data` and disjoint from
        // every other piece; `data` stays borrowed until `run` has joined.
        let piece = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(i * chunk), chunk) };
        f(i, piece);
    });
}

/// Calls `f(i, piece_i)` on the pool's threads for the pieces `data[bounds[i]..bounds[i + 1]]`
/// (`bounds` ascending, from 0 to `data.len()`).
pub fn par_split_mut<T: Send>(
    data: &mut [T],
    bounds: &[usize],
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    assert!(bounds.first() == Some(&0) && bounds.last() == Some(&data.len()));
    assert!(bounds.windows(2).all(|w| w[0] <= w[1]));
    let ptr = OutPtr(data.as_mut_ptr());
    pool::global().run(bounds.len() - 1, &|i| {
        // SAFETY: the pieces are disjoint ranges inside `data` (bounds checked ascending and
        // within it); `data` stays borrowed until `run` has joined.
        let piece = unsafe {
            std::slice::from_raw_parts_mut(ptr.get().add(bounds[i]), bounds[i + 1] - bounds[i])
        };
        f(i, piece);
    });
}
