//! Linearizable reads on any replica, by Raft's read index.
//!
//! The leader confirms with a quorum that it still leads and names the log index every write
//! acknowledged so far is at or below ([`crate::read_index`]); the reading replica waits until
//! it has applied that index and then reads its own machine. Nothing goes through the log. A
//! stale read skips all of this and reads what the replica has.

use openraft::error::{CheckIsLeaderError, RaftError};
use serde::{Deserialize, Serialize};

use crate::ids::ReplicaId;

/// Why a linearizable read could not be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ReadError {
    /// No leader is known, or the leader could not confirm its leadership with a quorum.
    #[error(
        "no leader is known or it cannot reach a quorum (an election may be in progress); retry"
    )]
    NoLeader,
    /// The leader could not be asked.
    #[error("could not reach the leader at {addr}: {message}")]
    LeaderUnreachable { addr: String, message: String },
    /// This replica did not apply up to the read index in time.
    #[error(
        "this replica did not apply log index {index} within {timeout_ms} ms; retry or read from the leader"
    )]
    Lagging { index: u64, timeout_ms: u64 },
    /// This replica has stopped.
    #[error("this replica has stopped: {0}")]
    Stopped(String),
}

impl ReadError {
    /// The read error a failed leadership check means.
    pub fn from_leader_check(
        e: RaftError<ReplicaId, CheckIsLeaderError<ReplicaId, crate::ReplicaAddr>>,
    ) -> Self {
        match e {
            RaftError::APIError(_) => ReadError::NoLeader,
            RaftError::Fatal(fatal) => ReadError::Stopped(fatal.to_string()),
        }
    }

    /// True when trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, ReadError::Stopped(_))
    }
}
