//! The disk tier: blocks survive the process, checked on read; foreign, corrupt, truncated and
//! half-written files are never used; tenants and models stay apart; the directory keeps to its
//! budget.

use super::*;
use std::fs;
use std::path::{Path, PathBuf};

const KEY: u128 = 0x5eed;

fn open(dir: &Path, budget: u64, key: u128) -> PrefixCache {
    let disk = DiskTier::open(dir, budget, key, SHAPE).expect("open the directory");
    PrefixCache::new(SHAPE, 1 << 20).with_disk(disk)
}

/// A cache over `dir` that has kept `tokens`' blocks and been dropped (its writes finished), as a
/// process that served them and stopped.
fn served(dir: &Path, tokens: &[u32]) {
    let mut pc = open(dir, 1 << 30, KEY);
    pc.insert(7, tokens, &filled(tokens));
}

/// The block files in `dir`, in no order.
fn block_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for shard in fs::read_dir(dir).unwrap().flatten() {
        let name = shard.file_name().to_string_lossy().to_string();
        if name.len() == 2 {
            for f in fs::read_dir(shard.path()).unwrap().flatten() {
                files.push(f.path());
            }
        }
    }
    files
}

/// The file of the block after `parents` (the earlier blocks' tokens, whole blocks) under
/// namespace 7.
fn file_of(dir: &Path, tokens: &[u32], block: usize) -> PathBuf {
    let mut parent = 0;
    let mut name = None;
    for b in tokens.chunks_exact(BLOCK_TOKENS).take(block + 1) {
        let n = BlockName::new(KEY, 7, parent, block_tokens(b));
        parent = n.hash;
        name = Some(n);
    }
    let hex = format!("{:032x}", name.unwrap().hash);
    dir.join(&hex[..2]).join(format!("{hex}.kv"))
}

#[test]
fn a_new_process_starts_from_the_blocks_of_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..70).collect();
    served(dir.path(), &tokens);
    assert_eq!(block_files(dir.path()).len(), 4, "four full blocks");

    let mut pc = open(dir.path(), 1 << 30, KEY);
    let mut c = empty();
    assert_eq!(pc.lookup_into(7, &tokens, 69, &mut c), 64);
    assert_rows_of(&c, &tokens, 64);
    assert_eq!(pc.stats().disk_tokens, 64);
    assert_eq!(pc.disk().unwrap().stats().read_blocks, 4);
    // Read once, they are in memory now.
    let mut c = empty();
    assert_eq!(pc.lookup_into(7, &tokens, 69, &mut c), 64);
    assert_eq!(pc.disk().unwrap().stats().read_blocks, 4);
    assert_rows_of(&c, &tokens, 64);
}

#[test]
fn memory_first_then_disk_where_memory_ends() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..64).collect();
    served(dir.path(), &tokens);
    let mut pc = open(dir.path(), 1 << 30, KEY);
    // This process computed only the first block itself.
    pc.insert(7, &tokens[..16], &filled(&tokens[..16]));
    let mut c = empty();
    assert_eq!(pc.lookup_into(7, &tokens, 63, &mut c), 48);
    assert_rows_of(&c, &tokens, 48);
    assert_eq!(pc.stats().disk_tokens, 32);
}

#[test]
fn other_tenants_and_models_find_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..40).collect();
    served(dir.path(), &tokens);
    let mut pc = open(dir.path(), 1 << 30, KEY);
    assert_eq!(pc.lookup_into(8, &tokens, 39, &mut empty()), 0);
    drop(pc);
    let mut other_model = open(dir.path(), 1 << 30, KEY + 1);
    assert_eq!(other_model.lookup_into(7, &tokens, 39, &mut empty()), 0);
}

#[test]
fn a_file_that_fails_its_check_is_deleted_and_its_block_recomputed() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..64).collect();
    served(dir.path(), &tokens);
    // A flipped byte in the second block's rows, the third truncated.
    let second = file_of(dir.path(), &tokens, 1);
    let mut bytes = fs::read(&second).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    fs::write(&second, &bytes).unwrap();
    let third = file_of(dir.path(), &tokens, 2);
    let len = fs::metadata(&third).unwrap().len();
    fs::File::options()
        .write(true)
        .open(&third)
        .unwrap()
        .set_len(len - 5)
        .unwrap();

    let mut pc = open(dir.path(), 1 << 30, KEY);
    let mut c = empty();
    assert_eq!(
        pc.lookup_into(7, &tokens, 63, &mut c),
        16,
        "only the first block"
    );
    assert_rows_of(&c, &tokens, 16);
    assert_eq!(pc.disk().unwrap().stats().rejected_blocks, 1);
    assert!(!second.exists(), "the corrupt file is deleted");

    // Recomputed and kept again, the whole prefix comes back.
    pc.insert(7, &tokens, &filled(&tokens));
    drop(pc);
    let mut pc = open(dir.path(), 1 << 30, KEY);
    let mut c = empty();
    // The truncated third block was not reached before, so it was not rewritten: the chain is
    // whole up to it now, and its file is rejected.
    assert_eq!(pc.lookup_into(7, &tokens, 63, &mut c), 32);
    assert_rows_of(&c, &tokens, 32);
    assert_eq!(pc.disk().unwrap().stats().rejected_blocks, 1);
}

