//! Who sent a request, and what that client's earlier requests left for drafting. The HTTP layer
//! names the tenant (from the API key); the scheduler keeps each tenant's drafting state apart.

use drafting::{Corpus, PredictionTable, SharedCorpus, SharedPredictions, MAX_TREE_TOP_K};
use engine::Sequence;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Who sent a request: the index of its API key (0 for every request when the server has no
/// keys). Per-tenant state (the drafting corpus) is kept apart by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tenant(pub usize);

/// Each tenant's namespace in the prefix cache, by the index of its key in `api_keys`: the first
/// eight bytes of the SHA-256 of the key, so that a tenant keeps its blocks on disk
/// (`--prefix-cache-dir`) across restarts whatever the order of the keys, and no other key's
/// requests can reach them. Without keys every request is the one tenant 0.
pub(crate) fn namespaces(api_keys: &[String]) -> Vec<u64> {
    use sha2::Digest;
    if api_keys.is_empty() {
        return vec![0];
    }
    api_keys
        .iter()
        .map(|k| {
            let digest = sha2::Sha256::new()
                .chain_update(b"pld prefix-cache tenant\0")
                .chain_update(k.as_bytes())
                .finalize();
            u64::from_le_bytes(digest[..8].try_into().expect("eight bytes"))
        })
        .collect()
}

/// What each tenant's earlier requests left for drafting: its corpus of prompts and outputs and
/// its table of the model's predictions, created on its first request.
pub(crate) struct Corpora {
    /// Tokens kept per tenant (0: no corpus).
    tokens: usize,
    by_tenant: HashMap<Tenant, (SharedCorpus, SharedPredictions)>,
}

impl Corpora {
    pub(crate) fn new(tokens: usize) -> Self {
        Corpora {
            tokens,
            by_tenant: HashMap::new(),
        }
    }

    /// Lets `seq` draft from what its tenant's earlier requests left (nothing when the corpus is
    /// off).
    pub(crate) fn attach(&mut self, tenant: Tenant, seq: &mut Sequence) {
        if self.tokens == 0 {
            return;
        }
        let tokens = self.tokens;
        let (corpus, predictions) = self.by_tenant.entry(tenant).or_insert_with(|| {
            (
                Arc::new(Mutex::new(Corpus::new(tokens))),
                Arc::new(Mutex::new(PredictionTable::new(MAX_TREE_TOP_K))),
            )
        });
        seq.set_tenant_sources(corpus.clone(), predictions.clone());
    }

    /// Adds a finished sequence's prompt and output to its tenant's corpus.
    pub(crate) fn add(&self, tenant: Tenant, seq: &Sequence) {
        if let Some((c, _)) = self.by_tenant.get(&tenant) {
            let mut document = seq.prompt_tokens().to_vec();
            document.extend_from_slice(seq.generated_tokens());
            c.lock().unwrap_or_else(|e| e.into_inner()).add(&document);
        }
    }
}
