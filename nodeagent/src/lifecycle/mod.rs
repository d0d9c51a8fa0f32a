//! The agent's decisions about runs, with no I/O: what each instruction, observed start or
//! exit, clock tick, fence and acknowledgement does to the runs of this node, and which
//! effects follow (spawn, signal, freeze, release, report, save).
//!
//! [`crate::runner`] is the executor: it feeds [`Runs::step`] what happened and carries out
//! the effects it returns, in order, outside the lock that guards this state. Keeping the
//! decisions here (like toydb's Raft node or openraft's engine, which return commands instead
//! of doing them) means every interleaving that matters — a kill before the process started,
//! a launch repeated or from an older epoch, an exit while being stopped, a restart between
//! any two steps — is tested without root, processes or time.
//!
//! Invariants, checked by the tests:
//! - a run is identified by (job, epoch); an instruction for an epoch older than the newest
//!   this node has had for that job changes nothing, and a launch of a run already had (or
//!   older) starts nothing, so nothing sent twice runs twice;
//! - every run started ends exactly once ([`Effect::Release`] and one `Ended` report), and its
//!   end is reported again to each new leader until acknowledged;
//! - a run being stopped gets SIGTERM, then SIGKILL after the grace, whatever else happens;
//! - walltime counts only time not suspended; a suspended run is frozen, and thawed before it
//!   is stopped.

use std::collections::BTreeMap;
use std::time::Duration;

use docket_proto::v1 as pb;
use nix::sys::signal::Signal;

/// Milliseconds on the executor's monotonic clock.
pub type Millis = u64;

/// A run: one (job, epoch).
pub type RunId = (u64, u64);

/// The most acknowledged runs remembered (newest epoch per job), so a late or repeated launch
/// of a finished run is still refused. Bounded: the oldest job ids go first.
const FINISHED_MEMORY: usize = 100_000;

/// How a run's processes ended, as the executor observed them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its monitor recorded an exit code or a killing signal.
    Exited { code: i32, signal: i32 },
    /// It could not be started, and why (nothing of it ran).
    LaunchFailed(String),
    /// Its monitor died without recording anything: nobody knows how it ended.
    Lost,
}

/// What the executor read from the run's cgroup and scratch as it ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Observed {
    pub oom_killed: bool,
    pub jobfs_full: bool,
    pub cpu_time_ms: u64,
    pub max_rss_mib: u64,
}

/// What happened.
#[derive(Debug, Clone)]
pub enum Input {
    /// An instruction from the leader.
    Instruction(Box<pb::instruction::Kind>),
    /// The run's processes are running (its monitor started them).
    Started(RunId),
    /// The run's processes are gone.
    Ended(RunId, Outcome, Observed),
    /// The clock moved (walltime, kill grace, simulated runs' ends).
    Tick,
    /// No leader for longer than the fence: every running job stops.
    Fence,
    /// The leader recorded the run's end.
    Acknowledged(RunId),
}

/// What the executor must do, in this order.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Start the run's processes (real runs) and report [`Input::Started`] when they run.
    Spawn(RunId, Box<pb::Launch>),
    /// Send a signal to every process of the run.
    Signal(RunId, Signal),
    /// Freeze (true) or thaw the run.
    Freeze(RunId, bool),
    /// The run ended: free what it held (cgroup, scratch, cpus, GPUs, its directory).
    Release(RunId),
    /// Tell the leader.
    Report(pb::JobEvent),
    /// Write the runs to the state file.
    Save,
}

/// One run's state.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Its processes run (false while being started).
    started: bool,
    running: bool,
    ended: Option<pb::Ended>,
    /// When this agent took it on, and how long it had run before (a re-adopted run).
    since: Millis,
    carried: Duration,
    limit: Option<Duration>,
    /// Time suspended since `since` (not counted), and the current suspension.
    paused: Duration,
    suspended_since: Option<Millis>,
    /// Why it is being stopped, if it is.
    stopping: Option<pb::EndCause>,
    /// When it gets SIGKILL if still running (the grace after SIGTERM).
    kill_at: Option<Millis>,
    /// A simulated run's length (its script's `sleep N`), None: until stopped.
    sim_runtime: Option<Duration>,
    /// When it started, on the wall clock (kept for a restarted agent).
    started_unix_ms: u64,
}

