//! The drafting policy of one sequence, in one place: where drafts come from, how many of the
//! proposed tokens to send (priced by the pass cost), and what is learned from each verified
//! outcome.
//!
//! Method `ngram` drafts one chain from the n-gram index over the sequence, cut by the
//! [`DraftLength`] controller. Method `tree` grows a [`DraftTree`] from up to three sources: every
//! earlier continuation of the suffix n-grams in the sequence, the model's own earlier predictions
//! ([`PredictionTable`]), and a tenant's [`Corpus`] of earlier requests. Each candidate node gets
//! an estimated probability of being accepted (the product, down its path, of decayed acceptance
//! rates per source, class and depth); nodes are added best first while a node's probability pays
//! for its row at the current price, so a tree grows when passes are cheap and shrinks to a chain
//! or to nothing when they are not.
//!
//! The engine's `step` and the offline drafting study drive the same [`Drafter`] through the same
//! calls per step: [`propose`](Drafter::propose) under a price, then (after verification)
//! [`observe`](Drafter::observe) the accepted path, [`push`](Drafter::push) the tokens that were
//! emitted, and, where timings are trusted, [`observe_cost`](Drafter::observe_cost); the engine
//! also hands each verified row's top candidates to
//! [`record_predictions`](Drafter::record_predictions).

use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};

use crate::calibration::{Calibration, Estimate};
use crate::corpus::Corpus;
use crate::length::{DraftLength, Probes, MIN_GAIN, PRIOR_PRICE};
use crate::predictions::PredictionTable;
use crate::scored::Candidates;
use crate::spec_config::{SpecConfig, SpecMethod, MAX_TREE_TOP_K};
use crate::tree::{DraftTree, Source, ROOT};
use crate::{NgramIndex, MAX_NGRAM};

/// A tenant's corpus, shared by its sequences.
pub type SharedCorpus = Arc<Mutex<Corpus>>;

/// A prediction table shared by a tenant's sequences (warm from its earlier requests).
pub type SharedPredictions = Arc<Mutex<PredictionTable>>;

/// Earlier occurrences looked at per source and step.
const MAX_OCCURRENCES: usize = 8;
/// Classes per source: the n-gram size for `ngram` and `corpus`, the rank for `model`.
const CLASSES: usize = if MAX_NGRAM + 1 > MAX_TREE_TOP_K {
    MAX_NGRAM + 1
} else {
    MAX_TREE_TOP_K
};
/// Depths told apart by the estimates (deeper nodes share the last).
const DEPTHS: usize = 8;
/// Decay of a rate's counts per observation.
const RATE_DECAY: f64 = 0.98;
/// Weight of a rate's prior, in observations.
const PRIOR_WEIGHT: f64 = 2.0;

/// The scored chain over the sequence and, where given, a corpus: the continuations of the
/// longest suffix n-gram found in either (the sequence's occurrences rank as more recent than the
/// corpus's when both have it at the same size), drafted into `out` (evidence-sized drafts
/// estimated under `calibration` where given, their tokens' uncalibrated estimates in
/// `estimates`). Returns the n-gram's size and, when the draft copies an occurrence in the
/// sequence, where its continuation starts.
fn scored_chain(
    index: &NgramIndex,
    cursor: Option<usize>,
    corpus: Option<&Corpus>,
    calibration: Option<&Calibration>,
    k: usize,
    out: &mut Vec<u32>,
    estimates: &mut Vec<Estimate>,
) -> Option<(usize, Option<usize>)> {
    out.clear();
    estimates.clear();
    let params = index.score_params();
    let mut own = Candidates::new(params.max_occurrences);
    let own_n = index.scored_candidates(k, cursor, &mut own);
    let tokens = index.tokens();
    let suffix = &tokens[tokens.len().saturating_sub(crate::scored::MAX_MATCH)..];
    let mut theirs = Candidates::new(params.max_occurrences);
    let their_n = corpus.and_then(|c| c.scored_candidates(suffix, k, &mut theirs));
    // The candidates drafted from, and how many of them (the first) are the sequence's.
    let (n, candidates, in_sequence) = match (own_n, their_n) {
        (None, None) => return None,
        (Some(a), Some(b)) if a == b => {
            let mine = own.len();
            own.extend(&theirs);
            (a, &own, mine)
        }
        (Some(a), Some(b)) if a > b => (a, &own, own.len()),
        (Some(a), None) => (a, &own, own.len()),
        (_, Some(b)) => (b, &theirs, 0),
    };
    let best =
        crate::evidence::draft_calibrated(candidates, k, &params, calibration, out, estimates);
    Some((n, (best < in_sequence).then(|| candidates.start(best) + n)))
}

