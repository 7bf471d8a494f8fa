//! The JSON files the benchmarks write and read back, as types: `bench run`'s results (read again
//! by `bench run --from-results` and `bench drafting`) and `bench forward --json` (read by
//! `bench drafting --forward`).

use drafting::{MatchPolicy, SpecConfig, SpecMethod, TreeSources};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One row of a workload in Spec-Bench's JSONL format: every turn is a user message.
#[derive(Deserialize, Clone)]
pub struct WorkloadRow {
    pub question_id: serde_json::Value,
    pub category: String,
    pub turns: Vec<String>,
    /// A JSON Schema the first turn's answer must meet (`pld bench serve` asks for it with
    /// `response_format`); most rows have none.
    #[serde(default)]
    pub schema: Option<serde_json::Value>,
}

/// Every row of a Spec-Bench JSONL file (blank lines skipped); an error names the file and line.
pub fn read_workload(path: &Path) -> anyhow::Result<Vec<WorkloadRow>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read workload {}: {e}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let row: WorkloadRow = serde_json::from_str(line).map_err(|e| {
            anyhow::anyhow!(
                "{} line {}: not a Spec-Bench row: {e}",
                path.display(),
                i + 1
            )
        })?;
        if row.turns.is_empty() {
            anyhow::bail!("{} line {}: the row has no turns", path.display(), i + 1);
        }
        rows.push(row);
    }
    Ok(rows)
}

/// `results.json` (and `results.partial.json`, which has rows only).
#[derive(Serialize, Deserialize)]
pub struct ResultsFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<RunSummary>,
    pub rows: Vec<RowResult>,
}

/// What one row measured, both ways, over all its turns.
#[derive(Serialize, Deserialize, Default, Clone)]
pub struct RowResult {
    pub question_id: serde_json::Value,
    pub category: String,
    pub new_tokens: usize,
    pub plain_decode_s: f64,
    pub spec_decode_s: f64,
    pub steps: usize,
    pub decode_tokens: usize,
    pub draft_tokens: usize,
    pub accepted_tokens: usize,
    pub propose_s: f64,
    /// Drafted and accepted tokens by draft source (absent in files from before draft trees).
    #[serde(default)]
    pub drafted_by_source: engine::BySource,
    #[serde(default)]
    pub accepted_by_source: engine::BySource,
    pub identical: bool,
    /// Prompt tokens over all turns, and those of them whose keys and values came from the
    /// prefix cache a row's earlier turns left (the same in both modes).
    #[serde(default)]
    pub prompt_tokens: usize,
    #[serde(default)]
    pub cached_tokens: usize,
    /// Summed over turns: wall time to the first text, and end to end (tokenizing, prefill and
    /// decode), in each mode.
    #[serde(default)]
    pub plain_ttft_s: f64,
    #[serde(default)]
    pub spec_ttft_s: f64,
    #[serde(default)]
    pub plain_e2e_s: f64,
    #[serde(default)]
    pub spec_e2e_s: f64,
    /// Per turn: the prompt and the (plain, greedy) output token ids, for offline drafting studies.
    pub turns: Vec<TurnTokens>,
}

#[derive(Serialize, Deserialize, Default, Clone)]
pub struct TurnTokens {
    pub prompt_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
}

/// Totals over a set of rows.
#[derive(Serialize, Deserialize, Default, Clone)]
pub struct Summary {
    pub rows: usize,
    pub new_tokens: usize,
    pub plain_tokens_per_s: f64,
    pub spec_tokens_per_s: f64,
    pub speedup: f64,
    pub mean_accepted_tokens: f64,
    pub acceptance_rate: f64,
    pub propose_us_per_step: f64,
    pub mismatches: usize,
    #[serde(default)]
    pub accepted_by_source: engine::BySource,
    /// Turns run (each row has one or more).
    #[serde(default)]
    pub turns: usize,
    #[serde(default)]
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache (later turns reuse earlier ones).
    #[serde(default)]
    pub cached_tokens: usize,
    /// Mean time to first text per turn, seconds, in each mode.
    #[serde(default)]
    pub plain_ttft_s: f64,
    #[serde(default)]
    pub spec_ttft_s: f64,
    /// Total end-to-end time (prefill and decode) over all turns, seconds, in each mode.
    #[serde(default)]
    pub plain_e2e_s: f64,
    #[serde(default)]
    pub spec_e2e_s: f64,
    /// `plain_e2e_s / spec_e2e_s`: the speedup a user waits for, prefill included.
    #[serde(default)]
    pub e2e_speedup: f64,
}

