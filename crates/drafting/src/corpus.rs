//! Earlier requests as a draft source: a bounded corpus of token sequences (prompts and outputs)
//! with an n-gram index over them, looked up with the current sequence's suffix.
//!
//! A corpus belongs to one tenant (the server keeps one per API key), so text of one client can
//! never steer or reach another's drafts. Memory is bounded: past `capacity` tokens the oldest
//! documents are dropped first (the index is rebuilt from what is left once a quarter of the
//! capacity has gone, so the rebuilding costs O(1) per token added).

use std::collections::VecDeque;

use crate::config::NgramConfig;
use crate::scored::{match_length, Candidates};
use crate::NgramIndex;

/// Default most tokens a corpus holds.
/// (The index takes about 100 bytes a token: 256k tokens are some 25 MB per tenant.)
pub const DEFAULT_CORPUS_TOKENS: usize = 1 << 18;

/// Separates documents in the index; never a real token id (continuations stop at it).
const SEPARATOR: u32 = u32::MAX - 1;

/// Shortest and longest n-gram looked up in a corpus (a single token matches too much of a large
/// corpus to be worth a row).
const CORPUS_MIN_N: usize = 2;
const CORPUS_MAX_N: usize = 4;

/// Documents of one tenant and the index over them.
#[derive(Debug)]
pub struct Corpus {
    capacity: usize,
    documents: VecDeque<Vec<u32>>,
    tokens: usize,
    index: NgramIndex,
}

impl Corpus {
    /// An empty corpus holding up to `capacity` tokens.
    pub fn new(capacity: usize) -> Self {
        Corpus {
            capacity,
            documents: VecDeque::new(),
            tokens: 0,
            index: NgramIndex::new(Self::config()),
        }
    }

    fn config() -> NgramConfig {
        NgramConfig::new(CORPUS_MIN_N, CORPUS_MAX_N).expect("a valid n-gram range")
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.tokens
    }

    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    pub fn documents(&self) -> usize {
        self.documents.len()
    }

    /// Adds a document (e.g. a prompt followed by its output), dropping the oldest ones if the
    /// corpus would hold more than its capacity. A document longer than the capacity keeps its end.
    pub fn add(&mut self, document: &[u32]) {
        if self.capacity == 0 || document.is_empty() {
            return;
        }
        let doc = &document[document.len().saturating_sub(self.capacity)..];
        self.documents.push_back(doc.to_vec());
        self.tokens += doc.len();
        self.index.extend(doc);
        self.index.push(SEPARATOR);
        if self.tokens > self.capacity {
            // Drop down to three quarters, then rebuild once.
            while self.tokens > self.capacity - self.capacity / 4 && self.documents.len() > 1 {
                let old = self.documents.pop_front().expect("not empty");
                self.tokens -= old.len();
            }
            self.index = NgramIndex::new(Self::config());
            for d in &self.documents {
                self.index.extend(d);
                self.index.push(SEPARATOR);
            }
        }
    }

    /// Calls `f(n, continuation)` for earlier occurrences of the n-grams ending `suffix`, longest
    /// first, most recent first within a size: `continuation` is up to `k` tokens that followed
    /// (never crossing into another document). At most `max` calls; `f` returns false to stop.
    pub fn for_each_continuation(
        &self,
        suffix: &[u32],
        k: usize,
        max: usize,
        mut f: impl FnMut(usize, &[u32]) -> bool,
    ) {
        let tokens = self.index.tokens();
        self.index.for_each_occurrence_of(suffix, max, |n, from| {
            let end = (from + k).min(tokens.len());
            let run = &tokens[from..end];
            let run = &run[..run
                .iter()
                .position(|&t| t == SEPARATOR)
                .unwrap_or(run.len())];
            run.is_empty() || f(n, run)
        });
    }
}

impl Corpus {
    /// Adds to `candidates` the continuations (up to `k` tokens, never crossing into another
    /// document) of the most recent occurrences of the longest n-gram ending `suffix` that has a
    /// continuation in the corpus, until `candidates` is full; returns that n-gram's size, or
    /// `None` (nothing added). The [`Scored`](crate::MatchPolicy::Scored) chain's corpus source.
    pub(crate) fn scored_candidates<'a>(
        &'a self,
        suffix: &[u32],
        k: usize,
        candidates: &mut Candidates<'a>,
    ) -> Option<usize> {
        let tokens = self.index.tokens();
        let mut found = None;
        self.index
            .for_each_occurrence_of(suffix, usize::MAX, |n, from| {
                if found.is_some_and(|m| m != n) || candidates.is_full() {
                    return false; // only the longest size with a continuation
                }
                let run = &tokens[from..(from + k).min(tokens.len())];
                let run = &run[..run
                    .iter()
                    .position(|&t| t == SEPARATOR)
                    .unwrap_or(run.len())];
                if !run.is_empty() {
                    found = Some(n);
                    candidates.push(run, from - n, match_length(tokens, from, suffix));
                }
                true
            });
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn continuations(c: &Corpus, suffix: &[u32]) -> Vec<(usize, Vec<u32>)> {
        let mut out = Vec::new();
        c.for_each_continuation(suffix, 3, 10, |n, run| {
            out.push((n, run.to_vec()));
            true
        });
        out
    }

    #[test]
    fn finds_continuations_within_documents() {
        let mut c = Corpus::new(100);
        c.add(&[1, 2, 3, 4, 5]);
        c.add(&[7, 2, 3, 9]);
        // Longest n first; within a size the newest document first; never across documents.
        assert_eq!(
            continuations(&c, &[8, 1, 2, 3]),
            [(3, vec![4, 5]), (2, vec![9]), (2, vec![4, 5])]
        );
        assert!(
            continuations(&c, &[3, 9]).is_empty(),
            "the end of a document has no follower"
        );
    }

    #[test]
    fn oldest_documents_go_first() {
        let mut c = Corpus::new(12);
        c.add(&[1, 2, 3, 4]);
        c.add(&[5, 6, 7, 8]);
        c.add(&[9, 10, 11]);
        assert_eq!((c.len(), c.documents()), (11, 3));
        // Over capacity: the oldest go until three quarters are left.
        c.add(&[12, 13]);
        assert_eq!((c.len(), c.documents()), (9, 3));
        assert!(
            continuations(&c, &[1, 2]).is_empty(),
            "the oldest was dropped"
        );
        assert_eq!(continuations(&c, &[5, 6]), [(2, vec![7, 8])]);
        // A document longer than the whole corpus keeps its end.
        c.add(&(0..20).collect::<Vec<_>>());
        assert_eq!((c.len(), c.documents()), (12, 1));
        assert_eq!(continuations(&c, &[13, 14]), [(2, vec![15, 16, 17])]);
    }
}
