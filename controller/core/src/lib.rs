//! Docket's scheduler, as a pure state machine.
//!
//! Every controller replica holds the same [`docket-core`](crate) state and applies the same
//! replicated commands to it in the same order, so everything here must be deterministic:
//! ordered maps only, no clocks (time arrives in each command, stamped by the leader), no
//! randomness except from a seed held in state, no I/O. The daemons around it do the I/O,
//! tracing, metrics and timing.
//!
//! This purity is what lets the same planning code run inside the leader, inside
//! `docket sim` on a workload trace, and inside deterministic simulation tests.

pub mod ids;

pub use ids::{AccountName, IdError, JobId, NodeName, PartitionName, QosName, UserName};
