//! Properties of apply, over random command streams:
//!
//! - two replicas applying the same stream end with byte-identical snapshots, even when one
//!   of them is restored from a snapshot halfway;
//! - every invariant holds after every command (the fixture checks);
//! - a command refused whole, or whose every item is refused, changes nothing but the log
//!   position.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Cluster, SCRIPT, by, name};
use docket_core::account::AssocLimits;
use docket_core::command::{EndCause, EndReport, StartDecision, StepEndReport};
use docket_core::config::{QueuePolicy, SchedConfig};
use docket_core::job::{
    ArrayPart, ArraySpec, Dependency, ExitStatus, JobRef, JobState, StepId, StepRef, StepSpec,
    TimeRequest,
};
use docket_core::plan::Unlimited;
use docket_core::qos::Qos;
use docket_core::quantity::Seconds;
use docket_core::reservation::Reservation;
use docket_core::{Actor, ApplyCtx, Command, Envelope, JobId, Rejection, Response, State};
use proptest::prelude::*;

const USERS: [&str; 3] = ["alice", "bob", "mallory"]; // mallory is unknown
const NODES: [&str; 4] = ["n001", "n002", "n003", "n404"]; // n404 does not exist
const DEPS: [&str; 5] = ["afterok", "afterany", "afternotok", "after", "aftercorr"];

