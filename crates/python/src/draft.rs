//! `pld.drafting` from Rust: the drafting crate over token ids only, for other engines (vLLM's
//! proposer, transformers' candidate generator). Token ids come as lists of ints or as the bytes
//! of a little-endian u32 array (what `pld/drafting.py` makes of a numpy array in one copy).

use drafting::{Corpus, Drafter, SharedCorpus, SpecConfig, SpecOverrides};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::{Arc, Mutex};

/// Token ids from a list of ints or the bytes of a little-endian u32 array.
#[derive(FromPyObject)]
pub enum Ids<'py> {
    Bytes(Bound<'py, PyBytes>),
    List(Vec<u32>),
}

impl Ids<'_> {
    fn into_vec(self) -> PyResult<Vec<u32>> {
        let b = match self {
            Ids::List(v) => return Ok(v),
            Ids::Bytes(b) => b,
        };
        let b = b.as_bytes();
        if !b.len().is_multiple_of(4) {
            let m = format!("token ids as bytes must be 4 per id, got {} bytes", b.len());
            return Err(PyValueError::new_err(m));
        }
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Speculation settings from vLLM's `speculative_config` JSON over pld's defaults.
pub fn spec_config(json: Option<&str>) -> PyResult<SpecConfig> {
    let overrides = match json {
        Some(text) => Some(
            serde_json::from_str::<SpecOverrides>(text)
                .map_err(|e| PyValueError::new_err(format!("speculative_config: {e}")))?,
        ),
        None => None,
    };
    SpecConfig::default()
        .merge(overrides.as_ref(), &SpecOverrides::default())
        .map_err(|e| PyValueError::new_err(format!("speculative_config: {e}")))
}

/// Earlier sequences' tokens that trees may draft from (the `corpus` source), bounded in tokens.
#[pyclass(frozen, module = "pld._native", name = "Corpus")]
pub struct PyCorpus {
    corpus: SharedCorpus,
}

#[pymethods]
impl PyCorpus {
    #[new]
    #[pyo3(signature = (max_tokens=drafting::DEFAULT_CORPUS_TOKENS))]
    fn new(max_tokens: usize) -> Self {
        PyCorpus {
            corpus: Arc::new(Mutex::new(Corpus::new(max_tokens))),
        }
    }

    /// Adds a finished sequence (prompt and output).
    fn add(&self, tokens: Ids) -> PyResult<()> {
        let tokens = tokens.into_vec()?;
        self.corpus
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(&tokens);
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.corpus.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// One sequence's drafter: its n-gram index, draft-length policy and (for trees) sources.
#[pyclass(module = "pld._native", name = "Drafter")]
pub struct PyDrafter {
    drafter: Drafter,
    /// The last proposal's parents (-1: the root).
    parents: Vec<i64>,
}

#[pymethods]
impl PyDrafter {
    #[new]
    #[pyo3(signature = (prompt, speculative_config=None, corpus=None))]
    fn new(
        prompt: Ids,
        speculative_config: Option<&str>,
        corpus: Option<&PyCorpus>,
    ) -> PyResult<Self> {
        let config = spec_config(speculative_config)?;
        let mut drafter = Drafter::new(&config, &prompt.into_vec()?);
        if let Some(c) = corpus {
            drafter.set_corpus(c.corpus.clone());
        }
        Ok(PyDrafter {
            drafter,
            parents: Vec::new(),
        })
    }

    /// The next draft, at most `limit` tokens: a chain (tree nodes in order for method `tree`,
    /// whose parents `parents()` gives). `price` is a drafted row's cost in plain tokens (None:
    /// the drafter's own estimate).
    #[pyo3(signature = (limit, price=None))]
    fn propose(&mut self, limit: usize, price: Option<f64>) -> Vec<u32> {
        let tree = self.drafter.propose(limit, price);
        self.parents = tree
            .parents()
            .iter()
            .map(|&p| if p == drafting::ROOT { -1 } else { p as i64 })
            .collect();
        tree.tokens().to_vec()
    }

    /// Parents of the last proposal's nodes (-1: the root, the last token; a chain is
    /// -1, 0, 1, ...).
    fn parents(&self) -> Vec<i64> {
        self.parents.clone()
    }

    /// Records the accepted nodes of the last proposed tree, from the root's child down.
    fn observe_path(&mut self, path: Vec<usize>) {
        self.drafter.observe(&path);
    }

    /// Appends emitted tokens.
    fn push(&mut self, tokens: Ids) -> PyResult<()> {
        for t in tokens.into_vec()? {
            self.drafter.push(t);
        }
        Ok(())
    }

    /// Records how many tokens of the last proposed chain were accepted.
    fn observe(&mut self, accepted: usize) {
        let path: Vec<usize> = (0..accepted).collect();
        self.drafter.observe(&path);
    }

    /// Cuts the sequence back to `n` tokens.
    fn truncate(&mut self, n: usize) {
        self.drafter.truncate(n);
    }

    fn tokens(&self) -> Vec<u32> {
        self.drafter.tokens().to_vec()
    }

    fn __len__(&self) -> usize {
        self.drafter.tokens().len()
    }
}
