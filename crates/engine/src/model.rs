//! The decoder: one generic transformer for every supported architecture (the differences are
//! fields of `config::Config`: Attention -> Mlp -> Layer -> Model), and its forward pass over a
//! ragged batch.
//!
//! A forward pass takes, for each sequence of the batch, some new tokens placed right after what its
//! KV cache already holds, and returns the logits of every new position (or only the last one, for
//! prefill). All rows of all sequences go through the matrix products together; attention runs per
//! row over that row's own cache. Each row's arithmetic is the same whatever else shares the pass,
//! so decoding one token at a time and verifying K drafts at once give bit-identical logits.

mod experts;
mod forward;

pub use forward::{attention_time, products_time};

pub use crate::config::{Activation, Architecture, Config, Rope, RopeStyle};
use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::kernels::{self, QMatrix};
use crate::kv_cache::{KvCache, KvDtype, KvShape};
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
    bo: Option<Vec<f32>>,
    /// A logit per query head that every softmax also counts (`attn_sinks`).
    sinks: Option<Vec<f32>>,
    /// Normalizes the block's output before the residual add.
    post_norm: Option<Vec<f32>>,
    /// Sees only the last `sliding_window` positions.
    windowed: bool,
}

struct Mlp {
    norm: Vec<f32>,
    ffn: Ffn,
    post_norm: Option<Vec<f32>>,
}

/// What a feed-forward block computes on the normalized rows.
enum Ffn {
    /// `down(act(gate(x)) * up(x))`.
    Dense {
        gate: QMatrix,
        up: QMatrix,
        down: QMatrix,
    },
    /// A mixture of such blocks, a few chosen per row by a router.
    Experts(experts::Mixture),
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
    /// What `new_cache` stores keys and values as.
    kv_dtype: KvDtype,
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
            let ffn = if let Some(moe) = c.moe {
                Ffn::Experts(experts::Mixture::load(file, i, d, moe, precision, isa)?)
            } else {
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
                let down = matrix(&p("ffn_down.weight"), d, ff)?;
                Ffn::Dense { gate, up, down }
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
                    bo: bias(&p("attn_output.bias"), d)?,
                    sinks: when(f.sinks, &p("attn_sinks.weight"), c.n_head)?,
                    post_norm: when(f.post_norms, &p("post_attention_norm.weight"), d)?,
                    windowed: c.is_windowed(i),
                },
                mlp: Mlp {
                    norm: vector(&p(&format!("{}.weight", f.ffn_norm)), d)?,
                    ffn,
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
        let kv_dtype = KvDtype::auto(c.head_dim);
        let model = Model {
            output_norm: vector("output_norm.weight", d)?,
            config: c,
            token_embd,
            layers,
            output,
            kv_dtype,
        };
        // Prompt rows multiply the layers' projections (not the experts nor the head): where
        // their arithmetic reads a copy of its own, it is made now, not in the first prompt.
        model
            .layer_matrices()
            .for_each(kernels::prepare_prompt_rows);
        Ok(model)
    }

    /// Bytes of the copies of the weights that prompt rows read beside the model's own
    /// (`PLD_PROMPT_ROWS=int8`; zero otherwise).
    pub fn prompt_copy_bytes(&self) -> usize {
        self.layer_matrices().map(kernels::prompt_copy_bytes).sum()
    }

    /// Bytes of weights one decode step reads: every layer matrix and the output head (the
    /// embedding table contributes one row). Divided into the memory bandwidth, the fastest a
    /// bandwidth-bound decode can go.
    /// (A mixture's layers count the router and, on average, the share of the experts a token
    /// runs.)
    pub fn weight_bytes_per_token(&self) -> usize {
        let size = |m: &QMatrix| m.bytes.as_slice().len();
        let matrices: usize = self.token_matrices().map(size).sum();
        let mixtures: usize = self.mixtures().map(|x| x.bytes_per_token()).sum();
        matrices + mixtures + self.token_embd.bytes.as_slice().len() / self.token_embd.rows.max(1)
    }

    /// What the latest forward pass read of the mixtures of experts: the experts it ran per layer
    /// (mean over the layers) and the bytes of their matrices (all layers). A pass reads each
    /// expert its rows chose once, so over several rows this is the union of their choices.
    /// `None` for a dense model.
    pub fn experts_read(&self) -> Option<ExpertsRead> {
        let layers = self.mixtures().count();
        (layers > 0).then(|| {
            let (n, bytes) = self
                .mixtures()
                .map(|x| x.last_read())
                .fold((0, 0), |(n, b), (xn, xb)| (n + xn, b + xb));
            ExpertsRead {
                per_layer: n as f64 / layers as f64,
                of: self.config.moe.map_or(0, |m| m.count),
                bytes,
            }
        })
    }

    /// In a mixture of experts, what a drafted row costs before any pass is timed, in plain
    /// tokens: the dense prior (`drafting::PRIOR_PRICE`) plus the bytes of the experts a
    /// second row adds to a one-row pass over the bytes that pass reads. With routing that looks
    /// independent, the second row's `used` choices miss the first row's with probability
    /// `1 - used / count` each. `None` for a dense model (the drafter's own prior).
    pub fn draft_price_prior(&self) -> Option<f64> {
        let moe = self.config.moe?;
        let experts: usize = self.mixtures().map(|x| x.expert_bytes()).sum();
        let per_expert = experts as f64 / moe.count.max(1) as f64;
        let one_row = self.dense_weight_bytes() as f64 + moe.used as f64 * per_expert;
        let added = moe.used as f64 * (1.0 - moe.used as f64 / moe.count as f64) * per_expert;
        Some(drafting::PRIOR_PRICE + added / one_row)
    }

