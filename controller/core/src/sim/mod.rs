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

mod machine;
mod replayer;
pub mod swf;

use crate::command::{Command, Envelope};
use crate::config::{BackfillMode, BackfillOrder};
use crate::predict::RuntimePredictor;
use crate::priority::RuntimeOrder;
use crate::quantity::Seconds;
use crate::quantity::TimeMs;
use crate::{ApplyCtx, Response, State};
use replayer::Replayer;

pub use machine::{QueueMap, SimMap, SimSite};

use swf::Trace;

/// What a replay schedules with: the planner that runs at each instant, the order of the
/// queue, the order of backfill's candidates and what run times it plans with.
///
/// Named as `docket sim --policy` and `--compare` take them: `fcfs`, `easy`,
/// `conservative`, `easy-sjbf` (EASY, backfilling shortest first), `easy++` (Tsafrir et
/// al.'s EASY++: `easy-sjbf` planning on runtime predictions), and `sjf`, `lxf`, `f1`
/// (EASY with the queue ordered by [`RuntimeOrder`]); any of them followed by modifiers
/// `+sjbf`, `+predict` and `+starve=SECONDS` (see [`Policy::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub backfill: BackfillMode,
    /// `None`: the queue in the site's priority order (FCFS without a site).
    pub order: Option<RuntimeOrder>,
    pub bf_order: BackfillOrder,
    pub predictor: RuntimePredictor,
    pub starvation_wait: Option<Seconds>,
}

impl Policy {
    pub const FCFS: Policy = Policy::of(BackfillMode::Off);
    pub const EASY: Policy = Policy::of(BackfillMode::Easy);
    pub const CONSERVATIVE: Policy = Policy::of(BackfillMode::Conservative);

    /// The policy a configuration's backfill mode amounts to.
    pub const fn of(backfill: BackfillMode) -> Policy {
        Policy {
            backfill,
            order: None,
            bf_order: BackfillOrder::Queue,
            predictor: RuntimePredictor::TimeLimit,
            starvation_wait: None,
        }
    }

    /// A policy by name (see [`Policy`]), e.g. `easy++`, `sjf+starve=86400`.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let mut parts = text.split('+');
        let base = parts.next().unwrap_or_default();
        let mut modifiers: Vec<&str> = parts.collect();
        // `easy++` splits into "easy", "", "" (and `easy+++starve=60` goes on from there).
        let mut p = if base == "easy" && modifiers.len() >= 2 && modifiers[..2] == ["", ""] {
            modifiers.drain(..2);
            Policy {
                bf_order: BackfillOrder::Shortest,
                predictor: RuntimePredictor::RecentAverage,
                ..Policy::EASY
            }
        } else {
            match base {
                "fcfs" => Policy::FCFS,
                "easy" => Policy::EASY,
                "conservative" => Policy::CONSERVATIVE,
                "easy-sjbf" => Policy {
                    bf_order: BackfillOrder::Shortest,
                    ..Policy::EASY
                },
                "sjf" | "lxf" | "f1" => Policy {
                    order: Some(match base {
                        "sjf" => RuntimeOrder::ShortestFirst,
                        "lxf" => RuntimeOrder::LargestXfactor,
                        _ => RuntimeOrder::F1,
                    }),
                    ..Policy::EASY
                },
                other => {
                    return Err(format!(
                        "unknown policy {other:?}; known: fcfs, easy, conservative, easy-sjbf, \
                         easy++, sjf, lxf, f1 (each with +sjbf, +predict, +starve=SECONDS)"
                    ));
                }
            }
        };
        for m in modifiers {
            match m.split_once('=') {
                None if m == "sjbf" => p.bf_order = BackfillOrder::Shortest,
                None if m == "predict" => p.predictor = RuntimePredictor::RecentAverage,
                Some(("starve", v)) => {
                    let s: u64 = v.parse().map_err(|_| {
                        format!("policy {text:?}: starve={v:?} is not a number of seconds")
                    })?;
                    if s == 0 {
                        return Err(format!("policy {text:?}: starve must be at least 1 s"));
                    }
                    p.starvation_wait = Some(Seconds(s));
                }
                _ => {
                    return Err(format!(
                        "policy {text:?}: unknown modifier {m:?}; known: +sjbf, +predict, \
                         +starve=SECONDS"
                    ));
                }
            }
        }
        if p.backfill != BackfillMode::Easy && p.bf_order == BackfillOrder::Shortest {
            return Err(format!(
                "policy {text:?}: +sjbf needs EASY backfill (conservative reserves in queue order)"
            ));
        }
        Ok(p)
    }

    /// The policy's name, as [`Policy::parse`] reads it back.
    pub fn name(&self) -> String {
        let plus_plus = self.order.is_none()
            && self.backfill == BackfillMode::Easy
            && self.bf_order == BackfillOrder::Shortest
            && self.predictor == RuntimePredictor::RecentAverage;
        let mut name = match (self.order, self.backfill) {
            (Some(RuntimeOrder::ShortestFirst), _) => "sjf".to_owned(),
            (Some(RuntimeOrder::LargestXfactor), _) => "lxf".to_owned(),
            (Some(RuntimeOrder::F1), _) => "f1".to_owned(),
            _ if plus_plus => "easy++".to_owned(),
            (None, BackfillMode::Off) => "fcfs".to_owned(),
            (None, BackfillMode::Easy) if self.bf_order == BackfillOrder::Shortest => {
                "easy-sjbf".to_owned()
            }
            (None, BackfillMode::Easy) => "easy".to_owned(),
            (None, BackfillMode::Conservative) => "conservative".to_owned(),
        };
        let base_sjbf = self.order.is_none() && self.backfill == BackfillMode::Easy;
        if self.bf_order == BackfillOrder::Shortest && !base_sjbf {
            name.push_str("+sjbf");
        }
        if self.predictor == RuntimePredictor::RecentAverage && !plus_plus {
            name.push_str("+predict");
        }
        if let Some(w) = self.starvation_wait {
            name.push_str(&format!("+starve={}", w.0));
        }
        name
    }

    /// Applies the policy to a site's scheduling configuration.
    pub(crate) fn configure(&self, config: &mut crate::config::SchedConfig) {
        config.sched.backfill = self.backfill;
        config.sched.bf_order = self.bf_order;
        config.sched.runtime_predictor = self.predictor;
        config.sched.starvation_wait = self.starvation_wait;
        if let Some(order) = self.order {
            config.priority.formula = crate::priority::PriorityFormula::Runtime(order);
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        Policy::parse(s)
    }
}

