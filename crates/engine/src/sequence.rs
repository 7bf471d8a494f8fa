//! `Sequence`: one request's state between passes, what it hands out (text that can no longer
//! change, log-probabilities, the final output), and its side of a pass: what it sends
//! (`pass_input`: a prompt chunk, or its last token and a draft) and what it does with its logits
//! rows (`prefilled`, `decoded`: verify the draft, keep the accepted path, teach the drafter).
//! `step` runs the pass over all of them.

use crate::error::{EngineError, Result};
use crate::generation::{FinishReason, GenerationConfig, GenerationOutput};
use crate::grammar::Constraint;
use crate::kv_cache::KvCache;
use crate::logprobs::{top_ids, TokenLogprob};
use crate::model::Model;
use crate::prefix_cache::PrefixCache;
use crate::stats::SpecStats;
use crate::tokenizer::{TextStream, Tokenizer};
use crate::verify::constrained::{first_token, verify_constrained};
use crate::verify::{verify, verify_tree};
use drafting::{path_rows, DraftTree, Drafter, SpecConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

/// Where a sequence is.
pub(crate) enum Phase {
    /// Prompt tokens fed so far.
    Prefill(usize),
    /// The last emitted token, not yet in the cache.
    Decode(u32),
    /// Resuming after a preemption (`Sequence::preempt`): tokens `..done` are back in the cache,
    /// the rest before `last` (its last emitted token) are being recomputed; then `Decode(last)`.
    Refill {
        done: usize,
        last: u32,
    },
    Finished(FinishReason),
}

/// One request's state: its tokens and KV cache, drafter, sampler, stop rules, output text and
/// statistics. `step` advances it; `take_new_text` hands out what can no longer change.
pub struct Sequence {
    pub(crate) tokens: Vec<u32>,
    pub(crate) prompt_len: usize,
    /// Prompt tokens whose keys and values came from a prefix cache rather than a pass.
    pub(crate) cached_tokens: usize,
    /// Prompt positions already offered to a prefix cache (`keep_prompt`).
    pub(crate) prompt_offered: usize,
    pub(crate) cache: KvCache,
    /// Positions this sequence can reach: its prompt and `max_new_tokens` more, within its
    /// context. The cache starts smaller and grows toward it (`make_room`).
    pub(crate) reach: usize,
    /// Present when the config drafts.
    pub(crate) drafter: Option<Drafter>,
    /// Upper bound on drafted tokens per step set by a scheduler (load-dependent).
    pub(crate) draft_limit: usize,
    /// Price of a drafted row set by a scheduler, overriding the sequence's own estimate.
    pub(crate) draft_price: Option<f64>,
    /// This step's draft length where the batch's drafts were chosen together (`plan_drafts`).
    pub(crate) planned: Option<usize>,
    pub(crate) config: GenerationConfig,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) phase: Phase,
    pub(crate) stream: TextStream,
    /// Output text, stop strings removed; `text[..released]` has been handed out.
    pub(crate) text: String,
    pub(crate) released: usize,
    /// Log-probabilities of the generated tokens (when asked for); `logprobs[..lp_released]`
    /// have been handed out.
    pub(crate) logprobs: Vec<TokenLogprob>,
    pub(crate) lp_released: usize,
    /// Which of `config.stop` ended the output, if one did.
    pub(crate) stopped_by: Option<usize>,
    pub stats: SpecStats,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    /// The grammar of `config.response_format`, compiled when the prompt is in.
    pub(crate) constraint: Option<Constraint>,
    /// Under a memory budget (`kv_budget`): drafts stay within the cache's capacity, which only
    /// `Sequence::grow` enlarges, so that a pass never takes memory the budget did not grant.
    pub(crate) budgeted: bool,
    /// Times this sequence was preempted (its cache given up, recomputed when it resumed).
    pub preemptions: usize,
}

impl Sequence {
    /// A new sequence over `prompt` within `context_len` positions (at most the model's own
    /// context), its KV cache sized to what it can reach: the prompt and `max_new_tokens` more.
    pub fn new(
        model: &Model,
        prompt: Vec<u32>,
        config: GenerationConfig,
        context_len: usize,
    ) -> Result<Self> {
        Sequence::with_first_room(model, prompt, config, context_len, FIRST_ROOM, None)
    }