    /// Bytes of weights a pass reads whatever its rows: every matrix but the experts' (the
    /// router included), and one embedding row.
    pub fn dense_weight_bytes(&self) -> usize {
        let size = |m: &QMatrix| m.bytes.as_slice().len();
        let routers: usize = self.mixtures().map(|x| size(&x.router)).sum();
        self.token_matrices().map(size).sum::<usize>()
            + routers
            + self.token_embd.bytes.as_slice().len() / self.token_embd.rows.max(1)
    }

    /// Multiply-adds of the matrix products per token: one per weight of every matrix it passes
    /// through (its embedding is a lookup; a mixture's experts as in `weight_bytes_per_token`).
    pub fn macs_per_token(&self) -> usize {
        let matrices: usize = self.token_matrices().map(|m| m.rows * m.cols).sum();
        matrices + self.mixtures().map(|x| x.macs_per_token()).sum::<usize>()
    }

    /// Multiply-adds of the output head per row whose logits are wanted (a prompt's chunk wants
    /// its last row's only): part of `macs_per_token`.
    pub fn head_macs(&self) -> usize {
        self.output.rows * self.output.cols
    }

    /// Positions of a cache of `len` that layer `layer`'s attention reads: all of them, or the
    /// window's worth in a windowed layer.
    fn attended(&self, layer: usize, len: usize) -> usize {
        match self.config.sliding_window {
            Some(w) if self.config.is_windowed(layer) => len.min(w),
            _ => len,
        }
    }

    /// Bytes of keys and values a pass reads from a cache of `len` positions (the attention
    /// kernels read each once for all the rows of a pass).
    pub fn cache_bytes_read(&self, len: usize) -> usize {
        let s = self.kv_shape();
        let per_layer_position = s.bytes_per_position() / s.n_layer;
        (0..s.n_layer)
            .map(|l| per_layer_position * self.attended(l, len))
            .sum()
    }

    /// f32 multiply-adds of one row's attention over `len` positions: a score and a weighted
    /// value per query head, dimension and position seen.
    pub fn attention_macs(&self, len: usize) -> usize {
        let c = &self.config;
        (0..c.n_layer)
            .map(|l| 2 * c.q_dim() * self.attended(l, len))
            .sum()
    }

    /// Every matrix a token's pass multiplies by, but for the mixtures of experts: each layer's
    /// projections and the output head.
    fn token_matrices(&self) -> impl Iterator<Item = &QMatrix> {
        self.layer_matrices().chain(std::iter::once(&self.output))
    }

    /// Each layer's projections: attention's and a dense feed-forward's.
    fn layer_matrices(&self) -> impl Iterator<Item = &QMatrix> {
        self.layers.iter().flat_map(|l| {
            let a = &l.attn;
            let dense = match &l.mlp.ffn {
                Ffn::Dense { gate, up, down } => vec![gate, up, down],
                Ffn::Experts(_) => Vec::new(),
            };
            [&a.wq, &a.wk, &a.wv, &a.wo].into_iter().chain(dense)
        })
    }

    /// The layers' mixtures of experts (none in a dense model).
    fn mixtures(&self) -> impl Iterator<Item = &experts::Mixture> {
        self.layers.iter().filter_map(|l| match &l.mlp.ffn {
            Ffn::Experts(x) => Some(x),
            Ffn::Dense { .. } => None,
        })
    }

    /// What one cached position holds (a key and a value per layer).
    pub fn kv_shape(&self) -> KvShape {
        let c = &self.config;
        KvShape {
            n_layer: c.n_layer,
            kv_dim: c.kv_dim(),
            hd: c.head_dim,
            dtype: self.kv_dtype,
        }
    }

    /// What the caches `new_cache` makes from now on store keys and values as (`KvDtype::auto`
    /// by default). bf16 pairs a head's dimensions: refused for an odd head size.
    pub fn set_kv_dtype(&mut self, dtype: KvDtype) -> Result<()> {
        let head_dim = self.config.head_dim;
        if !dtype.fits(head_dim) {
            return Err(EngineError::KvDtypeUnfit {
                dtype: dtype.name(),
                head_dim,
            });
        }
        self.kv_dtype = dtype;
        Ok(())
    }

    /// A KV cache for one sequence of up to `capacity` positions (clamped to the model's context).
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        KvCache::new(self.kv_shape(), capacity.min(self.config.context_len))
    }
}

/// What a forward pass read of a model's mixtures of experts (`Model::experts_read`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertsRead {
    /// Experts run per layer, on average over the layers.
    pub per_layer: f64,
    /// Experts per layer in all.
    pub of: usize,
    /// Bytes of the matrices of the experts run, over all layers.
    pub bytes: usize,
}

/// One sequence's part of a forward pass.
pub struct BatchItem<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
    pub all_logits: bool,
    /// The tokens are a prompt's (prefill), not generated ones or drafts: the kernels may compute
    /// their products with another arithmetic (`kernels::RowKind`).
    pub prompt: bool,
    /// Empty for a chain (each token follows the one before). For a draft tree, the parent of
    /// each row as an earlier row index, [`drafting::ROOT`] for the first row (the last committed
    /// token; see `DraftTree::row_parents`): every row takes the next cache slot but sees only the committed cache and its own
    /// ancestors, at position committed length + depth. After verification the accepted path is
    /// made consecutive with [`KvCache::keep_rows`].
    pub parents: &'a [u32],
}

/// The most rows a tree may have (a row's ancestors are one 64-bit mask).
pub const MAX_TREE_ROWS: usize = 64;