/// A shared table, even if a holder panicked (the data stays usable: every update is one insert).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Decayed counts of tried and accepted nodes per (source, class, depth): the estimated
/// probability that a node is accepted once its parent is.
#[derive(Clone, Debug)]
struct TreeRates {
    accepted: Vec<f64>,
    tried: Vec<f64>,
}

impl TreeRates {
    fn new() -> Self {
        let cells = Source::ALL.len() * CLASSES * DEPTHS;
        TreeRates {
            accepted: vec![0.0; cells],
            tried: vec![0.0; cells],
        }
    }

    fn cell(source: Source, class: usize, depth: usize) -> usize {
        let class = class.min(CLASSES - 1);
        let depth = depth.clamp(1, DEPTHS) - 1;
        (source.index() * CLASSES + class) * DEPTHS + depth
    }

    /// A prior guess: a long n-gram match predicts well, a single token less; the model's first
    /// candidate is right about as often as not on grounded text, later ranks much less.
    fn prior(source: Source, class: usize) -> f64 {
        match source {
            Source::Ngram | Source::Corpus => match class {
                0 | 1 => 0.3,
                2 => 0.45,
                _ => 0.6,
            },
            Source::Model => 0.4 / (1.0 + 2.0 * class as f64),
        }
    }

    fn rate(&self, source: Source, class: usize, depth: usize) -> f64 {
        let c = Self::cell(source, class, depth);
        (self.accepted[c] + PRIOR_WEIGHT * Self::prior(source, class))
            / (self.tried[c] + PRIOR_WEIGHT)
    }

    fn observe(&mut self, source: Source, class: usize, depth: usize, accepted: bool) {
        let c = Self::cell(source, class, depth);
        self.accepted[c] = self.accepted[c] * RATE_DECAY + f64::from(u8::from(accepted));
        self.tried[c] = self.tried[c] * RATE_DECAY + 1.0;
    }
}

/// A node waiting to join the tree, ordered by its estimated probability of acceptance.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    p: f64,
    parent: u32,
    token: u32,
    source: Source,
    class: u8,
    depth: u16,
    /// The copied run it comes from and its offset there (n-gram and corpus candidates).
    run: Option<(u32, u16)>,
}

/// Tokens copied from an earlier occurrence (in the sequence or the corpus): `len` tokens at
/// `start` in the drafter's `run_tokens`.
#[derive(Clone, Copy, Debug)]
struct Run {
    start: u32,
    len: u16,
    source: Source,
    /// The size of the n-gram match.
    class: u8,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.p == other.p
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.p.total_cmp(&other.p)
    }
}

/// One sequence's drafter: the sequence so far, indexed, the sources and estimates of its method.
#[derive(Clone, Debug)]
pub struct Drafter {
    index: NgramIndex,
    length: DraftLength,
    /// The settings, as `SpecConfig::merge` checked them (`num_speculative_tokens`, K: a chain's
    /// length, a tree's depth).
    config: SpecConfig,
    /// The draft of the current step.
    tree: DraftTree,
    /// A chain draft's tokens, before they become `tree` (scratch).
    chain: Vec<u32>,
    /// Size of the n-gram match behind a chain draft.
    draft_match: usize,
    /// The sequence's length when the last chain was proposed, and where in the sequence the
    /// continuation it copied starts (see [`cursor`](Self::cursor)).
    source: Option<(usize, usize)>,
    /// Per node of a tree draft: its class for the estimates.
    classes: Vec<u8>,
    /// The sequence's calibration of evidence-sized chains, and the uncalibrated estimates of
    /// the current chain's tokens.
    calibration: Calibration,
    estimates: Vec<Estimate>,
    /// The model's earlier predictions: the sequence's own table, or its tenant's.
    predictions: SharedPredictions,
    corpus: Option<SharedCorpus>,
    rates: TreeRates,
    /// When a tree that pays for nothing still sends its best node.
    probes: Probes,
    // Scratch of the tree builder.
    runs: Vec<Run>,
    run_tokens: Vec<u32>,
    heap: BinaryHeap<Candidate>,
    expanded: Vec<bool>,
}

