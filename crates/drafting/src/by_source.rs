//! `BySource<T>`: one value per draft source, indexed by [`Source`]. The one table of the sources
//! (which are on, what each drafted and had accepted): adding a source is adding its variant to
//! `Source`, and every table grows with it.

use crate::tree::Source;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::ops::{Index, IndexMut};

/// A value per draft source (a count by default). Serialized as an object keyed by the sources'
/// names (`{"ngram": 3, "model": 1, "corpus": 0}`); a name left out reads as the default, one
/// not known is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BySource<T = usize>([T; Source::ALL.len()]);

impl<T> BySource<T> {
    /// The table with `f(source)` for every source.
    pub fn from_fn(mut f: impl FnMut(Source) -> T) -> Self {
        BySource(Source::ALL.map(&mut f))
    }

    /// Every source with its value, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = (Source, &T)> {
        Source::ALL.into_iter().zip(&self.0)
    }
}

impl<T: Default> Default for BySource<T> {
    fn default() -> Self {
        BySource::from_fn(|_| T::default())
    }
}

impl<T> Index<Source> for BySource<T> {
    type Output = T;
    fn index(&self, source: Source) -> &T {
        &self.0[source.index()]
    }
}

impl<T> IndexMut<Source> for BySource<T> {
    fn index_mut(&mut self, source: Source) -> &mut T {
        &mut self.0[source.index()]
    }
}

impl BySource<usize> {
    pub fn add(&mut self, other: &BySource) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a += b;
        }
    }

    /// What was counted since `earlier` (a copy of these counts taken before).
    pub fn since(&self, earlier: &BySource) -> BySource {
        BySource::from_fn(|s| self[s] - earlier[s])
    }
}

impl<T: Serialize> Serialize for BySource<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter().map(|(source, v)| (source.name(), v)))
    }
}

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for BySource<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut named = BTreeMap::<String, T>::deserialize(d)?;
        Ok(BySource::from_fn(|s| {
            named.remove(s.name()).unwrap_or_default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_source_round_trip_through_json() {
        let mut c = BySource::default();
        c[Source::Model] += 2;
        c[Source::Corpus] += 1;
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(text, r#"{"ngram":0,"model":2,"corpus":1}"#);
        assert_eq!(serde_json::from_str::<BySource>(&text).unwrap(), c);
        let mut more = c;
        more.add(&c);
        assert_eq!(more.since(&c), c);
        let old: BySource = serde_json::from_str(r#"{"ngram":4}"#).unwrap();
        assert_eq!((old[Source::Ngram], old[Source::Corpus]), (4, 0));
    }
}
