//! Derived relations between jobs that the policy walks on every change: which jobs depend
//! on a job, and which records an array's tasks have split into.
//!
//! Without them, evaluating `afterok:ARRAY` scans every job for the array's tasks, and
//! knowing whose placement a finished job can change means re-placing the whole queue. They
//! are derived (not serialized): [`Relations::compute`] rebuilds them from the jobs, and
//! `check_invariants` verifies the maintained copy equals a fresh computation.
//!
//! Entries are never dropped because a job changed state, only when a record is purged:
//! a dependent that already started or ended stays listed until it goes, and callers
//! filter by state. A dependency target that was purged stays a key while its dependents
//! exist (the dependency then reads as never satisfied).

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::JobId;
use crate::job::{ArrayPart, Job};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Relations {
    /// Target job id -> the jobs whose dependency names it.
    dependents: BTreeMap<JobId, BTreeSet<JobId>>,
    /// Array job id -> the records of its tasks that have split off (the master itself
    /// once it became the last task).
    tasks: BTreeMap<JobId, BTreeSet<JobId>>,
}

impl Relations {
    /// The relations of every job in `jobs`.
    pub fn compute<'a>(jobs: impl Iterator<Item = &'a Job>) -> Relations {
        let mut r = Relations::default();
        for job in jobs {
            r.add(job);
        }
        r
    }

    /// Records a job's dependency targets and, for a task record, its array.
    pub fn add(&mut self, job: &Job) {
        if let Some(dep) = &job.spec.dependency {
            for target in dep.targets() {
                self.dependents
                    .entry(target.job)
                    .or_default()
                    .insert(job.id);
            }
        }
        if let Some(ArrayPart::Task { array_job, .. }) = job.array {
            self.tasks.entry(array_job).or_default().insert(job.id);
        }
    }

    /// Forgets a purged record.
    pub fn remove(&mut self, job: &Job) {
        if let Some(dep) = &job.spec.dependency {
            for target in dep.targets() {
                remove_from(&mut self.dependents, target.job, job.id);
            }
        }
        if let Some(ArrayPart::Task { array_job, .. }) = job.array {
            remove_from(&mut self.tasks, array_job, job.id);
        }
    }

    /// The jobs whose dependency names `target`, in id order.
    pub fn dependents_of(&self, target: JobId) -> impl Iterator<Item = JobId> + '_ {
        self.dependents.get(&target).into_iter().flatten().copied()
    }

    /// The split-off task records of array `array_job`, in id order.
    pub fn tasks_of(&self, array_job: JobId) -> impl Iterator<Item = JobId> + '_ {
        self.tasks.get(&array_job).into_iter().flatten().copied()
    }
}

fn remove_from(map: &mut BTreeMap<JobId, BTreeSet<JobId>>, key: JobId, id: JobId) {
    if let Some(set) = map.get_mut(&key) {
        set.remove(&id);
        if set.is_empty() {
            map.remove(&key);
        }
    }
}
