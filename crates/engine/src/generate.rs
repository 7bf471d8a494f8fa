//! The generation loop. A `Sequence` is one request's state (tokens, KV cache, drafter,
//! sampler, stop rules, statistics); `step` advances any set of sequences by one forward pass, each
//! with its own prompt chunk or its own [last token + drafts]. `generate` is `step` over a batch of
//! one; the server drives the same `step` over many.

use crate::error::{EngineError, Result};
use crate::grammar::{Constraint, ResponseFormat};
use crate::kv_cache::KvCache;
use crate::model::{BatchItem, Model, TREE_ROOT};
use crate::sampling::SamplingParams;
use crate::tokenizer::{TextStream, Tokenizer};
use crate::verify::{verify, verify_tree};
use drafting::{DraftTree, Drafter, Source, SpecConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Prompt tokens fed per forward pass during prefill.
pub const PREFILL_CHUNK: usize = 256;

/// Settings of one generation, named as in Hugging Face's `GenerationConfig` where it has them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerationConfig {
    pub max_new_tokens: usize,
    #[serde(flatten)]
    pub sampling: SamplingParams,
    pub seed: Option<u64>,
    /// How to draft (`num_speculative_tokens` = 0 turns speculation off).
    pub speculation: SpecConfig,
    /// Strings that end generation; they are not part of the output text.
    pub stop: Vec<String>,
    /// Record each generated token's log-probability under the model (before temperature and
    /// the other sampling settings), with this many of the most likely alternatives; `None`
    /// records nothing.
    pub logprobs: Option<usize>,
    /// What the output must be (free text, any JSON object, JSON matching a schema).
    #[serde(default, skip_serializing_if = "ResponseFormat::is_text")]
    pub response_format: ResponseFormat,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        GenerationConfig {
            max_new_tokens: 256,
            sampling: SamplingParams::default(),
            seed: None,
            speculation: SpecConfig::default(),
            stop: Vec::new(),
            logprobs: None,
            response_format: ResponseFormat::Text,
        }
    }
}