impl Run {
    /// How long it has run, suspension excluded.
    fn ran(&self, now: Millis) -> Duration {
        let suspended = self.suspended_since.map_or(0, |s| now.saturating_sub(s));
        self.carried
            + Duration::from_millis(now.saturating_sub(self.since).saturating_sub(suspended))
                .saturating_sub(self.paused)
    }

    /// When its walltime runs out, if it is counting.
    fn limit_at(&self, now: Millis) -> Option<Millis> {
        if !self.running || self.stopping.is_some() || self.suspended_since.is_some() {
            return None;
        }
        let left = self.limit?.saturating_sub(self.ran(now));
        Some(now + left.as_millis() as u64)
    }

    /// When a simulated run finishes by itself.
    fn sim_end_at(&self, now: Millis) -> Option<Millis> {
        if !self.running || self.stopping.is_some() || self.suspended_since.is_some() {
            return None;
        }
        let left = self.sim_runtime?.saturating_sub(self.ran(now));
        Some(now + left.as_millis() as u64)
    }

    pub fn running(&self) -> bool {
        self.running
    }

    /// Being stopped (cancelled, out of time, preempted): it takes no new steps.
    pub fn stopping(&self) -> bool {
        self.stopping.is_some()
    }

    pub fn suspended(&self) -> bool {
        self.suspended_since.is_some()
    }
}

/// The runs of this node.
#[derive(Debug, Clone)]
pub struct Runs {
    simulated: bool,
    kill_grace: Duration,
    runs: BTreeMap<RunId, Run>,
    /// The newest acknowledged epoch per job.
    finished: BTreeMap<u64, u64>,
}

impl Runs {
    /// No runs. `simulated`: runs have no processes (they last their script's `sleep N`).
    pub fn new(simulated: bool, kill_grace: Duration) -> Self {
        Runs {
            simulated,
            kill_grace,
            runs: BTreeMap::new(),
            finished: BTreeMap::new(),
        }
    }

    /// Applies what happened at `now` (monotonic ms; `unix_ms` on the wall clock).
    pub fn step(&mut self, now: Millis, unix_ms: u64, input: Input) -> Vec<Effect> {
        let mut fx = Vec::new();
        match input {
            Input::Instruction(kind) => self.instruction(now, unix_ms, *kind, &mut fx),
            Input::Started(id) => self.started(now, id, unix_ms, &mut fx),
            Input::Ended(id, outcome, observed) => self.ended(id, outcome, observed, &mut fx),
            Input::Tick => self.tick(now, &mut fx),
            Input::Fence => {
                let running: Vec<RunId> = self
                    .runs
                    .iter()
                    .filter(|(_, r)| r.running)
                    .map(|(id, _)| *id)
                    .collect();
                for id in running {
                    self.stop(now, id, pb::EndCause::NodeFailure, &mut fx);
                }
            }
            Input::Acknowledged(id) => self.acknowledged(id, &mut fx),
        }
        fx
    }

