//! The speculation settings, one type for every surface.
//!
//! [`SpecConfig`] is what a generation runs with. It is spelled with vLLM's names
//! (`num_speculative_tokens`, `prompt_lookup_max`, `prompt_lookup_min`) and also accepts Hugging
//! Face's (`prompt_lookup_num_tokens`, `max_matching_ngram_size`) when read from JSON. A surface (the
//! CLI's flags, an HTTP request) states only what it wants changed, as a [`SpecOverrides`];
//! [`SpecConfig::merge`] lays those over the defaults in one fixed order and checks the result, with
//! an error that names the offending field. vLLM's `speculative_config` object is a
//! [`SpecOverrides`] too, read with the same rules (unknown fields refused) everywhere.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::by_source::BySource;
use crate::config::{ConfigError, MatchPolicy, NgramConfig};
use crate::tree::Source;

/// Default number of drafted tokens per step (how it was chosen: docs/bench/defaults.md).
pub const DEFAULT_NUM_SPECULATIVE_TOKENS: usize = 8;
/// Default longest n-gram matched.
pub const DEFAULT_PROMPT_LOOKUP_MAX: usize = 4;
/// Default shortest n-gram matched.
pub const DEFAULT_PROMPT_LOOKUP_MIN: usize = 1;
/// Default match policy of speculation (the bare [`NgramIndex`](crate::NgramIndex) defaults to
/// `Recent`, its simplest semantics): on the dev workloads `Evidence` took more tokens per pass
/// than `Recent` in every category, in pld's engine and inside vLLM (docs/bench/vllm).
pub const DEFAULT_MATCH_POLICY: MatchPolicy = MatchPolicy::Evidence;

/// The `method` names accepted: `ngram` (vLLM's name) and `prompt_lookup` mean the single
/// prompt-lookup chain; `tree` means a draft tree from several sources.
pub const METHODS: [&str; 3] = ["ngram", "prompt_lookup", "tree"];

/// Default most nodes of a draft tree.
pub const DEFAULT_TREE_MAX_NODES: usize = 24;
/// Default candidates per token in the model's own prediction table.
pub const DEFAULT_TREE_TOP_K: usize = 4;
/// Largest `tree_top_k`.
pub const MAX_TREE_TOP_K: usize = 8;

/// How drafts are shaped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecMethod {
    /// One chain per step from the n-gram index over the sequence (vLLM's `ngram`).
    #[default]
    Ngram,
    /// A tree per step, merged from the enabled [`TreeSources`] and sized by cost.
    Tree,
}

impl SpecMethod {
    pub const fn name(self) -> &'static str {
        match self {
            SpecMethod::Ngram => "ngram",
            SpecMethod::Tree => "tree",
        }
    }

    /// The method a `method` name means, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "ngram" | "prompt_lookup" => Some(SpecMethod::Ngram),
            "tree" => Some(SpecMethod::Tree),
            _ => None,
        }
    }
}

/// Which sources feed a draft tree (all by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeSources(BySource<bool>);

impl Default for TreeSources {
    fn default() -> Self {
        TreeSources(BySource::from_fn(|_| true))
    }
}

impl TreeSources {
    /// Whether `source` is on.
    pub fn has(&self, source: Source) -> bool {
        self.0[source]
    }

    fn names(&self) -> Vec<&'static str> {
        Source::ALL
            .into_iter()
            .filter(|s| self.has(*s))
            .map(|s| s.name())
            .collect()
    }
}

impl std::str::FromStr for TreeSources {
    type Err = String;

    /// A comma-separated list of source names (`ngram,model,corpus`).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut on = BySource::default();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let source = Source::from_name(name).ok_or_else(|| {
                let known: Vec<_> = Source::ALL.iter().map(|s| s.name()).collect();
                format!(
                    "unknown draft source '{name}' (known: {})",
                    known.join(", ")
                )
            })?;
            on[source] = true;
        }
        Ok(TreeSources(on))
    }
}

impl Serialize for TreeSources {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.names().serialize(s)
    }
}

