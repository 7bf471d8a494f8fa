//! The forward pass over a ragged batch, along its own headings: the rows' layout (which item,
//! cache slot, position, tree and window masks), the attention plan, then per layer the attention
//! block and the feed-forward block, and the output head on the rows whose logits are wanted.

use super::{Attention, BatchItem, Ffn, Mlp, Model, MAX_TREE_ROWS};
use crate::config::{Activation, Config, Rope, RopeStyle};
use crate::error::{EngineError, Result};
use crate::kernels::{self, QMatrix, RowKind};
use crate::kv_cache::KvCache;
use crate::weights;
use drafting::ROOT;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where every row of a pass goes. A chain's row i goes to slot start + i at position start + i;
/// a tree's node also takes slot start + i but is rotated at start + its depth, and sees only the
/// committed cache and its ancestors.
struct Rows {
    /// Per row: its item, cache slot, position and tree-ancestor bits (bit i: the item's row i).
    item: Vec<usize>,
    slot: Vec<usize>,
    pos: Vec<usize>,
    mask: Vec<u64>,
    /// Per item: its committed length (its first row's slot).
    item_start: Vec<usize>,
    /// What the sliding-window layers see: row r the committed slots from `window_from[r]` on
    /// (committed slots are positions), and of its tree ancestors those less than a window away
    /// (`window_mask[r]`). Empty without a sliding window.
    window_from: Vec<usize>,
    window_mask: Vec<u64>,
}

impl Rows {
    fn lay_out(c: &Config, batch: &[BatchItem<'_>]) -> Result<Rows> {
        let mut rows = Rows {
            item: Vec::new(),
            slot: Vec::new(),
            pos: Vec::new(),
            mask: Vec::new(),
            item_start: Vec::with_capacity(batch.len()),
            window_from: Vec::new(),
            window_mask: Vec::new(),
        };
        for (bi, item) in batch.iter().enumerate() {
            let start = item.cache.len();
            rows.item_start.push(start);
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
                rows.item.push(bi);
                rows.slot.push(start + i);
                let first = rows.pos.len() - i; // the item's first row
                let (pos, mask) = match item.parents.get(i) {
                    None => (start + i, 0),
                    Some(&ROOT) => (start, 1u64),
                    Some(&p) => {
                        let p = first + p as usize;
                        (rows.pos[p] + 1, rows.mask[p] | 1u64 << i)
                    }
                };
                rows.pos.push(pos);
                rows.mask.push(mask);
            }
        }
        if let Some(w) = c.sliding_window {
            rows.windows(w, batch);
        }
        Ok(rows)
    }

    fn len(&self) -> usize {
        self.item.len()
    }

