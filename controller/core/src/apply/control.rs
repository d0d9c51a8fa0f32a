//! Cancel, hold and release: a user acting on their own jobs, an admin on anyone's.
//!
//! Jobs are named as `123` (a job, or a whole array) or `123_7` (one task). Acting on one
//! pending task of an array first splits it off its master into a record of its own, as
//! Slurm does, so it can carry its own state.

use crate::apply::{Rejection, Response};
use crate::command::{Actor, EndCause};
use crate::ids::JobId;
use crate::job::{ArrayPart, Hold, Job, JobRef, JobState, Part};
use crate::policy::Affected;
use crate::policy::stop_eligible_clock;
use crate::quantity::TimeMs;
use crate::state::State;

/// A run to signal: the job, the node running its batch script, and the run's epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalTarget {
    pub job: JobId,
    pub node: crate::ids::NodeName,
    pub epoch: u64,
}

#[derive(Clone, Copy)]
enum Action {
    Cancel,
    Hold,
    Release,
    Suspend,
    Resume,
    Requeue,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::Cancel => "cancel",
            Action::Hold => "hold",
            Action::Release => "release",
            Action::Suspend => "suspend",
            Action::Resume => "resume",
            Action::Requeue => "requeue",
        }
    }
}

/// What a job reference names.
#[derive(Clone, Copy)]
enum Place {
    /// A record of its own.
    Record(JobId),
    /// A task still pending inside its array's record: (array, index).
    PendingTask(JobId, u32),
}

/// Whether `action` may be applied to `job` (the record, or the array holding the task).
fn check_action(job: &Job, target: JobRef, action: Action, admin: bool) -> Result<(), Rejection> {
    let wrong_state = |state: &str| Rejection::WrongState {
        job: target.to_string(),
        state: state.to_owned(),
        action: action.verb().to_owned(),
    };
    match action {
        Action::Cancel => match job.state {
            JobState::Pending | JobState::Running | JobState::Suspended => Ok(()),
            other => Err(wrong_state(other.name())),
        },
        Action::Hold if job.state != JobState::Pending => Err(wrong_state(job.state.name())),
        Action::Hold => Ok(()),
        Action::Release if job.state != JobState::Pending => Err(wrong_state(job.state.name())),
        Action::Suspend | Action::Resume if !admin => Err(Rejection::NotPermitted(format!(
            "only an administrator may {} jobs",
            action.verb()
        ))),
        Action::Suspend if job.state != JobState::Running => Err(wrong_state(job.state.name())),
        Action::Resume if job.state != JobState::Suspended => Err(wrong_state(job.state.name())),
        Action::Suspend | Action::Resume => Ok(()),
        Action::Requeue => match job.state {
            JobState::Running | JobState::Suspended => Ok(()),
            other => Err(wrong_state(other.name())),
        },
        Action::Release => match job.hold {
            None => Err(wrong_state("not held")),
            Some(Hold::Admin) if !admin => Err(Rejection::NotPermitted(format!(
                "job {target} is held by an administrator"
            ))),
            Some(_) => Ok(()),
        },
    }
}

impl State {
    pub(crate) fn cancel_jobs(&mut self, actor: &Actor, jobs: &[JobRef], now: TimeMs) -> Response {
        self.act(actor, jobs, Action::Cancel, now)
    }

