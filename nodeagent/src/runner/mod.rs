//! Running jobs on this node: the executor of [`crate::lifecycle`]'s decisions.
//!
//! Every instruction, observed start and exit, clock tick and acknowledgement goes through
//! [`Runs::step`] under one lock; the effects it returns are then carried out here, in order,
//! with that lock released (a freeze that waits on the kernel holds up no other run):
//! spawning a run's processes (`launch`), signalling or freezing them through their cgroup,
//! releasing what a finished run held, reporting to the leader, saving the state file.
//!
//! Real runs are the batch script run as the submitting user by a monitor ([`crate::shim`]),
//! confined in cgroups of their own and controlled through them: the freezer suspends and
//! resumes, every process in the cgroups gets SIGTERM, then SIGKILL after the grace. Only an
//! agent told to confine nothing falls back to the job's process group. Simulated runs occupy
//! their allocation for the script's `sleep N` (or until killed) without a process, for scale
//! tests.
//!
//! On disk, under the state directory (root's, 0711): `state.0` and `state.1`, the two slots
//! of the state file ([`crate::statefile`]), which must outlive a reboot (ends the leader has
//! not acknowledged). Under the runtime directory (root's, 0711; a tmpfs such as `/run`),
//! what lives only as long as the runs it describes: `runs/<job>.<epoch>/`, root's
//! bookkeeping of a run (0700: the monitor's lock, the job's process group and exit, its
//! environment, emptied at the run's end), kept a day after the run ended;
//! `jobs/<job>.<epoch>/`, the job's own directory (root's, 0711; the script and PBS's node
//! file are root's too, lent to the user read-only by an ACL, [`crate::lend`]). A reboot that empties the runtime directory ends the runs too: a
//! restarted agent finds their records gone and reports them lost. Root writes only in its
//! own directories, through their handles ([`crate::rootdir`]), and reads a run's end only
//! from what its monitor recorded there.

mod launch;
mod restore;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use docket_proto::v1 as pb;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::{Notify, mpsc};

use crate::crash::CrashPoint;
use crate::lifecycle::{Effect, Input, Observed, RunId, RunRecord, Runs};
use crate::rootdir::RootDir;
use crate::statefile::StateFile;

/// The state directory's mode: root's, and jobs pass through it to their own directories.
pub const STATE_DIR_MODE: u32 = 0o711;
/// The agent's state file, in the state directory: slots `state.0` and `state.1`.
const STATE_FILE: &str = "state";
/// Root's bookkeeping of each run, `runs/<job>.<epoch>`: nobody else may even look.
const RUNS: &str = "runs";
const RUNS_MODE: u32 = 0o700;
/// Each job's own directory, `jobs/<job>.<epoch>` (root's, 0711): its script and node
/// file, root's and lent to the user read-only. Jobs pass through to theirs; nobody lists
/// the others.
const JOBS: &str = "jobs";
const JOBS_MODE: u32 = 0o711;

/// `cell`'s directory, opened (and checked) at the first call.
fn open_once<'a>(
    cell: &'a std::sync::OnceLock<RootDir>,
    path: &std::path::Path,
) -> std::io::Result<&'a RootDir> {
    if let Some(dir) = cell.get() {
        return Ok(dir);
    }
    let dir = RootDir::open_or_create(path, STATE_DIR_MODE)?;
    Ok(cell.get_or_init(|| dir))
}

/// The directory a run's record `ROOT/runs/<job>.<epoch>` is in: `ROOT`, where its `jobs/`
/// is too.
fn records_root(run_dir: &std::path::Path) -> Option<&std::path::Path> {
    run_dir.parent().and_then(std::path::Path::parent)
}

/// A run's name in `runs/` and `jobs/`.
fn run_name((job, epoch): RunId) -> String {
    format!("{job}.{epoch}")
}

/// How runs execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Real,
    Simulated,
}

