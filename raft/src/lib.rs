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
//! - [`db`]: the on-disk layout of a replica's RocksDB database (column families, the
//!   format version stamped in it, writes that are on disk before they return).

pub mod db;
pub mod ids;

pub use db::{DataDir, DbError, FORMAT_VERSION};
pub use ids::{ReplicaAddr, ReplicaId};
