//! A sequence under a memory budget (`kv_budget`): what its cache holds and needs for the next
//! pass, admission (a cache given, the longest cached prefix copied in), and preemption (the
//! cache given up, its blocks offered to the prefix cache) with the resume that follows.
//!
//! A preempted sequence keeps everything but its cache: its tokens, sampler state (the RNG),
//! drafter, grammar, text and statistics. Admitted again, it copies what the prefix cache still
//! holds of its tokens and recomputes the rest (`Phase::Refill`): its prompt as prompt rows, its
//! output as generated rows (never logits, never a sample), so every cached row is bit for bit
//! what it was and decoding goes on from its last token as if nothing had happened.

use super::{Phase, Sequence, FIRST_ROOM};
use crate::error::Result;
use crate::generation::GenerationConfig;
use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::prefix_cache::PrefixCache;

impl Sequence {
    /// A sequence over `prompt` that holds no cache yet: checked as `new` checks it, admitted
    /// later (`admit`) when a budget has room for it.
    pub fn waiting(
        model: &Model,
        prompt: Vec<u32>,
        config: GenerationConfig,
        context_len: usize,
    ) -> Result<Self> {
        let mut seq = Sequence::with_first_room(model, prompt, config, context_len, 0, None)?;
        seq.take_cache();
        Ok(seq)
    }

