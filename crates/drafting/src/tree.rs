//! A tree of drafted tokens, verified in one forward pass.
//!
//! Node `i` holds a token and its parent: an earlier node, or [`ROOT`] for a child of the last
//! committed token (which is not part of the tree: it is the first input of the pass, and every
//! node descends from it). Parents always come before their children, so the nodes are in a valid
//! order for the pass and a node's ancestors are found by walking parents. Siblings hold distinct
//! tokens. A chain, what plain prompt lookup drafts, is the tree in which every node is the only
//! child of the one before it.

/// The parent of a child of the last committed token, and of the first row of a pass over a tree
/// (the row of that token).
pub const ROOT: u32 = u32::MAX;

/// The row of the verifying pass that holds `node`: row 0 holds the last committed token (the
/// tree's root, [`ROOT`]), row `i + 1` holds node `i`. The one conversion between the two.
pub const fn pass_row(node: u32) -> usize {
    node.wrapping_add(1) as usize
}

/// The pass rows whose logits predicted each token emitted after a verification: the root's,
/// then each node's of the accepted `path`.
pub fn path_rows(path: &[usize]) -> Vec<usize> {
    std::iter::once(0)
        .chain(path.iter().map(|&n| pass_row(n as u32)))
        .collect()
}

/// The most nodes a tree may hold (a pass row is also needed for the last committed token, and
/// the engine marks a row's ancestors in one 64-bit word).
pub const MAX_NODES: usize = 63;