#[derive(Debug, Clone)]
enum Op {
    Submit {
        user: usize,
        count: usize,
        ntasks: u32,
        secs: u64,
        array: Option<(u32, Option<u32>)>,
        dep: Option<(usize, usize)>,
        singleton: bool,
        hold: bool,
        requeue: bool,
        express: bool,
    },
    Cancel {
        pick: usize,
        user: usize,
    },
    Hold {
        pick: usize,
        admin: bool,
    },
    Release {
        pick: usize,
        admin: bool,
    },
    Start {
        pick: usize,
        task: Option<u32>,
        node: usize,
    },
    End {
        pick: usize,
        cause: usize,
        code: i32,
        stale: bool,
        /// 0: the controller; 1: the run's node; 2: another node.
        reporter: u8,
    },
    Down {
        node: usize,
        /// For not responding (what a return to service may clear), not for another reason.
        silent: bool,
    },
    /// The node's agent is back.
    Return {
        node: usize,
        any_reason: bool,
    },
    Drain {
        node: usize,
        /// A user (refused), not an admin.
        user: Option<usize>,
    },
    Resume {
        node: usize,
    },
    Tick {
        secs: u64,
    },
    Caps {
        idle: Option<u32>,
        total: Option<u32>,
        soft: Option<u64>,
    },
    SuspendJob {
        pick: usize,
        admin: bool,
    },
    ResumeJob {
        pick: usize,
    },
    /// Run a planner pass on the current state and apply (part of) its plan.
    Plan {
        backfill: bool,
        what: usize,
    },
    /// An advance reservation on one node.
    Reserve {
        node: usize,
        from: u64,
        hours: u64,
        user: usize,
    },
    /// Limits that tie users together (QOS group, account) or bind one (QOS per user).
    Limits {
        qos_grp_jobs: Option<u32>,
        qos_user_jobs: Option<u32>,
        account_max_jobs: Option<u32>,
    },
    /// `srun` in a job, by its owner (or by another user: refused).
    Step {
        pick: usize,
        ntasks: u32,
        overlap: bool,
        stranger: bool,
    },
    /// A node's agent reports a step's tasks ended there (or on another node: refused).
    StepEnd {
        pick: usize,
        step: usize,
        code: i32,
        foreign: bool,
    },
    /// `scontrol update job=ID Name=...` by the owner: singletons of both names may move.
    Rename {
        pick: usize,
        other: bool,
    },
    /// `scancel JOBID.STEP` by the owner.
    StepCancel {
        pick: usize,
        step: usize,
    },
    /// A new priority formula (some keep the queue's order in an index, some do not), with
    /// or without a starvation bound.
    Formula {
        which: usize,
        starvation: bool,
    },
    /// `scontrol update job=ID TimeLimit=...` by an administrator (moves the job under the
    /// runtime formulas).
    Retime {
        pick: usize,
        mins: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 1..4usize, prop_oneof![6 => 1..5u32, 2 => 8..17u32, 1 => 17..20u32], 0..20_000u64,
              proptest::option::of((1..6u32, proptest::option::of(1..3u32))),
              proptest::option::of((0..5usize, 0..64usize)), any::<bool>(),
              proptest::bool::weighted(0.15), any::<bool>(), proptest::bool::weighted(0.4))
            .prop_map(|(user, count, ntasks, secs, array, dep, singleton, hold, requeue, express)| Op::Submit {
                user, count, ntasks, secs, array, dep, singleton: singleton && dep.is_none(), hold, requeue,
                express,
            }),
        1 => (0..64usize, 0..3usize).prop_map(|(pick, user)| Op::Cancel { pick, user }),
        1 => (0..64usize, any::<bool>()).prop_map(|(pick, admin)| Op::Hold { pick, admin }),
        1 => (0..64usize, any::<bool>()).prop_map(|(pick, admin)| Op::Release { pick, admin }),
        6 => (0..64usize, proptest::option::of(0..7u32), prop_oneof![6 => 0..3usize, 1 => Just(3usize)])
            .prop_map(|(pick, task, node)| Op::Start { pick, task, node }),
        4 => (0..64usize, 0..7usize, prop_oneof![3 => Just(0i32), 1 => 1..3i32], proptest::bool::weighted(0.1),
              prop_oneof![6 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8)])
            .prop_map(|(pick, cause, code, stale, reporter)| Op::End { pick, cause, code, stale, reporter }),
        1 => (0..64usize, any::<bool>()).prop_map(|(pick, admin)| Op::SuspendJob { pick, admin }),
        1 => (0..64usize).prop_map(|pick| Op::ResumeJob { pick }),
        1 => (0..4usize, any::<bool>()).prop_map(|(node, silent)| Op::Down { node, silent }),
        1 => (0..4usize, any::<bool>())
            .prop_map(|(node, any_reason)| Op::Return { node, any_reason }),
        1 => (0..4usize, proptest::option::weighted(0.3, 0..3usize))
            .prop_map(|(node, user)| Op::Drain { node, user }),
        3 => (0..4usize).prop_map(|node| Op::Resume { node }),
        2 => (0..4000u64).prop_map(|secs| Op::Tick { secs }),
        1 => (proptest::option::of(1..5u32), proptest::option::of(2..8u32),
              proptest::option::of(1_000..200_000u64))
            .prop_map(|(idle, total, soft)| Op::Caps { idle, total, soft }),
        6 => (any::<bool>(), 0..7usize).prop_map(|(backfill, what)| Op::Plan { backfill, what }),
        1 => (0..4usize, 0..7200u64, 1..4u64, 0..3usize)
            .prop_map(|(node, from, hours, user)| Op::Reserve { node, from, hours, user }),
        1 => (proptest::option::of(1..4u32), proptest::option::of(1..3u32), proptest::option::of(1..4u32))
            .prop_map(|(qos_grp_jobs, qos_user_jobs, account_max_jobs)| Op::Limits {
                qos_grp_jobs, qos_user_jobs, account_max_jobs,
            }),
        3 => (0..64usize, 1..6u32, proptest::bool::weighted(0.2), proptest::bool::weighted(0.1))
            .prop_map(|(pick, ntasks, overlap, stranger)| Op::Step { pick, ntasks, overlap, stranger }),
        3 => (0..64usize, 0..8usize, prop_oneof![3 => Just(0i32), 1 => 1..3i32], proptest::bool::weighted(0.1))
            .prop_map(|(pick, step, code, foreign)| Op::StepEnd { pick, step, code, foreign }),
        1 => (0..64usize, 0..8usize).prop_map(|(pick, step)| Op::StepCancel { pick, step }),
        1 => (0..64usize, any::<bool>()).prop_map(|(pick, other)| Op::Rename { pick, other }),
        1 => (0..5usize, proptest::bool::weighted(0.2))
            .prop_map(|(which, starvation)| Op::Formula { which, starvation }),
        1 => (0..64usize, 1..600u64).prop_map(|(pick, mins)| Op::Retime { pick, mins }),
    ]
}

fn pick_job(state: &State, pick: usize) -> Option<JobId> {
    let n = state.jobs.len();
    (n > 0).then(|| *state.jobs.keys().nth(pick % n).unwrap())
}

