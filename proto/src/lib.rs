//! Docket's wire protocol.
//!
//! Every message and service of package `docket.v1` is generated at build time from the
//! `.proto` files under `proto/` (see `build.rs`) and re-exported from [`v1`]. Nothing of the
//! messages is written by hand: changing the protocol means changing a `.proto` file. Besides
//! them: the names of the metadata the services exchange ([`metadata`]), the order in which
//! clients ask the replicas ([`endpoints`]), how clients read the typed states of replies
//! ([`states`]), how servers answer an undecodable request ([`malformed`]) and the clock the messages' times are read from
//! ([`unix_ms`]), each written once here.
//!
//! Compatibility rule: fields are only ever added, never renumbered or retyped, so a replica
//! or agent one release behind keeps working during a rolling upgrade.

/// Package `docket.v1`.
// Generated code: tonic's service routers are one long match, not ours to split.
#[allow(clippy::too_many_lines)]
pub mod v1 {
    tonic::include_proto!("docket.v1");
}

pub mod endpoints;
pub mod malformed;
pub mod metadata;
pub mod raw;
pub mod states;

mod clock;
pub use clock::unix_ms;
