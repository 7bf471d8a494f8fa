//! Continuous batching: one engine loop on its own thread. Requests join the running batch at step
//! boundaries (up to `max_num_seqs`, the rest wait in a bounded queue), the running sequences
//! advance in the same forward pass through the engine's `step` (every decoding one, and prompt
//! chunks within `step::PROMPT_ROWS_PER_PASS`, the oldest first, then the shortest), text goes
//! back to each request's channel as it is accepted, and a sequence whose client went away is
//! dropped within one step.
//! A request may also set `Limits` (llama-server's time to generate and indentation, for
//! completions in an editor): a sequence that reaches one ends after the step that reached it.
//!
//! Speculation adapts to load (`engine::pass_cost::BatchPricing`, shared with the Python `LLM`):
//! the loop times what passes cost by row count and context at start-up, refines it from real
//! decode passes, and the engine's `step_priced` chooses the greedy sequences' drafts together by
//! it; sampled sequences get a fixed cap on drafted tokens that shrinks as the batch grows.
//!
//! Prompts start from the prefix cache: a new sequence copies in the keys and values of the longest
//! prefix its tenant's earlier requests left (a chat client re-sends the whole conversation every
//! turn) and prefills only the rest. A sequence offers the cache its prompt's blocks as each
//! prefill chunk completes (so requests arriving meanwhile with the same start share them), and its
//! output when it finishes.
//!
//! Memory is budgeted (`engine::kv_budget`, `--kv-cache-bytes`): a request waits until the cache
//! it starts with fits beside the running ones and the spare caches, and before every pass each
//! running sequence gets the room its next pass needs, the most recently admitted being
//! preempted (its blocks offered to the prefix cache) when there is none; a preempted sequence
//! waits again and resumes from its tokens, its output unchanged (`budget.rs`).
//!
//! Each tenant (API key) has a corpus of its earlier prompts and outputs, bounded in tokens; a
//! sequence drafting a tree with the corpus source looks up only its own tenant's corpus, and adds
//! its prompt and output to it when it finishes.

use crate::metrics::Metrics;
use crate::tenant::{namespaces, Corpora, Tenant};
use crate::ServerConfig;
use engine::kv_cache::KvCache;
use engine::pass_cost::BatchPricing;
use engine::{FinishReason, GenerationConfig, KvBudget, LoadedModel, PrefixCache, Sequence};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// What the engine loop sends back for one request; `index` is the choice (0..n).
#[derive(Debug)]
pub enum Event {
    /// New output text, and the log-probabilities of the tokens behind it (when asked for).
    Text {
        index: usize,
        text: String,
        logprobs: Vec<engine::TokenLogprob>,
    },
    Finished {
        index: usize,
        reason: FinishReason,
        prompt_tokens: usize,
        /// Of the prompt tokens, those whose keys and values came from the prefix cache.
        cached_tokens: usize,
        completion_tokens: usize,
        /// The stop string that ended the output, if one did.
        stop: Option<String>,
    },
    Failed(String),
}

pub struct Job {
    pub tenant: Tenant,
    /// Limits besides the token budget (none by default).
    pub limits: Limits,
    /// Choices to generate: the prompt is prefilled once and the cache forked for the others.
    pub n: usize,
    pub prompt: Vec<u32>,
    pub config: GenerationConfig,
    pub events: UnboundedSender<Event>,
    pub arrived: Instant,
}

/// What a request may ask of its end besides its token budget, as llama-server's `/infill`
/// takes it for completions in an editor: the sequence is cancelled (`FinishReason::Cancelled`)
/// when one is reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// `t_max_predict_ms`: stop at the first newline generated once this long has passed since
    /// the first token.
    pub predict_time: Option<Duration>,
    /// `n_indent`: stop at a line indented less than this (`engine::fim::indent_cut`); 0: off.
    pub min_indent: usize,
}