/// Picks among jobs matching `want` most of the time, among all jobs otherwise (so stale
/// decisions and reports are exercised too).
fn pick_where(
    state: &State,
    pick: usize,
    want: impl Fn(&docket_core::job::Job) -> bool,
) -> Option<JobId> {
    let matching: Vec<JobId> = state
        .jobs
        .values()
        .filter(|j| want(j))
        .map(|j| j.id)
        .collect();
    if matching.is_empty() || pick.is_multiple_of(8) {
        pick_job(state, pick)
    } else {
        Some(matching[pick % matching.len()])
    }
}

/// A command of the controller's own.
fn ctl(cmd: Command) -> Envelope {
    Envelope::controller(cmd)
}

/// Turns an abstract op into a concrete command against the current state.
fn command(state: &State, op: &Op, spec_base: &docket_core::job::JobSpec) -> (Envelope, u64) {
    match op {
        Op::Submit { .. } => submission_command(state, op, spec_base),
        Op::Rename { .. }
        | Op::Cancel { .. }
        | Op::Hold { .. }
        | Op::Release { .. }
        | Op::Retime { .. } => user_command(state, op, spec_base),
        Op::Start { .. } | Op::SuspendJob { .. } | Op::ResumeJob { .. } | Op::Plan { .. } => {
            run_command(state, op)
        }
        Op::End { .. } => end_command(state, op),
        Op::Down { .. }
        | Op::Return { .. }
        | Op::Drain { .. }
        | Op::Resume { .. }
        | Op::Tick { .. }
        | Op::Formula { .. }
        | Op::Caps { .. } => node_command(state, op),
        Op::Reserve { .. } | Op::Limits { .. } => policy_command(state, op),
        Op::Step { .. } | Op::StepEnd { .. } | Op::StepCancel { .. } => step_command(state, op),
    }
}

/// A submission of `count` alike jobs by a user (some express, arrays, dependent, held).
fn submission_command(
    state: &State,
    op: &Op,
    spec_base: &docket_core::job::JobSpec,
) -> (Envelope, u64) {
    match op {
        Op::Submit {
            user,
            count,
            ntasks,
            secs,
            array,
            dep,
            singleton,
            hold,
            requeue,
            express,
        } => {
            let mut s = spec_base.clone();
            if *express {
                // A whole node: it must preempt whenever every node runs work jobs.
                s.partition = Some(name("express"));
            }
            s.user = name(USERS[*user]);
            s.ntasks = if *express { 16 } else { *ntasks };
            // Some work jobs want GPUs (one in three with 2 tasks, ...), which suspension
            // keeps; express jobs want none, or a node whose GPUs its suspended victims keep
            // could never take one.
            s.gpus_per_node = if *express { 0 } else { (*ntasks % 3).min(2) };
            s.time = if *secs == 0 {
                TimeRequest::Limit(Seconds(0))
            } else {
                TimeRequest::Limit(Seconds(*secs))
            };
            s.array = array.map(|(n, t)| {
                let mut a = ArraySpec::parse(&format!("0-{}", n - 1), 1000).unwrap();
                a.throttle = t;
                a
            });
            s.dependency = match (dep, singleton) {
                (Some((kind, pick)), _) => pick_job(state, *pick)
                    .map(|t| Dependency::parse(&format!("{}:{}", DEPS[*kind], t.0)).unwrap()),
                (None, true) => Some(Dependency::parse("singleton").unwrap()),
                _ => None,
            };
            s.hold = *hold;
            s.requeue = *requeue;
            let actor = Actor::User(s.user.clone());
            (
                by(
                    actor,
                    Command::SubmitJobs {
                        blobs: vec![SCRIPT.to_vec()],
                        jobs: vec![s; *count],
                    },
                ),
                1,
            )
        }
        _ => unreachable!("{op:?} is not one of Submit"),
    }
}