    /// [`crate::Command::CompleteJob`]: a running (or suspended) job of `actor`'s, or any
    /// job for an administrator, goes to COMPLETING and ends with `exit` once its agents
    /// confirm that it stopped.
    pub(crate) fn complete_job(
        &mut self,
        actor: &Actor,
        id: JobId,
        exit: crate::job::ExitStatus,
        now: TimeMs,
    ) -> Result<Response, Rejection> {
        let admin = self.is_admin(actor);
        self.permitted(
            actor,
            admin,
            JobRef {
                job: id,
                task: None,
            },
            "complete",
        )?;
        if !(0..=255).contains(&exit.code) || !(0..=64).contains(&exit.signal) {
            return Err(Rejection::invalid(
                "exit",
                format!(
                    "code {} and signal {}: codes are 0-255, signals 0-64",
                    exit.code, exit.signal
                ),
            ));
        }
        let job = self
            .jobs
            .get_mut(&id)
            .ok_or_else(|| Rejection::unknown("job", id))?;
        if !matches!(job.state, JobState::Running | JobState::Suspended) {
            return Err(Rejection::WrongState {
                job: id.to_string(),
                state: job.state.name().to_owned(),
                action: "complete".into(),
            });
        }
        if let Some(since) = job.suspended_since.take() {
            job.suspended_total += now.since(since);
        }
        job.state = JobState::Completing;
        job.end_cause = Some(EndCause::Exited);
        job.completed_with = Some(crate::job::ExitStatus {
            code: exit.code,
            signal: exit.signal,
            ..Default::default()
        });
        self.queue_index.touch(id);
        Ok(Response::Done)
    }

    pub(crate) fn suspend_jobs(&mut self, actor: &Actor, jobs: &[JobRef], now: TimeMs) -> Response {
        self.act(actor, jobs, Action::Suspend, now)
    }

    pub(crate) fn resume_jobs(&mut self, actor: &Actor, jobs: &[JobRef], now: TimeMs) -> Response {
        self.act(actor, jobs, Action::Resume, now)
    }

    pub(crate) fn hold_jobs(&mut self, actor: &Actor, jobs: &[JobRef], now: TimeMs) -> Response {
        self.act(actor, jobs, Action::Hold, now)
    }

    pub(crate) fn release_jobs(&mut self, actor: &Actor, jobs: &[JobRef], now: TimeMs) -> Response {
        self.act(actor, jobs, Action::Release, now)
    }

    pub(crate) fn requeue_jobs(&mut self, actor: &Actor, jobs: &[JobRef], now: TimeMs) -> Response {
        self.act(actor, jobs, Action::Requeue, now)
    }

    /// The job `target` names, if `actor` may `verb` it: its owner, a coordinator of its
    /// account, or an administrator.
    fn permitted(
        &self,
        actor: &Actor,
        admin: bool,
        target: JobRef,
        verb: &str,
    ) -> Result<&Job, Rejection> {
        let head = self
            .jobs
            .get(&target.job)
            .ok_or_else(|| Rejection::unknown("job", target))?;
        if !admin && !self.may_act_on(actor, head) {
            return Err(Rejection::NotPermitted(format!(
                "{actor} cannot {verb} job {target} of user {}",
                head.spec.user
            )));
        }
        Ok(head)
    }

    /// The runs `scancel --signal` reaches for each reference, changing nothing: the job (or
    /// every started task of an array), if `actor` may act on it and it is running or
    /// suspended. Signals are not replicated: the leader sends them straight to the agents.
    pub fn signal_targets(
        &self,
        actor: &Actor,
        jobs: &[JobRef],
    ) -> Vec<Result<Vec<SignalTarget>, Rejection>> {
        let admin = self.is_admin(actor);
        jobs.iter()
            .map(|&target| {
                let head = self.permitted(actor, admin, target, "signal")?;
                let ids: Vec<JobId> = match self.locate(target, Action::Cancel)? {
                    Place::PendingTask(..) => Vec::new(),
                    Place::Record(id) if target.task.is_none() => {
                        let mut all = vec![id];
                        all.extend(self.live_tasks_of(id));
                        all
                    }
                    Place::Record(id) => vec![id],
                };
                let runs: Vec<SignalTarget> = ids
                    .iter()
                    .filter_map(|id| self.jobs.get(id))
                    .filter(|j| matches!(j.state, JobState::Running | JobState::Suspended))
                    .filter_map(|j| {
                        let alloc = j.alloc.as_ref()?;
                        Some(SignalTarget {
                            job: j.id,
                            node: alloc.shares.first()?.node.clone(),
                            epoch: alloc.epoch,
                        })
                    })
                    .collect();
                if runs.is_empty() {
                    return Err(Rejection::WrongState {
                        job: target.to_string(),
                        state: head.state.name().to_owned(),
                        action: "signal".into(),
                    });
                }
                Ok(runs)
            })
            .collect()
    }

