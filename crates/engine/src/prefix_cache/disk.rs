//! The prefix cache's second tier: blocks kept as files in a directory (`--prefix-cache-dir`),
//! so that a restarted process starts from the prefixes an earlier one computed.
//!
//! A block's file is named by its chain hash, xxh3-128 over the model key (the model file's hash
//! with the cache's shape and number type and the name of attention's arithmetic), the tenant's
//! namespace, the chain hash of the block
//! before it and its tokens: what finds a block in memory finds it on disk. The file repeats the
//! model key, the namespace, the parent's hash and the tokens, and a read compares them all, so
//! neither a collision nor a file of another model or tenant is ever used.
//!
//! A file is written whole under `tmp/` and renamed into place, so a process killed in the middle
//! of a write leaves only a temporary file, never read and removed at the next start. Each file
//! carries checksums of its header and of its rows, checked on every read: a corrupt, truncated
//! or foreign file is logged, deleted, and its block recomputed. There is no fsync: a kill loses
//! nothing the page cache holds, and after a power cut the checksums catch a torn file.
//!
//! Writes go to a thread of their own, so the engine thread never waits on the disk; it reads
//! (one `read` of the whole file into a buffer it reuses) only when a prompt's prefix is on disk
//! and not in memory. The directory holds at most its budget of bytes, least recently used first;
//! a file's modification time carries its last use across restarts. One process per directory
//! (a lock file says so).

use super::BLOCK_TOKENS;
use crate::kv_cache::KvShape;
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};
use xxhash_rust::xxh3::{xxh3_128, xxh3_64, Xxh3};

const MAGIC: [u8; 8] = *b"pldkv\0\0\x01";
/// Magic, model key, namespace, parent hash, tokens, rows' length and checksum, header checksum.
const HEADER: usize = 8 + 16 + 8 + 16 + 4 * BLOCK_TOKENS + 8 + 8 + 8;
/// Writes waiting for the writer thread before new ones are dropped (their blocks stay in memory).
const QUEUE: usize = 1024;
/// A file's modification time is brought up to date at most this often.
const MARK_EVERY: Duration = Duration::from_secs(60);

/// What names one block, in memory and on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BlockName {
    pub hash: u128,
    pub namespace: u64,
    pub parent: u128,
    pub tokens: [u32; BLOCK_TOKENS],
}

impl BlockName {
    pub(super) fn new(
        model_key: u128,
        namespace: u64,
        parent: u128,
        tokens: [u32; BLOCK_TOKENS],
    ) -> Self {
        let mut bytes = [0u8; 16 + 8 + 16 + 4 * BLOCK_TOKENS];
        bytes[..16].copy_from_slice(&model_key.to_le_bytes());
        bytes[16..24].copy_from_slice(&namespace.to_le_bytes());
        bytes[24..40].copy_from_slice(&parent.to_le_bytes());
        for (b, t) in bytes[40..].chunks_exact_mut(4).zip(tokens) {
            b.copy_from_slice(&t.to_le_bytes());
        }
        BlockName {
            hash: xxh3_128(&bytes),
            namespace,
            parent,
            tokens,
        }
    }
}

/// The key of a model's blocks: xxh3-128 of its file, its cache's shape and number type, and
/// the name of the arithmetic attention and, where it differs from generated rows', the prompt rows'
/// products computed them with (`kernels::attention_arithmetic`, `kernels::prompt_arithmetic`), so
/// that a process never continues from keys and values whose bits it would not have computed
/// itself. Reads the whole file once (about a third of a second per GB from the page cache).
pub fn model_key(path: &Path, shape: KvShape, arithmetic: &str) -> io::Result<u128> {
    let mut file = File::open(path)?;
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    for n in [shape.n_layer, shape.kv_dim, shape.hd, shape.dtype.bytes()] {
        hasher.update(&(n as u64).to_le_bytes());
    }
    hasher.update(shape.dtype.name().as_bytes());
    hasher.update(&(arithmetic.len() as u64).to_le_bytes());
    hasher.update(arithmetic.as_bytes());
    Ok(hasher.digest128())
}

