//! The speculation flags shared by `generate`, `bench` and (later) `serve`, with vLLM's names and
//! its `--speculative-config` JSON.

use clap::Args;
use drafting::MatchPolicy;
use engine::generate::{
    DEFAULT_NUM_SPECULATIVE_TOKENS, DEFAULT_PROMPT_LOOKUP_MAX, DEFAULT_PROMPT_LOOKUP_MIN,
};

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
    /// Which earlier occurrence to copy from: recent, earliest or longest.
    #[arg(long, value_name = "POLICY")]
    pub match_policy: Option<MatchPolicy>,
    /// Always send all K proposed tokens, instead of as many as are expected to pay off.
    #[arg(long)]
    pub fixed_draft: bool,
    /// vLLM-style JSON, e.g. '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3,"prompt_lookup_min":1}'.
    #[arg(long, value_name = "JSON")]
    pub speculative_config: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SpeculativeConfig {
    method: Option<String>,
    num_speculative_tokens: Option<usize>,
    prompt_lookup_max: Option<usize>,
    prompt_lookup_min: Option<usize>,
}

/// The resolved speculation settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Speculation {
    pub num_tokens: usize,
    pub max_n: usize,
    pub min_n: usize,
    pub policy: MatchPolicy,
    pub adaptive: bool,
}

impl SpecArgs {
    pub fn resolve(&self) -> anyhow::Result<Speculation> {
        let mut s = Speculation {
            num_tokens: DEFAULT_NUM_SPECULATIVE_TOKENS,
            max_n: DEFAULT_PROMPT_LOOKUP_MAX,
            min_n: DEFAULT_PROMPT_LOOKUP_MIN,
            policy: MatchPolicy::default(),
            adaptive: !self.fixed_draft,
        };
        if let Some(json) = &self.speculative_config {
            let c: SpeculativeConfig = serde_json::from_str(json)
                .map_err(|e| anyhow::anyhow!("--speculative-config is not valid: {e}"))?;
            if let Some(m) = c.method.as_deref() {
                if m != "ngram" && m != "prompt_lookup" {
                    anyhow::bail!(
                        "--speculative-config: method '{m}' is not supported (pld drafts with \"ngram\")"
                    );
                }
            }
            s.num_tokens = c.num_speculative_tokens.unwrap_or(s.num_tokens);
            s.max_n = c.prompt_lookup_max.unwrap_or(s.max_n);
            s.min_n = c.prompt_lookup_min.unwrap_or(s.min_n);
        }
        s.num_tokens = self.num_speculative_tokens.unwrap_or(s.num_tokens);
        s.max_n = self.prompt_lookup_max.unwrap_or(s.max_n);
        s.min_n = self.prompt_lookup_min.unwrap_or(s.min_n);
        s.policy = self.match_policy.unwrap_or(s.policy);
        if self.no_spec {
            s.num_tokens = 0;
        }
        if s.num_tokens > 0 {
            drafting::NgramConfig::new(s.min_n, s.max_n)
                .map_err(|e| anyhow::anyhow!("speculation settings: {e}"))?;
        }
        Ok(s)
    }
}

impl Speculation {
    pub fn apply(&self, config: &mut engine::GenerationConfig) {
        config.prompt_lookup_num_tokens = self.num_tokens;
        config.max_matching_ngram_size = self.max_n;
        config.prompt_lookup_min = self.min_n;
        config.match_policy = self.policy;
        config.adaptive_draft = self.adaptive;
    }
}

impl From<Speculation> for server::SpecDefaults {
    fn from(s: Speculation) -> Self {
        server::SpecDefaults {
            num_tokens: s.num_tokens,
            max_n: s.max_n,
            min_n: s.min_n,
            policy: s.policy,
            adaptive: s.adaptive,
        }
    }
}
