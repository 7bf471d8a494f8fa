//! The speculation flags shared by `generate`, `serve` and the benchmarks, with vLLM's names and
//! its `--speculative-config` JSON. They become a `drafting::SpecOverrides` and are merged over the
//! defaults by `SpecConfig::merge`, the same rule the server applies to a request.

use clap::Args;
use drafting::{MatchPolicy, SpecConfig, SpecOverrides, TreeSources};

#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    /// Tokens drafted per step by prompt lookup (0 turns speculation off).
    #[arg(long, value_name = "K")]
    pub num_speculative_tokens: Option<usize>,
    /// Turn speculation off (same as --num-speculative-tokens 0).
    #[arg(long)]
    pub no_spec: bool,
    /// Longest n-gram to match.
    #[arg(long, alias = "ngram-prompt-lookup-max", value_name = "N")]
    pub prompt_lookup_max: Option<usize>,
    /// Shortest n-gram to match.
    #[arg(long, alias = "ngram-prompt-lookup-min", value_name = "N")]
    pub prompt_lookup_min: Option<usize>,
    /// Which earlier occurrence to copy from: recent, earliest, longest, scored (every earlier
    /// occurrence of the longest match, by how often and how recently each continuation followed),
    /// or evidence (the default: scored, each draft cut where its estimated chance of acceptance
    /// stops paying for the rows it adds).
    #[arg(long, value_name = "POLICY")]
    pub match_policy: Option<MatchPolicy>,
    /// Always send all K proposed tokens (or tree nodes), instead of as many as are expected to
    /// pay off.
    #[arg(long)]
    pub fixed_draft: bool,
    /// How to draft: `ngram` (one prompt-lookup chain, vLLM's method) or `tree` (a draft tree from
    /// the n-gram index, the model's own earlier predictions and, in the server, earlier requests).
    #[arg(long, value_name = "METHOD")]
    pub spec_method: Option<String>,
    /// Most nodes of a draft tree (method tree, 1-63).
    #[arg(long, value_name = "N")]
    pub tree_max_nodes: Option<usize>,
    /// Candidates per token kept from the model's predictions (method tree, 1-8).
    #[arg(long, value_name = "K")]
    pub tree_top_k: Option<usize>,
    /// Sources of a draft tree, comma-separated: ngram, model, corpus (method tree).
    #[arg(long, value_name = "LIST")]
    pub tree_sources: Option<TreeSources>,
    /// vLLM-style JSON, e.g. '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3,"prompt_lookup_min":1}'.
    #[arg(long, value_name = "JSON")]
    pub speculative_config: Option<String>,
}

impl SpecArgs {
    /// The settings these flags ask for: defaults, then `--speculative-config`, then the flags.
    pub fn resolve(&self) -> anyhow::Result<SpecConfig> {
        let speculative_config: Option<SpecOverrides> = self
            .speculative_config
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--speculative-config is not valid: {e}"))?;
        let flags = SpecOverrides {
            method: self.spec_method.clone(),
            num_speculative_tokens: if self.no_spec {
                Some(0)
            } else {
                self.num_speculative_tokens
            },
            prompt_lookup_max: self.prompt_lookup_max,
            prompt_lookup_min: self.prompt_lookup_min,
            match_policy: self.match_policy,
            adaptive: self.fixed_draft.then_some(false),
            tree_max_nodes: self.tree_max_nodes,
            tree_top_k: self.tree_top_k,
            tree_sources: self.tree_sources,
        };
        SpecConfig::default()
            .merge(speculative_config.as_ref(), &flags)
            .map_err(|e| anyhow::anyhow!("speculation settings: {e}"))
    }
}