/// What the disk tier has done since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Blocks read from files and used.
    pub read_blocks: u64,
    /// Files found corrupt, truncated or foreign on read, deleted.
    pub rejected_blocks: u64,
}

/// The directory's index: every block file with its size and last use.
#[derive(Default)]
struct Index {
    files: HashMap<u128, Entry>,
    /// Hashes by their stamp, least recently used first.
    by_age: BTreeMap<u64, u128>,
    clock: u64,
    bytes: u64,
}

struct Entry {
    bytes: u64,
    stamp: u64,
    /// When the file's modification time was last set (None: never by this process).
    marked: Option<Instant>,
}

impl Index {
    fn add(&mut self, hash: u128, bytes: u64, marked: Option<Instant>) {
        self.clock += 1;
        let stamp = self.clock;
        self.by_age.insert(stamp, hash);
        self.bytes += bytes;
        let old = self.files.insert(
            hash,
            Entry {
                bytes,
                stamp,
                marked,
            },
        );
        if let Some(old) = old {
            self.by_age.remove(&old.stamp);
            self.bytes -= old.bytes;
        }
    }

    fn remove(&mut self, hash: u128) {
        if let Some(e) = self.files.remove(&hash) {
            self.by_age.remove(&e.stamp);
            self.bytes -= e.bytes;
        }
    }

    /// Makes `hash` the most recently used; true when its file's time should be set again.
    fn touch(&mut self, hash: u128, now: Instant) -> bool {
        self.clock += 1;
        let stamp = self.clock;
        let Some(e) = self.files.get_mut(&hash) else {
            return false;
        };
        self.by_age.remove(&e.stamp);
        e.stamp = stamp;
        self.by_age.insert(stamp, hash);
        let stale = e.marked.is_none_or(|t| now.duration_since(t) >= MARK_EVERY);
        if stale {
            e.marked = Some(now);
        }
        stale
    }
}

/// What the engine thread and the writer share.
struct Shared {
    dir: PathBuf,
    model_key: u128,
    /// Bytes of one block's rows.
    rows_bytes: usize,
    budget: u64,
    index: Mutex<Index>,
}