impl Limits {
    /// Whether a sequence whose first token came at `first_token` and whose text is `text`, of
    /// which `new` is what the last step added, has reached a limit at `now`.
    fn reached(&self, first_token: Option<Instant>, now: Instant, text: &str, new: &str) -> bool {
        let late = match (self.predict_time, first_token) {
            (Some(limit), Some(first)) => now - first > limit,
            _ => false,
        };
        (late && new.contains('\n')) || engine::fim::indent_cut(text, self.min_indent).is_some()
    }
}

pub struct Scheduler {
    queue: SyncSender<Job>,
}

#[derive(Debug)]
pub enum SubmitError {
    QueueFull,
    Stopped,
}

impl Scheduler {
    /// Starts the engine thread over `prefix` (made by `prefix_cache`).
    pub fn start(
        lm: Arc<LoadedModel>,
        config: &ServerConfig,
        prefix: PrefixCache,
        budget: KvBudget,
        metrics: Arc<Metrics>,
    ) -> Scheduler {
        let (tx, rx) = sync_channel(config.max_queue);
        let settings = LoopSettings {
            max_seqs: config.max_num_seqs.max(1),
            ctx: config.max_model_len,
            namespaces: namespaces(&config.api_keys),
            budget,
        };
        let corpora = Corpora::new(config.corpus_tokens);
        std::thread::Builder::new()
            .name("pld-engine".into())
            .spawn(move || engine_loop(&lm, rx, settings, corpora, prefix, &metrics))
            .expect("spawn the engine thread");
        Scheduler { queue: tx }
    }

    pub fn submit(&self, job: Job, metrics: &Metrics) -> Result<(), SubmitError> {
        match self.queue.try_send(job) {
            Ok(()) => {
                metrics.waiting.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(SubmitError::QueueFull),
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Stopped),
        }
    }
}

struct Running {
    tenant: Tenant,
    /// Which choice of its request this sequence is.
    index: usize,
    /// Choices still to fork from this one once its prompt is in (the first sequence of an
    /// `n > 1` request).
    forks: std::ops::Range<usize>,
    seq: Sequence,
    events: UnboundedSender<Event>,
    arrived: Instant,
    first_token: Option<Instant>,
    limits: Limits,
    /// Bytes of the sequence's text that `limits` have been checked against.
    checked: usize,
}

/// What the engine thread is told once.
struct LoopSettings {
    max_seqs: usize,
    ctx: usize,
    /// Each tenant's namespace in the prefix cache (`tenant::namespaces`).
    namespaces: Vec<u64>,
    budget: KvBudget,
}

/// The engine thread's state: the running batch and what it has learned about pass costs.
struct EngineLoop<'a> {
    lm: &'a LoadedModel,
    max_seqs: usize,
    ctx: usize,
    namespaces: Vec<u64>,
    corpora: Corpora,
    prefix: PrefixCache,
    metrics: &'a Metrics,
    /// In the order they were admitted (the last is the first preempted).
    running: Vec<Running>,
    /// Sequences without a cache, in the order their requests arrived: taken from the queue
    /// when there was a batch slot, or preempted, or choices waiting for room.
    waiting: VecDeque<Running>,
    budget: KvBudget,
    /// Caches of ended requests, largest last, for the next ones (`Sequence::reusing`): kept
    /// committed rather than given back and faulted in again at every request.
    spares: Vec<KvCache>,
    pricing: BatchPricing,
}

/// How many ended requests' caches the engine keeps for later ones.
const SPARE_CACHES: usize = 2;

/// Keeps `cache` among `spares` (largest last), at most `SPARE_CACHES` of them: the smallest
/// goes.
fn keep_spare(spares: &mut Vec<KvCache>, cache: KvCache) {
    if cache.capacity() == 0 {
        return;
    }
    let at = spares.partition_point(|c| c.capacity() <= cache.capacity());
    spares.insert(at, cache);
    if spares.len() > SPARE_CACHES {
        spares.remove(0);
    }
}

