//! Purging finished jobs, so the replicated state (and every snapshot) stays bounded.
//!
//! A terminal job stays `min_job_age` after its end, for `squeue` and dependency checks,
//! then leaves state. Accounting history is not kept here: each purged job, with the service
//! units it was charged, goes to `State::finished`, which the daemon drains after every
//! apply into its archive (the `sacct` view). A job that a live job's
//! dependency names stays until that job is done with it, and an array's record stays while
//! any of its tasks is alive, so dependency outcomes never change by purging.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::JobId;
use crate::job::ArrayPart;
use crate::quantity::TimeMs;
use crate::state::State;

impl State {
    /// Purges the terminal jobs that ended `MinJobAge` ago and no live job still needs.
    ///
    /// Walks the ended jobs from the oldest end (the `ended` index) and stops at the first
    /// too young to go, so a tick costs what it purges plus what it must keep, not every
    /// job the state holds: with a queue thousands deep, walking every job at every tick
    /// was a tenth of a trace replay (`perf`, NASA's trace under FCFS at load 0.9).
    pub(crate) fn purge_finished(&mut self, now: TimeMs) {
        let min_age = self.config.min_job_age;
        // Whether a live job still looks at `id`: one whose dependency names it, or a live
        // task of array `id` (then every task of the array stays: `afterok:ARRAY` looks at
        // all of them). Asked once per array for its many tasks.
        let mut needed: BTreeMap<JobId, bool> = BTreeMap::new();
        let mut needed_by_live = |state: &State, id: JobId| {
            *needed.entry(id).or_insert_with(|| {
                state
                    .relations
                    .dependents_of(id)
                    .chain(state.relations.tasks_of(id))
                    .any(|j| state.jobs.get(&j).is_some_and(|j| !j.state.is_terminal()))
            })
        };
        let mut old: Vec<JobId> = Vec::new();
        for &(end, id) in &self.ended {
            if now.since(end) < min_age {
                break;
            }
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            let in_needed_array = matches!(job.array, Some(ArrayPart::Task { array_job, .. })
                if needed_by_live(self, array_job));
            if !in_needed_array && !needed_by_live(self, id) {
                old.push(id);
            }
        }
        // In id order, as the archive has always received them.
        old.sort_unstable();
        for id in old {
            let charged_milli_su = self.charged_milli_su(&id);
            let Some(job) = self.jobs.remove(&id) else {
                continue;
            };
            if let Some(end) = job.end_time {
                self.ended.remove(&(end, id));
            }
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

    /// The ended-jobs index as it should be: every terminal job with its end time.
    pub(crate) fn compute_ended(&self) -> BTreeSet<(TimeMs, JobId)> {
        self.jobs
            .values()
            .filter(|j| j.state.is_terminal())
            .filter_map(|j| j.end_time.map(|end| (end, j.id)))
            .collect()
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
