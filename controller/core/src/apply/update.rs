//! Changing a job after submission (`scontrol update job=ID TimeLimit=... Name=... Nice=...
//! Comment=...`).
//!
//! Slurm's rules: the owner (or a coordinator of its account) may lower a job's time limit,
//! rename it, and raise its nice value (lowering its own priority); only an administrator may
//! raise a time limit, make it unlimited, or set a negative nice. A time limit is still capped
//! by the partition's MaxTime, the QOS's MaxWall and the site's maximum walltime, for anyone.
//! Pending, running and suspended jobs take a new time limit (the leader tells a running
//! job's agent); only pending jobs change name and nice; any of them its comment. Each job is accepted or refused on
//! its own and a refusal changes nothing for that job.

use serde::{Deserialize, Serialize};
use smol_str::SmolStr;

use crate::apply::submit::{check_comment, check_text};
use crate::apply::{Rejection, Response};
use crate::command::Actor;
use crate::job::spec::TimeRequest;
use crate::job::{Job, JobRef, JobState};
use crate::policy::Affected;
use crate::quantity::{Seconds, TimeMs};
use crate::state::State;

/// The changes asked; `None` leaves a field alone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUpdate {
    pub time_limit: Option<TimeRequest>,
    pub name: Option<SmolStr>,
    pub nice: Option<i32>,
    /// A new comment; empty clears it. Any live job, by its owner.
    #[serde(
        deserialize_with = "crate::layout::since_v2",
        skip_serializing_if = "crate::layout::before_v2",
        default
    )]
    pub comment: Option<SmolStr>,
}

/// Longest job name.
const MAX_NAME: usize = 256;
/// Slurm's nice range.
const NICE_RANGE: std::ops::RangeInclusive<i32> = -2_147_483_645..=2_147_483_645;

impl State {
    pub(crate) fn update_jobs(
        &mut self,
        actor: &Actor,
        jobs: &[JobRef],
        update: &JobUpdate,
        now: TimeMs,
    ) -> Response {
        let mut affected = Affected::default();
        let results = jobs
            .iter()
            .map(|target| {
                // Before a rename too: singletons of the old name may be released.
                let mut before = Affected::default();
                self.note_changed(target.job, &mut before);
                let r = self.update_one(actor, *target, update);
                // Its limit or nice value, and so its key, may have changed.
                self.queue_index.touch(target.job);
                if r.is_ok() {
                    affected.merge(before);
                    self.note_changed(target.job, &mut affected);
                }
                r
            })
            .collect();
        self.refresh_affected(affected, now);
        Response::PerJob(results)
    }

    fn update_one(
        &mut self,
        actor: &Actor,
        target: JobRef,
        update: &JobUpdate,
    ) -> Result<(), Rejection> {
        if target.task.is_some() {
            return Err(Rejection::invalid(
                "job",
                format!("{target}: update the array {} as a whole", target.job),
            ));
        }
        let admin = self.is_admin(actor);
        let job = self
            .jobs
            .get(&target.job)
            .ok_or_else(|| Rejection::unknown("job", target))?;
        if !admin && !self.may_act_on(actor, job) {
            return Err(Rejection::NotPermitted(format!(
                "{actor} cannot update job {target} of user {}",
                job.spec.user
            )));
        }
        check_updatable(job, target, update)?;
        let new_limit = requested_limit(update.time_limit)?;
        if let Some(limit) = new_limit {
            self.check_new_limit(job, limit, admin)?;
        }
        if let Some(name) = &update.name {
            self.check_new_name(name)?;
        }
        if let Some(comment) = &update.comment {
            check_comment(comment)?;
        }
        if let Some(nice) = update.nice {
            check_nice(nice, admin)?;
        }
        // Checked: apply.
        let job = self
            .jobs
            .get_mut(&target.job)
            .ok_or_else(|| Rejection::unknown("job", target))?;
        if let Some(limit) = new_limit {
            job.resolved.time_limit = limit;
            job.spec.time = match limit {
                Some(t) => TimeRequest::Limit(t),
                None => TimeRequest::Unlimited,
            };
        }
        if let Some(name) = &update.name {
            // The singleton index is keyed by name.
            self.relations.remove(job);
            job.spec.name = name.clone();
            self.relations.add(job);
        }
        if let Some(nice) = update.nice {
            job.spec.nice = nice;
        }
        if let Some(comment) = &update.comment {
            job.spec.comment = Some(comment.clone()).filter(|c| !c.is_empty());
        }
        Ok(())
    }