/// The speculation settings as reports print them (vLLM's names, with the method: `none`,
/// `ngram` or `tree`; the tree's knobs only for a tree).
#[derive(Serialize, Deserialize, Clone)]
pub struct SpeculationReport {
    pub method: String,
    pub num_speculative_tokens: usize,
    pub prompt_lookup_max: usize,
    pub prompt_lookup_min: usize,
    pub match_policy: MatchPolicy,
    pub adaptive: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_max_nodes: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_top_k: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_sources: Option<TreeSources>,
}

impl From<&SpecConfig> for SpeculationReport {
    fn from(c: &SpecConfig) -> Self {
        let tree = c.enabled() && c.method == SpecMethod::Tree;
        SpeculationReport {
            method: if c.enabled() { c.method.name() } else { "none" }.into(),
            num_speculative_tokens: c.num_speculative_tokens,
            prompt_lookup_max: c.prompt_lookup_max,
            prompt_lookup_min: c.prompt_lookup_min,
            match_policy: c.match_policy,
            adaptive: c.adaptive,
            tree_max_nodes: tree.then_some(c.tree_max_nodes),
            tree_top_k: tree.then_some(c.tree_top_k),
            tree_sources: tree.then_some(c.tree_sources),
        }
    }
}

/// `bench run`'s summary: the run's settings, per category and overall.
#[derive(Serialize, Deserialize, Clone)]
pub struct RunSummary {
    pub model: String,
    pub model_path: std::path::PathBuf,
    pub threads: usize,
    pub max_tokens: usize,
    pub speculation: SpeculationReport,
    pub categories: std::collections::BTreeMap<String, Summary>,
    pub overall: Summary,
}

/// One pass size of `bench forward`.
#[derive(Serialize, Deserialize, Clone, Copy)]
pub struct PassTiming {
    pub tokens: usize,
    /// The median pass.
    pub ms: f64,
    /// The fastest pass: on a shared machine, where other tenants slow some passes, the steadier
    /// figure to compare two builds by.
    #[serde(default)]
    pub fastest_ms: f64,
    pub ratio_to_one: f64,
    /// The physical limit of this pass, in ms: max((weight bytes + cache bytes read) / bandwidth,
    /// tokens x multiply-adds per token / int8 peak + attention's multiply-adds / f32 peak) (the
    /// bandwidth term alone where there are no peaks: the plain kernels).
    #[serde(default)]
    pub limit_ms: f64,
    /// `limit_ms / ms`: 1.0 is at the limit.
    #[serde(default)]
    pub share_of_limit: f64,
    /// In a mixture of experts: the experts the pass ran per layer (the union of its rows'
    /// choices, averaged over the layers) and their matrices' bytes over all layers, which the
    /// limit counts instead of a token's average.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts_per_layer: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_bytes: Option<usize>,
    /// Attention's part of the median pass (`engine::model::attention_time`), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_ms: Option<f64>,
    /// Attention's limit at this context: max(the cache bytes it reads / bandwidth, its
    /// multiply-adds / the peak of the kind it runs: bf16 tiles on AMX, f32 otherwise), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_limit_ms: Option<f64>,
}

fn f32_cache() -> String {
    "f32".into()
}

