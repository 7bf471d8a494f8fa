//! The q8 cache's heads (`kernels::q8`): each block rounded to the nearest step of its scale, and
//! attention over a q8 head, on every implementation the CPU has, bit for bit the plain loops
//! over an f32 head holding the same numbers: alone, in rows and as a draft tree's nodes.

use super::attention::{attend_all, noise};
use super::*;
use crate::kernels::q8;

/// A q8 head of `hd` dimensions over `len` positions (key rows `ks` bytes apart), key `i` of
/// position `t` written as `key(i, t)` and value `d` as `value(t, d)`: its bytes, and the f32
/// head of the numbers it holds (key rows `len` apart).
#[allow(clippy::type_complexity)]
fn q8_head(
    (hd, len, ks): (usize, usize, usize),
    key: impl Fn(usize, usize) -> f32,
    value: impl Fn(usize, usize) -> f32,
) -> ((Vec<u8>, Vec<u8>), (Vec<f32>, Vec<f32>)) {
    let vs = q8::stored(hd);
    let (mut keys, mut values) = (vec![0u8; q8::stored(hd) * ks], vec![0u8; len * vs]);
    for t in 0..len {
        let k: Vec<f32> = (0..hd).map(|i| key(i, t)).collect();
        let v: Vec<f32> = (0..hd).map(|d| value(t, d)).collect();
        q8::write_key(&mut keys, ks, t, &k);
        q8::write_value(&mut values[t * vs..(t + 1) * vs], &v);
    }
    let (mut kf, mut vf) = (vec![0f32; hd * len], vec![0f32; len * hd]);
    q8::dequantize(
        (&keys, &values),
        (hd, ks, vs),
        (0, len),
        (&mut kf, len),
        &mut vf,
    );
    ((keys, values), (kf, vf))
}

/// The head over a q8 head's bytes.
fn q8_kv<'a>(keys: &'a [u8], values: &'a [u8], hd: usize, ks: usize, len: usize) -> KvHead<'a> {
    KvHead {
        elems: KvElems::Q8 { keys, values },
        key_stride: ks,
        value_stride: q8::stored(hd),
        hd,
        len,
        offset: 0,
    }
}

#[test]
fn q8_blocks_round_to_the_nearest_step_of_their_scale() {
    let mut q = [0i8; 32];
    for seed in 0..50u64 {
        // Magnitudes from 1e-3 to 1e3, one outlier in some blocks.
        let mag = 10f32.powi((seed % 7) as i32 - 3);
        let mut x: Vec<f32> = random_vec(32, seed).iter().map(|v| v * mag).collect();
        if seed % 3 == 0 {
            x[seed as usize % 32] = 40.0 * mag;
        }
        let bits = q8::quantize_block(&x, &mut q);
        let step = half::f16::from_bits(bits).to_f32();
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // The scale's rounding to f16: relative, or below f16's normal numbers, absolute.
        let rounding = (amax * 2e-3).max(127.0 * 6e-8);
        assert!(
            (step * 127.0 - amax).abs() <= rounding,
            "seed {seed}: scale"
        );
        for (v, &n) in x.iter().zip(&q) {
            let err = (v - n as f32 * step).abs();
            // Half a step, or where the scale rounded down, the clamp at 127 steps.
            assert!(err <= 0.5 * step + rounding, "seed {seed}: {v} as {n}");
        }
    }
    assert_eq!(q8::quantize_block(&[0.0; 32], &mut q), 0);
    assert_eq!(q, [0; 32]);
    let mut wild = [1.0f32; 32];
    (wild[0], wild[1], wild[2]) = (f32::NAN, f32::INFINITY, -1e30);
    let step = half::f16::from_bits(q8::quantize_block(&wild, &mut q)).to_f32();
    assert!(step.is_finite() && q[0] == 0 && q[1] == 127 && q[2] == -127);
}

#[test]
fn q8_attention_equals_f32_attention_over_its_numbers() {
    for &(hd, group, len, rows) in &[
        (32usize, 2usize, 1usize, 1usize),
        (64, 3, 37, 1),
        (128, 6, 530, 5),
        (64, 7, 300, 70),
        (128, 1, 129, 16),
        (256, 3, 70, 9),
        (32, 1, 1000, 3),
    ] {
        let ks = len + 13;
        let ((kb, vb), (kf, vf)) = q8_head(
            (hd, len, ks),
            |i, t| noise(1 + hd as u64, i, t) * (1.0 + (i % 5) as f32),
            |t, d| noise(2 + len as u64, t, d),
        );
        let q_stride = group * hd + 16;
        let q = random_vec((rows - 1) * q_stride + group * hd, 3 + len as u64);
        let scale = 1.0 / (hd as f32).sqrt();
        let f32_kv = KvHead::new(&kf, &vf, len, hd, hd, len);
        let want = attend_all(Isa::Scalar, &q, q_stride, rows, group, f32_kv, scale, None);
        let kv = q8_kv(&kb, &vb, hd, ks, len);
        for isa in Isa::available() {
            let got = attend_all(isa, &q, q_stride, rows, group, kv, scale, None);
            let what = format!("{isa:?} hd {hd} group {group} len {len} rows {rows}");
            assert!(got == want, "{what}: differs from f32 over its numbers");
            let last = rows - 1;
            let alone = KvHead { len, ..kv };
            let qr = &q[last * q_stride..last * q_stride + group * hd];
            let one = attend_all(isa, qr, group * hd, 1, group, alone, scale, None);
            assert!(one == got[last * group * hd..], "{what}: last row alone");
        }
    }
}

#[test]
fn q8_tree_rows_equal_f32_tree_rows() {
    for &(hd, group, start, rows, seed) in &[
        (64usize, 3usize, 40usize, 12usize, 1u64),
        (128, 6, 127, 64, 2),
        (32, 2, 7, 30, 3),
    ] {
        let len = start + rows;
        let ks = len + 5;
        let ((kb, vb), (kf, vf)) = q8_head(
            (hd, len, ks),
            |i, t| noise(10 + seed, i, t),
            |t, d| noise(20 + seed, t, d),
        );
        let mut masks = vec![1u64];
        for r in 1..rows {
            let parent = (noise(30 + seed, r, 0).abs() * r as f32) as usize % r;
            masks.push(masks[parent] | 1 << r);
        }
        let tree = TreeMask {
            start,
            rows: &masks,
        };
        let q_stride = group * hd;
        let q = random_vec(rows * q_stride, 40 + seed);
        let scale = 1.0 / (hd as f32).sqrt();
        let f32_kv = KvHead::new(&kf, &vf, len, hd, hd, len);
        let want = attend_all(
            Isa::Scalar,
            &q,
            q_stride,
            rows,
            group,
            f32_kv,
            scale,
            Some(tree),
        );
        let kv = q8_kv(&kb, &vb, hd, ks, len);
        for isa in Isa::available() {
            let got = attend_all(isa, &q, q_stride, rows, group, kv, scale, Some(tree));
            assert!(got == want, "{isa:?} hd {hd} start {start} rows {rows}");
        }
    }
}
