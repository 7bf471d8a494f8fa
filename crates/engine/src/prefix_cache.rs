//! The prefix cache: keys and values of earlier sequences kept across requests, so that a prompt
//! which starts as an earlier one did (a conversation's history re-sent with every turn, a shared
//! system prompt, a document asked about again) prefills only the rest.
//!
//! Positions are kept in full blocks of `BLOCK_TOKENS`, each block chained to the one before it
//! (as vLLM's automatic prefix caching hashes full blocks with their parent): a block is found by
//! (namespace, parent block, its tokens), and the tokens are compared, not only hashed, so a
//! collision can never hand out another prefix's rows. A prompt's cached prefix is the longest
//! chain of its blocks, found one hash lookup per block. We chose blocks over a radix tree
//! (SGLang's RadixAttention) because each sequence's KV cache is one contiguous buffer: cached rows
//! are copied into it, and fixed-size blocks make that copy, the memory accounting and eviction
//! plain, at the cost of recomputing under one block of a prefix that ends mid-block.
//!
//! Memory is bounded by a byte budget. The least recently used block goes first, and it is always
//! a leaf: a lookup or insert touches its chain from the last block back to the first, so a block
//! is always more recent than its descendants, and a chain is never cut in the middle. Cached rows
//! are copies, so a running sequence never depends on a block that might be evicted.
//!
//! Namespaces keep tenants apart: a lookup sees only blocks inserted under its own namespace (a
//! shared cache would tell one API key, through timing, what another sent).
//!
//! With a directory (`with_disk`, `--prefix-cache-dir`) every block is also written to a file
//! there (`disk`), named by a hash of the same chain, so a lookup continues from disk where memory
//! ends, and a restarted process starts from the prefixes of the one before.
//!
//! Rows do not depend on the pass that computed them (the kernels give a row the same bits alone
//! or in a batch, prefill or decode), so a warm start gives exactly the tokens and logits of a
//! cold one.

mod disk;

use crate::kv_cache::{KvCache, KvShape};
use disk::BlockName;
pub use disk::{model_key, DiskStats, DiskTier};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Positions per cached block.
pub const BLOCK_TOKENS: usize = 16;

/// What the cache has done since it was made (counters only grow).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Lookups that found at least one block.
    pub hits: u64,
    /// Lookups in all.
    pub lookups: u64,
    /// Prompt tokens whose rows came from the cache.
    pub cached_tokens: u64,
    /// Blocks stored.
    pub inserted_blocks: u64,
    /// Blocks dropped to stay within the budget.
    pub evicted_blocks: u64,
    /// Of the cached tokens, those read from the directory (`with_disk`).
    pub disk_tokens: u64,
    /// Block files that failed their check on read (deleted, their blocks recomputed).
    pub disk_rejected_blocks: u64,
}

/// What finds a block: its namespace, the block before it and its tokens.
#[derive(Clone, PartialEq, Eq, Hash)]
struct BlockKey {
    namespace: u64,
    parent: Option<usize>,
    tokens: [u32; BLOCK_TOKENS],
}

struct Block {
    key: BlockKey,
    /// Its chain hash, the name of its file on disk.
    hash: u128,
    /// The rows of its positions, as `KvCache::take_rows` lays them out.
    rows: Arc<[u8]>,
    /// Blocks chained to this one.
    children: usize,
    /// When it was last used (larger is more recent); its key in `by_age`.
    stamp: u64,
}

/// Cached blocks of one model's keys and values, within a byte budget.
pub struct PrefixCache {
    shape: KvShape,
    budget: usize,
    /// Slots; a `None` is free for the next block.
    blocks: Vec<Option<Block>>,
    free: Vec<usize>,
    by_key: HashMap<BlockKey, usize>,
    /// Every block by its stamp, least recently used first.
    by_age: BTreeMap<u64, usize>,
    clock: u64,
    stats: PrefixCacheStats,
    /// The blocks' files, if kept on disk too.
    disk: Option<DiskTier>,
}

