//! Replaying a workload trace through the scheduler, on a virtual clock.
//!
//! The replay drives the very state and planners the controller runs: every arrival is a
//! `SubmitJobs` command, every plan a `StartJobs` command that apply re-validates, every
//! completion an `EndJobs` report, each stamped with the virtual time. The machine is one
//! node with the trace's processors (the SWF model: processors, no topology). At each
//! instant: completions first, then arrivals, then one scheduling pass (the main pass for
//! FCFS, the backfill pass for EASY and conservative). A job that runs 0 s ends at the
//! instant it starts, and that instant is handled again. A `Tick` every simulated hour
//! purges finished jobs, as the controller's does.

pub mod swf;

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use crate::account::{AssocLimits, User, UserAssoc};
use crate::command::{Actor, Command, EndCause, EndReport, Envelope};
use crate::config::{BackfillMode, SchedConfig, SchedParams};
use crate::ids::{AccountName, JobId, NodeName, PartitionName, UserName};
use crate::job::{BlobId, ExitStatus, JobSpec, MemoryRequest, TimeRequest};
use crate::node::NodeSpec;
use crate::partition::Partition;
use crate::plan::Unlimited;
use crate::priority::PriorityFormula;
use crate::qos::Qos;
use crate::quantity::{MiB, Seconds, TimeMs};
use crate::{ApplyCtx, Response, State};

use swf::Trace;

/// Which planner runs at each instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Fcfs,
    Easy,
    Conservative,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Fcfs => "fcfs",
            Policy::Easy => "easy",
            Policy::Conservative => "conservative",
        }
    }

    fn backfill(self) -> BackfillMode {
        match self {
            Policy::Fcfs => BackfillMode::Off,
            Policy::Easy => BackfillMode::Easy,
            Policy::Conservative => BackfillMode::Conservative,
        }
    }
}

/// How to replay.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub policy: Policy,
    /// The machine's processors; `None` = the trace header's.
    pub procs: Option<u64>,
    /// Replay only the first N jobs.
    pub max_jobs: Option<usize>,
    /// The scheduler configuration (a controller's); `None` = FCFS priority with unlimited
    /// depths and 1 s resolution, the textbook algorithms.
    pub config: Option<SchedConfig>,
}

/// What happened to one job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOutcome {
    pub swf_id: u64,
    pub user: i64,
    pub procs: u64,
    pub submit: u64,
    pub start: u64,
    pub end: u64,
    pub estimate: u64,
}

impl JobOutcome {
    pub fn wait(&self) -> u64 {
        self.start - self.submit
    }

    pub fn run(&self) -> u64 {
        self.end - self.start
    }

    /// Bounded slowdown: max(1, (wait + run) / max(run, 10)).
    pub fn bsld(&self) -> f64 {
        let run = self.run() as f64;
        ((self.wait() as f64 + run) / run.max(10.0)).max(1.0)
    }
}

/// The figures of a replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub jobs: usize,
    pub dropped: usize,
    pub procs: u64,
    pub policy: Policy,
    pub utilization: f64,
    pub mean_wait_s: f64,
    pub p95_wait_s: f64,
    pub max_wait_s: f64,
    pub mean_bsld: f64,
    pub makespan_s: f64,
}

/// One point of the machine's load over time (for plots).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub time: u64,
    pub busy_procs: u64,
    pub queued_jobs: u64,
}

#[derive(Debug, Clone)]
pub struct Replay {
    pub outcomes: Vec<JobOutcome>,
    pub summary: Summary,
    pub samples: Vec<Sample>,
}

/// Why a replay could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error("the machine size is unknown: give --procs (the trace has no MaxProcs or MaxNodes)")]
    NoMachineSize,
    #[error("machine size {0} processors is above the limit of {max}", max = u32::MAX)]
    MachineTooLarge(u64),
    #[error("setting up the replay failed: {0}")]
    Setup(String),
    #[error("the scheduler refused a replayed command: {0}")]
    Refused(String),
    #[error("the replay stopped making progress at {time} s with {queued} jobs queued")]
    Stuck { time: u64, queued: usize },
}

const NODE: &str = "sim";
const PARTITION: &str = "batch";
const SCRIPT: &[u8] = b"#!/bin/sh\n# replayed from a workload trace\n";

struct Driver {
    state: State,
    index: u64,
}

impl Driver {
    fn apply(&mut self, cmd: Command, time: u64) -> Result<Response, SimError> {
        self.index += 1;
        let ctx = ApplyCtx {
            index: self.index,
            time_ms: TimeMs(time.saturating_mul(1000)),
        };
        self.state
            .apply(&Envelope::new(cmd), ctx)
            .map_err(|e| SimError::Refused(e.to_string()))
    }
}

fn name<T: std::str::FromStr>(s: &str) -> Result<T, SimError>
where
    T::Err: std::fmt::Display,
{
    s.parse()
        .map_err(|e: T::Err| SimError::Setup(e.to_string()))
}

