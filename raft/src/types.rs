//! openraft's type configuration for a replicated [`StateMachine`], and the aliases every
//! other module uses so openraft's generic parameters are spelled once.
//!
//! A log entry carries one [`Batch`] of commands (group commit: see [`crate::proposer`]); its
//! response is one response per command, in order.

use std::cmp::Ordering;
use std::fmt;
use std::marker::PhantomData;

use openraft::{RaftTypeConfig, TokioRuntime};
use serde::{Deserialize, Serialize};

use crate::ids::{ReplicaAddr, ReplicaId};
use crate::machine::StateMachine;
use crate::snapshot::SnapshotFile;

/// The commands of one log entry, stamped by the leader that proposed them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(bound = "C: Serialize + serde::de::DeserializeOwned")]
pub struct Batch<C> {
    /// The proposing leader's wall clock, milliseconds since the Unix epoch.
    pub time_ms: u64,
    pub commands: Vec<C>,
}

/// openraft's type configuration for machine `M`: node ids are [`ReplicaId`], nodes are
/// [`ReplicaAddr`], application data is a [`Batch`] of `M::Command`, and snapshots are files.
///
/// A zero-sized marker. The trait impls are written out rather than derived because derives
/// would demand them of `M`, which is neither `Copy` nor `Ord`.
pub struct TypeConfig<M>(PhantomData<fn() -> M>);

impl<M> fmt::Debug for TypeConfig<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TypeConfig")
    }
}
impl<M> Clone for TypeConfig<M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for TypeConfig<M> {}
impl<M> Default for TypeConfig<M> {
    fn default() -> Self {
        TypeConfig(PhantomData)
    }
}
impl<M> PartialEq for TypeConfig<M> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<M> Eq for TypeConfig<M> {}
impl<M> PartialOrd for TypeConfig<M> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<M> Ord for TypeConfig<M> {
    fn cmp(&self, _: &Self) -> Ordering {
        Ordering::Equal
    }
}

impl<M: StateMachine> RaftTypeConfig for TypeConfig<M> {
    type D = Batch<M::Command>;
    type R = Vec<M::Response>;
    type NodeId = ReplicaId;
    type Node = ReplicaAddr;
    type Entry = openraft::Entry<Self>;
    type SnapshotData = SnapshotFile;
    type AsyncRuntime = TokioRuntime;
    type Responder = openraft::impls::OneshotResponder<Self>;
}

/// Aliases for openraft's types at Docket's node id and node.
pub type Raft<M> = openraft::Raft<TypeConfig<M>>;
pub type Entry<M> = openraft::Entry<TypeConfig<M>>;
pub type LogId = openraft::LogId<ReplicaId>;
pub type Vote = openraft::Vote<ReplicaId>;
pub type StorageError = openraft::StorageError<ReplicaId>;
pub type StoredMembership = openraft::StoredMembership<ReplicaId, ReplicaAddr>;
pub type SnapshotMeta = openraft::SnapshotMeta<ReplicaId, ReplicaAddr>;
pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<ReplicaId, E>;
pub type RpcError<E = openraft::error::Infallible> =
    openraft::error::RPCError<ReplicaId, ReplicaAddr, RaftError<E>>;
pub type RaftMetrics = openraft::RaftMetrics<ReplicaId, ReplicaAddr>;
/// The part of [`RaftMetrics`] that changes only with the vote, the role, the leader or the
/// membership. Tasks that wait for those subscribe to it: openraft publishes the whole
/// [`RaftMetrics`] at every turn of its core's loop (several per entry, on every replica),
/// and each publication wakes every task waiting on it, where this one is published only
/// when it differs (and just before the whole metrics of the same turn).
pub type ServerMetrics = openraft::metrics::RaftServerMetrics<ReplicaId, ReplicaAddr>;
