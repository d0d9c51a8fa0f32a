//! Applying commands: the only way replicated state changes.
//!
//! `apply` is deterministic: it reads nothing but the state, the command and the context
//! (log index and the leader's time), so every replica ends in the same state. A rejected
//! command or rejected item changes nothing: each handler validates before it mutates.

mod admin;
pub mod authority;
pub mod charging;
mod control;
pub use control::SignalTarget;
mod lifecycle;
mod preemption;
pub mod purge;
mod resolve;
mod steps;
pub(crate) mod submit;
pub use submit::MAX_NAME_BYTES;
pub mod update;

use serde::{Deserialize, Serialize};

use crate::command::{Actor, COMMAND_VERSION, Command, Envelope};
use crate::ids::JobId;
use crate::quantity::TimeMs;
use crate::state::State;

/// What apply knows besides the state: where in the log this command sits, and the time the
/// leader stamped on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplyCtx {
    pub index: u64,
    pub time_ms: TimeMs,
}

/// What a successfully applied command answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Done,
    /// One result per submitted job, in order.
    Submitted(Vec<Result<JobId, Rejection>>),
    /// One result per job named (cancel, hold, release).
    PerJob(Vec<Result<(), Rejection>>),
    /// One result per start decision: the id of the job that started (a new id for an array
    /// task split off its master).
    Started(Vec<Result<JobId, Rejection>>),
    /// One result per preemption: the preemptor started, or its victims are being killed.
    Preempted(Vec<Result<PreemptOutcome, Rejection>>),
    /// How many end reports took effect; stale ones are ignored, and reports a node's agent
    /// made on another node's runs are refused.
    Ended {
        applied: u32,
        stale: u32,
        refused: u32,
    },
    /// The step `CreateStep` made and where its tasks go.
    StepCreated {
        step: crate::job::StepId,
        layout: Vec<crate::job::step::StepShare>,
    },
}

/// What one preemption did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PreemptOutcome {
    /// The victims are suspended and the job started (its id).
    Started(JobId),
    /// The victims are being killed; the job starts once their nodes are free.
    Freeing,
}

/// Why a command, or one item of it, was refused. The message names the field and the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Rejection {
    #[error(
        "command version {found} is newer than version {supported} that this replica applies; \
         upgrade every replica first"
    )]
    UnsupportedVersion { found: u16, supported: u16 },
    #[error("log index {index} is not after the last applied index {last}")]
    AlreadyApplied { index: u64, last: u64 },
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
    #[error("{field} = {value} exceeds the limit of {limit}")]
    TooLarge {
        field: String,
        value: u64,
        limit: u64,
    },
    #[error("unknown {kind} {name:?}")]
    Unknown { kind: String, name: String },
    #[error("{kind} {name} is in use: {why}")]
    InUse {
        kind: String,
        name: String,
        why: String,
    },
    #[error("not permitted: {0}")]
    NotPermitted(String),
    #[error("job {job} is {state}; cannot {action}")]
    WrongState {
        job: String,
        state: String,
        action: String,
    },
    #[error("stale decision for job {job}: {why}")]
    Stale { job: String, why: String },
    /// A step that fits in its job's allocation but not beside the steps running now:
    /// `srun` waits and retries (or, with `--immediate`, gives up).
    #[error("job {job}: step creation temporarily disabled ({why})")]
    Busy { job: String, why: String },
}

impl Rejection {
    pub(crate) fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Rejection {
        Rejection::Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }

    pub(crate) fn too_large(field: impl Into<String>, value: u64, limit: u64) -> Rejection {
        Rejection::TooLarge {
            field: field.into(),
            value,
            limit,
        }
    }

    pub(crate) fn unknown(kind: &str, name: impl ToString) -> Rejection {
        Rejection::Unknown {
            kind: kind.to_owned(),
            name: name.to_string(),
        }
    }
}

impl State {
    /// Applies one command. On `Err` nothing changed but the log position (and the time
    /// seen); per-item rejections inside an `Ok` response changed nothing for those items.
    /// The command is consumed: what it brings (a submission's specs and scripts) moves into
    /// the state rather than being copied.
    pub fn apply(&mut self, envelope: Envelope, ctx: ApplyCtx) -> Result<Response, Rejection> {
        if ctx.index <= self.applied.index {
            return Err(Rejection::AlreadyApplied {
                index: ctx.index,
                last: self.applied.index,
            });
        }
        // Every entry advances the log position, even one whose command is rejected: the
        // entry was committed and applied; its answer is the rejection.
        self.applied.index = ctx.index;
        self.applied.now = self.applied.now.max(ctx.time_ms);
        let now = self.applied.now;
        if envelope.version > COMMAND_VERSION {
            return Err(Rejection::UnsupportedVersion {
                found: envelope.version,
                supported: COMMAND_VERSION,
            });
        }
        // What changed meaning between versions follows the entry's own version, so an entry
        // an older build logged applies the same on every replica whichever build applies it.
        self.applying_version = envelope.version;
        let Envelope { actor, command, .. } = envelope;
        self.authorize(&actor, &command)?;
        // Administrators' commands are those that change the site (configuration, nodes,
        // partitions, QOS, reservations, accounts, users): what the index derives from
        // besides the jobs.
        let changes_the_site = authority::needed(&command) == authority::Authority::Admin;
        let response = self.execute(&actor, command, now);
        if changes_the_site {
            // The rebuilt index drops the jobs this command marked, so the tick's index of
            // clocked jobs, which learns from those marks, is rebuilt too.
            self.queue_index = self.compute_queue_index();
            self.clocked = self.compute_clocked();
            self.returns = self.compute_returns();
        } else {
            self.sync_returns();
            self.sync_queue_index(now);
        }
        response
    }

