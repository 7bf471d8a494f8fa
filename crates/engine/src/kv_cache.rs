//! The key/value cache of one sequence: preallocated for its whole capacity and indexed by
//! position, so appending writes in place and cutting back (`truncate`) is O(1): positions past the
//! new length are simply overwritten by the next pass.

use crate::kernels::KvHead;

pub struct KvCache {
    keys: Vec<f32>,
    values: Vec<f32>,
    n_layer: usize,
    kv_dim: usize,
    capacity: usize,
    len: usize,
}

impl KvCache {
    /// Reserves `n_layer * capacity * kv_dim` keys and as many values. The zeroed allocation is
    /// lazy on Linux: memory is only committed for positions actually written.
    pub fn new(n_layer: usize, kv_dim: usize, capacity: usize) -> Self {
        let size = n_layer * capacity * kv_dim;
        KvCache {
            keys: vec![0.0; size],
            values: vec![0.0; size],
            n_layer,
            kv_dim,
            capacity,
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

    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity);
        self.len = len;
    }

    fn offset(&self, layer: usize, pos: usize) -> usize {
        debug_assert!(layer < self.n_layer && pos < self.capacity);
        (layer * self.capacity + pos) * self.kv_dim
    }

    pub(crate) fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
        let o = self.offset(layer, pos);
        self.keys[o..o + self.kv_dim].copy_from_slice(key);
        self.values[o..o + self.kv_dim].copy_from_slice(value);
    }

    /// The first `len` keys and values of head `head` (`hd` wide) in layer `layer`.
    pub(crate) fn head(&self, layer: usize, head: usize, hd: usize, len: usize) -> KvHead<'_> {
        let o = self.offset(layer, 0) + head * hd;
        let end = self.offset(layer, 0) + self.capacity * self.kv_dim;
        KvHead {
            keys: &self.keys[o..end],
            values: &self.values[o..end],
            stride: self.kv_dim,
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
        let mut c = KvCache::new(2, 4, 8);
        for pos in 0..5 {
            c.write(1, pos, &[pos as f32; 4], &[-(pos as f32); 4]);
        }
        c.set_len(5);
        c.truncate(3);
        assert_eq!(c.len(), 3);
        let key = |c: &KvCache, pos: usize, head: usize, hd: usize| {
            c.head(1, head, hd, 4).keys[pos * 4..pos * 4 + hd].to_vec()
        };
        assert_eq!(key(&c, 2, 0, 4), [2.0; 4]);
        assert_eq!(c.head(1, 0, 4, 4).values[2 * 4..3 * 4], [-2.0; 4]);
        c.write(1, 3, &[9.0; 4], &[9.0; 4]);
        c.set_len(4);
        assert_eq!(key(&c, 3, 1, 2), [9.0; 2]);
        c.truncate(10);
        assert_eq!(c.len(), 4, "truncate never grows");
    }
}
