//! Docket's scheduler, as a pure state machine.
//!
//! Every controller replica holds the same [`State`] and applies the same replicated
//! [`Command`]s to it in the same order ([`State::apply`]), so everything here must be
//! deterministic: ordered maps only, no clocks (time arrives in each command, stamped by the
//! leader), no randomness except from a seed held in state, no I/O. The daemons around it do
//! the I/O, tracing, metrics and timing.
//!
//! This purity is what lets the same code run inside the leader, inside `docket sim` on a
//! workload trace, and inside deterministic simulation tests.
//!
//! Map:
//! - model: [`ids`], [`quantity`], [`job`], [`node`], [`partition`], [`qos`], [`account`],
//!   [`config`], held together in [`state`];
//! - change: [`command`] (what), [`apply`] (how), `policy` (which part of the queue and
//!   which reason each pending job gets);
//! - fair-share: [`usage`] (decayed usage ledger), [`fairshare`] (Fair Tree, classic, IT4I);
//! - ordering: [`priority`] (six formulas, `explain`, the order of consideration),
//!   [`predict`] (runtime predictions the planners may plan on instead of limits),
//!   `queue_index` (the idle queue kept in order where that order is time-independent);
//! - safety: [`invariants`] (written down and checked), [`snapshot`] (bytes and back),
//!   [`layout`] (reading bytes written before a field was added).

pub mod access;
pub mod account;
pub mod apply;
pub mod assoc;
pub mod command;
pub mod config;
pub mod fairshare;
pub mod hostlist;
pub mod ids;
pub mod invariants;
pub mod job;
pub mod job_table;
pub mod layout;
pub mod lookup;
pub mod node;
pub mod partition;
pub mod plan;
mod policy;
pub mod predict;
pub mod preempt;
pub mod priority;
pub mod qos;
pub mod quantity;
mod queue_index;
pub mod relations;
pub mod request;
pub mod reservation;
mod returns;
pub mod sim;
pub mod site;
pub mod snapshot;
pub mod state;
pub mod tres;
pub mod usage;

pub use apply::{ApplyCtx, PreemptOutcome, Rejection, Response};
pub use command::{Actor, Command, Envelope};
pub use ids::{
    AccountName, IdError, JobId, NodeName, PartitionName, QosName, ReservationName, UserName,
};
pub use invariants::InvariantViolation;
pub use snapshot::SnapshotError;
pub use state::State;
