//! The decoder: one generic transformer for the `llama` and `qwen2` architectures
//! (Config -> Attention -> Mlp -> Layer -> Model), and its forward pass over a ragged batch.
//!
//! A forward pass takes, for each sequence of the batch, some new tokens placed right after what its
//! KV cache already holds, and returns the logits of every new position (or only the last one, for
//! prefill). All rows of all sequences go through the matrix products together; attention runs per
//! row over that row's own cache. Each row's arithmetic is the same whatever else shares the pass,
//! so decoding one token at a time and verifying K drafts at once give bit-identical logits.

use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::kernels::{self, QMatrix};
use crate::kv_cache::KvCache;
use crate::weights;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    Qwen2,
}

/// How rotary embeddings pair the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama GGUFs, whose q/k weights were permuted for it.
    Interleaved,
    /// Halves (i, i + d/2): qwen2 (GPT-NeoX style).
    Halves,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Architecture,
    pub n_layer: usize,
    pub d_model: usize,
    pub d_ff: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub rope_dims: usize,
    pub rope_base: f32,
    pub rope_style: RopeStyle,
    pub rms_eps: f32,
    pub vocab_size: usize,
    pub context_len: usize,
}

impl Config {
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let arch_name = file.get_str("general.architecture")?;
        let (arch, rope_style) = match arch_name {
            "llama" => (Architecture::Llama, RopeStyle::Interleaved),
            "qwen2" => (Architecture::Qwen2, RopeStyle::Halves),
            other => return Err(EngineError::UnsupportedArchitecture(other.to_string())),
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let n_layer = file.get_u64(&key("block_count"))? as usize;
        let d_model = file.get_u64(&key("embedding_length"))? as usize;
        let d_ff = file.get_u64(&key("feed_forward_length"))? as usize;
        let n_head = file.get_u64(&key("attention.head_count"))? as usize;
        let n_kv_head = file
            .get_u64_opt(&key("attention.head_count_kv"))
            .unwrap_or(n_head as u64) as usize;
        if n_head == 0
            || n_kv_head == 0
            || !d_model.is_multiple_of(n_head)
            || !n_head.is_multiple_of(n_kv_head)
        {
            return Err(EngineError::BadMetadata(format!(
                "inconsistent attention shape: {n_head} heads, {n_kv_head} kv heads, width {d_model}"
            )));
        }
        let head_dim = file
            .get_u64_opt(&key("attention.key_length"))
            .unwrap_or((d_model / n_head) as u64) as usize;
        let rope_dims = file
            .get_u64_opt(&key("rope.dimension_count"))
            .unwrap_or(head_dim as u64) as usize;
        if rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
            return Err(EngineError::BadMetadata(format!(
                "rope dimension count {rope_dims} does not fit head size {head_dim}"
            )));
        }
        let rope_base = file.get_f32_opt(&key("rope.freq_base")).unwrap_or(10000.0);
        let rms_eps = file
            .get_f32_opt(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-5);
        let context_len = file.get_u64_opt(&key("context_length")).unwrap_or(2048) as usize;
        let embd = weights::matrix(file, "token_embd.weight")?;
        if embd.cols != d_model {
            return Err(EngineError::BadMetadata(format!(
                "token_embd width {} differs from embedding_length {d_model}",
                embd.cols
            )));
        }
        Ok(Config {
            arch,
            n_layer,
            d_model,
            d_ff,
            n_head,
            n_kv_head,
            head_dim,
            rope_dims,
            rope_base,
            rope_style,
            rms_eps,
            vocab_size: embd.rows,
            context_len,
        })
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}

struct Attention {
    norm: Vec<f32>,
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    wo: QMatrix,
}

struct Mlp {
    norm: Vec<f32>,
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
}

struct Layer {
    attn: Attention,
    mlp: Mlp,
}

pub struct Model {
    pub config: Config,
    token_embd: QMatrix,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    output: QMatrix,
}