    fn execute(
        &mut self,
        actor: &Actor,
        command: Command,
        now: TimeMs,
    ) -> Result<Response, Rejection> {
        match command {
            Command::SetConfig(c) => self.set_config(&c),
            Command::UpsertNode(spec) => self.upsert_node(&spec),
            Command::RemoveNode(name) => self.remove_node(&name),
            Command::DrainNode { node, reason } => self.drain_node(&node, &reason),
            Command::ResumeNode(node) => self.resume_node(&node, now),
            Command::DownNode { node, reason } => self.down_node(&node, &reason, now),
            Command::ReturnToService { node, any_reason } => {
                self.return_to_service(&node, any_reason, now)
            }
            Command::UpsertPartition(p) => self.upsert_partition(&p, now),
            Command::RemovePartition(name) => self.remove_partition(&name),
            Command::UpsertQos(q) => self.upsert_qos(&q),
            Command::RemoveQos(name) => self.remove_qos(&name),
            Command::UpsertReservation(r) => self.upsert_reservation(&r, now),
            Command::RemoveReservation(name) => self.remove_reservation(&name, now),
            Command::UpsertAccount {
                name,
                parent,
                shares,
                limits,
                grant,
            } => self.upsert_account(&name, &parent, shares, &limits, &grant),
            Command::RemoveAccount(name) => self.remove_account(&name),
            Command::UpsertUser { user, assocs } => self.upsert_user(&user, &assocs),
            Command::RemoveUser(name) => self.remove_user(&name),
            // The entry is the state machine's to keep: a submission's specs and blobs move into
            // the state instead of being copied (and the copies dropped with the entry).
            Command::SubmitJobs { blobs, jobs } => self.submit_jobs(actor, blobs, jobs, now),
            Command::CancelJobs { jobs } => Ok(self.cancel_jobs(actor, &jobs, now)),
            Command::SuspendJobs { jobs } => Ok(self.suspend_jobs(actor, &jobs, now)),
            Command::ResumeJobs { jobs } => Ok(self.resume_jobs(actor, &jobs, now)),
            Command::HoldJobs { jobs } => Ok(self.hold_jobs(actor, &jobs, now)),
            Command::ReleaseJobs { jobs } => Ok(self.release_jobs(actor, &jobs, now)),
            Command::RequeueJobs { jobs } => Ok(self.requeue_jobs(actor, &jobs, now)),
            Command::SetCoordinators { account, users } => self.set_coordinators(&account, &users),
            Command::UpdateJobs { jobs, update } => {
                Ok(self.update_jobs(actor, &jobs, &update, now))
            }
            Command::StartJobs(decisions) => Ok(self.start_jobs(&decisions, now)),
            Command::Preempt(decisions) => Ok(self.preempt(&decisions, now)),
            Command::SetSchedulerReasons(reasons) => self.set_scheduler_reasons(&reasons),
            Command::NoteBypassed(jobs) => {
                self.note_bypassed(&jobs);
                Ok(Response::Done)
            }
            Command::EndJobs(reports) => Ok(self.end_jobs(actor, &reports, now)),
            Command::CreateStep { job, spec } => self.create_step(actor, job, &spec, now),
            Command::EndSteps(reports) => Ok(self.end_steps(actor, &reports, now)),
            Command::CancelSteps { steps } => Ok(self.cancel_steps(actor, &steps, now)),
            Command::CompleteJob { job, exit } => self.complete_job(actor, job, exit, now),
            Command::RaiseCommandVersion(v) => {
                let v = v.min(COMMAND_VERSION);
                self.command_version.0 = self.command_version.0.max(v);
                Ok(Response::Done)
            }
            Command::Tick => {
                self.accrue_all_usage(now);
                self.purge_finished(now);
                self.expire_archive(now);
                self.refresh_on_tick(now);
                Ok(Response::Done)
            }
        }
    }

    /// Why waiting jobs did not start in the last pass: scheduler reasons only, taken only
    /// by jobs still idle with no policy reason (others: stale).
    fn set_scheduler_reasons(
        &mut self,
        reasons: &[(JobId, crate::job::Reason)],
    ) -> Result<Response, Rejection> {
        if let Some((id, r)) = reasons.iter().find(|(_, r)| !r.is_eligible()) {
            return Err(Rejection::invalid(
                "reason",
                format!("{r} for job {id} is not a scheduler reason"),
            ));
        }
        for (id, r) in reasons {
            // Looked at before it is taken to change (see `crate::job_table`).
            let takes = self.jobs.get(id).is_some_and(|job| {
                job.state == crate::job::JobState::Pending
                    && job.part == crate::job::Part::Idle
                    && job.reason.is_eligible()
                    && job.reason != *r
            });
            if takes && let Some(job) = self.jobs.get_mut(id) {
                job.reason = *r;
            }
        }
        Ok(Response::Done)
    }

    /// Counts one more bypass for each job still waiting; others are ignored (the plan is
    /// stale).
    fn note_bypassed(&mut self, jobs: &[JobId]) {
        for id in jobs {
            if let Some(job) = self.jobs.get_mut(id)
                && job.state == crate::job::JobState::Pending
            {
                job.bypass_count = job.bypass_count.saturating_add(1);
            }
        }
    }
}