impl Drafter {
    /// Begins drafting over `prompt` with settings checked by [`SpecConfig::merge`] (speculation
    /// on to draft anything; K = 0 gives a drafter that never proposes). Settings built by hand
    /// are taken as they are, a tree's sizes clamped to what a tree holds, as
    /// [`NgramIndex::new`] clamps the n-gram range.
    pub fn new(config: &SpecConfig, prompt: &[u32]) -> Self {
        let mut config = *config;
        config.tree_max_nodes = config.tree_max_nodes.min(crate::tree::MAX_NODES);
        config.tree_top_k = config.tree_top_k.min(MAX_TREE_TOP_K);
        Drafter {
            index: NgramIndex::with_tokens(config.ngram(), prompt),
            length: DraftLength::new(PRIOR_PRICE),
            config,
            tree: DraftTree::new(),
            chain: Vec::with_capacity(config.num_speculative_tokens),
            draft_match: 0,
            source: None,
            classes: Vec::new(),
            calibration: Calibration::new(),
            estimates: Vec::new(),
            predictions: Arc::new(Mutex::new(PredictionTable::new(config.tree_top_k))),
            corpus: None,
            rates: TreeRates::new(),
            probes: Probes::new(),
            runs: Vec::new(),
            run_tokens: Vec::new(),
            heap: BinaryHeap::new(),
            expanded: Vec::new(),
        }
    }

    /// Starts the price of a drafted row (in plain tokens, before any pass is measured) at
    /// `price` instead of the dense-model prior [`PRIOR_PRICE`]: what a model whose rows cost more
    /// (a mixture of experts, where a drafted row reads experts of its own) knows beforehand.
    pub fn with_prior_price(mut self, price: f64) -> Self {
        self.length = DraftLength::new(price);
        self
    }

    /// Drafts also from `corpus`: method `tree` with the corpus source on, and chains under
    /// [`MatchPolicy::Scored`] (whose candidates then include the corpus's continuations).
    pub fn set_corpus(&mut self, corpus: SharedCorpus) {
        self.corpus = Some(corpus);
    }

    /// Changes the settings of [`MatchPolicy::Scored`] (see [`ScoreParams`](crate::ScoreParams)).
    pub fn set_score_params(&mut self, params: crate::ScoreParams) {
        self.index.set_score_params(params);
    }

    /// Drafts the model source from (and records into) `table`, shared with other sequences of
    /// the same tenant, instead of a table of its own.
    pub fn set_predictions(&mut self, table: SharedPredictions) {
        self.predictions = table;
    }

    /// The sequence as the drafter knows it (prompt and emitted tokens).
    pub fn tokens(&self) -> &[u32] {
        self.index.tokens()
    }

    /// Appends an emitted token.
    pub fn push(&mut self, token: u32) {
        self.index.push(token);
    }

    /// Cuts the sequence back to `len` tokens (the estimates are kept): an engine that rolled
    /// its own sequence back (a rejected draft it had appended, a regenerated turn).
    pub fn truncate(&mut self, len: usize) {
        self.index.truncate(len);
    }

    /// How many top candidates per verified row the drafter wants through
    /// [`record_predictions`](Self::record_predictions) (0: none, the model source is off).
    pub fn wants_predictions(&self) -> usize {
        if self.config.method == SpecMethod::Tree
            && self.config.tree_sources.has(Source::Model)
            && self.config.num_speculative_tokens > 0
        {
            self.config.tree_top_k
        } else {
            0
        }
    }

    /// Records the model's most likely tokens (best first) after every row of the pass that
    /// verified the current proposal: `top[0]` after the last token of the sequence, `top[i]`
    /// after node `i - 1` of the proposal. Call it before [`observe`](Self::observe), while the
    /// proposal is still known; each row is keyed by its input token and the input before it.
    pub fn record_predictions(&mut self, top: &[Vec<u32>]) {
        let tokens = self.index.tokens();
        let Some(&last) = tokens.last() else {
            return;
        };
        let before_last = tokens.len().checked_sub(2).map(|i| tokens[i]);
        let t = &self.tree;
        let mut table = lock(&self.predictions);
        for (row, top) in top.iter().enumerate() {
            let (prev, token) = match row {
                0 => (before_last, last),
                _ => {
                    let node = row - 1;
                    let prev = match t.parents()[node] {
                        ROOT => last,
                        p => t.tokens()[p as usize],
                    };
                    (Some(prev), t.tokens()[node])
                }
            };
            table.record(prev, token, top);
        }
    }

