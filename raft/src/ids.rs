//! Replica identity.
//!
//! A controller replica is a [`ReplicaId`] (a small integer chosen by the operator, stable for
//! the life of the replica's data directory) plus a [`ReplicaAddr`] (where its gRPC server
//! listens). The word "node" is reserved for compute nodes, which are never Raft members.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The Raft member id of one controller replica.
///
/// Satisfies openraft's `NodeId` bounds (ordered, hashable, `Copy`, `Display`, serde).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct ReplicaId(pub u64);

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}

impl From<u64> for ReplicaId {
    fn from(id: u64) -> Self {
        ReplicaId(id)
    }
}

/// Where a replica can be reached: the `host:port` of its gRPC server, which carries both the
/// Raft RPCs and the public API. Stored in the Raft membership, so it is replicated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaAddr {
    pub addr: String,
}

impl fmt::Display for ReplicaAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.addr)
    }
}

/// A member list like `1=10.0.0.1:6817,2=10.0.0.2:6817` (the `--bootstrap` flag's syntax)
/// could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}; expected ID=HOST:PORT,... (e.g. 1=10.0.0.1:6817,2=10.0.0.2:6817)")]
pub struct MembersError(String);

/// Reads a member list, `ID=HOST:PORT,...`.
pub fn parse_members(
    spec: &str,
) -> Result<std::collections::BTreeMap<ReplicaId, String>, MembersError> {
    let mut members = std::collections::BTreeMap::new();
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| MembersError(format!("{part:?} has no '='")))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| MembersError(format!("replica id {id:?} is not a number")))?;
        if id == 0 {
            return Err(MembersError("replica ids start at 1".into()));
        }
        let addr = addr.trim();
        if !addr.contains(':') {
            return Err(MembersError(format!("address {addr:?} is not HOST:PORT")));
        }
        if members.insert(ReplicaId(id), addr.to_owned()).is_some() {
            return Err(MembersError(format!("replica id {id} appears twice")));
        }
    }
    if members.is_empty() {
        return Err(MembersError("no replicas named".into()));
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_openraft_node_id<T: openraft::NodeId>() {}
    fn assert_openraft_node<T: openraft::Node>() {}

    #[test]
    fn replica_types_fit_openraft() {
        assert_openraft_node_id::<ReplicaId>();
        assert_openraft_node::<ReplicaAddr>();
    }

    #[test]
    fn member_lists_parse_and_bad_ones_say_why() {
        let m = parse_members("1=a:1, 2=b:2").unwrap();
        assert_eq!(m[&ReplicaId(2)], "b:2");
        for (bad, why) in [
            ("", "no replicas"),
            ("1", "no '='"),
            ("x=a:1", "not a number"),
            ("0=a:1", "start at 1"),
            ("1=a", "HOST:PORT"),
            ("1=a:1,1=b:2", "twice"),
        ] {
            let e = parse_members(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn replica_id_serializes_as_a_bare_number() {
        assert_eq!(serde_json::to_string(&ReplicaId(3)).unwrap(), "3");
        assert_eq!(
            serde_json::from_str::<ReplicaId>("7").unwrap(),
            ReplicaId(7)
        );
        assert_eq!(ReplicaId(3).to_string(), "r3");
    }
}
