//! Creating, ending and cancelling job steps.
//!
//! Only the job's owner (and root, and the controller) creates steps in it, and only while
//! it runs: a suspended job's steps wait like busy ones. The placement is decided here, at
//! apply, against the steps the log has at this point, so two `srun`s racing for the same
//! cpus can never both get them. A step ends when every node of its layout has reported
//! (each node's agent speaks for its own tasks only), and with its job: whatever ends a job
//! ends its live steps.

use crate::apply::{Rejection, Response};
use crate::command::{Actor, StepEndReport};
use crate::ids::JobId;
use crate::job::step::{
    IO_KEY_BYTES, MAX_RUNNING_STEPS, MAX_STEP_NAME_BYTES, MAX_STEPS_PER_JOB, NodeEnd, Placement,
    Step, place,
};
use crate::job::{JobState, StepId, StepRef, StepSpec};
use crate::quantity::TimeMs;
use crate::state::State;

/// The most nodes a step may name in `--nodelist` (no allocation is larger than the cluster,
/// and the list is checked against the allocation one by one).
const MAX_STEP_NODELIST: usize = 65_536;

impl State {
    pub(crate) fn create_step(
        &mut self,
        actor: &Actor,
        id: JobId,
        spec: &StepSpec,
        now: TimeMs,
    ) -> Result<Response, Rejection> {
        check_spec(spec)?;
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| Rejection::unknown("job", id))?;
        let owner = match actor {
            Actor::User(u) => u == &job.spec.user,
            Actor::Operator | Actor::Controller => true,
            Actor::Node(_) => false,
        };
        if !owner {
            return Err(Rejection::NotPermitted(format!(
                "{actor} cannot create a step in job {id} of user {}: only its owner (and \
                 root) may",
                job.spec.user
            )));
        }
        let busy = |why: String| Rejection::Busy {
            job: id.to_string(),
            why,
        };
        match job.state {
            JobState::Running => {}
            JobState::Suspended => return Err(busy("the job is suspended".into())),
            other => {
                return Err(Rejection::WrongState {
                    job: id.to_string(),
                    state: other.name().to_owned(),
                    action: "create a step".into(),
                });
            }
        }
        if job.steps.next >= MAX_STEPS_PER_JOB {
            return Err(Rejection::too_large(
                "steps of the job",
                u64::from(job.steps.next) + 1,
                u64::from(MAX_STEPS_PER_JOB),
            ));
        }
        if job.steps.live().count() >= MAX_RUNNING_STEPS {
            return Err(busy(format!(
                "{MAX_RUNNING_STEPS} steps are running, the most one job may run at once"
            )));
        }
        let Some(alloc) = &job.alloc else {
            return Err(Rejection::WrongState {
                job: id.to_string(),
                state: "without an allocation".into(),
                action: "create a step".into(),
            });
        };
        let layout = match place(alloc, &|n| job.steps.held_cpus(n), spec) {
            Placement::Placed(layout) => layout,
            Placement::Busy(why) => return Err(busy(why)),
            Placement::Never { field, why } => return Err(Rejection::invalid(field, why)),
        };
        // Accepted: nothing below can fail.
        let Some(job) = self.jobs.get_mut(&id) else {
            return Err(Rejection::unknown("job", id));
        };
        let step = StepId(job.steps.next);
        job.steps.next += 1;
        job.steps.list.insert(
            step,
            Step {
                id: step,
                name: spec.name.clone(),
                layout: layout.clone(),
                cpus_per_task: spec.cpus_per_task,
                overlap: spec.overlap,
                time_limit: spec.time_limit,
                io_key: spec.io_key.clone(),
                state: JobState::Running,
                start_time: now,
                end_time: None,
                cancelled: false,
                ends: Default::default(),
                exit: None,
            },
        );
        Ok(Response::StepCreated { step, layout })
    }

    /// Agents' reports of a step's tasks ending on their node. A report from an older run
    /// of the job, on a step already ended, or repeating a node's report is stale; one a
    /// node's agent makes for another node, or for a node outside the step, is refused.
    pub(crate) fn end_steps(
        &mut self,
        actor: &Actor,
        reports: &[StepEndReport],
        now: TimeMs,
    ) -> Response {
        let (mut applied, mut stale, mut refused) = (0, 0, 0);
        for r in reports {
            if let Actor::Node(node) = actor
                && node != &r.node
            {
                refused += 1;
                continue;
            }
            let Some(job) = self.jobs.get_mut(&r.step.job) else {
                stale += 1;
                continue;
            };
            let current = job.state.holds_resources()
                && job.alloc.as_ref().is_some_and(|a| a.epoch == r.epoch);
            let Some(step) = job.steps.list.get_mut(&r.step.step) else {
                stale += 1;
                continue;
            };
            if step.on_node(&r.node).is_none() {
                refused += 1;
                continue;
            }
            if !current || !step.is_live() || step.ends.contains_key(&r.node) {
                stale += 1;
                continue;
            }
            step.ends.insert(
                r.node.clone(),
                NodeEnd {
                    cause: r.cause,
                    exit: r.exit,
                },
            );
            if step.ends.len() == step.layout.len() {
                let (state, exit) = step.conclusion();
                step.state = state;
                step.exit = Some(exit);
                step.end_time = Some(now);
            }
            applied += 1;
        }
        Response::Ended {
            applied,
            stale,
            refused,
        }
    }

    /// `scancel JOBID.STEP`: the step's agents are told to kill its tasks; it ends as
    /// cancelled when they report. Who may cancel a job may cancel its steps.
    pub(crate) fn cancel_steps(
        &mut self,
        actor: &Actor,
        steps: &[StepRef],
        _now: TimeMs,
    ) -> Response {
        let results = steps
            .iter()
            .map(|&r| {
                let job = self
                    .jobs
                    .get(&r.job)
                    .ok_or_else(|| Rejection::unknown("job", r.job))?;
                if !self.may_act_on(actor, job) {
                    return Err(Rejection::NotPermitted(format!(
                        "{actor} cannot cancel step {r} of user {}",
                        job.spec.user
                    )));
                }
                let step = job
                    .steps
                    .list
                    .get(&r.step)
                    .ok_or_else(|| Rejection::unknown("step", r))?;
                if !step.is_live() {
                    return Err(Rejection::WrongState {
                        job: r.to_string(),
                        state: step.state.name().to_owned(),
                        action: "cancel".into(),
                    });
                }
                if let Some(step) = self
                    .jobs
                    .get_mut(&r.job)
                    .and_then(|j| j.steps.list.get_mut(&r.step))
                {
                    step.cancelled = true;
                    step.state = JobState::Completing;
                }
                Ok(())
            })
            .collect();
        Response::PerJob(results)
    }

    /// Ends every live step of a job whose run is over: with the job's node failure as
    /// node failures, otherwise as cancelled (Slurm's steps of a timed-out job read
    /// CANCELLED). Their agents kill what is left with the job's cgroup.
    pub(crate) fn end_live_steps(&mut self, id: JobId, node_failed: bool, now: TimeMs) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let state = if node_failed {
            JobState::NodeFail
        } else {
            JobState::Cancelled
        };
        for step in job.steps.list.values_mut().filter(|s| s.is_live()) {
            let (_, exit) = step.conclusion();
            step.state = state;
            step.exit = Some(exit);
            step.end_time = Some(now);
        }
    }
}