impl PrefixCache {
    /// A cache for keys and values of `shape` holding at most `budget_bytes` of rows (0 keeps
    /// nothing).
    pub fn new(shape: KvShape, budget_bytes: usize) -> Self {
        PrefixCache {
            shape,
            budget: budget_bytes,
            blocks: Vec::new(),
            free: Vec::new(),
            by_key: HashMap::new(),
            by_age: BTreeMap::new(),
            clock: 0,
            stats: PrefixCacheStats::default(),
            disk: None,
        }
    }

    /// This cache with its blocks also kept in `disk`'s directory, and looked up there where
    /// memory has none.
    pub fn with_disk(mut self, disk: DiskTier) -> Self {
        self.disk = Some(disk);
        self
    }

    pub fn disk(&self) -> Option<&DiskTier> {
        self.disk.as_ref()
    }

    /// The model key that starts every chain hash: the disk tier's, 0 in memory alone.
    fn model_key(&self) -> u128 {
        self.disk.as_ref().map_or(0, DiskTier::model_key)
    }

    /// A cache of `budget_bytes` for the keys and values (of `shape`) of the model in
    /// `model_path`, its blocks kept in `dir` too when one is given (at most `dir_bytes` there):
    /// an error names what failed when the directory cannot be opened or is in use, or when the
    /// memory budget is 0 (the directory is reached through memory).
    pub fn open(
        model_path: &std::path::Path,
        shape: KvShape,
        budget_bytes: usize,
        dir: Option<&std::path::Path>,
        dir_bytes: u64,
    ) -> anyhow::Result<PrefixCache> {
        let cache = PrefixCache::new(shape, budget_bytes);
        let Some(dir) = dir else {
            return Ok(cache);
        };
        if budget_bytes == 0 {
            anyhow::bail!("a prefix cache directory needs the prefix cache on (its budget is 0)");
        }
        let bf16 = shape.dtype == crate::kv_cache::KvDtype::Bf16;
        let attention = crate::kernels::attention_arithmetic(crate::kernels::isa(), shape.hd, bf16);
        // Every block is a prompt's (`Sequence::keep_prefix`): its products' arithmetic too, where
        // it is not the generated rows' (whose name alone keys the other classes' directories).
        let arithmetic = match crate::kernels::prompt_arithmetic_differs() {
            true => format!(
                "{attention}; prompt products {}",
                crate::kernels::prompt_arithmetic()
            ),
            false => attention.to_string(),
        };
        let key = model_key(model_path, shape, &arithmetic).map_err(|e| {
            anyhow::anyhow!(
                "cannot read {} to key its cached blocks: {e}",
                model_path.display()
            )
        })?;
        Ok(cache.with_disk(DiskTier::open(dir, dir_bytes, key, shape)?))
    }

    /// Bytes one block's rows take.
    pub fn block_bytes(&self) -> usize {
        BLOCK_TOKENS * self.shape.bytes_per_position()
    }

