//! The main and direct passes: jobs in order of consideration, started where they fit now.
//!
//! A partition stops at the first job (in order) that cannot start for lack of resources:
//! later jobs there may not overtake it, which is what keeps the main pass from starving a
//! large job (backfill may still start them where that delays nobody). Jobs held back by a
//! limit on what their owner runs do not stop their partition, as in Slurm. The limits count
//! the starts this pass has already decided, so a plan never exceeds them.

use std::collections::BTreeSet;

use crate::command::StartDecision;
use crate::job::{ArrayPart, Job, JobRef, JobState, Part, Reason};
use crate::plan::{Budget, Continuation, Plan, Pool};
use crate::policy::{DepStatus, RunningSummary};
use crate::quantity::TimeMs;
use crate::state::State;

impl State {
    /// The main pass (`partition_job_depth`, stops a partition at its first blocked job).
    /// Pass the continuation of a pass the budget stopped to resume it.
    pub fn main_pass(
        &self,
        now: TimeMs,
        budget: &mut dyn Budget,
        resume: Option<Continuation>,
    ) -> Plan {
        self.run_main(now, budget, resume, None)
    }

    /// The direct pass run on submission: the main pass over at most
    /// `default_queue_depth` jobs (0 = all).
    pub fn direct_pass(&self, now: TimeMs, budget: &mut dyn Budget) -> Plan {
        let depth = self.config.sched.default_queue_depth;
        self.run_main(now, budget, None, (depth > 0).then_some(u64::from(depth)))
    }

    fn run_main(
        &self,
        now: TimeMs,
        budget: &mut dyn Budget,
        resume: Option<Continuation>,
        total: Option<u64>,
    ) -> Plan {
        let mut cont = resume.unwrap_or_else(|| Continuation {
            rest: self.consideration_order(now),
            ..Continuation::default()
        });
        let rest = std::mem::take(&mut cont.rest);
        let mut pass = Pass {
            state: self,
            now,
            pool: Pool::new(self),
            running: self.running_summary(now),
            soft_lifted: self.nothing_else_eligible(),
            plan: Plan::default(),
        };
        let per_partition = self.config.sched.partition_job_depth;
        for (k, &id) in rest.iter().enumerate() {
            if total.is_some_and(|t| cont.considered >= t) {
                break;
            }
            if budget.exhausted() {
                cont.rest = rest[k..].to_vec();
                pass.plan.continuation = Some(cont);
                return pass.plan;
            }
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            if job.state != JobState::Pending || job.part != Part::Idle {
                continue;
            }
            let partition = &job.resolved.partition;
            if cont.blocked.contains(partition) {
                continue;
            }
            let depth = cont.depth.entry(partition.clone()).or_default();
            if per_partition > 0 && *depth >= per_partition {
                continue;
            }
            *depth += 1;
            cont.considered += 1;
            if pass.try_start(job) == Outcome::NoResources {
                cont.blocked.insert(partition.clone());
            }
        }
        pass.plan
    }

    /// HPC2N's rule for the soft MAXPS limit: lifted only when no job is eligible otherwise.
    fn nothing_else_eligible(&self) -> bool {
        !self.jobs.values().any(|j| {
            j.state == JobState::Pending && j.part == Part::Idle && j.reason == Reason::None
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Started (for an array, at least one task; the rest stopped by a limit).
    Started,
    /// A limit on what the owner runs holds it back; its partition goes on.
    Limited,
    /// No nodes for it now: its partition stops.
    NoResources,
}

/// One pass's working state: what is free and what runs, with its own decisions counted.
struct Pass<'a> {
    state: &'a State,
    now: TimeMs,
    pool: Pool<'a>,
    running: RunningSummary,
    soft_lifted: bool,
    plan: Plan,
}

impl Pass<'_> {
    fn limited(&self, job: &Job) -> bool {
        match self.state.start_blocker(job, &self.running) {
            None => false,
            Some(Reason::MaxPsSoftLimit) => !self.soft_lifted,
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

    fn try_start(&mut self, job: &Job) -> Outcome {
        self.plan.considered += 1;
        if self.limited(job) {
            return Outcome::Limited;
        }
        let Some(ArrayPart::Master { pending, throttle }) = &job.array else {
            return match self.pool.place(job) {
                Some(nodes) => {
                    let target = JobRef {
                        job: job.id,
                        task: None,
                    };
                    self.record(job, target, nodes);
                    Outcome::Started
                }
                None => Outcome::NoResources,
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
            let Some(nodes) = self.pool.place(job) else {
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
