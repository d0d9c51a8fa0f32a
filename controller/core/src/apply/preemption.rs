//! Applying a preemption: check the preemptor, every victim and its mode, then suspend and
//! start (suspend mode) or mark the victims for killing (requeue and cancel modes). Nothing
//! changes unless all of it holds.

use crate::apply::{PreemptOutcome, Rejection, Response};
use crate::command::{EndCause, PreemptDecision};
use crate::job::{JobState, Preemption};
use crate::partition::PreemptMode;
use crate::policy::Affected;
use crate::quantity::TimeMs;
use crate::state::State;

impl State {
    pub(crate) fn preempt(&mut self, decisions: &[PreemptDecision], now: TimeMs) -> Response {
        let mut results = Vec::with_capacity(decisions.len());
        let mut affected = Affected::default();
        for d in decisions {
            let r = self.preempt_one(d, now);
            if r.is_ok() {
                self.note_changed(d.start.job.job, &mut affected);
                for v in &d.victims {
                    self.note_changed(*v, &mut affected);
                }
            }
            results.push(r);
        }
        self.refresh_affected(affected, now);
        Response::Preempted(results)
    }

    fn preempt_one(
        &mut self,
        d: &PreemptDecision,
        now: TimeMs,
    ) -> Result<PreemptOutcome, Rejection> {
        let preemptor_id = d.start.job.job;
        let preemptor = self
            .jobs
            .get(&preemptor_id)
            .ok_or_else(|| Rejection::unknown("job", preemptor_id))?;
        if d.victims.is_empty() {
            return Err(Rejection::invalid(
                "victims",
                "a preemption names no victim",
            ));
        }
        let mut modes = Vec::with_capacity(d.victims.len());
        for v in &d.victims {
            let victim = self
                .jobs
                .get(v)
                .ok_or_else(|| Rejection::unknown("job", v))?;
            let mode =
                self.preempt_mode(preemptor, victim, now)
                    .ok_or_else(|| Rejection::Stale {
                        job: v.to_string(),
                        why: format!("job {preemptor_id} may not preempt it (now)"),
                    })?;
            modes.push((*v, mode));
        }
        let suspend_all = modes.iter().all(|(_, m)| *m == PreemptMode::Suspend);
        // Their state and shares change (or are put back): the derived indexes learn it.
        for (v, _) in &modes {
            self.queue_index.touch(*v);
        }
        if suspend_all {
            // Free the victims' cpus, try the start, and undo if it does not hold.
            for (v, _) in &modes {
                self.mark_suspended(*v, true);
            }
            let running = self.running_summary(now);
            match self.start_one(&d.start, &running, now) {
                Ok(started) => {
                    for (v, mode) in &modes {
                        self.accrue_usage(*v, now);
                        if let Some(job) = self.jobs.get_mut(v) {
                            job.state = JobState::Suspended;
                            job.suspended_since = Some(now);
                            job.preempted = Some(Preemption {
                                by: started,
                                mode: *mode,
                            });
                        }
                    }
                    Ok(PreemptOutcome::Started(started))
                }
                Err(e) => {
                    for (v, _) in &modes {
                        self.mark_suspended(*v, false);
                    }
                    Err(e)
                }
            }
        } else {
            // Kill modes: the victims' agents kill them; the preemptor waits for the nodes.
            for (v, mode) in &modes {
                if let Some(job) = self.jobs.get_mut(v) {
                    job.state = JobState::Completing;
                    job.end_cause = Some(EndCause::Preempted);
                    job.preempted = Some(Preemption {
                        by: preemptor_id,
                        mode: *mode,
                    });
                }
            }
            Ok(PreemptOutcome::Freeing)
        }
    }
}