impl Model {
    pub fn load(file: &GgufFile) -> Result<Self> {
        let c = Config::from_gguf(file)?;
        let isa = kernels::isa();
        let matrix = |name: &str, rows: usize, cols: usize| {
            weights::packed_matrix(file, name, rows, cols, isa)
        };
        let bias = |name: &str, len: usize| weights::optional_vector(file, name, len);
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let p = |s: &str| format!("blk.{i}.{s}");
            layers.push(Layer {
                attn: Attention {
                    norm: weights::vector(file, &p("attn_norm.weight"), c.d_model)?,
                    wq: matrix(&p("attn_q.weight"), c.q_dim(), c.d_model)?,
                    wk: matrix(&p("attn_k.weight"), c.kv_dim(), c.d_model)?,
                    wv: matrix(&p("attn_v.weight"), c.kv_dim(), c.d_model)?,
                    bq: bias(&p("attn_q.bias"), c.q_dim())?,
                    bk: bias(&p("attn_k.bias"), c.kv_dim())?,
                    bv: bias(&p("attn_v.bias"), c.kv_dim())?,
                    wo: matrix(&p("attn_output.weight"), c.d_model, c.q_dim())?,
                },
                mlp: Mlp {
                    norm: weights::vector(file, &p("ffn_norm.weight"), c.d_model)?,
                    gate: matrix(&p("ffn_gate.weight"), c.d_ff, c.d_model)?,
                    up: matrix(&p("ffn_up.weight"), c.d_ff, c.d_model)?,
                    down: matrix(&p("ffn_down.weight"), c.d_model, c.d_ff)?,
                },
            });
        }
        let token_embd = weights::matrix(file, "token_embd.weight")?;
        // Tied embeddings: without an output matrix the embedding table doubles as the head.
        let output = if file.has_tensor("output.weight") {
            matrix("output.weight", c.vocab_size, c.d_model)?
        } else {
            token_embd.clone().packed_for(isa)
        };
        Ok(Model {
            output_norm: weights::vector(file, "output_norm.weight", c.d_model)?,
            config: c,
            token_embd,
            layers,
            output,
        })
    }

    /// Bytes of weights one decode step reads: every layer matrix and the output head (the
    /// embedding table contributes one row). Divided into the memory bandwidth, the fastest a
    /// bandwidth-bound decode can go.
    pub fn weight_bytes_per_token(&self) -> usize {
        let size = |m: &QMatrix| m.bytes.as_slice().len();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let (a, f) = (&l.attn, &l.mlp);
                size(&a.wq)
                    + size(&a.wk)
                    + size(&a.wv)
                    + size(&a.wo)
                    + size(&f.gate)
                    + size(&f.up)
                    + size(&f.down)
            })
            .sum();
        layers + size(&self.output) + size(&self.token_embd) / self.token_embd.rows.max(1)
    }

    /// A KV cache for one sequence of up to `capacity` positions (clamped to the model's context).
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let c = &self.config;
        KvCache::new(
            c.n_layer,
            c.kv_dim(),
            c.head_dim,
            capacity.min(c.context_len),
        )
    }

    /// Runs the new tokens of every item through the model, appends their keys and values to each
    /// item's cache, and returns the logits: for each item in order, one row per new token when
    /// `all_logits` is set, else the last row only. Rows are `vocab_size` long.
    pub fn forward(&self, batch: &mut [BatchItem<'_>]) -> Result<Vec<f32>> {
        let c = &self.config;
        let (d, qd, kvd, hd) = (c.d_model, c.q_dim(), c.kv_dim(), c.head_dim);
        // Lay out the rows: which item, which cache slot, which position. A chain's row i goes
        // to slot start + i at position start + i; a tree's node also takes slot start + i but is
        // rotated at start + its depth, and sees only the committed cache and its ancestors.
        let mut row_item = Vec::new();
        let mut row_slot = Vec::new();
        let mut row_pos = Vec::new();
        let mut row_mask = Vec::new();
        let mut item_start = Vec::with_capacity(batch.len());
        for (bi, item) in batch.iter().enumerate() {
            let start = item.cache.len();
            item_start.push(start);
            if !item.parents.is_empty() {
                check_tree(item.parents, item.tokens.len())?;
            }
            let needed = start + item.tokens.len();
            if needed > item.cache.capacity() {
                return Err(EngineError::ContextFull {
                    needed,
                    capacity: item.cache.capacity(),
                });
            }
            for (i, &t) in item.tokens.iter().enumerate() {
                if t as usize >= c.vocab_size {
                    return Err(EngineError::InvalidConfig(format!(
                        "token id {t} is outside the vocabulary of {}",
                        c.vocab_size
                    )));
                }
                row_item.push(bi);
                row_slot.push(start + i);
                let first = row_pos.len() - i; // the item's first row
                let (pos, mask) = match item.parents.get(i) {
                    None => (start + i, 0),
                    Some(&TREE_ROOT) => (start, 1u64),
                    Some(&p) => {
                        let p = first + p as usize;
                        (row_pos[p] + 1, row_mask[p] | 1u64 << i)
                    }
                };
                row_pos.push(pos);
                row_mask.push(mask);
            }
        }
        let n = row_item.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut x = vec![0f32; n * d];
        let tokens = batch.iter().flat_map(|b| b.tokens.iter().copied());
        weights::embed(&self.token_embd, tokens, &mut x);
        let rope = RopeTable::new(c, &row_pos);
        let mut h = vec![0f32; n * d];
        let mut q = vec![0f32; n * qd];
        let mut k = vec![0f32; n * kvd];
        let mut v = vec![0f32; n * kvd];
        let mut att = vec![0f32; n * qd];
        let mut proj = vec![0f32; n * d];
        let mut gate = vec![0f32; n * c.d_ff];
        let mut up = vec![0f32; n * c.d_ff];
        let scale = 1.0 / (hd as f32).sqrt();
        let group = c.n_head / c.n_kv_head;

        // Attention jobs, the same in every layer: one per (sequence, kv head, run of its rows),
        // so that the rows of a run read each key and value once for all their query heads. Runs
        // are split only as far as the threads need work. Job j writes its rows' outputs to
        // `job_out[bounds[j]..bounds[j + 1]]`.
        let threads = kernels::pool::global().threads();
        let isa = kernels::isa();
        let mut jobs = Vec::new();
        let mut bounds = vec![0];
        let mut first = 0;
        for (bi, item) in batch.iter().enumerate() {
            let rows = item.tokens.len();
            let runs = (2 * threads)
                .div_ceil(c.n_kv_head * batch.len())
                .clamp(1, rows.max(1));
            for kvh in 0..c.n_kv_head {
                for run in 0..runs {
                    let (r0, r1) = (first + rows * run / runs, first + rows * (run + 1) / runs);
                    if r1 > r0 {
                        jobs.push((bi, kvh, r0, r1));
                        bounds.push(bounds.last().unwrap() + (r1 - r0) * group * hd);
                    }
                }
            }
            first += rows;
        }
        let mut job_out = vec![0f32; n * qd];

        for (li, layer) in self.layers.iter().enumerate() {
            // Attention block.
            let a = &layer.attn;
            norm_rows(&x, &a.norm, c.rms_eps, &mut h, d);
            kernels::matmul_many(
                &h,
                n,
                &mut [(&a.wq, &mut q), (&a.wk, &mut k), (&a.wv, &mut v)],
            );
            add_bias(&mut q, a.bq.as_deref());
            add_bias(&mut k, a.bk.as_deref());
            add_bias(&mut v, a.bv.as_deref());
            rope.apply(&mut q, c.n_head, hd);
            rope.apply(&mut k, c.n_kv_head, hd);
            for r in 0..n {
                batch[row_item[r]].cache.write(
                    li,
                    row_slot[r],
                    &k[r * kvd..(r + 1) * kvd],
                    &v[r * kvd..(r + 1) * kvd],
                );
            }
            let caches: Vec<&KvCache> = batch.iter().map(|b| &*b.cache).collect();
            let attend = |scores: &mut Vec<f32>, j: usize, out: &mut [f32]| {
                let (bi, kvh, r0, r1) = jobs[j];
                let kv = caches[bi].head(li, kvh, row_slot[r1 - 1] + 1);
                let q0 = r0 * qd + kvh * group * hd;
                let tree = (!batch[bi].parents.is_empty()).then(|| kernels::TreeMask {
                    start: item_start[bi],
                    rows: &row_mask[r0..r1],
                });
                kernels::attend_rows(isa, &q[q0..], qd, r1 - r0, kv, scale, tree, scores, out);
            };
            // Threads pay off once there are enough (row, head, position) triples.
            let work: usize = row_slot.iter().map(|p| p + 1).sum::<usize>() * c.n_head * hd;
            if work < 1 << 16 {
                let mut scores = Vec::new();
                for (j, w) in bounds.windows(2).enumerate() {
                    attend(&mut scores, j, &mut job_out[w[0]..w[1]]);
                }
            } else {
                thread_local! {
                    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
                }
                kernels::par_split_mut(&mut job_out, &bounds, &|j, out| {
                    SCORES.with(|s| attend(&mut s.borrow_mut(), j, out));
                });
            }
            for (&(_, kvh, r0, r1), w) in jobs.iter().zip(bounds.windows(2)) {
                let part = &job_out[w[0]..w[1]];
                for (r, o) in (r0..r1).zip(part.chunks(group * hd)) {
                    att[r * qd + kvh * group * hd..][..group * hd].copy_from_slice(o);
                }
            }
            kernels::matmul(&att, n, &a.wo, &mut proj);
            add_rows(&mut x, &proj);

            // Feed-forward block.
            let m = &layer.mlp;
            norm_rows(&x, &m.norm, c.rms_eps, &mut h, d);
            kernels::matmul_many(&h, n, &mut [(&m.gate, &mut gate), (&m.up, &mut up)]);
            if n >= 4 {
                kernels::par_chunks_mut(&mut gate, c.d_ff, &|r, g| {
                    kernels::swiglu(g, &up[r * c.d_ff..(r + 1) * c.d_ff])
                });
            } else {
                kernels::swiglu(&mut gate, &up);
            }
            kernels::matmul(&gate, n, &m.down, &mut proj);
            add_rows(&mut x, &proj);
        }
        for item in batch.iter_mut() {
            let len = item.cache.len() + item.tokens.len();
            item.cache.set_len(len);
        }

        // Output head, on the rows whose logits are wanted.
        let mut wanted = Vec::new();
        let mut row = 0;
        for item in batch.iter() {
            let count = item.tokens.len();
            if item.all_logits {
                wanted.extend(row..row + count);
            } else if count > 0 {
                wanted.push(row + count - 1);
            }
            row += count;
        }
        let mut hn = vec![0f32; wanted.len() * d];
        for (o, &r) in hn.chunks_mut(d).zip(&wanted) {
            kernels::rms_norm(&x[r * d..(r + 1) * d], &self.output_norm, c.rms_eps, o);
        }
        let mut logits = vec![0f32; wanted.len() * c.vocab_size];
        kernels::matmul(&hn, wanted.len(), &self.output, &mut logits);
        Ok(logits)
    }
}