impl Shared {
    fn path(&self, hash: u128) -> PathBuf {
        let name = format!("{hash:032x}");
        self.dir.join(&name[..2]).join(format!("{name}.kv"))
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Deletes least recently used files until `extra` more bytes fit in the budget.
    fn make_room(&self, index: &mut Index, extra: u64) {
        while index.bytes + extra > self.budget {
            let Some((_, &hash)) = index.by_age.iter().next() else {
                break;
            };
            index.remove(hash);
            let _ = fs::remove_file(self.path(hash));
        }
    }
}

enum Job {
    Write(BlockName, Arc<[u8]>),
    /// Blocks just used, the last of a chain first.
    Touch(Vec<u128>),
    /// Answered once every job before it is done.
    Flush(SyncSender<()>),
}

/// Block files in one directory, for one model and cache shape.
pub struct DiskTier {
    shared: Arc<Shared>,
    jobs: Option<SyncSender<Job>>,
    writer: Option<JoinHandle<()>>,
    /// Holds the lock on the directory while open.
    _lock: File,
    buf: Vec<u8>,
    stats: DiskStats,
}

impl DiskTier {
    /// Opens (making it if needed) `dir` for blocks of `shape` under `model_key`, holding at most
    /// `budget_bytes`: temporary files of an interrupted write are removed, the block files are
    /// indexed by name, size and time, and the least recently used go until the budget holds.
    pub fn open(
        dir: &Path,
        budget_bytes: u64,
        model_key: u128,
        shape: KvShape,
    ) -> anyhow::Result<DiskTier> {
        use anyhow::Context;
        let what = || format!("prefix cache directory {}", dir.display());
        fs::create_dir_all(dir.join("tmp")).with_context(what)?;
        let lock = File::create(dir.join("lock")).with_context(what)?;
        if lock.try_lock().is_err() {
            anyhow::bail!("{} is in use by another process", what());
        }
        for entry in fs::read_dir(dir.join("tmp")).with_context(what)?.flatten() {
            let _ = fs::remove_file(entry.path());
        }
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            model_key,
            rows_bytes: BLOCK_TOKENS * shape.bytes_per_position(),
            budget: budget_bytes,
            index: Mutex::new(scan(dir).with_context(what)?),
        });
        {
            let mut index = shared.index();
            shared.make_room(&mut index, 0);
            tracing::info!(
                dir = %dir.display(),
                files = index.files.len(),
                bytes = index.bytes,
                budget_bytes,
                "prefix cache directory"
            );
        }
        let (jobs, rx) = sync_channel(QUEUE);
        let s = shared.clone();
        let writer = std::thread::Builder::new()
            .name("pld-prefix-disk".into())
            .spawn(move || write_loop(&s, rx))
            .context("start the prefix cache's writer thread")?;
        Ok(DiskTier {
            shared,
            jobs: Some(jobs),
            writer: Some(writer),
            _lock: lock,
            buf: Vec::new(),
            stats: DiskStats::default(),
        })
    }

    pub fn model_key(&self) -> u128 {
        self.shared.model_key
    }

    pub fn stats(&self) -> DiskStats {
        self.stats
    }

    /// Bytes of block files in the directory now.
    pub fn bytes(&self) -> u64 {
        self.shared.index().bytes
    }

    /// The rows of block `name` from its file, checked; None when there is none, or when it fails
    /// a check (then it is logged and deleted).
    pub(super) fn read(&mut self, name: &BlockName) -> Option<&[u8]> {
        if !self.shared.index().files.contains_key(&name.hash) {
            return None;
        }
        let path = self.shared.path(name.hash);
        match read_checked(&path, name, &self.shared, &mut self.buf) {
            Ok(true) => {
                self.stats.read_blocks += 1;
                Some(&self.buf[HEADER..])
            }
            // Evicted by the writer since the index was read.
            Ok(false) => None,
            Err(why) => {
                tracing::warn!(file = %path.display(), why, "prefix cache: a block file failed its check; it is deleted and the block recomputed");
                self.stats.rejected_blocks += 1;
                self.shared.index().remove(name.hash);
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Queues block `name`'s rows to be written (dropped when the queue is full).
    pub(super) fn write(&self, name: BlockName, rows: Arc<[u8]>) {
        self.send(Job::Write(name, rows));
    }

    /// Marks blocks as just used, the last of a chain first.
    pub(super) fn touch(&self, hashes: Vec<u128>) {
        if !hashes.is_empty() {
            self.send(Job::Touch(hashes));
        }
    }

    fn send(&self, job: Job) {
        if let Some(jobs) = &self.jobs {
            if let Err(TrySendError::Full(_)) = jobs.try_send(job) {
                tracing::debug!("prefix cache: the writer is behind; a block stays in memory only");
            }
        }
    }

    /// Returns once every write queued before it is on disk.
    pub fn flush(&self) {
        let (tx, rx) = sync_channel(1);
        if let Some(jobs) = &self.jobs {
            if jobs.send(Job::Flush(tx)).is_ok() {
                let _ = rx.recv();
            }
        }
    }
}

impl Drop for DiskTier {
    /// Finishes the queued writes.
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// The block files under `dir`, oldest modification first.
fn scan(dir: &Path) -> io::Result<Index> {
    let mut found = Vec::new();
    for shard in fs::read_dir(dir)?.flatten() {
        let name = shard.file_name();
        let name = name.to_string_lossy();
        if name.len() != 2 || !shard.path().is_dir() {
            continue;
        }
        for file in fs::read_dir(shard.path())?.flatten() {
            let file_name = file.file_name();
            let Some(hex) = file_name
                .to_string_lossy()
                .strip_suffix(".kv")
                .map(str::to_owned)
            else {
                continue;
            };
            let (Ok(hash), Ok(meta)) = (u128::from_str_radix(&hex, 16), file.metadata()) else {
                continue;
            };
            let time = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((time, hash, meta.len()));
        }
    }
    found.sort();
    let mut index = Index::default();
    for (_, hash, bytes) in found {
        index.add(hash, bytes, None);
    }
    Ok(index)
}

fn write_loop(shared: &Shared, jobs: Receiver<Job>) {
    for job in jobs {
        match job {
            Job::Write(name, rows) => {
                if let Err(e) = store(shared, &name, &rows) {
                    tracing::warn!(error = %e, "prefix cache: a block could not be written to disk");
                }
            }
            Job::Touch(hashes) => {
                let now = Instant::now();
                let stale: Vec<u128> = {
                    let mut index = shared.index();
                    hashes
                        .into_iter()
                        .filter(|&h| index.touch(h, now))
                        .collect()
                };
                for h in stale {
                    if let Ok(f) = File::options().write(true).open(shared.path(h)) {
                        let _ = f.set_modified(SystemTime::now());
                    }
                }
            }
            Job::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Writes one block's file (whole under `tmp/`, then renamed into place) unless it is there.
fn store(shared: &Shared, name: &BlockName, rows: &[u8]) -> io::Result<()> {
    let bytes = (HEADER + rows.len()) as u64;
    {
        let mut index = shared.index();
        if index.files.contains_key(&name.hash) || bytes > shared.budget {
            return Ok(());
        }
        shared.make_room(&mut index, bytes);
    }
    let path = shared.path(name.hash);
    let tmp = shared
        .dir
        .join("tmp")
        .join(format!("{:032x}.kv", name.hash));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(&header(shared.model_key, name, rows))?;
        f.write_all(rows)?;
    }
    if let Some(shard) = path.parent() {
        fs::create_dir_all(shard)?;
    }
    fs::rename(&tmp, &path)?;
    shared.index().add(name.hash, bytes, Some(Instant::now()));
    Ok(())
}

fn header(model_key: u128, name: &BlockName, rows: &[u8]) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        h[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(&MAGIC);
    put(&model_key.to_le_bytes());
    put(&name.namespace.to_le_bytes());
    put(&name.parent.to_le_bytes());
    for t in name.tokens {
        put(&t.to_le_bytes());
    }
    put(&(rows.len() as u64).to_le_bytes());
    put(&xxh3_64(rows).to_le_bytes());
    let sum = xxh3_64(&h[..HEADER - 8]);
    h[HEADER - 8..].copy_from_slice(&sum.to_le_bytes());
    h
}

/// Reads the file of `name` into `buf` and checks it: Ok(true) when it holds exactly that block
/// of this model, Ok(false) when the file is gone, Err with what is wrong otherwise.
fn read_checked(
    path: &Path,
    name: &BlockName,
    shared: &Shared,
    buf: &mut Vec<u8>,
) -> Result<bool, String> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e.to_string()),
    };
    let want = HEADER + shared.rows_bytes;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if len != want as u64 {
        return Err(format!("{len} bytes where a block takes {want}"));
    }
    buf.resize(want, 0);
    f.read_exact(buf).map_err(|e| e.to_string())?;
    let (head, rows) = buf.split_at(HEADER);
    if head[..8] != MAGIC {
        return Err("not a pld block file".into());
    }
    if head[HEADER - 8..] != xxh3_64(&head[..HEADER - 8]).to_le_bytes() {
        return Err("its header's checksum does not match".into());
    }
    let expected = header(shared.model_key, name, rows);
    // Magic | model key | namespace, parent, tokens | rows' length | rows' checksum | header's.
    let fields = [
        8,
        24,
        24 + 8 + 16 + 4 * BLOCK_TOKENS,
        HEADER - 16,
        HEADER - 8,
    ];
    let differs = |from: usize, to: usize| head[from..to] != expected[from..to];
    if differs(fields[0], fields[1]) {
        return Err("written for another model file or cache type".into());
    }
    if differs(fields[1], fields[2]) {
        return Err("it holds another block (tenant, parent or tokens)".into());
    }
    if differs(fields[2], fields[4]) {
        return Err("its rows' checksum does not match".into());
    }
    Ok(true)
}
