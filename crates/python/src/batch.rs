//! `LLM.generate` over a list: every request runs in one continuous batch through the engine's
//! `step`, as the server's loop runs them. Up to `max_seqs` sequences advance in each pass; a
//! request's other choices (`n > 1`) fork from its first once the prompt is in; every prompt
//! starts from the prefix cache and leaves its rows there. The caches stay within the `LLM`'s
//! memory budget (`engine::kv_budget`, `kv_cache_bytes`) as in the server: a prompt waits until
//! its first cache fits, and the newest sequence is preempted (and resumes later, its output
//! unchanged) when an older one must grow past the budget. The drafts of a batch's sequences
//! are priced and chosen together as the server's are (`engine::pass_cost::BatchPricing`, timed
//! at the `LLM`'s first batch of more than one sequence with speculation on).

use engine::pass_cost::BatchPricing;
use engine::{
    step, GenerationConfig, GenerationOutput, KvBudget, LoadedModel, PrefixCache, Sequence,
    LOCAL_NAMESPACE,
};
use std::collections::VecDeque;
use std::ops::Range;
use std::time::Instant;

/// One prompt and its settings.
pub struct Request {
    pub prompt: Vec<u32>,
    pub config: GenerationConfig,
    pub n: usize,
}

/// A finished choice with the time from the batch's start to its first token.
pub struct Choice {
    pub out: GenerationOutput,
    pub first_token_s: Option<f64>,
}

struct Live {
    request: usize,
    choice: usize,
    /// Choices still to fork from this one once its prompt is in.
    forks: Range<usize>,
    seq: Sequence,
    first_token_s: Option<f64>,
}

/// Why a batch stopped before its end.
pub enum Stopped<E> {
    Engine(engine::EngineError),
    /// `between` said stop (a signal).
    Caller(E),
}

impl<E> From<engine::EngineError> for Stopped<E> {
    fn from(e: engine::EngineError) -> Self {
        Stopped::Engine(e)
    }
}

/// Checks a request as `Sequence::new`, the budget (`KvBudget::check`) and the grammar compiler
/// would, before anything runs.
pub fn check(lm: &LoadedModel, r: &Request, ctx: usize, budget: &KvBudget) -> engine::Result<()> {
    let seq = Sequence::waiting(&lm.model, r.prompt.clone(), r.config.clone(), ctx)?;
    budget.check(seq.reach(), r.n)?;
    if !r.config.response_format.is_text() {
        lm.tokenizer
            .grammar(lm.model.config.vocab_size)?
            .compile(&r.config.response_format)?;
    }
    Ok(())
}

/// Where a batch stands: its live sequences (in the order they were admitted), those waiting
/// for room (preempted, or choices that did not fit), and the requests not yet started.
struct Batch {
    live: Vec<Live>,
    waiting: Vec<Live>,
    queue: VecDeque<(usize, Request)>,
}

/// Runs `requests` to the end within `budget`; returns each one's choices in order.
/// `between(done)` runs after every pass with the number of requests finished so far, and may
/// stop the batch.
pub fn run<E>(
    lm: &LoadedModel,
    prefix: &mut PrefixCache,
    requests: Vec<Request>,
    (max_seqs, ctx, budget): (usize, usize, &KvBudget),
    pricing: &mut Option<BatchPricing>,
    mut between: impl FnMut(usize) -> Result<(), E>,
) -> Result<Vec<Vec<Choice>>, Stopped<E>> {
    let started = Instant::now();
    let mut results: Vec<Vec<Option<Choice>>> = requests
        .iter()
        .map(|r| (0..r.n).map(|_| None).collect())
        .collect();
    let mut b = Batch {
        live: Vec::new(),
        waiting: Vec::new(),
        queue: requests.into_iter().enumerate().collect(),
    };
    let mut done = 0;
    while !b.queue.is_empty() || !b.waiting.is_empty() || !b.live.is_empty() {
        b.admit(lm, prefix, max_seqs.max(1), ctx, budget)?;
        let drafting = b.live.iter().any(|l| l.seq.config().speculation.enabled());
        if b.live.len() > 1 && drafting && pricing.is_none() {
            *pricing = Some(BatchPricing::measure(&lm.model));
        }
        let keep = {
            let mut seqs: Vec<&mut Sequence> = b.live.iter_mut().map(|l| &mut l.seq).collect();
            if let Some(p) = pricing.as_ref() {
                p.price(&mut seqs);
            }
            budget.fit(&mut seqs, &mut Vec::new())
        };
        for mut l in b.live.drain(keep..).collect::<Vec<_>>() {
            l.seq.preempt(prefix, LOCAL_NAMESPACE);
            b.wait(l);
        }
        {
            let mut seqs: Vec<&mut Sequence> = b.live.iter_mut().map(|l| &mut l.seq).collect();
            match pricing.as_mut() {
                Some(p) => drop(p.step(&lm.model, &lm.tokenizer, &mut seqs)?),
                None => step(&lm.model, &lm.tokenizer, &mut seqs)?,
            }
        }
        let now = started.elapsed().as_secs_f64();
        b.fork_choices(lm, prefix, budget, now)?;
        for l in b.live.extract_if(.., |l| l.seq.is_finished()) {
            l.seq.keep_prefix(prefix, LOCAL_NAMESPACE);
            let slots = &mut results[l.request];
            slots[l.choice] = Some(Choice {
                out: l.seq.into_output(),
                first_token_s: l.first_token_s,
            });
            done += usize::from(slots.iter().all(Option::is_some));
        }
        between(done).map_err(Stopped::Caller)?;
    }
    Ok(results
        .into_iter()
        .map(|r| {
            r.into_iter()
                .map(|c| c.expect("every choice ran"))
                .collect()
        })
        .collect())
}