/// Bounds on what a step may ask, checked before anything else.
fn check_spec(spec: &StepSpec) -> Result<(), Rejection> {
    if spec.name.len() > MAX_STEP_NAME_BYTES {
        return Err(Rejection::too_large(
            "step name length",
            spec.name.len() as u64,
            MAX_STEP_NAME_BYTES as u64,
        ));
    }
    if spec.name.chars().any(char::is_control) {
        return Err(Rejection::invalid(
            "step name",
            "contains a control character",
        ));
    }
    if spec.cpus_per_task == 0 {
        return Err(Rejection::invalid("cpus_per_task", "must be at least 1"));
    }
    if spec.io_key.len() != IO_KEY_BYTES {
        return Err(Rejection::invalid(
            "io_key",
            format!(
                "is {} bytes; a step's I/O key is a SHA-256 hash of {IO_KEY_BYTES} bytes",
                spec.io_key.len()
            ),
        ));
    }
    if let Some(limit) = spec.time_limit
        && limit > crate::job::step::MAX_STEP_TIME_LIMIT
    {
        return Err(Rejection::too_large(
            "time_limit",
            limit.0,
            crate::job::step::MAX_STEP_TIME_LIMIT.0,
        ));
    }
    if spec.nodelist.len() > MAX_STEP_NODELIST {
        return Err(Rejection::too_large(
            "nodelist",
            spec.nodelist.len() as u64,
            MAX_STEP_NODELIST as u64,
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = spec.nodelist.iter().find(|n| !seen.insert(*n)) {
        return Err(Rejection::invalid(
            "nodelist",
            format!("node {twice} is named twice"),
        ));
    }
    Ok(())
}