impl GenerationConfig {
    pub fn validate(&self) -> Result<()> {
        self.sampling
            .validate()
            .map_err(|e| EngineError::InvalidConfig(e.message))?;
        if self.max_new_tokens == 0 {
            return Err(EngineError::InvalidConfig(
                "max_new_tokens must be at least 1".into(),
            ));
        }
        self.speculation
            .validate()
            .map_err(|e| EngineError::InvalidConfig(e.to_string()))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_new_tokens` reached, or the context is full.
    Length,
}

/// What speculation did during one generation.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SpecStats {
    /// Forward passes while decoding (prefill excluded).
    pub steps: usize,
    /// Tokens drafted and sent to verification.
    pub draft_tokens: usize,
    /// Drafted tokens the verifier kept.
    pub accepted_tokens: usize,
    /// Tokens emitted by decode steps (every token but the first, which prefill yields).
    pub decode_tokens: usize,
    /// Drafted tokens by the source that proposed them.
    pub drafted_by_source: BySource,
    /// Accepted drafted tokens by the source that proposed them.
    pub accepted_by_source: BySource,
    #[serde(skip)]
    pub propose_time: Duration,
}

/// A count per draft source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BySource {
    pub ngram: usize,
    pub model: usize,
    pub corpus: usize,
}

impl BySource {
    pub fn get_mut(&mut self, source: Source) -> &mut usize {
        match source {
            Source::Ngram => &mut self.ngram,
            Source::Model => &mut self.model,
            Source::Corpus => &mut self.corpus,
        }
    }

    pub fn add(&mut self, other: &BySource) {
        self.ngram += other.ngram;
        self.model += other.model;
        self.corpus += other.corpus;
    }

    /// What was counted since `earlier` (a copy of these counts taken before).
    pub fn since(&self, earlier: &BySource) -> BySource {
        BySource {
            ngram: self.ngram - earlier.ngram,
            model: self.model - earlier.model,
            corpus: self.corpus - earlier.corpus,
        }
    }
}

impl SpecStats {
    pub fn acceptance_rate(&self) -> f64 {
        if self.draft_tokens == 0 {
            0.0
        } else {
            self.accepted_tokens as f64 / self.draft_tokens as f64
        }
    }

    /// Tokens per decoding forward pass (1.0 for plain decoding).
    pub fn mean_accepted_tokens(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.decode_tokens as f64 / self.steps as f64
        }
    }

    pub fn propose_us_per_step(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.propose_time.as_secs_f64() * 1e6 / self.steps as f64
        }
    }
}

enum Phase {
    /// Prompt tokens fed so far.
    Prefill(usize),
    /// The last emitted token, not yet in the cache.
    Decode(u32),
    Finished(FinishReason),
}

pub struct Sequence {
    tokens: Vec<u32>,
    prompt_len: usize,
    cache: KvCache,
    /// Present when the config drafts.
    drafter: Option<Drafter>,
    /// Upper bound on drafted tokens per step set by a scheduler (load-dependent).
    draft_limit: usize,
    /// Price of a drafted row set by a scheduler, overriding the sequence's own estimate.
    draft_cost: Option<f64>,
    config: GenerationConfig,
    rng: ChaCha8Rng,
    phase: Phase,
    stream: TextStream,
    /// Output text, stop strings removed; `text[..released]` has been handed out.
    text: String,
    released: usize,
    /// Log-probabilities of the generated tokens (when asked for); `logprobs[..lp_released]`
    /// have been handed out.
    logprobs: Vec<TokenLogprob>,
    lp_released: usize,
    pub stats: SpecStats,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    /// The grammar of `config.response_format`, compiled when the prompt is in.
    constraint: Option<Constraint>,
}

impl Sequence {
    /// A new sequence over `prompt` with a KV cache of `context_len` positions (at most the
    /// model's own context).
    pub fn new(
        model: &Model,
        prompt: Vec<u32>,
        config: GenerationConfig,
        context_len: usize,
    ) -> Result<Self> {
        config.validate()?;
        let capacity = context_len.min(model.config.context_len);
        if prompt.is_empty() {
            return Err(EngineError::InvalidConfig("the prompt is empty".into()));
        }
        if prompt.len() >= capacity {
            return Err(EngineError::PromptTooLong {
                prompt_tokens: prompt.len(),
                context_len: capacity,
            });
        }
        if let Some(&bad) = prompt
            .iter()
            .find(|&&t| t as usize >= model.config.vocab_size)
        {
            return Err(EngineError::InvalidConfig(format!(
                "prompt token {bad} is outside the vocabulary of {}",
                model.config.vocab_size
            )));
        }
        let drafter = if config.speculation.enabled() {
            // Under a grammar drafts are chains: each is cut at its first forbidden token.
            let spec = if config.response_format.is_text() {
                config.speculation
            } else {
                SpecConfig {
                    method: drafting::SpecMethod::Ngram,
                    ..config.speculation
                }
            };
            let d = Drafter::new(&spec, &prompt)
                .map_err(|e| EngineError::InvalidConfig(e.to_string()))?;
            Some(d)
        } else {
            None
        };
        let rng = match config.seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s),
            None => ChaCha8Rng::from_os_rng(),
        };
        Ok(Sequence {
            prompt_len: prompt.len(),
            tokens: prompt,
            cache: model.new_cache(capacity),
            drafter,
            draft_limit: usize::MAX,
            draft_cost: None,
            config,
            rng,
            phase: Phase::Prefill(0),
            stream: TextStream::default(),
            text: String::new(),
            released: 0,
            logprobs: Vec::new(),
            lp_released: 0,
            stats: SpecStats::default(),
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            constraint: None,
        })
    }

    /// Compiles the sequence's grammar when it has one and has not yet (when its prompt is in).
    /// A grammar that does not compile ends the sequence; callers check formats beforehand
    /// (`Tokenizer::grammar`), so this only guards against the unexpected.
    fn ensure_constraint(&mut self, tok: &Tokenizer, vocab: usize) {
        if self.constraint.is_some() || self.config.response_format.is_text() {
            return;
        }
        match tok
            .grammar(vocab)
            .and_then(|g| g.compile(&self.config.response_format))
        {
            Ok(c) => self.constraint = c,
            Err(e) => {
                tracing::error!("ending a sequence whose grammar does not compile: {e}");
                self.phase = Phase::Finished(FinishReason::Stop);
            }
        }
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Finished(_))
    }

    pub fn finish_reason(&self) -> Option<FinishReason> {
        match self.phase {
            Phase::Finished(r) => Some(r),
            _ => None,
        }
    }

    /// Stops the sequence (a client went away); its cache can be dropped with it.
    pub fn cancel(&mut self) {
        if !self.is_finished() {
            self.phase = Phase::Finished(FinishReason::Stop);
        }
    }

    /// A new sequence over the same prompt and settings (with `seed`), sharing this one's prompt
    /// cache: the keys and values of all but the last prompt token are copied, and the fork's
    /// first pass runs that last token alone, giving it its own first token. For `n` choices of
    /// one request, prefilled once. `None` until this sequence's prompt is in the cache.
    pub fn fork(&self, model: &Model, seed: Option<u64>) -> Result<Option<Sequence>> {
        if self.in_prefill() {
            return Ok(None);
        }
        let config = GenerationConfig {
            seed,
            ..self.config.clone()
        };
        let prompt = self.prompt_tokens().to_vec();
        let mut fork = Sequence::new(model, prompt, config, self.cache.capacity())?;
        let shared = self.prompt_len - 1;
        fork.cache.copy_prefix(&self.cache, shared);
        fork.phase = Phase::Prefill(shared);
        Ok(Some(fork))
    }

    /// Lets the drafter draw on what a tenant's earlier requests left: their prompts and outputs
    /// (the corpus source) and the model's predictions on them (the model source). Used when the
    /// method is `tree` with those sources on.
    pub fn set_tenant_sources(
        &mut self,
        corpus: drafting::SharedCorpus,
        predictions: drafting::SharedPredictions,
    ) {
        if let Some(d) = self.drafter.as_mut() {
            d.set_corpus(corpus);
            d.set_predictions(predictions);
        }
    }

    /// Caps the drafted tokens per step below the configured K (a scheduler's load control).
    pub fn set_draft_limit(&mut self, limit: usize) {
        self.draft_limit = limit;
    }

    /// The price of a drafted row in plain tokens, as a scheduler measured it for the current
    /// batch (`PassCost::draft_token_cost`); `None` lets the sequence use its own estimate.
    pub fn set_draft_cost(&mut self, cost: Option<f64>) {
        self.draft_cost = cost;
    }

    /// Whether the prompt is still being fed (the next pass is not a decode step).
    pub fn in_prefill(&self) -> bool {
        matches!(self.phase, Phase::Prefill(_))
    }

    pub fn prompt_tokens(&self) -> &[u32] {
        &self.tokens[..self.prompt_len]
    }

    pub fn generated_tokens(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn config(&self) -> &GenerationConfig {
        &self.config
    }

    /// Text produced since the last call that can no longer change (a possible start of a stop
    /// string is held back until it is decided).
    pub fn take_new_text(&mut self) -> String {
        let safe = if self.is_finished() {
            self.text.len()
        } else {
            safe_len(&self.text, &self.config.stop)
        };
        if safe <= self.released {
            return String::new();
        }
        let out = self.text[self.released..safe].to_string();
        self.released = safe;
        out
    }

    /// Log-probabilities recorded since the last call (empty unless the config asks for them).
    pub fn take_new_logprobs(&mut self) -> Vec<TokenLogprob> {
        let out = self.logprobs[self.lp_released..].to_vec();
        self.lp_released = self.logprobs.len();
        out
    }

    /// Appends one emitted token predicted by logits row `row`; returns false once the sequence
    /// has finished.
    fn emit(&mut self, tok: &Tokenizer, token: u32, row: &[f32]) -> bool {
        if let (Some(top), false) = (self.config.logprobs, tok.is_end(token)) {
            self.logprobs
                .push(TokenLogprob::from_logits(row, token, top));
        }
        self.tokens.push(token);
        if let Some(d) = self.drafter.as_mut() {
            d.push(token);
        }
        if let Some(c) = self.constraint.as_mut() {
            c.consume(&[token]);
        }
        let generated = self.tokens.len() - self.prompt_len;
        if tok.is_end(token) {
            self.text.push_str(&self.stream.finish());
            self.phase = Phase::Finished(FinishReason::Stop);
            return false;
        }
        let before = self.text.len();
        self.text
            .push_str(&self.stream.push(tok.token_bytes(token)));
        if let Some(cut) = find_stop(&self.text, before, &self.config.stop) {
            self.text.truncate(cut);
            self.phase = Phase::Finished(FinishReason::Stop);
            return false;
        }
        if generated >= self.config.max_new_tokens || self.tokens.len() >= self.cache.capacity() {
            self.text.push_str(&self.stream.finish());
            self.phase = Phase::Finished(FinishReason::Length);
            return false;
        }
        self.phase = Phase::Decode(token);
        true
    }
}

/// Where the first stop string occurs in `text`, looking only at matches that end after `from`.
fn find_stop(text: &str, from: usize, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| {
            let start = from.saturating_sub(s.len() - 1);
            let start = (start..=from).find(|&i| text.is_char_boundary(i))?;
            text[start..].find(s.as_str()).map(|p| start + p)
        })
        .min()
}

/// The length of `text` that cannot become part of a stop string: the longest suffix that is a
/// prefix of a stop string is held back.
fn safe_len(text: &str, stops: &[String]) -> usize {
    let mut safe = text.len();
    for s in stops {
        for (i, _) in text.char_indices().rev().take(s.chars().count()) {
            if s.starts_with(&text[i..]) {
                safe = safe.min(i);
            }
        }
    }
    safe
}

/// One sequence's inputs to a pass.
struct PassInput {
    seq: usize,
    tokens: Vec<u32>,
    /// The drafted tree (empty for prefill and plain decoding).
    tree: DraftTree,
    /// Row parents for the model when the tree is not a chain (see `BatchItem::parents`).
    parents: Vec<u32>,
}

/// Advances every unfinished sequence by one forward pass: a prompt chunk for those still in
/// prefill, the last token plus its draft (a chain or a tree) for those decoding.
pub fn step(model: &Model, tok: &Tokenizer, seqs: &mut [&mut Sequence]) -> Result<()> {
    let started = Instant::now();
    let mut inputs: Vec<PassInput> = Vec::new();
    for (si, seq) in seqs.iter_mut().enumerate() {
        match seq.phase {
            Phase::Finished(_) => {}
            Phase::Prefill(done) => {
                let end = (done + PREFILL_CHUNK).min(seq.prompt_len);
                inputs.push(PassInput {
                    seq: si,
                    tokens: seq.tokens[done..end].to_vec(),
                    tree: DraftTree::new(),
                    parents: Vec::new(),
                });
            }
            Phase::Decode(last) => {
                let generated = seq.tokens.len() - seq.prompt_len;
                // Room left: the pass writes 1 + nodes positions, and at most max_new_tokens
                // tokens may still be emitted (the model's own token is one of them).
                let room = seq.cache.capacity() - seq.cache.len() - 1;
                let left = seq.config.max_new_tokens - generated - 1;
                let limit = seq.draft_limit.min(room).min(left);
                let price = seq.draft_cost;
                let mut tree = match seq.drafter.as_mut().filter(|_| limit > 0) {
                    Some(d) => {
                        let t0 = Instant::now();
                        let tree = d.propose(limit, price).clone();
                        seq.stats.propose_time += t0.elapsed();
                        tree
                    }
                    None => DraftTree::new(),
                };
                if let Some(c) = seq.constraint.as_mut() {
                    // A chain (the drafter proposes chains under a grammar), cut before its first
                    // token the grammar forbids and before any end token.
                    let chain = tree.tokens();
                    let free = chain
                        .iter()
                        .position(|&t| tok.is_end(t))
                        .unwrap_or(chain.len());
                    let keep = c.valid_prefix(&chain[..free]);
                    tree.truncate(keep);
                    if let Some(d) = seq.drafter.as_mut() {
                        d.keep_first(keep);
                    }
                }
                let mut tokens = Vec::with_capacity(tree.len() + 1);
                tokens.push(last);
                tokens.extend_from_slice(tree.tokens());
                let parents = if tree.is_chain() {
                    Vec::new()
                } else {
                    std::iter::once(TREE_ROOT)
                        .chain(tree.parents().iter().map(|&p| p.wrapping_add(1)))
                        .collect()
                };
                inputs.push(PassInput {
                    seq: si,
                    tokens,
                    tree,
                    parents,
                });
            }
        }
    }
    if inputs.is_empty() {
        return Ok(());
    }
    let logits = {
        let mut items: Vec<BatchItem<'_>> = Vec::with_capacity(inputs.len());
        let mut pending = inputs.iter().peekable();
        for (si, seq) in seqs.iter_mut().enumerate() {
            if let Some(input) = pending.next_if(|i| i.seq == si) {
                let all_logits = matches!(seq.phase, Phase::Decode(_));
                items.push(BatchItem {
                    tokens: &input.tokens,
                    cache: &mut seq.cache,
                    all_logits,
                    parents: &input.parents,
                });
            }
        }
        model.forward(&mut items)?
    };
    let elapsed = started.elapsed();
    let alone = inputs.len() == 1;
    let vocab = model.config.vocab_size;
    let mut row = 0;
    for input in inputs {
        let PassInput {
            seq: si,
            tokens: toks,
            tree,
            ..
        } = input;
        let seq = &mut *seqs[si];
        match seq.phase {
            Phase::Prefill(done) => {
                seq.prefill_time += elapsed;
                let done = done + toks.len();
                let last_row = &logits[row * vocab..(row + 1) * vocab];
                row += 1;
                if done < seq.prompt_len {
                    seq.phase = Phase::Prefill(done);
                    continue;
                }
                // The prompt is in: its last row gives the first new token.
                seq.ensure_constraint(tok, vocab);
                if seq.is_finished() {
                    continue;
                }
                let masked;
                let chosen_from = match seq.constraint.as_mut() {
                    Some(c) => {
                        masked = {
                            let mut r = last_row.to_vec();
                            c.mask(&mut r);
                            r
                        };
                        &masked[..]
                    }
                    None => last_row,
                };
                let verdict = verify(
                    chosen_from,
                    vocab,
                    &[],
                    &seq.tokens,
                    &seq.config.sampling,
                    &mut seq.rng,
                );
                seq.emit(tok, verdict.tokens[0], last_row);
            }
            Phase::Decode(_) => {
                seq.decode_time += elapsed;
                let rows = &logits[row * vocab..(row + toks.len()) * vocab];
                row += toks.len();
                let start = seq.cache.len() - toks.len();
                let verdict = match seq.constraint.as_mut() {
                    Some(c) => {
                        // Each row masked by the grammar state after the drafts before it; under
                        // greedy only the rows the walk reaches (the chain is cut where the
                        // model's constrained choice leaves it, which changes no verdict).
                        let params = &seq.config.sampling;
                        let mut context = if params.repetition_penalty != 1.0 {
                            seq.tokens.clone()
                        } else {
                            Vec::new()
                        };
                        let drafts = tree.tokens().to_vec();
                        let mut choose = |row: &[f32], i: usize| {
                            if i > 0 && params.repetition_penalty != 1.0 {
                                context.push(drafts[i - 1]);
                            }
                            crate::sampling::greedy(row, &context, params)
                        };
                        let chooser: Option<&mut crate::grammar::Chooser<'_>> =
                            if params.is_greedy() {
                                Some(&mut choose)
                            } else {
                                None
                            };
                        let (masked, verified) = c.masked_rows(rows, vocab, &drafts, chooser);
                        let mut checked = tree.clone();
                        checked.truncate(verified);
                        verify_tree(
                            &masked,
                            vocab,
                            &checked,
                            &seq.tokens,
                            &seq.config.sampling,
                            &mut seq.rng,
                        )
                    }
                    None => verify_tree(
                        rows,
                        vocab,
                        &tree,
                        &seq.tokens,
                        &seq.config.sampling,
                        &mut seq.rng,
                    ),
                };
                // The rows whose logits predicted each emitted token: the root's, then each
                // accepted node's. Keep the cache for the root and the accepted path only.
                let kept: Vec<usize> = std::iter::once(0)
                    .chain(verdict.path.iter().map(|&n| n + 1))
                    .collect();
                seq.cache.keep_rows(start, &kept);
                seq.stats.steps += 1;
                seq.stats.draft_tokens += tree.len();
                seq.stats.accepted_tokens += verdict.accepted();
                for &s in tree.sources() {
                    *seq.stats.drafted_by_source.get_mut(s) += 1;
                }
                for &n in &verdict.path {
                    *seq.stats.accepted_by_source.get_mut(tree.sources()[n]) += 1;
                }
                if let Some(d) = seq.drafter.as_mut() {
                    let k = d.wants_predictions();
                    if k > 0 {
                        let top: Vec<Vec<u32>> =
                            rows.chunks_exact(vocab).map(|r| top_ids(r, k)).collect();
                        d.record_predictions(&top);
                    }
                    d.observe(&verdict.path);
                    // Timings vary from run to run: they may steer draft lengths only where the
                    // output cannot depend on them (greedy), so seeded sampling stays
                    // reproducible. A pass shared with other sequences says nothing about this
                    // one's draft cost.
                    if seq.config.sampling.is_greedy() && alone {
                        d.observe_cost(toks.len(), elapsed.as_secs_f64());
                    }
                }
                for (&t, &r) in verdict.tokens.iter().zip(&kept) {
                    seq.stats.decode_tokens += 1;
                    if !seq.emit(tok, t, &rows[r * vocab..(r + 1) * vocab]) {
                        break;
                    }
                }
            }
            Phase::Finished(_) => unreachable!("finished sequences have no inputs"),
        }
    }
    Ok(())
}

/// The ids of the `k` largest logits of `row`, largest first.
fn top_ids(row: &[f32], k: usize) -> Vec<u32> {
    top_logits(row, k).into_iter().map(|(i, _)| i).collect()
}

/// The `k` largest logits of `row` with their ids, largest first.
fn top_logits(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    for (i, &l) in row.iter().enumerate() {
        if best.len() < k || l > best[best.len() - 1].1 {
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (i as u32, l));
            best.truncate(k);
        }
    }
    best
}

/// A generated token's log-probability, and the most likely tokens at its position.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// From the logits row that predicted `token`: a log-softmax over the whole vocabulary.
    pub fn from_logits(logits: &[f32], token: u32, top: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let norm = max + sum.ln() as f32;
        let best = top_logits(logits, top);
        TokenLogprob {
            token,
            logprob: logits[token as usize] - norm,
            top: best.into_iter().map(|(i, l)| (i, l - norm)).collect(),
        }
    }
}

/// Everything a finished generation reports.
#[derive(Clone, Debug, Serialize)]
pub struct GenerationOutput {
    pub text: String,
    pub token_ids: Vec<u32>,
    /// Per generated token, when `GenerationConfig::logprobs` asked for them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<TokenLogprob>,
    pub prompt_token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub stats: SpecStats,
    #[serde(skip)]
    pub prefill_time: Duration,
    #[serde(skip)]
    pub decode_time: Duration,
}

impl GenerationOutput {
    pub fn decode_tokens_per_s(&self) -> f64 {
        let t = self.decode_time.as_secs_f64();
        if t > 0.0 {
            self.stats.decode_tokens as f64 / t
        } else {
            0.0
        }
    }

    pub fn prefill_tokens_per_s(&self) -> f64 {
        let t = self.prefill_time.as_secs_f64();
        if t > 0.0 {
            self.prompt_token_ids.len() as f64 / t
        } else {
            0.0
        }
    }
}

impl Sequence {
    pub fn into_output(self) -> GenerationOutput {
        GenerationOutput {
            text: self.text,
            token_ids: self.tokens[self.prompt_len..].to_vec(),
            logprobs: self.logprobs,
            prompt_token_ids: self.tokens[..self.prompt_len].to_vec(),
            finish_reason: match self.phase {
                Phase::Finished(r) => r,
                _ => FinishReason::Length,
            },
            stats: self.stats,
            prefill_time: self.prefill_time,
            decode_time: self.decode_time,
        }
    }
}

/// Generates from `prompt` (token ids), handing text to `on_text` as it is accepted.
pub fn generate(
    model: &Model,
    tok: &Tokenizer,
    prompt: Vec<u32>,
    config: GenerationConfig,
    context_len: usize,
    mut on_text: impl FnMut(&str),
) -> Result<GenerationOutput> {
    if !config.response_format.is_text() {
        // A schema that does not compile is an error now rather than an empty answer.
        tok.grammar(model.config.vocab_size)?
            .compile(&config.response_format)?;
    }
    let mut seq = Sequence::new(model, prompt, config, context_len)?;
    while !seq.is_finished() {
        step(model, tok, &mut [&mut seq])?;
        let t = seq.take_new_text();
        if !t.is_empty() {
            on_text(&t);
        }
    }
    Ok(seq.into_output())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_found_across_pushes() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        assert_eq!(find_stop("abcEN", 3, &stops), None);
        assert_eq!(find_stop("abcEND", 5, &stops), Some(3));
        assert_eq!(find_stop("a\n\nb", 2, &stops), Some(1));
        assert_eq!(safe_len("abcEN", &stops), 3);
        assert_eq!(safe_len("abc\n", &stops), 3);
        assert_eq!(safe_len("abc", &stops), 3);
        assert_eq!(safe_len("héE", &stops), "hé".len());
    }
}
