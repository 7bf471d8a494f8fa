//! The KV memory budget of a batch: the bytes its sequences' caches and the spare caches of ended
//! requests may reserve together (`--kv-cache-bytes`, Python's `kv_cache_bytes`). Every caller of
//! `step` that runs a batch (the server's loop, Python's `LLM.generate`) goes through the same
//! three decisions here:
//!
//! - **Never fits** (`KvBudget::check`): a request whose caches at their longest (prompt plus
//!   `max_tokens`, within the context, for each of its choices) exceed the budget is refused at
//!   once, with the figures.
//! - **Admission** (`KvBudget::admission`): a waiting sequence is admitted when the cache it
//!   starts with fits beside what is held, spare caches dropped first (smallest first). It starts
//!   with room for `FIRST_ROOM` positions past its tokens (within its reach) where that fits,
//!   else for `MIN_ROOM`, and grows as it goes: admission by current need, not by reach, so
//!   that a batch holds as many sequences as their present lengths allow. A preempted sequence
//!   resumes only with the larger room, so that it is not preempted again a few tokens later.
//! - **Growth and preemption** (`KvBudget::fit`, before every pass): each running sequence,
//!   oldest first, gets the room its next pass needs. It grows by doubling where that fits, else
//!   to what its next pass and its largest draft need, else (spares dropped) drafts shrink to the
//!   room it has; when even its next token does not fit, the most recently admitted sequence is
//!   preempted (itself, if it is the newest), its blocks going to the prefix cache, and resumes
//!   later from its tokens (`Sequence::preempt`, `Sequence::admit`). The oldest sequence always
//!   advances, so the batch never stalls, and a request that fits alone always completes.
//!
//! What the budget counts: the bytes each cache reserves (`KvCache::bytes`, all its positions,
//! committed as they are written). Not counted: the prefix cache (its own budget,
//! `--prefix-cache-bytes`), the weights, activations and logits of a pass.

use crate::error::EngineError;
use crate::kv_cache::{KvCache, KvShape};
use crate::sequence::Sequence;

/// Positions past its tokens that a sequence admitted under pressure starts with.
pub const MIN_ROOM: usize = 16;

/// The bytes every cache of a batch may reserve together, for caches of `shape`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBudget {
    pub bytes: usize,
    pub shape: KvShape,
}

impl KvBudget {
    /// Bytes a cache of `positions` reserves.
    pub fn cache_bytes(&self, positions: usize) -> usize {
        KvCache::bytes_for(self.shape, positions)
    }

    /// The most positions one cache may hold within `bytes`.
    pub fn positions_within(&self, bytes: usize) -> usize {
        let (mut lo, mut hi) = (0, bytes / self.shape.bytes_per_position().max(1) + 1);
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            match self.cache_bytes(mid) <= bytes {
                true => lo = mid,
                false => hi = mid,
            }
        }
        lo
    }

    /// Tokens of output a request of `prompt_len` tokens and `choices` choices may ask for
    /// within the budget (0: its prompt alone does not fit): its default `max_tokens` under a
    /// budget.
    pub fn room(&self, prompt_len: usize, choices: usize) -> usize {
        self.positions_within(self.bytes / choices.max(1))
            .saturating_sub(prompt_len)
    }

    /// Refuses a request whose `choices` caches, at their longest (`positions`: its prompt and
    /// its `max_tokens`, within the context), could never fit, even alone.
    pub fn check(&self, positions: usize, choices: usize) -> Result<(), EngineError> {
        let need = self.cache_bytes(positions).saturating_mul(choices.max(1));
        if need > self.bytes {
            return Err(EngineError::OverKvBudget {
                need,
                budget: self.bytes,
                positions,
                choices: choices.max(1),
            });
        }
        Ok(())
    }

    /// Whether `seq` can be admitted beside `held` bytes (every running cache and the spares):
    /// the capacity to give it and the spare cache to take (one that holds that capacity, whose
    /// bytes are counted already), dropping the smallest spares while room is short. `None`:
    /// it waits.
    pub fn admission(
        &self,
        seq: &Sequence,
        held: usize,
        spares: &mut Vec<KvCache>,
    ) -> Option<(usize, Option<KvCache>)> {
        // A preempted sequence resumes only with room to go on (its reach, or `FIRST_ROOM`
        // more), lest it be preempted again a few tokens later.
        let rooms: &[usize] = match seq.preemptions {
            0 => &[usize::MAX, MIN_ROOM],
            _ => &[usize::MAX],
        };
        for &room in rooms {
            let capacity = seq.admit_capacity(room);
            if let Some(i) = spares.iter().position(|c| c.capacity() >= capacity) {
                return Some((capacity, Some(spares.remove(i))));
            }
            if self
                .make_room(self.cache_bytes(capacity), held, spares)
                .is_some()
            {
                return Some((capacity, None));
            }
        }
        None
    }

    /// Whether `bytes` more fit beside `held` (spares included), dropping the smallest spares
    /// until they do (none is dropped when they cannot fit even without any): the bytes then
    /// held with them, or `None`.
    pub fn make_room(&self, bytes: usize, held: usize, spares: &mut Vec<KvCache>) -> Option<usize> {
        let spare: usize = spares.iter().map(KvCache::bytes).sum();
        if held - spare.min(held) + bytes > self.bytes {
            return None;
        }
        let mut held = held;
        while held + bytes > self.bytes {
            held -= spares.remove(0).bytes();
        }
        Some(held + bytes)
    }

    /// Before a pass over `seqs` (in the order they were admitted): gives each the room its next
    /// pass needs within the budget, growing caches, dropping `spares` and shrinking drafts as
    /// the module's comment says. Returns how many sequences keep running: those past it must be
    /// preempted (`Sequence::preempt`) by the caller, the newest first to go.
    pub fn fit(&self, seqs: &mut [&mut Sequence], spares: &mut Vec<KvCache>) -> usize {
        let mut keep = seqs.len();
        let mut i = 0;
        while i < keep {
            let (hard, soft) = seqs[i].next_need();
            while seqs[i].capacity() < soft {
                let held: usize = seqs[..keep].iter().map(|s| s.cache_bytes()).sum::<usize>()
                    + spares.iter().map(KvCache::bytes).sum::<usize>();
                let free = self.bytes.saturating_sub(held - seqs[i].cache_bytes());
                let fits = |positions| self.cache_bytes(positions) <= free;
                let doubled = seqs[i].growth(soft);
                if let Some(to) = [doubled, soft].into_iter().find(|&p| fits(p)) {
                    seqs[i].grow(to);
                } else if !spares.is_empty() {
                    spares.remove(0);
                    continue;
                } else if seqs[i].capacity() >= hard {
                    // Drafts stay within the cache (`Sequence::budgeted`).
                } else if fits(hard) {
                    seqs[i].grow(hard);
                } else if keep > i + 1 {
                    keep -= 1;
                    continue;
                } else {
                    keep = i;
                }
                break;
            }
            i += 1;
        }
        keep
    }
}