impl<'de> Deserialize<'de> for TreeSources {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        names.join(",").parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for SpecMethod {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for SpecMethod {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        SpecMethod::from_name(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown speculative method '{s}' (known: ngram, prompt_lookup, tree)"
            ))
        })
    }
}

/// How a generation drafts: how many tokens per step, from which n-gram sizes, and whether the
/// draft is cut to what is expected to pay for its verification.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpecConfig {
    /// A chain from the n-gram index (`ngram`) or a tree from several sources (`tree`).
    pub method: SpecMethod,
    /// Tokens drafted per step at most; 0 turns speculation off.
    #[serde(alias = "prompt_lookup_num_tokens")]
    pub num_speculative_tokens: usize,
    /// The longest n-gram matched (tried first).
    #[serde(alias = "max_matching_ngram_size")]
    pub prompt_lookup_max: usize,
    /// The shortest n-gram matched.
    pub prompt_lookup_min: usize,
    /// Which earlier occurrence of the n-gram to copy from.
    pub match_policy: MatchPolicy,
    /// Send only as many drafted tokens as are expected to pay for their verification (estimated
    /// from the acceptance so far and the measured pass cost); false sends every proposed token.
    pub adaptive: bool,
    /// Most nodes of a draft tree (method `tree`); a tree is also at most
    /// `num_speculative_tokens` deep.
    pub tree_max_nodes: usize,
    /// Candidates kept per token in the model's prediction table (method `tree`).
    pub tree_top_k: usize,
    /// The sources a tree is drafted from (method `tree`).
    pub tree_sources: TreeSources,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            method: SpecMethod::default(),
            num_speculative_tokens: DEFAULT_NUM_SPECULATIVE_TOKENS,
            prompt_lookup_max: DEFAULT_PROMPT_LOOKUP_MAX,
            prompt_lookup_min: DEFAULT_PROMPT_LOOKUP_MIN,
            match_policy: DEFAULT_MATCH_POLICY,
            adaptive: true,
            tree_max_nodes: DEFAULT_TREE_MAX_NODES,
            tree_top_k: DEFAULT_TREE_TOP_K,
            tree_sources: TreeSources::default(),
        }
    }
}

/// What one surface asks to change in a [`SpecConfig`]; `None` keeps the value below it. This is
/// also vLLM's `speculative_config` object (with `method`), read the same way by the CLI and the
/// server: unknown fields are an error. With the `clap` feature it is also the CLI's speculation
/// flags (the field docs are their help), `--spec-method` for `method`; `adaptive` is the CLI's
/// `--fixed-draft`, which is not a field's flag.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct SpecOverrides {
    /// How to draft: `ngram` (one prompt-lookup chain, vLLM's method; `prompt_lookup` is another
    /// name for it) or `tree` (a draft tree from the n-gram index, the model's own earlier
    /// predictions and, in the server, earlier requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long = "spec-method", value_name = "METHOD"))]
    pub method: Option<String>,
    /// Tokens drafted per step by prompt lookup (0 turns speculation off).
    #[serde(
        default,
        alias = "prompt_lookup_num_tokens",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "clap", arg(long, value_name = "K"))]
    pub num_speculative_tokens: Option<usize>,
    /// Longest n-gram to match.
    #[serde(
        default,
        alias = "max_matching_ngram_size",
        alias = "ngram_prompt_lookup_max",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "clap",
        arg(long, alias = "ngram-prompt-lookup-max", value_name = "N")
    )]
    pub prompt_lookup_max: Option<usize>,
    /// Shortest n-gram to match.
    #[serde(
        default,
        alias = "ngram_prompt_lookup_min",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "clap",
        arg(long, alias = "ngram-prompt-lookup-min", value_name = "N")
    )]
    pub prompt_lookup_min: Option<usize>,
    /// Which earlier occurrence to copy from: recent, earliest, longest, scored (every earlier
    /// occurrence of the longest match, by how often and how recently each continuation followed),
    /// or evidence (the default: scored, each draft cut where its estimated chance of acceptance
    /// stops paying for the rows it adds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "POLICY"))]
    pub match_policy: Option<MatchPolicy>,
    /// Send only as many drafted tokens as are expected to pay off (false: all K).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(skip))]
    pub adaptive: Option<bool>,
    /// Most nodes of a draft tree (method tree, 1-63).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub tree_max_nodes: Option<usize>,
    /// Candidates per token kept from the model's predictions (method tree, 1-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "K"))]
    pub tree_top_k: Option<usize>,
    /// Sources of a draft tree, comma-separated: ngram, model, corpus (method tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "LIST"))]
    pub tree_sources: Option<TreeSources>,
}