    /// The draft for the next pass: at most `limit` nodes, at most K deep (and for a tree at most
    /// `tree_max_nodes` nodes). With adaptive drafting it is cut to what is expected to pay for
    /// its rows at `price` (the cost of a drafted row in plain tokens, as a scheduler measured it
    /// for this batch; `None` uses the drafter's own estimate from
    /// [`observe_cost`](Self::observe_cost)). Empty when nothing is worth sending.
    pub fn propose(&mut self, limit: usize, price: Option<f64>) -> &DraftTree {
        self.tree.clear();
        self.classes.clear();
        self.draft_match = 0;
        let k = self.config.num_speculative_tokens.min(limit);
        if k == 0 {
            return &self.tree;
        }
        let price = price.unwrap_or(self.length.price());
        match self.config.method {
            SpecMethod::Ngram => self.propose_chain(k, price),
            SpecMethod::Tree => self.propose_tree(k, limit.min(self.config.tree_max_nodes), price),
        }
        &self.tree
    }

    fn propose_chain(&mut self, k: usize, price: f64) {
        if let Some(n) = self.find_chain(k).filter(|_| self.config.adaptive) {
            // An evidence-sized chain knows each token's estimate; other chains use the
            // acceptance measured for matches of this size.
            let keep = if !self.estimates.is_empty() {
                debug_assert_eq!(self.estimates.len(), self.chain.len());
                let paths = self.estimates.iter().map(|e| f64::from(e.path));
                self.length.choose_from_paths(price, n, paths)
            } else {
                self.length.choose_at_price(price, n, self.chain.len())
            };
            self.chain.truncate(keep);
            self.estimates.truncate(keep);
        }
        self.tree.set_chain(&self.chain, Source::Ngram);
    }

    /// The longest chain of at most `k` tokens the index proposes (in `chain`, with its
    /// estimates where evidence sized it), remembered as the step's; the size of the match
    /// behind it, or `None` (and no chain).
    fn find_chain(&mut self, k: usize) -> Option<usize> {
        self.estimates.clear();
        let found = if self.config.match_policy.is_scored() {
            let cursor = Some(self.cursor());
            let corpus = self.corpus.as_ref().map(|c| lock(c));
            let calibration = self
                .index
                .score_params()
                .calibrate
                .then_some(&self.calibration);
            scored_chain(
                &self.index,
                cursor,
                corpus.as_deref(),
                calibration,
                k,
                &mut self.chain,
                &mut self.estimates,
            )
        } else {
            self.index
                .propose_from(k, None, &mut self.chain)
                .map(|m| (m.n, Some(m.start + m.n)))
        };
        if let Some((_, Some(from))) = found {
            self.source = Some((self.index.len(), from));
        }
        match found {
            Some((n, _)) => {
                self.draft_match = n;
                Some(n)
            }
            None => {
                self.chain.clear();
                self.estimates.clear();
                None
            }
        }
    }

    /// For a scheduler that chooses the drafts of a whole batch together
    /// ([`PassCost::choose_drafts`](crate::pass_cost::PassCost::choose_drafts)): the longest
    /// chain the next pass could verify (at most `limit` tokens), kept as the step's proposal,
    /// and for each of its tokens the estimated probability that it and every token before it
    /// are accepted. Then [`keep_planned`](Self::keep_planned) cuts it to the chosen length.
    /// `None` where the drafts are not chosen this way: a tree, or lengths that do not adapt.
    pub fn candidates(&mut self, limit: usize) -> Option<Vec<f64>> {
        if self.config.method != SpecMethod::Ngram || !self.config.adaptive {
            return None;
        }
        self.tree.clear();
        self.classes.clear();
        self.draft_match = 0;
        let k = self.config.num_speculative_tokens.min(limit);
        let paths = match (k > 0).then(|| self.find_chain(k)).flatten() {
            None => {
                self.chain.clear();
                Vec::new()
            }
            Some(_) if !self.estimates.is_empty() => {
                self.estimates.iter().map(|e| f64::from(e.path)).collect()
            }
            Some(n) => self.length.paths(n, self.chain.len()).collect(),
        };
        self.tree.set_chain(&self.chain, Source::Ngram);
        Some(paths)
    }

    /// The chain of [`candidates`](Self::candidates) cut to its first `len` tokens, or to a
    /// one-token probe where `len` is 0 and the chain controller's probe is due (as
    /// [`propose`](Self::propose) would send one): the step's proposal.
    pub fn keep_planned(&mut self, len: usize) -> &DraftTree {
        let available = self.chain.len();
        let keep = self
            .length
            .or_probe(len.min(available), self.draft_match, available);
        self.chain.truncate(keep);
        self.estimates.truncate(keep);
        self.tree.set_chain(&self.chain, Source::Ngram);
        &self.tree
    }