/// Users' and administrators' changes to waiting jobs.
fn user_command(state: &State, op: &Op, spec_base: &docket_core::job::JobSpec) -> (Envelope, u64) {
    let job = |pick| JobRef {
        job: pick_job(state, pick).unwrap_or(JobId(999_999)),
        task: None,
    };
    match op {
        Op::Rename { pick, other } => (
            by(
                owner(state, *pick),
                Command::UpdateJobs {
                    jobs: vec![job(*pick)],
                    update: docket_core::apply::update::JobUpdate {
                        name: Some(
                            if *other {
                                "other"
                            } else {
                                spec_base.name.as_str()
                            }
                            .into(),
                        ),
                        ..Default::default()
                    },
                },
            ),
            0,
        ),
        Op::Cancel { pick, user } => (
            by(
                Actor::User(name(USERS[*user])),
                Command::CancelJobs {
                    jobs: vec![job(*pick)],
                },
            ),
            0,
        ),
        Op::Hold { pick, admin } => {
            let actor = if *admin {
                Actor::Operator
            } else {
                owner(state, *pick)
            };
            (
                by(
                    actor,
                    Command::HoldJobs {
                        jobs: vec![job(*pick)],
                    },
                ),
                0,
            )
        }
        Op::Release { pick, admin } => {
            let actor = if *admin {
                Actor::Operator
            } else {
                owner(state, *pick)
            };
            (
                by(
                    actor,
                    Command::ReleaseJobs {
                        jobs: vec![job(*pick)],
                    },
                ),
                0,
            )
        }
        Op::Retime { pick, mins } => (
            ctl(Command::UpdateJobs {
                jobs: vec![job(*pick)],
                update: docket_core::apply::update::JobUpdate {
                    time_limit: Some(TimeRequest::Limit(Seconds(mins * 60))),
                    ..Default::default()
                },
            }),
            0,
        ),
        _ => unreachable!("{op:?} is not one of Rename, Cancel, Hold, Release, Retime"),
    }
}

/// Starts, suspensions and resumptions, and whole planner passes.
fn run_command(state: &State, op: &Op) -> (Envelope, u64) {
    match op {
        Op::Start { pick, task, node } => {
            let mut r = JobRef {
                job: pick_where(state, *pick, |j| {
                    j.state == JobState::Pending && j.part == docket_core::job::Part::Idle
                })
                .unwrap_or(JobId(999_999)),
                task: None,
            };
            // Name a pending task of an array master, when there is one.
            if let Some(j) = state.jobs.get(&r.job)
                && let Some(ArrayPart::Master { pending, .. }) = &j.array
            {
                r.task = task.map(|t| {
                    pending
                        .iter()
                        .nth(t as usize % pending.len() as usize)
                        .unwrap_or(t)
                });
            }
            let nodes = vec![name(NODES[*node])];
            (
                ctl(Command::StartJobs(vec![StartDecision { job: r, nodes }])),
                1,
            )
        }
        Op::SuspendJob { pick, admin } => {
            let id = pick_where(state, *pick, |j| j.state == JobState::Running);
            let actor = if *admin {
                Actor::Operator
            } else {
                owner(state, *pick)
            };
            let jobs = vec![JobRef {
                job: id.unwrap_or(JobId(999_999)),
                task: None,
            }];
            (by(actor, Command::SuspendJobs { jobs }), 0)
        }
        Op::ResumeJob { pick } => {
            let id = pick_where(state, *pick, |j| j.state == JobState::Suspended);
            let jobs = vec![JobRef {
                job: id.unwrap_or(JobId(999_999)),
                task: None,
            }];
            (by(Actor::Operator, Command::ResumeJobs { jobs }), 0)
        }
        Op::Plan { backfill, what } => {
            let now = state.applied.now;
            let plan = if *backfill {
                state.backfill_pass(now, &mut Unlimited, None)
            } else {
                state.main_pass(now, &mut Unlimited, None)
            };
            let cmd = match what {
                0 | 1 => ctl(Command::StartJobs(plan.starts)),
                2 | 3 => ctl(Command::Preempt(plan.preemptions)),
                4 => by(
                    Actor::Operator,
                    Command::ResumeJobs {
                        jobs: plan
                            .resumes
                            .iter()
                            .map(|id| JobRef {
                                job: *id,
                                task: None,
                            })
                            .collect(),
                    },
                ),
                5 => ctl(Command::NoteBypassed(plan.bypassed)),
                _ => ctl(Command::SetSchedulerReasons(plan.reasons)),
            };
            (cmd, 0)
        }
        _ => unreachable!("{op:?} is not one of Start, SuspendJob, ResumeJob, Plan"),
    }
}

