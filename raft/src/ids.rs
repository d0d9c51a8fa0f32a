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
    fn replica_id_serializes_as_a_bare_number() {
        assert_eq!(serde_json::to_string(&ReplicaId(3)).unwrap(), "3");
        assert_eq!(
            serde_json::from_str::<ReplicaId>("7").unwrap(),
            ReplicaId(7)
        );
        assert_eq!(ReplicaId(3).to_string(), "r3");
    }
}