    /// Bytes its cache reserves (0 while it waits).
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }

    /// Positions its cache has room for.
    pub fn capacity(&self) -> usize {
        self.cache.capacity()
    }

    /// Positions it can reach: its prompt and `max_new_tokens` more, within its context.
    pub fn reach(&self) -> usize {
        self.reach
    }

    /// Positions its cache must hold when it is admitted: the tokens it recomputes or prefills
    /// and the next one.
    fn fill(&self) -> usize {
        match self.phase {
            Phase::Refill { .. } | Phase::Decode(_) => self.tokens.len(),
            Phase::Prefill(_) | Phase::Finished(_) => self.prompt_len,
        }
    }

    /// The capacity it is admitted with: its tokens and `room` positions more, within its reach
    /// (`FIRST_ROOM` is what a sequence without a budget starts with).
    pub fn admit_capacity(&self, room: usize) -> usize {
        self.reach.min(self.fill() + room.min(FIRST_ROOM)).max(1)
    }

    /// Positions the next pass needs in the cache: without drafts (the hard need), and with
    /// the largest draft its limits allow (the soft need). Zero when finished. A sampled
    /// sequence's drafts decide how its random numbers are drawn, so for it the two are one:
    /// memory never shortens its drafts, and its output stays the one its seed gives.
    pub fn next_need(&self) -> (usize, usize) {
        match self.phase {
            Phase::Finished(_) => (0, 0),
            Phase::Prefill(_) => (self.prompt_len, self.prompt_len),
            Phase::Refill { done, .. } => {
                let end = self.refill_end(done).max(1);
                (end, end)
            }
            Phase::Decode(_) => {
                let hard = self.cache.len() + 1;
                let generated = self.tokens.len() - self.prompt_len;
                let left = self.config.max_new_tokens.saturating_sub(generated + 1);
                let draft = match self.drafter {
                    Some(_) => self.draft_limit.min(self.reach - hard).min(left),
                    None => 0,
                };
                match self.config.sampling.is_greedy() {
                    true => (hard, hard + draft),
                    false => (hard + draft, hard + draft),
                }
            }
        }
    }

    /// Whether it waits for a cache (new, or preempted).
    pub fn is_waiting(&self) -> bool {
        self.cache.capacity() == 0 && !self.is_finished()
    }

    /// Gives it a cache of `capacity` positions (`spare`'s when that is of its shape and holds
    /// enough; `spare` is dropped otherwise), then copies in the longest prefix of its tokens
    /// that `prefix` holds under `namespace`; the rest is computed by the next passes. From now
    /// on its drafts stay within its cache (`budgeted`).
    pub fn admit(
        &mut self,
        spare: Option<KvCache>,
        capacity: usize,
        prefix: &mut PrefixCache,
        namespace: u64,
    ) {
        let shape = self.cache.shape();
        self.cache = match spare {
            Some(mut c) if c.shape() == shape && c.capacity() >= capacity => {
                c.truncate(0);
                c
            }
            _ => KvCache::new(shape, capacity),
        };
        self.budgeted = true;
        match self.phase {
            Phase::Prefill(0) if self.preemptions == 0 => {
                self.reuse_prefix(prefix, namespace);
            }
            Phase::Prefill(_) => {
                let limit = self.prompt_len - 1;
                let found = prefix.lookup_into(namespace, &self.tokens, limit, &mut self.cache);
                self.phase = Phase::Prefill(found);
            }
            Phase::Refill { last, .. } => {
                // Where prompt rows take an arithmetic of their own, the cache's blocks past the
                // prompt were computed as another request's prompt: not this output's rows.
                let limit = match crate::kernels::prompt_arithmetic_differs() {
                    true => self.prompt_len,
                    false => self.tokens.len() - 1,
                };
                let found = prefix.lookup_into(namespace, &self.tokens, limit, &mut self.cache);
                self.phase = self.refill_phase(found, last);
            }
            Phase::Decode(_) | Phase::Finished(_) => {}
        }
    }

    /// Gives up its cache between passes: the blocks it computed go to `prefix` under
    /// `namespace` (where they fit), and it waits to be admitted again (`admit`), keeping its
    /// tokens, sampler, drafter and text.
    pub fn preempt(&mut self, prefix: &mut PrefixCache, namespace: u64) {
        if self.is_finished() || self.is_waiting() {
            return;
        }
        self.keep_prefix(prefix, namespace);
        self.take_cache();
        self.preemptions += 1;
        self.phase = match self.phase {
            Phase::Decode(last) | Phase::Refill { last, .. } => Phase::Refill { done: 0, last },
            Phase::Prefill(_) => Phase::Prefill(0),
            Phase::Finished(r) => Phase::Finished(r),
        };
    }

    /// Where recomputing from `done` stops for one pass: the end of the prompt first (its rows
    /// are prompt rows), then the last emitted token (not in the cache while decoding).
    pub(crate) fn refill_end(&self, done: usize) -> usize {
        if done < self.prompt_len {
            self.prompt_len
        } else {
            self.tokens.len() - 1
        }
    }

    fn refill_phase(&self, done: usize, last: u32) -> Phase {
        if done >= self.tokens.len() - 1 {
            Phase::Decode(last)
        } else {
            Phase::Refill { done, last }
        }
    }

    /// Whether the next pass feeds prompt tokens (prompt rows, `BatchItem::prompt`).
    pub(crate) fn feeds_prompt(&self) -> bool {
        match self.phase {
            Phase::Prefill(_) => true,
            Phase::Refill { done, .. } => done < self.prompt_len,
            Phase::Decode(_) | Phase::Finished(_) => false,
        }
    }

    /// A recomputing pass is done: `done` tokens are back in the cache.
    pub(crate) fn refilled(&mut self, done: usize, last: u32, pass: &super::Pass) {
        self.prefill_time += pass.elapsed;
        self.phase = self.refill_phase(done, last);
    }
}

impl Sequence {
    /// Choice `choice` of an `n > 1` request as a waiting sequence (seeded as `fork_choice`
    /// seeds it): where a budget has no room for a fork's copy of the prompt now, the choice is
    /// admitted later like any request, its prompt from the prefix cache.
    pub fn choice_waiting(&self, model: &Model, choice: usize) -> Result<Sequence> {
        let config = GenerationConfig {
            seed: self.config.seed.map(|s| s.wrapping_add(choice as u64)),
            ..self.config.clone()
        };
        Sequence::waiting(model, self.prompt_tokens().to_vec(), config, self.reach)
    }

    /// Positions of the cache a fork of it starts with (`fork`).
    pub fn fork_capacity(&self) -> usize {
        self.reach.min(self.prompt_len + FIRST_ROOM)
    }
}