/// A run's end, reported by the controller or by a node's agent (its own or another).
fn end_command(state: &State, op: &Op) -> (Envelope, u64) {
    match op {
        Op::End {
            pick,
            cause,
            code,
            stale,
            reporter,
        } => {
            let id =
                pick_where(state, *pick, |j| j.state.holds_resources()).unwrap_or(JobId(999_999));
            let epoch = state
                .jobs
                .get(&id)
                .and_then(|j| j.alloc.as_ref())
                .map_or(0, |a| a.epoch);
            let cause = [
                EndCause::Exited,
                EndCause::Exited,
                EndCause::Timeout,
                EndCause::OutOfMemory,
                EndCause::JobfsExceeded,
                EndCause::NodeFail,
                EndCause::LaunchFailed,
            ][*cause];
            let report = EndReport {
                job: id,
                epoch: if *stale { epoch.wrapping_sub(1) } else { epoch },
                cause,
                exit: ExitStatus {
                    code: *code,
                    signal: 0,
                    ..Default::default()
                },
            };
            // Most reports come through the controller; some from a node's agent: the one
            // the run is on (accepted), or another one (refused: it speaks for its node only).
            let on = state
                .jobs
                .get(&id)
                .and_then(|j| j.alloc.as_ref())
                .and_then(|a| a.shares.first())
                .map(|s| s.node.clone());
            let actor = match (reporter, on) {
                (1, Some(node)) => Actor::Node(node),
                (2, Some(node)) => Actor::Node(another_node(&node)),
                _ => Actor::Controller,
            };
            (by(actor, Command::EndJobs(vec![report])), 30)
        }
        _ => unreachable!("{op:?} is not one of End"),
    }
}

/// Nodes' health, time passing, and the priority formula and queue caps.
fn node_command(state: &State, op: &Op) -> (Envelope, u64) {
    match op {
        Op::Down { node, silent } => (
            ctl(Command::DownNode {
                node: name(NODES[*node]),
                reason: if *silent {
                    format!("{} for 30 s", docket_core::node::NOT_RESPONDING)
                } else {
                    "test".into()
                },
            }),
            0,
        ),
        Op::Return { node, any_reason } => (
            ctl(Command::ReturnToService {
                node: name(NODES[*node]),
                any_reason: *any_reason,
            }),
            0,
        ),
        Op::Drain { node, user } => {
            // Most drains by an admin; some by a user, who must be refused with nothing
            // changed.
            let actor = match user {
                Some(u) => Actor::User(name(USERS[*u])),
                None => Actor::Operator,
            };
            (
                by(
                    actor,
                    Command::DrainNode {
                        node: name(NODES[*node]),
                        reason: "test".into(),
                    },
                ),
                0,
            )
        }
        Op::Resume { node } => (ctl(Command::ResumeNode(name(NODES[*node]))), 0),
        Op::Tick { secs } => (ctl(Command::Tick), *secs),
        Op::Formula { which, starvation } => {
            use docket_core::priority::{PriorityFormula, RuntimeOrder};
            let mut config = state.config.clone();
            config.priority.formula = match which {
                0 => SchedConfig::default().priority.formula,
                1 => PriorityFormula::Fcfs,
                2 => PriorityFormula::Runtime(RuntimeOrder::ShortestFirst),
                3 => PriorityFormula::Runtime(RuntimeOrder::F1),
                _ => PriorityFormula::Runtime(RuntimeOrder::LargestXfactor),
            };
            config.sched.starvation_wait = starvation.then(|| Seconds::minutes(30));
            (ctl(Command::SetConfig(Box::new(config))), 0)
        }
        Op::Caps { idle, total, soft } => {
            let mut config = state.config.clone();
            config.queue_policy = QueuePolicy {
                max_idle_jobs_per_user: *idle,
                max_jobs_per_user: *total,
                maxps_soft: *soft,
                maxps_hard: soft.map(|s| s * 3),
                ..QueuePolicy::default()
            };
            (ctl(Command::SetConfig(Box::new(config))), 0)
        }
        _ => unreachable!("{op:?} is not one of Down, Return, Drain, Resume, Tick, Formula, Caps"),
    }
}

/// Reservations and limits.
fn policy_command(state: &State, op: &Op) -> (Envelope, u64) {
    match op {
        Op::Reserve {
            node,
            from,
            hours,
            user,
        } => {
            let start = state.applied.now.plus(Seconds(*from));
            (
                ctl(Command::UpsertReservation(Box::new(Reservation {
                    name: name(&format!("r{node}")),
                    nodes: [name(NODES[*node])].into(),
                    start,
                    end: start.plus(Seconds::hours(*hours)),
                    users: [name(USERS[*user])].into(),
                    accounts: Default::default(),
                }))),
                0,
            )
        }
        Op::Limits {
            qos_grp_jobs,
            qos_user_jobs,
            account_max_jobs,
        } => {
            // Alternates between the QOS and the account, so both kinds are in force at once.
            if qos_grp_jobs.is_some() || account_max_jobs.is_none() {
                let mut q = Qos::new(name("normal"));
                q.limits.grp_jobs = *qos_grp_jobs;
                q.limits.max_jobs_per_user = *qos_user_jobs;
                (ctl(Command::UpsertQos(Box::new(q))), 0)
            } else {
                (
                    ctl(Command::UpsertAccount {
                        name: name("proj"),
                        parent: name("root"),
                        shares: 1,
                        limits: AssocLimits {
                            max_jobs: *account_max_jobs,
                            ..AssocLimits::default()
                        },
                        grant: None,
                    }),
                    0,
                )
            }
        }
        _ => unreachable!("{op:?} is not one of Reserve, Limits"),
    }
}

