//! Proposing a command and reading state through the local replica, with outcomes mapped to
//! gRPC status codes the way the proto files document them.

use std::time::Duration;

use docket_core::{Envelope, Response, State};
use docket_raft::proposer::WriteError;
use docket_raft::read::ReadError;
use docket_raft::replica::Replica;
use tonic::Status;

use crate::jobs::rejection_status;
use crate::machine::CoreMachine;

/// The status a failed write maps to.
pub fn write_error_status(e: &WriteError) -> Status {
    match e {
        WriteError::NoLeader => Status::unavailable(e.to_string()),
        WriteError::Indeterminate(_) => Status::aborted(format!(
            "{e}; check the queue before sending the request again"
        )),
        WriteError::TooLarge { .. } => Status::invalid_argument(e.to_string()),
        WriteError::Stopped(_) => Status::unavailable(e.to_string()),
    }
}

/// The status a failed read maps to.
pub fn read_error_status(e: &ReadError) -> Status {
    Status::unavailable(e.to_string())
}

/// Proposes `envelope` and returns docket-core's answer once applied.
pub async fn write(replica: &Replica<CoreMachine>, envelope: Envelope) -> Result<Response, Status> {
    match replica.write_one(envelope).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(rejection)) => Err(rejection_status(&rejection)),
        Err(e) => Err(write_error_status(&e)),
    }
}

/// Runs `f` on the state, linearizably unless `stale`.
pub async fn read<T>(
    replica: &Replica<CoreMachine>,
    stale: bool,
    timeout: Duration,
    f: impl FnOnce(&State) -> T,
) -> Result<T, Status> {
    if stale {
        return Ok(replica.read_stale(|a| f(&a.machine.state)));
    }
    replica
        .read_linearizable(timeout, |a| f(&a.machine.state))
        .await
        .map_err(|e| read_error_status(&e))
}
