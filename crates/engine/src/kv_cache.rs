//! The key/value cache of one sequence: preallocated for its whole capacity and indexed by
//! position, so appending writes in place and cutting back (`truncate`) is O(1): positions past the
//! new length are simply overwritten by the next pass.
//!
//! Each layer and head has its own region. Values are stored one position after another; keys
//! transposed, one row of positions per dimension (see `kernels::KvHead`), which turns the
//! attention scores into plain vector products.
//!
//! Keys and values are stored as f32 or f16 (`KvDtype`). f16 is llama.cpp's default: half the
//! memory and half the bytes attention reads, which at long context is much of a decode step's
//! traffic beside the weights. A number is rounded once, when written; every later pass reads the
//! same rounded number, so a speculative pass sees exactly what plain decoding sees and their
//! tokens stay identical.

use crate::kernels::{KvElem, KvHead};
use half::f16;

/// The number type a cache stores its keys and values in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// Half precision: half the memory and the bytes attention reads.
    F16,
    /// Single precision (the default: on Zen 4 an f16 cache measured no faster at decode once
    /// its pages were faulted in as the cache fills, see the README).
    #[default]
    F32,
}

impl KvDtype {
    /// Bytes of one stored number.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }

    /// Its name, as `--kv-cache-dtype` spells it.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
        }
    }
}

/// The shape of a model's keys and values: what one cached position holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub n_layer: usize,
    /// Key (and value) numbers per position and layer: the KV heads times their dimension.
    pub kv_dim: usize,
    pub hd: usize,
    pub dtype: KvDtype,
}

impl KvShape {
    /// Numbers one position holds: a key and a value per layer.
    pub fn numbers_per_position(&self) -> usize {
        2 * self.n_layer * self.kv_dim
    }

    /// Bytes one position holds.
    pub fn bytes_per_position(&self) -> usize {
        self.dtype.bytes() * self.numbers_per_position()
    }
}

/// The stored numbers: per layer, `kv_dim` rows of `key_stride` positions of keys (each head's
/// `hd` rows together); per layer and head, `capacity` rows of `hd` values.
enum Store {
    F16 { keys: Vec<f16>, values: Vec<f16> },
    F32 { keys: Vec<f32>, values: Vec<f32> },
}

/// `$body` with `$keys` and `$values` bound to the store's vectors (or references to them, as
/// `$store` is taken), whichever their number type: one generic body, compiled for each.
macro_rules! on_store {
    ($store:expr, |$keys:ident, $values:ident| $body:expr) => {
        match $store {
            Store::F16 {
                keys: $keys,
                values: $values,
            } => $body,
            Store::F32 {
                keys: $keys,
                values: $values,
            } => $body,
        }
    };
}

pub struct KvCache {
    store: Store,
    hd: usize,
    n_layer: usize,
    kv_dim: usize,
    capacity: usize,
    key_stride: usize,
    len: usize,
}

impl KvCache {
    /// Reserves `n_layer * capacity * kv_dim` keys and as many values of `dtype`. The zeroed
    /// allocation is lazy on Linux: memory is only committed for positions actually written.
    pub fn new(shape: KvShape, capacity: usize) -> Self {
        let KvShape {
            n_layer,
            kv_dim,
            hd,
            dtype,
        } = shape;
        assert!(
            hd > 0 && kv_dim.is_multiple_of(hd),
            "heads of {hd} do not divide {kv_dim}"
        );
        // Key rows start on cache lines and lie an odd number of lines apart, so that the rows
        // of one block of positions spread over every L1 set.
        let per_line = 64 / dtype.bytes();
        let key_stride = per_line * (capacity.div_ceil(per_line) | 1);
        let (nk, nv) = (n_layer * kv_dim * key_stride, n_layer * capacity * kv_dim);
        // Zeroed allocations (`vec![0.0; n]` is one for f32; `vec![f16::ZERO; n]` would write
        // every number, committing the whole capacity at once).
        let store = match dtype {
            KvDtype::F16 => Store::F16 {
                keys: bytemuck::zeroed_vec(nk),
                values: bytemuck::zeroed_vec(nv),
            },
            KvDtype::F32 => Store::F32 {
                keys: vec![0.0; nk],
                values: vec![0.0; nv],
            },
        };
        KvCache {
            store,
            hd,
            n_layer,
            kv_dim,
            capacity,
            key_stride,
            len: 0,
        }
    }

