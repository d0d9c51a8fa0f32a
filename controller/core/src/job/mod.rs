//! A job: what was asked ([`JobSpec`]), what it resolved to, and where it is in its life.
//!
//! An array job is one record while its tasks are pending (its [`ArrayPart::Master`] keeps
//! the pending indexes); each task splits off into a record of its own, with a new id, when
//! it starts, as Slurm does. So 10,000 pending tasks cost one record.

pub mod array;
pub mod dependency;
pub mod spec;
pub mod state;
pub mod step;

use serde::{Deserialize, Serialize};

use crate::ids::{AccountName, JobId, NodeName, PartitionName, QosName};
use crate::quantity::{MiB, Seconds, TimeMs};

pub use array::{ArraySpec, IndexSet};
pub use dependency::{Combine, DepClause, DepKind, Dependency, JobRef};
pub use spec::{BlobId, JobSpec, MemoryRequest, TimeRequest, WarnSignal};
pub use state::{JobState, Reason};
pub use step::{StepId, StepRef, StepSpec, Steps};

/// Who put a hold on a job; an admin hold can only be released by an admin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Hold {
    User,
    Admin,
}

/// A job's place in an array.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ArrayPart {
    /// The array itself: the tasks that have not started yet.
    Master {
        pending: IndexSet,
        throttle: Option<u32>,
    },
    /// One task that has started (or been split off): `array_job_index`.
    Task { array_job: JobId, index: u32 },
}

/// The resources one node gives a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeShare {
    pub node: NodeName,
    pub cpus: u32,
    pub memory: MiB,
    pub jobfs: MiB,
    pub gpus: u32,
}

/// What a running job holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub shares: Vec<NodeShare>,
    /// Whole nodes, shared with nobody.
    pub exclusive: bool,
    /// Agents refuse instructions older than this; bumped on every start and requeue.
    pub epoch: u64,
    /// What holding it is billed, in thousandths, weighed by its partition's
    /// `TRESBillingWeights` when it started (sacct's `billing=` in AllocTRES, as Slurm keeps
    /// the billable TRES of the start). `None` for allocations made before it was recorded.
    #[serde(deserialize_with = "crate::layout::since_v2", default)]
    pub billing_milli: Option<u64>,
}

impl Allocation {
    pub fn cpus(&self) -> u64 {
        self.shares.iter().map(|s| u64::from(s.cpus)).sum()
    }

    pub fn gpus(&self) -> u64 {
        self.shares.iter().map(|s| u64::from(s.gpus)).sum()
    }

    pub fn memory(&self) -> MiB {
        MiB(self
            .shares
            .iter()
            .fold(0u64, |m, s| m.saturating_add(s.memory.0)))
    }

    /// What it holds, as [`crate::tres::BillingWeights`] weigh it.
    pub fn tres(&self) -> crate::tres::Tres {
        crate::tres::Tres {
            cpus: self.cpus(),
            memory: self.memory(),
            gpus: self.gpus(),
        }
    }
}

/// How a job ended, and what it used, as its agent reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// The script's exit code (0-255).
    pub code: i32,
    /// The signal that killed it, 0 if none.
    pub signal: i32,
    /// CPU time its processes used (user + system), milliseconds (sacct's TotalCPU).
    pub cpu_time_ms: u64,
    /// Its peak memory, MiB (sacct's MaxRSS).
    pub max_rss_mib: u64,
}

/// The effective request after defaults: what limits and scheduling use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    pub account: AccountName,
    /// The (account, user) association's id.
    pub assoc: crate::assoc::AssocId,
    pub partition: PartitionName,
    pub qos: QosName,
    /// `None` = no limit (UNLIMITED).
    pub time_limit: Option<Seconds>,
    pub memory: MemoryRequest,
    pub jobfs: MiB,
}

/// Maui's parts of the queue, for a pending job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Part {
    /// Submitted, not yet placed by the policy (placement happens in the same apply).
    New,
    /// Considered for scheduling; counts against the per-user idle cap.
    Idle,
    /// Held back by a rule, a hold, a dependency or its begin time; [`Job::reason`] says which.
    Blocked,
}