/// Job steps: created, ended on their nodes, cancelled.
fn step_command(state: &State, op: &Op) -> (Envelope, u64) {
    match op {
        Op::Step {
            pick,
            ntasks,
            overlap,
            stranger,
        } => {
            let id = pick_where(state, *pick, |j| j.state == JobState::Running)
                .unwrap_or(JobId(999_999));
            let actor = match owner_of(state, id) {
                Actor::User(u) if *stranger => Actor::User(another_user(&u)),
                other => other,
            };
            let spec = StepSpec {
                name: "step".into(),
                ntasks: Some(*ntasks),
                nodes: None,
                ntasks_per_node: None,
                cpus_per_task: 1,
                nodelist: Vec::new(),
                overlap: *overlap,
                time_limit: None,
                io_key: vec![1; docket_core::job::step::IO_KEY_BYTES],
            };
            (by(actor, Command::CreateStep { job: id, spec }), 1)
        }
        Op::StepEnd {
            pick,
            step,
            code,
            foreign,
        } => {
            let id = pick_where(state, *pick, |j| j.steps.live().next().is_some())
                .unwrap_or(JobId(999_999));
            let job = state.jobs.get(&id);
            let live: Vec<&docket_core::job::step::Step> = job
                .map(|j| j.steps.list.values().collect())
                .unwrap_or_default();
            let Some(s) = live.get(step % live.len().max(1)) else {
                return (ctl(Command::EndSteps(Vec::new())), 1);
            };
            let node = s.layout.first().map_or(name(NODES[0]), |l| l.node.clone());
            let actor = Actor::Node(if *foreign {
                another_node(&node)
            } else {
                node.clone()
            });
            let report = StepEndReport {
                step: StepRef {
                    job: id,
                    step: s.id,
                },
                epoch: job.and_then(|j| j.alloc.as_ref()).map_or(0, |a| a.epoch),
                node,
                cause: EndCause::Exited,
                exit: ExitStatus {
                    code: *code,
                    ..Default::default()
                },
            };
            (by(actor, Command::EndSteps(vec![report])), 5)
        }
        Op::StepCancel { pick, step } => {
            let id = pick_where(state, *pick, |j| j.steps.live().next().is_some())
                .unwrap_or(JobId(999_999));
            let n = state.jobs.get(&id).map_or(1, |j| j.steps.next.max(1));
            let r = StepRef {
                job: id,
                step: StepId(*step as u32 % n),
            };
            (
                by(owner_of(state, id), Command::CancelSteps { steps: vec![r] }),
                1,
            )
        }
        _ => unreachable!("{op:?} is not one of Step, StepEnd, StepCancel"),
    }
}

/// One of the first two nodes that is not `node`.
fn another_node(node: &docket_core::NodeName) -> docket_core::NodeName {
    name(if node.as_str() == NODES[0] {
        NODES[1]
    } else {
        NODES[0]
    })
}

/// Alice or Bob, whichever `user` is not.
fn another_user(user: &docket_core::UserName) -> docket_core::UserName {
    name(if user.as_str() == "alice" {
        "bob"
    } else {
        "alice"
    })
}

fn owner_of(state: &State, id: JobId) -> Actor {
    state
        .jobs
        .get(&id)
        .map_or(Actor::Operator, |j| Actor::User(j.spec.user.clone()))
}

fn owner(state: &State, pick: usize) -> Actor {
    pick_job(state, pick)
        .map(|id| Actor::User(state.jobs[&id].spec.user.clone()))
        .unwrap_or(Actor::Operator)
}

/// Everything but the log position and time.
fn content(state: &State) -> Vec<u8> {
    let mut s = state.clone();
    s.applied = Default::default();
    s.to_snapshot().unwrap()
}

