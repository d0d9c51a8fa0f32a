//! Purging finished jobs, so the replicated state (and every snapshot) stays bounded.
//!
//! A terminal job stays `min_job_age` after its end, for `squeue` and dependency checks,
//! then leaves state. Accounting history is not kept here: each purged job, with the service
//! units it was charged, goes to `State::finished`, which the daemon drains after every
//! apply into its archive (the `sacct` view). A job that a live job's
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
            let charged_milli_su = self.charged_milli_su(&id);
            let Some(job) = self.jobs.remove(&id) else {
                continue;
            };
            self.relations.remove(&job);
            for blob in std::iter::once(job.spec.script).chain(job.spec.env) {
                self.release_blob(&job.spec.user, blob);
            }
            self.finished.0.push(Finished {
                job,
                charged_milli_su,
            });
        }
    }

    /// What a job is charged: its run time (so far, if it still runs) x cpus x its
    /// partition's rate, nothing in the bonus QOS (the rule `State::charge` applies at its
    /// end). Zero for a job not in the queue.
    pub fn charged_milli_su(&self, id: &JobId) -> u64 {
        let Some(job) = self.jobs.get(id) else {
            return 0;
        };
        if self.config.bonus_qos.as_ref() == Some(&job.resolved.qos) {
            return 0;
        }
        let rate = self
            .partitions
            .get(&job.resolved.partition)
            .map_or(1000, |p| u64::from(p.charge_rate.0));
        let end = job.end_time.unwrap_or(self.applied.now);
        crate::apply::charging::service_units_milli(job.run_time(end).0, job.cpus(), rate)
    }
}

/// A job purged from state, for the archive.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub job: Box<crate::job::Job>,
    /// Thousandths of a service unit charged to its account.
    pub charged_milli_su: u64,
}

/// What applies handed the archive and the daemon has not drained yet: purged jobs, and the
/// retention cut-off a tick decided. Not replicated state: never serialized, and equal to
/// any other outbox (so two replicas that drained at different moments still compare equal).
#[derive(Debug, Clone, Default)]
pub struct Outbox(pub Vec<Finished>, pub Option<TimeMs>);

impl PartialEq for Outbox {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl State {
    /// Takes the jobs purged since the last call.
    pub fn take_finished(&mut self) -> Vec<Finished> {
        std::mem::take(&mut self.finished.0)
    }

    /// Takes the retention cut-off the last tick decided: archived jobs that ended before it
    /// are due to leave the archive ([`crate::config::Retention`]). `None` without a
    /// retention setting, or when no tick applied since the last call.
    pub fn take_archive_expiry(&mut self) -> Option<TimeMs> {
        self.finished.1.take()
    }

    /// At a tick: when archived jobs that ended before now minus `PurgeJobAfter` are due.
    pub(crate) fn expire_archive(&mut self, now: TimeMs) {
        if let Some(keep) = self.config.retention.purge_job_after {
            self.finished.1 = Some(TimeMs(now.0.saturating_sub(keep.0.saturating_mul(1000))));
        }
    }
}
