//! Hash maps for the lookups submission and limit checks make by name, with a snapshot
//! encoding that does not depend on hashing.
//!
//! Ordered maps keep iteration identical on every replica, but a lookup in one with ten
//! thousand users compares a dozen names. The tables looked up once or more per job
//! (users, each user's live jobs, associations by user) are [`NameMap`]s instead: FxHash,
//! which has no random seed, and serialized in key order by [`sorted`], so two replicas that
//! built the same map by different histories still write identical snapshots.
//!
//! Rule: code that iterates a `NameMap` must not let the iteration order reach replicated
//! state or a response. Sort first (see `State::users_with_live_jobs`) or only aggregate.

use std::collections::HashMap;

/// A hash map keyed by a name; see the module docs for the iteration rule.
pub type NameMap<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;

/// Serde for a [`NameMap`] field: written as a map in key order, read back as a hash map.
/// Use with `#[serde(with = "crate::lookup::sorted")]`.
pub mod sorted {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::NameMap;

    pub fn serialize<K, V, S>(map: &NameMap<K, V>, serializer: S) -> Result<S::Ok, S::Error>
    where
        K: Serialize + Ord,
        V: Serialize,
        S: Serializer,
    {
        let mut entries: Vec<(&K, &V)> = map.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        serializer.collect_map(entries)
    }

    pub fn deserialize<'de, K, V, D>(deserializer: D) -> Result<NameMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Eq + std::hash::Hash,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        NameMap::deserialize(deserializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Holder {
        #[serde(with = "sorted")]
        map: NameMap<String, u32>,
    }

    #[test]
    fn encoding_is_independent_of_insertion_history() {
        let mut a = Holder {
            map: NameMap::default(),
        };
        let mut b = Holder {
            map: NameMap::default(),
        };
        for i in 0..500u32 {
            a.map.insert(format!("u{i}"), i);
        }
        // The same contents reached another way: extra keys added and removed, reverse order.
        for i in (0..700u32).rev() {
            b.map.insert(format!("u{i}"), i);
        }
        for i in 500..700u32 {
            b.map.remove(&format!("u{i}"));
        }
        let bytes_a = postcard::to_allocvec(&a).unwrap();
        let bytes_b = postcard::to_allocvec(&b).unwrap();
        assert_eq!(bytes_a, bytes_b);
        let back: Holder = postcard::from_bytes(&bytes_a).unwrap();
        assert_eq!(back, a);
    }
}
