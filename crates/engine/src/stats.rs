//! What speculation did: drafted, accepted and emitted tokens per generation, and per draft
//! source.

pub use drafting::BySource;
use drafting::DraftTree;
use serde::Serialize;
use std::time::Duration;

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

impl SpecStats {
    /// What was counted since `earlier` (a copy of these statistics taken before).
    pub fn since(&self, earlier: &SpecStats) -> SpecStats {
        SpecStats {
            steps: self.steps - earlier.steps,
            draft_tokens: self.draft_tokens - earlier.draft_tokens,
            accepted_tokens: self.accepted_tokens - earlier.accepted_tokens,
            decode_tokens: self.decode_tokens - earlier.decode_tokens,
            drafted_by_source: self.drafted_by_source.since(&earlier.drafted_by_source),
            accepted_by_source: self.accepted_by_source.since(&earlier.accepted_by_source),
            propose_time: self.propose_time.saturating_sub(earlier.propose_time),
        }
    }

    /// Adds `other`'s counts to these (several choices of one request counted together).
    pub fn add(&mut self, other: &SpecStats) {
        self.steps += other.steps;
        self.draft_tokens += other.draft_tokens;
        self.accepted_tokens += other.accepted_tokens;
        self.decode_tokens += other.decode_tokens;
        self.drafted_by_source.add(&other.drafted_by_source);
        self.accepted_by_source.add(&other.accepted_by_source);
        self.propose_time += other.propose_time;
    }

    /// Counts one verified decode step: the draft sent and the path of it that was accepted.
    pub(crate) fn count_step(&mut self, tree: &DraftTree, path: &[usize]) {
        self.steps += 1;
        self.draft_tokens += tree.len();
        self.accepted_tokens += path.len();
        for &s in tree.sources() {
            self.drafted_by_source[s] += 1;
        }
        for &n in path {
            self.accepted_by_source[tree.sources()[n]] += 1;
        }
    }
}