/// A speculation setting that was refused, with the field it concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    /// The field at fault, as the user spelled it on the JSON surfaces (e.g. `prompt_lookup_min`,
    /// `speculative_config.method`).
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for SpecError {}

impl SpecConfig {
    /// Speculation off, everything else default.
    pub fn off() -> Self {
        SpecConfig {
            num_speculative_tokens: 0,
            ..Default::default()
        }
    }

    /// Whether any token is drafted.
    pub fn enabled(&self) -> bool {
        self.num_speculative_tokens > 0
    }

    /// The n-gram lookup these settings describe.
    pub fn ngram(&self) -> NgramConfig {
        NgramConfig {
            min_n: self.prompt_lookup_min,
            max_n: self.prompt_lookup_max,
            policy: self.match_policy,
        }
    }

    /// The one check of the settings, made by [`merge`](Self::merge) (the n-gram range and the
    /// tree's shape matter only when speculation is on); an error names the field at fault.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.enabled() {
            self.ngram().validate().map_err(|e| SpecError {
                field: match e {
                    ConfigError::MaxTooLarge { .. } => "prompt_lookup_max",
                    ConfigError::MinNZero | ConfigError::MinAboveMax { .. } => "prompt_lookup_min",
                },
                message: e.to_string(),
            })?;
        }
        if self.enabled() && self.method == SpecMethod::Tree {
            if !(1..=crate::tree::MAX_NODES).contains(&self.tree_max_nodes) {
                return Err(SpecError {
                    field: "tree_max_nodes",
                    message: format!(
                        "tree_max_nodes must be between 1 and {}, not {}",
                        crate::tree::MAX_NODES,
                        self.tree_max_nodes
                    ),
                });
            }
            if !(1..=MAX_TREE_TOP_K).contains(&self.tree_top_k) {
                return Err(SpecError {
                    field: "tree_top_k",
                    message: format!(
                        "tree_top_k must be between 1 and {MAX_TREE_TOP_K}, not {}",
                        self.tree_top_k
                    ),
                });
            }
            if self.tree_sources.names().is_empty() {
                return Err(SpecError {
                    field: "tree_sources",
                    message: "a tree needs at least one draft source".into(),
                });
            }
        }
        Ok(())
    }

    /// The one precedence rule of every surface: `self` (the defaults), then the
    /// `speculative_config` object, then the top-level settings (flags or request fields). The
    /// result is validated, and the rest (the engine, the drafter) trusts it.
    pub fn merge(
        &self,
        speculative_config: Option<&SpecOverrides>,
        top_level: &SpecOverrides,
    ) -> Result<SpecConfig, SpecError> {
        let mut out = *self;
        if let Some(sc) = speculative_config {
            out.apply(sc, "speculative_config.method")?;
        }
        out.apply(top_level, "method")?;
        out.validate()?;
        Ok(out)
    }

    fn apply(&mut self, o: &SpecOverrides, method_field: &'static str) -> Result<(), SpecError> {
        if let Some(m) = o.method.as_deref() {
            self.method = SpecMethod::from_name(m).ok_or_else(|| SpecError {
                field: method_field,
                message: format!(
                    "speculative method '{m}' is not supported (pld drafts with \"ngram\", \
                     its alias \"prompt_lookup\", or \"tree\")"
                ),
            })?;
        }
        let SpecOverrides {
            method: _,
            num_speculative_tokens,
            prompt_lookup_max,
            prompt_lookup_min,
            match_policy,
            adaptive,
            tree_max_nodes,
            tree_top_k,
            tree_sources,
        } = o;
        set(&mut self.num_speculative_tokens, num_speculative_tokens);
        set(&mut self.prompt_lookup_max, prompt_lookup_max);
        set(&mut self.prompt_lookup_min, prompt_lookup_min);
        set(&mut self.match_policy, match_policy);
        set(&mut self.adaptive, adaptive);
        set(&mut self.tree_max_nodes, tree_max_nodes);
        set(&mut self.tree_top_k, tree_top_k);
        set(&mut self.tree_sources, tree_sources);
        Ok(())
    }
}