/// Bytes the caches of `seqs` and `spares` reserve together.
pub fn held<'a>(seqs: impl IntoIterator<Item = &'a Sequence>, spares: &[KvCache]) -> usize {
    seqs.into_iter().map(Sequence::cache_bytes).sum::<usize>()
        + spares.iter().map(KvCache::bytes).sum::<usize>()
}

/// The least default budget, whatever the machine's memory says (256 MiB).
pub const MIN_DEFAULT_BYTES: usize = 256 << 20;

/// The default budget and what it was derived from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DefaultBudget {
    pub bytes: usize,
    /// The machine's memory counted: the lesser of `MemAvailable` and seven eighths of
    /// `MemTotal` (`/proc/meminfo`; 8 GiB where that cannot be read).
    pub memory: usize,
    /// The model file's size, standing for its weights.
    pub weights: usize,
    /// The prefix cache's budget.
    pub prefix: usize,
}

/// The budget unless told otherwise: the machine's memory less the weights and the prefix
/// cache's budget, at least `MIN_DEFAULT_BYTES`.
pub fn default_budget(weights: usize, prefix: usize) -> DefaultBudget {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        meminfo.lines().find_map(|l| {
            let kib = l.strip_prefix(name)?.trim().trim_end_matches("kB").trim();
            kib.parse::<usize>().ok().map(|k| k * 1024)
        })
    };
    let total = field("MemTotal:").map(|t| t / 8 * 7);
    let memory = match (field("MemAvailable:"), total) {
        (Some(a), Some(t)) => a.min(t),
        (a, t) => a.or(t).unwrap_or(8 << 30),
    };
    let bytes = memory
        .saturating_sub(weights)
        .saturating_sub(prefix)
        .max(MIN_DEFAULT_BYTES);
    DefaultBudget {
        bytes,
        memory,
        weights,
        prefix,
    }
}

/// The budget for `lm`'s caches: `asked` (`--kv-cache-bytes`, `kv_cache_bytes`) or the default
/// beside a prefix cache of `prefix` bytes; logged with how it was derived.
pub fn for_model(lm: &crate::LoadedModel, asked: Option<usize>, prefix: usize) -> KvBudget {
    let shape = lm.model.kv_shape();
    let per_position = shape.bytes_per_position();
    let bytes = match asked {
        Some(bytes) => {
            tracing::info!(
                budget_bytes = bytes,
                positions = bytes / per_position.max(1),
                "KV cache budget (as asked)"
            );
            bytes
        }
        None => {
            let weights = std::fs::metadata(&lm.path).map_or(0, |m| m.len() as usize);
            let d = default_budget(weights, prefix);
            tracing::info!(
                budget_bytes = d.bytes,
                positions = d.bytes / per_position.max(1),
                memory_bytes = d.memory,
                weights_bytes = d.weights,
                prefix_cache_bytes = d.prefix,
                "KV cache budget: memory (the lesser of MemAvailable and 7/8 of MemTotal) less \
                 the weights and the prefix cache, at least 256 MiB"
            );
            d.bytes
        }
    };
    KvBudget { bytes, shape }
}

#[cfg(test)]
mod tests;