/// How to replay.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// `None`: the site configuration's backfill mode, EASY without one.
    pub policy: Option<Policy>,
    /// The machine's processors; `None` = the trace header's.
    pub procs: Option<u64>,
    /// Replay only the first N jobs.
    pub max_jobs: Option<usize>,
    /// The site (a controller's configuration file) with its SWF mapping; `None` = one
    /// node, FCFS priority, unlimited depths and 1 s resolution: the textbook algorithms.
    pub site: Option<SimSite>,
}

/// What happened to one job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOutcome {
    pub swf_id: u64,
    pub user: i64,
    pub procs: u64,
    pub submit: u64,
    pub start: u64,
    /// Later than `start` + `run` when the job was suspended on the way.
    pub end: u64,
    pub estimate: u64,
    /// The seconds it ran, suspensions excluded (its trace run time: a suspended job's
    /// clock stops). Counting them, a preemptor and its suspended victim were both counted
    /// on the same cpus, and a replay with suspension reported a utilization above 1.
    pub run: u64,
}

impl JobOutcome {
    pub fn wait(&self) -> u64 {
        self.start - self.submit
    }

    /// Bounded slowdown: max(1, (end - submit) / max(run, 10)), the response time (time
    /// suspended included) over the run time; (wait + run) / max(run, 10) for a job never
    /// suspended.
    pub fn bsld(&self) -> f64 {
        let response = self.end.saturating_sub(self.submit) as f64;
        (response / (self.run as f64).max(10.0)).max(1.0)
    }
}

/// The figures of a replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Jobs that ran to completion (the figures below are theirs).
    pub jobs: usize,
    /// Trace lines that are not usable jobs, and jobs larger than the machine.
    pub dropped: usize,
    /// Jobs the site's policies refused at submission, and the first refusal.
    pub refused: usize,
    pub first_refusal: Option<String>,
    /// Jobs accepted but never finished (limits kept them from starting, or suspended).
    pub unstarted: usize,
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

/// The state machine a replay drives, and the log position it is at.
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
        let response = self
            .state
            .apply(Envelope::controller(cmd), ctx)
            .map_err(|e| SimError::Refused(e.to_string()));
        // A replay keeps no accounting archive: purged jobs are dropped.
        drop(self.state.take_finished());
        response
    }
}

/// Replays `trace`; `progress(done, total)` is called as jobs finish.
pub fn replay(
    trace: &Trace,
    options: &SimOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Replay, SimError> {
    let policy = policy_of(options);
    // The machine's size bounds the jobs kept; a site's nodes define it.
    let site_procs = options
        .site
        .as_ref()
        .filter(|s| !s.site.nodes.is_empty())
        .map(|s| s.site.nodes.iter().map(|n| u64::from(n.cpus)).sum::<u64>());
    let trace_procs = trace.machine_procs(options.procs);
    let limit = site_procs.or(trace_procs).ok_or(SimError::NoMachineSize)?;
    let mut jobs: Vec<&swf::SwfJob> = trace.jobs.iter().filter(|j| j.procs <= limit).collect();
    let dropped_big = trace.jobs.len() - jobs.len();
    if let Some(n) = options.max_jobs {
        jobs.truncate(n);
    }
    jobs.sort_by_key(|j| j.submit); // stable: trace order within an instant

    let machine = machine::build(
        options.site.as_ref(),
        policy,
        trace_procs,
        options.procs.is_some(),
        &jobs,
    )?;
    let mut replayer = Replayer::set_up(jobs, machine, policy, options)?;
    replayer.run(progress)?;
    let procs = replayer.machine.procs;
    let (outcomes, samples, tally) = replayer.finish();
    let mut summary = summarize(&outcomes, procs, policy, dropped_big + trace_dropped(trace));
    summary.refused = tally.refused;
    summary.first_refusal = tally.first_refusal;
    summary.unstarted = tally.unstarted;
    Ok(Replay {
        outcomes,
        summary,
        samples,
    })
}

/// The policy a replay runs: the one asked for, else the site's, else EASY.
fn policy_of(options: &SimOptions) -> Policy {
    options.policy.unwrap_or_else(|| match &options.site {
        Some(s) => {
            let sched = &s.site.sched.sched;
            Policy {
                bf_order: sched.bf_order,
                predictor: sched.runtime_predictor,
                starvation_wait: sched.starvation_wait,
                ..Policy::of(sched.backfill)
            }
        }
        None => Policy::EASY,
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
    let work: f64 = outcomes.iter().map(|o| o.run as f64 * o.procs as f64).sum();
    let mean = |sum: f64| if n == 0 { 0.0 } else { sum / n as f64 };
    Summary {
        jobs: n,
        dropped,
        refused: 0,
        first_refusal: None,
        unstarted: 0,
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
