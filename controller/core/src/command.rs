//! Commands: every change to replicated state.
//!
//! A command is what the leader proposes and every replica applies. It is serialized into the
//! Raft log, so its encoding is versioned ([`Envelope::version`]): a replica refuses a
//! command newer than it understands instead of misapplying it, which is what makes rolling
//! upgrades safe (upgrade every replica before the leader proposes the new version).
//!
//! Every command travels with its [`Actor`]: who asked, as the controller proved it (a user's
//! credential, an agent's certificate) or the controller itself. Apply checks the actor's
//! authority for every command against the state at that point of the log
//! ([`crate::apply::authority`]), so a change of role (an admin demoted) takes effect exactly
//! where it is in the log, and no request reaches the state on anyone's word.

use serde::{Deserialize, Serialize};

use crate::layout::{self, Layout};

use crate::account::{AssocLimits, Grant, User, UserAssoc};
use crate::config::SchedConfig;
use crate::ids::{AccountName, JobId, NodeName, PartitionName, QosName, UserName};
use crate::job::{ExitStatus, JobRef, JobSpec};
use crate::node::NodeSpec;
use crate::partition::Partition;
use crate::qos::Qos;

/// The command encoding this build writes and the newest it applies. Version 2 carries the
/// actor in the envelope for every command; version 3 adds job steps ([`Command::CreateStep`],
/// [`Command::EndSteps`], [`Command::CancelSteps`]); version 4 adds jobs' comments
/// ([`Layout::V2`]); version 5 adds [`Command::ReturnToService`] (same layout). Versions 2
/// and 3 are read as [`Layout::V1`].
pub const COMMAND_VERSION: u16 = 5;

/// What command `version` added, in a few words, for refusals while a cluster still writes an
/// older one.
pub fn added_in(version: u16) -> &'static str {
    match version {
        5 => "returning nodes to service",
        4 => "jobs' comments",
        3 => "job steps",
        _ => "the actor in every envelope",
    }
}

/// The layout of the data inside an envelope of `version`.
pub fn layout_of(version: u16) -> Layout {
    if version < 4 { Layout::V1 } else { Layout::V2 }
}

/// A command as it travels through the log: what to do and who asked.
///
/// Its version is its first field, and decoding reads the rest in the layout that version
/// wrote ([`crate::layout`]), so entries a replica logged before an upgrade still apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub version: u16,
    pub actor: Actor,
    pub command: Command,
}

impl Envelope {
    pub fn new(actor: Actor, command: Command) -> Envelope {
        Envelope {
            version: COMMAND_VERSION,
            actor,
            command,
        }
    }

    /// A command the controller makes on its own behalf (scheduling passes, node liveness,
    /// the site file at bootstrap).
    pub fn controller(command: Command) -> Envelope {
        Envelope::new(Actor::Controller, command)
    }
}

/// Written in the layout of its version, so an entry read from bytes an older build wrote and
/// written again (the log store and every append re-encode entries) is the same bytes.
impl Serialize for Envelope {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let _layout = layout::Scope::enter(layout_of(self.version));
        let mut s = serializer.serialize_struct("Envelope", 3)?;
        s.serialize_field("version", &self.version)?;
        s.serialize_field("actor", &self.actor)?;
        s.serialize_field("command", &self.command)?;
        s.end()
    }
}

impl<'de> Deserialize<'de> for Envelope {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        const FIELDS: &[&str] = &["version", "actor", "command"];
        deserializer.deserialize_struct("Envelope", FIELDS, EnvelopeVisitor)
    }
}

struct EnvelopeVisitor;

impl<'de> serde::de::Visitor<'de> for EnvelopeVisitor {
    type Value = Envelope;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a command envelope (version, actor, command)")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Envelope, A::Error> {
        use serde::de::Error;
        let version: u16 = seq
            .next_element()?
            .ok_or_else(|| A::Error::invalid_length(0, &self))?;
        let _layout = layout::Scope::enter(layout_of(version));
        let actor = seq
            .next_element()?
            .ok_or_else(|| A::Error::invalid_length(1, &self))?;
        let command = seq
            .next_element()?
            .ok_or_else(|| A::Error::invalid_length(2, &self))?;
        Ok(Envelope {
            version,
            actor,
            command,
        })
    }
}

/// Who asks. The controller proves the caller (a user's credential, an agent's certificate);
/// the core decides what they may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Actor {
    /// A user (a credential for their uid): acts on their own jobs, and on others' as an
    /// account coordinator or an admin (`AdminLevel` in state).
    User(UserName),
    /// Root (a credential for uid 0): the cluster's operator, an admin of everything.
    Operator,
    /// The controller itself: the leader's scheduling passes and node liveness, and the site
    /// file a new cluster starts from. Never what a request becomes.
    Controller,
    /// The agent of a compute node (its certificate): it may only report the ends of runs
    /// dispatched to that node.
    Node(NodeName),
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Actor::User(u) => write!(f, "{u}"),
            Actor::Operator => f.write_str("root"),
            Actor::Controller => f.write_str("the controller"),
            Actor::Node(n) => write!(f, "the agent of node {n}"),
        }
    }
}