impl Batch {
    /// Admits sequences while the batch has a slot and the first in line fits the budget: the
    /// waiting ones first (earliest request first), then new requests.
    fn admit(
        &mut self,
        lm: &LoadedModel,
        prefix: &mut PrefixCache,
        max_seqs: usize,
        ctx: usize,
        budget: &KvBudget,
    ) -> engine::Result<()> {
        while self.live.len() < max_seqs {
            if self.waiting.is_empty() {
                let Some((request, r)) = self.queue.pop_front() else {
                    break;
                };
                self.waiting.push(Live {
                    request,
                    choice: 0,
                    forks: 1..r.n,
                    seq: Sequence::waiting(&lm.model, r.prompt, r.config, ctx)?,
                    first_token_s: None,
                });
            }
            let held = engine::kv_budget::held(self.live.iter().map(|l| &l.seq), &[]);
            let Some((capacity, _)) = budget.admission(&self.waiting[0].seq, held, &mut Vec::new())
            else {
                break;
            };
            let mut l = self.waiting.remove(0);
            l.seq.admit(None, capacity, prefix, LOCAL_NAMESPACE);
            self.live.push(l);
        }
        Ok(())
    }

    /// Puts `l` among the waiting sequences, by request and choice.
    fn wait(&mut self, l: Live) {
        let at = self
            .waiting
            .partition_point(|w| (w.request, w.choice) <= (l.request, l.choice));
        self.waiting.insert(at, l);
    }

    /// Times first tokens, offers the prompts' blocks to the prefix cache, and starts the other
    /// choices of requests whose prompt is in: a copy of its cache where the budget has room, else
    /// waiting (their prompt then comes from the prefix cache).
    fn fork_choices(
        &mut self,
        lm: &LoadedModel,
        prefix: &mut PrefixCache,
        budget: &KvBudget,
        now: f64,
    ) -> engine::Result<()> {
        let mut held = engine::kv_budget::held(self.live.iter().map(|l| &l.seq), &[]);
        let (mut forked, mut waiting) = (Vec::new(), Vec::new());
        for l in self.live.iter_mut() {
            if l.first_token_s.is_none() && !l.seq.generated_tokens().is_empty() {
                l.first_token_s = Some(now);
            }
            l.seq.keep_prompt(prefix, LOCAL_NAMESPACE);
            while !l.forks.is_empty() && !l.seq.in_prefill() {
                let choice = l.forks.start;
                let bytes = budget.cache_bytes(l.seq.fork_capacity());
                let room = budget.make_room(bytes, held, &mut Vec::new());
                let seq = match room {
                    Some(_) => l.seq.fork_choice(&lm.model, choice)?,
                    None => Some(l.seq.choice_waiting(&lm.model, choice)?),
                };
                let Some(seq) = seq else {
                    break;
                };
                l.forks.start += 1;
                let new = Live {
                    request: l.request,
                    choice,
                    forks: 0..0,
                    seq,
                    first_token_s: None,
                };
                match room {
                    Some(now) => {
                        held = now;
                        forked.push(new);
                    }
                    None => waiting.push(new),
                }
            }
        }
        self.live.extend(forked);
        for l in waiting {
            self.wait(l);
        }
        Ok(())
    }
}