fn engine_loop(
    lm: &LoadedModel,
    rx: Receiver<Job>,
    settings: LoopSettings,
    corpora: Corpora,
    prefix: PrefixCache,
    metrics: &Metrics,
) {
    let mut engine = EngineLoop {
        lm,
        max_seqs: settings.max_seqs,
        ctx: settings.ctx,
        namespaces: settings.namespaces,
        corpora,
        prefix,
        metrics,
        running: Vec::new(),
        waiting: VecDeque::new(),
        budget: settings.budget,
        spares: Vec::new(),
        pricing: BatchPricing::measure(&lm.model),
    };
    loop {
        if !engine.admit_waiting(&rx) {
            return;
        }
        engine.drop_cancelled();
        if engine.running.is_empty() {
            continue;
        }
        if let Err(e) = engine.step() {
            tracing::error!("engine step failed: {e}");
            for r in engine.running.drain(..) {
                let _ = r.events.send(Event::Failed(e.to_string()));
            }
            continue;
        }
        let now = Instant::now();
        engine.apply_limits(now);
        engine.send_text(now);
        engine.fork_choices();
        engine.keep_prompts();
        engine.finish_done(now);
        metrics.set_prefix_cache(&engine.prefix);
        engine.count_memory();
    }
}

impl EngineLoop<'_> {
    /// Cancellation: a closed channel means the client is gone.
    fn drop_cancelled(&mut self) {
        let (metrics, prefix, namespaces) = (self.metrics, &mut self.prefix, &self.namespaces);
        let spares = &mut self.spares;
        let before = self.waiting.len();
        self.waiting.retain(|r| !r.events.is_closed());
        metrics
            .waiting
            .fetch_sub((before - self.waiting.len()) as u64, Ordering::Relaxed);
        self.running.retain_mut(|r| {
            let gone = r.events.is_closed();
            if gone {
                // What a cancelled request generated was still generated, and its rows stay
                // good for a retry.
                metrics
                    .generation_tokens
                    .fetch_add(r.seq.generated_tokens().len() as u64, Ordering::Relaxed);
                r.seq.keep_prefix(prefix, namespaces[r.tenant.0]);
                keep_spare(spares, r.seq.take_cache());
            }
            !gone
        });
        metrics
            .running
            .store(self.running.len() as u64, Ordering::Relaxed);
    }

    /// One pass over the running batch, each sequence's drafts priced for the batch's size and
    /// its own context (`BatchPricing`), within the memory budget (`fit_budget`, which may
    /// preempt the newest sequences); what speculation did is counted.
    fn step(&mut self) -> engine::Result<()> {
        {
            let mut seqs: Vec<&mut Sequence> =
                self.running.iter_mut().map(|r| &mut r.seq).collect();
            self.pricing.price(&mut seqs);
        }
        self.fit_budget();
        if self.running.is_empty() {
            return Ok(());
        }
        let counted = {
            let mut seqs: Vec<&mut Sequence> =
                self.running.iter_mut().map(|r| &mut r.seq).collect();
            (self.pricing).step(&self.lm.model, &self.lm.tokenizer, &mut seqs)?
        };
        for c in &counted {
            self.metrics.count_step(c);
        }
        Ok(())
    }

    /// Ends the sequences that have reached one of their limits (before their text is sent, so
    /// that all of it goes out: a cancelled sequence holds nothing back).
    fn apply_limits(&mut self, now: Instant) {
        for r in self.running.iter_mut() {
            if r.limits == Limits::default() || r.seq.is_finished() {
                continue;
            }
            let text = r.seq.text();
            let new = text.get(r.checked..).unwrap_or_default();
            if r.limits.reached(r.first_token, now, text, new) {
                r.seq.cancel();
            }
            r.checked = r.seq.text().len();
        }
    }

    /// Sends each sequence's new text, with the log-probabilities behind it (the rest at the
    /// end), and times its first token.
    fn send_text(&mut self, now: Instant) {
        for r in self.running.iter_mut() {
            if r.first_token.is_none() && !r.seq.generated_tokens().is_empty() {
                r.first_token = Some(now);
                self.metrics
                    .time_to_first_token
                    .observe((now - r.arrived).as_secs_f64());
            }
            let text = r.seq.take_new_text();
            if !text.is_empty() || r.seq.finish_reason().is_some() {
                let logprobs = r.seq.take_new_logprobs();
                if !text.is_empty() || !logprobs.is_empty() {
                    let _ = r.events.send(Event::Text {
                        index: r.index,
                        text,
                        logprobs,
                    });
                }
            }
        }
    }

    /// Offers the prefix cache the prompt blocks prefilled so far, chunk by chunk (as vLLM caches
    /// each block once it is full), so a request arriving during a long prefill with the same
    /// start reuses what is already computed.
    fn keep_prompts(&mut self) {
        for r in self.running.iter_mut() {
            r.seq
                .keep_prompt(&mut self.prefix, self.namespaces[r.tenant.0]);
        }
    }

    /// Ends the finished sequences: counted, added to their tenant's corpus and the prefix cache,
    /// logged, reported.
    fn finish_done(&mut self, now: Instant) {
        let (metrics, corpora, prefix) = (self.metrics, &self.corpora, &mut self.prefix);
        let (namespaces, spares) = (&self.namespaces, &mut self.spares);
        self.running.retain_mut(|r| {
            let Some(reason) = r.seq.finish_reason() else {
                return true;
            };
            let completion = r.seq.generated_tokens().len();
            let prompt = r.seq.prompt_tokens().len();
            metrics
                .generation_tokens
                .fetch_add(completion as u64, Ordering::Relaxed);
            if let (Some(first), true) = (r.first_token, completion > 1) {
                let per = (now - first).as_secs_f64() / (completion - 1) as f64;
                metrics.time_per_output_token.observe(per);
            }
            corpora.add(r.tenant, &r.seq);
            r.seq.keep_prefix(prefix, namespaces[r.tenant.0]);
            let s = &r.seq.stats;
            tracing::info!(
                prompt_tokens = prompt,
                cached_tokens = r.seq.cached_tokens(),
                completion_tokens = completion,
                finish_reason = ?reason,
                steps = s.steps,
                draft_tokens = s.draft_tokens,
                accepted_tokens = s.accepted_tokens,
                mean_accepted_tokens = format!("{:.2}", s.mean_accepted_tokens()),
                seconds = format!("{:.2}", (now - r.arrived).as_secs_f64()),
                "request done"
            );
            let _ = r.events.send(Event::Finished {
                index: r.index,
                reason,
                prompt_tokens: prompt,
                cached_tokens: r.seq.cached_tokens(),
                completion_tokens: completion,
                stop: r.seq.stopped_by().map(str::to_string),
            });
            keep_spare(spares, r.seq.take_cache());
            false
        });
    }
}

