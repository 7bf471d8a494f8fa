//! Prometheus text metrics: requests by status, tokens, latency histograms, batch occupancy, and
//! the speculative-decoding counters vLLM exposes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A histogram with fixed upper bounds (seconds).
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            if seconds <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            out.push_str(&format!(
                "{name}_bucket{{le=\"{b}\"}} {}\n",
                c.load(Ordering::Relaxed)
            ));
        }
        let count = self.count.load(Ordering::Relaxed);
        out.push_str(&format!("{name}_bucket{{le=\"+Inf\"}} {count}\n"));
        out.push_str(&format!(
            "{name}_sum {}\n{name}_count {count}\n",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        ));
    }
}

const TTFT_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
const TPOT_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
];

pub struct Metrics {
    pub requests_by_status: Mutex<BTreeMap<u16, u64>>,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub running: AtomicU64,
    /// Requests queued for the batch, and preempted sequences waiting to resume.
    pub waiting: AtomicU64,
    /// Bytes the KV caches of the batch and the spare caches reserve, and their budget.
    pub kv_cache_bytes: AtomicU64,
    pub kv_cache_budget_bytes: AtomicU64,
    /// Sequences preempted to keep the KV caches within their budget.
    pub preemptions: AtomicU64,
    pub draft_tokens: AtomicU64,
    pub accepted_tokens: AtomicU64,
    pub verification_steps: AtomicU64,
    /// Drafted and accepted tokens by draft source, as the engine's `BySource` counts them.
    pub drafted_by_source: Mutex<engine::BySource>,
    pub accepted_by_source: Mutex<engine::BySource>,
    pub time_to_first_token: Histogram,
    pub time_per_output_token: Histogram,
    /// The prefix cache as the engine loop last saw it.
    pub prefix_cache: Mutex<PrefixCacheGauge>,
}

/// What the metrics show of the prefix cache: its counters, the bytes it holds and its budget.
#[derive(Clone, Copy, Debug, Default)]
pub struct PrefixCacheGauge {
    pub stats: engine::prefix_cache::PrefixCacheStats,
    pub bytes: usize,
    pub budget: usize,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests_by_status: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            kv_cache_bytes: AtomicU64::new(0),
            kv_cache_budget_bytes: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            draft_tokens: AtomicU64::new(0),
            accepted_tokens: AtomicU64::new(0),
            verification_steps: AtomicU64::new(0),
            drafted_by_source: Mutex::default(),
            accepted_by_source: Mutex::default(),
            time_to_first_token: Histogram::new(TTFT_BOUNDS),
            time_per_output_token: Histogram::new(TPOT_BOUNDS),
            prefix_cache: Mutex::default(),
        }
    }
}

impl Metrics {
    /// Adds what speculation did in one step of one sequence (`SpecStats::since` the step).
    pub fn count_step(&self, s: &engine::SpecStats) {
        let add = |a: &AtomicU64, v: usize| a.fetch_add(v as u64, Ordering::Relaxed);
        add(&self.draft_tokens, s.draft_tokens);
        add(&self.accepted_tokens, s.accepted_tokens);
        add(&self.verification_steps, s.steps);
        for (counts, more) in [
            (&self.drafted_by_source, &s.drafted_by_source),
            (&self.accepted_by_source, &s.accepted_by_source),
        ] {
            counts.lock().unwrap_or_else(|e| e.into_inner()).add(more);
        }
    }

    /// Records the prefix cache's state (after each engine step).
    pub fn set_prefix_cache(&self, cache: &engine::PrefixCache) {
        *self.prefix_cache.lock().unwrap_or_else(|e| e.into_inner()) = PrefixCacheGauge {
            stats: cache.stats(),
            bytes: cache.bytes(),
            budget: cache.budget(),
        };
    }

    pub fn count_status(&self, status: u16) {
        let mut m = self
            .requests_by_status
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *m.entry(status).or_default() += 1;
    }

