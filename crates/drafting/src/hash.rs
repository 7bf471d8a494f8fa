//! Hashing of n-grams into 64-bit keys, and a pass-through hasher for maps
//! whose keys are already such hashes.
//!
//! The key of an n-gram is built by folding its tokens in from the last one
//! backwards, so one pass from a position towards the start of the sequence
//! yields the keys of the 1-gram, 2-gram, ... ending there. Each fold step is
//! a bijection of the running state for a fixed token, followed by full
//! 64-bit diffusion, so distinct n-grams of the same length collide with
//! probability about 2^-64 per pair. Lookups still verify the tokens.

use std::hash::{BuildHasher, Hasher};

/// Starting state of the fold (an arbitrary odd constant).
pub(crate) const SEED: u64 = 0x243F_6A88_85A3_08D3;

const MUL_A: u64 = 0x9E37_79B9_7F4A_7C15;
const MUL_B: u64 = 0xD6E8_FEB8_6659_FD93;

/// Folds one more (earlier) token into an n-gram key.
#[inline(always)]
pub(crate) fn fold(state: u64, token: u32) -> u64 {
    // xor the token in, then multiply / xorshift twice: every step is
    // invertible, and the shifts carry high product bits back down.
    let mut x = (state ^ u64::from(token)).wrapping_mul(MUL_A);
    x ^= x >> 32;
    x = x.wrapping_mul(MUL_B);
    x ^ (x >> 29)
}

/// Hasher for `u64` keys that are already well mixed: it hands the key
/// through unchanged, so a map lookup costs no extra hashing.
#[derive(Clone, Copy, Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }

    /// Fallback for other key types (not used by this crate): folds the
    /// bytes in eight at a time.
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            let v = u64::from_le_bytes(word);
            self.0 = fold(self.0 ^ v, chunk.len() as u32);
        }
    }
}

/// Builds [`KeyHasher`]s.
#[derive(Clone, Copy, Default)]
pub(crate) struct BuildKeyHasher;

impl BuildHasher for BuildKeyHasher {
    type Hasher = KeyHasher;

    #[inline]
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn key(tokens: &[u32]) -> u64 {
        tokens.iter().rev().fold(SEED, |h, &t| fold(h, t))
    }

    #[test]
    fn short_ngrams_do_not_collide() {
        // Every 1-, 2- and 3-gram over a small alphabet, plus some large ids.
        let alphabet: Vec<u32> = (0..24).chain([u32::MAX, u32::MAX - 1, 1 << 31]).collect();
        let mut seen = HashSet::new();
        let mut count = 0;
        for &a in &alphabet {
            assert!(seen.insert((1, key(&[a]))));
            count += 1;
            for &b in &alphabet {
                assert!(seen.insert((2, key(&[a, b]))));
                count += 1;
                for &c in &alphabet {
                    assert!(seen.insert((3, key(&[a, b, c]))));
                    count += 1;
                }
            }
        }
        assert_eq!(seen.len(), count);
    }

    #[test]
    fn keys_use_high_and_low_bits() {
        // hashbrown uses the top 7 bits and the low bits: both must vary.
        let mut top = HashSet::new();
        let mut low = HashSet::new();
        for t in 0..256u32 {
            let k = key(&[t]);
            top.insert(k >> 57);
            low.insert(k & 0xff);
        }
        assert!(top.len() > 100, "top bits poorly spread: {}", top.len());
        assert!(low.len() > 140, "low bits poorly spread: {}", low.len());
    }
}
