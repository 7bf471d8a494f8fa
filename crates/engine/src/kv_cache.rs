//! The key/value cache of one sequence: preallocated for its whole capacity and indexed by
//! position, so appending writes in place and cutting back (`truncate`) is O(1): positions past the
//! new length are simply overwritten by the next pass.
//!
//! Each layer and head has its own region. Values are stored one position after another; keys
//! transposed, one row of positions per dimension (see `kernels::KvHead`), which turns the
//! attention scores into plain vector products.

use crate::kernels::KvHead;

/// The shape of a model's keys and values: what one cached position holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub n_layer: usize,
    /// Key (and value) floats per position and layer: the KV heads times their dimension.
    pub kv_dim: usize,
    pub hd: usize,
}

impl KvShape {
    /// Floats one position holds: a key and a value per layer.
    pub fn floats_per_position(&self) -> usize {
        2 * self.n_layer * self.kv_dim
    }

    /// Bytes one position holds (f32 keys and values).
    pub fn bytes_per_position(&self) -> usize {
        4 * self.floats_per_position()
    }
}

pub struct KvCache {
    /// Per layer, `kv_dim` rows of `key_stride` positions (each head's `hd` rows together).
    keys: Vec<f32>,
    /// Per layer and head, `capacity` rows of `hd`.
    values: Vec<f32>,
    hd: usize,
    n_layer: usize,
    kv_dim: usize,
    capacity: usize,
    key_stride: usize,
    len: usize,
}

