//! Running jobs on this node: launch, walltime, suspend/resume, kill, and what ended.
//!
//! Every run is a (job, epoch). An instruction for an older epoch than the one held for that
//! job is refused, a launch of a run already held is ignored, so nothing sent twice runs
//! twice. A run's end is kept until the leader has acknowledged its report (an agent that
//! loses its leader reports it to the next one).
//!
//! Real runs are the batch script run as the submitting user by a monitor ([`crate::shim`]),
//! confined in cgroups of their own and controlled through them: the freezer suspends and
//! resumes (walltime stops meanwhile), every process in the cgroups gets SIGTERM, then SIGKILL
//! after the grace, to kill or at the time limit. Only an agent told to confine nothing falls
//! back to the job's process group. Simulated runs occupy their allocation for the script's
//! `sleep N` (or until killed) without a process, for scale tests.
//!
//! On disk, under the state directory (root's, 0711): `state.json`; `runs/<job>.<epoch>/`,
//! root's bookkeeping of a run (0700: the monitor's lock, the job's process group and exit,
//! its environment); `jobs/<job>.<epoch>/`, the job's own directory (root's, 0711; the
//! script and PBS's node file are the user's). Root writes only in its own directories, through their handles
//! ([`crate::rootdir`]), and reads a run's end only from what its monitor recorded there.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use docket_proto::v1 as pb;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::{Notify, mpsc};

use crate::crash::CrashPoint;
use crate::rootdir::RootDir;
use crate::shim::Monitor;
use crate::world;

/// The state directory's mode: root's, and jobs pass through it to their own directories.
pub const STATE_DIR_MODE: u32 = 0o711;
/// Root's bookkeeping of each run, `runs/<job>.<epoch>`: nobody else may even look.
const RUNS: &str = "runs";
const RUNS_MODE: u32 = 0o700;
/// Each job's own directory, `jobs/<job>.<epoch>` (root's, 0711): its script and node
/// file, which are the user's. Jobs pass through to theirs; nobody lists the others.
const JOBS: &str = "jobs";
const JOBS_MODE: u32 = 0o711;
const SCRIPT: &str = "script";
const NODEFILE: &str = "nodefile";
/// In a run's directory: the job's environment, and the monitor's own messages.
const ENVIRON: &str = "environ";
const MONITOR_LOG: &str = "monitor.log";
/// How long a finished run's record stays in `runs/` (fault drills read them minutes after).
const RUN_RECORD_KEEP: Duration = Duration::from_secs(24 * 3600);
/// Old records are looked for at start and after every this many acknowledged ends.
const PRUNE_EVERY: u64 = 512;
/// The agent's state file, in the state directory.
const STATE_FILE: &str = "state.json";

/// A run's name in `runs/` and `jobs/`.
fn run_name(job: u64, epoch: u64) -> String {
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

#[derive(Debug)]
struct Run {
    epoch: u64,
    pgid: Option<i32>,
    running: bool,
    ended: Option<pb::Ended>,
    started: Instant,
    /// Walltime: the limit, and how long the run has been suspended (not counted).
    limit: Option<Duration>,
    paused: Duration,
    suspended_since: Option<Instant>,
    /// Why it is being stopped (cancelled, timeout, node_failure), if it is.
    stopping: Option<pb::EndCause>,
    /// Its cgroups, when confined.
    cgroup: Option<crate::cgroup::JobCgroup>,
    /// The cpus it holds from the pool.
    cpus: Vec<u32>,
    /// The GPUs it holds (node indices).
    gpus: Vec<u32>,
    /// Its scratch, when it has one.
    scratch: Option<crate::jobfs::JobScratch>,
    /// Wakes the run's walltime watcher when its limit or suspension changes.
    changed: Arc<Notify>,
    /// Its monitor process (real runs) and the directory it records into.
    monitor: Option<i32>,
    run_dir: Option<PathBuf>,
    /// A simulated run's length (its script's `sleep N`), None: until stopped.
    sim_runtime: Option<Duration>,
    /// When it started, on the wall clock (for a restarted agent).
    started_unix_ms: u64,
}

impl Run {
    /// Time left before the limit, suspension excluded; None when unlimited or suspended.
    fn remaining(&self, now: Instant) -> Option<Duration> {
        if self.suspended_since.is_some() {
            return None;
        }
        let limit = self.limit?;
        let ran = now.duration_since(self.started).saturating_sub(self.paused);
        Some(limit.saturating_sub(ran))
    }
}

/// The newest epoch of runs that ended and were acknowledged, per job, so a late or repeated
/// launch of a finished run is still refused. Bounded: the oldest job ids go first.
const FINISHED_MEMORY: usize = 100_000;

/// The runs of this node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Runner {
    config: Arc<RunnerConfig>,
    runs: Arc<Mutex<BTreeMap<u64, Run>>>,
    finished: Arc<Mutex<BTreeMap<u64, u64>>>,
    events: mpsc::UnboundedSender<pb::JobEvent>,
    /// Held from the snapshot of the runs to the rename of the state file, so that saves
    /// land in the order they were taken: the file never goes back to an older state, and
    /// two saves never share the temporary file.
    saving: Arc<Mutex<()>>,
    /// The state directory's handle, once opened.
    state: Arc<std::sync::OnceLock<RootDir>>,
    /// Ends acknowledged, to prune old run records now and then.
    acknowledged: Arc<std::sync::atomic::AtomicU64>,
}

