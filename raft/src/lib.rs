//! Docket's replication layer.
//!
//! This crate is plumbing only: it makes a set of controller replicas agree on an ordered log
//! of opaque commands, durably, using openraft 0.9 over RocksDB and gRPC. It is generic over
//! the state machine it replicates and knows nothing of jobs, so it can be tested with a small
//! key-value machine and then carry docket-core's commands unchanged.
//!
//! What lives here:
//! - [`ids`]: who a replica is ([`ReplicaId`]) and how to reach it ([`ReplicaAddr`]), the
//!   node types openraft is parameterised with.
//! - [`machine`]: the [`StateMachine`] trait the application implements.
//! - [`types`]: openraft's type configuration for a machine, and aliases.
//! - [`db`]: the on-disk layout of a replica's RocksDB database (column families, the
//!   format version stamped in it, writes that are on disk before they return).
//! - [`log_store`]: the Raft log on that database, synced before anything is acknowledged.
//! - [`machine_store`] and [`snapshot`]: the machine as openraft drives it, with snapshots
//!   streamed through files.
//! - [`network`]: the gRPC service replicas serve and the client they call each other with.
//! - [`proposer`]: group commit (many writes, one entry) and forwarding to the leader.
//! - [`read`] and [`read_index`]: linearizable reads on any replica, by a read index the
//!   leader confirms from the replicas' saved votes.
//! - [`replica`]: one running replica and the cluster operations on it.
//! - [`kv`]: a key-value machine for tests and the benchmark.

// openraft's trait methods return its `StorageError` (over 200 bytes); our helpers return
// the same type so `?` carries it through unchanged.
#![allow(clippy::result_large_err)]

pub mod cluster_clock;
pub mod codec;
pub mod db;
pub mod election_gate;
pub mod ids;
pub mod kv;
pub mod leader_contact;
pub mod leader_watch;
pub mod log_store;
pub mod machine;
pub mod machine_store;
pub mod network;
pub mod proposer;
pub mod read;
pub mod read_index;
pub mod replica;
pub mod rocks_memory;
pub mod snapshot;
pub mod status;
pub mod types;

pub use db::{DataDir, DbError, FORMAT_VERSION, FaultInjection};
pub use ids::{MembersError, ReplicaAddr, ReplicaId, parse_members};
pub use machine::{ApplyContext, SnapshotTail, StateMachine};
pub use types::{Batch, TypeConfig};