    fn push_candidate(&mut self, c: Candidate) {
        if c.p > 0.0 {
            self.heap.push(c);
        }
    }

    /// The candidate children of `node` (holding `token` after `prev`, at `depth`, with
    /// probability `p`) from the model's prediction table.
    fn push_predictions(&mut self, node: u32, prev: Option<u32>, token: u32, depth: usize, p: f64) {
        if !self.config.tree_sources.has(Source::Model) {
            return;
        }
        let mut next = [0u32; MAX_TREE_TOP_K];
        let count = {
            let table = lock(&self.predictions);
            let found = table.get(prev, token);
            let n = found.len().min(self.config.tree_top_k);
            next[..n].copy_from_slice(&found[..n]);
            n
        };
        for (rank, &t) in next[..count].iter().enumerate() {
            let r = self.rates.rate(Source::Model, rank, depth + 1);
            self.push_candidate(Candidate {
                p: p * r,
                parent: node,
                token: t,
                source: Source::Model,
                class: rank as u8,
                depth: (depth + 1) as u16,
                run: None,
            });
        }
    }

    fn propose_tree(&mut self, k: usize, max_nodes: usize, price: f64) {
        self.heap.clear();
        self.runs.clear();
        self.run_tokens.clear();
        self.expanded.clear();
        let Some(&last) = self.index.tokens().last() else {
            return;
        };
        // Copied runs: every earlier continuation of the suffix, in the sequence and the corpus.
        let (runs, run_tokens) = (&mut self.runs, &mut self.run_tokens);
        let mut add_run = |source: Source, n: usize, tokens: &[u32]| {
            runs.push(Run {
                start: run_tokens.len() as u32,
                len: tokens.len() as u16,
                source,
                class: n as u8,
            });
            run_tokens.extend_from_slice(tokens);
        };
        let tokens = self.index.tokens();
        if self.config.tree_sources.has(Source::Ngram) {
            self.index.for_each_occurrence(MAX_OCCURRENCES, |n, from| {
                add_run(
                    Source::Ngram,
                    n,
                    &tokens[from..(from + k).min(tokens.len())],
                );
                true
            });
        }
        if let (true, Some(corpus)) = (
            self.config.tree_sources.has(Source::Corpus),
            self.corpus.as_ref(),
        ) {
            let suffix = &tokens[tokens.len().saturating_sub(MAX_NGRAM)..];
            lock(corpus).for_each_continuation(suffix, k, MAX_OCCURRENCES, |n, run| {
                add_run(Source::Corpus, n, run);
                true
            });
        }
        for i in 0..self.runs.len() {
            let run = self.runs[i];
            self.push_candidate(Candidate {
                p: self.rates.rate(run.source, run.class as usize, 1),
                parent: ROOT,
                token: self.run_tokens[run.start as usize],
                source: run.source,
                class: run.class,
                depth: 1,
                run: Some((i as u32, 0)),
            });
        }
        let before_last = self.index.tokens().iter().rev().nth(1).copied();
        self.push_predictions(ROOT, before_last, last, 0, 1.0);

        // Best first: a node's probability is at most its parent's, so the chosen set is closed
        // under parents. Add while a node pays for its row at the current rate of tokens per cost.
        let mut expected = 1.0; // tokens per pass: the model's own, plus the accepted nodes
        let mut best_first = None;
        while let Some(c) = self.heap.pop() {
            best_first.get_or_insert(c);
            let rows = self.tree.len() as f64;
            let rate = expected / (1.0 + price * rows);
            let existing = self.tree.child(c.parent, c.token);
            let full = self.tree.len() >= max_nodes;
            if existing.is_none() && (full || (self.config.adaptive && c.p <= price * rate)) {
                // Everything left in the heap is less likely still.
                break;
            }
            let node = match existing {
                Some(n) => n,
                None => {
                    expected += c.p;
                    self.classes.push(c.class);
                    self.expanded.push(false);
                    self.tree.push(c.token, c.parent, c.source)
                }
            };
            let depth = c.depth as usize;
            if depth >= k {
                continue;
            }
            if let Some((i, off)) = c.run {
                let run = self.runs[i as usize];
                if off + 1 < run.len {
                    let r = self.rates.rate(run.source, run.class as usize, depth + 1);
                    self.push_candidate(Candidate {
                        p: c.p * r,
                        parent: node as u32,
                        token: self.run_tokens[(run.start + u32::from(off) + 1) as usize],
                        source: run.source,
                        class: run.class,
                        depth: (depth + 1) as u16,
                        run: Some((i, off + 1)),
                    });
                }
            }
            if !self.expanded[node] {
                self.expanded[node] = true;
                let prev = match c.parent {
                    ROOT => last,
                    p => self.tree.tokens()[p as usize],
                };
                self.push_predictions(node as u32, Some(prev), c.token, depth, c.p);
            }
        }
        let gain = expected / (1.0 + price * self.tree.len() as f64);
        if self.config.adaptive && gain < 1.0 + MIN_GAIN {
            self.tree.clear();
            self.classes.clear();
            // Nothing pays: now and then send the single best node, so that estimates that are
            // too low (or a price too high) can be corrected by evidence.
            if let (Some(c), true) = (best_first, self.probes.due()) {
                self.classes.push(c.class);
                self.tree.push(c.token, ROOT, c.source);
            }
        }
    }

