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
pub mod swf;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use crate::command::{Command, EndCause, EndReport, Envelope};
use crate::config::{BackfillMode, BackfillOrder};
use crate::ids::JobId;
use crate::job::{ExitStatus, JobRef};
use crate::partition::PreemptMode;
use crate::plan::Unlimited;
use crate::predict::RuntimePredictor;
use crate::priority::RuntimeOrder;
use crate::quantity::Seconds;
use crate::quantity::TimeMs;
use crate::{ApplyCtx, PreemptOutcome, Response, State};

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
            .apply(&Envelope::controller(cmd), ctx)
            .map_err(|e| SimError::Refused(e.to_string()));
        // A replay keeps no accounting archive: purged jobs are dropped.
        drop(self.state.take_finished());
        response
    }
}

/// The jobs holding processors, and when each will end: the agents' side of a replay.
#[derive(Default)]
struct Running {
    /// Ends in time order; an entry whose job no longer ends then (it was suspended or
    /// killed) is skipped.
    ends: BinaryHeap<Reverse<(u64, JobId)>>,
    end_of: FxHashMap<JobId, u64>,
    /// Suspended jobs and the run time they have left.
    suspended: FxHashMap<JobId, u64>,
    busy: u64,
}

impl Running {
    fn start(&mut self, id: JobId, end: u64, procs: u64) {
        self.ends.push(Reverse((end, id)));
        self.end_of.insert(id, end);
        self.busy += procs;
    }

    /// Stops `id`'s clock; `keep` remembers what it has left (suspension).
    fn stop(&mut self, id: JobId, now: u64, procs: u64, keep: bool) {
        if let Some(end) = self.end_of.remove(&id) {
            self.busy -= procs;
            if keep {
                self.suspended.insert(id, end.saturating_sub(now));
            }
        }
    }

    fn resume(&mut self, id: JobId, now: u64, procs: u64) {
        if let Some(left) = self.suspended.remove(&id) {
            self.start(id, now + left, procs);
        }
    }

    fn next_end(&mut self) -> Option<u64> {
        while let Some(Reverse((t, id))) = self.ends.peek().copied() {
            if self.end_of.get(&id) == Some(&t) {
                return Some(t);
            }
            self.ends.pop();
        }
        None
    }

    /// The jobs that end at `t`.
    fn ending(&mut self, t: u64) -> Vec<JobId> {
        let mut out = Vec::new();
        while self.next_end() == Some(t) {
            if let Some(Reverse((_, id))) = self.ends.pop() {
                self.end_of.remove(&id);
                out.push(id);
            }
        }
        out
    }
}

