//! The backfill pass: jobs start out of order where that delays no job ahead of them.
//!
//! Jobs are taken in order of consideration. One that fits now (for its whole time limit,
//! around every reservation made so far) starts. One that does not gets a reservation: the
//! earliest instant, within `bf_window` and rounded up to `bf_resolution`, at which nodes
//! come free for its whole time limit; from then on those nodes are taken in the profile, so
//! no later job can be placed on them in a way that would push it back. EASY reserves for the
//! first such job of each partition only; conservative for every one (up to
//! `reservation_depth`). Jobs count against `bf_max_job_test` and the per-user and
//! per-partition caps whether they start or not, as in Slurm.
//!
//! Time limits are the only estimates: a job that ends early frees its nodes early, which
//! can only make reserved jobs start sooner.

use crate::config::BackfillMode;
use crate::job::{JobRef, JobState, Part};
use crate::plan::pass::{Outcome, Pass};
use crate::plan::{Budget, Continuation, Plan};
use crate::quantity::TimeMs;
use crate::state::State;

impl State {
    /// One backfill pass; pass the continuation of a pass the budget stopped to resume it
    /// (`bf_continue`). With backfill off, plans nothing.
    pub fn backfill_pass(
        &self,
        now: TimeMs,
        budget: &mut dyn Budget,
        resume: Option<Continuation>,
    ) -> Plan {
        let params = &self.config.sched;
        if params.backfill == BackfillMode::Off {
            return Plan::default();
        }
        let mut cont = resume.unwrap_or_else(|| Continuation {
            rest: self.consideration_order(now),
            ..Continuation::default()
        });
        let rest = std::mem::take(&mut cont.rest);
        let mut pass = Pass::new(self, now);
        // Reservations from before a yield still bind, where their jobs still wait.
        cont.reservations.retain(|(target, placement)| {
            self.jobs
                .get(&target.job)
                .is_some_and(|j| j.state == JobState::Pending && j.part == Part::Idle)
                && pass.pool.hold(&self.jobs[&target.job], placement)
        });
        let horizon = now.plus(params.bf_window);
        let mut waiting_ahead: Vec<crate::ids::JobId> = Vec::new();
        for (k, &id) in rest.iter().enumerate() {
            if params.bf_max_job_test > 0 && cont.considered >= u64::from(params.bf_max_job_test) {
                break;
            }
            if budget.exhausted() {
                cont.rest = rest[k..].to_vec();
                pass.plan.reservations = cont.reservations.clone();
                pass.plan.continuation = Some(cont);
                return pass.plan;
            }
            let Some(job) = self.waiting(id) else {
                continue;
            };
            let partition = &job.resolved.partition;
            let in_partition = cont.depth.get(partition).copied().unwrap_or(0);
            if params.bf_max_job_part > 0 && in_partition >= params.bf_max_job_part {
                continue;
            }
            let of_user = cont.per_user.get(&job.spec.user).copied().unwrap_or(0);
            if params.bf_max_job_user > 0 && of_user >= params.bf_max_job_user {
                continue;
            }
            cont.depth.insert(partition.clone(), in_partition + 1);
            cont.per_user.insert(job.spec.user.clone(), of_user + 1);
            cont.considered += 1;
            match pass.try_start(job) {
                Outcome::Started => {
                    // Every job ahead of it that could not start has been bypassed (Maui's
                    // bypass count; NCI: bypassed jobs gain score so none starves).
                    pass.plan.bypassed.extend(waiting_ahead.iter().copied());
                    waiting_ahead.clear();
                    continue;
                }
                Outcome::Limited => continue,
                Outcome::NoResources => {
                    pass.note_reason(job, crate::job::Reason::Resources);
                    waiting_ahead.push(id);
                }
            }
            let may_reserve = match params.backfill {
                BackfillMode::Off => false,
                BackfillMode::Easy => !cont.blocked.contains(partition),
                BackfillMode::Conservative => {
                    params.reservation_depth == 0
                        || cont.reservations.len() < params.reservation_depth as usize
                }
            };
            if !may_reserve {
                continue;
            }
            cont.blocked.insert(partition.clone());
            let target = match &job.array {
                Some(crate::job::ArrayPart::Master { pending, .. }) => JobRef {
                    job: id,
                    task: pending.first(),
                },
                _ => JobRef {
                    job: id,
                    task: None,
                },
            };
            if let Some(placement) =
                pass.pool
                    .reserve(job, job.resolved.time_limit, params.bf_resolution, horizon)
            {
                cont.reservations.push((target, placement));
            }
        }
        pass.plan.reservations = cont.reservations;
        pass.plan.bypassed.sort_unstable();
        pass.plan.bypassed.dedup();
        pass.plan
    }
}