/// How a job ended, as far as the scheduler cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EndCause {
    /// The script exited; the exit status says how.
    Exited,
    /// Killed at its time limit.
    Timeout,
    /// Killed by the out-of-memory killer.
    OutOfMemory,
    /// Filled its jobfs.
    JobfsExceeded,
    /// Its node failed.
    NodeFail,
    /// It could not be launched.
    LaunchFailed,
    /// Cancelled while running.
    Cancelled,
    /// Killed to make room for a preempting job (requeued or cancelled as its mode says).
    Preempted,
    /// Killed to be requeued (`scontrol requeue`): it goes back to pending when it ends.
    Requeued,
}

/// One start decision made by the planner: re-validated by apply against current state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartDecision {
    /// The job, or for an array master the task to split off.
    pub job: JobRef,
    /// The nodes, in order; cpus, memory and jobfs per node follow from the request.
    pub nodes: Vec<NodeName>,
}

/// A preemption the planner decided: the running jobs to stop, and the start they make room
/// for. Apply checks all of it and does all or nothing: suspended victims free their cpus
/// and the job starts at once; victims being killed (requeue or cancel mode) free their
/// nodes only when their agents report, and the job starts in a later pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptDecision {
    pub start: StartDecision,
    pub victims: Vec<crate::ids::JobId>,
}

/// A job's end, reported by its agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndReport {
    pub job: JobId,
    /// The dispatch epoch the agent holds; a stale report is ignored.
    pub epoch: u64,
    pub cause: EndCause,
    pub exit: ExitStatus,
}

/// The end of a step's tasks on one node, reported by that node's agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepEndReport {
    pub step: crate::job::StepRef,
    /// The job's dispatch epoch the agent holds; a report from an older run is ignored.
    pub epoch: u64,
    pub node: NodeName,
    pub cause: EndCause,
    pub exit: ExitStatus,
}

/// Every change to replicated state.
///
/// Encoded by variant position (postcard), and old entries live on in every log: a new
/// variant goes last, and none is ever removed or reordered (`tests/upgrade.rs` reads
/// entries an older build wrote).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Replace the scheduler configuration.
    SetConfig(Box<SchedConfig>),
    /// Add a node or change its capacity and features.
    UpsertNode(NodeSpec),
    /// Remove a node that holds no jobs.
    RemoveNode(NodeName),
    /// Let running jobs finish, start nothing new.
    DrainNode {
        node: NodeName,
        reason: String,
    },
    /// Undo a drain or a down.
    ResumeNode(NodeName),
    /// Declare a node down: its jobs are requeued or failed (node failure).
    DownNode {
        node: NodeName,
        reason: String,
    },
    UpsertPartition(Box<Partition>),
    RemovePartition(PartitionName),
    UpsertQos(Box<Qos>),
    RemoveQos(QosName),
    /// Jobs a backfill pass started lower-priority jobs ahead of: each one's bypass count
    /// grows by one (Maui's bypass factor; NCI's starvation guard).
    NoteBypassed(Vec<crate::ids::JobId>),
    /// Why waiting jobs did not start in the last pass (Resources, Priority, or None).
    SetSchedulerReasons(Vec<(crate::ids::JobId, crate::job::Reason)>),
    /// Preemptions decided by the planner.
    Preempt(Vec<PreemptDecision>),
    /// Creates or changes an advance reservation.
    UpsertReservation(Box<crate::reservation::Reservation>),
    RemoveReservation(crate::ids::ReservationName),
    /// Add or change an account (its users are kept).
    UpsertAccount {
        name: AccountName,
        parent: AccountName,
        shares: u32,
        limits: AssocLimits,
        grant: Option<Grant>,
    },
    RemoveAccount(AccountName),
    /// Add or change a user and their associations (replacing the previous set).
    UpsertUser {
        user: User,
        assocs: Vec<(AccountName, UserAssoc)>,
    },
    RemoveUser(UserName),
    /// Submit jobs. Each is accepted or rejected on its own; `blobs` carries the scripts and
    /// environments they reference (content-addressed, stored once).
    SubmitJobs {
        blobs: Vec<Vec<u8>>,
        jobs: Vec<JobSpec>,
    },
    CancelJobs {
        jobs: Vec<JobRef>,
    },
    /// Freeze running jobs (admin): they keep memory and jobfs; walltime stops.
    SuspendJobs {
        jobs: Vec<JobRef>,
    },
    /// Thaw suspended jobs (admin).
    ResumeJobs {
        jobs: Vec<JobRef>,
    },
    HoldJobs {
        jobs: Vec<JobRef>,
    },
    ReleaseJobs {
        jobs: Vec<JobRef>,
    },
    /// The planner's start decisions.
    StartJobs(Vec<StartDecision>),
    /// Agents' end reports.
    EndJobs(Vec<EndReport>),
    /// Time passes: re-evaluate begin times, limits that depend on time, purge old jobs.
    Tick,
    /// Stop running or suspended jobs and put them back in the queue (`scontrol requeue`).
    RequeueJobs {
        jobs: Vec<JobRef>,
    },
    /// Make exactly these users the coordinators of an account.
    SetCoordinators {
        account: AccountName,
        users: Vec<UserName>,
    },
    /// Change jobs' time limit, name or nice (`scontrol update job`).
    UpdateJobs {
        jobs: Vec<JobRef>,
        update: crate::apply::update::JobUpdate,
    },
    /// `srun` inside a running job: a new step in its allocation.
    CreateStep {
        job: JobId,
        spec: crate::job::StepSpec,
    },
    /// Agents' reports that a step's tasks ended on their node.
    EndSteps(Vec<StepEndReport>),
    /// Stop steps (`scancel JOBID.STEP`, an interrupted `srun`).
    CancelSteps {
        steps: Vec<crate::job::StepRef>,
    },
    /// Its owner ends a running job with an exit status of their choosing (Slurm's
    /// `slurm_complete_job`): `salloc` when its command exits, `srun` outside an allocation
    /// when its step ends. The agents stop what runs; the job ends with this status.
    CompleteJob {
        job: JobId,
        exit: crate::job::ExitStatus,
    },
    /// Every replica runs a build that applies commands of this version: the leader raises
    /// the cluster's command version once all of them report it, and from then on commands
    /// are written in it (see [`crate::layout`]). Never lowers it.
    RaiseCommandVersion(u16),
    /// Its agent is back: clear a node's down, leaving any drain (Slurm's
    /// `ReturnToService`). Only a down for not responding
    /// ([`crate::node::NOT_RESPONDING`]) unless `any_reason`; anything else is refused.
    ReturnToService {
        node: NodeName,
        any_reason: bool,
    },
}