fn user_name(id: i64) -> String {
    if id >= 0 {
        format!("u{id}")
    } else {
        "unknown".into()
    }
}

fn account_name(id: i64) -> String {
    if id >= 0 {
        format!("g{id}")
    } else {
        "nogroup".into()
    }
}

/// Replays `trace`; `progress(done, total)` is called as jobs finish.
pub fn replay(
    trace: &Trace,
    options: &SimOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Replay, SimError> {
    let procs = trace
        .machine_procs(options.procs)
        .ok_or(SimError::NoMachineSize)?;
    let cpus = u32::try_from(procs).map_err(|_| SimError::MachineTooLarge(procs))?;
    let mut jobs: Vec<&swf::SwfJob> = trace.jobs.iter().filter(|j| j.procs <= procs).collect();
    let dropped_big = trace.jobs.len() - jobs.len();
    if let Some(n) = options.max_jobs {
        jobs.truncate(n);
    }
    jobs.sort_by_key(|j| j.submit); // stable: trace order within an instant

    let mut config = options.config.clone().unwrap_or_else(|| {
        let mut c = SchedConfig::default();
        c.priority.formula = PriorityFormula::Fcfs;
        c.sched = SchedParams::unlimited(options.policy.backfill());
        c
    });
    config.sched.backfill = options.policy.backfill();
    config.max_batch = config
        .max_batch
        .max(u32::try_from(jobs.len()).unwrap_or(u32::MAX));
    config.max_job_count = config.max_job_count.max(jobs.len() as u64 + 1);
    let mut d = Driver {
        state: State::new(config.clone()),
        index: 0,
    };
    let t0 = jobs.first().map_or(0, |j| j.submit);
    d.apply(
        Command::UpsertNode(NodeSpec {
            name: name(NODE)?,
            cpus,
            memory: MiB(u64::MAX / 4),
            jobfs: MiB(u64::MAX / 4),
            gpus: 0,
            features: BTreeSet::new(),
        }),
        t0,
    )?;
    if !d.state.qos.contains_key(&config.default_qos) {
        d.apply(
            Command::UpsertQos(Box::new(Qos::new(config.default_qos.clone()))),
            t0,
        )?;
    }
    let node: NodeName = name(NODE)?;
    let mut partition = Partition::new(name(PARTITION)?, BTreeSet::from([node]));
    partition.is_default = true;
    d.apply(Command::UpsertPartition(Box::new(partition)), t0)?;
    let groups: BTreeSet<i64> = jobs.iter().map(|j| j.group).collect();
    for g in &groups {
        d.apply(
            Command::UpsertAccount {
                name: name(&account_name(*g))?,
                parent: name("root")?,
                shares: 1,
                limits: AssocLimits::default(),
                grant: None,
            },
            t0,
        )?;
    }
    // Each user belongs to every group they submitted under; the first is their default.
    let mut users: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
    for j in &jobs {
        let gs = users.entry(j.user).or_default();
        if !gs.contains(&j.group) {
            gs.push(j.group);
        }
    }
    for (u, gs) in &users {
        let assocs = gs
            .iter()
            .map(|g| {
                Ok((
                    name::<AccountName>(&account_name(*g))?,
                    UserAssoc {
                        shares: 1,
                        priority: 0,
                        limits: AssocLimits::default(),
                    },
                ))
            })
            .collect::<Result<Vec<_>, SimError>>()?;
        d.apply(
            Command::UpsertUser {
                user: User {
                    name: name(&user_name(*u))?,
                    default_account: name(&account_name(gs[0]))?,
                    admin: false,
                },
                assocs,
            },
            t0,
        )?;
    }
    let script = BlobId::of(SCRIPT);
    let partition_name: PartitionName = name(PARTITION)?;
    let spec_of = |j: &swf::SwfJob| -> Result<JobSpec, SimError> {
        let mut s = JobSpec::simple(name::<UserName>(&user_name(j.user))?, script);
        s.account = Some(name(&account_name(j.group))?);
        s.partition = Some(partition_name.clone());
        s.ntasks = u32::try_from(j.procs).map_err(|_| SimError::MachineTooLarge(j.procs))?;
        s.memory = Some(MemoryRequest::PerNode(MiB(0)));
        s.jobfs = Some(MiB(0));
        s.time = TimeRequest::Limit(Seconds(j.estimate.max(1)));
        s.name = smol_str::SmolStr::new(format!("swf{}", j.id));
        Ok(s)
    };

    let total = jobs.len();
    let mut outcomes: Vec<Option<JobOutcome>> = vec![None; total];
    let mut which: std::collections::BTreeMap<JobId, usize> = Default::default();
    let mut ends: BinaryHeap<Reverse<(u64, JobId)>> = BinaryHeap::new();
    let mut samples = Vec::new();
    let mut next = 0usize;
    let mut done = 0usize;
    let mut busy: u64 = 0;
    let mut last_tick = t0;
    loop {
        let t = match (jobs.get(next).map(|j| j.submit), ends.peek().map(|e| e.0.0)) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(e)) => e,
            (Some(a), Some(e)) => a.min(e),
        };
        if t >= last_tick + 3600 {
            d.apply(Command::Tick, t)?;
            last_tick = t;
        }
        // Completions.
        let mut reports = Vec::new();
        while ends.peek().is_some_and(|e| e.0.0 == t) {
            let Some(Reverse((_, id))) = ends.pop() else {
                break;
            };
            let epoch = d.state.jobs[&id].alloc.as_ref().map_or(0, |a| a.epoch);
            reports.push(EndReport {
                job: id,
                epoch,
                cause: EndCause::Exited,
                exit: ExitStatus { code: 0, signal: 0 },
            });
            if let Some(&k) = which.get(&id) {
                busy -= jobs[k].procs;
            }
            done += 1;
        }
        if !reports.is_empty() {
            d.apply(Command::EndJobs(reports), t)?;
            progress(done, total);
        }
        // Arrivals.
        let first = next;
        while next < total && jobs[next].submit == t {
            next += 1;
        }
        if next > first {
            let specs = jobs[first..next]
                .iter()
                .map(|j| spec_of(j))
                .collect::<Result<Vec<_>, _>>()?;
            // Sent with every batch: stored once, dropped when no job uses it any more.
            let blobs = vec![SCRIPT.to_vec()];
            let r = d.apply(
                Command::SubmitJobs {
                    actor: Actor::Operator,
                    blobs,
                    jobs: specs,
                },
                t,
            )?;
            let Response::Submitted(results) = r else {
                return Err(SimError::Refused(format!("submission answered {r:?}")));
            };
            for (k, r) in results.into_iter().enumerate() {
                let id = r.map_err(|e| SimError::Refused(format!("{}: {e}", jobs[first + k])))?;
                which.insert(id, first + k);
            }
        }
        // One pass.
        let now = TimeMs(t * 1000);
        let plan = match options.policy {
            Policy::Fcfs => d.state.main_pass(now, &mut Unlimited, None),
            _ => d.state.backfill_pass(now, &mut Unlimited, None),
        };
        if !plan.starts.is_empty() {
            let Response::Started(results) = d.apply(Command::StartJobs(plan.starts.clone()), t)?
            else {
                return Err(SimError::Refused("start answered otherwise".into()));
            };
            for r in results {
                let id = r.map_err(|e| SimError::Refused(format!("a planned start: {e}")))?;
                let k = which[&id];
                let j = jobs[k];
                busy += j.procs;
                ends.push(Reverse((t + j.runtime, id)));
                outcomes[k] = Some(JobOutcome {
                    swf_id: j.id,
                    user: j.user,
                    procs: j.procs,
                    submit: j.submit,
                    start: t,
                    end: t + j.runtime,
                    estimate: j.estimate,
                });
            }
        }
        samples.push(Sample {
            time: t,
            busy_procs: busy,
            queued_jobs: (next - done) as u64 - ends.len() as u64,
        });
        if ends.is_empty() && next >= total && done < total {
            return Err(SimError::Stuck {
                time: t,
                queued: total - done,
            });
        }
    }
    let outcomes: Vec<JobOutcome> = outcomes.into_iter().flatten().collect();
    let summary = summarize(
        &outcomes,
        procs,
        options.policy,
        dropped_big + trace_dropped(trace),
    );
    Ok(Replay {
        outcomes,
        summary,
        samples,
    })
}