    /// The Prometheus text of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_requests(&mut out);
        let pc = *lock(&self.prefix_cache);
        for (name, help, v) in self.counters(&pc) {
            family(&mut out, name, help, "counter", v);
        }
        self.render_by_source(&mut out);
        for (name, help, v) in self.gauges(&pc) {
            family(&mut out, name, help, "gauge", v);
        }
        self.time_to_first_token.render(
            "pld_time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
            &mut out,
        );
        self.time_per_output_token.render(
            "pld_time_per_output_token_seconds",
            "Mean time per generated token after the first, per request.",
            &mut out,
        );
        out
    }

    /// `pld_requests_total`, one sample per status code.
    fn render_requests(&self, out: &mut String) {
        out.push_str("# HELP pld_requests_total HTTP requests by status code.\n# TYPE pld_requests_total counter\n");
        for (status, n) in lock(&self.requests_by_status).iter() {
            out.push_str(&format!("pld_requests_total{{status=\"{status}\"}} {n}\n"));
        }
    }

    /// The counters without labels: name, help and value.
    fn counters(&self, pc: &PrefixCacheGauge) -> [(&'static str, &'static str, u64); 12] {
        [
            (
                "pld_num_preemptions_total",
                "Sequences preempted to keep the KV caches within their budget (resumed later).",
                get(&self.preemptions),
            ),
            (
                "pld_prompt_tokens_total",
                "Prompt tokens processed.",
                get(&self.prompt_tokens),
            ),
            (
                "pld_generation_tokens_total",
                "Tokens generated.",
                get(&self.generation_tokens),
            ),
            (
                "pld_spec_decode_num_draft_tokens_total",
                "Drafted tokens sent to verification.",
                get(&self.draft_tokens),
            ),
            (
                "pld_spec_decode_num_accepted_tokens_total",
                "Drafted tokens accepted.",
                get(&self.accepted_tokens),
            ),
            (
                "pld_spec_decode_num_verification_steps_total",
                "Decoding forward passes (verification steps).",
                get(&self.verification_steps),
            ),
            (
                "pld_prefix_cache_lookups_total",
                "Prompts looked up in the prefix cache.",
                pc.stats.lookups,
            ),
            (
                "pld_prefix_cache_hits_total",
                "Prompts that started from a cached prefix.",
                pc.stats.hits,
            ),
            (
                "pld_prefix_cache_cached_prompt_tokens_total",
                "Prompt tokens whose keys and values came from the prefix cache.",
                pc.stats.cached_tokens,
            ),
            (
                "pld_prefix_cache_evicted_blocks_total",
                "Blocks of 16 positions evicted from the prefix cache.",
                pc.stats.evicted_blocks,
            ),
            (
                "pld_prefix_cache_disk_tokens_total",
                "Of the cached prompt tokens, those read from --prefix-cache-dir.",
                pc.stats.disk_tokens,
            ),
            (
                "pld_prefix_cache_disk_rejected_blocks_total",
                "Block files in --prefix-cache-dir that failed their check on read (recomputed).",
                pc.stats.disk_rejected_blocks,
            ),
        ]
    }

    /// The drafted and accepted tokens by draft source, one sample per source.
    fn render_by_source(&self, out: &mut String) {
        for (name, help, counts) in [
            (
                "pld_spec_decode_draft_tokens_by_source_total",
                "Drafted tokens by draft source.",
                &self.drafted_by_source,
            ),
            (
                "pld_spec_decode_accepted_tokens_by_source_total",
                "Accepted drafted tokens by draft source.",
                &self.accepted_by_source,
            ),
        ] {
            let c = *lock(counts);
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
            for (source, v) in c.iter() {
                let source = source.name();
                out.push_str(&format!("{name}{{source=\"{source}\"}} {v}\n"));
            }
        }
    }

    /// The gauges: name, help and value.
    fn gauges(&self, pc: &PrefixCacheGauge) -> [(&'static str, &'static str, f64); 7] {
        let drafts = get(&self.draft_tokens);
        let rate = if drafts > 0 {
            get(&self.accepted_tokens) as f64 / drafts as f64
        } else {
            0.0
        };
        [
            (
                "pld_num_requests_running",
                "Sequences in the running batch.",
                get(&self.running) as f64,
            ),
            (
                "pld_num_requests_waiting",
                "Requests queued for the batch, and preempted sequences waiting to resume.",
                get(&self.waiting) as f64,
            ),
            (
                "pld_kv_cache_bytes",
                "Bytes the KV caches of the running sequences and the spare caches reserve.",
                get(&self.kv_cache_bytes) as f64,
            ),
            (
                "pld_kv_cache_budget_bytes",
                "The KV caches' byte budget (--kv-cache-bytes).",
                get(&self.kv_cache_budget_bytes) as f64,
            ),
            (
                "pld_spec_decode_draft_acceptance_rate",
                "Accepted over drafted tokens.",
                rate,
            ),
            (
                "pld_prefix_cache_bytes",
                "Bytes of keys and values the prefix cache holds.",
                pc.bytes as f64,
            ),
            (
                "pld_prefix_cache_budget_bytes",
                "The prefix cache's byte budget (0: off).",
                pc.budget as f64,
            ),
        ]
    }
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// The value behind a mutex, poisoned or not (the metrics hold plain counts).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One metric without labels: its `# HELP` and `# TYPE` lines and its sample.
fn family(out: &mut String, name: &str, help: &str, kind: &str, v: impl std::fmt::Display) {
    out.push_str(&format!(
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
    ));
}