    fn act(&mut self, actor: &Actor, jobs: &[JobRef], action: Action, now: TimeMs) -> Response {
        let mut results = Vec::with_capacity(jobs.len());
        let mut affected = Affected::default();
        for &target in jobs {
            let mut r = self.act_one(actor, target, action, now);
            // `scancel 123` on an array cancels its started tasks too.
            if r.is_ok() && matches!(action, Action::Cancel) && target.task.is_none() {
                for task in self.live_tasks_of(target.job) {
                    let t = JobRef {
                        job: task,
                        task: None,
                    };
                    match self.act_one(actor, t, action, now) {
                        Ok(()) => self.note_changed(task, &mut affected),
                        Err(e) => r = Err(e),
                    }
                }
            }
            if r.is_ok() {
                // A task acted on alone may have split off with an id of its own; its
                // owner and dependents are those of the array.
                self.note_changed(target.job, &mut affected);
            }
            results.push(r);
        }
        // Frees idle slots and running limits, and can satisfy or break dependencies.
        self.refresh_affected(affected, now);
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
        self.permitted(actor, admin, target, action.verb())?;
        // Validate against the record the action would change (for a pending task still in
        // its array, the array record), and only then split the task off.
        let place = self.locate(target, action)?;
        let probe = match place {
            Place::Record(id) | Place::PendingTask(id, _) => self
                .jobs
                .get(&id)
                .ok_or_else(|| Rejection::unknown("job", target))?,
        };
        check_action(probe, target, action, admin)?;
        if let (Action::Suspend, Place::Record(id)) = (action, place) {
            // Usage accrues up to the moment the job is frozen.
            self.accrue_usage(id, now);
        }
        if let (Action::Resume, Place::Record(id)) = (action, place) {
            self.check_resumable(id)?;
        }
        let id = match place {
            Place::Record(id) => id,
            Place::PendingTask(master, index) => self.split_task(master, index),
        };
        self.queue_index.touch(id);
        let Some(job) = self.jobs.get_mut(&id) else {
            return Err(Rejection::unknown("job", target));
        };
        match action {
            Action::Cancel => {
                if job.state == JobState::Pending {
                    stop_eligible_clock(job, now);
                    job.state = JobState::Cancelled;
                    job.end_time = Some(now);
                    job.end_cause = Some(EndCause::Cancelled);
                    let user = job.spec.user.clone();
                    self.index_ended(&user, id);
                } else {
                    // The agent thaws and kills it and reports; resources stay held until
                    // then. A suspended job's suspension ends here.
                    if let Some(since) = job.suspended_since.take() {
                        job.suspended_total += now.since(since);
                    }
                    job.state = JobState::Completing;
                    job.end_cause = Some(EndCause::Cancelled);
                }
            }
            Action::Requeue => {
                // Like a cancel of a running job, but it comes back: the agent kills it and
                // reports, and its end puts it back in the queue for a new run (new epoch).
                if let Some(since) = job.suspended_since.take() {
                    job.suspended_total += now.since(since);
                }
                job.state = JobState::Completing;
                job.end_cause = Some(EndCause::Requeued);
            }
            Action::Hold => job.hold = Some(if admin { Hold::Admin } else { Hold::User }),
            Action::Suspend => {
                job.state = JobState::Suspended;
                job.suspended_since = Some(now);
                self.mark_suspended(id, true);
            }
            Action::Resume => {
                job.state = JobState::Running;
                if let Some(since) = job.suspended_since.take() {
                    job.suspended_total += now.since(since);
                }
                job.usage_until = Some(now);
                job.preempted = None;
                self.mark_suspended(id, false);
            }
            Action::Release => {
                job.hold = None;
                // Released jobs are placed afresh (they compete for an idle slot).
                job.part = Part::Blocked;
            }
        }
        Ok(())
    }

