//! Derived relations between jobs that the policy walks on every change: which jobs depend
//! on a job, which records an array's tasks have split into, and which jobs wait as a
//! `singleton` on the jobs of their name.
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

use smol_str::SmolStr;

use crate::ids::{JobId, UserName};
use crate::job::{ArrayPart, DepKind, Job};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Relations {
    /// Target job id -> the jobs whose dependency names it.
    dependents: BTreeMap<JobId, BTreeSet<JobId>>,
    /// Array job id -> the records of its tasks that have split off (the master itself
    /// once it became the last task).
    tasks: BTreeMap<JobId, BTreeSet<JobId>>,
    /// User -> job name -> that user's jobs of that name with a `singleton` clause: the
    /// only jobs a start or end of some other job of that name and user can release.
    singletons: BTreeMap<UserName, BTreeMap<SmolStr, BTreeSet<JobId>>>,
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
            if is_singleton(job) {
                self.singletons
                    .entry(job.spec.user.clone())
                    .or_default()
                    .entry(job.spec.name.clone())
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
            if is_singleton(job)
                && let Some(names) = self.singletons.get_mut(&job.spec.user)
            {
                remove_from(names, job.spec.name.clone(), job.id);
                if names.is_empty() {
                    self.singletons.remove(&job.spec.user);
                }
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

    /// The jobs of `user` named `name` that wait as a `singleton`, in id order.
    pub fn singletons_named<'a>(
        &'a self,
        user: &UserName,
        name: &str,
    ) -> impl Iterator<Item = JobId> + 'a {
        self.singletons
            .get(user)
            .and_then(|names| names.get(name))
            .into_iter()
            .flatten()
            .copied()
    }

    /// Every array with split-off task records, with those records.
    pub fn arrays(&self) -> impl Iterator<Item = (JobId, &BTreeSet<JobId>)> + '_ {
        self.tasks.iter().map(|(array, tasks)| (*array, tasks))
    }

    /// The split-off task records of array `array_job`, in id order.
    pub fn tasks_of(&self, array_job: JobId) -> impl Iterator<Item = JobId> + '_ {
        self.tasks.get(&array_job).into_iter().flatten().copied()
    }
}

fn is_singleton(job: &Job) -> bool {
    job.spec
        .dependency
        .as_ref()
        .is_some_and(|d| d.clauses.iter().any(|c| c.kind == DepKind::Singleton))
}

fn remove_from<K: Ord>(map: &mut BTreeMap<K, BTreeSet<JobId>>, key: K, id: JobId) {
    if let Some(set) = map.get_mut(&key) {
        set.remove(&id);
        if set.is_empty() {
            map.remove(&key);
        }
    }
}