    /// `new`, its cache taken from `spare` (an ended sequence's, `take_cache`) where that holds
    /// enough, instead of a new one: a server reuses caches from one request to the next, so
    /// that their memory is not given back and committed again (page faults that cost seconds
    /// on a VM). What a spare held past its new length is never read as a position: such rows
    /// are the ones rejected drafts leave behind in any cache. `spare` is dropped if unused.
    pub fn reusing(
        model: &Model,
        prompt: Vec<u32>,
        config: GenerationConfig,
        context_len: usize,
        spare: Option<KvCache>,
    ) -> Result<Self> {
        Sequence::with_first_room(model, prompt, config, context_len, FIRST_ROOM, spare)
    }

    /// An ended sequence's cache, for `reusing` (this sequence is left with an empty one).
    pub fn take_cache(&mut self) -> KvCache {
        let empty = KvCache::new(self.cache.shape(), 0);
        std::mem::replace(&mut self.cache, empty)
    }

    /// `new`, the cache first holding the prompt and `first_room` more positions.
    pub(crate) fn with_first_room(
        model: &Model,
        prompt: Vec<u32>,
        config: GenerationConfig,
        context_len: usize,
        first_room: usize,
        spare: Option<KvCache>,
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
            let drafter = Drafter::new(&spec, &prompt);
            Some(match model.draft_price_prior() {
                Some(price) => drafter.with_prior_price(price),
                None => drafter,
            })
        } else {
            None
        };
        // The cache holds the prompt and room for `first_room` more positions, and grows as
        // the output needs (`make_room`), up to what the sequence can reach: not the whole
        // context at once. With the keys transposed, their first positions touch every huge
        // page of the key rows, so a cache of the context's size was committed whole at the
        // first token (917 MB for qwen-coder-1.5b's 32k positions; seconds of page faults on a
        // VM).
        let reach = capacity.min(prompt.len().saturating_add(config.max_new_tokens));
        let first = reach.min(prompt.len() + first_room);
        let cache = match spare {
            Some(mut c) if c.shape() == model.kv_shape() && c.capacity() >= first => {
                c.truncate(0);
                c
            }
            _ => model.new_cache(first),
        };
        let rng = match config.seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s),
            None => ChaCha8Rng::from_os_rng(),
        };
        Ok(Sequence {
            prompt_len: prompt.len(),
            cached_tokens: 0,
            prompt_offered: 0,
            tokens: prompt,
            cache,
            reach,
            drafter,
            draft_limit: usize::MAX,
            draft_price: None,
            planned: None,
            config,
            rng,
            phase: Phase::Prefill(0),
            stream: TextStream::default(),
            text: String::new(),
            released: 0,
            logprobs: Vec::new(),
            lp_released: 0,
            stopped_by: None,
            stats: SpecStats::default(),
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            constraint: None,
            budgeted: false,
            preemptions: 0,
        })
    }

    /// Compiles the sequence's grammar when it has one and has not yet (when its prompt is in).
    /// A grammar that does not compile ends the sequence; callers check formats beforehand
    /// (`Tokenizer::grammar`), so this only guards against the unexpected.
    pub(crate) fn ensure_constraint(&mut self, tok: &Tokenizer, vocab: usize) {
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

    /// Ends the sequence now, keeping what it has produced (`FinishReason::Cancelled`).
    pub fn cancel(&mut self) {
        if !self.is_finished() {
            self.text.push_str(&self.stream.finish());
            self.phase = Phase::Finished(FinishReason::Cancelled);
        }
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Finished(_))
    }

    /// The stop string that ended the output (the config's `stop`), if one did.
    pub fn stopped_by(&self) -> Option<&str> {
        self.stopped_by.map(|i| self.config.stop[i].as_str())
    }

    pub fn finish_reason(&self) -> Option<FinishReason> {
        match self.phase {
            Phase::Finished(r) => Some(r),
            _ => None,
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
        let mut fork = Sequence::new(model, prompt, config, self.reach)?;
        let shared = self.prompt_len - 1;
        fork.cache.copy_prefix(&self.cache, shared);
        fork.phase = Phase::Prefill(shared);
        fork.cached_tokens = self.cached_tokens;
        fork.budgeted = self.budgeted;
        // The prompt is the parent's, offered by it.
        fork.prompt_offered = self.prompt_len;
        Ok(Some(fork))
    }

    /// `fork` for choice `choice` of an `n > 1` request: seeded with the request's seed plus
    /// `choice`, so each choice samples on its own and reproducibly.
    pub fn fork_choice(&self, model: &Model, choice: usize) -> Result<Option<Sequence>> {
        let seed = self.config.seed.map(|s| s.wrapping_add(choice as u64));
        self.fork(model, seed)
    }

    /// Starts the prompt from its longest prefix in `prefix` under `namespace` (its tenant):
    /// those positions' keys and values are copied in and only the rest is prefilled. The
    /// prompt's last token is always run, as its logits give the first token. Only before the
    /// first pass; returns the tokens reused.
    pub fn reuse_prefix(&mut self, prefix: &mut PrefixCache, namespace: u64) -> usize {
        if !matches!(self.phase, Phase::Prefill(0)) || !self.cache.is_empty() {
            return 0;
        }
        let limit = self.prompt_len - 1;
        let found = prefix.lookup_into(namespace, &self.tokens, limit, &mut self.cache);
        if found > 0 {
            self.phase = Phase::Prefill(found);
            self.cached_tokens = found;
            self.prompt_offered = found;
        }
        found
    }

    /// Offers `prefix` the keys and values this sequence has computed (the prompt so far, and
    /// the output once decoding) under `namespace`, for later requests to reuse. Where the
    /// kernels compute prompt rows with an arithmetic of their own
    /// (`kernels::prompt_arithmetic_differs`), only the prompt's: a later request whose prompt
    /// holds this one's output computes those tokens as prompt rows, whose keys and values differ
    /// from the generated rows' here, and must get what it would get cold.
    pub fn keep_prefix(&self, prefix: &mut PrefixCache, namespace: u64) {
        let computed = match crate::kernels::prompt_arithmetic_differs() {
            true => self.prompt_len.min(self.tokens.len()),
            false => self.tokens.len(),
        };
        prefix.insert(namespace, &self.tokens[..computed], &self.cache);
    }

    /// `keep_prefix` while the prompt is being fed: offers the prompt's blocks prefilled since the
    /// last call (so that a request arriving mid-prefill with the same start reuses them), and
    /// nothing more once the whole prompt has been offered. Call it after every pass.
    pub fn keep_prompt(&mut self, prefix: &mut PrefixCache, namespace: u64) {
        let done = match self.phase {
            Phase::Prefill(done) => done,
            _ => self.prompt_len,
        };
        if done > self.prompt_offered {
            self.keep_prefix(prefix, namespace);
            self.prompt_offered = done;
        }
    }

    /// Prompt tokens whose keys and values came from a prefix cache (`reuse_prefix`).
    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens
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
    /// batch (`PassCost::price`); `None` lets the sequence use its own estimate.
    pub fn set_draft_price(&mut self, price: Option<f64>) {
        self.draft_price = price;
    }

    /// Positions in the sequence's cache: what the rows of its next pass attend to.
    pub fn positions(&self) -> usize {
        self.cache.len()
    }

    /// Whether the prompt is still being fed, or the tokens of a preempted sequence recomputed
    /// (the next pass is not a decode step).
    pub fn in_prefill(&self) -> bool {
        matches!(self.phase, Phase::Prefill(_) | Phase::Refill { .. })
    }

    /// The positions of the chunk the next pass feeds (`PREFILL_CHUNK` at most, a refill's prompt
    /// part before its generated part); `None` while decoding or finished.
    pub(crate) fn prompt_chunk(&self) -> Option<std::ops::Range<usize>> {
        let (done, end) = match self.phase {
            Phase::Prefill(done) => (done, self.prompt_len),
            Phase::Refill { done, .. } => (done, self.refill_end(done)),
            _ => return None,
        };
        Some(done..(done + PREFILL_CHUNK).min(end))
    }

    /// Rows still to feed before decoding (the prompt's rest in prefill, the recomputed tokens'
    /// in a refill); `None` while decoding or finished.
    pub fn prompt_rows_left(&self) -> Option<usize> {
        match self.phase {
            Phase::Prefill(done) => Some(self.prompt_len - done),
            Phase::Refill { done, .. } => Some(self.tokens.len() - 1 - done),
            _ => None,
        }
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
    pub(crate) fn emit(&mut self, tok: &Tokenizer, token: u32, row: &[f32]) -> bool {
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
        if let Some((cut, which)) = find_stop(&self.text, before, &self.config.stop) {
            self.text.truncate(cut);
            self.stopped_by = Some(which);
            self.phase = Phase::Finished(FinishReason::Stop);
            return false;
        }
        if generated >= self.config.max_new_tokens || self.tokens.len() >= self.reach {
            self.text.push_str(&self.stream.finish());
            self.phase = Phase::Finished(FinishReason::Length);
            return false;
        }
        self.phase = Phase::Decode(token);
        true
    }
}

/// Where the first stop string occurs in `text`, looking only at matches that end after `from`.
/// Returns the position and the index of the stop string found there (the first listed when
/// several start at the same place).
fn find_stop(text: &str, from: usize, stops: &[String]) -> Option<(usize, usize)> {
    stops
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.is_empty())
        .filter_map(|(i, s)| {
            let start = from.saturating_sub(s.len() - 1);
            let start = (start..=from).find(|&i| text.is_char_boundary(i))?;
            text[start..].find(s.as_str()).map(|p| (start + p, i))
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

impl Sequence {
    pub fn into_output(self) -> GenerationOutput {
        GenerationOutput {
            text: self.text,
            token_ids: self.tokens[self.prompt_len..].to_vec(),
            logprobs: self.logprobs,
            prompt_token_ids: self.tokens[..self.prompt_len].to_vec(),
            cached_tokens: self.cached_tokens,
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

/// Prompt tokens fed per forward pass during prefill.
pub const PREFILL_CHUNK: usize = 256;

/// Positions a new sequence's cache has room for past its prompt before it first grows
/// (`Sequence::make_room`): the default 256 new tokens and their drafts fit.
pub const FIRST_ROOM: usize = 1024;

/// One sequence's inputs to a pass.
pub(crate) struct PassInput {
    pub(crate) seq: usize,
    pub(crate) tokens: Vec<u32>,
    /// The drafted tree (empty for prefill and plain decoding).
    pub(crate) tree: DraftTree,
    /// Row parents for the model when the tree is not a chain (see `BatchItem::parents`).
    pub(crate) parents: Vec<u32>,
}

/// What every sequence of a pass shares.
pub(crate) struct Pass {
    pub(crate) elapsed: Duration,
    /// The pass had this sequence alone (its time says what its own rows cost).
    pub(crate) alone: bool,
    pub(crate) vocab: usize,
}

/// One pass, seen from a sequence (`step` runs the pass over all of them).
impl Sequence {
    /// What this sequence sends to the next pass (`si`: its place in the step), if anything.
    pub(crate) fn pass_input(&mut self, si: usize, tok: &Tokenizer) -> Option<PassInput> {
        match self.phase {
            Phase::Finished(_) => None,
            Phase::Prefill(_) | Phase::Refill { .. } => Some(PassInput {
                seq: si,
                tokens: self.tokens[self.prompt_chunk()?].to_vec(),
                tree: DraftTree::new(),
                parents: Vec::new(),
            }),
            Phase::Decode(last) => {
                let tree = self.draft(tok);
                let mut tokens = Vec::with_capacity(tree.len() + 1);
                tokens.push(last);
                tokens.extend_from_slice(tree.tokens());
                Some(PassInput {
                    seq: si,
                    tokens,
                    parents: tree.row_parents(),
                    tree,
                })
            }
        }
    }

    /// Grows the cache to hold `needed` positions (at most `reach`, which every pass stays
    /// within), to twice its size or more: a new cache with this one's positions copied in,
    /// bit for bit, so that nothing computed depends on when the cache grew.
    fn make_room(&mut self, needed: usize) {
        if needed > self.cache.capacity() {
            self.grow(self.growth(needed));
        }
    }

    /// The capacity the cache grows to when it must hold `needed` positions: twice its size or
    /// more, within `reach`.
    pub fn growth(&self, needed: usize) -> usize {
        needed.max(2 * self.cache.capacity()).min(self.reach)
    }

    /// Moves the cache to one of `capacity` positions (more than it has), its positions copied
    /// bit for bit.
    pub fn grow(&mut self, capacity: usize) {
        if capacity <= self.cache.capacity() {
            return;
        }
        let mut bigger = KvCache::new(self.cache.shape(), capacity);
        bigger.copy_prefix(&self.cache, self.cache.len());
        self.cache = bigger;
    }

    /// A prefill pass is done: `done` prompt tokens are in; once all are, the prompt's last row
    /// gives the first token.
    pub(crate) fn prefilled(
        &mut self,
        tok: &Tokenizer,
        done: usize,
        last_row: &[f32],
        pass: &Pass,
    ) {
        self.prefill_time += pass.elapsed;
        if done < self.prompt_len {
            self.phase = Phase::Prefill(done);
            return;
        }
        self.ensure_constraint(tok, pass.vocab);
        if self.is_finished() {
            return;
        }
        let healed;
        let row = match self.config.first_token_prefix.as_deref() {
            Some(p) => {
                healed = tok.tokens_starting_with(last_row, p.as_bytes());
                &healed[..]
            }
            None => last_row,
        };
        let (params, rng) = (&self.config.sampling, &mut self.rng);
        let token = match self.constraint.as_mut() {
            Some(c) => first_token(c, row, &self.tokens, params, rng),
            None => verify(row, pass.vocab, &[], &self.tokens, params, rng).tokens[0],
        };
        self.emit(tok, token, last_row);
    }

    /// A decode pass is done: verifies the draft against `rows` (one per input), keeps the
    /// accepted path in the cache, counts it, teaches the drafter and emits the tokens.
    pub(crate) fn decoded(&mut self, tok: &Tokenizer, input: PassInput, rows: &[f32], pass: &Pass) {
        let PassInput { tokens, tree, .. } = input;
        let vocab = pass.vocab;
        self.decode_time += pass.elapsed;
        let start = self.cache.len() - tokens.len();
        let (params, rng) = (&self.config.sampling, &mut self.rng);
        let verdict = match self.constraint.as_mut() {
            Some(c) => verify_constrained(c, rows, vocab, &tree, &self.tokens, params, rng),
            None => verify_tree(rows, vocab, &tree, &self.tokens, params, rng),
        };
        // The rows whose logits predicted each emitted token: the root's, then each accepted
        // node's. Keep the cache for the root and the accepted path only.
        let kept = path_rows(&verdict.path);
        self.cache.keep_rows(start, &kept);
        self.stats.count_step(&tree, &verdict.path);
        self.teach_drafter(rows, &verdict.path, tokens.len(), pass);
        for (&t, &r) in verdict.tokens.iter().zip(&kept) {
            self.stats.decode_tokens += 1;
            if !self.emit(tok, t, &rows[r * vocab..(r + 1) * vocab]) {
                break;
            }
        }
    }

    /// Hands the drafter what the pass showed: the model's top candidates at every row (when its
    /// model source is on), the accepted path, and (alone, greedy) what `rows` rows cost.
    fn teach_drafter(&mut self, logits: &[f32], path: &[usize], rows: usize, pass: &Pass) {
        let Some(d) = self.drafter.as_mut() else {
            return;
        };
        let k = d.wants_predictions();
        if k > 0 {
            let top: Vec<Vec<u32>> = logits
                .chunks_exact(pass.vocab)
                .map(|r| top_ids(r, k))
                .collect();
            d.record_predictions(&top);
        }
        d.observe(path);
        // Timings vary from run to run: they may steer draft lengths only where the output cannot
        // depend on them (greedy), so seeded sampling stays reproducible. A pass shared with other
        // sequences says nothing about this one's draft cost.
        if self.config.sampling.is_greedy() && pass.alone {
            d.observe_cost(rows, pass.elapsed.as_secs_f64());
        }
    }
}

mod draft;
mod resume;

pub(crate) use draft::plan_drafts;
#[cfg(test)]
mod tests;