impl Runner {
    /// A runner; its job events arrive on the returned receiver.
    pub fn new(config: RunnerConfig) -> (Self, mpsc::UnboundedReceiver<pb::JobEvent>) {
        let (events, rx) = mpsc::unbounded_channel();
        (
            Runner {
                config: Arc::new(config),
                runs: Arc::new(Mutex::new(BTreeMap::new())),
                finished: Arc::new(Mutex::new(BTreeMap::new())),
                events,
                saving: Arc::new(Mutex::new(())),
                state: Arc::new(std::sync::OnceLock::new()),
                acknowledged: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            },
            rx,
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Run>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What this node holds, for registration and heartbeats.
    pub fn held(&self) -> Vec<pb::HeldJob> {
        self.lock()
            .iter()
            .map(|(id, r)| pb::HeldJob {
                job_id: *id,
                epoch: r.epoch,
                running: r.running,
            })
            .collect()
    }

    /// Ends not yet acknowledged, to report (again) to a new leader.
    pub fn unreported(&self) -> Vec<pb::JobEvent> {
        self.lock()
            .iter()
            .filter_map(|(id, r)| {
                r.ended.clone().map(|e| pb::JobEvent {
                    job_id: *id,
                    epoch: r.epoch,
                    event: Some(pb::job_event::Event::Ended(e)),
                })
            })
            .collect()
    }

    /// The leader recorded the end of (job, epoch): forget the run.
    pub fn acknowledged(&self, job: u64, epoch: u64) {
        let mut runs = self.lock();
        if runs
            .get(&job)
            .is_some_and(|r| r.epoch == epoch && !r.running)
        {
            runs.remove(&job);
            let mut finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
            finished.insert(job, epoch);
            while finished.len() > FINISHED_MEMORY {
                finished.pop_first();
            }
            drop(finished);
            drop(runs);
            self.persist();
            let n = self
                .acknowledged
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n % PRUNE_EVERY == PRUNE_EVERY - 1 {
                self.prune_run_records();
            }
        }
    }

    /// Removes the records (`runs/<job>.<epoch>`) of runs not held here that ended more than
    /// [`RUN_RECORD_KEEP`] ago, so a node running millions of jobs does not keep them all.
    fn prune_run_records(&self) {
        if self.config.mode == Mode::Simulated {
            return;
        }
        let held: std::collections::BTreeSet<String> = self
            .lock()
            .iter()
            .map(|(job, r)| run_name(*job, r.epoch))
            .collect();
        let Ok(runs) = self
            .state_dir()
            .and_then(|s| s.open_subdir(RUNS, RUNS_MODE))
        else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(runs.path()) else {
            return;
        };
        let now = std::time::SystemTime::now();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > RUN_RECORD_KEEP);
            if old
                && !held.contains(&name)
                && let Err(e) = runs.remove_tree(&name)
            {
                tracing::warn!(error = %e, "removing an old run record");
            }
        }
    }