impl KvCache {
    /// Reserves `n_layer * capacity * kv_dim` keys and as many values. The zeroed allocation is
    /// lazy on Linux: memory is only committed for positions actually written.
    pub fn new(n_layer: usize, kv_dim: usize, hd: usize, capacity: usize) -> Self {
        assert!(
            hd > 0 && kv_dim.is_multiple_of(hd),
            "heads of {hd} do not divide {kv_dim}"
        );
        // Key rows start on cache lines and lie an odd number of lines apart, so that the rows
        // of one block of positions spread over every L1 set.
        let key_stride = 16 * (capacity.div_ceil(16) | 1);
        KvCache {
            keys: vec![0.0; n_layer * kv_dim * key_stride],
            values: vec![0.0; n_layer * capacity * kv_dim],
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
        let (hd, stride) = (self.hd, self.key_stride);
        for (j, &r) in rows.iter().enumerate() {
            if r == j {
                continue;
            }
            let (from, to) = (start + r, start + j);
            assert!(from < self.len, "row {r} past the cache");
            for layer in 0..self.n_layer {
                for head in 0..self.kv_dim / hd {
                    let base = self.value_base(layer, head);
                    self.values
                        .copy_within(base + from * hd..base + (from + 1) * hd, base + to * hd);
                }
                let keys = &mut self.keys[layer * self.kv_dim * stride..];
                for i in 0..self.kv_dim {
                    keys[i * stride + to] = keys[i * stride + from];
                }
            }
        }
        self.truncate(start + rows.len());
    }

    /// Makes the first `len` positions those of `from` (a cache of the same shape): a sequence
    /// forked from another after its prompt shares the prompt's keys and values without
    /// recomputing them. Only those positions are copied.
    pub fn copy_prefix(&mut self, from: &KvCache, len: usize) {
        assert!(
            self.n_layer == from.n_layer && self.kv_dim == from.kv_dim && self.hd == from.hd,
            "caches of different shapes"
        );
        assert!(
            len <= from.len && len <= self.capacity,
            "prefix longer than the caches"
        );
        let hd = self.hd;
        for layer in 0..self.n_layer {
            for head in 0..self.kv_dim / hd {
                let (a, b) = (self.value_base(layer, head), from.value_base(layer, head));
                self.values[a..a + len * hd].copy_from_slice(&from.values[b..b + len * hd]);
            }
            for i in 0..self.kv_dim {
                let a = (layer * self.kv_dim + i) * self.key_stride;
                let b = (layer * from.kv_dim + i) * from.key_stride;
                self.keys[a..a + len].copy_from_slice(&from.keys[b..b + len]);
            }
        }
        self.len = len;
    }

    pub fn shape(&self) -> KvShape {
        KvShape {
            n_layer: self.n_layer,
            kv_dim: self.kv_dim,
            hd: self.hd,
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
    /// holds `n * shape().floats_per_position()` floats: per layer each key dimension's `n`
    /// positions, then per layer and head `n` values of `hd`. `put_rows` is its inverse.
    pub fn take_rows(&self, start: usize, n: usize, out: &mut [f32]) {
        assert!(start + n <= self.len, "rows past the cache");
        assert_eq!(out.len(), n * self.shape().floats_per_position());
        if n == 0 {
            return;
        }
        let (keys, values) = out.split_at_mut(out.len() / 2);
        let (key_spans, value_spans) = self.spans(start, n);
        for (chunk, r) in keys.chunks_exact_mut(n).zip(key_spans) {
            chunk.copy_from_slice(&self.keys[r]);
        }
        for (chunk, r) in values.chunks_exact_mut(n * self.hd).zip(value_spans) {
            chunk.copy_from_slice(&self.values[r]);
        }
    }

    /// Writes positions `start..start + n` from `rows` (laid out as `take_rows` writes them) and
    /// makes the cache that long: `start` must be its length, so positions are only appended.
    pub fn put_rows(&mut self, start: usize, n: usize, rows: &[f32]) {
        assert_eq!(start, self.len, "rows must follow the cached ones");
        assert!(start + n <= self.capacity, "rows past the capacity");
        assert_eq!(rows.len(), n * self.shape().floats_per_position());
        let (keys, values) = rows.split_at(rows.len() / 2);
        if n == 0 {
            return;
        }
        let (key_spans, value_spans) = self.spans(start, n);
        for (chunk, r) in keys.chunks_exact(n).zip(key_spans) {
            self.keys[r].copy_from_slice(chunk);
        }
        for (chunk, r) in values.chunks_exact(n * self.hd).zip(value_spans) {
            self.values[r].copy_from_slice(chunk);
        }
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

    pub(crate) fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
        debug_assert!(pos < self.capacity);
        let hd = self.hd;
        for (head, v) in value[..self.kv_dim].chunks(hd).enumerate() {
            let o = self.value_base(layer, head) + pos * hd;
            self.values[o..o + hd].copy_from_slice(v);
        }
        let rows = &mut self.keys[layer * self.kv_dim * self.key_stride..];
        for (i, &k) in key[..self.kv_dim].iter().enumerate() {
            rows[i * self.key_stride + pos] = k;
        }
    }

    /// The first `len` keys and values of head `head` in layer `layer`.
    pub(crate) fn head(&self, layer: usize, head: usize, len: usize) -> KvHead<'_> {
        let hd = self.hd;
        let v = self.value_base(layer, head);
        let k = (layer * self.kv_dim + head * hd) * self.key_stride;
        KvHead {
            keys: &self.keys[k..k + hd * self.key_stride],
            values: &self.values[v..v + self.capacity * hd],
            key_stride: self.key_stride,
            value_stride: hd,
            hd,
            len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_keeps_prefix_and_later_writes_overwrite() {
        let mut c = KvCache::new(2, 4, 2, 8);
        // Key dimension i of position p is 10p + i: each read below picks one position of one
        // head.
        let key_at = |pos: usize| -> Vec<f32> { (0..4).map(|i| (10 * pos + i) as f32).collect() };
        for pos in 0..5 {
            c.write(1, pos, &key_at(pos), &[-(pos as f32); 4]);
        }
        c.set_len(5);
        c.truncate(3);
        assert_eq!(c.len(), 3);
        let key = |c: &KvCache, pos: usize, head: usize| {
            let h = c.head(1, head, 4);
            (0..2)
                .map(|i| h.keys[i * h.key_stride + pos])
                .collect::<Vec<_>>()
        };
        assert_eq!(key(&c, 2, 0), key_at(2)[..2]);
        assert_eq!(key(&c, 4, 1), key_at(4)[2..]);
        assert_eq!(c.head(1, 1, 4).values[2 * 2..3 * 2], [-2.0; 2]);
        c.write(1, 3, &[9.0; 4], &[9.0; 4]);
        c.set_len(4);
        assert_eq!(key(&c, 3, 1), [9.0; 2]);
        c.truncate(10);
        assert_eq!(c.len(), 4, "truncate never grows");
    }

    #[test]
    fn copy_prefix_copies_only_the_prefix() {
        let mut a = KvCache::new(2, 4, 2, 8);
        for layer in 0..2 {
            for pos in 0..5 {
                a.write(layer, pos, &[pos as f32 + 0.5; 4], &[pos as f32; 4]);
            }
        }
        a.set_len(5);
        let mut b = KvCache::new(2, 4, 2, 16);
        b.copy_prefix(&a, 3);
        assert_eq!(b.len(), 3);
        for layer in 0..2 {
            let (ha, hb) = (a.head(layer, 1, 5), b.head(layer, 1, 4));
            for p in 0..3 {
                assert_eq!(hb.keys[hb.key_stride + p], ha.keys[ha.key_stride + p]);
                assert_eq!(hb.values[p * 2], ha.values[p * 2]);
            }
            assert_eq!(hb.values[3 * 2], 0.0, "nothing past the prefix");
        }
    }

    #[test]
    fn put_rows_restores_what_take_rows_took() {
        let mut a = KvCache::new(2, 4, 2, 40);
        for layer in 0..2 {
            for pos in 0..20 {
                let key: Vec<f32> = (0..4)
                    .map(|i| (100 * layer + 10 * pos + i) as f32)
                    .collect();
                a.write(layer, pos, &key, &[-(pos as f32) - 0.5 * layer as f32; 4]);
            }
        }
        a.set_len(20);
        let floats = a.shape().floats_per_position();
        let (mut first, mut second) = (vec![0.0; 8 * floats], vec![0.0; 12 * floats]);
        a.take_rows(0, 8, &mut first);
        a.take_rows(8, 12, &mut second);
        let mut b = KvCache::new(2, 4, 2, 33);
        b.put_rows(0, 8, &first);
        b.put_rows(8, 12, &second);
        assert_eq!(b.len(), 20);
        for layer in 0..2 {
            for head in 0..2 {
                let (ha, hb) = (a.head(layer, head, 20), b.head(layer, head, 20));
                for p in 0..20 {
                    for i in 0..2 {
                        assert_eq!(
                            hb.keys[i * hb.key_stride + p],
                            ha.keys[i * ha.key_stride + p]
                        );
                        assert_eq!(hb.values[p * 2 + i], ha.values[p * 2 + i]);
                    }
                }
            }
        }
    }

    #[test]
    fn keep_rows_moves_the_kept_rows_down() {
        let mut c = KvCache::new(2, 4, 2, 8);
        let key_at = |pos: usize| -> Vec<f32> { (0..4).map(|i| (10 * pos + i) as f32).collect() };
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
            let h = c.head(layer, 1, 5);
            let keys: Vec<f32> = (0..5).map(|p| h.keys[h.key_stride + p]).collect();
            assert_eq!(keys, [3.0, 13.0, 23.0, 43.0, 53.0]);
            let values: Vec<f32> = (0..5).map(|p| h.values[p * 2]).collect();
            assert_eq!(values, [0.0, 1.0, 2.0, 4.0, 5.0]);
        }
    }
}