/// One job in the replicated state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    /// Boxed: the spec is most of a job's bytes, and with it inline a job (1,104 bytes) was
    /// too large for glibc's per-thread cache of freed blocks (1,032 bytes at most), so every
    /// job's end freed it the slow way, and every move of a job copied it.
    pub spec: Box<JobSpec>,
    pub resolved: Resolved,
    pub state: JobState,
    pub reason: Reason,
    pub hold: Option<Hold>,
    /// For a pending job: idle or blocked (Maui). Meaningless otherwise.
    pub part: Part,
    pub array: Option<ArrayPart>,
    pub submit_time: TimeMs,
    /// Since when the job has been eligible without interruption (age accrues from here;
    /// Slurm's age does not grow while held, blocked by a limit or waiting on a dependency).
    pub eligible_since: Option<TimeMs>,
    /// Eligible time accrued before the current stretch (IT4I's eligible_time).
    pub eligible_accrued: Seconds,
    pub start_time: Option<TimeMs>,
    pub end_time: Option<TimeMs>,
    /// Time spent suspended so far; walltime does not run while suspended.
    pub suspended_total: Seconds,
    pub suspended_since: Option<TimeMs>,
    /// Fair-share usage has been accrued up to here (running jobs accrue on every tick).
    pub usage_until: Option<TimeMs>,
    pub alloc: Option<Allocation>,
    pub requeue_count: u32,
    pub exit: Option<ExitStatus>,
    /// Why it ended, as its agent reported.
    pub end_cause: Option<crate::command::EndCause>,
    /// Slurm's site factor: added to priority as is; set by an administrator.
    pub site_priority: i64,
    /// Times the backfill planner let a lower-priority job start ahead of it (Maui).
    pub bypass_count: u32,
    /// Preempted (suspended, or being killed to be requeued or cancelled) for this job.
    pub preempted: Option<Preemption>,
    /// The steps `srun` created inside the job's allocation (not the batch script).
    pub steps: Steps,
    /// The status its owner completed it with ([`crate::Command::CompleteJob`]) while its
    /// agents stop it; the job ends with this status, not the killed script's.
    pub completed_with: Option<ExitStatus>,
    /// The allocation it ended with, kept for accounting (`sacct`'s NodeList, AllocCPUS and
    /// the batch step's node) once [`Job::alloc`] no longer holds anything.
    pub ran_on: Option<Allocation>,
    /// How long the planners expect it to run, predicted at submission from its owner's
    /// recent jobs (see [`crate::predict`]); `None` = plan on the time limit.
    pub predicted: Option<Seconds>,
}

/// Why a running job was stopped for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemption {
    pub by: JobId,
    pub mode: crate::partition::PreemptMode,
}

impl Job {
    /// The allocation it runs in, or the one it last ended with.
    pub fn allocation_record(&self) -> Option<&Allocation> {
        self.alloc.as_ref().or(self.ran_on.as_ref())
    }

    /// Total cpus asked for.
    pub fn cpus(&self) -> u64 {
        self.spec.cpus()
    }

    /// Pending tasks this record stands for: an array master counts its pending indexes.
    pub fn pending_count(&self) -> u64 {
        match (&self.state, &self.array) {
            (JobState::Pending, Some(ArrayPart::Master { pending, .. })) => pending.len(),
            (JobState::Pending, _) => 1,
            _ => 0,
        }
    }

    /// The resources the job holds: its allocation's, or the cpus and GPUs it asks for
    /// while it holds none.
    pub fn tres_held(&self) -> crate::tres::Tres {
        match &self.alloc {
            Some(a) => a.tres(),
            None => crate::tres::Tres {
                cpus: self.cpus(),
                memory: MiB(0),
                gpus: u64::from(self.spec.gpus_per_node) * u64::from(self.spec.nodes.max(1)),
            },
        }
    }

    /// Eligible time accrued up to `now`.
    pub fn eligible_time(&self, now: TimeMs) -> Seconds {
        self.eligible_accrued
            + self
                .eligible_since
                .map(|since| now.since(since))
                .unwrap_or_default()
    }

    /// Wall-clock run time up to `now`, excluding time suspended.
    pub fn run_time(&self, now: TimeMs) -> Seconds {
        let Some(start) = self.start_time else {
            return Seconds::ZERO;
        };
        let end = self.end_time.unwrap_or(now);
        let suspended = self.suspended_total
            + self
                .suspended_since
                .map(|s| end.since(s))
                .unwrap_or_default();
        end.since(start).saturating_sub(suspended)
    }

    /// Processor-seconds still to run (Maui's PS for a running job): remaining walltime x cpus.
    pub fn remaining_ps(&self, now: TimeMs) -> Option<u64> {
        let limit = self.resolved.time_limit?;
        let left = limit.saturating_sub(self.run_time(now));
        Some(left.0.saturating_mul(self.cpus()))
    }

    /// Processor-seconds the job asks for (Maui's PS for a job about to start):
    /// WCLIMIT x procs. `None` for an unlimited job.
    pub fn requested_ps(&self) -> Option<u64> {
        Some(self.resolved.time_limit?.0.saturating_mul(self.cpus()))
    }
}