    fn instruction(
        &mut self,
        now: Millis,
        unix_ms: u64,
        kind: pb::instruction::Kind,
        fx: &mut Vec<Effect>,
    ) {
        use pb::instruction::Kind;
        match kind {
            Kind::Launch(l) => self.launch(now, unix_ms, l, fx),
            Kind::Suspend(c) => self.suspend(now, (c.job_id, c.epoch), true, fx),
            Kind::Resume(c) => self.suspend(now, (c.job_id, c.epoch), false, fx),
            Kind::Kill(c) => self.kill(now, (c.job_id, c.epoch), fx),
            Kind::TimeLimit(t) => {
                if let Some(run) = self.runs.get_mut(&(t.job_id, t.epoch)) {
                    run.limit = (t.time_limit_seconds > 0)
                        .then(|| Duration::from_secs(t.time_limit_seconds));
                    fx.push(Effect::Save);
                }
            }
            Kind::Signal(s) => {
                let id = (s.job_id, s.epoch);
                if let Ok(signal) = Signal::try_from(s.signal)
                    && !self.simulated
                    && self.runs.get(&id).is_some_and(|r| r.running && r.started)
                {
                    fx.push(Effect::Signal(id, signal));
                }
            }
            // Steps are the step registry's (crate::steps), not a run's.
            Kind::StepGrant(_) | Kind::StepCancel(_) => {}
        }
    }

    /// The newest epoch this node has had for `job`, running or finished.
    pub fn newest_epoch(&self, job: u64) -> Option<u64> {
        let held = self
            .runs
            .range((job, 0)..=(job, u64::MAX))
            .next_back()
            .map(|((_, e), _)| *e);
        held.max(self.finished.get(&job).copied())
    }

    /// Whether an instruction for `id` is older than the newest run of its job.
    fn stale(&self, (job, epoch): RunId) -> bool {
        self.newest_epoch(job).is_some_and(|e| e > epoch)
    }

    fn launch(&mut self, now: Millis, unix_ms: u64, l: pb::Launch, fx: &mut Vec<Effect>) {
        let id = (l.job_id, l.epoch);
        if self.newest_epoch(l.job_id).is_some_and(|e| e >= l.epoch) {
            return;
        }
        // A newer epoch replaces an older run of the same job, which must not keep running.
        let older: Vec<RunId> = self
            .runs
            .range((l.job_id, 0)..(l.job_id, l.epoch))
            .filter(|(_, r)| r.running)
            .map(|(id, _)| *id)
            .collect();
        for old in older {
            self.stop(now, old, pb::EndCause::Cancelled, fx);
        }
        self.runs.insert(
            id,
            Run {
                started: false,
                running: true,
                ended: None,
                since: now,
                carried: Duration::ZERO,
                limit: (l.time_limit_seconds > 0)
                    .then(|| Duration::from_secs(l.time_limit_seconds)),
                paused: Duration::ZERO,
                suspended_since: None,
                stopping: None,
                kill_at: None,
                sim_runtime: simulated_runtime(&l.script),
                started_unix_ms: unix_ms,
            },
        );
        fx.push(Effect::Save);
        fx.push(Effect::Spawn(id, Box::new(l)));
    }

    fn started(&mut self, now: Millis, id: RunId, unix_ms: u64, fx: &mut Vec<Effect>) {
        let Some(run) = self.runs.get_mut(&id).filter(|r| r.running && !r.started) else {
            return;
        };
        run.started = true;
        fx.push(Effect::Report(pb::JobEvent {
            job_id: id.0,
            epoch: id.1,
            event: Some(pb::job_event::Event::Started(pb::Started {
                time_unix_ms: unix_ms,
            })),
        }));
        // What was asked while it was being started applies now.
        if run.stopping.is_some() {
            self.signal_stopping(now, id, fx);
        } else if run.suspended_since.is_some() && !self.simulated {
            fx.push(Effect::Freeze(id, true));
        }
    }

    fn suspend(&mut self, now: Millis, id: RunId, suspend: bool, fx: &mut Vec<Effect>) {
        if self.stale(id) {
            return;
        }
        let simulated = self.simulated;
        let Some(run) = self.runs.get_mut(&id).filter(|r| r.running) else {
            return;
        };
        let act = run.started && !simulated;
        match (suspend, run.suspended_since) {
            (true, None) => {
                run.suspended_since = Some(now);
                if act {
                    fx.push(Effect::Freeze(id, true));
                }
            }
            (false, Some(since)) => {
                run.paused += Duration::from_millis(now.saturating_sub(since));
                run.suspended_since = None;
                if act {
                    fx.push(Effect::Freeze(id, false));
                }
            }
            _ => return,
        }
        fx.push(Effect::Save);
    }