    /// Positions that hold valid keys and values.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets every position at or after `len`.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Keeps, of the positions from `start` on, only `rows` (increasing offsets from `start`),
    /// moved down to `start, start + 1, ...`: the accepted path of a draft tree becomes consecutive
    /// and the rest is dropped. Costs one copy per kept row that moves, whatever the tree's size.
    pub fn keep_rows(&mut self, start: usize, rows: &[usize]) {
        debug_assert!(rows.windows(2).all(|w| w[0] < w[1]), "rows must increase");
        let (hd, stride, len) = (self.hd, self.key_stride, self.len);
        let (heads, head_values) = (self.n_layer * self.kv_dim / hd, hd * self.capacity);
        on_store!(&mut self.store, |keys, values| {
            for (j, &r) in rows.iter().enumerate() {
                if r == j {
                    continue;
                }
                let (from, to) = (start + r, start + j);
                assert!(from < len, "row {r} past the cache");
                for base in (0..heads).map(|lh| lh * head_values) {
                    values.copy_within(base + from * hd..base + (from + 1) * hd, base + to * hd);
                }
                for row in keys.chunks_exact_mut(stride) {
                    row[to] = row[from];
                }
            }
        });
        self.truncate(start + rows.len());
    }

    /// Makes the first `len` positions those of `from` (a cache of the same shape): a sequence
    /// forked from another after its prompt shares the prompt's keys and values without
    /// recomputing them. Only those positions are copied.
    pub fn copy_prefix(&mut self, from: &KvCache, len: usize) {
        assert!(self.shape() == from.shape(), "caches of different shapes");
        assert!(
            len <= from.len && len <= self.capacity,
            "prefix longer than the caches"
        );
        let (hd, rows) = (self.hd, self.n_layer * self.kv_dim);
        let (to_stride, from_stride) = (self.key_stride, from.key_stride);
        let (to_cap, from_cap) = (self.capacity, from.capacity);
        match (&mut self.store, &from.store) {
            (Store::F16 { keys, values }, Store::F16 { keys: k, values: v }) => {
                copy_prefix_of(keys, k, (to_stride, from_stride), rows, len);
                copy_prefix_of(values, v, (hd * to_cap, hd * from_cap), rows / hd, len * hd);
            }
            (Store::F32 { keys, values }, Store::F32 { keys: k, values: v }) => {
                copy_prefix_of(keys, k, (to_stride, from_stride), rows, len);
                copy_prefix_of(values, v, (hd * to_cap, hd * from_cap), rows / hd, len * hd);
            }
            _ => unreachable!("equal shapes have equal number types"),
        }
        self.len = len;
    }

    pub fn shape(&self) -> KvShape {
        KvShape {
            n_layer: self.n_layer,
            kv_dim: self.kv_dim,
            hd: self.hd,
            dtype: match self.store {
                Store::F16 { .. } => KvDtype::F16,
                Store::F32 { .. } => KvDtype::F32,
            },
        }
    }

    /// Where positions `start..start + n` lie: each key row's range in `keys` (per layer, one per
    /// key dimension), then each layer and head's range in `values`, in the order `take_rows`
    /// lays them out.
    fn spans(
        &self,
        start: usize,
        n: usize,
    ) -> (
        impl Iterator<Item = std::ops::Range<usize>>,
        impl Iterator<Item = std::ops::Range<usize>>,
    ) {
        let (stride, hd, capacity) = (self.key_stride, self.hd, self.capacity);
        let rows = self.n_layer * self.kv_dim;
        let keys = (0..rows).map(move |r| r * stride + start..r * stride + start + n);
        // Layer and head `lh` starts at `value_base`: `lh * hd * capacity`.
        let values = (0..rows / hd).map(move |lh| {
            let base = lh * hd * capacity + start * hd;
            base..base + n * hd
        });
        (keys, values)
    }

