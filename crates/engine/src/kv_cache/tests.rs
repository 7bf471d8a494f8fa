//! The KV cache: numbers rounded once as written, and every copy (rows taken and put back, a
//! prefix, a tree's kept rows) moving them whole, for each number type.
use super::*;
use crate::kernels::KvElems;

/// Every number type: the tests' numbers are exact in each wherever they are compared with
/// what was written.
const DTYPES: [KvDtype; 3] = [KvDtype::F16, KvDtype::Bf16, KvDtype::F32];

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
    let ks = h.key_stride;
    match h.elems {
        KvElems::F32 { keys, .. } => keys[f32::key_at(i, pos, ks)],
        KvElems::F16 { keys, .. } => keys[f16::key_at(i, pos, ks)].to_f32(),
        KvElems::Bf16 { keys, .. } => keys[bf16::key_at(i, pos, ks)].to_f32(),
        KvElems::Q8 { keys, .. } => q8::key(keys, h.hd, ks, i, pos),
    }
}

/// Value dimension `i` of position `pos` of `head` in `layer`, as f32.
fn value(c: &KvCache, layer: usize, head: usize, i: usize, pos: usize) -> f32 {
    let h = c.head(layer, head, pos + 1);
    let vs = h.value_stride;
    match h.elems {
        KvElems::F32 { values, .. } => values[f32::value_at(pos, i, vs)],
        KvElems::F16 { values, .. } => values[f16::value_at(pos, i, vs)].to_f32(),
        KvElems::Bf16 { values, .. } => values[bf16::value_at(pos, i, vs)].to_f32(),
        KvElems::Q8 { values, .. } => q8::value(values, h.hd, vs, pos, i),
    }
}

#[test]
fn truncate_keeps_prefix_and_later_writes_overwrite() {
    for dtype in DTYPES {
        let mut c = cache(dtype, 8);
        // Key dimension i of position p is 10p + i: each read below picks one position of
        // one head.
        let key_at = |pos: usize| -> Vec<f32> { (0..4).map(|i| (10 * pos + i) as f32).collect() };
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
    let given = [1.0f32 / 3.0, -7.1e-3, 1.0e6, -f32::INFINITY];
    for dtype in DTYPES {
        let mut c = cache(dtype, 4);
        c.write(0, 1, &given, &given);
        c.set_len(2);
        for (i, &x) in given.iter().enumerate() {
            let want = match dtype {
                KvDtype::F32 if x.is_infinite() => continue,
                KvDtype::F32 => x,
                KvDtype::F16 => f16::from_f32(x.clamp(-65504.0, 65504.0)).to_f32(),
                KvDtype::Bf16 => bf16::from_f32(x.max(bf16::MIN.to_f32())).to_f32(),
                KvDtype::Q8 => unreachable!("q8 has its own test"),
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
            let keys: Vec<f32> = (0..5).map(|p| key(&c, layer, 1, 1, p)).collect();
            assert_eq!(keys, [3.0, 13.0, 23.0, 43.0, 53.0]);
            let values: Vec<f32> = (0..5).map(|p| value(&c, layer, 1, 0, p)).collect();
            assert_eq!(values, [0.0, 1.0, 2.0, 4.0, 5.0]);
        }
    }
}

/// A q8 cache (heads of 32): each number within half a step of its block's scale of what was
/// written, and its scales moved with its numbers by every copy: rows taken and put back,
/// a prefix copied, a tree's kept rows moved down.
#[test]
fn q8_cache_moves_scales_with_their_numbers() {
    let q8_cache = |capacity| {
        let shape = KvShape {
            n_layer: 2,
            kv_dim: 64,
            hd: 32,
            dtype: KvDtype::Q8,
        };
        KvCache::new(shape, capacity)
    };
    // Position p's numbers grow with p, so that every position has its own scales.
    let given = |layer: usize, pos: usize, i: usize, sign: f32| {
        sign * (1.0 + pos as f32) * ((7 * i + 3 * layer) % 11) as f32 / 10.0
    };
    let mut a = q8_cache(40);
    for layer in 0..2 {
        for pos in 0..20 {
            let key: Vec<f32> = (0..64).map(|i| given(layer, pos, i, 1.0)).collect();
            let value: Vec<f32> = (0..64).map(|i| given(layer, pos, i, -1.0)).collect();
            a.write(layer, pos, &key, &value);
        }
    }
    a.set_len(20);
    let all = |c: &KvCache, len: usize| -> Vec<f32> {
        let mut v = Vec::new();
        for (layer, head, p, i) in (0..2 * 2 * len * 32)
            .map(|n| (n / (64 * len), n / (32 * len) % 2, n / 32 % len, n % 32))
        {
            v.push(key(c, layer, head, i, p));
            v.push(value(c, layer, head, i, p));
        }
        v
    };
    for (layer, head, p, i) in
        (0..2 * 2 * 20 * 32).map(|n| (n / 1280, n / 640 % 2, n / 32 % 20, n % 32))
    {
        let want = given(layer, p, 32 * head + i, 1.0);
        let step = (1.0 + p as f32) / 127.0;
        assert!((key(&a, layer, head, i, p) - want).abs() <= 0.51 * step);
        assert!((value(&a, layer, head, i, p) + want).abs() <= 0.51 * step);
    }
    let bytes = a.shape().bytes_per_position();
    assert_eq!(bytes, 2 * 2 * 2 * (32 + 2));
    let (mut first, mut second) = (vec![0u8; 8 * bytes], vec![0u8; 12 * bytes]);
    a.take_rows(0, 8, &mut first);
    a.take_rows(8, 12, &mut second);
    let mut b = q8_cache(33);
    b.put_rows(0, 8, &first);
    b.put_rows(8, 12, &second);
    assert_eq!(all(&b, 20), all(&a, 20));
    let mut c = q8_cache(16);
    c.copy_prefix(&a, 3);
    assert_eq!(all(&c, 3), all(&a, 3));
    let kept = [0usize, 2, 3];
    b.keep_rows(2, &kept);
    for (layer, head, i) in (0..128).map(|n| (n / 64, n / 32 % 2, n % 32)) {
        for (j, &r) in kept.iter().enumerate() {
            assert_eq!(
                key(&b, layer, head, i, 2 + j),
                key(&a, layer, head, i, 2 + r)
            );
            assert_eq!(
                value(&b, layer, head, i, 2 + j),
                value(&a, layer, head, i, 2 + r)
            );
        }
    }
}
