//! A corrupt, truncated or hostile GGUF file is a clear error, never a panic or a huge
//! allocation: a small valid file is built here, then cut short at every length, has random
//! bytes of its header changed, and has its counts, lengths and shapes replaced by absurd
//! values; opening each must return (an error, or for harmless changes a file) without
//! panicking.

use engine::gguf::GgufFile;
use proptest::prelude::*;
use std::path::PathBuf;

/// Byte offsets of the fields the hostile cases overwrite.
struct Layout {
    bytes: Vec<u8>,
    tensor_count: usize,
    first_key_len: usize,
    array_count: usize,
    first_dims: usize,
    first_dim: usize,
    header_end: usize,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A GGUF 3 file: four metadata entries (a string, a u32, an array of strings, an array of
/// f32) and two F32 tensors, aligned to 32 bytes.
fn valid_file() -> Layout {
    let mut b = Vec::new();
    b.extend(0x4655_4747u32.to_le_bytes());
    b.extend(3u32.to_le_bytes());
    let tensor_count = b.len();
    b.extend(2u64.to_le_bytes());
    b.extend(4u64.to_le_bytes());
    let first_key_len = b.len();
    string(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    string(&mut b, "llama");
    string(&mut b, "llama.block_count");
    b.extend(4u32.to_le_bytes());
    b.extend(1u32.to_le_bytes());
    string(&mut b, "tokenizer.ggml.tokens");
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    let array_count = b.len();
    b.extend(3u64.to_le_bytes());
    for t in ["a", "bc", "def"] {
        string(&mut b, t);
    }
    string(&mut b, "tokenizer.ggml.scores");
    b.extend(9u32.to_le_bytes());
    b.extend(6u32.to_le_bytes());
    b.extend(3u64.to_le_bytes());
    for x in [0.5f32, -1.0, 2.0] {
        b.extend(x.to_le_bytes());
    }
    string(&mut b, "w");
    let first_dims = b.len();
    b.extend(2u32.to_le_bytes());
    let first_dim = b.len();
    b.extend(4u64.to_le_bytes());
    b.extend(2u64.to_le_bytes());
    b.extend(0u32.to_le_bytes()); // F32
    b.extend(0u64.to_le_bytes());
    string(&mut b, "v");
    b.extend(1u32.to_le_bytes());
    b.extend(3u64.to_le_bytes());
    b.extend(0u32.to_le_bytes());
    b.extend(32u64.to_le_bytes());
    let header_end = b.len();
    while b.len() % 32 != 0 {
        b.push(0);
    }
    for i in 0..8 {
        b.extend((i as f32).to_le_bytes());
    }
    for i in 0..3 {
        b.extend((i as f32 * 0.5).to_le_bytes());
    }
    Layout {
        bytes: b,
        tensor_count,
        first_key_len,
        array_count,
        first_dims,
        first_dim,
        header_end,
    }
}

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "pld-gguf-fuzz-{}-{tag}-{:?}.gguf",
        std::process::id(),
        std::thread::current().id()
    ))
}

/// Opens `bytes` as a file; returns whether it opened (panics propagate and fail the test).
fn open(bytes: &[u8], tag: &str) -> Result<(), String> {
    let path = temp_path(tag);
    std::fs::write(&path, bytes).unwrap();
    let r = GgufFile::open(&path).map(|_| ()).map_err(|e| e.to_string());
    let _ = std::fs::remove_file(&path);
    r
}

#[test]
fn the_valid_file_opens() {
    let l = valid_file();
    open(&l.bytes, "valid").expect("the valid file opens");
}

#[test]
fn every_truncation_is_an_error() {
    let l = valid_file();
    for len in 0..l.bytes.len() {
        let e = open(&l.bytes[..len], "cut").expect_err("a truncated file must not open");
        assert!(!e.is_empty());
    }
}

#[test]
fn hostile_counts_are_refused_by_name() {
    let l = valid_file();
    let cases: [(usize, &[u8], &str); 6] = [
        (l.tensor_count, &u64::MAX.to_le_bytes(), "tensors"),
        (
            l.tensor_count + 8,
            &(1u64 << 50).to_le_bytes(),
            "metadata entries",
        ),
        (
            l.first_key_len,
            &(1u64 << 62).to_le_bytes(),
            "truncated or corrupt",
        ),
        (
            l.array_count,
            &(u64::MAX / 2).to_le_bytes(),
            "array elements",
        ),
        (l.first_dims, &1000u32.to_le_bytes(), "dimensions"),
        (l.first_dim, &(1u64 << 62).to_le_bytes(), "impossibly large"),
    ];
    for (at, value, want) in cases {
        let mut b = l.bytes.clone();
        b[at..at + value.len()].copy_from_slice(value);
        let e = open(&b, "hostile").expect_err("a hostile header must not open");
        assert!(e.contains(want), "byte {at}: {e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any few bytes of the header changed: an error or a file, never a panic.
    #[test]
    fn corrupted_headers_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)
    ) {
        let l = valid_file();
        let mut b = l.bytes.clone();
        for (i, v) in edits {
            b[i.index(l.header_end)] = v;
        }
        let _ = open(&b, "edit");
    }
}
