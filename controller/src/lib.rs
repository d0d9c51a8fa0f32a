//! The Docket controller daemon.
//!
//! One process is one Raft replica (docket-raft) of the scheduler state (docket-core). Every
//! replica serves reads and forwards writes to the leader; the leader alone runs the timed
//! scheduling loops and dispatches to node agents. Everything that touches the network, the
//! disk, the clock, tracing or metrics lives here, never in docket-core.
//!
//! Map: [`machine`] (docket-core as the replicated machine), [`identity`] (who calls),
//! [`convert`] (protobuf to core and back), [`write`](mod@write) (proposing and reading, status
//! mapping), [`jobs`] (the jobs service), [`steps`] (its job steps), [`health`] (readiness).

pub mod admin;
pub mod agents;
pub mod archive;
pub mod associations;
pub mod convert;
pub mod daemon;
pub mod dispatch;
pub mod dry_run;
pub mod health;
pub mod http;
pub mod http_conn;
pub mod identity;
pub mod inflight;
pub mod jobs;
pub mod loops;
pub mod machine;
pub mod native_heap;
pub mod stats;
pub mod step_grants;
pub mod steps;
pub mod typed;
pub mod web;
pub mod write;
