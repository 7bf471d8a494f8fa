//! Configuration of the n-gram proposer: the range of n-gram sizes to try and
//! which earlier occurrence to draft from.

use std::fmt;
use std::str::FromStr;

/// Largest n-gram size an [`NgramConfig`] may ask for.
pub const MAX_NGRAM: usize = 16;

/// Which earlier occurrence of the suffix n-gram supplies the draft. The index's default is
/// `Recent`; speculation's is [`DEFAULT_MATCH_POLICY`](crate::DEFAULT_MATCH_POLICY).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum MatchPolicy {
    /// The most recent earlier occurrence.
    #[default]
    Recent,
    /// The first occurrence in the sequence.
    Earliest,
    /// Of the earliest and the most recent occurrence, the one that can
    /// supply more continuation tokens (counting at most `k`); a tie goes to
    /// the most recent.
    LongestContinuation,
    /// The continuation the earlier occurrences agree on: up to
    /// [`ScoreParams::max_occurrences`](crate::ScoreParams) of the most recent occurrences are
    /// grouped by the tokens that followed them, each weighted by its rank (the copy in
    /// progress first, then by recency), and the draft follows the heaviest branch while the
    /// estimated probability of the whole path stays above
    /// [`ScoreParams::min_path_probability`](crate::ScoreParams). With a single occurrence it
    /// drafts what `Recent` and `Earliest` draft (they pick that same occurrence).
    Scored,
    /// `Scored` with drafts sized by evidence (see `evidence.rs`): each token is kept while its
    /// estimated probability of acceptance (from how many examined occurrences continue with it,
    /// how many otherwise, and how long their context agrees) stays above a threshold, and a
    /// [`Drafter`](crate::Drafter) calibrates those estimates by the sequence's own accepted
    /// drafts. Settings: [`ScoreParams::evidence`](crate::ScoreParams::evidence), unless others
    /// are set.
    Evidence,
}

impl MatchPolicy {
    /// Every policy, in declaration order.
    pub const ALL: [MatchPolicy; 5] = [
        MatchPolicy::Recent,
        MatchPolicy::Earliest,
        MatchPolicy::LongestContinuation,
        MatchPolicy::Scored,
        MatchPolicy::Evidence,
    ];

    /// The name accepted by [`FromStr`] and printed by [`Display`](fmt::Display).
    pub const fn name(self) -> &'static str {
        match self {
            MatchPolicy::Recent => "recent",
            MatchPolicy::Earliest => "earliest",
            MatchPolicy::LongestContinuation => "longest",
            MatchPolicy::Scored => "scored",
            MatchPolicy::Evidence => "evidence",
        }
    }

    /// Whether drafts read many occurrences (`Scored` and `Evidence`).
    pub const fn is_scored(self) -> bool {
        matches!(self, MatchPolicy::Scored | MatchPolicy::Evidence)
    }
}

impl fmt::Display for MatchPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error returned when a string names no [`MatchPolicy`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsePolicyError {
    input: String,
}

impl ParsePolicyError {
    /// The string that failed to parse.
    pub fn input(&self) -> &str {
        &self.input
    }
}

impl fmt::Display for ParsePolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown match policy {:?}; valid policies are: recent, earliest, longest, scored, \
             evidence",
            self.input
        )
    }
}

impl std::error::Error for ParsePolicyError {}

impl FromStr for MatchPolicy {
    type Err = ParsePolicyError;

    /// Parses `recent`, `earliest`, `longest`, `scored` or `evidence` (ASCII case is ignored, and
    /// surrounding whitespace is trimmed).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        MatchPolicy::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(trimmed))
            .ok_or_else(|| ParsePolicyError {
                input: s.to_owned(),
            })
    }
}

