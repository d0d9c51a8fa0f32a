//! Purging finished jobs, so the replicated state (and every snapshot) stays bounded.
//!
//! A terminal job stays `min_job_age` after its end, for `squeue` and dependency checks,
//! then leaves state (accounting history is not kept here). A job that a live job's
//! dependency names stays until that job is done with it, and an array's record stays while
//! any of its tasks is alive, so dependency outcomes never change by purging.

use std::collections::BTreeSet;

use crate::ids::JobId;
use crate::job::ArrayPart;
use crate::quantity::TimeMs;
use crate::state::State;

impl State {
    pub(crate) fn purge_finished(&mut self, now: TimeMs) {
        let min_age = self.config.min_job_age;
        let mut keep: BTreeSet<JobId> = BTreeSet::new();
        for job in self.jobs.values().filter(|j| !j.state.is_terminal()) {
            if let Some(dep) = &job.spec.dependency {
                keep.extend(dep.targets().map(|t| t.job));
            }
            if let Some(ArrayPart::Task { array_job, .. }) = job.array {
                keep.insert(array_job);
            }
        }
        // Keep every task of a kept array too: `afterok:ARRAY` looks at all of them.
        let kept_arrays = keep.clone();
        let old: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.state.is_terminal())
            .filter(|j| j.end_time.is_some_and(|end| now.since(end) >= min_age))
            .filter(|j| !keep.contains(&j.id))
            .filter(|j| {
                !matches!(j.array, Some(ArrayPart::Task { array_job, .. })
                    if kept_arrays.contains(&array_job))
            })
            .map(|j| j.id)
            .collect();
        for id in old {
            let Some(job) = self.jobs.remove(&id) else {
                continue;
            };
            self.relations.remove(&job);
            for blob in std::iter::once(job.spec.script).chain(job.spec.env) {
                if let Some(b) = self.blobs.get_mut(&blob) {
                    b.refs -= 1;
                    if b.refs == 0 {
                        self.blobs.remove(&blob);
                    }
                }
            }
        }
    }
}