fn refused_entirely(r: &Result<Response, Rejection>) -> bool {
    match r {
        Err(_) => true,
        Ok(Response::Submitted(v)) => v.iter().all(Result::is_err),
        Ok(Response::PerJob(v)) => v.iter().all(Result::is_err),
        Ok(Response::Started(v)) => v.iter().all(Result::is_err),
        Ok(Response::Preempted(v)) => v.iter().all(Result::is_err),
        Ok(Response::Ended { applied, .. }) => *applied == 0,
        Ok(Response::Done) => false,
        Ok(Response::StepCreated { .. }) => false,
    }
}

/// Three nodes of 2 GPUs in `work` (whose jobs express may suspend) and `express` (tier 10).
fn cluster() -> Cluster {
    let mut c = Cluster::new(SchedConfig::default(), 3);
    for n in ["n001", "n002", "n003"] {
        let mut spec = c.state.nodes[&name(n)].spec.clone();
        spec.gpus = 2;
        c.ok(Command::UpsertNode(spec));
    }
    let mut work = c.state.partitions[&name("work")].clone();
    work.preempt_mode = docket_core::partition::PreemptMode::Suspend;
    let mut express = docket_core::partition::Partition::new(name("express"), work.nodes.clone());
    express.priority_tier = 10;
    express.def_mem_per_cpu = work.def_mem_per_cpu;
    c.ok(Command::UpsertPartition(Box::new(work)));
    c.ok(Command::UpsertPartition(Box::new(express)));
    c
}

/// What one stream exercised.
#[derive(Debug, Default)]
struct Stats {
    accepted_jobs: u64,
    refused: u64,
    started: u64,
    completed: u64,
    requeued: u64,
    blocked_by_caps: u64,
    blocked_by_group_limits: u64,
    preempted: u64,
    planned_starts: u64,
    /// End reports a node's agent made on another node's runs (refused).
    foreign_reports: u64,
    /// Admin commands users tried (refused).
    users_refused_admin: u64,
    /// Steps created, and steps that ended on their nodes' reports.
    steps_created: u64,
    steps_ended: u64,
    /// Passes planned while the formula keeps the queue's order in an index.
    timeless_plans: u64,
}

/// Whether the configuration's order of consideration is time-independent (kept in an
/// index rather than computed at each pass).
fn timeless(config: &SchedConfig) -> bool {
    use docket_core::priority::{PriorityFormula, RuntimeOrder};
    matches!(
        config.priority.formula,
        PriorityFormula::Fcfs
            | PriorityFormula::Runtime(RuntimeOrder::ShortestFirst | RuntimeOrder::F1)
    ) && config.sched.starvation_wait.is_none()
}