    /// The newest epoch this node has had for `job`, running or finished.
    fn newest_epoch(&self, job: u64) -> Option<u64> {
        let running = self.lock().get(&job).map(|r| r.epoch);
        let finished = self
            .finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&job)
            .copied();
        running.max(finished)
    }

    /// The state directory, opened (and checked) once: every save writes through it.
    fn state_dir(&self) -> std::io::Result<&RootDir> {
        if let Some(dir) = self.state.get() {
            return Ok(dir);
        }
        let dir = RootDir::open_or_create(&self.config.state_dir, STATE_DIR_MODE)?;
        Ok(self.state.get_or_init(|| dir))
    }

    /// Writes every run to the state file (atomically), so a restarted agent finds them.
    fn persist(&self) {
        if let Err(e) = self.save() {
            tracing::error!(error = %e, "saving the agent state");
        }
    }

    /// Writes the runs to the state file (atomically, in the order saves are asked for).
    fn save(&self) -> std::io::Result<()> {
        let _saving = self.saving.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let saved: Vec<SavedRun> = self
            .lock()
            .iter()
            .map(|(job, r)| SavedRun {
                job: *job,
                epoch: r.epoch,
                running: r.running,
                ended: r.ended.as_ref().map(SavedEnd::from),
                started_unix_ms: r.started_unix_ms,
                limit_s: r.limit.map(|l| l.as_secs()),
                paused_ms: (r.paused
                    + r.suspended_since
                        .map_or(Duration::ZERO, |s| now.duration_since(s)))
                .as_millis() as u64,
                suspended: r.suspended_since.is_some(),
                stopping: r.stopping.map(|c| c.as_str_name().to_owned()),
                monitor: r.monitor,
                pgid: r.pgid,
                run_dir: r.run_dir.clone(),
                cgroup: r.cgroup.clone(),
                scratch: r.scratch.clone(),
                cpus: r.cpus.clone(),
                gpus: r.gpus.clone(),
                sim_runtime_ms: r.sim_runtime.map(|d| d.as_millis() as u64),
            })
            .collect();
        let text = serde_json::to_vec(&saved)?;
        self.state_dir()?.write_atomically(STATE_FILE, &text)
    }

    /// Reads the state file a previous agent left and re-adopts its runs: ends not yet
    /// reported are reported; runs whose monitor still lives are watched to their end (with
    /// their walltime); runs whose monitor is gone without a recorded exit are reported as
    /// node failures. Returns the cgroup names and scratch mounts to keep when reaping.
    pub fn restore(
        &self,
    ) -> (
        std::collections::BTreeSet<String>,
        std::collections::BTreeSet<PathBuf>,
    ) {
        let mut keep_cgroups = std::collections::BTreeSet::new();
        let mut keep_scratch = std::collections::BTreeSet::new();
        let text = match self.state_dir() {
            Ok(dir) => dir.read_text(STATE_FILE),
            Err(e) => {
                tracing::error!(error = %e, "the state directory");
                None
            }
        };
        let Some(text) = text else {
            self.reap_directories();
            return (keep_cgroups, keep_scratch);
        };
        let saved: Vec<SavedRun> = match serde_json::from_str(&text) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "the agent state file is unreadable; starting afresh");
                self.reap_directories();
                return (keep_cgroups, keep_scratch);
            }
        };
        let now = Instant::now();
        let now_unix = now_ms();
        for s in saved {
            let ago = Duration::from_millis(now_unix.saturating_sub(s.started_unix_ms));
            let changed = Arc::new(Notify::new());
            let run = Run {
                epoch: s.epoch,
                pgid: s.pgid,
                running: s.running,
                ended: s.ended.map(pb::Ended::from),
                started: now.checked_sub(ago).unwrap_or(now),
                limit: s.limit_s.map(Duration::from_secs),
                paused: Duration::from_millis(s.paused_ms),
                suspended_since: s.suspended.then_some(now),
                stopping: s.stopping.as_deref().map(stop_reason),
                changed: changed.clone(),
                cgroup: s.cgroup.clone(),
                cpus: s.cpus.clone(),
                gpus: s.gpus.clone(),
                scratch: s.scratch.clone(),
                monitor: s.monitor,
                run_dir: s.run_dir.clone(),
                sim_runtime: s.sim_runtime_ms.map(Duration::from_millis),
                started_unix_ms: s.started_unix_ms,
            };
            if !s.running {
                self.lock().insert(s.job, run);
                continue;
            }
            if let Some(cg) = &s.cgroup {
                keep_cgroups.insert(format!("job_{}_{}", s.job, s.epoch));
                let _ = cg;
            }
            if let Some(sc) = &s.scratch {
                keep_scratch.insert(sc.path.clone());
            }
            self.lock().insert(s.job, run);
            tracing::info!(job = s.job, epoch = s.epoch, "re-adopting a run");
            let (job, epoch) = (s.job, s.epoch);
            let this = self.clone();
            match (self.config.mode, s.monitor, s.run_dir) {
                (Mode::Simulated, _, _) => {
                    tokio::spawn(async move {
                        let status = this.simulate(job, epoch).await;
                        this.finish(job, epoch, Ok(status));
                    });
                }
                (Mode::Real, _, Some(dir)) => {
                    tokio::spawn(async move { this.readopt(job, epoch, &dir).await });
                }
                (Mode::Real, _, None) => {
                    // Nothing was started for it (its run directory is recorded first): lost.
                    if let Some(r) = self.lock().get_mut(&job) {
                        r.stopping = Some(pb::EndCause::NodeFailure);
                    }
                    use std::os::unix::process::ExitStatusExt;
                    self.finish(job, epoch, Ok(std::process::ExitStatus::from_raw(9)));
                    continue;
                }
            }
            let this = self.clone();
            tokio::spawn(async move { this.watch_walltime(job, epoch, changed).await });
        }
        self.reap_directories();
        (keep_cgroups, keep_scratch)
    }

    /// Removes the job directories of runs this agent no longer holds running (an agent that
    /// died between recording an end and removing them leaves some), and old run records.
    fn reap_directories(&self) {
        self.prune_run_records();
        let keep: std::collections::BTreeSet<String> = self
            .lock()
            .iter()
            .filter(|(_, r)| r.running)
            .map(|(job, r)| run_name(*job, r.epoch))
            .collect();
        let Ok(jobs) = self
            .state_dir()
            .and_then(|s| s.open_subdir(JOBS, JOBS_MODE))
        else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(jobs.path()) else {
            return;
        };
        for e in entries.flatten() {
            let entry = e.file_name().to_string_lossy().into_owned();
            if !keep.contains(&entry)
                && let Err(e) = jobs.remove_tree(&entry)
            {
                tracing::warn!(error = %e, "removing a stale job directory");
            }
        }
    }

    /// Removes what a finished run no longer needs: the job's own directory and the copy of
    /// its environment. The run's record (`runs/<job>.<epoch>`: whether its monitor started
    /// it, or it was abandoned, and how it ended) stays, for fault drills to check launches
    /// against.
    fn remove_directories(&self, job: u64, epoch: u64) {
        if self.config.mode == Mode::Simulated {
            return;
        }
        let Ok(state) = self.state_dir() else { return };
        let name = run_name(job, epoch);
        if let Ok(jobs) = state.open_subdir(JOBS, JOBS_MODE)
            && let Err(e) = jobs.remove_tree(&name)
        {
            tracing::warn!(job, epoch, error = %e, "removing a finished job's directory");
        }
        if let Ok(run) = state
            .open_subdir(RUNS, RUNS_MODE)
            .and_then(|runs| runs.open_subdir(&name, crate::shim::RUN_DIR_MODE))
        {
            let _ = run.remove_file(ENVIRON);
        }
    }

    /// Carries out one instruction.
    pub fn apply(&self, instruction: pb::Instruction) {
        match instruction.kind {
            Some(pb::instruction::Kind::Launch(l)) => self.launch(l),
            Some(pb::instruction::Kind::Suspend(c)) => self.suspend(&c, true),
            Some(pb::instruction::Kind::Resume(c)) => self.suspend(&c, false),
            Some(pb::instruction::Kind::Kill(c)) => self.kill(&c),
            Some(pb::instruction::Kind::TimeLimit(t)) => self.time_limit(&t),
            Some(pb::instruction::Kind::Signal(s)) => self.signal(&s),
            None => {}
        }
    }

    /// Whether an instruction for (job, epoch) is older than the newest run of that job.
    fn stale(&self, job: u64, epoch: u64) -> bool {
        self.newest_epoch(job).is_some_and(|e| e > epoch)
    }

    fn launch(&self, l: pb::Launch) {
        let (job, epoch) = (l.job_id, l.epoch);
        if let Some(newest) = self.newest_epoch(job)
            && newest >= epoch
        {
            tracing::debug!(
                job,
                epoch,
                newest,
                "launch of a run already had or older: ignored"
            );
            return;
        }
        // A newer epoch replaces an older run of the same job, which must not keep running.
        let old = self.lock().get(&job).filter(|r| r.running).map(|r| r.epoch);
        if let Some(old) = old {
            self.stop(job, old, pb::EndCause::Cancelled);
        }
        let changed = Arc::new(Notify::new());
        let limit = (l.time_limit_seconds > 0).then(|| Duration::from_secs(l.time_limit_seconds));
        self.lock().insert(
            job,
            Run {
                epoch,
                pgid: None,
                running: true,
                ended: None,
                started: Instant::now(),
                limit,
                paused: Duration::ZERO,
                suspended_since: None,
                stopping: None,
                changed: changed.clone(),
                cgroup: None,
                cpus: Vec::new(),
                gpus: Vec::new(),
                scratch: None,
                monitor: None,
                run_dir: None,
                sim_runtime: simulated_runtime(&l.script),
                started_unix_ms: now_ms(),
            },
        );
        self.persist();
        crate::crash::reached(CrashPoint::LaunchRecorded);
        let this = self.clone();
        tokio::spawn(async move {
            let outcome = match this.config.mode {
                Mode::Real => this.run_real(&l).await,
                Mode::Simulated => this.run_simulated(&l).await,
            };
            this.finish(job, epoch, outcome);
        });
        let this = self.clone();
        tokio::spawn(async move { this.watch_walltime(job, epoch, changed).await });
    }

    /// Runs the batch script and waits for it; `Err` is a launch failure.
    async fn run_real(&self, l: &pb::Launch) -> Result<std::process::ExitStatus, String> {
        let user = nix::unistd::User::from_name(&l.user)
            .map_err(|e| format!("looking up user {}: {e}", l.user))?
            .ok_or_else(|| format!("user {} does not exist on this node", l.user))?;
        let me = nix::unistd::geteuid();
        if !me.is_root() && me != user.uid {
            return Err(format!(
                "this agent runs as uid {me}, so it cannot run jobs as {} (uid {})",
                l.user, user.uid
            ));
        }
        let (uid, gid) = (user.uid.as_raw(), user.gid.as_raw());
        let name = run_name(l.job_id, l.epoch);
        let fail = |what: &str| {
            let what = what.to_owned();
            move |e: std::io::Error| format!("{what}: {e}")
        };
        let state = self.state_dir().map_err(fail("the state directory"))?;
        // Root's bookkeeping for the run: the monitor's lock, the job's process group and exit.
        let run_dir = state
            .subdir(RUNS, RUNS_MODE)
            .and_then(|runs| runs.fresh_subdir(&name, crate::shim::RUN_DIR_MODE))
            .map_err(fail("the run's directory"))?;
        // The job's own directory: root's (0711, so the job cannot fill it or grow a tree in
        // it root would have to remove), its files the user's.
        let job_dir = state
            .subdir(JOBS, JOBS_MODE)
            .and_then(|jobs| jobs.fresh_subdir(&name, 0o711))
            .map_err(fail("the job's directory"))?;
        job_dir
            .write_new(SCRIPT, &l.script, 0o500)
            .and_then(|f| crate::rootdir::give_file(&f, uid, gid))
            .map_err(fail("writing the script"))?;
        job_dir
            .write_new(
                NODEFILE,
                world::nodefile_contents(l, &self.config.node).as_bytes(),
                0o400,
            )
            .and_then(|f| crate::rootdir::give_file(&f, uid, gid))
            .map_err(fail("writing the node file"))?;
        let script = job_dir.path().join(SCRIPT);
        let nodefile = job_dir.path().join(NODEFILE);
        let (stdout, stderr) = world::output_paths(l, &self.config.node);
        let who = world::Identity {
            user: l.user.clone(),
            home: user.dir.display().to_string(),
            shell: user.shell.display().to_string(),
        };
        let scratch = match &self.config.jobfs {
            Some(jobfs) if l.jobfs_mib > 0 => {
                let s = jobfs
                    .create(l.job_id, l.epoch, l.jobfs_mib, uid, gid)
                    .map_err(|e| e.to_string())?;
                if let Some(r) = self.lock().get_mut(&l.job_id) {
                    r.scratch = Some(s.clone());
                }
                Some(s)
            }
            _ => None,
        };
        let gpus = self.take_gpus(l.job_id, l.gpus)?;
        let constrained = self
            .config
            .cgroups
            .as_ref()
            .is_some_and(|c| c.constrains_devices());
        let mut env = world::environment(
            l,
            &self.config.node,
            &who,
            &nodefile,
            scratch.as_ref().map(|s| s.path.as_path()),
            &self.config.cluster,
        );
        env.extend(
            crate::gpu::environment(&gpus, constrained)
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v)),
        );
        run_dir
            .write_new(ENVIRON, &crate::shim::encode_environment(&env), 0o600)
            .map_err(fail("writing the job's environment"))?;
        // Confinement: the job's cgroups, which the shim joins before it becomes the user.
        let mut join = Vec::new();
        if let Some(cgroups) = &self.config.cgroups {
            let cpus = self.take_cpus(l.job_id, l.cpus);
            let limits = crate::cgroup::Limits {
                cpus: (!cpus.is_empty()).then(|| cpu_list(&cpus)),
                memory_bytes: (l.memory_mib > 0).then_some(l.memory_mib << 20),
                vmem_bytes: l.vmem_mib.map(|v| v << 20),
                pids: Some(self.config.pids_max),
                denied_devices: self.config.gpus.denied(&gpus),
            };
            let cg = cgroups
                .create(l.job_id, l.epoch, &limits)
                .map_err(|e| format!("confining the job: {e}"))?;
            join = cg.procs_files();
            if let Some(r) = self.lock().get_mut(&l.job_id) {
                r.cgroup = Some(cg);
            }
        }
        let mut command: Vec<String> = Vec::new();
        if !l.script.starts_with(b"#!") {
            command.push("/bin/sh".into());
        }
        command.push(script.display().to_string());
        let shim = crate::shim::ShimArgs {
            join,
            user: l.user.clone(),
            uid,
            gid,
            rlimit_as: l
                .vmem_mib
                .or(Some(l.memory_mib))
                .filter(|v| *v > 0 && l.address_space_limit)
                .map(|v| v << 20),
            env_file: Some(run_dir.path().join(ENVIRON)),
            work_dir: PathBuf::from(&l.work_dir),
            stdout,
            stderr,
            command,
        };
        // The monitor's own messages (never the job's output) go to a log of root's.
        let log = run_dir
            .create_new(MONITOR_LOG, 0o600)
            .map_err(fail("the monitor's log"))?;
        let log_too = log.try_clone().map_err(fail("the monitor's log"))?;
        let mut cmd = tokio::process::Command::new(&self.config.shim);
        cmd.arg("exec-job")
            .arg("--run-dir")
            .arg(run_dir.path())
            .args(shim.to_args())
            // Root runs with root's environment, never the job's.
            .env_clear()
            .env("PATH", crate::shim::ROOT_PATH)
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_too)
            .process_group(0)
            .kill_on_drop(false);
        // The run directory is recorded before the monitor starts: an agent restarted after
        // this point finds the monitor by its lock there (or stops it from starting the job).
        if let Some(r) = self.lock().get_mut(&l.job_id) {
            r.run_dir = Some(run_dir.path().to_path_buf());
        }
        self.persist();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting the job's monitor: {e}"))?;
        crate::crash::reached(CrashPoint::LaunchSpawned);
        let monitor = child.id().map(|p| p as i32);
        if let Some(r) = self.lock().get_mut(&l.job_id) {
            r.monitor = monitor;
        }
        self.persist();
        // The job's own process group, once the monitor has started it.
        let start = Instant::now();
        let pgid = loop {
            if let Some(p) = crate::shim::read_pgid(&run_dir) {
                break Some(p);
            }
            if start.elapsed() > Duration::from_secs(10)
                || crate::shim::read_exit(&run_dir).is_some()
            {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let (suspended, stopping) = match self.lock().get_mut(&l.job_id) {
            Some(r) => {
                r.pgid = pgid;
                (r.suspended_since.is_some(), r.stopping.is_some())
            }
            None => (false, false),
        };
        self.persist();
        // Instructions that came while the process was being started apply now.
        if let Some(r) = self.lock().get(&l.job_id) {
            if stopping {
                signal_run(r, Signal::SIGTERM);
            } else if suspended {
                freeze(r, true);
            }
        }
        let _ = self.events.send(pb::JobEvent {
            job_id: l.job_id,
            epoch: l.epoch,
            event: Some(pb::job_event::Event::Started(pb::Started {
                time_unix_ms: now_ms(),
            })),
        });
        let status = child.wait().await;
        crate::crash::reached(CrashPoint::ExitObserved);
        self.recorded_exit(l.job_id, &run_dir, status.ok())
    }

    /// Watches a run a previous agent started to its end, by its monitor's lock and exit file.
    async fn readopt(&self, job: u64, epoch: u64, path: &std::path::Path) {
        let dir = match RootDir::open(path, crate::shim::RUN_DIR_MODE) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(job, epoch, error = %e, "the run's directory is gone");
                if let Some(r) = self.lock().get_mut(&job) {
                    r.stopping.get_or_insert(pb::EndCause::NodeFailure);
                }
                use std::os::unix::process::ExitStatusExt;
                self.finish(job, epoch, Ok(std::process::ExitStatus::from_raw(9)));
                return;
            }
        };
        loop {
            // The job's process group, if the previous agent died before it learnt it.
            if let Some(r) = self.lock().get_mut(&job).filter(|r| r.pgid.is_none()) {
                r.pgid = crate::shim::read_pgid(&dir);
            }
            match crate::shim::probe(&dir) {
                Monitor::Running => tokio::time::sleep(Duration::from_millis(100)).await,
                Monitor::Ended(..) => break,
                Monitor::Gone => {
                    // The monitor died without the job's end: nothing will report it, so
                    // nothing of it may keep running. Confined, its cgroups are emptied when
                    // the run finishes; unconfined, its process group is killed, but only if
                    // its leader still runs this run's script (not a process that was given
                    // the number since).
                    let script = self
                        .config
                        .state_dir
                        .join(JOBS)
                        .join(run_name(job, epoch))
                        .join(SCRIPT);
                    let pgid = crate::shim::read_pgid(&dir).filter(|p| {
                        std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                            String::from_utf8_lossy(&c).contains(&*script.to_string_lossy())
                        })
                    });
                    let unconfined = self.lock().get(&job).is_some_and(|r| r.cgroup.is_none());
                    if unconfined {
                        signal_group(pgid, Signal::SIGKILL);
                    }
                    break;
                }
            }
        }
        let outcome = self.recorded_exit(job, &dir, None);
        self.finish(job, epoch, outcome);
    }

    /// How a run ended, as its monitor recorded it (`Err`: the job could not be started, and
    /// why); a monitor that died without recording anything means the run was lost (counted as
    /// a node failure).
    fn recorded_exit(
        &self,
        job: u64,
        dir: &RootDir,
        monitor_status: Option<std::process::ExitStatus>,
    ) -> Result<std::process::ExitStatus, String> {
        use std::os::unix::process::ExitStatusExt;
        match crate::shim::read_exit(dir) {
            Some(crate::shim::RecordedEnd {
                launch_error: Some(why),
                ..
            }) => Err(why),
            Some(end) => Ok(std::process::ExitStatus::from_raw(if end.signal != 0 {
                end.signal
            } else {
                end.code << 8
            })),
            None => {
                let log = dir.read_text(MONITOR_LOG).unwrap_or_default();
                tracing::warn!(job, ?monitor_status, monitor_log = %log.trim(), "the job's monitor recorded no exit");
                if let Some(r) = self.lock().get_mut(&job) {
                    r.stopping.get_or_insert(pb::EndCause::NodeFailure);
                }
                Ok(std::process::ExitStatus::from_raw(9))
            }
        }
    }

    /// A simulated run: as long as the script's first `sleep N`, or until stopped.
    async fn run_simulated(&self, l: &pb::Launch) -> Result<std::process::ExitStatus, String> {
        Ok(self.simulate(l.job_id, l.epoch).await)
    }

    /// Waits out a simulated run (also one re-adopted after a restart).
    async fn simulate(&self, job: u64, epoch: u64) -> std::process::ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        loop {
            let (stopping, remaining, runtime) = match self.lock().get(&job) {
                Some(r) if r.epoch == epoch => {
                    let ran = Instant::now()
                        .duration_since(r.started)
                        .saturating_sub(r.paused)
                        .saturating_sub(r.suspended_since.map_or(Duration::ZERO, |s| s.elapsed()));
                    (
                        r.stopping,
                        r.sim_runtime.map(|t| t.saturating_sub(ran)),
                        r.suspended_since.is_none(),
                    )
                }
                _ => return std::process::ExitStatus::from_raw(9),
            };
            if stopping.is_some() {
                return std::process::ExitStatus::from_raw(15);
            }
            if runtime && remaining.is_some_and(|r| r.is_zero()) {
                return std::process::ExitStatus::from_raw(0);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Records how a run ended and reports it.
    fn finish(&self, job: u64, epoch: u64, outcome: Result<std::process::ExitStatus, String>) {
        use std::os::unix::process::ExitStatusExt;
        let mut runs = self.lock();
        let Some(run) = runs.get_mut(&job).filter(|r| r.epoch == epoch) else {
            return;
        };
        let ended = match outcome {
            Err(why) => {
                tracing::warn!(job, epoch, %why, "launch failed");
                pb::Ended {
                    cause: pb::EndCause::LaunchFailed.into(),
                    reason: why,
                    exit_code: 1,
                    ..Default::default()
                }
            }
            Ok(status) => {
                let code = status.code().unwrap_or(0);
                let signal = status.signal().unwrap_or(0);
                let cause = match run.stopping {
                    Some(why) => why,
                    None if code == 0 && signal == 0 => pb::EndCause::Completed,
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
        let mut ended = ended;
        let scratch = run.scratch.take();
        if let Some(scratch) = &scratch
            && ended.cause() == pb::EndCause::Failed
            && scratch.full()
        {
            ended.set_cause(pb::EndCause::JobfsExceeded);
        }
        // The cgroup first: once it is empty nothing of the job holds its scratch.
        if let Some(cg) = run.cgroup.take() {
            if cg.oom_killed() && run.stopping.is_none() {
                ended.set_cause(pb::EndCause::OutOfMemory);
            }
            ended.cpu_time_ms = cg.cpu_time_ms();
            ended.max_rss_mib = cg.peak_memory_mib();
            cg.remove();
        }
        if let Some(scratch) = scratch {
            scratch.remove();
        }
        // Its cpus and GPUs return to the pool (what is held is read from running runs).
        run.cpus.clear();
        run.gpus.clear();
        run.running = false;
        run.ended = Some(ended.clone());
        run.changed.notify_one();
        drop(runs);
        self.persist();
        self.remove_directories(job, epoch);
        crate::crash::reached(CrashPoint::ExitRecorded);
        let _ = self.events.send(pb::JobEvent {
            job_id: job,
            epoch,
            event: Some(pb::job_event::Event::Ended(ended)),
        });
    }

    async fn watch_walltime(&self, job: u64, epoch: u64, changed: Arc<Notify>) {
        loop {
            let remaining = match self.lock().get(&job) {
                Some(r) if r.epoch == epoch && r.running && r.stopping.is_none() => {
                    r.remaining(Instant::now())
                }
                _ => return,
            };
            match remaining {
                Some(left) if left.is_zero() => {
                    tracing::info!(job, epoch, "time limit reached");
                    self.stop(job, epoch, pb::EndCause::Timeout);
                    return;
                }
                Some(left) => {
                    tokio::select! {
                        _ = tokio::time::sleep(left) => {}
                        _ = changed.notified() => {}
                    }
                }
                None => changed.notified().await,
            }
        }
    }

    fn suspend(&self, c: &pb::JobControl, suspend: bool) {
        if self.stale(c.job_id, c.epoch) {
            tracing::warn!(
                job = c.job_id,
                epoch = c.epoch,
                "stale suspend/resume refused"
            );
            return;
        }
        let mut runs = self.lock();
        let Some(run) = runs
            .get_mut(&c.job_id)
            .filter(|r| r.epoch == c.epoch && r.running)
        else {
            return;
        };
        match (suspend, run.suspended_since) {
            (true, None) => {
                run.suspended_since = Some(Instant::now());
                freeze(run, true);
            }
            (false, Some(since)) => {
                run.paused += since.elapsed();
                run.suspended_since = None;
                freeze(run, false);
            }
            _ => {}
        }
        run.changed.notify_one();
        drop(runs);
        self.persist();
    }

    fn kill(&self, c: &pb::JobControl) {
        if self.stale(c.job_id, c.epoch) {
            tracing::warn!(job = c.job_id, epoch = c.epoch, "stale kill refused");
            return;
        }
        let held = self.lock().get(&c.job_id).map(|r| (r.epoch, r.running));
        match held {
            Some((e, true)) if e == c.epoch => {
                self.stop(c.job_id, c.epoch, pb::EndCause::Cancelled)
            }
            Some((e, false)) if e == c.epoch => {}
            // Never held here (the launch never came): it ended, cancelled.
            _ => {
                let _ = self.events.send(pb::JobEvent {
                    job_id: c.job_id,
                    epoch: c.epoch,
                    event: Some(pb::job_event::Event::Ended(pb::Ended {
                        cause: pb::EndCause::Cancelled.into(),
                        ..Default::default()
                    })),
                });
            }
        }
    }

    /// `scancel --signal`: the signal to every process of the run, if the epoch is the run's;
    /// a simulated run has no processes and ignores it.
    fn signal(&self, s: &pb::SignalJob) {
        let signal = match Signal::try_from(s.signal) {
            Ok(sig) => sig,
            Err(e) => {
                tracing::warn!(job = s.job_id, signal = s.signal, error = %e, "not a signal");
                return;
            }
        };
        let runs = self.lock();
        match runs
            .get(&s.job_id)
            .filter(|r| r.epoch == s.epoch && r.running && (r.cgroup.is_some() || r.pgid.is_some()))
        {
            Some(run) => {
                tracing::info!(job = s.job_id, ?signal, "signalling");
                signal_run(run, signal);
            }
            None => tracing::debug!(
                job = s.job_id,
                epoch = s.epoch,
                "signal for a run not running here: ignored"
            ),
        }
    }

    fn time_limit(&self, t: &pb::TimeLimit) {
        let mut runs = self.lock();
        if let Some(run) = runs.get_mut(&t.job_id).filter(|r| r.epoch == t.epoch) {
            run.limit =
                (t.time_limit_seconds > 0).then(|| Duration::from_secs(t.time_limit_seconds));
            run.changed.notify_one();
        }
        drop(runs);
        self.persist();
    }

    /// Stops a run: thawed, SIGTERM to every process of it, SIGKILL after the grace.
    pub fn stop(&self, job: u64, epoch: u64, why: pb::EndCause) {
        {
            let mut runs = self.lock();
            let Some(run) = runs.get_mut(&job).filter(|r| r.epoch == epoch && r.running) else {
                return;
            };
            if run.stopping.is_none() {
                run.stopping = Some(why);
            }
            run.changed.notify_one();
            if run.suspended_since.is_some() {
                freeze(run, false);
                run.suspended_since = None;
            }
            signal_run(run, Signal::SIGTERM);
        }
        self.persist();
        let grace = self.config.kill_grace;
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if let Some(run) = this
                .lock()
                .get(&job)
                .filter(|r| r.epoch == epoch && r.running)
            {
                signal_run(run, Signal::SIGKILL);
            }
        });
    }

    /// Takes `n` free cpus of the pool for `job` (lowest first). Fewer than `n` free (an agent
    /// declaring more cpus than it owns, for tests): no exclusive set.
    fn take_cpus(&self, job: u64, n: u32) -> Vec<u32> {
        let mut runs = self.lock();
        let used: std::collections::BTreeSet<u32> = runs
            .values()
            .filter(|r| r.running)
            .flat_map(|r| r.cpus.iter().copied())
            .collect();
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
        if let Some(r) = runs.get_mut(&job) {
            r.cpus = free.clone();
        }
        free
    }

    /// Takes `n` free GPUs for `job` (lowest indices first); fewer free is a launch failure
    /// (the leader counts GPUs as it counts cpus, so this means the two disagree).
    fn take_gpus(&self, job: u64, n: u32) -> Result<Vec<u32>, String> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut runs = self.lock();
        let used: std::collections::BTreeSet<u32> = runs
            .values()
            .filter(|r| r.running)
            .flat_map(|r| r.gpus.iter().copied())
            .collect();
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
        if let Some(r) = runs.get_mut(&job) {
            r.gpus = free.clone();
        }
        Ok(free)
    }

    /// Stops every running job (the fence: no leader for too long).
    pub fn stop_all(&self, why: pb::EndCause) {
        let running: Vec<(u64, u64)> = self
            .lock()
            .iter()
            .filter(|(_, r)| r.running)
            .map(|(id, r)| (*id, r.epoch))
            .collect();
        for (job, epoch) in running {
            self.stop(job, epoch, why);
        }
    }
}

/// Freezes or thaws a run: with the cgroup freezer when confined (a failure is an error,
/// never a quiet fall back to signals a job can catch or undo); with SIGSTOP/SIGCONT to its
/// process group only when the agent confines nothing.
fn freeze(run: &Run, frozen: bool) {
    match &run.cgroup {
        Some(cg) => {
            if let Err(e) = cg.freeze(frozen) {
                tracing::error!(error = %e, frozen, "the cgroup freezer failed");
            }
        }
        None => signal_group(
            run.pgid,
            if frozen {
                Signal::SIGSTOP
            } else {
                Signal::SIGCONT
            },
        ),
    }
}

/// Sends `signal` to every process of a run: through its cgroups when confined (what is in
/// them is the job, whatever process groups or sessions it made); to its process group, as
/// the monitor recorded it, only when the agent confines nothing.
fn signal_run(run: &Run, signal: Signal) {
    match &run.cgroup {
        Some(cg) => {
            if let Err(e) = cg.signal_all(signal, run.suspended_since.is_some()) {
                tracing::error!(error = %e, ?signal, "signalling a job's cgroup");
            }
        }
        None => signal_group(run.pgid, signal),
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

fn signal_group(pgid: Option<i32>, signal: Signal) {
    if let Some(pgid) = pgid
        && let Err(e) = killpg(Pid::from_raw(pgid), signal)
        && e != nix::errno::Errno::ESRCH
    {
        tracing::warn!(pgid, ?signal, error = %e, "signalling a job's process group");
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

/// A run as the state file keeps it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SavedRun {
    job: u64,
    epoch: u64,
    running: bool,
    ended: Option<SavedEnd>,
    started_unix_ms: u64,
    limit_s: Option<u64>,
    paused_ms: u64,
    suspended: bool,
    stopping: Option<String>,
    monitor: Option<i32>,
    pgid: Option<i32>,
    run_dir: Option<PathBuf>,
    cgroup: Option<crate::cgroup::JobCgroup>,
    scratch: Option<crate::jobfs::JobScratch>,
    cpus: Vec<u32>,
    #[serde(default)]
    gpus: Vec<u32>,
    sim_runtime_ms: Option<u64>,
}

/// A run's end as the state file keeps it (its cause by the protocol's name for it).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SavedEnd {
    cause: String,
    #[serde(default)]
    reason: String,
    exit_code: i32,
    signal: i32,
    cpu_time_ms: u64,
    max_rss_mib: u64,
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

/// Why a run is being stopped, from the state file (what is not a timeout or a lost node
/// was a cancellation).
fn stop_reason(text: &str) -> pb::EndCause {
    match pb::EndCause::from_str_name(text) {
        Some(c @ (pb::EndCause::Timeout | pb::EndCause::NodeFailure | pb::EndCause::Preempted)) => {
            c
        }
        _ => pb::EndCause::Cancelled,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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
        let text = std::fs::read_to_string(dir.path().join("state.json")).unwrap();
        let saved: Vec<SavedRun> = serde_json::from_str(&text).unwrap();
        assert_eq!(
            saved.len() as u64,
            threads * each,
            "the file went back to an older state"
        );
        assert!(!dir.path().join("state.tmp").exists());
        drop(rt);
    }
}