    /// Bytes of rows held now (at most the budget).
    pub fn bytes(&self) -> usize {
        self.by_key.len() * self.block_bytes()
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            disk_rejected_blocks: self.disk.as_ref().map_or(0, |d| d.stats().rejected_blocks),
            ..self.stats
        }
    }

    /// Copies into `cache` (empty, of this cache's shape) the rows of the longest cached prefix
    /// of `tokens` under `namespace`, at most `limit` tokens, and returns its length (a multiple
    /// of `BLOCK_TOKENS`). Callers leave at least the prompt's last token out of `limit`: its
    /// logits give the first token.
    pub fn lookup_into(
        &mut self,
        namespace: u64,
        tokens: &[u32],
        limit: usize,
        cache: &mut KvCache,
    ) -> usize {
        assert!(cache.is_empty(), "a prefix goes into an empty cache");
        assert_eq!(cache.shape(), self.shape, "a cache of another model");
        if self.budget == 0 {
            return 0;
        }
        self.stats.lookups += 1;
        let limit = limit.min(tokens.len()).min(cache.capacity());
        let mut chain = self.find_chain(namespace, &tokens[..limit]);
        for (b, &id) in chain.iter().enumerate() {
            let rows = &self.block(id).rows;
            cache.put_rows(b * BLOCK_TOKENS, BLOCK_TOKENS, rows);
        }
        let in_memory = chain.len();
        let from_disk = self.lookup_disk(namespace, &tokens[..limit], &mut chain, cache);
        self.touch(&chain);
        let found = (in_memory + from_disk) * BLOCK_TOKENS;
        self.stats.disk_tokens += (from_disk * BLOCK_TOKENS) as u64;
        if found > 0 {
            self.stats.hits += 1;
            self.stats.cached_tokens += found as u64;
        }
        found
    }

    /// Keeps the full blocks of the positions `cache` holds for `tokens` (the first
    /// `min(cache.len(), tokens.len())`) that are not kept yet, under `namespace`, evicting the
    /// least recently used blocks to stay within the budget. Stops early when the budget cannot
    /// hold more without evicting this very chain.
    pub fn insert(&mut self, namespace: u64, tokens: &[u32], cache: &KvCache) {
        assert_eq!(cache.shape(), self.shape, "a cache of another model");
        if self.budget < self.block_bytes() {
            return;
        }
        let n = cache.len().min(tokens.len()) / BLOCK_TOKENS;
        let mut chain = self.find_chain(namespace, &tokens[..n * BLOCK_TOKENS]);
        // What is already there becomes the most recent, so eviction takes other blocks first.
        self.touch(&chain);
        while chain.len() < n {
            if !self.make_room(&chain) {
                break;
            }
            let b = chain.len();
            let key = BlockKey {
                namespace,
                parent: chain.last().copied(),
                tokens: block_tokens(&tokens[b * BLOCK_TOKENS..]),
            };
            let parent = chain.last().map_or(0, |&id| self.block(id).hash);
            let name = BlockName::new(self.model_key(), namespace, parent, key.tokens);
            let mut rows = vec![0u8; BLOCK_TOKENS * self.shape.bytes_per_position()];
            cache.take_rows(b * BLOCK_TOKENS, BLOCK_TOKENS, &mut rows);
            let rows: Arc<[u8]> = rows.into();
            if let Some(disk) = &self.disk {
                disk.write(name, rows.clone());
            }
            let id = self.add(key, name.hash, rows);
            chain.push(id);
        }
        self.touch(&chain);
        if let Some(disk) = &self.disk {
            // After the writes: the files' last use, the chain's end first, as in memory.
            disk.touch(chain.iter().rev().map(|&id| self.block(id).hash).collect());
        }
    }

    /// Continues `chain` (in `cache` already) with the blocks of `tokens` found on disk, each put
    /// into `cache` and kept in memory too while the budget allows; returns how many.
    fn lookup_disk(
        &mut self,
        namespace: u64,
        tokens: &[u32],
        chain: &mut Vec<usize>,
        cache: &mut KvCache,
    ) -> usize {
        if self.disk.is_none() {
            return 0;
        }
        let model_key = self.model_key();
        let mut hashes: Vec<u128> = chain.iter().map(|&id| self.block(id).hash).collect();
        let Some(disk) = self.disk.as_mut() else {
            return 0;
        };
        let mut read = Vec::new();
        for block in tokens.chunks_exact(BLOCK_TOKENS).skip(chain.len()) {
            let parent = hashes.last().copied().unwrap_or(0);
            let name = BlockName::new(model_key, namespace, parent, block_tokens(block));
            let Some(rows) = disk.read(&name) else {
                break;
            };
            cache.put_rows(hashes.len() * BLOCK_TOKENS, BLOCK_TOKENS, rows);
            read.push((name, Arc::<[u8]>::from(rows)));
            hashes.push(name.hash);
        }
        // The files' last use, the chain's end first, as in memory.
        hashes.reverse();
        disk.touch(hashes);
        let n = read.len();
        // Into memory as well, chained after what memory had, while the budget allows.
        for (name, rows) in read {
            if !self.make_room(chain) {
                break;
            }
            let key = BlockKey {
                namespace,
                parent: chain.last().copied(),
                tokens: name.tokens,
            };
            chain.push(self.add(key, name.hash, rows));
        }
        n
    }

    /// The blocks that make up the longest cached prefix of `tokens` (full blocks only).
    fn find_chain(&self, namespace: u64, tokens: &[u32]) -> Vec<usize> {
        let mut chain = Vec::new();
        for block in tokens.chunks_exact(BLOCK_TOKENS) {
            let key = BlockKey {
                namespace,
                parent: chain.last().copied(),
                tokens: block_tokens(block),
            };
            match self.by_key.get(&key) {
                Some(&id) => chain.push(id),
                None => break,
            }
        }
        chain
    }

    /// Marks `chain` as just used, its last block first: every block ends more recent than the
    /// blocks chained after it, so the least recent block is always a leaf.
    fn touch(&mut self, chain: &[usize]) {
        for &id in chain.iter().rev() {
            self.clock += 1;
            let stamp = self.clock;
            let block = self.blocks[id]
                .as_mut()
                .expect("a chained block is present");
            self.by_age.remove(&block.stamp);
            block.stamp = stamp;
            self.by_age.insert(stamp, id);
        }
    }

    fn add(&mut self, key: BlockKey, hash: u128, rows: Arc<[u8]>) -> usize {
        if let Some(parent) = key.parent {
            self.blocks[parent]
                .as_mut()
                .expect("parent present")
                .children += 1;
        }
        self.clock += 1;
        let block = Block {
            key: key.clone(),
            hash,
            rows,
            children: 0,
            stamp: self.clock,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.blocks[id] = Some(block);
                id
            }
            None => {
                self.blocks.push(Some(block));
                self.blocks.len() - 1
            }
        };
        self.by_key.insert(key, id);
        self.by_age.insert(self.clock, id);
        self.stats.inserted_blocks += 1;
        id
    }

    /// Room for one more block within the budget, evicting a leaf not in `keep` if needed; false
    /// when there is none to evict.
    fn make_room(&mut self, keep: &[usize]) -> bool {
        self.bytes() + self.block_bytes() <= self.budget || self.evict_one(keep)
    }

    /// Drops the least recently used leaf that is not in `keep`; false when there is none.
    fn evict_one(&mut self, keep: &[usize]) -> bool {
        let victim = self
            .by_age
            .values()
            .copied()
            .find(|&id| self.block(id).children == 0 && !keep.contains(&id));
        let Some(id) = victim else {
            return false;
        };
        let block = self.blocks[id].take().expect("present");
        self.by_age.remove(&block.stamp);
        self.by_key.remove(&block.key);
        if let Some(parent) = block.key.parent {
            self.blocks[parent]
                .as_mut()
                .expect("parent present")
                .children -= 1;
        }
        self.free.push(id);
        self.stats.evicted_blocks += 1;
        true
    }

    fn block(&self, id: usize) -> &Block {
        self.blocks[id].as_ref().expect("a listed block is present")
    }
}

fn block_tokens(tokens: &[u32]) -> [u32; BLOCK_TOKENS] {
    tokens[..BLOCK_TOKENS].try_into().expect("a full block")
}

/// A budget for the prefix cache from this machine's memory: an eighth of it (3 GiB of 24), or
/// 1 GiB where the total cannot be read.
pub fn default_budget_bytes() -> usize {
    let total_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
    });
    match total_kib {
        Some(kib) => kib * 1024 / 8,
        None => 1 << 30,
    }
}

#[cfg(test)]
mod tests;
