//! The Responses API's stored responses: each kept under its id with the API key (tenant) that
//! made it, the response object as `GET /v1/responses/{id}` returns it and the conversation up
//! to it (its input items, the chained ones included, then its output items), which a request
//! naming it as `previous_response_id` continues. Bounded in count and in bytes; the least
//! recently used go first. Another tenant's response is never found.

use crate::tenant::Tenant;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// One stored response.
#[derive(Clone, Debug)]
pub struct Stored {
    pub tenant: Tenant,
    /// The response object.
    pub response: Value,
    /// Every input item of the conversation up to this response (the chain's included).
    pub input: Vec<Value>,
    /// Bytes this entry is counted as (its JSON).
    bytes: usize,
    /// When it was last used (the store's clock), its key in `by_use`.
    used: u64,
}

impl Stored {
    /// The conversation a chained request continues: the input, then this response's output.
    pub fn history(&self) -> Vec<Value> {
        let mut items = self.input.clone();
        if let Some(out) = self.response["output"].as_array() {
            items.extend(out.iter().cloned());
        }
        items
    }
}

/// Stored responses, bounded in count and bytes.
pub struct ResponseStore {
    max_entries: usize,
    max_bytes: usize,
    bytes: usize,
    clock: u64,
    entries: HashMap<String, Stored>,
    /// Ids by last use, oldest first.
    by_use: BTreeMap<u64, String>,
}

impl ResponseStore {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        ResponseStore {
            max_entries,
            max_bytes,
            bytes: 0,
            clock: 0,
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
        }
    }

    /// Stored responses now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes they are counted as.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps a response (replacing one of the same id), then drops the least recently used until
    /// the store is within its bounds. One larger than the whole byte bound is not kept: false.
    pub fn put(&mut self, id: &str, tenant: Tenant, response: Value, input: Vec<Value>) -> bool {
        let bytes =
            id.len() + response.to_string().len() + Value::from(input.clone()).to_string().len();
        self.remove_entry(id);
        if bytes > self.max_bytes || self.max_entries == 0 {
            return false;
        }
        self.clock += 1;
        self.by_use.insert(self.clock, id.to_string());
        self.bytes += bytes;
        self.entries.insert(
            id.to_string(),
            Stored {
                tenant,
                response,
                input,
                bytes,
                used: self.clock,
            },
        );
        while self.entries.len() > self.max_entries || self.bytes > self.max_bytes {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.bytes -= e.bytes;
            }
        }
        true
    }

    /// The tenant's response `id` (marked as just used); `None` if unknown or another tenant's.
    pub fn get(&mut self, id: &str, tenant: Tenant) -> Option<Stored> {
        let e = self.entries.get_mut(id).filter(|e| e.tenant == tenant)?;
        self.by_use.remove(&e.used);
        self.clock += 1;
        e.used = self.clock;
        self.by_use.insert(self.clock, id.to_string());
        Some(e.clone())
    }

    /// Removes the tenant's response `id`; false if unknown or another tenant's.
    pub fn remove(&mut self, id: &str, tenant: Tenant) -> bool {
        if self.entries.get(id).is_some_and(|e| e.tenant == tenant) {
            self.remove_entry(id);
            true
        } else {
            false
        }
    }

    fn remove_entry(&mut self, id: &str) {
        if let Some(e) = self.entries.remove(id) {
            self.by_use.remove(&e.used);
            self.bytes -= e.bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn response(text: &str) -> Value {
        json!({"id": "x", "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]})
    }

    #[test]
    fn tenants_never_see_each_others_responses() {
        let mut s = ResponseStore::new(10, 1 << 20);
        assert!(s.put("a", Tenant(0), response("one"), vec![json!("hi")]));
        assert!(s.get("a", Tenant(1)).is_none());
        assert!(!s.remove("a", Tenant(1)));
        let got = s.get("a", Tenant(0)).unwrap();
        assert_eq!(got.history().len(), 2);
        assert!(s.remove("a", Tenant(0)));
        assert!(s.get("a", Tenant(0)).is_none());
        assert_eq!((s.len(), s.bytes()), (0, 0));
    }

    #[test]
    fn least_recently_used_go_first_within_both_bounds() {
        let mut s = ResponseStore::new(3, 1 << 20);
        for id in ["a", "b", "c"] {
            s.put(id, Tenant(0), response(id), Vec::new());
        }
        s.get("a", Tenant(0));
        s.put("d", Tenant(0), response("d"), Vec::new());
        assert!(
            s.get("b", Tenant(0)).is_none(),
            "b was the least recently used"
        );
        assert!(s.get("a", Tenant(0)).is_some() && s.get("d", Tenant(0)).is_some());
        let one = {
            let mut t = ResponseStore::new(100, 1 << 20);
            t.put("e", Tenant(0), response(&"x".repeat(100)), Vec::new());
            t.bytes()
        };
        let mut by_bytes = ResponseStore::new(100, one * 2 + one / 2);
        for id in ["e", "f", "g"] {
            by_bytes.put(id, Tenant(0), response(&"x".repeat(100)), Vec::new());
            assert!(by_bytes.bytes() <= one * 2 + one / 2);
        }
        assert_eq!(by_bytes.len(), 2);
        assert!(by_bytes.get("e", Tenant(0)).is_none());
        assert!(!by_bytes.put("h", Tenant(0), response(&"x".repeat(10_000)), Vec::new()));
    }
}