#[test]
fn a_foreign_file_under_a_blocks_name_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..32).collect();
    served(dir.path(), &tokens);
    // Another block's file copied over the first's name: right size, right checksums, wrong
    // tokens.
    let (first, second) = (
        file_of(dir.path(), &tokens, 0),
        file_of(dir.path(), &tokens, 1),
    );
    fs::copy(&second, &first).unwrap();
    let mut pc = open(dir.path(), 1 << 30, KEY);
    assert_eq!(pc.lookup_into(7, &tokens, 31, &mut empty()), 0);
    assert_eq!(pc.disk().unwrap().stats().rejected_blocks, 1);
}

#[test]
fn a_half_written_file_is_never_read_and_is_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..32).collect();
    served(dir.path(), &tokens);
    // What a kill in the middle of a write leaves: a partial file under tmp/.
    let first = file_of(dir.path(), &tokens, 0);
    let bytes = fs::read(&first).unwrap();
    let tmp = dir.path().join("tmp").join(first.file_name().unwrap());
    fs::write(&tmp, &bytes[..bytes.len() / 2]).unwrap();
    fs::remove_file(&first).unwrap();
    let mut pc = open(dir.path(), 1 << 30, KEY);
    assert!(!tmp.exists(), "cleared at start");
    assert_eq!(pc.lookup_into(7, &tokens, 31, &mut empty()), 0);
    assert_eq!(pc.disk().unwrap().stats().rejected_blocks, 0);
}

#[test]
fn the_directory_keeps_to_its_budget_least_recent_first() {
    let dir = tempfile::tempdir().unwrap();
    let file_bytes = fs::metadata(&{
        served(dir.path(), &(0..16).collect::<Vec<u32>>());
        block_files(dir.path())[0].clone()
    })
    .unwrap()
    .len();
    // Room for three files.
    let mut pc = open(dir.path(), 3 * file_bytes + 10, KEY);
    let a: Vec<u32> = (100..140).collect();
    let b: Vec<u32> = (200..240).collect();
    pc.insert(7, &a, &filled(&a));
    pc.disk().unwrap().flush();
    assert!(pc.disk().unwrap().bytes() <= 3 * file_bytes + 10);
    pc.insert(7, &b, &filled(&b));
    pc.disk().unwrap().flush();
    let disk = pc.disk().unwrap();
    assert_eq!(disk.bytes(), 3 * file_bytes);
    drop(pc);
    // The newest chain is whole on disk.
    let mut fresh = open(dir.path(), 1 << 30, KEY);
    assert_eq!(fresh.lookup_into(7, &b, 39, &mut empty()), 32);
    // Of the older chain only its first block is left (a leaf went first, never a parent).
    assert_eq!(fresh.lookup_into(7, &a, 39, &mut empty()), 16);
}

#[test]
fn one_process_per_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _first = DiskTier::open(dir.path(), 1 << 20, KEY, SHAPE).unwrap();
    let second = DiskTier::open(dir.path(), 1 << 20, KEY, SHAPE);
    let err = second
        .err()
        .expect("a second opener is refused")
        .to_string();
    assert!(err.contains("in use by another process"), "{err}");
}

/// The model key names the model file, the cache's shape and attention's arithmetic: blocks
/// computed by tiles never serve a process whose attention runs on vectors (or on tiles of
/// another version), whose bits would differ, and the same inputs always give the same key.
#[test]
fn the_model_key_tells_attentions_arithmetic_apart() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.gguf");
    fs::write(&model, b"not really a model, but bytes to hash").unwrap();
    let key = |shape, arithmetic| disk::model_key(&model, shape, arithmetic).unwrap();
    let plain = key(SHAPE, "plain");
    assert_eq!(plain, key(SHAPE, "plain"));
    assert_ne!(plain, key(SHAPE, "bf16 tiles 2"));
    assert_ne!(key(SHAPE, "bf16 tiles 1"), key(SHAPE, "bf16 tiles 2"));
    let bf16 = KvShape {
        dtype: KvDtype::Bf16,
        ..SHAPE
    };
    assert_ne!(plain, key(bf16, "plain"));
    let tiles = crate::kernels::attention_arithmetic(crate::kernels::Isa::Scalar, 128, true);
    assert_eq!(tiles, "plain", "the plain version never runs on tiles");
}