/// The runner's settings.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub node: String,
    pub cluster: String,
    pub state_dir: PathBuf,
    /// Where the runs' records and the jobs' directories live (a tmpfs, normally).
    pub runtime_dir: PathBuf,
    pub mode: Mode,
    /// Between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Confinement; None runs jobs unconfined (only when asked for).
    pub cgroups: Option<crate::cgroup::Cgroups>,
    /// The host cpus this agent hands out exclusively, lowest first; empty: no cpusets.
    pub cpu_pool: Vec<u32>,
    /// Most processes one job may have.
    pub pids_max: u64,
    /// The agent's own executable (it is also the job shim).
    pub shim: PathBuf,
    /// Where job scratch is mounted; None: no jobfs (simulated runs).
    pub jobfs: Option<crate::jobfs::Jobfs>,
    /// The node's GPU devices (none in simulated runs).
    pub gpus: crate::gpu::Gpus,
}

/// What a run holds on this node until it is released.
#[derive(Debug, Clone, Default)]
struct Held {
    cgroup: Option<crate::cgroup::JobCgroup>,
    cpus: Vec<u32>,
    gpus: Vec<u32>,
    scratch: Option<crate::jobfs::JobScratch>,
    /// Its monitor process and the directory it records into (real runs).
    monitor: Option<i32>,
    run_dir: Option<PathBuf>,
    /// The job's process group, as its monitor recorded it (used only unconfined).
    pgid: Option<i32>,
    /// What the job's steps start from here (runs this agent started).
    step_base: Option<Arc<crate::steps::StepBase>>,
}

/// The runs of this node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Runner {
    config: Arc<RunnerConfig>,
    /// The decisions, and what each run holds.
    book: Arc<Mutex<Runs>>,
    held: Arc<Mutex<BTreeMap<RunId, Held>>>,
    events: mpsc::UnboundedSender<pb::JobEvent>,
    /// The state file once opened, held from the snapshot of the runs to the end of the
    /// write, so that saves land in the order they were taken: the file never goes back to
    /// an older state.
    saving: Arc<Mutex<Option<StateFile>>>,
    /// The state and runtime directories' handles, once opened.
    state: Arc<std::sync::OnceLock<RootDir>>,
    runtime: Arc<std::sync::OnceLock<RootDir>>,
    /// Ends acknowledged, to prune old run records now and then.
    acknowledged: Arc<std::sync::atomic::AtomicU64>,
    /// The monotonic clock's origin, and the clock task's wake-up (a deadline may have
    /// moved).
    origin: Instant,
    wake: Arc<Notify>,
    /// The steps the leader granted this node.
    steps: Arc<crate::steps::Grants>,
    /// Forks the runs' monitors.
    launcher: Arc<crate::launcher::Launcher>,
}

