//! One pass's working state, shared by the main and backfill passes: the availability
//! profile, what runs (with the pass's own starts counted, so limits hold within a plan),
//! and the decisions so far.

use std::collections::BTreeSet;

use crate::command::StartDecision;
use crate::job::{ArrayPart, Job, JobRef, Reason};
use crate::plan::pool::Horizon;
use crate::plan::{Plan, Pool};
use crate::policy::{DepStatus, RunningSummary};
use crate::quantity::TimeMs;
use crate::state::State;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Started (for an array, at least one task; the rest stopped by a limit).
    Started,
    /// A limit on what the owner runs holds it back; its partition goes on.
    Limited,
    /// No nodes for it now: its partition stops.
    NoResources,
}

/// One pass's working state: what is free and what runs, with its own decisions counted.
pub(crate) struct Pass<'a> {
    /// Jobs this pass already chose as victims.
    pub(crate) victims: std::collections::BTreeSet<crate::ids::JobId>,
    pub(crate) state: &'a State,
    pub(crate) now: TimeMs,
    pub(crate) pool: Pool<'a>,
    pub(crate) running: RunningSummary,
    /// HPC2N's soft MAXPS is lifted only when nothing else is eligible; found out (a scan
    /// of the queue) only if a job meets that limit.
    soft_lifted: std::cell::OnceCell<bool>,
    /// Whether the configuration can preempt at all ([`State::preemption_configured`]),
    /// asked once: a job that finds no room looks for victims only then.
    pub(crate) preempts: bool,
    pub(crate) plan: Plan,
}

impl<'a> Pass<'a> {
    pub(crate) fn new(state: &'a State, now: TimeMs, horizon: Horizon) -> Pass<'a> {
        Pass {
            victims: std::collections::BTreeSet::new(),
            state,
            now,
            pool: Pool::new(state, now, horizon),
            running: state.running_summary(now),
            soft_lifted: std::cell::OnceCell::new(),
            preempts: state.preemption_configured(),
            plan: Plan::default(),
        }
    }

    /// Records why a waiting job did not start, if that is news.
    pub(crate) fn note_reason(&mut self, job: &Job, reason: Reason) {
        if job.reason != reason && job.reason.is_eligible() {
            self.plan.reasons.push((job.id, reason));
        }
    }

    pub(crate) fn limited(&self, job: &Job) -> bool {
        match self.state.start_blocker(job, &self.running) {
            None => false,
            Some(Reason::MaxPsSoftLimit) => !*self
                .soft_lifted
                .get_or_init(|| self.state.nothing_else_eligible()),
            Some(_) => true,
        }
    }

    fn record(&mut self, job: &Job, target: JobRef, nodes: Vec<crate::ids::NodeName>) {
        self.plan.starts.push(StartDecision { job: target, nodes });
        self.running.add_job(job, &self.state.accounts, self.now);
        if target.task.is_some() {
            self.running.note_task_start(job.id);
        }
    }

    pub(crate) fn try_start(&mut self, job: &Job) -> Outcome {
        self.plan.considered += 1;
        if self.limited(job) {
            return Outcome::Limited;
        }
        let Some(ArrayPart::Master { pending, throttle }) = &job.array else {
            // Turned away before its run time is worked out and `place` is called, as
            // `place` would turn it away: most jobs a backfill pass walks on a busy machine
            // ask for more cpus than are free (the calls were 2% of a 100,000-job replay).
            let placed = if self.pool.too_big_now(job) {
                None
            } else {
                self.pool.place(job, job.expected_runtime(self.now))
            };
            return match placed {
                Some(nodes) => {
                    let target = JobRef {
                        job: job.id,
                        task: None,
                    };
                    self.record(job, target, nodes);
                    Outcome::Started
                }
                None if !self.preempts => Outcome::NoResources,
                None => {
                    let mut taken = std::mem::take(&mut self.victims);
                    let preempted = self.try_preempt(job, &mut taken);
                    self.victims = taken;
                    if preempted {
                        Outcome::Started
                    } else {
                        Outcome::NoResources
                    }
                }
            };
        };
        // An array: its pending tasks one by one, while the throttle, limits and nodes allow.
        let mut started: BTreeSet<u32> = BTreeSet::new();
        for index in pending.iter() {
            if let Some(t) = throttle
                && self.running.array_running(job.id) >= *t
            {
                break;
            }
            if !started.is_empty() && self.limited(job) {
                break;
            }
            if self.state.dependency_status(job, Some(index), self.now) != DepStatus::Satisfied {
                continue; // aftercorr: this task's partner has not finished well
            }
            let Some(nodes) = self.pool.place(job, job.expected_runtime(self.now)) else {
                return if started.is_empty() {
                    Outcome::NoResources
                } else {
                    Outcome::Started
                };
            };
            started.insert(index);
            let target = JobRef {
                job: job.id,
                task: Some(index),
            };
            self.record(job, target, nodes);
        }
        if started.is_empty() {
            Outcome::Limited
        } else {
            Outcome::Started
        }
    }
}
