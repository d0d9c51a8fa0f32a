//! Who may apply which command: checked for every command, at its place in the log.
//!
//! The controller proves who is asking before it proposes anything, and also checks a
//! caller's role to give a quick answer; this is the check that counts. It runs against the
//! state as of the command's log position, on every replica alike, so a follower that
//! forwarded a request, a leader that proposed it and a replica replaying the log years later
//! all reach the same verdict — and an admin demoted one entry earlier is no longer one.
//!
//! | commands | who |
//! |---|---|
//! | scheduling decisions (`StartJobs`, `Preempt`, reasons, bypass counts), `Tick`, `DownNode` | the controller only |
//! | `EndJobs`, `EndSteps` | the controller, or a node's agent for runs on that node (checked per report) |
//! | configuration: nodes, partitions, QOS, accounts, users, reservations, coordinators, drain and resume | admins: root, a user with `AdminLevel`, the controller |
//! | job commands (submit, cancel, hold, release, requeue, update, suspend, resume), steps (create, cancel) | users, admins and the controller; each job's own rules follow (owner, coordinator, admin; only the owner and root create steps) |
//!
//! A node's agent may do nothing but report ends.

use crate::command::{Actor, Command};
use crate::state::State;

use super::Rejection;

/// Who may apply a kind of command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// Only the controller's own loops.
    Controller,
    /// The controller, or a node's agent (for its own runs).
    ControllerOrNode,
    /// An administrator.
    Admin,
    /// Any user; per-job permissions are checked by the command.
    Users,
}

/// The authority `command` needs.
pub fn needed(command: &Command) -> Authority {
    match command {
        Command::StartJobs(_)
        | Command::Preempt(_)
        | Command::SetSchedulerReasons(_)
        | Command::NoteBypassed(_)
        | Command::Tick
        | Command::RaiseCommandVersion(_)
        | Command::DownNode { .. }
        | Command::ReturnToService { .. } => Authority::Controller,
        Command::EndJobs(_) | Command::EndSteps(_) => Authority::ControllerOrNode,
        Command::SetConfig(_)
        | Command::UpsertNode(_)
        | Command::RemoveNode(_)
        | Command::DrainNode { .. }
        | Command::ResumeNode(_)
        | Command::UpsertPartition(_)
        | Command::RemovePartition(_)
        | Command::UpsertQos(_)
        | Command::RemoveQos(_)
        | Command::UpsertReservation(_)
        | Command::RemoveReservation(_)
        | Command::UpsertAccount { .. }
        | Command::RemoveAccount(_)
        | Command::UpsertUser { .. }
        | Command::RemoveUser(_)
        | Command::SetCoordinators { .. } => Authority::Admin,
        Command::SubmitJobs { .. }
        | Command::CancelJobs { .. }
        | Command::SuspendJobs { .. }
        | Command::ResumeJobs { .. }
        | Command::HoldJobs { .. }
        | Command::ReleaseJobs { .. }
        | Command::RequeueJobs { .. }
        | Command::UpdateJobs { .. }
        | Command::CreateStep { .. }
        | Command::CancelSteps { .. }
        | Command::CompleteJob { .. } => Authority::Users,
    }
}

impl State {
    /// Refuses `command` unless `actor` holds the authority it needs.
    pub fn authorize(&self, actor: &Actor, command: &Command) -> Result<(), Rejection> {
        let needed = needed(command);
        let ok = match (needed, actor) {
            (_, Actor::Controller) => true,
            (Authority::ControllerOrNode, Actor::Node(_)) => true,
            (_, Actor::Node(_)) => false,
            (Authority::Controller | Authority::ControllerOrNode, _) => false,
            (Authority::Admin, actor) => self.is_admin(actor),
            (Authority::Users, Actor::User(_) | Actor::Operator) => true,
        };
        if ok {
            return Ok(());
        }
        Err(Rejection::NotPermitted(match needed {
            Authority::Controller | Authority::ControllerOrNode => format!(
                "{actor} cannot {}: only the controller (and a node's agent, for its own \
                 runs' ends) may",
                describe(command)
            ),
            Authority::Admin => format!(
                "{actor} cannot {}: this needs the admin role (root, or a user with \
                 AdminLevel); nothing changed",
                describe(command)
            ),
            Authority::Users => format!(
                "{actor} cannot {}: a node's agent may only report its runs' ends",
                describe(command)
            ),
        }))
    }
}

/// A few words naming what a command does, for refusals.
fn describe(command: &Command) -> &'static str {
    match command {
        Command::SetConfig(_) => "change the scheduler configuration",
        Command::UpsertNode(_) => "add or change a node",
        Command::RemoveNode(_) => "remove a node",
        Command::DrainNode { .. } => "drain a node",
        Command::ResumeNode(_) => "resume a node",
        Command::DownNode { .. } => "declare a node down",
        Command::ReturnToService { .. } => "return a node to service",
        Command::UpsertPartition(_) => "add or change a partition",
        Command::RemovePartition(_) => "remove a partition",
        Command::UpsertQos(_) => "add or change a QOS",
        Command::RemoveQos(_) => "remove a QOS",
        Command::NoteBypassed(_) => "record bypassed jobs",
        Command::SetSchedulerReasons(_) => "set scheduling reasons",
        Command::Preempt(_) => "preempt jobs",
        Command::UpsertReservation(_) => "create or change a reservation",
        Command::RemoveReservation(_) => "remove a reservation",
        Command::UpsertAccount { .. } => "add or change an account",
        Command::RemoveAccount(_) => "remove an account",
        Command::UpsertUser { .. } => "add or change a user",
        Command::RemoveUser(_) => "remove a user",
        Command::SubmitJobs { .. } => "submit jobs",
        Command::CancelJobs { .. } => "cancel jobs",
        Command::SuspendJobs { .. } => "suspend jobs",
        Command::ResumeJobs { .. } => "resume jobs",
        Command::HoldJobs { .. } => "hold jobs",
        Command::ReleaseJobs { .. } => "release jobs",
        Command::StartJobs(_) => "start jobs",
        Command::EndJobs(_) => "report jobs' ends",
        Command::Tick => "advance the clock",
        Command::RequeueJobs { .. } => "requeue jobs",
        Command::SetCoordinators { .. } => "set an account's coordinators",
        Command::UpdateJobs { .. } => "update jobs",
        Command::CreateStep { .. } => "create a job step",
        Command::EndSteps(_) => "report steps' ends",
        Command::CancelSteps { .. } => "cancel job steps",
        Command::CompleteJob { .. } => "complete a job",
        Command::RaiseCommandVersion(_) => "raise the cluster's command version",
    }
}