/// Replays `trace`; `progress(done, total)` is called as jobs finish.
pub fn replay(
    trace: &Trace,
    options: &SimOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Replay, SimError> {
    let policy = options.policy.unwrap_or_else(|| match &options.site {
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
    });
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
    let procs = machine.procs;
    // Preemption and resumes are planned by the main pass: run it before backfill when the
    // configuration can preempt.
    let preempting = machine.config.preempt.parallel_run.is_some()
        || options.site.as_ref().is_some_and(|s| {
            s.site
                .partitions
                .iter()
                .any(|p| p.preempt_mode != PreemptMode::Off)
                || s.site.qos.iter().any(|q| !q.preempt.is_empty())
        });
    let mut d = Driver {
        state: State::new(machine.config.clone()),
        index: 0,
    };
    let t0 = jobs.first().map_or(0, |j| j.submit);
    for cmd in machine.commands {
        d.apply(cmd, t0)
            .map_err(|e| SimError::Setup(e.to_string()))?;
    }

    let total = jobs.len();
    let mut outcomes: Vec<Option<JobOutcome>> = vec![None; total];
    let mut which: FxHashMap<JobId, usize> = FxHashMap::default();
    let mut running = Running::default();
    let mut samples = Vec::new();
    let mut completed = vec![false; total];
    let mut refused = 0usize;
    let mut first_refusal: Option<String> = None;
    let mut next = 0usize;
    let mut done = 0usize;
    let mut last_tick = t0;
    // Instants at which a running job outlives its runtime prediction: the plans are made
    // again then, on the corrected prediction (EASY++); stale entries are skipped.
    let mut expiries: BinaryHeap<Reverse<(u64, JobId)>> = BinaryHeap::new();
    loop {
        let arrival = jobs.get(next).map(|j| j.submit);
        let end = running.next_end();
        let t = match [arrival, end].into_iter().flatten().min() {
            Some(t) => t,
            // Nothing arrives or runs (expiries belong to running jobs).
            None => break,
        };
        let t = expiries.peek().map_or(t, |Reverse((x, _))| t.min(*x));
        // Predictions that run out now: the passes below plan on the corrected ones.
        while let Some(&Reverse((x, id))) = expiries.peek()
            && x <= t
        {
            expiries.pop();
            let later = d
                .state
                .jobs
                .get(&id)
                .and_then(|j| j.prediction_expires(TimeMs(t * 1000)));
            schedule_expiry(&mut expiries, later, id);
        }
        if t >= last_tick + 3600 {
            d.apply(Command::Tick, t)?;
            last_tick = t;
        }
        // Completions.
        let mut reports = Vec::new();
        for id in running.ending(t) {
            let epoch = d.state.jobs[&id].alloc.as_ref().map_or(0, |a| a.epoch);
            reports.push(EndReport {
                job: id,
                epoch,
                cause: EndCause::Exited,
                exit: ExitStatus {
                    code: 0,
                    signal: 0,
                    ..Default::default()
                },
            });
            if let Some(&k) = which.get(&id) {
                running.busy -= jobs[k].procs;
                completed[k] = true;
                // Later than planned when it was suspended on the way.
                if let Some(o) = outcomes[k].as_mut() {
                    o.end = t;
                }
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
                .map(|j| machine.jobs.spec(j))
                .collect::<Result<Vec<_>, _>>()?;
            // Sent with every batch: stored once, dropped when no job uses it any more.
            let blobs = vec![machine::SCRIPT.to_vec()];
            let r = d.apply(Command::SubmitJobs { blobs, jobs: specs }, t)?;
            let Response::Submitted(results) = r else {
                return Err(SimError::Refused(format!("submission answered {r:?}")));
            };
            for (k, r) in results.into_iter().enumerate() {
                match r {
                    Ok(id) => {
                        which.insert(id, first + k);
                    }
                    // The site's policies refuse it (a walltime cap, a QOS the partition
                    // does not allow, ...): counted, as a controller would have told the
                    // user. The textbook machine refuses nothing.
                    Err(e) if options.site.is_some() => {
                        refused += 1;
                        first_refusal.get_or_insert_with(|| format!("{}: {e}", jobs[first + k]));
                    }
                    Err(e) => {
                        return Err(SimError::Refused(format!("{}: {e}", jobs[first + k])));
                    }
                }
            }
        }
        // The passes, as the leader runs them. On a site, they run again while they start
        // something: a start can unblock others (Maui promotes a blocked job when an idle
        // one starts), which the leader's next loop would see seconds later. The textbook
        // algorithms start everything they can in one pass.
        let now = TimeMs(t * 1000);
        let rounds = if options.site.is_some() { 16 } else { 1 };
        for _ in 0..rounds {
            let mut starts = Vec::new();
            if policy.backfill == BackfillMode::Off || preempting {
                let plan = d.state.main_pass(now, &mut Unlimited, None);
                starts.extend(apply_starts(&mut d, plan.starts, t)?);
                if !plan.preemptions.is_empty() {
                    let victims: Vec<Vec<JobId>> =
                        plan.preemptions.iter().map(|p| p.victims.clone()).collect();
                    let Response::Preempted(results) =
                        d.apply(Command::Preempt(plan.preemptions), t)?
                    else {
                        return Err(SimError::Refused("preempt answered otherwise".into()));
                    };
                    let mut killed = Vec::new();
                    for (r, victims) in results.into_iter().zip(victims) {
                        let suspend = match r {
                            Ok(PreemptOutcome::Started(id)) => {
                                starts.push(id);
                                true
                            }
                            Ok(PreemptOutcome::Freeing) => false,
                            Err(e) => return Err(SimError::Refused(format!("a preemption: {e}"))),
                        };
                        for v in victims {
                            let p = which.get(&v).map_or(0, |&k| jobs[k].procs);
                            running.stop(v, t, p, suspend);
                            if !suspend {
                                let epoch = d.state.jobs[&v].alloc.as_ref().map_or(0, |a| a.epoch);
                                killed.push(EndReport {
                                    job: v,
                                    epoch,
                                    cause: EndCause::Preempted,
                                    exit: ExitStatus {
                                        code: 0,
                                        signal: 15,
                                        ..Default::default()
                                    },
                                });
                            }
                        }
                    }
                    if !killed.is_empty() {
                        d.apply(Command::EndJobs(killed), t)?;
                    }
                }
                if !plan.resumes.is_empty() {
                    let refs: Vec<JobRef> = plan
                        .resumes
                        .iter()
                        .map(|id| JobRef {
                            job: *id,
                            task: None,
                        })
                        .collect();
                    let Response::PerJob(results) =
                        d.apply(Command::ResumeJobs { jobs: refs }, t)?
                    else {
                        return Err(SimError::Refused("resume answered otherwise".into()));
                    };
                    for (id, r) in plan.resumes.iter().zip(results) {
                        if r.is_ok() {
                            let p = which.get(id).map_or(0, |&k| jobs[k].procs);
                            running.resume(*id, t, p);
                        }
                    }
                }
            }
            if policy.backfill != BackfillMode::Off {
                let plan = d.state.backfill_pass(now, &mut Unlimited, None);
                starts.extend(apply_starts(&mut d, plan.starts, t)?);
            }
            let progressed = !starts.is_empty();
            for id in starts {
                let k = which[&id];
                let j = jobs[k];
                running.start(id, t + j.runtime, j.procs);
                let expires = d
                    .state
                    .jobs
                    .get(&id)
                    .and_then(|j| j.prediction_expires(now));
                schedule_expiry(&mut expiries, expires, id);
                // A requeued job's outcome is its last run.
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
            if !progressed {
                break;
            }
        }
        let in_system = which.len() - done;
        samples.push(Sample {
            time: t,
            busy_procs: running.busy,
            queued_jobs: (in_system - running.end_of.len() - running.suspended.len()) as u64,
        });
        if running.next_end().is_none() && next >= total && done < which.len() {
            if options.site.is_some() {
                // The site's limits keep these from ever starting (a MAXPS hard limit,
                // a down partition, ...): reported, not an error.
                break;
            }
            return Err(SimError::Stuck {
                time: t,
                queued: which.len() - done,
            });
        }
    }
    let unstarted = which.len() - done;
    let outcomes: Vec<JobOutcome> = outcomes
        .into_iter()
        .zip(completed)
        .filter_map(|(o, done)| o.filter(|_| done))
        .collect();
    let mut summary = summarize(&outcomes, procs, policy, dropped_big + trace_dropped(trace));
    summary.refused = refused;
    summary.first_refusal = first_refusal;
    summary.unstarted = unstarted;
    Ok(Replay {
        outcomes,
        summary,
        samples,
    })
}

/// Re-plans at the (whole) second job `id`'s runtime prediction runs out, if it will.
fn schedule_expiry(
    expiries: &mut BinaryHeap<Reverse<(u64, JobId)>>,
    at: Option<TimeMs>,
    id: JobId,
) {
    if let Some(at) = at {
        expiries.push(Reverse((at.0.div_ceil(1000), id)));
    }
}

/// Applies planned starts; the ids of those apply accepted (a replay's plans are never
/// stale, so a refusal is a bug and stops the replay).
fn apply_starts(
    d: &mut Driver,
    starts: Vec<crate::command::StartDecision>,
    t: u64,
) -> Result<Vec<JobId>, SimError> {
    if starts.is_empty() {
        return Ok(Vec::new());
    }
    let Response::Started(results) = d.apply(Command::StartJobs(starts), t)? else {
        return Err(SimError::Refused("start answered otherwise".into()));
    };
    results
        .into_iter()
        .map(|r| r.map_err(|e| SimError::Refused(format!("a planned start: {e}"))))
        .collect()
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