fn trace_dropped(trace: &Trace) -> usize {
    trace.malformed.len() + trace.dropped
}

fn summarize(outcomes: &[JobOutcome], procs: u64, policy: Policy, dropped: usize) -> Summary {
    let n = outcomes.len();
    let mut waits: Vec<u64> = outcomes.iter().map(JobOutcome::wait).collect();
    waits.sort_unstable();
    let first_submit = outcomes.iter().map(|o| o.submit).min().unwrap_or(0);
    let last_end = outcomes.iter().map(|o| o.end).max().unwrap_or(0);
    let makespan = last_end.saturating_sub(first_submit);
    let work: f64 = outcomes
        .iter()
        .map(|o| o.run() as f64 * o.procs as f64)
        .sum();
    let mean = |sum: f64| if n == 0 { 0.0 } else { sum / n as f64 };
    Summary {
        jobs: n,
        dropped,
        procs,
        policy,
        utilization: if makespan == 0 {
            0.0
        } else {
            work / (procs as f64 * makespan as f64)
        },
        mean_wait_s: mean(waits.iter().map(|w| *w as f64).sum()),
        p95_wait_s: if n == 0 {
            0.0
        } else {
            waits[((n - 1) as f64 * 0.95).round() as usize] as f64
        },
        max_wait_s: waits.last().copied().unwrap_or(0) as f64,
        mean_bsld: mean(outcomes.iter().map(JobOutcome::bsld).sum()),
        makespan_s: makespan as f64,
    }
}