impl Command {
    /// The oldest command version that can carry this command whole: 5 for
    /// [`Command::ReturnToService`], 4 for a job's comment (submitted or updated) and for
    /// [`Command::RaiseCommandVersion`], 3 otherwise.
    pub fn needs_version(&self) -> u16 {
        match self {
            Command::ReturnToService { .. } => 5,
            Command::SubmitJobs { jobs, .. } if jobs.iter().any(|j| j.comment.is_some()) => 4,
            Command::UpdateJobs { update, .. } if update.comment.is_some() => 4,
            Command::RaiseCommandVersion(_) => 4,
            _ => 3,
        }
    }

    /// Whether applying this command can let a waiting job start at once: it adds jobs or
    /// makes them eligible, frees resources, or widens what may run where. The leader runs
    /// its direct scheduling pass after such a command commits instead of leaving the job to
    /// the next timed main pass, as Slurm's controller schedules on submission and on job
    /// completion (`schedule()` from `job_complete`), so a node freed by an ending job is
    /// refilled within milliseconds, not within `sched_interval`.
    ///
    /// The scheduler's own bookkeeping (starts, bypass counts, reasons) and the timed tick
    /// (the main pass follows it) answer false, so a pass never wakes itself.
    pub fn may_let_jobs_start(&self) -> bool {
        match self {
            Command::SubmitJobs { .. }
            | Command::EndJobs(_)
            | Command::CancelJobs { .. }
            | Command::ReleaseJobs { .. }
            | Command::ResumeJobs { .. }
            | Command::SuspendJobs { .. }
            | Command::RequeueJobs { .. }
            | Command::UpdateJobs { .. }
            | Command::CompleteJob { .. }
            | Command::Preempt(_)
            | Command::DownNode { .. }
            | Command::ResumeNode(_)
            | Command::ReturnToService { .. }
            | Command::UpsertNode(_)
            | Command::UpsertPartition(_)
            | Command::UpsertQos(_)
            | Command::UpsertReservation(_)
            | Command::RemoveReservation(_)
            | Command::UpsertAccount { .. }
            | Command::UpsertUser { .. }
            | Command::SetConfig(_) => true,
            Command::StartJobs(_)
            | Command::NoteBypassed(_)
            | Command::SetSchedulerReasons(_)
            | Command::Tick
            | Command::HoldJobs { .. }
            | Command::DrainNode { .. }
            | Command::RemoveNode(_)
            | Command::RemovePartition(_)
            | Command::RemoveQos(_)
            | Command::RemoveAccount(_)
            | Command::RemoveUser(_)
            | Command::SetCoordinators { .. }
            | Command::CreateStep { .. }
            | Command::EndSteps(_)
            | Command::CancelSteps { .. }
            | Command::RaiseCommandVersion(_) => false,
        }
    }
}