    /// A new time limit (`None`: unlimited) is within the partition's, the QOS's and the
    /// site's caps, raised only by an administrator, and not below what a running job has
    /// already run.
    fn check_new_limit(
        &self,
        job: &Job,
        limit: Option<Seconds>,
        admin: bool,
    ) -> Result<(), Rejection> {
        let raising = match (limit, job.resolved.time_limit) {
            (None, None) => false,
            (None, Some(_)) => true,
            (Some(_), None) => false,
            (Some(new), Some(old)) => new > old,
        };
        if raising && !admin {
            return Err(Rejection::NotPermitted(
                "only an administrator may raise a time limit".into(),
            ));
        }
        let partition = self.partitions.get(&job.resolved.partition);
        let qos = self.qos.get(&job.resolved.qos);
        let caps = [
            (
                "time_limit (partition MaxTime)",
                partition.and_then(|p| p.max_time),
            ),
            (
                "time_limit (QOS MaxWall)",
                qos.and_then(|q| q.limits.max_wall),
            ),
            (
                "time_limit (site maximum walltime)",
                self.config.max_walltime,
            ),
        ];
        for (field, cap) in caps {
            match (limit, cap) {
                (Some(t), Some(cap)) if t > cap => {
                    return Err(Rejection::too_large(field, t.0, cap.0));
                }
                (None, Some(cap)) => {
                    return Err(Rejection::too_large(field, u64::MAX, cap.0));
                }
                _ => {}
            }
        }
        if let Some(t) = limit
            && job.state != JobState::Pending
        {
            // A running job cannot be given less than it has already run.
            let ran = job.run_time(self.applied.now);
            if t < ran {
                return Err(Rejection::invalid(
                    "time_limit",
                    format!("{} s is less than the {} s the job has run", t.0, ran.0),
                ));
            }
        }
        Ok(())
    }

    /// A new name follows the rule of the entry's command version.
    fn check_new_name(&self, name: &str) -> Result<(), Rejection> {
        if name.is_empty() {
            return Err(Rejection::invalid("name", "must not be empty"));
        }
        if self.applying_version >= 4 {
            check_text("name", name, MAX_NAME)?;
        } else if name.len() > MAX_NAME || name.contains('\0') {
            // Version 3's rule, for entries logged before it changed.
            return Err(Rejection::invalid(
                "name",
                format!("must be 1 to {MAX_NAME} bytes without NUL"),
            ));
        }
        Ok(())
    }
}

/// The job is live, and only a pending one may change its name or nice.
fn check_updatable(job: &Job, target: JobRef, update: &JobUpdate) -> Result<(), Rejection> {
    let pending = job.state == JobState::Pending;
    let live = pending || matches!(job.state, JobState::Running | JobState::Suspended);
    if !live {
        return Err(Rejection::WrongState {
            job: target.to_string(),
            state: job.state.name().to_owned(),
            action: "update".into(),
        });
    }
    if !pending && (update.name.is_some() || update.nice.is_some()) {
        return Err(Rejection::WrongState {
            job: target.to_string(),
            state: job.state.name().to_owned(),
            action: "change the name or nice of (only pending jobs)".into(),
        });
    }
    Ok(())
}

/// The time limit asked for: none (unchanged), a limit, or `Some(None)` for unlimited.
fn requested_limit(asked: Option<TimeRequest>) -> Result<Option<Option<Seconds>>, Rejection> {
    match asked {
        None => Ok(None),
        Some(TimeRequest::Default) => Err(Rejection::invalid(
            "time_limit",
            "give a limit, or Unlimited (administrators)",
        )),
        Some(TimeRequest::Limit(t)) if t.0 == 0 => Err(Rejection::invalid(
            "time_limit",
            "a limit of 0 s; use Unlimited",
        )),
        Some(TimeRequest::Limit(t)) => Ok(Some(Some(t))),
        Some(TimeRequest::Unlimited) => Ok(Some(None)),
    }
}

/// A nice value within range; negative ones (a higher priority) for administrators only.
fn check_nice(nice: i32, admin: bool) -> Result<(), Rejection> {
    if !NICE_RANGE.contains(&nice) {
        return Err(Rejection::invalid(
            "nice",
            format!(
                "{nice} is outside {}..={}",
                NICE_RANGE.start(),
                NICE_RANGE.end()
            ),
        ));
    }
    if nice < 0 && !admin {
        return Err(Rejection::NotPermitted(
            "only an administrator may set a negative nice".into(),
        ));
    }
    Ok(())
}
