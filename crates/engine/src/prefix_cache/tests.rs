use super::*;
use crate::kv_cache::KvDtype;
use proptest::prelude::*;

mod disk;

/// f32 numbers, so that every `row_value` is held exactly (the f16 test below uses small ones).
const SHAPE: KvShape = KvShape {
    n_layer: 2,
    kv_dim: 4,
    hd: 2,
    dtype: KvDtype::F32,
};

/// What position `p` of a sequence over `tokens` holds in these tests: a number fixed by the
/// tokens up to `p`, as real rows depend on the whole prefix.
fn row_value(tokens: &[u32], p: usize, slot: usize) -> f32 {
    let h = tokens[..=p].iter().fold(17u64, |h, &t| {
        h.wrapping_mul(1_000_003).wrapping_add(t as u64)
    });
    ((h >> 40) as f32) + slot as f32 * 0.25
}

/// A cache of `tokens.len()` positions whose rows are `row_value`.
fn filled(tokens: &[u32]) -> KvCache {
    filled_as(SHAPE, tokens, |v| v)
}

/// `filled` in a cache of `shape`, each number `row_value` passed through `f`.
fn filled_as(shape: KvShape, tokens: &[u32], f: impl Fn(f32) -> f32) -> KvCache {
    let mut c = KvCache::new(shape, 256);
    for layer in 0..shape.n_layer {
        for p in 0..tokens.len() {
            let key: Vec<f32> = (0..4)
                .map(|i| f(row_value(tokens, p, layer * 8 + i)))
                .collect();
            let value: Vec<f32> = (0..4)
                .map(|i| f(row_value(tokens, p, layer * 8 + 4 + i)))
                .collect();
            c.write(layer, p, &key, &value);
        }
    }
    c.set_len(tokens.len());
    c
}

/// Checks that the first `n` positions of `c` hold the rows of `tokens`.
fn assert_rows_of(c: &KvCache, tokens: &[u32], n: usize) {
    assert_eq!(c.len(), n);
    let bytes = SHAPE.bytes_per_position();
    let (mut got, mut want) = (vec![0u8; n * bytes], vec![0u8; n * bytes]);
    c.take_rows(0, n, &mut got);
    filled(&tokens[..n]).take_rows(0, n, &mut want);
    assert_eq!(got, want);
}

fn empty() -> KvCache {
    KvCache::new(SHAPE, 256)
}

/// An f16 cache's blocks take half the bytes and come back as the very numbers it stored; a
/// cache of the other number type is refused.
#[test]
fn f16_rows_come_back_as_stored() {
    let half = KvShape {
        dtype: KvDtype::F16,
        ..SHAPE
    };
    // Numbers with more bits than f16 holds: the cache rounds them once, as written.
    let third = |v: f32| v / 3.0e4;
    let tokens: Vec<u32> = (0..40).collect();
    let mut pc = PrefixCache::new(half, 1 << 20);
    assert_eq!(
        pc.block_bytes() * 2,
        PrefixCache::new(SHAPE, 0).block_bytes()
    );
    let source = filled_as(half, &tokens, third);
    pc.insert(0, &tokens, &source);
    let mut c = KvCache::new(half, 256);
    assert_eq!(pc.lookup_into(0, &tokens, 39, &mut c), 32);
    let n = 32 * half.bytes_per_position();
    let (mut got, mut want) = (vec![0u8; n], vec![0u8; n]);
    c.take_rows(0, 32, &mut got);
    source.take_rows(0, 32, &mut want);
    assert_eq!(got, want);
    // (A cache may own a disk tier's writer thread, which is not unwind-safe; this one has none.)
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        pc.lookup_into(0, &tokens, 39, &mut empty());
    }));
    assert!(refused.is_err(), "an f32 cache took f16 rows");
}

#[test]
fn a_prompt_starts_from_its_longest_cached_prefix() {
    let mut pc = PrefixCache::new(SHAPE, 1 << 20);
    let first: Vec<u32> = (0..50).collect();
    pc.insert(0, &first, &filled(&first));
    assert_eq!(
        pc.bytes(),
        3 * pc.block_bytes(),
        "only full blocks are kept"
    );

    // Shares 40 tokens with the first: two full blocks.
    let mut second: Vec<u32> = (0..40).collect();
    second.extend(100..120);
    let mut c = empty();
    assert_eq!(pc.lookup_into(0, &second, second.len() - 1, &mut c), 32);
    assert_rows_of(&c, &second, 32);

    // The limit leaves the last token out even when everything is cached.
    let mut c = empty();
    assert_eq!(pc.lookup_into(0, &first[..48], 47, &mut c), 32);
    let stats = pc.stats();
    assert_eq!((stats.lookups, stats.hits, stats.cached_tokens), (2, 2, 64));

    // A different first token shares nothing.
    let mut c = empty();
    let other: Vec<u32> = (1..51).collect();
    assert_eq!(pc.lookup_into(0, &other, 49, &mut c), 0);
    assert!(c.is_empty());
}

