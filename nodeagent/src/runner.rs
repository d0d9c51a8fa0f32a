//! Running jobs on this node: launch, walltime, suspend/resume, kill, and what ended.
//!
//! Every run is a (job, epoch). An instruction for an older epoch than the one held for that
//! job is refused, a launch of a run already held is ignored, so nothing sent twice runs
//! twice. A run's end is kept until the leader has acknowledged its report (an agent that
//! loses its leader reports it to the next one).
//!
//! Real runs are the batch script as a process group of the submitting user, signalled as a
//! group: SIGSTOP/SIGCONT to suspend and resume (walltime stops meanwhile), SIGTERM then
//! SIGKILL after the grace to kill or at the time limit. Simulated runs occupy their
//! allocation for the script's `sleep N` (or until killed) without a process, for scale tests.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use docket_proto::v1 as pb;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::{Notify, mpsc};

use crate::world;

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
    stopping: Option<&'static str>,
    /// Its cgroups, when confined.
    cgroup: Option<crate::cgroup::JobCgroup>,
    /// The cpus it holds from the pool.
    cpus: Vec<u32>,
    /// Its scratch, when it has one.
    scratch: Option<crate::jobfs::JobScratch>,
    /// Wakes the run's walltime watcher when its limit or suspension changes.
    changed: Arc<Notify>,
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

    /// Carries out one instruction.
    pub fn apply(&self, instruction: pb::Instruction) {
        match instruction.kind {
            Some(pb::instruction::Kind::Launch(l)) => self.launch(l),
            Some(pb::instruction::Kind::Suspend(c)) => self.suspend(&c, true),
            Some(pb::instruction::Kind::Resume(c)) => self.suspend(&c, false),
            Some(pb::instruction::Kind::Kill(c)) => self.kill(&c),
            Some(pb::instruction::Kind::TimeLimit(t)) => self.time_limit(&t),
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
            self.stop(job, old, "cancelled");
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
                scratch: None,
            },
        );
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
        let dir = self
            .config
            .state_dir
            .join("jobs")
            .join(format!("{}.{}", l.job_id, l.epoch));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let script = dir.join("script");
        std::fs::write(&script, &l.script).map_err(|e| format!("writing the script: {e}"))?;
        let nodefile = dir.join("nodefile");
        std::fs::write(&nodefile, world::nodefile_contents(l, &self.config.node))
            .map_err(|e| format!("writing the node file: {e}"))?;
        for p in [&dir, &script, &nodefile] {
            std::os::unix::fs::chown(p, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .map_err(|e| format!("chown {}: {e}", p.display()))?;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("chmod the script: {e}"))?;
        let (out_path, err_path) = world::output_paths(l, &self.config.node);
        let open = |p: &PathBuf| -> Result<std::fs::File, String> {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("opening {}: {e}", p.display()))?;
            std::os::unix::fs::fchown(&f, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .map_err(|e| format!("chown {}: {e}", p.display()))?;
            Ok(f)
        };
        let stdout = open(&out_path)?;
        let stderr = if err_path == out_path {
            stdout.try_clone().map_err(|e| e.to_string())?
        } else {
            open(&err_path)?
        };
        let who = world::Identity {
            user: l.user.clone(),
            home: user.dir.display().to_string(),
            shell: user.shell.display().to_string(),
        };
        let scratch = match &self.config.jobfs {
            Some(jobfs) if l.jobfs_mib > 0 => {
                let s = jobfs
                    .create(
                        l.job_id,
                        l.epoch,
                        l.jobfs_mib,
                        user.uid.as_raw(),
                        user.gid.as_raw(),
                    )
                    .map_err(|e| e.to_string())?;
                if let Some(r) = self.lock().get_mut(&l.job_id) {
                    r.scratch = Some(s.clone());
                }
                Some(s)
            }
            _ => None,
        };
        let env = world::environment(
            l,
            &self.config.node,
            &who,
            &nodefile,
            scratch.as_ref().map(|s| s.path.as_path()),
            &self.config.cluster,
        );
        // Confinement: the job's cgroups, which the shim joins before it becomes the user.
        let mut join = Vec::new();
        if let Some(cgroups) = &self.config.cgroups {
            let cpus = self.take_cpus(l.job_id, l.cpus);
            let limits = crate::cgroup::Limits {
                cpus: (!cpus.is_empty()).then(|| cpu_list(&cpus)),
                memory_bytes: (l.memory_mib > 0).then_some(l.memory_mib << 20),
                vmem_bytes: l.vmem_mib.map(|v| v << 20),
                pids: Some(self.config.pids_max),
            };
            let cg = cgroups
                .create(l.job_id, l.epoch, &limits)
                .map_err(|e| format!("confining the job: {e}"))?;
            join = cg.procs_files();
            if let Some(r) = self.lock().get_mut(&l.job_id) {
                r.cgroup = Some(cg);
            }
        }
        let mut argv: Vec<String> = Vec::new();
        if !l.script.starts_with(b"#!") {
            argv.push("/bin/sh".into());
        }
        argv.push(script.display().to_string());
        let mut cmd = tokio::process::Command::new(&self.config.shim);
        cmd.arg("exec-job")
            .args(["--user", &l.user])
            .args(["--uid", &user.uid.as_raw().to_string()])
            .args(["--gid", &user.gid.as_raw().to_string()]);
        for f in &join {
            cmd.arg("--join").arg(f);
        }
        if l.address_space_limit
            && let Some(v) = l.vmem_mib.or(Some(l.memory_mib)).filter(|v| *v > 0)
        {
            cmd.args(["--rlimit-as", &(v << 20).to_string()]);
        }
        cmd.arg("--")
            .args(&argv)
            .current_dir(&l.work_dir)
            .env_clear()
            .envs(env)
            .stdin(std::process::Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(false);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting {} in {}: {e}", script.display(), l.work_dir))?;
        let pgid = child.id().map(|p| p as i32);
        let (suspended, stopping) = match self.lock().get_mut(&l.job_id) {
            Some(r) => {
                r.pgid = pgid;
                (r.suspended_since.is_some(), r.stopping.is_some())
            }
            None => (false, false),
        };
        // Instructions that came while the process was being started apply now.
        if stopping {
            signal_group(pgid, Signal::SIGTERM);
        } else if suspended && let Some(r) = self.lock().get(&l.job_id) {
            freeze(r, true);
        }
        let _ = self.events.send(pb::JobEvent {
            job_id: l.job_id,
            epoch: l.epoch,
            event: Some(pb::job_event::Event::Started(pb::Started {
                time_unix_ms: now_ms(),
            })),
        });
        child
            .wait()
            .await
            .map_err(|e| format!("waiting for the job: {e}"))
    }

    /// A simulated run: as long as the script's first `sleep N`, or until stopped.
    async fn run_simulated(&self, l: &pb::Launch) -> Result<std::process::ExitStatus, String> {
        use std::os::unix::process::ExitStatusExt;
        let runtime = String::from_utf8_lossy(&l.script)
            .lines()
            .filter_map(|line| line.trim().strip_prefix("sleep "))
            .find_map(|n| n.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let started = Instant::now();
        loop {
            let (stopping, paused, suspended) = match self.lock().get(&l.job_id) {
                Some(r) if r.epoch == l.epoch => (r.stopping, r.paused, r.suspended_since),
                _ => return Ok(std::process::ExitStatus::from_raw(9)),
            };
            if stopping.is_some() {
                return Ok(std::process::ExitStatus::from_raw(15));
            }
            let ran = started.elapsed().saturating_sub(paused)
                - suspended.map_or(Duration::ZERO, |s| s.elapsed());
            if runtime.is_some_and(|r| ran >= r) && suspended.is_none() {
                return Ok(std::process::ExitStatus::from_raw(0));
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
                    cause: "launch_failed".into(),
                    exit_code: 1,
                    ..Default::default()
                }
            }
            Ok(status) => {
                let code = status.code().unwrap_or(0);
                let signal = status.signal().unwrap_or(0);
                let cause = match run.stopping {
                    Some(why) => why,
                    None if code == 0 && signal == 0 => "completed",
                    None => "failed",
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
        if let Some(scratch) = run.scratch.take() {
            let unsuccessful = ended.cause == "failed";
            if unsuccessful && scratch.full() {
                ended.cause = "jobfs_exceeded".into();
            }
            scratch.remove();
        }
        if let Some(cg) = run.cgroup.take() {
            if cg.oom_killed() && run.stopping.is_none() {
                ended.cause = "out_of_memory".into();
            }
            ended.cpu_time_ms = cg.cpu_time_ms();
            ended.max_rss_mib = cg.peak_memory_mib();
            cg.remove();
        }
        // Its cpus return to the pool (held cpus are read from running runs).
        run.cpus.clear();
        run.running = false;
        run.ended = Some(ended.clone());
        run.changed.notify_one();
        drop(runs);
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
                    self.stop(job, epoch, "timeout");
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
    }

    fn kill(&self, c: &pb::JobControl) {
        if self.stale(c.job_id, c.epoch) {
            tracing::warn!(job = c.job_id, epoch = c.epoch, "stale kill refused");
            return;
        }
        let held = self.lock().get(&c.job_id).map(|r| (r.epoch, r.running));
        match held {
            Some((e, true)) if e == c.epoch => self.stop(c.job_id, c.epoch, "cancelled"),
            Some((e, false)) if e == c.epoch => {}
            // Never held here (the launch never came): it ended, cancelled.
            _ => {
                let _ = self.events.send(pb::JobEvent {
                    job_id: c.job_id,
                    epoch: c.epoch,
                    event: Some(pb::job_event::Event::Ended(pb::Ended {
                        cause: "cancelled".into(),
                        ..Default::default()
                    })),
                });
            }
        }
    }

    fn time_limit(&self, t: &pb::TimeLimit) {
        let mut runs = self.lock();
        if let Some(run) = runs.get_mut(&t.job_id).filter(|r| r.epoch == t.epoch) {
            run.limit =
                (t.time_limit_seconds > 0).then(|| Duration::from_secs(t.time_limit_seconds));
            run.changed.notify_one();
        }
    }

    /// Stops a run: SIGTERM to its process group (thawed first), SIGKILL after the grace.
    pub fn stop(&self, job: u64, epoch: u64, why: &'static str) {
        let pgid = {
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
            }
            run.pgid
        };
        signal_group(pgid, Signal::SIGCONT);
        signal_group(pgid, Signal::SIGTERM);
        let grace = self.config.kill_grace;
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let cgroup = this
                .lock()
                .get(&job)
                .filter(|r| r.epoch == epoch && r.running)
                .map(|r| r.cgroup.clone());
            if let Some(cgroup) = cgroup {
                signal_group(pgid, Signal::SIGKILL);
                // Processes that left the group are still in the cgroup.
                if let Some(cg) = cgroup {
                    cg.kill_all();
                }
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

    /// Stops every running job (the fence: no leader for too long).
    pub fn stop_all(&self, why: &'static str) {
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

/// Freezes or thaws a run: the cgroup freezer when confined, SIGSTOP/SIGCONT to its process
/// group otherwise (or when the freezer fails).
fn freeze(run: &Run, frozen: bool) {
    if let Some(cg) = &run.cgroup {
        match cg.freeze(frozen) {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %e, "freezer failed; signalling the process group"),
        }
    }
    signal_group(
        run.pgid,
        if frozen {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        },
    );
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

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