/// Declares [`Source`] with its variants, their names and `Source::ALL`, so that a new draft
/// source is one line here (and a `BySource` table of every kind grows with it).
macro_rules! sources {
    ($($(#[doc = $doc:expr])* $variant:ident => $name:literal,)+) => {
        /// Where a drafted node came from.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Source {
            $($(#[doc = $doc])* $variant,)+
        }

        impl Source {
            /// Every source, in declaration order.
            pub const ALL: [Source; [$($name),+].len()] = [$(Source::$variant),+];

            /// The name used in reports and settings.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Source::$variant => $name,)+
                }
            }
        }
    };
}

sources! {
    /// The n-gram index over the sequence (prompt and output): what followed the current suffix
    /// where it occurred before.
    Ngram => "ngram",
    /// The model's own earlier predictions: the top candidates its logits gave after this token.
    Model => "model",
    /// Earlier requests' prompts and outputs (the server's corpus).
    Corpus => "corpus",
}

impl Source {
    /// The source a name means, if any.
    pub fn from_name(name: &str) -> Option<Source> {
        Source::ALL.into_iter().find(|s| s.name() == name)
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// Drafted tokens with their parents, in pass order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraftTree {
    tokens: Vec<u32>,
    parents: Vec<u32>,
    depths: Vec<u16>,
    sources: Vec<Source>,
}

impl DraftTree {
    /// An empty tree.
    pub fn new() -> Self {
        DraftTree::default()
    }

    /// A chain: each token the only child of the one before.
    pub fn chain(tokens: &[u32], source: Source) -> Self {
        let mut t = DraftTree::new();
        t.set_chain(tokens, source);
        t
    }

    /// Makes this tree the chain of `tokens` (reusing its storage).
    pub fn set_chain(&mut self, tokens: &[u32], source: Source) {
        self.clear();
        let mut parent = ROOT;
        for &tok in tokens {
            parent = self.push(tok, parent, source) as u32;
        }
    }

    /// Keeps the first `len` nodes (a tree still: parents precede their children).
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        self.parents.truncate(len);
        self.depths.truncate(len);
        self.sources.truncate(len);
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.parents.clear();
        self.depths.clear();
        self.sources.clear();
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Tokens of the nodes, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Parent of each node ([`ROOT`] for children of the last committed token).
    pub fn parents(&self) -> &[u32] {
        &self.parents
    }

    /// Depth of each node: 1 for a child of the last committed token.
    pub fn depths(&self) -> &[u16] {
        &self.depths
    }

    /// Source of each node.
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// Adds a node and returns its index.
    ///
    /// # Panics
    /// If `parent` is neither [`ROOT`] nor an existing node.
    pub fn push(&mut self, token: u32, parent: u32, source: Source) -> usize {
        let depth = if parent == ROOT {
            1
        } else {
            self.depths[parent as usize] + 1
        };
        self.tokens.push(token);
        self.parents.push(parent);
        self.depths.push(depth);
        self.sources.push(source);
        self.tokens.len() - 1
    }

    /// The child of `parent` with `token`, if there is one.
    pub fn child(&self, parent: u32, token: u32) -> Option<usize> {
        (0..self.len()).find(|&i| self.parents[i] == parent && self.tokens[i] == token)
    }

    /// The children of `parent`, in order.
    pub fn children(&self, parent: u32) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(move |&i| self.parents[i] == parent)
    }

    /// Each pass row's parent row, for a pass over this tree when it is not a chain: [`ROOT`] for
    /// row 0 (the last committed token), then [`pass_row`] of each node's parent. Empty for a
    /// chain, where each row follows the one before.
    pub fn row_parents(&self) -> Vec<u32> {
        if self.is_chain() {
            return Vec::new();
        }
        std::iter::once(ROOT)
            .chain(self.parents.iter().map(|&p| pass_row(p) as u32))
            .collect()
    }

    /// Whether every node is the only child of the node before it.
    pub fn is_chain(&self) -> bool {
        self.parents
            .iter()
            .enumerate()
            .all(|(i, &p)| p == if i == 0 { ROOT } else { i as u32 - 1 })
    }

    /// The nodes from the root's child down to `node`, in order.
    pub fn path(&self, node: usize) -> Vec<usize> {
        let mut path = Vec::with_capacity(self.depths[node] as usize);
        let mut at = node as u32;
        while at != ROOT {
            path.push(at as usize);
            at = self.parents[at as usize];
        }
        path.reverse();
        path
    }

    /// The path a known continuation takes: from the root, the child holding each next token of
    /// `tokens`, as far as such a child exists (what greedy verification keeps when the model's
    /// choices are `tokens`).
    pub fn follow(&self, tokens: &[u32]) -> Vec<usize> {
        let mut path = Vec::new();
        let mut at = ROOT;
        for &t in tokens {
            match self.child(at, t) {
                Some(c) => {
                    path.push(c);
                    at = c as u32;
                }
                None => break,
            }
        }
        path
    }

    /// Adds `tokens` as a path below `parent`, sharing the nodes that already exist, up to
    /// `max_nodes` nodes in all; returns how many tokens of the path are in the tree.
    pub fn insert_path(
        &mut self,
        parent: u32,
        tokens: &[u32],
        source: Source,
        max_nodes: usize,
    ) -> usize {
        let mut at = parent;
        for (i, &t) in tokens.iter().enumerate() {
            at = match self.child(at, t) {
                Some(c) => c as u32,
                None if self.len() < max_nodes => self.push(t, at, source) as u32,
                None => return i,
            };
        }
        tokens.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_share_prefixes() {
        let mut t = DraftTree::new();
        assert_eq!(t.insert_path(ROOT, &[1, 2, 3], Source::Ngram, 63), 3);
        assert_eq!(t.insert_path(ROOT, &[1, 2, 4], Source::Model, 63), 3);
        assert_eq!(t.insert_path(ROOT, &[5], Source::Model, 63), 1);
        assert_eq!(t.tokens(), [1, 2, 3, 4, 5]);
        assert_eq!(t.parents(), [ROOT, 0, 1, 1, ROOT]);
        assert_eq!(t.depths(), [1, 2, 3, 3, 1]);
        assert_eq!(t.sources()[3], Source::Model);
        assert_eq!(t.path(3), [0, 1, 3]);
        assert_eq!(t.children(1).collect::<Vec<_>>(), [2, 3]);
        assert!(!t.is_chain());
        assert!(DraftTree::chain(&[7, 8, 9], Source::Ngram).is_chain());
        // Rows of a pass: row 0 is the root, row i + 1 node i.
        assert_eq!(t.row_parents(), [ROOT, 0, 1, 2, 2, 0]);
        assert_eq!(path_rows(&[0, 1, 3]), [0, 1, 2, 4]);
        assert_eq!(pass_row(ROOT), 0);
        assert!(DraftTree::chain(&[7, 8], Source::Ngram)
            .row_parents()
            .is_empty());
        // The budget stops a path part-way.
        assert_eq!(t.insert_path(4, &[6, 7], Source::Model, 6), 1);
        assert_eq!(t.len(), 6);
    }
}