fn set<T: Copy>(field: &mut T, value: &Option<T>) {
    if let Some(v) = value {
        *field = *v;
    }
}

impl Serialize for MatchPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for MatchPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<SpecOverrides, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn later_layers_win() {
        let sc = parse(r#"{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3}"#)
            .unwrap();
        let top = SpecOverrides {
            num_speculative_tokens: Some(2),
            ..Default::default()
        };
        let c = SpecConfig::default().merge(Some(&sc), &top).unwrap();
        assert_eq!(
            c.num_speculative_tokens, 2,
            "top level over speculative_config"
        );
        assert_eq!(c.prompt_lookup_max, 3, "speculative_config over defaults");
        assert_eq!(c.prompt_lookup_min, DEFAULT_PROMPT_LOOKUP_MIN);
        assert_eq!(c.match_policy, MatchPolicy::Evidence);
        let c = SpecConfig::default()
            .merge(None, &SpecOverrides::default())
            .unwrap();
        assert_eq!(c, SpecConfig::default());
    }

    #[test]
    fn hugging_face_and_old_vllm_names_are_accepted() {
        let o = parse(r#"{"prompt_lookup_num_tokens":5,"max_matching_ngram_size":2}"#).unwrap();
        assert_eq!(o.num_speculative_tokens, Some(5));
        assert_eq!(o.prompt_lookup_max, Some(2));
        let o = parse(r#"{"ngram_prompt_lookup_max":6,"ngram_prompt_lookup_min":2}"#).unwrap();
        assert_eq!(
            (o.prompt_lookup_max, o.prompt_lookup_min),
            (Some(6), Some(2))
        );
        let c: SpecConfig =
            serde_json::from_str(r#"{"prompt_lookup_num_tokens":3,"match_policy":"longest"}"#)
                .unwrap();
        assert_eq!(c.num_speculative_tokens, 3);
        assert_eq!(c.match_policy, MatchPolicy::LongestContinuation);
        assert_eq!(c.prompt_lookup_max, DEFAULT_PROMPT_LOOKUP_MAX);
        let o = parse(r#"{"method":"ngram","match_policy":"scored"}"#).unwrap();
        assert_eq!(o.match_policy, Some(MatchPolicy::Scored));
        let c = SpecConfig::default()
            .merge(Some(&o), &SpecOverrides::default())
            .unwrap();
        assert_eq!(c.match_policy, MatchPolicy::Scored);
        assert!(serde_json::to_string(&c)
            .unwrap()
            .contains("\"match_policy\":\"scored\""));
    }

    #[test]
    fn unknown_fields_and_methods_are_refused_by_name() {
        let e = parse(r#"{"method":"ngram","num_lookahead":3}"#).unwrap_err();
        assert!(e.to_string().contains("num_lookahead"), "{e}");
        let e = serde_json::from_str::<SpecConfig>(r#"{"k":3}"#).unwrap_err();
        assert!(e.to_string().contains("`k`"), "{e}");
        let sc = parse(r#"{"method":"eagle"}"#).unwrap();
        let e = SpecConfig::default()
            .merge(Some(&sc), &SpecOverrides::default())
            .unwrap_err();
        assert_eq!(e.field, "speculative_config.method");
        assert!(e.message.contains("eagle"), "{e}");
        let e = parse(r#"{"tree_sources":["ngram","oracle"]}"#).unwrap_err();
        assert!(e.to_string().contains("oracle"), "{e}");
        let e = parse(r#"{"match_policy":"newest"}"#).unwrap_err();
        assert!(e.to_string().contains("newest"), "{e}");
        assert!(
            e.to_string().contains("evidence"),
            "the valid names are listed: {e}"
        );
        // A threshold is not a setting of its own: evidence sizing is a policy.
        let e = parse(r#"{"match_policy":"evidence","min_token_probability":0.1}"#).unwrap_err();
        assert!(e.to_string().contains("min_token_probability"), "{e}");
    }

    #[test]
    fn evidence_is_a_policy() {
        let o = parse(r#"{"method":"ngram","match_policy":"evidence","adaptive":false}"#).unwrap();
        let c = SpecConfig::default()
            .merge(Some(&o), &SpecOverrides::default())
            .unwrap();
        assert_eq!(c.match_policy, MatchPolicy::Evidence);
        // A lone 1-token match: evidence drafts 4 tokens where scored would draft 8.
        let mut d = crate::Drafter::new(&c, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 1]);
        assert_eq!(d.propose(8, None).len(), 4);
    }

    #[test]
    fn range_errors_name_the_field() {
        let bad = |min, max| SpecOverrides {
            prompt_lookup_min: Some(min),
            prompt_lookup_max: Some(max),
            ..Default::default()
        };
        let e = SpecConfig::default().merge(None, &bad(0, 3)).unwrap_err();
        assert_eq!(e.field, "prompt_lookup_min");
        let e = SpecConfig::default().merge(None, &bad(4, 2)).unwrap_err();
        assert_eq!(e.field, "prompt_lookup_min");
        assert!(e.to_string().contains("prompt_lookup_min"), "{e}");
        let e = SpecConfig::default().merge(None, &bad(1, 99)).unwrap_err();
        assert_eq!(e.field, "prompt_lookup_max");
        // With speculation off the range is not checked.
        let mut off = bad(0, 3);
        off.num_speculative_tokens = Some(0);
        assert!(!SpecConfig::default().merge(None, &off).unwrap().enabled());
    }

    #[test]
    fn tree_method_and_its_knobs() {
        let sc =
            parse(r#"{"method":"tree","tree_max_nodes":40,"tree_sources":["model"]}"#).unwrap();
        let c = SpecConfig::default()
            .merge(Some(&sc), &SpecOverrides::default())
            .unwrap();
        assert_eq!(c.method, SpecMethod::Tree);
        assert_eq!(c.tree_max_nodes, 40);
        assert!(c.tree_sources.has(Source::Model) && !c.tree_sources.has(Source::Ngram));
        // The top level can switch back to vLLM's chain.
        let top = SpecOverrides {
            method: Some("ngram".into()),
            ..Default::default()
        };
        assert_eq!(
            SpecConfig::default().merge(Some(&sc), &top).unwrap().method,
            SpecMethod::Ngram
        );
        let bad = parse(r#"{"method":"tree","tree_max_nodes":64}"#).unwrap();
        let e = SpecConfig::default()
            .merge(Some(&bad), &SpecOverrides::default())
            .unwrap_err();
        assert_eq!(e.field, "tree_max_nodes");
        let bad = parse(r#"{"method":"tree","tree_sources":[]}"#).unwrap();
        let e = SpecConfig::default()
            .merge(Some(&bad), &SpecOverrides::default())
            .unwrap_err();
        assert_eq!(e.field, "tree_sources");
    }

    #[test]
    fn round_trips_through_json() {
        let c = SpecConfig {
            num_speculative_tokens: 6,
            prompt_lookup_max: 3,
            prompt_lookup_min: 2,
            match_policy: MatchPolicy::Earliest,
            adaptive: false,
            method: SpecMethod::Tree,
            tree_max_nodes: 12,
            tree_top_k: 3,
            tree_sources: "ngram,corpus".parse().unwrap(),
        };
        let text = serde_json::to_string(&c).unwrap();
        assert!(text.contains("\"match_policy\":\"earliest\""), "{text}");
        assert!(
            text.contains("\"tree_sources\":[\"ngram\",\"corpus\"]"),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<SpecConfig>(&text).unwrap(), c);
    }
}
