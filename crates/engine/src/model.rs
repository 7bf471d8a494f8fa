//! The decoder: one generic transformer for every supported architecture (the differences are
//! fields of `config::Config`: Attention -> Mlp -> Layer -> Model), and its forward pass over a
//! ragged batch.
//!
//! A forward pass takes, for each sequence of the batch, some new tokens placed right after what its
//! KV cache already holds, and returns the logits of every new position (or only the last one, for
//! prefill). All rows of all sequences go through the matrix products together; attention runs per
//! row over that row's own cache. Each row's arithmetic is the same whatever else shares the pass,
//! so decoding one token at a time and verifying K drafts at once give bit-identical logits.

pub use crate::config::{Activation, Architecture, Config, Rope, RopeStyle};
use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::kernels::{self, QMatrix};
use crate::kv_cache::KvCache;
use crate::weights::{self, Precision};

struct Attention {
    norm: Vec<f32>,
    wq: QMatrix,
    wk: QMatrix,
    wv: QMatrix,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    /// Per-head RMSNorm weights of queries and keys (`head_dim` long).
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    wo: QMatrix,
    /// Normalizes the block's output before the residual add.
    post_norm: Option<Vec<f32>>,
    /// Sees only the last `sliding_window` positions.
    windowed: bool,
}

struct Mlp {
    norm: Vec<f32>,
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
    post_norm: Option<Vec<f32>>,
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
        Self::load_with(file, Precision::Stored)
    }

    /// `load`, with the weight matrices held at `precision`.
    pub fn load_with(file: &GgufFile, precision: Precision) -> Result<Self> {
        let c = Config::from_gguf(file)?;
        let f = c.family();
        let isa = kernels::isa();
        let matrix = |name: &str, rows: usize, cols: usize| {
            weights::product_matrix(file, name, rows, cols, precision, isa)
        };
        // A fused tensor's rows, split into its parts: phi3's `attn_qkv` (q, k, v) and `ffn_up`
        // (gate, up).
        let split = |name: &str, parts: &[usize], cols: usize| -> Result<Vec<QMatrix>> {
            let whole = weights::matrix(file, name)?;
            let rows: usize = parts.iter().sum();
            if whole.rows != rows || whole.cols != cols {
                return Err(EngineError::BadMetadata(format!(
                    "tensor '{name}' is {}x{}, expected {rows}x{cols}",
                    whole.rows, whole.cols
                )));
            }
            let mut first = 0;
            parts
                .iter()
                .map(|&n| {
                    let part =
                        whole
                            .row_range(first, n)
                            .map_err(|reason| EngineError::BadModelFile {
                                path: file.path.clone(),
                                reason: format!("tensor '{name}': {reason}"),
                            })?;
                    first += n;
                    Ok(weights::for_products(part, precision, isa))
                })
                .collect()
        };
        let vector = |name: &str, len: usize| weights::vector(file, name, len);
        let bias = |name: &str, len: usize| weights::optional_vector(file, name, len);
        let when = |cond: bool, name: &str, len: usize| -> Result<Option<Vec<f32>>> {
            cond.then(|| vector(name, len)).transpose()
        };
        let (d, qd, kvd, hd, ff) = (c.d_model, c.q_dim(), c.kv_dim(), c.head_dim, c.d_ff);
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let p = |s: &str| format!("blk.{i}.{s}");
            let (wq, wk, wv) = if f.fused {
                let mut qkv = split(&p("attn_qkv.weight"), &[qd, kvd, kvd], d)?.into_iter();
                let mut next = || qkv.next().expect("three parts");
                (next(), next(), next())
            } else {
                (
                    matrix(&p("attn_q.weight"), qd, d)?,
                    matrix(&p("attn_k.weight"), kvd, d)?,
                    matrix(&p("attn_v.weight"), kvd, d)?,
                )
            };
            let (gate, up) = if f.fused {
                let mut gu = split(&p("ffn_up.weight"), &[ff, ff], d)?.into_iter();
                let gate = gu.next().expect("two parts");
                (gate, gu.next().expect("two parts"))
            } else {
                (
                    matrix(&p("ffn_gate.weight"), ff, d)?,
                    matrix(&p("ffn_up.weight"), ff, d)?,
                )
            };
            layers.push(Layer {
                attn: Attention {
                    norm: vector(&p("attn_norm.weight"), d)?,
                    wq,
                    wk,
                    wv,
                    bq: bias(&p("attn_q.bias"), qd)?,
                    bk: bias(&p("attn_k.bias"), kvd)?,
                    bv: bias(&p("attn_v.bias"), kvd)?,
                    q_norm: when(f.qk_norm, &p("attn_q_norm.weight"), hd)?,
                    k_norm: when(f.qk_norm, &p("attn_k_norm.weight"), hd)?,
                    wo: matrix(&p("attn_output.weight"), d, qd)?,
                    post_norm: when(f.post_norms, &p("post_attention_norm.weight"), d)?,
                    windowed: c.is_windowed(i),
                },
                mlp: Mlp {
                    norm: vector(&p("ffn_norm.weight"), d)?,
                    gate,
                    up,
                    down: matrix(&p("ffn_down.weight"), d, ff)?,
                    post_norm: when(f.post_norms, &p("post_ffw_norm.weight"), d)?,
                },
            });
        }
        let token_embd = weights::matrix(file, "token_embd.weight")?;
        // Tied embeddings: without an output matrix the embedding table doubles as the head.
        let output = if file.has_tensor("output.weight") {
            matrix("output.weight", c.vocab_size, d)?
        } else {
            weights::for_products(token_embd.clone(), precision, isa)
        };
        Ok(Model {
            output_norm: vector("output_norm.weight", d)?,
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
        let matrices: usize = self
            .token_matrices()
            .map(|m| m.bytes.as_slice().len())
            .sum();
        matrices + self.token_embd.bytes.as_slice().len() / self.token_embd.rows.max(1)
    }

    /// Multiply-adds of the matrix products per token: one per weight of every matrix it passes
    /// through (its embedding is a lookup).
    pub fn macs_per_token(&self) -> usize {
        self.token_matrices().map(|m| m.rows * m.cols).sum()
    }

    /// Every matrix a token's pass multiplies by: each layer's projections and the output head.
    fn token_matrices(&self) -> impl Iterator<Item = &QMatrix> {
        self.layers
            .iter()
            .flat_map(|l| {
                let (a, f) = (&l.attn, &l.mlp);
                [&a.wq, &a.wk, &a.wv, &a.wo, &f.gate, &f.up, &f.down]
            })
            .chain(std::iter::once(&self.output))
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
        if c.family().scale_embeddings {
            let s = (d as f64).sqrt() as f32;
            x.iter_mut().for_each(|v| *v *= s);
        }
        let rope = RopeTable::new(c, &c.rope, &row_pos);
        let rope_local = c
            .rope_local
            .as_ref()
            .map(|r| RopeTable::new(c, r, &row_pos));
        // What the sliding-window layers see: row r the committed slots from `window_from[r]` on
        // (committed slots are positions), and of its tree ancestors those less than a window
        // away (`window_mask[r]`).
        let (window_from, window_mask): (Vec<usize>, Vec<u64>) = match c.sliding_window {
            None => (Vec::new(), Vec::new()),
            Some(w) => {
                let mut first = 0;
                let mut from = Vec::with_capacity(n);
                let mut masks = Vec::with_capacity(n);
                for item in batch.iter() {
                    for r in first..first + item.tokens.len() {
                        from.push((row_pos[r] + 1).saturating_sub(w));
                        let mut m = row_mask[r];
                        let mut bits = m;
                        while bits != 0 {
                            let i = bits.trailing_zeros() as usize;
                            bits &= bits - 1;
                            if row_pos[r] - row_pos[first + i] >= w {
                                m &= !(1u64 << i);
                            }
                        }
                        masks.push(m);
                    }
                    first += item.tokens.len();
                }
                (from, masks)
            }
        };
        let mut h = vec![0f32; n * d];
        let mut q = vec![0f32; n * qd];
        let mut k = vec![0f32; n * kvd];
        let mut v = vec![0f32; n * kvd];
        let mut att = vec![0f32; n * qd];
        let mut proj = vec![0f32; n * d];
        let mut gate = vec![0f32; n * c.d_ff];
        let mut up = vec![0f32; n * c.d_ff];
        let scale = c.attn_scale;
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
            if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
                norm_heads(&mut q, qn, c.rms_eps);
                norm_heads(&mut k, kn, c.rms_eps);
            }
            let rope = match &rope_local {
                Some(local) if a.windowed => local,
                _ => &rope,
            };
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
                let is_tree = !batch[bi].parents.is_empty();
                let start = item_start[bi];
                let windowed_rows = a.windowed
                    && (r0..r1).any(|r| window_from[r] > 0 || window_mask[r] != row_mask[r]);
                if windowed_rows {
                    // Rows whose window cuts into what they would otherwise see go one at a time,
                    // each over the cache from its window's first slot (a tree node: from the
                    // committed ones, its ancestors masked as near as the window allows).
                    for (r, o) in (r0..r1).zip(out.chunks_mut(group * hd)) {
                        let skip = if is_tree {
                            window_from[r].min(start)
                        } else {
                            window_from[r]
                        };
                        let kv = caches[bi].head(li, kvh, row_slot[r] + 1).skip(skip);
                        let bits = [window_mask[r]];
                        let tree = is_tree.then_some(kernels::TreeMask {
                            start: start - skip,
                            rows: &bits,
                        });
                        let q0 = r * qd + kvh * group * hd;
                        kernels::attend_rows(isa, &q[q0..], qd, 1, kv, scale, tree, scores, o);
                    }
                    return;
                }
                let kv = caches[bi].head(li, kvh, row_slot[r1 - 1] + 1);
                let q0 = r0 * qd + kvh * group * hd;
                let tree = is_tree.then(|| kernels::TreeMask {
                    start,
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
            if let Some(w) = &a.post_norm {
                norm_in_place(&mut proj, w, c.rms_eps, d);
            }
            add_rows(&mut x, &proj);

            // Feed-forward block.
            let m = &layer.mlp;
            norm_rows(&x, &m.norm, c.rms_eps, &mut h, d);
            kernels::matmul_many(&h, n, &mut [(&m.gate, &mut gate), (&m.up, &mut up)]);
            let activation = match c.family().activation {
                Activation::Silu => kernels::swiglu,
                Activation::GeluTanh => kernels::geglu,
            };
            if n >= 4 {
                kernels::par_chunks_mut(&mut gate, c.d_ff, &|r, g| {
                    activation(g, &up[r * c.d_ff..(r + 1) * c.d_ff])
                });
            } else {
                activation(&mut gate, &up);
            }
            kernels::matmul(&gate, n, &m.down, &mut proj);
            if let Some(w) = &m.post_norm {
                norm_in_place(&mut proj, w, c.rms_eps, d);
            }
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

/// RMSNorm of every `w.len()`-long piece of `x` (each head of each row) in place.
fn norm_heads(x: &mut [f32], w: &[f32], eps: f32) {
    norm_in_place(x, w, eps, w.len());
}

fn norm_in_place(x: &mut [f32], w: &[f32], eps: f32, width: usize) {
    let mut tmp = vec![0f32; width];
    for piece in x.chunks_mut(width) {
        kernels::rms_norm(piece, w, eps, &mut tmp);
        piece.copy_from_slice(&tmp);
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
    fn new(c: &Config, rope: &Rope, positions: &[usize]) -> Self {
        let dims = c.rope_dims;
        let half = dims / 2;
        let base = rope.base as f64;
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| {
                let f = base.powf(-2.0 * i as f64 / dims as f64);
                match &rope.factors {
                    Some(factors) => f / factors[i] as f64,
                    None => f,
                }
            })
            .collect();
        let scale = rope.position_scale as f64;
        let attn = rope.attn_factor as f64;
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for f in &inv_freq {
                let angle = p as f64 * scale * f;
                cos.push((angle.cos() * attn) as f32);
                sin.push((angle.sin() * attn) as f32);
            }
        }
        RopeTable {
            style: c.family().rope_style,
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