/// Applies a stream to one replica (checking invariants and refusals), replays it on a second
/// one restored from a snapshot halfway, and compares.
fn run_stream(ops: &[Op]) -> Result<Stats, TestCaseError> {
    let mut stats = Stats::default();
    let mut a = cluster();
    let spec_base = a.spec("alice");
    let mut log: Vec<(Envelope, ApplyCtx)> = Vec::new();
    for op in ops {
        let (cmd, advance) = command(&a.state, op, &spec_base);
        if matches!(op, Op::Plan { .. }) && timeless(&a.state.config) {
            stats.timeless_plans += 1;
        }
        let before = content(&a.state);
        let r = a.apply_after(advance, cmd.clone());
        if refused_entirely(&r) {
            stats.refused += 1;
            prop_assert_eq!(
                content(&a.state),
                before,
                "refused {:?} changed state: {:?}",
                op,
                r
            );
        }
        if let (Ok(Response::Ended { applied: 1, .. }), Command::EndJobs(reports)) =
            (&r, &cmd.command)
        {
            let done = a.state.jobs.get(&reports[0].job).map(|j| j.state);
            stats.completed += u64::from(done == Some(JobState::Completed));
        }
        match &r {
            Ok(Response::Submitted(v)) => {
                stats.accepted_jobs += v.iter().filter(|x| x.is_ok()).count() as u64
            }
            Ok(Response::Started(v)) => {
                stats.started += v.iter().filter(|x| x.is_ok()).count() as u64;
                if matches!(op, Op::Plan { .. }) {
                    stats.planned_starts += v.iter().filter(|x| x.is_ok()).count() as u64;
                }
            }
            Ok(Response::Preempted(v)) => {
                stats.preempted += v.iter().filter(|x| x.is_ok()).count() as u64
            }
            Ok(Response::Ended { refused, .. }) => stats.foreign_reports += u64::from(*refused),
            Ok(Response::StepCreated { .. }) => stats.steps_created += 1,
            Err(Rejection::NotPermitted(_)) if matches!(op, Op::Drain { user: Some(_), .. }) => {
                stats.users_refused_admin += 1
            }
            _ => {}
        }
        log.push((
            cmd,
            ApplyCtx {
                index: a.index,
                time_ms: a.now,
            },
        ));
    }
    for j in a.state.jobs.values() {
        stats.steps_ended += j.steps.list.values().filter(|s| !s.ends.is_empty()).count() as u64;
        stats.requeued += u64::from(j.requeue_count > 0);
        stats.blocked_by_caps += u64::from(matches!(
            j.reason,
            docket_core::job::Reason::MaxIdleJobsPerUser | docket_core::job::Reason::MaxJobsPerUser
        ));
        stats.blocked_by_group_limits += u64::from(matches!(
            j.reason,
            docket_core::job::Reason::QosGrpJobsLimit | docket_core::job::Reason::AssocMaxJobsLimit
        ));
    }
    let mut b = cluster().state;
    let half = log.len() / 2;
    for (k, (env, ctx)) in log.iter().enumerate() {
        if k == half {
            b = State::from_snapshot(&b.to_snapshot().unwrap()).unwrap();
        }
        let _ = b.apply(env.clone(), *ctx);
    }
    prop_assert_eq!(a.state.to_snapshot().unwrap(), b.to_snapshot().unwrap());
    let restored = State::from_snapshot(&a.state.to_snapshot().unwrap()).unwrap();
    prop_assert!(restored == a.state);
    Ok(stats)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn replicas_agree_and_refusals_change_nothing(ops in proptest::collection::vec(op(), 1..80)) {
        run_stream(&ops)?;
    }
}

/// The random streams are not vacuous: over a fixed set of them, every interesting path runs
/// (preemption needs full nodes and an express job at once: about one stream in forty).
#[test]
fn random_streams_exercise_the_interesting_paths() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let mut total = Stats::default();
    for _ in 0..160 {
        let ops = proptest::collection::vec(op(), 60..80)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let s = run_stream(&ops).unwrap();
        total.accepted_jobs += s.accepted_jobs;
        total.refused += s.refused;
        total.started += s.started;
        total.completed += s.completed;
        total.requeued += s.requeued;
        total.blocked_by_caps += s.blocked_by_caps;
        total.blocked_by_group_limits += s.blocked_by_group_limits;
        total.preempted += s.preempted;
        total.planned_starts += s.planned_starts;
        total.foreign_reports += s.foreign_reports;
        total.users_refused_admin += s.users_refused_admin;
        total.steps_created += s.steps_created;
        total.steps_ended += s.steps_ended;
        total.timeless_plans += s.timeless_plans;
    }
    eprintln!("{total:?}");
    assert!(total.accepted_jobs > 100, "{total:?}");
    assert!(total.refused > 50, "{total:?}");
    assert!(total.started > 20, "{total:?}");
    assert!(total.completed > 5, "{total:?}");
    assert!(total.steps_created > 10, "{total:?}");
    assert!(total.steps_ended > 3, "{total:?}");
    assert!(total.requeued > 0, "{total:?}");
    assert!(total.blocked_by_caps > 0, "{total:?}");
    assert!(total.blocked_by_group_limits > 0, "{total:?}");
    assert!(total.planned_starts > 20, "{total:?}");
    assert!(total.preempted > 0, "{total:?}");
    assert!(total.foreign_reports > 0, "{total:?}");
    assert!(total.users_refused_admin > 0, "{total:?}");
    assert!(total.timeless_plans > 50, "{total:?}");
}

#[test]
fn corrupt_and_future_snapshots_are_refused() {
    let c = cluster();
    let bytes = c.state.to_snapshot().unwrap();
    assert!(State::from_snapshot(b"nope").is_err());
    let mut future = bytes.clone();
    future[4..6].copy_from_slice(&(docket_core::snapshot::SNAPSHOT_FORMAT + 1).to_be_bytes());
    let err = State::from_snapshot(&future).unwrap_err();
    assert!(err.to_string().contains("newer than format"), "{err}");
    let truncated = &bytes[..bytes.len() / 2];
    assert!(State::from_snapshot(truncated).is_err());
}