    fn kill(&mut self, now: Millis, id: RunId, fx: &mut Vec<Effect>) {
        if self.stale(id) {
            return;
        }
        match self.runs.get(&id) {
            Some(r) if r.running => self.stop(now, id, pb::EndCause::Cancelled, fx),
            Some(_) => {}
            // Never held here (the launch never came): it ended, cancelled.
            None => fx.push(Effect::Report(ended_event(
                id,
                pb::Ended {
                    cause: pb::EndCause::Cancelled.into(),
                    ..Default::default()
                },
            ))),
        }
    }

    /// Stops a run: thawed, SIGTERM to every process of it, SIGKILL after the grace. A
    /// simulated run has no processes: it ends at once, as if by the SIGTERM.
    fn stop(&mut self, now: Millis, id: RunId, why: pb::EndCause, fx: &mut Vec<Effect>) {
        let Some(run) = self.runs.get_mut(&id).filter(|r| r.running) else {
            return;
        };
        run.stopping.get_or_insert(why);
        if self.simulated {
            self.ended(
                id,
                Outcome::Exited {
                    code: 0,
                    signal: Signal::SIGTERM as i32,
                },
                Observed::default(),
                fx,
            );
            return;
        }
        fx.push(Effect::Save);
        if run.started {
            self.signal_stopping(now, id, fx);
        }
    }