/// One sequence's part of a forward pass.
pub struct BatchItem<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
    pub all_logits: bool,
    /// Empty for a chain (each token follows the one before). For a draft tree, the parent of
    /// each row as an earlier row index, [`TREE_ROOT`] for the first row (the last committed
    /// token): every row takes the next cache slot but sees only the committed cache and its own
    /// ancestors, at position committed length + depth. After verification the accepted path is
    /// made consecutive with [`KvCache::keep_rows`].
    pub parents: &'a [u32],
}

/// The parent of a tree's first row.
pub const TREE_ROOT: u32 = u32::MAX;

/// The most rows a tree may have (a row's ancestors are one 64-bit mask).
pub const MAX_TREE_ROWS: usize = 64;

fn check_tree(parents: &[u32], rows: usize) -> Result<()> {
    let bad = |why: String| Err(EngineError::InvalidConfig(format!("draft tree: {why}")));
    if parents.len() != rows {
        return bad(format!("{} parents for {rows} rows", parents.len()));
    }
    if rows > MAX_TREE_ROWS {
        return bad(format!("{rows} rows, at most {MAX_TREE_ROWS}"));
    }
    if parents[0] != TREE_ROOT {
        return bad("the first row must be the root".into());
    }
    match parents[1..]
        .iter()
        .enumerate()
        .find(|&(i, &p)| p as usize > i)
    {
        Some((i, p)) => bad(format!("row {} has parent {p}, not an earlier row", i + 1)),
        None => Ok(()),
    }
}

fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], d: usize) {
    for (o, xr) in out.chunks_mut(d).zip(x.chunks(d)) {
        kernels::rms_norm(xr, w, eps, o);
    }
}

fn add_bias(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in x.chunks_mut(b.len()) {
            for (v, bi) in row.iter_mut().zip(b) {
                *v += bi;
            }
        }
    }
}

fn add_rows(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// cos/sin of every rotated pair for the positions of one pass.
struct RopeTable {
    style: RopeStyle,
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    fn new(c: &Config, positions: &[usize]) -> Self {
        let half = c.rope_dims / 2;
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        let base = c.rope_base as f64;
        for &p in positions {
            for i in 0..half {
                let inv_freq = base.powf(-2.0 * i as f64 / c.rope_dims as f64);
                let angle = p as f64 * inv_freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        RopeTable {
            style: c.rope_style,
            half,
            cos,
            sin,
        }
    }

    /// Rotates every head of every row of `x` (`rows x heads*hd`).
    fn apply(&self, x: &mut [f32], heads: usize, hd: usize) {
        let half = self.half;
        for (r, row) in x.chunks_mut(heads * hd).enumerate() {
            let cos = &self.cos[r * half..(r + 1) * half];
            let sin = &self.sin[r * half..(r + 1) * half];
            for head in row.chunks_mut(hd) {
                for i in 0..half {
                    let (a, b) = match self.style {
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                        RopeStyle::Halves => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * cos[i] - x1 * sin[i];
                    head[b] = x0 * sin[i] + x1 * cos[i];
                }
            }
        }
    }
}
