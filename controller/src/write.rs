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

/// `envelope` in the command version the cluster writes (the replicated
/// [`State::command_version`]): until every replica applies this build's version a command
/// goes out in the cluster's, which replicas of the builds before read, and one that version
/// cannot carry (a job's comment before 4, a return to service before 5) is refused with the
/// reason.
pub fn stamp(replica: &Replica<CoreMachine>, envelope: Envelope) -> Result<Envelope, Status> {
    stamp_in(cluster_version(replica), envelope)
}

/// The command version the cluster writes, as this replica has applied it.
fn cluster_version(replica: &Replica<CoreMachine>) -> u16 {
    replica.read_stale(|a| a.machine.state.command_version.0)
}

/// [`stamp`] for a cluster that writes version `cluster`.
fn stamp_in(cluster: u16, mut envelope: Envelope) -> Result<Envelope, Status> {
    let version = cluster.min(docket_core::command::COMMAND_VERSION);
    let needed = envelope.command.needs_version();
    if needed > version {
        return Err(Status::failed_precondition(format!(
            "this needs command version {needed} ({}); the cluster still writes \
             version {version} because not every replica runs a build that applies {needed} \
             yet: upgrade them all, then try again",
            docket_core::command::added_in(needed)
        )));
    }
    envelope.version = version;
    Ok(envelope)
}

/// How long a request waits for the cluster to write a command version this build has and
/// the request needs, before it is refused ([`stamp_when_written`]).
const VERSION_WAIT: Duration = Duration::from_secs(2);

/// [`stamp`], first waiting up to [`VERSION_WAIT`] while the command needs a version this
/// build applies but the cluster does not write yet. A new cluster, or one whose last replica
/// was just upgraded, raises its version moments after its leader is elected
/// (`loops::raise_command_version`); a request in that moment (the first `sbatch --comment`
/// on a cluster just started) waited for nothing and was refused. A cluster that really is
/// mid-upgrade still refuses it, with the reason, once the wait is over.
async fn stamp_when_written(
    replica: &Replica<CoreMachine>,
    envelope: Envelope,
) -> Result<Envelope, Status> {
    let needed = envelope.command.needs_version();
    let deadline = tokio::time::Instant::now() + VERSION_WAIT;
    // One read of the state in the usual case: the cluster already writes what is needed.
    let mut cluster = cluster_version(replica);
    while needed <= docket_core::command::COMMAND_VERSION
        && needed > cluster
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
        cluster = cluster_version(replica);
    }
    stamp_in(cluster, envelope)
}

/// Proposes `envelope` (in the cluster's command version, `stamp_when_written`) and
/// returns docket-core's answer once applied.
pub async fn write(replica: &Replica<CoreMachine>, envelope: Envelope) -> Result<Response, Status> {
    let envelope = stamp_when_written(replica, envelope).await?;
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
