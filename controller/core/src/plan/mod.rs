//! The planners the leader runs: read the state, decide which jobs start where, and return
//! the decisions as commands for apply to re-validate (a plan made on a state that has since
//! changed is refused, never half-applied).
//!
//! Passes (GWDG's Slurm documentation; Slurm's `sched_config`):
//! - the *direct* pass, on submission: the main pass bounded by `default_queue_depth`;
//! - the *main* pass, every `sched_interval`: jobs in order of consideration, at most
//!   `partition_job_depth` per partition, and a partition stops at its first job that cannot
//!   start, so nothing overtakes it there;
//! - the *backfill* pass (EASY or conservative reservations within `bf_window`).
//!
//! Every pass polls a [`Budget`] before each job. Told to stop, it returns its decisions and
//! a [`Continuation`]: the rest of the order it computed when it began, and its counters.
//! Handed back, the pass resumes there, skipping jobs that started, ended or were blocked
//! meanwhile (the leader's loops decide whether to hand it back: backfill does so after a
//! yield only with `bf_continue` or when nothing changed, as Slurm's does).

pub mod backfill;
pub mod budget;
pub mod main_pass;
mod pass;
pub mod pool;
mod preemption;

use std::collections::BTreeMap;

use crate::command::StartDecision;
use crate::ids::{JobId, PartitionName, UserName};
use crate::job::JobRef;

pub use budget::{Budget, JobCount, Unlimited};
pub use pool::{Placement, Pool};

/// What a pass decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Start these, in this order (one `StartJobs` command).
    pub starts: Vec<StartDecision>,
    /// `Some` when the budget stopped the pass before the end of its order.
    pub continuation: Option<Continuation>,
    /// Jobs (array tasks counting one each) the pass looked at.
    pub considered: u64,
    /// Backfill: the jobs that cannot start now and when and where they are expected to
    /// (what no backfilled job may delay; `squeue --start` shows them).
    pub reservations: Vec<(JobRef, Placement)>,
    /// Preemptions (one `Preempt` command), proposed before the starts.
    pub preemptions: Vec<crate::command::PreemptDecision>,
    /// Main pass: preempted jobs whose cpus are free again (one `ResumeJobs` command),
    /// proposed first.
    pub resumes: Vec<JobId>,
    /// Backfill: jobs a lower one started ahead of (one `NoteBypassed` command).
    pub bypassed: Vec<JobId>,
    /// Why waiting jobs did not start, where that changed: `Resources` for the job a
    /// partition stopped at, `Priority` for the jobs behind it (one `SetSchedulerReasons`
    /// command; `squeue` shows them).
    pub reasons: Vec<(JobId, crate::job::Reason)>,
}

/// Where a stopped pass resumes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Continuation {
    /// The jobs not yet considered, first next.
    pub(crate) rest: Vec<JobId>,
    /// Partitions whose first job that could not start has been met.
    pub(crate) blocked: Blocked,
    /// Jobs considered so far per partition (for `partition_job_depth`).
    pub(crate) depth: BTreeMap<PartitionName, u32>,
    /// Jobs considered so far in all.
    pub(crate) considered: u64,
    /// Backfill: jobs considered so far per user (for `bf_max_job_user`).
    pub(crate) per_user: BTreeMap<UserName, u32>,
    /// Backfill: reservations made so far, kept across a yield so that jobs planned after
    /// it still cannot delay them.
    pub(crate) reservations: Vec<(JobRef, Placement)>,
    /// Backfill in shortest-first order: jobs met behind their partition's reservation
    /// (already counted against the caps), with their queue positions, tried once the queue
    /// has been walked.
    pub(crate) deferred: Vec<(usize, JobId)>,
    /// ... and `rest` now holds them, shortest first, with their positions in `positions`.
    pub(crate) sorted: bool,
    pub(crate) positions: Vec<usize>,
    /// Backfill: jobs of the queue's order walked so far (the next one's queue position),
    /// kept while the walk is in queue order (a yield there records it).
    pub(crate) walked: usize,
}

impl crate::state::State {
    /// The job `id` if it waits to be scheduled: pending, and in the idle part of the queue.
    pub(crate) fn waiting(&self, id: JobId) -> Option<&crate::job::Job> {
        self.jobs.get(&id).filter(|j| {
            j.state == crate::job::JobState::Pending && j.part == crate::job::Part::Idle
        })
    }
}

/// A set of partitions kept as a sorted list, inline up to a few. Nearly every backfill
/// pass blocks a partition, and an ordered set allocated a node of eleven names for it; a
/// site has tens of partitions at most, so the insertion's shift is short.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Blocked(smallvec::SmallVec<[PartitionName; 2]>);

impl Blocked {
    pub(crate) fn contains(&self, partition: &PartitionName) -> bool {
        self.0.binary_search(partition).is_ok()
    }

    /// Adds `partition` (once).
    pub(crate) fn insert(&mut self, partition: PartitionName) {
        if let Err(at) = self.0.binary_search(&partition) {
            self.0.insert(at, partition);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

impl Continuation {
    /// Jobs still to consider.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }
}