#[test]
fn namespaces_never_see_each_other() {
    let mut pc = PrefixCache::new(SHAPE, 1 << 20);
    let tokens: Vec<u32> = (0..64).collect();
    pc.insert(1, &tokens, &filled(&tokens));
    let mut c = empty();
    assert_eq!(pc.lookup_into(2, &tokens, 63, &mut c), 0);
    assert_eq!(pc.lookup_into(1, &tokens, 63, &mut c), 48);
    // The same tokens under the second namespace are kept apart.
    pc.insert(2, &tokens, &filled(&tokens));
    assert_eq!(pc.bytes(), 8 * pc.block_bytes());
}

#[test]
fn a_zero_budget_keeps_nothing() {
    let mut pc = PrefixCache::new(SHAPE, 0);
    let tokens: Vec<u32> = (0..64).collect();
    pc.insert(0, &tokens, &filled(&tokens));
    assert_eq!(pc.bytes(), 0);
    assert_eq!(pc.lookup_into(0, &tokens, 63, &mut empty()), 0);
    assert_eq!(pc.stats(), PrefixCacheStats::default());
}

#[test]
fn the_least_recently_used_leaf_goes_first() {
    let block = BLOCK_TOKENS * SHAPE.bytes_per_position();
    let mut pc = PrefixCache::new(SHAPE, 4 * block);
    let a: Vec<u32> = (0..32).collect();
    let mut b: Vec<u32> = (0..16).collect();
    b.extend(500..516);
    pc.insert(0, &a, &filled(&a)); // a0, a1
    pc.insert(0, &b, &filled(&b)); // b1 after a0
    assert_eq!(pc.bytes(), 3 * block);
    // Using `a` makes b's own block the least recent: a new chain evicts it, not a0 or a1.
    assert_eq!(pc.lookup_into(0, &a, 32, &mut empty()), 32);
    let c: Vec<u32> = (1000..1032).collect();
    pc.insert(0, &c, &filled(&c));
    assert_eq!(pc.bytes(), 4 * block);
    assert_eq!(pc.stats().evicted_blocks, 1);
    assert_eq!(
        pc.lookup_into(0, &b, 32, &mut empty()),
        16,
        "b1 is gone, a0 stays"
    );
    assert_eq!(pc.lookup_into(0, &a, 32, &mut empty()), 32);
    assert_eq!(pc.lookup_into(0, &c, 32, &mut empty()), 32);
}

#[test]
fn a_chain_longer_than_the_budget_keeps_its_start() {
    let block = BLOCK_TOKENS * SHAPE.bytes_per_position();
    let mut pc = PrefixCache::new(SHAPE, 3 * block + block / 2);
    let long: Vec<u32> = (0..100).collect();
    pc.insert(0, &long, &filled(&long));
    assert_eq!(pc.bytes(), 3 * block);
    let mut c = empty();
    assert_eq!(pc.lookup_into(0, &long, 99, &mut c), 48);
    assert_rows_of(&c, &long, 48);
}

#[test]
fn positions_the_cache_does_not_hold_are_not_kept() {
    let mut pc = PrefixCache::new(SHAPE, 1 << 20);
    let tokens: Vec<u32> = (0..64).collect();
    // The cache holds 40 of the 64 (the rest were never run).
    pc.insert(0, &tokens, &filled(&tokens[..40]));
    assert_eq!(pc.bytes(), 2 * pc.block_bytes());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any mix of inserts and lookups over a small alphabet (so prefixes are shared): every
    /// lookup hands out exactly the rows of the tokens it was given, at most what was inserted,
    /// every kept block's parent is kept, and the budget holds.
    #[test]
    fn lookups_hand_out_the_rows_of_their_own_tokens(
        ops in prop::collection::vec(
            (any::<bool>(), 0u64..2, prop::collection::vec(0u32..3, 16..120)),
            1..40,
        ),
        budget_blocks in 0usize..12,
    ) {
        let block = BLOCK_TOKENS * SHAPE.bytes_per_position();
        let mut pc = PrefixCache::new(SHAPE, budget_blocks * block);
        // Each sequence starts with a short fixed run so that prefixes collide often.
        for (is_insert, ns, tail) in ops {
            let mut tokens = vec![7u32; 16];
            tokens.extend(tail);
            if is_insert {
                pc.insert(ns, &tokens, &filled(&tokens));
            } else {
                let mut c = empty();
                let n = pc.lookup_into(ns, &tokens, tokens.len() - 1, &mut c);
                prop_assert_eq!(n % BLOCK_TOKENS, 0);
                prop_assert!(n < tokens.len());
                assert_rows_of(&c, &tokens, n);
            }
            prop_assert!(pc.bytes() <= pc.budget());
            for b in pc.blocks.iter().flatten() {
                if let Some(p) = b.key.parent {
                    prop_assert!(pc.blocks[p].is_some(), "a kept block lost its parent");
                }
            }
            let kept = pc.blocks.iter().flatten().count();
            prop_assert_eq!(kept, pc.by_key.len());
            prop_assert_eq!(kept, pc.by_age.len());
        }
    }
}