impl Runner {
    /// A runner; its job events arrive on the returned receiver.
    pub fn new(config: RunnerConfig) -> (Self, mpsc::UnboundedReceiver<pb::JobEvent>) {
        let (events, rx) = mpsc::unbounded_channel();
        let steps = crate::steps::Grants::new(events.clone());
        let book = Runs::new(config.mode == Mode::Simulated, config.kill_grace);
        let launcher = Arc::new(crate::launcher::Launcher::new(
            config.shim.clone(),
            config.state_dir.clone(),
        ));
        (
            Runner {
                launcher,
                config: Arc::new(config),
                book: Arc::new(Mutex::new(book)),
                held: Arc::new(Mutex::new(BTreeMap::new())),
                events,
                saving: Arc::new(Mutex::new(None)),
                state: Arc::new(std::sync::OnceLock::new()),
                runtime: Arc::new(std::sync::OnceLock::new()),
                acknowledged: Arc::new(std::sync::atomic::AtomicU64::new(0)),
                origin: Instant::now(),
                wake: Arc::new(Notify::new()),
                steps,
            },
            rx,
        )
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn holdings(&self) -> std::sync::MutexGuard<'_, BTreeMap<RunId, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Feeds what happened to the state machine and carries out what follows.
    fn step(&self, input: Input) {
        let tick = matches!(input, Input::Tick);
        let effects = self.book().step(self.now(), docket_proto::unix_ms(), input);
        if !tick {
            self.wake.notify_one();
        }
        self.execute(effects);
    }

    fn execute(&self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Save => self.persist(),
                Effect::Spawn(id, launch) => {
                    crate::crash::reached(CrashPoint::LaunchRecorded);
                    match self.config.mode {
                        Mode::Simulated => self.step(Input::Started(id)),
                        Mode::Real => {
                            let this = self.clone();
                            tokio::spawn(async move { this.run_real(id, *launch).await });
                        }
                    }
                }
                Effect::Signal(id, signal) => self.signal_run(id, signal),
                Effect::Freeze(id, frozen) => self.freeze_run(id, frozen),
                Effect::Release(id) => self.release(id),
                Effect::Report(event) => {
                    if matches!(event.event, Some(pb::job_event::Event::Ended(_))) {
                        crate::crash::reached(CrashPoint::ExitRecorded);
                    }
                    let _ = self.events.send(event);
                }
            }
        }
    }

    /// Runs the clock: a tick whenever a walltime, a kill grace or a simulated run's end is
    /// due. Runs until the runtime stops.
    pub async fn clock(self) {
        loop {
            let next = self.book().next_deadline(self.now());
            match next {
                Some(at) => {
                    let wait = Duration::from_millis(at.saturating_sub(self.now()));
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.wake.notified() => {}
                    }
                }
                None => self.wake.notified().await,
            }
            self.step(Input::Tick);
        }
    }

    /// Carries out one instruction. Steps are the step registry's; runs the state machine's.
    pub fn apply(&self, instruction: pb::Instruction) {
        match instruction.kind {
            Some(pb::instruction::Kind::StepGrant(grant)) => {
                let runs_here = self
                    .book()
                    .get((grant.job_id, grant.epoch))
                    .is_some_and(|r| r.running());
                if runs_here {
                    self.steps.grant(grant);
                } else {
                    tracing::debug!(
                        job = grant.job_id,
                        epoch = grant.epoch,
                        step = grant.step_id,
                        "a step of a run not running here"
                    );
                }
            }
            Some(pb::instruction::Kind::StepCancel(c)) => {
                self.steps.cancel(c.job_id, c.epoch, c.step_id)
            }
            Some(kind) => self.step(Input::Instruction(Box::new(kind))),
            None => {}
        }
    }

    /// The step I/O service of this node's runs (srun's way to its tasks).
    pub fn step_service(
        &self,
    ) -> docket_proto::v1::step_io_server::StepIoServer<crate::steps::serve::StepIoService> {
        crate::steps::serve::StepIoService::new(
            Arc::new(self.clone()),
            self.steps.clone(),
            self.config.node.clone(),
            self.config.shim.clone(),
            self.config.kill_grace,
        )
    }

    /// What this node holds, for registration and heartbeats.
    pub fn held(&self) -> Vec<pb::HeldJob> {
        self.book().held()
    }

    /// Ends not yet acknowledged, to report (again) to a new leader.
    pub fn unreported(&self) -> Vec<pb::JobEvent> {
        self.book().unreported()
    }

    /// The leader recorded the end of (job, epoch): forget the run.
    pub fn acknowledged(&self, job: u64, epoch: u64) {
        self.step(Input::Acknowledged((job, epoch)));
        let n = self
            .acknowledged
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n % restore::PRUNE_EVERY == restore::PRUNE_EVERY - 1 {
            self.prune_run_records();
        }
    }

    /// Stops every running job (the fence: no leader for too long).
    pub fn fence(&self) {
        self.step(Input::Fence);
    }

    /// Sends `signal` to every process of a run: through its cgroups when confined (what is in
    /// them is the job, whatever process groups or sessions it made); to its process group, as
    /// the monitor recorded it, only when the agent confines nothing. A suspended run keeps
    /// the signal pending until it is resumed.
    fn signal_run(&self, id: RunId, signal: Signal) {
        let Some(held) = self.holdings().get(&id).cloned() else {
            return;
        };
        match &held.cgroup {
            Some(cg) => {
                let suspended = self.book().get(id).is_some_and(|r| r.suspended());
                if let Err(e) = cg.signal_all(signal, suspended) {
                    tracing::error!(job = id.0, error = %e, ?signal, "signalling a job's cgroup");
                }
            }
            None => signal_group(held.pgid, signal),
        }
    }

    /// Freezes or thaws a run: with the cgroup freezer when confined (a failure is an error,
    /// never a quiet fall back to signals a job can catch or undo); with SIGSTOP/SIGCONT to its
    /// process group only when the agent confines nothing.
    fn freeze_run(&self, id: RunId, frozen: bool) {
        let Some(held) = self.holdings().get(&id).cloned() else {
            return;
        };
        match &held.cgroup {
            Some(cg) => {
                if let Err(e) = cg.freeze(frozen) {
                    tracing::error!(job = id.0, error = %e, frozen, "the cgroup freezer failed");
                }
            }
            None => signal_group(
                held.pgid,
                if frozen {
                    Signal::SIGSTOP
                } else {
                    Signal::SIGCONT
                },
            ),
        }
    }

    /// What a run's cgroup and scratch show as it ends.
    fn observe(&self, id: RunId) -> Observed {
        let held = self.holdings().get(&id).cloned().unwrap_or_default();
        let mut seen = Observed {
            jobfs_full: held.scratch.as_ref().is_some_and(|s| s.full()),
            ..Observed::default()
        };
        if let Some(cg) = &held.cgroup {
            seen.oom_killed = cg.oom_killed();
            seen.cpu_time_ms = cg.cpu_time_ms();
            seen.max_rss_mib = cg.peak_memory_mib();
        }
        seen
    }

    /// Frees what a finished run held: its cgroup first (once it is empty nothing of the job
    /// holds its scratch), then its scratch, its cpus and GPUs, and its directories.
    fn release(&self, id: RunId) {
        self.steps.forget_job(id.0, id.1);
        let Some(held) = self.holdings().remove(&id) else {
            return;
        };
        if let Some(cg) = &held.cgroup {
            cg.remove();
        }
        if let Some(scratch) = &held.scratch {
            scratch.remove();
        }
        self.remove_directories(id, held.run_dir.as_deref());
    }

    /// Takes `n` free cpus of the pool for run `id` (lowest first). Fewer than `n` free (an
    /// agent declaring more cpus than it owns, for tests): no exclusive set.
    fn take_cpus(&self, id: RunId, n: u32) -> Vec<u32> {
        let mut held = self.holdings();
        let used: std::collections::BTreeSet<u32> =
            held.values().flat_map(|h| h.cpus.iter().copied()).collect();
        let free: Vec<u32> = self
            .config
            .cpu_pool
            .iter()
            .copied()
            .filter(|c| !used.contains(c))
            .take(n as usize)
            .collect();
        if free.len() < n as usize {
            return Vec::new();
        }
        held.entry(id).or_default().cpus = free.clone();
        free
    }

    /// Takes `n` free GPUs for run `id` (lowest indices first); fewer free is a launch failure
    /// (the leader counts GPUs as it counts cpus, so this means the two disagree).
    fn take_gpus(&self, id: RunId, n: u32) -> Result<Vec<u32>, String> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut held = self.holdings();
        let used: std::collections::BTreeSet<u32> =
            held.values().flat_map(|h| h.gpus.iter().copied()).collect();
        let free: Vec<u32> = (0..self.config.gpus.count())
            .filter(|g| !used.contains(g))
            .take(n as usize)
            .collect();
        if free.len() < n as usize {
            return Err(format!(
                "gpus: {n} asked, {} free of this node's {}",
                free.len(),
                self.config.gpus.count()
            ));
        }
        held.entry(id).or_default().gpus = free.clone();
        Ok(free)
    }

    /// Records what run `id` holds (and saves it, so a restarted agent finds it).
    fn hold(&self, id: RunId, change: impl FnOnce(&mut Held)) {
        change(self.holdings().entry(id).or_default());
        self.persist();
    }

    /// The state directory, opened (and checked) once: every save writes through it.
    fn state_dir(&self) -> std::io::Result<&RootDir> {
        open_once(&self.state, &self.config.state_dir)
    }

    /// The runtime directory, opened (and checked) once: `runs/` and `jobs/` are in it.
    fn runtime_dir(&self) -> std::io::Result<&RootDir> {
        open_once(&self.runtime, &self.config.runtime_dir)
    }

    /// The directory holding the `runs/` and `jobs/` of the run recorded in `run_dir`: the
    /// state directory for a run re-adopted from an agent that kept them there, else the
    /// runtime directory.
    fn root_of(&self, run_dir: Option<&std::path::Path>) -> std::io::Result<&RootDir> {
        if run_dir.and_then(records_root) == Some(self.config.state_dir.as_path()) {
            self.state_dir()
        } else {
            self.runtime_dir()
        }
    }

    /// Writes every run to the state file (atomically), so a restarted agent finds them.
    fn persist(&self) {
        if let Err(e) = self.save() {
            tracing::error!(error = %e, "saving the agent state");
        }
    }

    /// Writes the runs to the state file (atomically, in the order saves are asked for).
    fn save(&self) -> std::io::Result<()> {
        let mut saving = self.saving.lock().unwrap_or_else(|p| p.into_inner());
        let records = self.book().records(self.now());
        let held = self.holdings().clone();
        let saved: Vec<SavedRun> = records
            .into_iter()
            .map(|((job, epoch), record)| {
                let h = held.get(&(job, epoch)).cloned().unwrap_or_default();
                SavedRun {
                    job,
                    epoch,
                    record,
                    monitor: h.monitor,
                    pgid: h.pgid,
                    run_dir: h.run_dir,
                    cgroup: h.cgroup,
                    scratch: h.scratch,
                    cpus: h.cpus,
                    gpus: h.gpus,
                    step_base: h.step_base.as_deref().cloned(),
                }
            })
            .collect();
        let text = serde_json::to_vec(&saved)?;
        let dir = self.state_dir()?;
        let file = match saving.as_mut() {
            Some(file) => file,
            None => saving.insert(StateFile::open(dir, STATE_FILE)?.0),
        };
        file.save(dir, &text)
    }

    /// Opens the state file and returns what it holds (None: nothing, or unreadable).
    fn load(&self) -> Option<Vec<u8>> {
        let mut saving = self.saving.lock().unwrap_or_else(|p| p.into_inner());
        let opened = self
            .state_dir()
            .and_then(|dir| StateFile::open(dir, STATE_FILE));
        match opened {
            Ok((file, saved)) => {
                *saving = Some(file);
                saved
            }
            Err(e) => {
                tracing::error!(error = %e, "opening the agent state file");
                None
            }
        }
    }
}

