//! Working memory laid out on cache lines.

/// The first `len` floats of `v` from a cache line's start: `v` grown to `len` and one line
/// more where it is shorter, and the slice from its first float on a 64-byte boundary. A
/// `Vec<f32>` is only as aligned as the allocator makes it (16 bytes, and large ones 16 bytes
/// past a page), so a kernel's 64-byte vectors there would each straddle two lines, which costs
/// the loads and stores twice (measured in attention's room for widened keys and values:
/// `abench 8 16384 24 128 6 bf16`, 38 against 50 G multiply-adds/s on one AVX-512 core).
pub fn on_lines(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    const LINE: usize = 64 / std::mem::size_of::<f32>();
    if v.len() < len + LINE {
        v.resize(len + LINE, 0.0);
    }
    let skip = v.as_ptr().align_offset(64).min(LINE);
    &mut v[skip..skip + len]
}

#[cfg(test)]
mod tests {
    use super::on_lines;

    #[test]
    fn slices_start_on_lines_and_keep_their_length() {
        // Vectors the allocator places at different offsets: small and large, grown or not.
        for first in [0usize, 1, 7, 100, 5_000, 40_000] {
            let mut v = vec![1f32; first];
            for len in [1usize, 15, 16, 17, 1_000, 70_000] {
                let s = on_lines(&mut v, len);
                assert_eq!(s.len(), len);
                assert_eq!(s.as_ptr() as usize % 64, 0, "{first} then {len}");
                // A second call on the same vector gives the same slice, without growing it.
                let (at, grown) = (s.as_ptr(), v.len());
                assert_eq!(on_lines(&mut v, len).as_ptr(), at);
                assert_eq!(v.len(), grown);
            }
        }
    }
}
