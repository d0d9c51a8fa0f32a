//! The Docket controller daemon.
//!
//! One process is one Raft replica (docket-raft) of the scheduler state (docket-core). Every
//! replica serves reads and forwards writes to the leader; the leader alone runs the timed
//! scheduling loops and dispatches to node agents. Everything that touches the network, the
//! disk, the clock, tracing or metrics lives here, never in docket-core.

pub mod health;