    /// The cursor of a scored chain (see [`NgramIndex::propose_from`]): the last chain drafted
    /// from the sequence copied the continuation at `from` when the sequence had `then` tokens;
    /// the tokens emitted since agree with that continuation for some count `m`, so the copy
    /// stands at `from + m` (steps without a match, or drafted from the corpus, leave it there).
    /// Before any such chain, or after a rewind past it, the start of the sequence.
    fn cursor(&self) -> usize {
        let tokens = self.index.tokens();
        match self.source {
            Some((then, from)) if then <= tokens.len() && from <= tokens.len() => {
                let agree = tokens[then..]
                    .iter()
                    .zip(&tokens[from..])
                    .take_while(|(a, b)| a == b)
                    .count();
                from + agree
            }
            _ => 0,
        }
    }

    /// Keeps only the first `len` nodes of the last proposal, because only they were sent (an
    /// engine's grammar forbade the next): the cut nodes were never verified, so they count as
    /// neither accepted nor rejected.
    pub fn keep_first(&mut self, len: usize) {
        if len < self.tree.len() {
            self.tree.truncate(len);
            self.classes.truncate(len);
            self.estimates.truncate(len);
        }
    }

    /// Records the verified outcome of the last proposal: `path` is the accepted nodes, from the
    /// root's child down (for a chain, `0..accepted`). A step whose proposal was empty counts as
    /// a step without a draft.
    pub fn observe(&mut self, path: &[usize]) {
        let drafted = self.tree.len();
        match self.config.method {
            SpecMethod::Ngram if drafted == 0 => self.length.idle(),
            SpecMethod::Ngram => {
                let accepted = path.len().min(drafted);
                self.length.observe(self.draft_match, drafted, accepted);
                let estimates = &self.estimates[..self.estimates.len().min(drafted)];
                self.calibration.observe(estimates, accepted);
            }
            SpecMethod::Tree if drafted == 0 => self.probes.idle(),
            SpecMethod::Tree => {
                // A node was tried if its parent was accepted (or is the root).
                let on_path = |n: u32| path.contains(&(n as usize));
                let t = &self.tree;
                for i in 0..drafted {
                    let p = t.parents()[i];
                    if p == ROOT || on_path(p) {
                        let (class, depth) = (self.classes[i] as usize, t.depths()[i] as usize);
                        self.rates
                            .observe(t.sources()[i], class, depth, on_path(i as u32));
                    }
                }
                self.probes.sent(!path.is_empty());
            }
        }
        self.tree.clear();
        self.classes.clear();
        self.estimates.clear();
    }

    /// Records what a pass over `rows` rows cost (seconds, or relative to one row), refining the
    /// drafter's own price of a drafted row.
    pub fn observe_cost(&mut self, rows: usize, seconds: f64) {
        self.length.observe_cost(rows, seconds);
    }

    /// The chain controller's estimates (acceptance by n-gram size, price of a row).
    #[cfg(test)]
    fn length(&self) -> &DraftLength {
        &self.length
    }

    /// Estimated probability that a node from `source` (class: n-gram size or rank) at `depth`
    /// is accepted once its parent is.
    #[cfg(test)]
    fn tree_rate(&self, source: Source, class: usize, depth: usize) -> f64 {
        self.rates.rate(source, class, depth)
    }
}

#[cfg(test)]
mod tests;
