//! The speculation flags shared by `generate`, `chat`, `serve` and the benchmarks, with vLLM's
//! names and its `--speculative-config` JSON. The flags are `drafting::SpecOverrides` itself
//! (through the drafting crate's `clap` feature), so each setting is declared once; they are merged
//! over the defaults by `SpecConfig::merge`, the same rule the server applies to a request.

use clap::Args;
use drafting::{SpecConfig, SpecOverrides};

#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    #[command(flatten)]
    pub overrides: SpecOverrides,
    /// Turn speculation off (same as --num-speculative-tokens 0).
    #[arg(long)]
    pub no_spec: bool,
    /// Always send all K proposed tokens (or tree nodes), instead of as many as are expected to
    /// pay off.
    #[arg(long)]
    pub fixed_draft: bool,
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
        let mut flags = self.overrides.clone();
        if self.no_spec {
            flags.num_speculative_tokens = Some(0);
        }
        if self.fixed_draft {
            flags.adaptive = Some(false);
        }
        SpecConfig::default()
            .merge(speculative_config.as_ref(), &flags)
            .map_err(|e| anyhow::anyhow!("speculation settings: {e}"))
    }
}