    /// Thaws a run being stopped, sends it SIGTERM and sets the SIGKILL after the grace.
    fn signal_stopping(&mut self, now: Millis, id: RunId, fx: &mut Vec<Effect>) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        if let Some(since) = run.suspended_since.take() {
            run.paused += Duration::from_millis(now.saturating_sub(since));
            fx.push(Effect::Freeze(id, false));
        }
        fx.push(Effect::Signal(id, Signal::SIGTERM));
        let kill_at = now + self.kill_grace.as_millis() as u64;
        run.kill_at = Some(run.kill_at.map_or(kill_at, |k| k.min(kill_at)));
    }

    fn tick(&mut self, now: Millis, fx: &mut Vec<Effect>) {
        let ids: Vec<RunId> = self
            .runs
            .iter()
            .filter(|(_, r)| r.running)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(run) = self.runs.get_mut(&id) else {
                continue;
            };
            if run.kill_at.is_some_and(|k| k <= now) {
                run.kill_at = None;
                fx.push(Effect::Signal(id, Signal::SIGKILL));
                continue;
            }
            if run.limit_at(now).is_some_and(|t| t <= now) {
                self.stop(now, id, pb::EndCause::Timeout, fx);
                continue;
            }
            if self.simulated && run.sim_end_at(now).is_some_and(|t| t <= now) {
                self.ended(
                    id,
                    Outcome::Exited { code: 0, signal: 0 },
                    Observed::default(),
                    fx,
                );
            }
        }
    }

    /// When the next [`Input::Tick`] has something to do.
    pub fn next_deadline(&self, now: Millis) -> Option<Millis> {
        self.runs
            .values()
            .filter(|r| r.running)
            .flat_map(|r| {
                [
                    r.kill_at,
                    r.limit_at(now),
                    self.simulated.then(|| r.sim_end_at(now)).flatten(),
                ]
            })
            .flatten()
            .min()
    }

    fn ended(&mut self, id: RunId, outcome: Outcome, seen: Observed, fx: &mut Vec<Effect>) {
        let Some(run) = self.runs.get_mut(&id).filter(|r| r.running) else {
            return;
        };
        let mut ended = match outcome {
            Outcome::LaunchFailed(why) => pb::Ended {
                cause: pb::EndCause::LaunchFailed.into(),
                reason: why,
                exit_code: 1,
                ..Default::default()
            },
            Outcome::Lost => pb::Ended {
                cause: run.stopping.unwrap_or(pb::EndCause::NodeFailure).into(),
                signal: Signal::SIGKILL as i32,
                ..Default::default()
            },
            Outcome::Exited { code, signal } => {
                // Slurm's rule: an OOM kill anywhere in the job makes it out of memory,
                // whatever its script returned; a failure with its scratch full is the
                // scratch's.
                let cause = match run.stopping {
                    Some(why) => why,
                    None if seen.oom_killed => pb::EndCause::OutOfMemory,
                    None if code == 0 && signal == 0 => pb::EndCause::Completed,
                    None if seen.jobfs_full => pb::EndCause::JobfsExceeded,
                    None => pb::EndCause::Failed,
                };
                pb::Ended {
                    cause: cause.into(),
                    exit_code: code,
                    signal,
                    ..Default::default()
                }
            }
        };
        ended.cpu_time_ms = seen.cpu_time_ms;
        ended.max_rss_mib = seen.max_rss_mib;
        run.running = false;
        run.kill_at = None;
        run.suspended_since = None;
        run.ended = Some(ended.clone());
        fx.push(Effect::Release(id));
        fx.push(Effect::Save);
        fx.push(Effect::Report(ended_event(id, ended)));
    }

    fn acknowledged(&mut self, id: RunId, fx: &mut Vec<Effect>) {
        if self.runs.get(&id).is_none_or(|r| r.running) {
            return;
        }
        self.runs.remove(&id);
        let newest = self.finished.entry(id.0).or_insert(id.1);
        *newest = (*newest).max(id.1);
        while self.finished.len() > FINISHED_MEMORY {
            self.finished.pop_first();
        }
        fx.push(Effect::Save);
    }

    /// What this node holds, for registration and heartbeats.
    pub fn held(&self) -> Vec<pb::HeldJob> {
        self.runs
            .iter()
            .map(|(&(job_id, epoch), r)| pb::HeldJob {
                job_id,
                epoch,
                running: r.running,
                suspended: r.running && r.suspended_since.is_some(),
            })
            .collect()
    }

    /// Ends not yet acknowledged, to report (again) to a new leader.
    pub fn unreported(&self) -> Vec<pb::JobEvent> {
        self.runs
            .iter()
            .filter_map(|(id, r)| r.ended.clone().map(|e| ended_event(*id, e)))
            .collect()
    }

    pub fn get(&self, id: RunId) -> Option<&Run> {
        self.runs.get(&id)
    }

    /// The runs as the state file keeps them.
    pub fn records(&self, now: Millis) -> Vec<(RunId, RunRecord)> {
        self.runs
            .iter()
            .map(|(id, r)| {
                let suspended = r.suspended_since.map_or(0, |s| now.saturating_sub(s));
                (
                    *id,
                    RunRecord {
                        running: r.running,
                        started: r.started,
                        ended: r.ended.as_ref().map(SavedEnd::from),
                        started_unix_ms: r.started_unix_ms,
                        limit_s: r.limit.map(|l| l.as_secs()),
                        ran_ms: r.ran(now).as_millis() as u64,
                        paused_ms: (r.paused + Duration::from_millis(suspended)).as_millis() as u64,
                        suspended: r.suspended_since.is_some(),
                        stopping: r.stopping.map(|c| c.as_str_name().to_owned()),
                        sim_runtime_ms: r.sim_runtime.map(|d| d.as_millis() as u64),
                    },
                )
            })
            .collect()
    }

    /// Takes on the runs a previous agent recorded, at `now` (`unix_ms` on the wall clock). A
    /// run recorded as running continues: its walltime counts what it had run (the wall clock
    /// since it started, less its suspensions; a suspended one what it had run when
    /// suspended), it stays suspended if it was, and a stop under way goes on (SIGTERM again, SIGKILL after
    /// the grace). The executor then watches each one's processes to their end.
    pub fn restore(
        &mut self,
        now: Millis,
        unix_ms: u64,
        records: Vec<(RunId, RunRecord)>,
        fx: &mut Vec<Effect>,
    ) {
        for (id, s) in records {
            // Running, it ran on while no agent watched (the wall clock since it started, less
            // its suspensions); suspended, it stayed suspended.
            let ran = if s.suspended && s.ran_ms > 0 {
                Duration::from_millis(s.ran_ms)
            } else {
                Duration::from_millis(
                    unix_ms
                        .saturating_sub(s.started_unix_ms)
                        .saturating_sub(s.paused_ms),
                )
            };
            let run = Run {
                started: s.started || s.running,
                running: s.running,
                ended: s.ended.map(pb::Ended::from),
                since: now,
                carried: ran,
                limit: s.limit_s.map(Duration::from_secs),
                paused: Duration::ZERO,
                suspended_since: s.suspended.then_some(now),
                stopping: s.stopping.as_deref().map(stop_reason),
                kill_at: None,
                sim_runtime: s.sim_runtime_ms.map(Duration::from_millis),
                started_unix_ms: s.started_unix_ms,
            };
            let stopping = run.running && run.stopping.is_some();
            self.runs.insert(id, run);
            if stopping && !self.simulated {
                self.signal_stopping(now, id, fx);
            }
        }
    }
}