/// Why an [`NgramConfig`] was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// `min_n` was 0; an n-gram needs at least one token.
    MinNZero,
    /// `min_n` was larger than `max_n`.
    MinAboveMax {
        /// The requested smallest size.
        min_n: usize,
        /// The requested largest size.
        max_n: usize,
    },
    /// `max_n` was larger than [`MAX_NGRAM`].
    MaxTooLarge {
        /// The requested largest size.
        max_n: usize,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConfigError::MinNZero => f.write_str("n-gram min_n must be at least 1, got 0"),
            ConfigError::MinAboveMax { min_n, max_n } => write!(
                f,
                "n-gram min_n ({min_n}) must not be greater than max_n ({max_n})"
            ),
            ConfigError::MaxTooLarge { max_n } => {
                write!(f, "n-gram max_n ({max_n}) exceeds the limit of {MAX_NGRAM}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// Range of n-gram sizes to look up, largest first, and the match policy.
///
/// Build it with [`NgramConfig::new`], which checks
/// `1 <= min_n <= max_n <=` [`MAX_NGRAM`]. The fields are public for
/// convenience; an index built from an out-of-range config sanitizes it (see
/// [`NgramIndex::new`](crate::NgramIndex::new)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NgramConfig {
    /// Smallest n-gram size tried.
    pub min_n: usize,
    /// Largest n-gram size tried (tried first).
    pub max_n: usize,
    /// Which earlier occurrence to draft from.
    pub policy: MatchPolicy,
}

impl NgramConfig {
    /// A config with the default policy ([`MatchPolicy::Recent`]), or an
    /// error naming the violated bound.
    pub fn new(min_n: usize, max_n: usize) -> Result<Self, ConfigError> {
        let config = NgramConfig {
            min_n,
            max_n,
            policy: MatchPolicy::default(),
        };
        config.validate()?;
        Ok(config)
    }

    /// The same config with another policy.
    #[must_use]
    pub const fn with_policy(mut self, policy: MatchPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Checks `1 <= min_n <= max_n <= MAX_NGRAM`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.min_n == 0 {
            Err(ConfigError::MinNZero)
        } else if self.min_n > self.max_n {
            Err(ConfigError::MinAboveMax {
                min_n: self.min_n,
                max_n: self.max_n,
            })
        } else if self.max_n > MAX_NGRAM {
            Err(ConfigError::MaxTooLarge { max_n: self.max_n })
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_round_trip() {
        for p in MatchPolicy::ALL {
            assert_eq!(p.to_string().parse::<MatchPolicy>(), Ok(p));
        }
        assert_eq!(" Longest ".parse(), Ok(MatchPolicy::LongestContinuation));
        assert_eq!("SCORED".parse(), Ok(MatchPolicy::Scored));
        assert_eq!(MatchPolicy::default(), MatchPolicy::Recent);
    }

    #[test]
    fn policy_parse_error_lists_names() {
        let err = "newest".parse::<MatchPolicy>().unwrap_err();
        assert_eq!(err.input(), "newest");
        let msg = err.to_string();
        for p in MatchPolicy::ALL {
            assert!(msg.contains(p.name()), "{msg}");
        }
        assert!(msg.contains("newest"), "{msg}");
    }

    #[test]
    fn config_bounds() {
        assert_eq!(NgramConfig::new(0, 3), Err(ConfigError::MinNZero));
        assert_eq!(
            NgramConfig::new(4, 3),
            Err(ConfigError::MinAboveMax { min_n: 4, max_n: 3 })
        );
        assert_eq!(
            NgramConfig::new(1, MAX_NGRAM + 1),
            Err(ConfigError::MaxTooLarge {
                max_n: MAX_NGRAM + 1
            })
        );
        let c = NgramConfig::new(1, MAX_NGRAM).unwrap();
        assert_eq!(
            (c.min_n, c.max_n, c.policy),
            (1, MAX_NGRAM, MatchPolicy::Recent)
        );
        let c = NgramConfig::new(2, 2)
            .unwrap()
            .with_policy(MatchPolicy::Earliest);
        assert_eq!(c.policy, MatchPolicy::Earliest);
    }

    #[test]
    fn config_error_messages_name_the_problem() {
        assert!(ConfigError::MinNZero.to_string().contains("min_n"));
        let m = ConfigError::MinAboveMax { min_n: 5, max_n: 2 }.to_string();
        assert!(
            m.contains('5') && m.contains('2') && m.contains("max_n"),
            "{m}"
        );
        let m = ConfigError::MaxTooLarge { max_n: 40 }.to_string();
        assert!(
            m.contains("40") && m.contains(&MAX_NGRAM.to_string()),
            "{m}"
        );
    }
}