    /// Fills `window_from` and `window_mask` for a window of `w` positions.
    fn windows(&mut self, w: usize, batch: &[BatchItem<'_>]) {
        let n = self.len();
        let mut first = 0;
        self.window_from = Vec::with_capacity(n);
        self.window_mask = Vec::with_capacity(n);
        for item in batch.iter() {
            for r in first..first + item.tokens.len() {
                self.window_from.push((self.pos[r] + 1).saturating_sub(w));
                let mut m = self.mask[r];
                let mut bits = m;
                while bits != 0 {
                    let i = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    if self.pos[r] - self.pos[first + i] >= w {
                        m &= !(1u64 << i);
                    }
                }
                self.window_mask.push(m);
            }
            first += item.tokens.len();
        }
    }
}

/// Nanoseconds this process has spent in attention's kernels (`Model::attend`, every layer of
/// every pass) and in the matrix products of the layers (`Kinds::products`), for `bench
/// forward`'s shares of each pass.
static ATTENTION_NANOS: AtomicU64 = AtomicU64::new(0);
static PRODUCTS_NANOS: AtomicU64 = AtomicU64::new(0);

/// Time this process has spent in attention's kernels so far: the difference over a pass is
/// attention's part of it.
pub fn attention_time() -> std::time::Duration {
    std::time::Duration::from_nanos(ATTENTION_NANOS.load(Ordering::Relaxed))
}

/// Time this process has spent in the layers' matrix products so far (the output head's
/// excluded): the difference over a pass is the products' part of it.
pub fn products_time() -> std::time::Duration {
    std::time::Duration::from_nanos(PRODUCTS_NANOS.load(Ordering::Relaxed))
}

/// Attention jobs, the same in every layer: one per (sequence, kv head, run of its rows), so that
/// the rows of a run read each key and value once for all their query heads. Runs are split only
/// as far as the threads need work. Job j writes its rows' outputs to
/// `out[bounds[j]..bounds[j + 1]]`.
struct Jobs {
    /// (item, kv head, first row, end row).
    list: Vec<(usize, usize, usize, usize)>,
    bounds: Vec<usize>,
}

impl Jobs {
    fn plan(c: &Config, batch: &[BatchItem<'_>]) -> Jobs {
        let threads = kernels::pool::global().threads();
        let group = c.n_head / c.n_kv_head;
        let mut list = Vec::new();
        let mut bounds = vec![0];
        let mut first = 0;
        for (bi, item) in batch.iter().enumerate() {
            let rows = item.tokens.len();
            let runs = threads
                .div_ceil(c.n_kv_head * batch.len())
                .clamp(1, rows.max(1));
            for kvh in 0..c.n_kv_head {
                for run in 0..runs {
                    let (r0, r1) = (first + rows * run / runs, first + rows * (run + 1) / runs);
                    if r1 > r0 {
                        list.push((bi, kvh, r0, r1));
                        bounds.push(bounds.last().unwrap() + (r1 - r0) * group * c.head_dim);
                    }
                }
            }
            first += rows;
        }
        Jobs { list, bounds }
    }
}

/// What every layer of one pass shares: the rows' layout, the attention jobs, and the rotations
/// of the rows' positions (for the sliding-window layers too when their base differs).
struct Plan {
    rows: Rows,
    kinds: Kinds,
    jobs: Jobs,
    rope: RopeTable,
    rope_local: Option<RopeTable>,
}

/// The activations of one pass, reused by every layer (`n` rows each).
struct Buffers {
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// The attention jobs' outputs, in job order.
    job_out: Vec<f32>,
}

impl Buffers {
    fn new(c: &Config, n: usize) -> Self {
        let (d, qd, kvd) = (c.d_model, c.q_dim(), c.kv_dim());
        Buffers {
            h: vec![0f32; n * d],
            q: vec![0f32; n * qd],
            k: vec![0f32; n * kvd],
            v: vec![0f32; n * kvd],
            att: vec![0f32; n * qd],
            proj: vec![0f32; n * d],
            // Sized at the first layer that needs them: a fused feed-forward does not, and a
            // mixture's experts keep their own.
            gate: Vec::new(),
            up: Vec::new(),
            // Sized where attention takes it, from a cache line's start (`on_lines`).
            job_out: Vec::new(),
        }
    }
}

impl Model {
    /// Runs the new tokens of every item through the model, appends their keys and values to each
    /// item's cache, and returns the logits: for each item in order, one row per new token when
    /// `all_logits` is set, else the last row only. Rows are `vocab_size` long.
    pub fn forward(&self, batch: &mut [BatchItem<'_>]) -> Result<Vec<f32>> {
        let c = &self.config;
        let rows = Rows::lay_out(c, batch)?;
        let n = rows.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let d = c.d_model;
        let mut x = vec![0f32; n * d];
        let tokens = batch.iter().flat_map(|b| b.tokens.iter().copied());
        weights::embed(&self.token_embd, tokens, &mut x);
        if c.family().scale_embeddings {
            let s = (d as f64).sqrt() as f32;
            x.iter_mut().for_each(|v| *v *= s);
        }
        let plan = Plan {
            rope: RopeTable::new(c, &c.rope, &rows.pos),
            rope_local: c
                .rope_local
                .as_ref()
                .map(|r| RopeTable::new(c, r, &rows.pos)),
            jobs: Jobs::plan(c, batch),
            kinds: Kinds::of(batch),
            rows,
        };
        let mut b = Buffers::new(c, n);
        for (li, layer) in self.layers.iter().enumerate() {
            self.attention(li, &layer.attn, batch, &plan, &mut b, &mut x);
            self.feed_forward(&layer.mlp, &plan.kinds, n, &mut b, &mut x);
        }
        for item in batch.iter_mut() {
            let len = item.cache.len() + item.tokens.len();
            item.cache.set_len(len);
        }
        Ok(self.head(batch, &x))
    }

    /// The attention block of layer `li`: queries, keys and values of every row (the keys and
    /// values written to the caches), attention per job, the output projection added to `x`.
    fn attention(
        &self,
        li: usize,
        a: &Attention,
        batch: &mut [BatchItem<'_>],
        plan: &Plan,
        b: &mut Buffers,
        x: &mut [f32],
    ) {
        let c = &self.config;
        let (rows, jobs) = (&plan.rows, &plan.jobs);
        let rope = match &plan.rope_local {
            Some(local) if a.windowed => local,
            _ => &plan.rope,
        };
        let (d, qd, kvd, hd) = (c.d_model, c.q_dim(), c.kv_dim(), c.head_dim);
        let n = rows.len();
        norm_rows(x, &a.norm, c.rms_eps, &mut b.h, d);
        plan.kinds.products(
            &b.h,
            n,
            &mut [(&a.wq, &mut b.q), (&a.wk, &mut b.k), (&a.wv, &mut b.v)],
        );
        add_bias(&mut b.q, a.bq.as_deref());
        add_bias(&mut b.k, a.bk.as_deref());
        add_bias(&mut b.v, a.bv.as_deref());
        if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
            norm_heads(&mut b.q, qn, c.rms_eps);
            norm_heads(&mut b.k, kn, c.rms_eps);
        }
        rope.apply(&mut b.q, c.n_head, hd);
        rope.apply(&mut b.k, c.n_kv_head, hd);
        for r in 0..n {
            batch[rows.item[r]].cache.write(
                li,
                rows.slot[r],
                &b.k[r * kvd..(r + 1) * kvd],
                &b.v[r * kvd..(r + 1) * kvd],
            );
        }
        let started = std::time::Instant::now();
        let job_out = kernels::on_lines(&mut b.job_out, n * qd);
        self.attend(li, a, batch, plan, &b.q, job_out);
        ATTENTION_NANOS.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let group = c.n_head / c.n_kv_head;
        for (&(_, kvh, r0, r1), w) in jobs.list.iter().zip(jobs.bounds.windows(2)) {
            let part = &job_out[w[0]..w[1]];
            for (r, o) in (r0..r1).zip(part.chunks(group * hd)) {
                b.att[r * qd + kvh * group * hd..][..group * hd].copy_from_slice(o);
            }
        }
        plan.kinds.products(&b.att, n, &mut [(&a.wo, &mut b.proj)]);
        add_bias(&mut b.proj, a.bo.as_deref());
        if let Some(w) = &a.post_norm {
            norm_in_place(&mut b.proj, w, c.rms_eps, d);
        }
        add_rows(x, &b.proj);
    }

    /// Every attention job of layer `li` over the caches, on the pool's threads when there is
    /// enough work; job j's output goes to `out[jobs.bounds[j]..jobs.bounds[j + 1]]`.
    fn attend(
        &self,
        li: usize,
        a: &Attention,
        batch: &[BatchItem<'_>],
        plan: &Plan,
        q: &[f32],
        out: &mut [f32],
    ) {
        let c = &self.config;
        let (rows, jobs) = (&plan.rows, &plan.jobs);
        let (qd, hd) = (c.q_dim(), c.head_dim);
        let group = c.n_head / c.n_kv_head;
        let scale = c.attn_scale;
        let isa = kernels::isa();
        let caches: Vec<&KvCache> = batch.iter().map(|b| &*b.cache).collect();
        let windowed = a.windowed;
        let attend = |scores: &mut Vec<f32>, j: usize, out: &mut [f32]| {
            let (bi, kvh, r0, r1) = jobs.list[j];
            let sinks = a
                .sinks
                .as_deref()
                .map(|s| &s[kvh * group..(kvh + 1) * group]);
            let is_tree = !batch[bi].parents.is_empty();
            let start = rows.item_start[bi];
            let windowed_rows = windowed
                && (r0..r1).any(|r| rows.window_from[r] > 0 || rows.window_mask[r] != rows.mask[r]);
            if windowed_rows {
                // Rows whose window cuts into what they would otherwise see go one at a time,
                // each over the cache from its window's first slot (a tree node: from the
                // committed ones, its ancestors masked as near as the window allows).
                for (r, o) in (r0..r1).zip(out.chunks_mut(group * hd)) {
                    let skip = if is_tree {
                        rows.window_from[r].min(start)
                    } else {
                        rows.window_from[r]
                    };
                    let kv = caches[bi].head(li, kvh, rows.slot[r] + 1).skip(skip);
                    let bits = [rows.window_mask[r]];
                    let tree = is_tree.then_some(kernels::TreeMask {
                        start: start - skip,
                        rows: &bits,
                    });
                    let q0 = r * qd + kvh * group * hd;
                    kernels::attend_rows(isa, &q[q0..], qd, 1, kv, scale, sinks, tree, scores, o);
                }
                return;
            }
            let kv = caches[bi].head(li, kvh, rows.slot[r1 - 1] + 1);
            let q0 = r0 * qd + kvh * group * hd;
            let tree = is_tree.then(|| kernels::TreeMask {
                start,
                rows: &rows.mask[r0..r1],
            });
            kernels::attend_rows(
                isa,
                &q[q0..],
                qd,
                r1 - r0,
                kv,
                scale,
                sinks,
                tree,
                scores,
                out,
            );
        };
        // Threads pay off once there are enough (row, head, position) triples.
        let work: usize = rows.slot.iter().map(|p| p + 1).sum::<usize>() * c.n_head * hd;
        if work < 1 << 16 {
            let mut scores = Vec::new();
            for (j, w) in jobs.bounds.windows(2).enumerate() {
                attend(&mut scores, j, &mut out[w[0]..w[1]]);
            }
        } else {
            thread_local! {
                static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
            }
            kernels::par_split_mut(out, &jobs.bounds, &|j, out| {
                SCORES.with(|s| attend(&mut s.borrow_mut(), j, out));
            });
        }
    }

    /// The feed-forward block: gated activation of every row, projected down, or the row's
    /// experts' (`experts`), added to `x`.
    fn feed_forward(&self, m: &Mlp, kinds: &Kinds, n: usize, b: &mut Buffers, x: &mut [f32]) {
        let c = &self.config;
        norm_rows(x, &m.norm, c.rms_eps, &mut b.h, c.d_model);
        let activation = match c.family().activation {
            Activation::Silu => kernels::swiglu,
            Activation::GeluTanh => kernels::geglu,
            Activation::SiluClamped => kernels::swiglu_oai,
        };
        match &m.ffn {
            Ffn::Dense { gate, up, down } => {
                let ffn = kernels::GatedFfn {
                    gate,
                    up,
                    down,
                    activation,
                };
                if !kinds.fused_ffn(&b.h, n, &ffn, &mut b.proj) {
                    self.ffn_in_steps(&ffn, kinds, n, b);
                }
            }
            Ffn::Experts(mixture) => mixture.forward(&b.h, n, activation, &mut b.proj),
        }
        if let Some(w) = &m.post_norm {
            norm_in_place(&mut b.proj, w, c.rms_eps, c.d_model);
        }
        add_rows(x, &b.proj);
    }

    /// A gated feed-forward as the gate and up products, the activation row by row, and the down
    /// product (into `b.proj`).
    fn ffn_in_steps(&self, ffn: &kernels::GatedFfn, kinds: &Kinds, n: usize, b: &mut Buffers) {
        let d_ff = self.config.d_ff;
        b.gate.resize(n * d_ff, 0.0);
        b.up.resize(n * d_ff, 0.0);
        kinds.products(&b.h, n, &mut [(ffn.gate, &mut b.gate), (ffn.up, &mut b.up)]);
        let (up, activation) = (&b.up, ffn.activation);
        if n >= 4 {
            kernels::par_chunks_mut(&mut b.gate, d_ff, &|r, g| {
                activation(g, &up[r * d_ff..(r + 1) * d_ff])
            });
        } else {
            activation(&mut b.gate, up);
        }
        kinds.products(&b.gate, n, &mut [(ffn.down, &mut b.proj)]);
    }

    /// The output head, on the rows whose logits are wanted.
    fn head(&self, batch: &[BatchItem<'_>], x: &[f32]) -> Vec<f32> {
        let c = &self.config;
        let d = c.d_model;
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
        logits
    }
}

/// The kinds of a pass's rows (`BatchItem::prompt`), as far as the kernels in use tell them apart
/// (`kernels::prompt_arithmetic_differs`): the layers' products run once per kind. The output
/// head and a mixture's experts take every row alike.
enum Kinds {
    All(RowKind),
    /// Rows of both kinds: each kind's rows, in order.
    Mixed([(RowKind, Vec<usize>); 2]),
}

impl Kinds {
    fn of(batch: &[BatchItem<'_>]) -> Kinds {
        let kind = |b: &BatchItem<'_>| match b.prompt {
            true => RowKind::Prompt,
            false => RowKind::Generated,
        };
        let first = batch.first().map_or(RowKind::Generated, kind);
        if !kernels::prompt_arithmetic_differs() {
            return Kinds::All(RowKind::Generated);
        }
        if batch.iter().all(|b| kind(b) == first) {
            return Kinds::All(first);
        }
        let (mut prompt, mut generated) = (Vec::new(), Vec::new());
        let mut row = 0;
        for b in batch {
            let rows = row..row + b.tokens.len();
            match kind(b) {
                RowKind::Prompt => prompt.extend(rows),
                RowKind::Generated => generated.extend(rows),
            }
            row += b.tokens.len();
        }
        Kinds::Mixed([(RowKind::Prompt, prompt), (RowKind::Generated, generated)])
    }

    /// `kernels::matmul_many` over `n` rows, each row in its kind's arithmetic: rows of both
    /// kinds are gathered per kind and their outputs put back in place.
    fn products(&self, x: &[f32], n: usize, jobs: &mut [(&QMatrix, &mut [f32])]) {
        let started = std::time::Instant::now();
        self.products_untimed(x, n, jobs);
        PRODUCTS_NANOS.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// The gated feed-forward of all `n` rows in one go where the kernels fuse it for their kind
    /// (`kernels::gated_ffn_rows`, the same bits as the products and the activation in turn), its
    /// time counted as the products'; false where they do not.
    fn fused_ffn(&self, x: &[f32], n: usize, ffn: &kernels::GatedFfn, out: &mut [f32]) -> bool {
        let Kinds::All(kind) = self else {
            return false;
        };
        let started = std::time::Instant::now();
        let fused = kernels::gated_ffn_rows(*kind, x, n, ffn, out);
        if fused {
            PRODUCTS_NANOS.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        fused
    }

    fn products_untimed(&self, x: &[f32], n: usize, jobs: &mut [(&QMatrix, &mut [f32])]) {
        let parts = match self {
            Kinds::All(kind) => return kernels::matmul_many_rows(*kind, x, n, jobs),
            Kinds::Mixed(parts) => parts,
        };
        let k = x.len() / n;
        for (kind, rows) in parts {
            let xs: Vec<f32> = rows
                .iter()
                .flat_map(|&r| &x[r * k..(r + 1) * k])
                .copied()
                .collect();
            let mut outs: Vec<Vec<f32>> = jobs
                .iter()
                .map(|(w, _)| vec![0f32; rows.len() * w.rows])
                .collect();
            let mut part: Vec<(&QMatrix, &mut [f32])> = jobs
                .iter()
                .zip(outs.iter_mut())
                .map(|((w, _), o)| (*w, o.as_mut_slice()))
                .collect();
            kernels::matmul_many_rows(*kind, &xs, rows.len(), &mut part);
            for ((w, out), o) in jobs.iter_mut().zip(&outs) {
                for (i, &r) in rows.iter().enumerate() {
                    out[r * w.rows..(r + 1) * w.rows].copy_from_slice(&o[i * w.rows..][..w.rows]);
                }
            }
        }
    }
}

fn check_tree(parents: &[u32], rows: usize) -> Result<()> {
    let bad = |why: String| Err(EngineError::InvalidConfig(format!("draft tree: {why}")));
    if parents.len() != rows {
        return bad(format!("{} parents for {rows} rows", parents.len()));
    }
    if rows > MAX_TREE_ROWS {
        return bad(format!("{rows} rows, at most {MAX_TREE_ROWS}"));
    }
    if parents[0] != ROOT {
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

/// Adds `bias` to every row of `x` (rows of its length).
pub(super) fn add_bias(x: &mut [f32], bias: Option<&[f32]>) {
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
                    Some(factors) => f / factors[i],
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
