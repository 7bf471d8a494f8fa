//! Draft tokens for speculative decoding by prompt lookup.
//!
//! Prompt lookup decoding guesses the next tokens of a generation by finding
//! the current suffix of the sequence (the prompt followed by every accepted
//! token) earlier in that sequence, and proposing the tokens that followed
//! it there. The model then verifies the draft in one forward pass. This
//! crate is the drafting half: it works on token ids only and knows nothing
//! of models.
//!
//! At each step the longest suffix n-gram with `min_n <= n <= max_n` that
//! also occurs earlier (with at least one token after it) is looked up,
//! trying `max_n` first; the tokens after the occurrence picked by the
//! [`MatchPolicy`], up to `k` of them and up to the end of the sequence, are
//! the draft. [`MatchPolicy::Scored`] reads many occurrences instead (the 32
//! most recent by default): the draft follows the continuation they agree on,
//! the copy in progress first and then by recency, and stops where they stop
//! agreeing (see [`ScoreParams`]).
//!
//! A [`Drafter`] is one sequence's drafting policy: the index, the draft-length controller
//! ([`DraftLength`], which sends only drafts expected to pay for their rows at the current
//! [`PassCost`]) and what it learns from verified outcomes. [`SpecConfig`] is the one type of the
//! speculation settings, with vLLM's and Hugging Face's names and the merge of defaults, the
//! `speculative_config` object and top-level settings that every surface uses.
//!
//! [`NgramIndex`] keeps a hash map per n-gram size from each n-gram to its
//! occurrences, updated as tokens are pushed (and rewound by
//! [`NgramIndex::truncate`]), so a proposal costs the same at any context
//! length. [`propose_by_scan`] is the simple O(context) scan with the same
//! semantics under [`MatchPolicy::Recent`].
//!
//! ```
//! use drafting::{NgramConfig, NgramIndex};
//!
//! let config = NgramConfig::new(1, 3).unwrap();
//! let mut index = NgramIndex::with_tokens(config, &[5, 6, 7, 8, 9, 1, 2]);
//! index.extend(&[5, 6]);
//! let mut draft = Vec::new();
//! let m = index.propose(2, &mut draft).unwrap();
//! assert_eq!((m.n, m.start, m.len), (2, 0, 2));
//! assert_eq!(draft, [7, 8]);
//! ```

mod by_source;
mod calibration;
mod config;
mod corpus;
mod drafter;
mod evidence;
mod hash;
mod index;
mod length;
pub mod pass_cost;
mod predictions;
mod scan;
mod scored;
mod spec_config;
pub mod tree;

pub use by_source::BySource;
pub use config::{ConfigError, MatchPolicy, NgramConfig, ParsePolicyError, MAX_NGRAM};
pub use corpus::{Corpus, DEFAULT_CORPUS_TOKENS};
pub use drafter::{Drafter, SharedCorpus, SharedPredictions};
pub use index::NgramIndex;
pub use length::{DraftLength, PRIOR_PRICE};
pub use pass_cost::{ContextCost, PassCost};
pub use predictions::PredictionTable;
pub use scan::propose_by_scan;
pub use scored::{ScoreParams, EVIDENCE_MIN_TOKEN_PROBABILITY, MAX_SCORED_OCCURRENCES};
pub use spec_config::{
    SpecConfig, SpecError, SpecMethod, SpecOverrides, TreeSources, DEFAULT_MATCH_POLICY,
    DEFAULT_NUM_SPECULATIVE_TOKENS, DEFAULT_PROMPT_LOOKUP_MAX, DEFAULT_PROMPT_LOOKUP_MIN,
    DEFAULT_TREE_MAX_NODES, DEFAULT_TREE_TOP_K, MAX_TREE_TOP_K, METHODS,
};
pub use tree::{pass_row, path_rows, DraftTree, Source, ROOT};

/// Where a proposal came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    /// Size of the matched suffix n-gram.
    pub n: usize,
    /// Index of the first token of the earlier occurrence.
    pub start: usize,
    /// Number of tokens proposed (at most `k`; fewer near the end of the
    /// sequence).
    pub len: usize,
}

/// Copies the up to `k` tokens that follow the occurrence of an `n`-gram starting at `start` into
/// `out`, and describes the match.
pub(crate) fn copy_continuation(
    tokens: &[u32],
    start: usize,
    n: usize,
    k: usize,
    out: &mut Vec<u32>,
) -> Match {
    let from = start + n;
    let to = from + k.min(tokens.len() - from);
    out.extend_from_slice(&tokens[from..to]);
    Match {
        n,
        start,
        len: to - from,
    }
}

#[cfg(test)]
mod tests;