    /// Copies the keys and values of positions `start..start + n` (all valid) into `out`, which
    /// holds `n * shape().bytes_per_position()` bytes: per layer each key dimension's `n`
    /// positions, then per layer and head `n` values of `hd`, as the cache stores the numbers.
    /// `put_rows` is its inverse.
    pub fn take_rows(&self, start: usize, n: usize, out: &mut [u8]) {
        assert!(start + n <= self.len, "rows past the cache");
        assert_eq!(out.len(), n * self.shape().bytes_per_position());
        if n == 0 {
            return;
        }
        let (key_spans, value_spans) = self.spans(start, n);
        let (out_keys, out_values) = out.split_at_mut(out.len() / 2);
        let size = self.shape().dtype.bytes();
        on_store!(&self.store, |keys, values| {
            for (chunk, r) in out_keys.chunks_exact_mut(n * size).zip(key_spans) {
                chunk.copy_from_slice(bytemuck::cast_slice(&keys[r]));
            }
            for (chunk, r) in out_values
                .chunks_exact_mut(n * self.hd * size)
                .zip(value_spans)
            {
                chunk.copy_from_slice(bytemuck::cast_slice(&values[r]));
            }
        })
    }

    /// Writes positions `start..start + n` from `rows` (laid out as `take_rows` writes them) and
    /// makes the cache that long: `start` must be its length, so positions are only appended.
    pub fn put_rows(&mut self, start: usize, n: usize, rows: &[u8]) {
        assert_eq!(start, self.len, "rows must follow the cached ones");
        assert!(start + n <= self.capacity, "rows past the capacity");
        assert_eq!(rows.len(), n * self.shape().bytes_per_position());
        if n == 0 {
            return;
        }
        let (key_spans, value_spans) = self.spans(start, n);
        let (in_keys, in_values) = rows.split_at(rows.len() / 2);
        let (hd, size) = (self.hd, self.shape().dtype.bytes());
        on_store!(&mut self.store, |keys, values| {
            for (chunk, r) in in_keys.chunks_exact(n * size).zip(key_spans) {
                bytemuck::cast_slice_mut(&mut keys[r]).copy_from_slice(chunk);
            }
            for (chunk, r) in in_values.chunks_exact(n * hd * size).zip(value_spans) {
                bytemuck::cast_slice_mut(&mut values[r]).copy_from_slice(chunk);
            }
        });
        self.len = start + n;
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity);
        self.len = len;
    }

    /// Where the values of `head` in `layer` start.
    fn value_base(&self, layer: usize, head: usize) -> usize {
        debug_assert!(layer < self.n_layer && head * self.hd < self.kv_dim);
        (layer * self.kv_dim + head * self.hd) * self.capacity
    }

    /// Writes the key and value of `pos` in `layer`, each number rounded to the stored type.
    pub(crate) fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
        debug_assert!(pos < self.capacity);
        let (hd, kv_dim, stride) = (self.hd, self.kv_dim, self.key_stride);
        let first_value = self.value_base(layer, 0) + pos * hd;
        let head_values = hd * self.capacity;
        on_store!(&mut self.store, |keys, values| {
            for (head, v) in value[..kv_dim].chunks(hd).enumerate() {
                let o = first_value + head * head_values;
                for (to, &x) in values[o..o + hd].iter_mut().zip(v) {
                    *to = KvElem::from_f32(x);
                }
            }
            let rows = &mut keys[layer * kv_dim * stride..];
            for (i, &k) in key[..kv_dim].iter().enumerate() {
                rows[i * stride + pos] = KvElem::from_f32(k);
            }
        })
    }

    /// The first `len` keys and values of head `head` in layer `layer`.
    pub(crate) fn head(&self, layer: usize, head: usize, len: usize) -> KvHead<'_> {
        let hd = self.hd;
        let v = self.value_base(layer, head);
        let k = (layer * self.kv_dim + head * hd) * self.key_stride;
        let (ks, vs) = (k..k + hd * self.key_stride, v..v + self.capacity * hd);
        on_store!(&self.store, |keys, values| {
            KvHead::new(&keys[ks], &values[vs], self.key_stride, hd, hd, len)
        })
    }
}

