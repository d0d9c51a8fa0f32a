//! Cancel, hold and release: a user acting on their own jobs, an admin on anyone's.
//!
//! Jobs are named as `123` (a job, or a whole array) or `123_7` (one task). Acting on one
//! pending task of an array first splits it off its master into a record of its own, as
//! Slurm does, so it can carry its own state.

use crate::apply::{Rejection, Response};
use crate::command::{Actor, EndCause};
use crate::ids::JobId;
use crate::job::{ArrayPart, Hold, JobRef, JobState, Part};
use crate::policy::stop_eligible_clock;
use crate::quantity::TimeMs;
use crate::state::State;

#[derive(Clone, Copy)]
enum Action {
    Cancel,
    Hold,
    Release,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::Cancel => "cancel",
            Action::Hold => "hold",
            Action::Release => "release",
        }
    }
}

impl State {
    pub(crate) fn cancel_jobs(&mut self, actor: &Actor, jobs: &[JobRef], now: TimeMs) -> Response {
        self.act(actor, jobs, Action::Cancel, now)
    }

    pub(crate) fn hold_jobs(&mut self, actor: &Actor, jobs: &[JobRef], now: TimeMs) -> Response {
        self.act(actor, jobs, Action::Hold, now)
    }

    pub(crate) fn release_jobs(&mut self, actor: &Actor, jobs: &[JobRef], now: TimeMs) -> Response {
        self.act(actor, jobs, Action::Release, now)
    }

    fn act(&mut self, actor: &Actor, jobs: &[JobRef], action: Action, now: TimeMs) -> Response {
        let mut results = Vec::with_capacity(jobs.len());
        let mut touched = std::collections::BTreeSet::new();
        for &target in jobs {
            let mut r = self.act_one(actor, target, action, now);
            // `scancel 123` on an array cancels its started tasks too.
            if r.is_ok() && matches!(action, Action::Cancel) && target.task.is_none() {
                for task in self.live_tasks_of(target.job) {
                    let t = JobRef {
                        job: task,
                        task: None,
                    };
                    if let Err(e) = self.act_one(actor, t, action, now) {
                        r = Err(e);
                    }
                }
            }
            if r.is_ok()
                && let Some(job) = self.jobs.get(&target.job)
            {
                touched.insert(job.spec.user.clone());
            }
            results.push(r);
        }
        if !touched.is_empty() {
            // Cancels free idle slots and may satisfy dependencies of anyone's jobs.
            self.refresh_all_pending(now);
        }
        Response::PerJob(results)
    }

    fn act_one(
        &mut self,
        actor: &Actor,
        target: JobRef,
        action: Action,
        now: TimeMs,
    ) -> Result<(), Rejection> {
        let admin = self.is_admin(actor);
        let job = self
            .jobs
            .get(&target.job)
            .ok_or_else(|| Rejection::unknown("job", target))?;
        if let Actor::User(u) = actor
            && !admin
            && u != &job.spec.user
        {
            return Err(Rejection::NotPermitted(format!(
                "user {u} cannot {} job {target} of user {}",
                action.verb(),
                job.spec.user
            )));
        }
        let id = self.resolve_target(target, action)?;
        let job = self
            .jobs
            .get_mut(&id)
            .ok_or_else(|| Rejection::unknown("job", target))?;
        let wrong_state = |state: JobState| Rejection::WrongState {
            job: target.to_string(),
            state: state.name().to_owned(),
            action: action.verb().to_owned(),
        };
        match action {
            Action::Cancel => match job.state {
                JobState::Pending => {
                    stop_eligible_clock(job, now);
                    job.state = JobState::Cancelled;
                    job.end_time = Some(now);
                    job.end_cause = Some(EndCause::Cancelled);
                    let user = job.spec.user.clone();
                    self.unindex_live(&user, id);
                }
                JobState::Running | JobState::Suspended => {
                    // The agent kills it and reports; resources stay held until then.
                    job.state = JobState::Completing;
                    job.end_cause = Some(EndCause::Cancelled);
                }
                other => return Err(wrong_state(other)),
            },
            Action::Hold => {
                if job.state != JobState::Pending {
                    return Err(wrong_state(job.state));
                }
                job.hold = Some(if admin { Hold::Admin } else { Hold::User });
            }
            Action::Release => {
                if job.state != JobState::Pending {
                    return Err(wrong_state(job.state));
                }
                match job.hold {
                    None => {
                        return Err(Rejection::WrongState {
                            job: target.to_string(),
                            state: "not held".into(),
                            action: "release".into(),
                        });
                    }
                    Some(Hold::Admin) if !admin => {
                        return Err(Rejection::NotPermitted(format!(
                            "job {target} is held by an administrator"
                        )));
                    }
                    Some(_) => job.hold = None,
                }
                // Released jobs are placed afresh (they compete for an idle slot).
                job.part = Part::Blocked;
            }
        }
        Ok(())
    }

    /// Live records of an array's split-off tasks (not the master record itself).
    fn live_tasks_of(&self, array_job: JobId) -> Vec<JobId> {
        self.jobs
            .values()
            .filter(|j| {
                j.id != array_job
                    && !j.state.is_terminal()
                    && j.state != JobState::Completing
                    && matches!(j.array, Some(ArrayPart::Task { array_job: a, .. }) if a == array_job)
            })
            .map(|j| j.id)
            .collect()
    }

    /// The record an action applies to. A single pending task of an array is split off
    /// first (except for cancel, which just drops the index).
    fn resolve_target(&mut self, target: JobRef, action: Action) -> Result<JobId, Rejection> {
        let Some(index) = target.task else {
            return Ok(target.job);
        };
        let head = self
            .jobs
            .get(&target.job)
            .ok_or_else(|| Rejection::unknown("job", target))?;
        match &head.array {
            Some(ArrayPart::Master { pending, .. }) if pending.contains(index) => {
                Ok(self.split_task(target.job, index))
            }
            Some(ArrayPart::Task { index: i, .. }) if *i == index => Ok(target.job),
            Some(_) => self
                .jobs
                .values()
                .find(|j| {
                    matches!(j.array, Some(ArrayPart::Task { array_job, index: i })
                        if array_job == target.job && i == index)
                })
                .map(|j| j.id)
                .ok_or_else(|| Rejection::unknown("array task", target)),
            None => Err(Rejection::invalid(
                "job",
                format!(
                    "job {} is not an array; cannot {} task {index}",
                    target.job,
                    action.verb()
                ),
            )),
        }
    }

    /// Splits pending task `index` off array `master` into its own record and returns its
    /// id. The last pending task takes over the master record itself (Slurm's convention:
    /// the array job id ends up naming its last task).
    pub(crate) fn split_task(&mut self, master: JobId, index: u32) -> JobId {
        let Some(head) = self.jobs.get_mut(&master) else {
            return master;
        };
        let Some(ArrayPart::Master { pending, .. }) = &mut head.array else {
            return master;
        };
        pending.remove(index);
        if pending.is_empty() {
            head.array = Some(ArrayPart::Task {
                array_job: master,
                index,
            });
            return master;
        }
        let mut task = head.clone();
        task.array = Some(ArrayPart::Task {
            array_job: master,
            index,
        });
        let id = JobId(self.next_job_id);
        self.next_job_id += 1;
        task.id = id;
        for blob in std::iter::once(task.spec.script).chain(task.spec.env) {
            if let Some(b) = self.blobs.get_mut(&blob) {
                b.refs += 1;
            }
        }
        self.index_live(&task);
        self.jobs.insert(id, task);
        id
    }
}