mod budget;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_spare_caches_are_kept() {
        use engine::kv_cache::{KvDtype, KvShape};
        let shape = KvShape {
            n_layer: 1,
            kv_dim: 4,
            hd: 4,
            dtype: KvDtype::F32,
        };
        let mut spares = Vec::new();
        for n in [30, 0, 10, 50, 20] {
            keep_spare(&mut spares, KvCache::new(shape, n));
        }
        let kept: Vec<usize> = spares.iter().map(|c| c.capacity()).collect();
        assert_eq!(kept, [30, 50], "the two largest, largest last");
    }

    #[test]
    fn limits_stop_at_a_late_newline_or_a_shallow_line() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(50);
        let timed = Limits {
            predict_time: Some(Duration::from_millis(10)),
            min_indent: 0,
        };
        assert!(timed.reached(Some(t0), later, "a\nb", "a\nb"));
        assert!(
            !timed.reached(Some(t0), later, "a\nb", "b"),
            "no new newline"
        );
        let early = t0 + Duration::from_millis(5);
        assert!(!timed.reached(Some(t0), early, "a\n", "a\n"), "in time");
        assert!(!timed.reached(None, later, "a\n", "a\n"), "no token yet");
        let indented = Limits {
            predict_time: None,
            min_indent: 4,
        };
        assert!(!indented.reached(None, later, "x\n    y", "y"));
        assert!(indented.reached(None, later, "x\n  y", "y"));
        assert!(!Limits::default().reached(Some(t0), later, "x\n\n", "\n"));
    }
}