/// The first `len` numbers of each of `rows` runs, from runs `strides.1` apart in `from` to runs
/// `strides.0` apart in `to`.
fn copy_prefix_of<E: Copy>(
    to: &mut [E],
    from: &[E],
    strides: (usize, usize),
    rows: usize,
    len: usize,
) {
    for r in 0..rows {
        let (a, b) = (r * strides.0, r * strides.1);
        to[a..a + len].copy_from_slice(&from[b..b + len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::KvElems;

    /// Both number types: every test's numbers are exact in f16.
    const DTYPES: [KvDtype; 2] = [KvDtype::F16, KvDtype::F32];

    fn cache(dtype: KvDtype, capacity: usize) -> KvCache {
        let shape = KvShape {
            n_layer: 2,
            kv_dim: 4,
            hd: 2,
            dtype,
        };
        KvCache::new(shape, capacity)
    }

    /// Key dimension `i` of position `pos` of `head` in `layer`, as f32.
    fn key(c: &KvCache, layer: usize, head: usize, i: usize, pos: usize) -> f32 {
        let h = c.head(layer, head, pos + 1);
        match h.elems {
            KvElems::F32 { keys, .. } => keys[i * h.key_stride + pos],
            KvElems::F16 { keys, .. } => keys[i * h.key_stride + pos].to_f32(),
        }
    }

    /// Value dimension `i` of position `pos` of `head` in `layer`, as f32.
    fn value(c: &KvCache, layer: usize, head: usize, i: usize, pos: usize) -> f32 {
        let h = c.head(layer, head, pos + 1);
        match h.elems {
            KvElems::F32 { values, .. } => values[pos * h.value_stride + i],
            KvElems::F16 { values, .. } => values[pos * h.value_stride + i].to_f32(),
        }
    }

    #[test]
    fn truncate_keeps_prefix_and_later_writes_overwrite() {
        for dtype in DTYPES {
            let mut c = cache(dtype, 8);
            // Key dimension i of position p is 10p + i: each read below picks one position of
            // one head.
            let key_at =
                |pos: usize| -> Vec<f32> { (0..4).map(|i| (10 * pos + i) as f32).collect() };
            for pos in 0..5 {
                c.write(1, pos, &key_at(pos), &[-(pos as f32); 4]);
            }
            c.set_len(5);
            c.truncate(3);
            assert_eq!(c.len(), 3);
            let keys = |c: &KvCache, pos: usize, head: usize| -> Vec<f32> {
                (0..2).map(|i| key(c, 1, head, i, pos)).collect()
            };
            assert_eq!(keys(&c, 2, 0), key_at(2)[..2]);
            assert_eq!(keys(&c, 4, 1), key_at(4)[2..]);
            assert_eq!([value(&c, 1, 1, 0, 2), value(&c, 1, 1, 1, 2)], [-2.0; 2]);
            c.write(1, 3, &[9.0; 4], &[9.0; 4]);
            c.set_len(4);
            assert_eq!(keys(&c, 3, 1), [9.0; 2]);
            c.truncate(10);
            assert_eq!(c.len(), 4, "truncate never grows");
        }
    }

    /// f16 rounds each number once, to the nearest, and holds what f16 cannot as its largest
    /// finite number; f32 keeps it as given.
    #[test]
    fn numbers_are_rounded_to_the_stored_type_once() {
        let given = [1.0f32 / 3.0, -7.1e-3, 1.0e6, -1.0e6];
        for dtype in DTYPES {
            let mut c = cache(dtype, 4);
            c.write(0, 1, &given, &given);
            c.set_len(2);
            for (i, &x) in given.iter().enumerate() {
                let want = match dtype {
                    KvDtype::F32 => x,
                    KvDtype::F16 => f16::from_f32(x.clamp(-65504.0, 65504.0)).to_f32(),
                };
                assert_eq!(key(&c, 0, i / 2, i % 2, 1), want, "{dtype:?} key {i}");
                assert_eq!(value(&c, 0, i / 2, i % 2, 1), want, "{dtype:?} value {i}");
                assert!(want.is_finite());
            }
        }
    }

    #[test]
    fn copy_prefix_copies_only_the_prefix() {
        for dtype in DTYPES {
            let mut a = cache(dtype, 8);
            for layer in 0..2 {
                for pos in 0..5 {
                    a.write(layer, pos, &[pos as f32 + 0.5; 4], &[pos as f32 + 1.0; 4]);
                }
            }
            a.set_len(5);
            let mut b = cache(dtype, 16);
            b.copy_prefix(&a, 3);
            assert_eq!(b.len(), 3);
            for layer in 0..2 {
                for p in 0..3 {
                    assert_eq!(key(&b, layer, 1, 1, p), key(&a, layer, 1, 1, p));
                    assert_eq!(value(&b, layer, 1, 0, p), value(&a, layer, 1, 0, p));
                }
                assert_eq!(value(&b, layer, 1, 0, 3), 0.0, "nothing past the prefix");
            }
        }
    }

    #[test]
    fn put_rows_restores_what_take_rows_took() {
        for dtype in DTYPES {
            let mut a = cache(dtype, 40);
            for layer in 0..2 {
                for pos in 0..20 {
                    let key: Vec<f32> = (0..4)
                        .map(|i| (100 * layer + 10 * pos + i) as f32)
                        .collect();
                    a.write(layer, pos, &key, &[-(pos as f32) - 0.5 * layer as f32; 4]);
                }
            }
            a.set_len(20);
            let bytes = a.shape().bytes_per_position();
            assert_eq!(bytes, 2 * 2 * 4 * dtype.bytes());
            let (mut first, mut second) = (vec![0u8; 8 * bytes], vec![0u8; 12 * bytes]);
            a.take_rows(0, 8, &mut first);
            a.take_rows(8, 12, &mut second);
            let mut b = cache(dtype, 33);
            b.put_rows(0, 8, &first);
            b.put_rows(8, 12, &second);
            assert_eq!(b.len(), 20);
            for (layer, head, p, i) in
                (0..2 * 2 * 20 * 2).map(|n| (n / 80, n / 40 % 2, n / 2 % 20, n % 2))
            {
                assert_eq!(key(&b, layer, head, i, p), key(&a, layer, head, i, p));
                assert_eq!(value(&b, layer, head, i, p), value(&a, layer, head, i, p));
            }
        }
    }

    #[test]
    fn keep_rows_moves_the_kept_rows_down() {
        for dtype in DTYPES {
            let mut c = cache(dtype, 8);
            let key_at =
                |pos: usize| -> Vec<f32> { (0..4).map(|i| (10 * pos + i) as f32).collect() };
            for layer in 0..2 {
                for pos in 0..6 {
                    c.write(layer, pos, &key_at(pos), &[pos as f32; 4]);
                }
            }
            c.set_len(6);
            // Rows 2.. were a tree; keep rows 0, 2 and 3 of it (positions 2, 4, 5).
            c.keep_rows(2, &[0, 2, 3]);
            assert_eq!(c.len(), 5);
            for layer in 0..2 {
                let keys: Vec<f32> = (0..5).map(|p| key(&c, layer, 1, 1, p)).collect();
                assert_eq!(keys, [3.0, 13.0, 23.0, 43.0, 53.0]);
                let values: Vec<f32> = (0..5).map(|p| value(&c, layer, 1, 0, p)).collect();
                assert_eq!(values, [0.0, 1.0, 2.0, 4.0, 5.0]);
            }
        }
    }
}