fn signal_group(pgid: Option<i32>, signal: Signal) {
    if let Some(pgid) = pgid
        && let Err(e) = killpg(Pid::from_raw(pgid), signal)
        && e != nix::errno::Errno::ESRCH
    {
        tracing::warn!(pgid, ?signal, error = %e, "signalling a job's process group");
    }
}

/// `0-3,8` from sorted cpu ids.
fn cpu_list(cpus: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// A run as the state file keeps it: its state, and what it holds.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SavedRun {
    job: u64,
    epoch: u64,
    #[serde(flatten)]
    record: RunRecord,
    monitor: Option<i32>,
    pgid: Option<i32>,
    run_dir: Option<PathBuf>,
    cgroup: Option<crate::cgroup::JobCgroup>,
    scratch: Option<crate::jobfs::JobScratch>,
    cpus: Vec<u32>,
    #[serde(default)]
    gpus: Vec<u32>,
    /// What its steps start from (absent in a state file written before steps were kept).
    #[serde(default)]
    step_base: Option<crate::steps::StepBase>,
}

/// How long a step waits for its run's preparation to finish on this node.
const STEP_BASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl crate::steps::serve::Jobs for Runner {
    fn step_context(
        &self,
        job: u64,
        epoch: u64,
    ) -> Result<crate::steps::serve::StepContext, String> {
        let node = &self.config.node;
        match self.book().get((job, epoch)) {
            Some(r) if r.suspended() => {
                return Err(format!("job {job} is suspended on node {node}"));
            }
            Some(r) if r.stopping() => {
                return Err(format!("job {job} is being stopped on node {node}"));
            }
            Some(r) if r.running() => {}
            _ => return Err(format!("job {job} does not run on node {node}")),
        }
        // A run the controller already counts as started may still be being prepared here
        // (its cgroups and environment, on the blocking pool): a step that comes that early
        // (`salloc` then `srun` at once) waits for it, briefly. Called on a blocking thread.
        let deadline = std::time::Instant::now() + STEP_BASE_WAIT;
        let held = loop {
            let held = self
                .holdings()
                .get(&(job, epoch))
                .cloned()
                .unwrap_or_default();
            if held.step_base.is_some() || std::time::Instant::now() >= deadline {
                break held;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        };
        let base = held.step_base.ok_or_else(|| {
            format!(
                "the agent of node {node} restarted since job {job} started there; it starts no \
                 steps for it"
            )
        })?;
        Ok(crate::steps::serve::StepContext {
            base,
            cgroup: held.cgroup,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(job: u64) -> pb::Instruction {
        pb::Instruction {
            kind: Some(pb::instruction::Kind::Launch(pb::Launch {
                job_id: job,
                epoch: 1,
                script: b"#!/bin/sh\nsleep 600\n".to_vec(),
                cpus: 1,
                ..Default::default()
            })),
        }
    }

    /// Launches from many threads at once: every save is whole and the file ends with the
    /// newest state (with a save's snapshot and its rename not serialized, an older snapshot
    /// could be renamed over a newer one, and two saves shared the temporary file).
    #[test]
    fn concurrent_saves_leave_the_newest_state() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (runner, _events) = Runner::new(RunnerConfig {
            node: "n01".into(),
            cluster: "test".into(),
            state_dir: dir.path().to_path_buf(),
            runtime_dir: dir.path().join("run"),
            mode: Mode::Simulated,
            kill_grace: Duration::from_secs(1),
            cgroups: None,
            cpu_pool: Vec::new(),
            pids_max: 64,
            shim: PathBuf::from("/bin/false"),
            jobfs: None,
            gpus: crate::gpu::Gpus::default(),
        });
        let (threads, each) = (8u64, 40u64);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (runner, handle) = (runner.clone(), rt.handle().clone());
                s.spawn(move || {
                    let _entered = handle.enter();
                    for i in 0..each {
                        runner.apply(launch(1 + t * each + i));
                        // And saves with nothing new, as a stream of reports causes.
                        for _ in 0..5 {
                            runner.save().expect("a save failed");
                        }
                    }
                });
            }
        });
        let state = RootDir::open(dir.path(), STATE_DIR_MODE).unwrap();
        let text = StateFile::open(&state, STATE_FILE).unwrap().1.unwrap();
        let saved: Vec<SavedRun> = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            saved.len() as u64,
            threads * each,
            "the file went back to an older state"
        );
        drop(rt);
    }
}