    /// Live records of an array's split-off tasks (not the master record itself).
    fn live_tasks_of(&self, array_job: JobId) -> Vec<JobId> {
        self.relations
            .tasks_of(array_job)
            .filter(|id| *id != array_job)
            .filter(|id| {
                self.jobs
                    .get(id)
                    .is_some_and(|j| !j.state.is_terminal() && j.state != JobState::Completing)
            })
            .collect()
    }

    /// Where a job reference points, without changing anything.
    fn locate(&self, target: JobRef, action: Action) -> Result<Place, Rejection> {
        let Some(index) = target.task else {
            return Ok(Place::Record(target.job));
        };
        let head = self
            .jobs
            .get(&target.job)
            .ok_or_else(|| Rejection::unknown("job", target))?;
        match &head.array {
            Some(ArrayPart::Master { pending, .. }) if pending.contains(index) => {
                Ok(Place::PendingTask(target.job, index))
            }
            Some(ArrayPart::Task { index: i, .. }) if *i == index => Ok(Place::Record(target.job)),
            Some(_) => self
                .jobs
                .values()
                .find(|j| {
                    matches!(j.array, Some(ArrayPart::Task { array_job, index: i })
                        if array_job == target.job && i == index)
                })
                .map(|j| Place::Record(j.id))
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
            self.relations.add(head);
            return master;
        }
        let mut task = Box::new(head.clone());
        task.array = Some(ArrayPart::Task {
            array_job: master,
            index,
        });
        let id = JobId(self.next_job_id);
        self.next_job_id += 1;
        task.id = id;
        for blob in std::iter::once(task.spec.script).chain(task.spec.env) {
            self.retain_blob(&task.spec.user, blob);
        }
        self.index_live(&task);
        self.relations.add(&task);
        self.jobs.insert(id, task);
        self.queue_index.touch(id);
        id
    }
}

impl State {
    /// Records on a job's nodes whether its cpus are in use (running) or free for a
    /// preemptor (suspended); its memory and jobfs stay held either way.
    pub(crate) fn mark_suspended(&mut self, id: JobId, suspended: bool) {
        let Some(alloc) = self.jobs.get(&id).and_then(|j| j.alloc.as_ref()) else {
            return;
        };
        let nodes: Vec<crate::ids::NodeName> =
            alloc.shares.iter().map(|s| s.node.clone()).collect();
        let mut marked = false;
        for n in nodes {
            if let Some(u) = self
                .nodes
                .get_mut(&n)
                .and_then(|node| node.jobs.get_mut(&id))
            {
                u.suspended = suspended;
                marked = true;
            }
        }
        if suspended && marked {
            self.suspended_shares.insert(id);
        } else if !suspended {
            self.suspended_shares.remove(&id);
        }
    }

    /// A suspended job resumes only when its cpus are free again on every node it holds.
    pub(crate) fn check_resumable(&self, id: JobId) -> Result<(), Rejection> {
        let Some(alloc) = self.jobs.get(&id).and_then(|j| j.alloc.as_ref()) else {
            return Ok(());
        };
        for s in &alloc.shares {
            if let Some(node) = self.nodes.get(&s.node)
                && u64::from(node.used_cpus()) + u64::from(s.cpus) > u64::from(node.spec.cpus)
            {
                return Err(Rejection::Stale {
                    job: id.to_string(),
                    why: format!("its {} cpus on node {} are in use", s.cpus, s.node),
                });
            }
        }
        Ok(())
    }
}
