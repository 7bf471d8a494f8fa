//! The key/value cache of one sequence: allocated for a capacity and indexed by position, so
//! appending writes in place and cutting back (`truncate`) is O(1): positions past the new length
//! are simply overwritten by the next pass. A sequence that needs more room moves to a larger
//! cache (`Sequence::make_room`, by `copy_prefix`).
//!
//! Each layer and head has its own region. Values are stored one position after another; keys
//! transposed, one row of positions per dimension (see `kernels::KvHead`), which turns the
//! attention scores into plain vector products.
//!
//! Keys and values are stored as f32, f16, bf16 or q8 (`KvDtype`). f16 is llama.cpp's default:
//! half the memory and half the bytes attention reads, which at long context is much of a decode
//! step's traffic beside the weights. bf16 reads as few bytes and is what AMX tiles multiply. q8
//! (`kernels::q8`: int8s and an f16 scale per block of 32) takes about half of bf16's. A number
//! is rounded once, when written; every later pass reads the same rounded number, so a
//! speculative pass sees exactly what plain decoding sees and their tokens stay identical.

pub use crate::kernels::KvDtype;
use crate::kernels::{q8, KvElem, KvElems, KvHead, KvStored, ATTENTION_BLOCK};
use half::{bf16, f16};

impl KvDtype {
    /// The type a model with heads of `hd` caches in unless told otherwise, on the kernel class in
    /// use (`kernels::isa`): bf16 where the class's attention over bf16 heads ran faster than over
    /// f32 ones at every pass width (`kernels::bf16_by_default`: on AMX tiles, and on AVX-512's
    /// 512-bit registers, which widen a block at a time in wide passes), reading half f32's
    /// bytes, in half its memory, and agreeing with the transformers fixtures as closely as f32
    /// (f16 does not on SmolLM2); f32 elsewhere (AVX2, not yet measured on a CPU of that class,
    /// and the plain loops).
    pub fn auto(hd: usize) -> KvDtype {
        if crate::kernels::bf16_by_default(crate::kernels::isa(), hd) {
            KvDtype::Bf16
        } else {
            KvDtype::F32
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
    /// Numbers one position holds: a key and a value per layer and head (with q8's scales).
    pub fn numbers_per_position(&self) -> usize {
        2 * self.n_layer * (self.kv_dim / self.hd) * self.dtype.stored(self.hd)
    }

    /// Bytes one position holds.
    pub fn bytes_per_position(&self) -> usize {
        self.dtype.bytes() * self.numbers_per_position()
    }
}

/// The stored numbers: per layer, `kv_dim` rows of `key_stride` positions of keys (each head's
/// `hd` rows together); per layer and head, `room` rows of `hd` values.
enum Store {
    F16 {
        keys: Numbers<f16>,
        values: Numbers<f16>,
    },
    Bf16 {
        keys: Numbers<bf16>,
        values: Numbers<bf16>,
    },
    F32 {
        keys: Numbers<f32>,
        values: Numbers<f32>,
    },
    /// `kernels::q8`'s bytes.
    Q8 {
        keys: Numbers<u8>,
        values: Numbers<u8>,
    },
}

/// `len` numbers, zero until written, in an anonymous mapping advised to huge pages: memory is
/// committed as it is first written (for the transposed keys, whose first positions lie in
/// every page of their rows, nearly all of it at the first position: hence caches sized to their
/// sequence), and at long context attention's reads (a block's key rows lie a row of positions
/// apart) stay within a few pages' translations instead of one per row.
struct Numbers<E> {
    map: memmap2::MmapMut,
    len: usize,
    number: std::marker::PhantomData<E>,
}

impl<E: bytemuck::Pod> Numbers<E> {
    fn zeroed(len: usize) -> Numbers<E> {
        let bytes = (len * std::mem::size_of::<E>()).max(1);
        let map = memmap2::MmapMut::map_anon(bytes)
            .unwrap_or_else(|e| panic!("no memory for a KV cache of {bytes} bytes: {e}"));
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Numbers {
            map,
            len,
            number: std::marker::PhantomData,
        }
    }
}

impl<E: bytemuck::Pod> std::ops::Deref for Numbers<E> {
    type Target = [E];
    fn deref(&self) -> &[E] {
        bytemuck::cast_slice(&self.map[..self.len * std::mem::size_of::<E>()])
    }
}

impl<E: bytemuck::Pod> std::ops::DerefMut for Numbers<E> {
    fn deref_mut(&mut self) -> &mut [E] {
        bytemuck::cast_slice_mut(&mut self.map[..self.len * std::mem::size_of::<E>()])
    }
}

/// `$body` with `$keys` and `$values` bound to the store's vectors (or references to them, as
/// `$store` is taken), whichever their number type: one generic body, compiled for each. With
/// `q8 => $other`, a q8 store's bytes take `$other` instead (for bodies that need a `KvElem`:
/// one number per element).
macro_rules! on_store {
    ($store:expr, |$keys:ident, $values:ident| $body:expr) => {
        on_store!($store, |$keys, $values| $body, q8 => $body)
    };
    ($store:expr, |$keys:ident, $values:ident| $body:expr, q8 => $other:expr) => {
        match $store {
            Store::F16 {
                keys: $keys,
                values: $values,
            } => $body,
            Store::Bf16 {
                keys: $keys,
                values: $values,
            } => $body,
            Store::F32 {
                keys: $keys,
                values: $values,
            } => $body,
            Store::Q8 {
                keys: $keys,
                values: $values,
            } => $other,
        }
    };
}

pub struct KvCache {
    store: Store,
    hd: usize,
    n_layer: usize,
    kv_dim: usize,
    capacity: usize,
    /// Positions each head's values have room for: the capacity, or for a paired type (bf16)
    /// whole blocks past it, which the tiles read.
    room: usize,
    key_stride: usize,
    len: usize,
}

/// Positions a cache of `dtype` and `capacity` has room for (`KvCache::room`).
fn room(dtype: KvDtype, capacity: usize) -> usize {
    match dtype {
        KvDtype::Bf16 => capacity.next_multiple_of(ATTENTION_BLOCK) + ATTENTION_BLOCK,
        KvDtype::F16 | KvDtype::F32 | KvDtype::Q8 => capacity,
    }
}

/// Positions each head's values (`room`) and each key row (`key_stride`) have room for in a
/// cache of `capacity`: key rows start on cache lines and lie an odd number of lines apart, so
/// that the rows of one block of positions spread over every L1 set.
fn layout(dtype: KvDtype, capacity: usize) -> (usize, usize) {
    let room = room(dtype, capacity);
    let per_line = 64 / dtype.bytes();
    (room, per_line * (room.div_ceil(per_line) | 1))
}

impl KvCache {
    /// Bytes a cache of `shape` and `capacity` reserves, its keys and values (what `bytes` says
    /// once made): what a memory budget counts.
    /// An empty cache (capacity 0) counts nothing: it is never written.
    pub fn bytes_for(shape: KvShape, capacity: usize) -> usize {
        if capacity == 0 {
            return 0;
        }
        let (room, key_stride) = layout(shape.dtype, capacity);
        shape.numbers_per_position() / 2 * (room + key_stride) * shape.dtype.bytes()
    }

    /// Bytes this cache reserves (`bytes_for` its shape and capacity).
    pub fn bytes(&self) -> usize {
        KvCache::bytes_for(self.shape(), self.capacity)
    }

    /// Reserves `n_layer * capacity * kv_dim` keys and as many values of `dtype` (`Numbers`:
    /// memory is only committed for positions actually written).
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
        assert!(dtype.fits(hd), "a {} cache of heads of {hd}", dtype.name());
        let (room, key_stride) = layout(dtype, capacity);
        let numbers = n_layer * (kv_dim / hd) * dtype.stored(hd);
        let (nk, nv) = (numbers * key_stride, numbers * room);
        let store = match dtype {
            KvDtype::F16 => Store::F16 {
                keys: Numbers::zeroed(nk),
                values: Numbers::zeroed(nv),
            },
            KvDtype::Bf16 => Store::Bf16 {
                keys: Numbers::zeroed(nk),
                values: Numbers::zeroed(nv),
            },
            KvDtype::F32 => Store::F32 {
                keys: Numbers::zeroed(nk),
                values: Numbers::zeroed(nv),
            },
            KvDtype::Q8 => Store::Q8 {
                keys: Numbers::zeroed(nk),
                values: Numbers::zeroed(nv),
            },
        };
        KvCache {
            store,
            hd,
            n_layer,
            kv_dim,
            capacity,
            room,
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
        let layout = self.layout();
        let len = self.len;
        on_store!(&mut self.store, |keys, values| {
            for (j, &r) in rows.iter().enumerate() {
                if r == j {
                    continue;
                }
                assert!(start + r < len, "row {r} past the cache");
                layout.move_position(keys, values, start + r, start + j);
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
        let (to, of) = (self.layout(), from.layout());
        match (&mut self.store, &from.store) {
            (Store::F16 { keys, values }, Store::F16 { keys: k, values: v }) => {
                to.copy_prefix(of, (keys, values), (k, v), len)
            }
            (Store::Bf16 { keys, values }, Store::Bf16 { keys: k, values: v }) => {
                to.copy_prefix(of, (keys, values), (k, v), len)
            }
            (Store::F32 { keys, values }, Store::F32 { keys: k, values: v }) => {
                to.copy_prefix(of, (keys, values), (k, v), len)
            }
            (Store::Q8 { keys, values }, Store::Q8 { keys: k, values: v }) => {
                to.copy_prefix(of, (keys, values), (k, v), len)
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
                Store::Bf16 { .. } => KvDtype::Bf16,
                Store::F32 { .. } => KvDtype::F32,
                Store::Q8 { .. } => KvDtype::Q8,
            },
        }
    }

    fn layout(&self) -> Layout {
        Layout {
            heads: self.n_layer * self.kv_dim / self.hd,
            stored: self.shape().dtype.stored(self.hd),
            key_stride: self.key_stride,
            room: self.room,
        }
    }

    /// Copies the keys and values of positions `start..start + n` (all valid) into `out`, which
    /// holds `n * shape().bytes_per_position()` bytes: per layer each key row's `n` positions (a
    /// paired type's rows hold two dimensions), then per layer and head `n` values of `hd`, as
    /// the cache stores the numbers (a paired type's values one position after another).
    /// `put_rows` is its inverse.
    pub fn take_rows(&self, start: usize, n: usize, out: &mut [u8]) {
        assert!(start + n <= self.len, "rows past the cache");
        assert_eq!(out.len(), n * self.shape().bytes_per_position());
        if n == 0 {
            return;
        }
        let layout = self.layout();
        let (out_keys, out_values) = out.split_at_mut(out.len() / 2);
        on_store!(&self.store, |keys, values| {
            layout.take((keys, values), (start, n), (out_keys, out_values))
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
        let layout = self.layout();
        let (in_keys, in_values) = rows.split_at(rows.len() / 2);
        on_store!(&mut self.store, |keys, values| {
            layout.put((keys, values), (start, n), (in_keys, in_values))
        });
        self.len = start + n;
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity);
        self.len = len;
    }

    /// Writes the key and value of `pos` in `layer`, each number rounded to the stored type.
    pub(crate) fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
        debug_assert!(pos < self.capacity);
        let (hd, kv_dim, stride) = (self.hd, self.kv_dim, self.key_stride);
        let (heads, stored) = (kv_dim / hd, self.shape().dtype.stored(hd));
        let (first_value, head_values) = (layer * heads * stored * self.room, stored * self.room);
        /// The writes over numbers of type `E` (`keys` from the layer's first row).
        fn write_of<E: KvElem>(
            (keys, values): (&mut [E], &mut [E]),
            (key, value): (&[f32], &[f32]),
            (pos, hd, stride, first_value, head_values): (usize, usize, usize, usize, usize),
        ) {
            for (head, v) in value.chunks(hd).enumerate() {
                let o = first_value + head * head_values;
                for (d, &x) in v.iter().enumerate() {
                    values[o + E::value_at(pos, d, hd)] = E::from_f32(x);
                }
            }
            for (i, &k) in key.iter().enumerate() {
                keys[E::key_at(i, pos, stride)] = E::from_f32(k);
            }
        }
        let at = (pos, hd, stride, first_value, head_values);
        let (key, value) = (&key[..kv_dim], &value[..kv_dim]);
        on_store!(&mut self.store, |keys, values| {
            let rows = &mut keys[layer * kv_dim * stride..];
            write_of((rows, values), (key, value), at)
        }, q8 => {
            let first_key = layer * heads * stored * stride;
            for (head, (k, v)) in key.chunks(hd).zip(value.chunks(hd)).enumerate() {
                let rows = &mut keys[first_key + head * stored * stride..];
                q8::write_key(rows, stride, pos, k);
                let o = first_value + head * head_values + pos * stored;
                q8::write_value(&mut values[o..o + stored], v);
            }
        })
    }

    /// The first `len` keys and values of head `head` in layer `layer`.
    pub(crate) fn head(&self, layer: usize, head: usize, len: usize) -> KvHead<'_> {
        let (hd, heads) = (self.hd, self.kv_dim / self.hd);
        let stored = self.shape().dtype.stored(hd);
        let v = (layer * heads + head) * stored * self.room;
        let k = (layer * heads + head) * stored * self.key_stride;
        let (ks, vs) = (k..k + stored * self.key_stride, v..v + self.room * stored);
        on_store!(&self.store, |keys, values| {
            KvHead::new(&keys[ks], &values[vs], self.key_stride, hd, hd, len)
        }, q8 => KvHead {
            elems: KvElems::Q8 { keys: &keys[ks], values: &values[vs] },
            key_stride: self.key_stride,
            value_stride: stored,
            hd,
            len,
            offset: 0,
        })
    }
}

/// Where a cache's numbers lie: `heads` (layers times KV heads) of `stored` key rows
/// `key_stride` positions long (`stored / 2` rows of pairs twice as long for a paired type), and
/// `room` positions of `stored` values each. `stored` is the head's dimensions, and for q8 its
/// scales' bytes besides, which these copies move as numbers.
#[derive(Clone, Copy)]
struct Layout {
    heads: usize,
    stored: usize,
    key_stride: usize,
    room: usize,
}

impl Layout {
    /// Key rows of a type: (rows, numbers in a row, numbers per position in a row).
    fn key_rows<E: KvStored>(&self) -> (usize, usize, usize) {
        let per = if E::PAIRED { 2 } else { 1 };
        (self.heads * self.stored / per, per * self.key_stride, per)
    }

    /// Moves position `from`'s keys and values to `to`.
    fn move_position<E: KvStored>(&self, keys: &mut [E], values: &mut [E], from: usize, to: usize) {
        let (hd, ks) = (self.stored, self.key_stride);
        for h in 0..self.heads {
            let (kb, vb) = (h * hd * ks, h * hd * self.room);
            for i in 0..hd {
                keys[kb + E::key_at(i, to, ks)] = keys[kb + E::key_at(i, from, ks)];
                values[vb + E::value_at(to, i, hd)] = values[vb + E::value_at(from, i, hd)];
            }
        }
    }

    /// Makes the first `len` positions of `to` (in this layout) those of `from` (in `of`),
    /// copying nothing else.
    fn copy_prefix<E: KvStored>(
        &self,
        of: Layout,
        to: (&mut [E], &mut [E]),
        from: (&[E], &[E]),
        len: usize,
    ) {
        let (rows, to_row, per) = self.key_rows::<E>();
        let from_row = of.key_rows::<E>().1;
        for r in 0..rows {
            to.0[r * to_row..][..per * len].copy_from_slice(&from.0[r * from_row..][..per * len]);
        }
        let hd = self.stored;
        // Whole pairs of positions in one run; a paired type's odd last position by itself.
        let whole = if E::PAIRED { len / 2 * 2 } else { len };
        for h in 0..self.heads {
            let (a, b) = (h * hd * self.room, h * hd * of.room);
            to.1[a..a + whole * hd].copy_from_slice(&from.1[b..b + whole * hd]);
            for t in whole..len {
                for d in 0..hd {
                    to.1[a + E::value_at(t, d, hd)] = from.1[b + E::value_at(t, d, hd)];
                }
            }
        }
    }

    /// `KvCache::take_rows` over numbers of type `E`.
    fn take<E: KvStored>(
        &self,
        (keys, values): (&[E], &[E]),
        (start, n): (usize, usize),
        (out_keys, out_values): (&mut [u8], &mut [u8]),
    ) {
        let (_, row, per) = self.key_rows::<E>();
        let size = std::mem::size_of::<E>();
        for (r, chunk) in out_keys.chunks_exact_mut(per * n * size).enumerate() {
            chunk.copy_from_slice(bytemuck::cast_slice(
                &keys[r * row + per * start..][..per * n],
            ));
        }
        let hd = self.stored;
        for (h, chunk) in out_values.chunks_exact_mut(n * hd * size).enumerate() {
            let base = h * hd * self.room;
            if E::PAIRED {
                let one_by_one: Vec<E> = (start..start + n)
                    .flat_map(|t| (0..hd).map(move |d| values[base + E::value_at(t, d, hd)]))
                    .collect();
                chunk.copy_from_slice(bytemuck::cast_slice(&one_by_one));
            } else {
                chunk.copy_from_slice(bytemuck::cast_slice(&values[base + start * hd..][..n * hd]));
            }
        }
    }

    /// `KvCache::put_rows` over numbers of type `E`: `take`'s inverse.
    fn put<E: KvStored>(
        &self,
        (keys, values): (&mut [E], &mut [E]),
        (start, n): (usize, usize),
        (in_keys, in_values): (&[u8], &[u8]),
    ) {
        let (_, row, per) = self.key_rows::<E>();
        let size = std::mem::size_of::<E>();
        for (r, chunk) in in_keys.chunks_exact(per * n * size).enumerate() {
            let to = &mut keys[r * row + per * start..][..per * n];
            bytemuck::cast_slice_mut(to).copy_from_slice(chunk);
        }
        let hd = self.stored;
        for (h, chunk) in in_values.chunks_exact(n * hd * size).enumerate() {
            let base = h * hd * self.room;
            if E::PAIRED {
                let one_by_one: Vec<E> = bytemuck::pod_collect_to_vec(chunk);
                for (j, t) in (start..start + n).enumerate() {
                    for d in 0..hd {
                        values[base + E::value_at(t, d, hd)] = one_by_one[j * hd + d];
                    }
                }
            } else {
                let to = &mut values[base + start * hd..][..n * hd];
                bytemuck::cast_slice_mut(to).copy_from_slice(chunk);
            }
        }
    }
}

#[cfg(test)]
mod tests;