/// Every figure of `bench forward` at one thread count.
#[derive(Serialize, Deserialize, Clone)]
pub struct ForwardRun {
    pub model: String,
    pub model_path: std::path::PathBuf,
    pub threads: usize,
    pub isa: String,
    pub context: usize,
    pub passes: Vec<PassTiming>,
    pub decode_tokens_per_s: f64,
    pub prefill_tokens: usize,
    pub prefill_tokens_per_s: f64,
    pub weight_bytes_per_token: usize,
    /// Bytes of keys and values a pass reads at `context` positions (part of the decode bound).
    #[serde(default)]
    pub cache_bytes_per_token: usize,
    /// What the KV cache stored keys and values as (`f16` or `f32`; runs before it was recorded
    /// were f32).
    #[serde(default = "f32_cache")]
    pub kv_cache_dtype: String,
    /// f32 multiply-adds of one row's attention at `context + 1` positions.
    #[serde(default)]
    pub attention_macs_per_token: usize,
    pub bandwidth_gb_s: f64,
    /// Bandwidth over the bytes a decode step reads: the weights and the cache at `context`.
    pub bandwidth_bound_tokens_per_s: f64,
    pub decode_fraction_of_bound: f64,
    /// Multiply-adds of the matrix products per token.
    #[serde(default)]
    pub macs_per_token: usize,
    /// The int8 multiply-add peak of the kernels in use over these threads, G/s (absent for the
    /// plain kernels).
    pub int8_peak_gmacs: Option<f64>,
    /// With the AMX kernels: the int8 peak of AMX tiles over these threads, G/s, which passes of
    /// `engine::kernels::AMX_MIN_ROWS` rows or more (prefill chunks) use; `int8_peak_gmacs` is
    /// then the AVX-512 VNNI peak of the smaller passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amx_int8_peak_gmacs: Option<f64>,
    /// Where prompt rows take bf16 tiles (`engine::kernels::prompt_arithmetic`): the bf16 peak
    /// of tiles over these threads, G/s, the prefill's compute limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amx_bf16_peak_gmacs: Option<f64>,
    /// The arithmetic of prompt rows (`engine::kernels::prompt_arithmetic`).
    #[serde(default)]
    pub prompt_rows: String,
    /// Bytes of the weights' copy that prompt rows read (`PLD_PROMPT_ROWS=int8`), beside the
    /// model's own.
    #[serde(default)]
    pub prompt_copy_bytes: usize,
    /// The prefill's products' multiply-adds per second over the peak of the tiles prompt rows
    /// take (int8 for the rotated int8 arithmetic, else bf16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_fraction_of_tile_peak: Option<f64>,
    /// The prefill's time per chunk (`engine::step::PREFILL_CHUNK` tokens), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_chunk_ms: Option<f64>,
    /// The shares of the prefill's time in the layers' matrix products
    /// (`engine::model::products_time`) and in attention (`engine::model::attention_time`); the
    /// rest is norms, rotations, activations and the output head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_products_share: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_attention_share: Option<f64>,
    /// The layers' products' multiply-adds (the head's left out) over their own time, as a share
    /// of the peak of the tiles prompt rows take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_products_fraction_of_tile_peak: Option<f64>,
    /// The f32 multiply-add peak of the attention kernels over these threads, G/s (absent for the
    /// plain kernels).
    #[serde(default)]
    pub f32_peak_gmacs: Option<f64>,
    /// Prefill rate over its compute limit.
    pub prefill_fraction_of_compute_limit: Option<f64>,
    /// The compute limit of the prefill: its products at the int8 peak and its attention at the
    /// f32 peak.
    #[serde(default)]
    pub prefill_compute_limit_tokens_per_s: Option<f64>,
}

/// `bench forward --json`: the run with the most threads at the top level, every run in `runs`.
#[derive(Serialize, Deserialize, Clone)]
pub struct ForwardReport {
    #[serde(flatten)]
    pub top: ForwardRun,
    pub runs: Vec<ForwardRun>,
}

/// Reads and parses a JSON file, naming the file in every error.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not {what}: {e}", path.display()))
}
