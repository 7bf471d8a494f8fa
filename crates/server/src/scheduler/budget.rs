//! The engine loop's side of the memory budget (`engine::kv_budget`): jobs become waiting
//! sequences, which are admitted while the batch has a slot and their first cache fits; before
//! every pass the running sequences get the room they need, the newest preempted where there is
//! none; an `n > 1` request's other choices copy its prompt's cache where that fits and wait
//! otherwise. What is held, the preemptions and the queue go to the metrics.

use super::{EngineLoop, Event, Job, Running};
use engine::Sequence;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

impl EngineLoop<'_> {
    /// Admits what fits: blocks for a job when nothing runs or waits, then admits waiting
    /// sequences (queued jobs taken as slots free up) while the batch has a slot and the first
    /// in line fits. False once the queue is closed (the server is gone).
    pub(super) fn admit_waiting(&mut self, rx: &Receiver<Job>) -> bool {
        if self.running.is_empty() && self.waiting.is_empty() {
            match rx.recv() {
                Ok(job) => self.enqueue(job),
                Err(_) => return false,
            }
        }
        while self.running.len() < self.max_seqs {
            if self.waiting.is_empty() {
                match rx.try_recv() {
                    Ok(job) => {
                        self.enqueue(job);
                        continue;
                    }
                    Err(_) => break,
                }
            }
            if !self.admit_first() {
                break;
            }
        }
        self.count_memory();
        true
    }

    /// A job taken from the queue: checked into a waiting sequence, or failed with the reason
    /// (a request that could never fit the budget, which the API layer refuses first).
    fn enqueue(&mut self, job: Job) {
        if job.events.is_closed() {
            self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        self.metrics
            .prompt_tokens
            .fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
        let n = job.n.max(1);
        let seq = Sequence::waiting(&self.lm.model, job.prompt, job.config, self.ctx)
            .and_then(|seq| self.budget.check(seq.reach(), n).map(|()| seq));
        match seq {
            Ok(mut seq) => {
                self.corpora.attach(job.tenant, &mut seq);
                self.wait(Running {
                    tenant: job.tenant,
                    index: 0,
                    forks: 1..n,
                    seq,
                    events: job.events,
                    arrived: job.arrived,
                    first_token: None,
                    limits: job.limits,
                    checked: 0,
                });
            }
            Err(e) => {
                self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                let _ = job.events.send(Event::Failed(e.to_string()));
            }
        }
    }

    /// Puts `r` among the waiting sequences, by its request's arrival.
    fn wait(&mut self, r: Running) {
        let at = self.waiting.partition_point(|w| w.arrived <= r.arrived);
        self.waiting.insert(at, r);
    }

    /// Admits the first waiting sequence if its first cache fits; whether it did.
    fn admit_first(&mut self) -> bool {
        let Some(first) = self.waiting.front() else {
            return false;
        };
        let held = engine::kv_budget::held(self.running.iter().map(|r| &r.seq), &self.spares);
        let Some((capacity, spare)) = self.budget.admission(&first.seq, held, &mut self.spares)
        else {
            return false;
        };
        let mut r = self.waiting.pop_front().expect("a first waiting sequence");
        self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
        let namespace = self.namespaces[r.tenant.0];
        r.seq.admit(spare, capacity, &mut self.prefix, namespace);
        self.running.push(r);
        true
    }

    /// Before a pass: every running sequence gets the room its next pass needs within the
    /// budget; those that must give way (the newest) are preempted and wait again.
    pub(super) fn fit_budget(&mut self) {
        let keep = {
            let mut seqs: Vec<&mut Sequence> =
                self.running.iter_mut().map(|r| &mut r.seq).collect();
            self.budget.fit(&mut seqs, &mut self.spares)
        };
        let preempted: Vec<Running> = self.running.drain(keep..).collect();
        for mut r in preempted {
            r.seq.preempt(&mut self.prefix, self.namespaces[r.tenant.0]);
            tracing::info!(
                tokens = r.seq.prompt_tokens().len() + r.seq.generated_tokens().len(),
                preemptions = r.seq.preemptions,
                running = self.running.len(),
                "preempted a sequence: the KV cache budget is full"
            );
            self.metrics.preemptions.fetch_add(1, Ordering::Relaxed);
            self.metrics.waiting.fetch_add(1, Ordering::Relaxed);
            self.wait(r);
        }
        self.count_memory();
    }

    /// Choices 1..n of a request start once its first choice has its prompt in the cache: a
    /// copy of that cache where it fits in the budget, else waiting for room (their prompt then
    /// comes from the prefix cache, where the first choice offered it).
    pub(super) fn fork_choices(&mut self) {
        let mut forked = Vec::new();
        let mut waiting = Vec::new();
        let mut held = engine::kv_budget::held(self.running.iter().map(|r| &r.seq), &self.spares);
        for r in self.running.iter_mut() {
            while !r.forks.is_empty() && !r.seq.in_prefill() {
                let index = r.forks.start;
                let bytes = self.budget.cache_bytes(r.seq.fork_capacity());
                let room = self.budget.make_room(bytes, held, &mut self.spares);
                let seq = match room {
                    Some(_) => r.seq.fork_choice(&self.lm.model, index),
                    None => r.seq.choice_waiting(&self.lm.model, index).map(Some),
                };
                let mut seq = match seq {
                    Ok(Some(seq)) => seq,
                    Ok(None) => break,
                    Err(e) => {
                        let _ = r.events.send(Event::Failed(e.to_string()));
                        r.forks = 0..0;
                        break;
                    }
                };
                r.forks.start += 1;
                self.corpora.attach(r.tenant, &mut seq);
                let choice = Running {
                    tenant: r.tenant,
                    index,
                    forks: 0..0,
                    seq,
                    events: r.events.clone(),
                    arrived: r.arrived,
                    first_token: None,
                    limits: r.limits,
                    checked: 0,
                };
                match room {
                    Some(now) => {
                        held = now;
                        forked.push(choice);
                    }
                    None => waiting.push(choice),
                }
            }
        }
        self.running.extend(forked);
        for r in waiting {
            self.metrics.waiting.fetch_add(1, Ordering::Relaxed);
            self.wait(r);
        }
    }

    /// The metrics of the batch's memory and occupancy.
    pub(super) fn count_memory(&self) {
        let held = engine::kv_budget::held(self.running.iter().map(|r| &r.seq), &self.spares);
        let m = self.metrics;
        m.kv_cache_bytes.store(held as u64, Ordering::Relaxed);
        m.kv_cache_budget_bytes
            .store(self.budget.bytes as u64, Ordering::Relaxed);
        m.running
            .store(self.running.len() as u64, Ordering::Relaxed);
    }
}