fn ended_event((job_id, epoch): RunId, ended: pb::Ended) -> pb::JobEvent {
    pb::JobEvent {
        job_id,
        epoch,
        event: Some(pb::job_event::Event::Ended(ended)),
    }
}

/// A simulated run's length: its script's first `sleep N`.
fn simulated_runtime(script: &[u8]) -> Option<Duration> {
    String::from_utf8_lossy(script)
        .lines()
        .filter_map(|line| line.trim().strip_prefix("sleep "))
        .find_map(|n| n.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// A run as the state file keeps it (the executor adds what the run holds).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    pub running: bool,
    #[serde(default)]
    pub started: bool,
    pub ended: Option<SavedEnd>,
    pub started_unix_ms: u64,
    pub limit_s: Option<u64>,
    /// How long it had run when saved, suspension excluded (0 in files from before it was
    /// kept).
    #[serde(default)]
    pub ran_ms: u64,
    pub paused_ms: u64,
    pub suspended: bool,
    pub stopping: Option<String>,
    pub sim_runtime_ms: Option<u64>,
}

/// A run's end as the state file keeps it (its cause by the protocol's name for it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SavedEnd {
    pub cause: String,
    #[serde(default)]
    pub reason: String,
    pub exit_code: i32,
    pub signal: i32,
    pub cpu_time_ms: u64,
    pub max_rss_mib: u64,
}

impl From<&pb::Ended> for SavedEnd {
    fn from(e: &pb::Ended) -> Self {
        SavedEnd {
            cause: e.cause().as_str_name().to_owned(),
            reason: e.reason.clone(),
            exit_code: e.exit_code,
            signal: e.signal,
            cpu_time_ms: e.cpu_time_ms,
            max_rss_mib: e.max_rss_mib,
        }
    }
}

impl From<SavedEnd> for pb::Ended {
    fn from(s: SavedEnd) -> Self {
        pb::Ended {
            // An unknown name (a file from another version) reads as a lost run.
            cause: pb::EndCause::from_str_name(&s.cause)
                .unwrap_or(pb::EndCause::NodeFailure)
                .into(),
            reason: s.reason,
            exit_code: s.exit_code,
            signal: s.signal,
            cpu_time_ms: s.cpu_time_ms,
            max_rss_mib: s.max_rss_mib,
        }
    }
}

/// Why a run is being stopped, from the state file (what is not a timeout, a lost node or a
/// preemption was a cancellation).
fn stop_reason(text: &str) -> pb::EndCause {
    match pb::EndCause::from_str_name(text) {
        Some(c @ (pb::EndCause::Timeout | pb::EndCause::NodeFailure | pb::EndCause::Preempted)) => {
            c
        }
        _ => pb::EndCause::Cancelled,
    }
}

#[cfg(test)]
mod tests;
