//! A real run, step by step: its directories and files, its scratch, GPUs, environment and
//! cgroups; its monitor started; its processes running; its end observed. And a run a
//! previous agent started, watched to its end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use docket_proto::v1 as pb;

use super::{JOBS, JOBS_MODE, RUNS, RUNS_MODE, RunId, Runner, cpu_list, run_name, signal_group};
use crate::crash::CrashPoint;
use crate::lend::{Access, Lent, lend_file};
use crate::lifecycle::{Input, Outcome};
use crate::rootdir::RootDir;
use crate::shim::Monitor;
use crate::world;

const SCRIPT: &str = "script";
const NODEFILE: &str = "nodefile";
/// In a run's directory: the job's environment.
pub(super) const ENVIRON: &str = "environ";
use crate::shim::MONITOR_LOG;

/// A run's monitor, however it was started.
enum MonitorProc {
    /// Forked by the launcher.
    Launched(crate::launcher::Launched),
    /// Started by the agent itself (`exec-job`), when the launcher cannot be used.
    Child(tokio::process::Child),
    /// Asked of a launcher that died before answering: only the run's directory can tell
    /// whether a monitor runs.
    Unknown,
}

/// A run made ready to start: who it runs as, its directories, what its monitor is told.
struct Prepared {
    run_dir: RootDir,
    shim: crate::shim::ShimArgs,
}

impl Runner {
    /// Prepares, starts and watches run `id` to its end, reporting each step.
    ///
    /// Preparing (files, cgroups: writes to cgroup v1's `cgroup.procs` and `rmdir`s wait for
    /// the kernel's RCU grace periods, milliseconds each) and releasing run on the blocking
    /// pool, so a node launching or ending many runs at once does them side by side and never
    /// stalls the agent's runtime (its instruction stream, heartbeats and step service).
    pub(super) async fn run_real(&self, id: RunId, l: pb::Launch) {
        let this = self.clone();
        let started = tokio::task::spawn_blocking(move || {
            let prepared = this.prepare(id, &l)?;
            let child = this.start_monitor(id, &prepared)?;
            Ok::<_, String>((prepared, child))
        })
        .await
        .unwrap_or_else(|e| Err(format!("preparing the run failed: {e}")));
        let (prepared, monitor) = match started {
            Ok(s) => s,
            Err(why) => return self.launch_failed(id, why),
        };
        self.wait_until_started(id, &prepared.run_dir).await;
        self.step(Input::Started(id));
        let status = match monitor {
            MonitorProc::Launched(launched) => match launched.ended.await {
                Ok(raw) => Ok(std::os::unix::process::ExitStatusExt::from_raw(raw)),
                // The launcher died: its monitor, if it forked one, is watched as a
                // restarted agent watches one.
                Err(_) => return self.readopt(id, prepared.run_dir.path()).await,
            },
            MonitorProc::Child(mut child) => child.wait().await,
            MonitorProc::Unknown => return self.readopt(id, prepared.run_dir.path()).await,
        };
        crate::crash::reached(CrashPoint::ExitObserved);
        let this = self.clone();
        let ended = tokio::task::spawn_blocking(move || {
            let outcome = this.recorded_exit(id, &prepared.run_dir, status.ok());
            let seen = this.observe(id);
            this.step(Input::Ended(id, outcome, seen));
        })
        .await;
        if let Err(e) = ended {
            tracing::error!(job = id.0, epoch = id.1, error = %e, "recording a run's end failed");
        }
    }

    fn launch_failed(&self, id: RunId, why: String) {
        let seen = self.observe(id);
        self.step(Input::Ended(id, Outcome::LaunchFailed(why), seen));
    }

    /// Everything before the monitor: the user, the run's and the job's directories, the
    /// script and node file, scratch, GPUs, the environment, the cgroups.
    fn prepare(&self, id: RunId, l: &pb::Launch) -> Result<Prepared, String> {
        let user = job_user(l)?;
        let (uid, gid) = (user.uid.as_raw(), user.gid.as_raw());
        let name = run_name(id);
        let runtime = self
            .runtime_dir()
            .map_err(failed("the runtime directory"))?;
        // Root's bookkeeping for the run: the monitor's lock, the job's process group and exit.
        let run_dir = runtime
            .subdir(RUNS, RUNS_MODE)
            .and_then(|runs| runs.fresh_subdir(&name, crate::shim::RUN_DIR_MODE))
            .map_err(failed("the run's directory"))?;
        // The job's own directory: root's (0711, so the job cannot fill it or grow a tree in
        // it root would have to remove), its files root's and lent to the user read-only.
        let job_dir = runtime
            .subdir(JOBS, JOBS_MODE)
            .and_then(|jobs| jobs.fresh_subdir(&name, 0o711))
            .map_err(failed("the job's directory"))?;
        let (script, nodefile) = self.write_job_files(&job_dir, l, uid, gid)?;
        let scratch = self.make_scratch(id, l, uid, gid)?;
        let gpus = self.take_gpus(id, l.gpus)?;
        let env = self.job_environment(l, &user, &nodefile, scratch.as_ref(), &gpus);
        run_dir
            .write_new(ENVIRON, &crate::shim::encode_environment(&env), 0o600)
            .map_err(failed("writing the job's environment"))?;
        let join = self.confine(id, l, &gpus)?;
        let shim = self.shim_args(l, uid, gid, join, &script, &run_dir);
        // What a step's tasks on this node start from.
        let base = step_base(l, &shim, &env, &run_dir);
        self.hold(id, |h| h.step_base = Some(std::sync::Arc::new(base)));
        Ok(Prepared { run_dir, shim })
    }

    /// Writes the job's script and node file into `job_dir` and lends them to the user
    /// read-only; their paths.
    fn write_job_files(
        &self,
        job_dir: &RootDir,
        l: &pb::Launch,
        uid: u32,
        gid: u32,
    ) -> Result<(PathBuf, PathBuf), String> {
        let script = job_dir
            .write_new(SCRIPT, &l.script, 0o500)
            .and_then(|f| lend_file(&f, uid, gid, Access::ReadExecute))
            .map_err(failed("writing the script"))?;
        let nodefile = job_dir
            .write_new(
                NODEFILE,
                world::nodefile_contents(l, &self.config.node).as_bytes(),
                0o400,
            )
            .and_then(|f| lend_file(&f, uid, gid, Access::Read))
            .map_err(failed("writing the node file"))?;
        if script == Lent::Given || nodefile == Lent::Given {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    dir = %job_dir.path().display(),
                    "the runtime directory's file system has no POSIX ACLs: jobs' scripts are \
                     their users' own files, and a job could grow its script until the file \
                     system is full"
                );
            });
        }
        Ok((job_dir.path().join(SCRIPT), job_dir.path().join(NODEFILE)))
    }

    /// Mounts the job's scratch, the user's, if it asked for one and the node has jobfs;
    /// held by the run from then on.
    fn make_scratch(
        &self,
        id: RunId,
        l: &pb::Launch,
        uid: u32,
        gid: u32,
    ) -> Result<Option<crate::jobfs::JobScratch>, String> {
        Ok(match &self.config.jobfs {
            Some(jobfs) if l.jobfs_mib > 0 => {
                let s = jobfs
                    .create(l.job_id, l.epoch, l.jobfs_mib, uid, gid)
                    .map_err(|e| e.to_string())?;
                self.hold(id, |h| h.scratch = Some(s.clone()));
                Some(s)
            }
            _ => None,
        })
    }

    /// The job's environment: the launch's and the scheduler's variables, then its GPUs'.
    fn job_environment(
        &self,
        l: &pb::Launch,
        user: &nix::unistd::User,
        nodefile: &Path,
        scratch: Option<&crate::jobfs::JobScratch>,
        gpus: &[u32],
    ) -> BTreeMap<String, String> {
        let who = world::Identity {
            user: l.user.clone(),
            home: user.dir.display().to_string(),
            shell: user.shell.display().to_string(),
        };
        let mut env = world::environment(
            l,
            &self.config.node,
            &who,
            nodefile,
            scratch.map(|s| s.path.as_path()),
            &self.config.cluster,
        );
        let constrained = self
            .config
            .cgroups
            .as_ref()
            .is_some_and(|c| c.constrains_devices());
        env.extend(
            crate::gpu::environment(gpus, constrained)
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v)),
        );
        env
    }

    /// What the monitor is told: the cgroups to join, the user, the limits, the environment
    /// file, the working directory, the output files and the command (the script).
    fn shim_args(
        &self,
        l: &pb::Launch,
        uid: u32,
        gid: u32,
        join: Vec<PathBuf>,
        script: &Path,
        run_dir: &RootDir,
    ) -> crate::shim::ShimArgs {
        let mut command: Vec<String> = Vec::new();
        if !l.script.starts_with(b"#!") {
            command.push("/bin/sh".into());
        }
        command.push(script.display().to_string());
        let (stdout, stderr) = world::output_paths(l, &self.config.node);
        crate::shim::ShimArgs {
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
            set: Vec::new(),
            work_dir: PathBuf::from(&l.work_dir),
            stdout,
            stderr,
            inherit_stdio: false,
            command,
        }
    }

    /// The job's cgroups (when confined), which the shim joins before it becomes the user:
    /// the `cgroup.procs` files it writes itself into.
    fn confine(&self, id: RunId, l: &pb::Launch, gpus: &[u32]) -> Result<Vec<PathBuf>, String> {
        let Some(cgroups) = &self.config.cgroups else {
            return Ok(Vec::new());
        };
        let cpus = self.take_cpus(id, l.cpus);
        let limits = crate::cgroup::Limits {
            cpus: (!cpus.is_empty()).then(|| cpu_list(&cpus)),
            memory_bytes: (l.memory_mib > 0).then_some(l.memory_mib << 20),
            vmem_bytes: l.vmem_mib.map(|v| v << 20),
            pids: Some(self.config.pids_max),
            denied_devices: self.config.gpus.denied(gpus),
        };
        // One made half-way is recorded too, so that it is removed with the run.
        let cg = cgroups
            .create(l.job_id, l.epoch, &limits)
            .map_err(|e| format!("confining the job: {e}"));
        let cg = match cg {
            Ok(cg) => cg,
            Err(why) => {
                let partial = cgroups.existing(l.job_id, l.epoch);
                self.hold(id, |h| h.cgroup = Some(partial));
                return Err(why);
            }
        };
        let join = cg.procs_files();
        self.hold(id, |h| h.cgroup = Some(cg));
        Ok(join)
    }

    /// Starts the run's monitor as root with root's fixed environment, its run directory
    /// recorded first: an agent restarted after this point finds the monitor by its lock
    /// there (or stops it from starting the job). The launcher forks it
    /// ([`crate::launcher`]); only when the launcher cannot be used at all does the agent
    /// start it as a program (`exec-job`).
    fn start_monitor(&self, id: RunId, prepared: &Prepared) -> Result<MonitorProc, String> {
        let run_dir = &prepared.run_dir;
        self.hold(id, |h| h.run_dir = Some(run_dir.path().to_path_buf()));
        // The monitor's own messages (never the job's output) go to a log of root's, made
        // here so that a failure to make it is this launch's failure, said.
        let log = run_dir
            .create_new(MONITOR_LOG, 0o600)
            .map_err(|e| format!("the monitor's log: {e}"))?;
        let mut args = vec![std::ffi::OsString::from(format!(
            "--run-dir={}",
            run_dir.path().display()
        ))];
        args.extend(prepared.shim.to_args());
        match self.launcher.launch(run_dir.path(), &args) {
            Ok(launched) => {
                crate::crash::reached(CrashPoint::LaunchSpawned);
                let pid = launched.pid;
                self.hold(id, |h| h.monitor = Some(pid));
                return Ok(MonitorProc::Launched(launched));
            }
            Err(crate::launcher::LaunchError::Unanswered(why)) => {
                tracing::warn!(job = id.0, epoch = id.1, %why, "the launcher did not answer; watching the run's directory");
                return Ok(MonitorProc::Unknown);
            }
            Err(crate::launcher::LaunchError::Fork(e)) => {
                return Err(format!("starting the job's monitor: {e}"));
            }
            Err(e @ crate::launcher::LaunchError::Unavailable(_)) => {
                tracing::warn!(job = id.0, epoch = id.1, error = %e, "starting the monitor as a program");
            }
        }
        self.spawn_monitor(id, prepared, log)
            .map(MonitorProc::Child)
    }

    /// Starts the run's monitor as a program of its own (`exec-job`), its output to `log`.
    fn spawn_monitor(
        &self,
        id: RunId,
        prepared: &Prepared,
        log: std::fs::File,
    ) -> Result<tokio::process::Child, String> {
        let run_dir = &prepared.run_dir;
        let log_too = log
            .try_clone()
            .map_err(|e| format!("the monitor's log: {e}"))?;
        let mut cmd = tokio::process::Command::new(&self.config.shim);
        cmd.arg("exec-job")
            .arg(format!("--run-dir={}", run_dir.path().display()))
            .args(prepared.shim.to_args())
            // Root runs with root's environment, never the job's.
            .env_clear()
            .env("PATH", crate::shim::ROOT_PATH)
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_too)
            .process_group(0)
            .kill_on_drop(false);
        self.hold(id, |h| h.run_dir = Some(run_dir.path().to_path_buf()));
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting the job's monitor: {e}"))?;
        crate::crash::reached(CrashPoint::LaunchSpawned);
        let monitor = child.id().map(|p| p as i32);
        self.hold(id, |h| h.monitor = monitor);
        Ok(child)
    }

    /// Waits (up to 10 s) until the monitor has started the job and recorded its process
    /// group, or has recorded an end.
    async fn wait_until_started(&self, id: RunId, run_dir: &RootDir) {
        let start = Instant::now();
        let pgid = loop {
            if let Some(p) = crate::shim::read_pgid(run_dir) {
                break Some(p);
            }
            if start.elapsed() > Duration::from_secs(10)
                || crate::shim::read_exit(run_dir).is_some()
            {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        self.hold(id, |h| h.pgid = pgid);
    }

    /// Watches a run a previous agent started to its end, by its monitor's lock and exit file.
    pub(super) async fn readopt(&self, id: RunId, path: &Path) {
        let dir = match RootDir::open(path, crate::shim::RUN_DIR_MODE) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(job = id.0, epoch = id.1, error = %e, "the run's directory is gone");
                let seen = self.observe(id);
                return self.step(Input::Ended(id, Outcome::Lost, seen));
            }
        };
        loop {
            // The job's process group, if the previous agent died before it learnt it.
            let pgid = crate::shim::read_pgid(&dir);
            if let Some(h) = self.holdings().get_mut(&id)
                && h.pgid.is_none()
            {
                h.pgid = pgid;
            }
            match crate::shim::probe(&dir) {
                Monitor::Running => tokio::time::sleep(Duration::from_millis(100)).await,
                Monitor::Ended(..) => break,
                Monitor::Gone => {
                    // The monitor died without the job's end: nothing will report it, so
                    // nothing of it may keep running. Confined, its cgroups are emptied when
                    // the run is released; unconfined, its process group is killed, but only
                    // if its leader is still the process the monitor started (not one that
                    // was given the number since): the same start time, or, recorded by an
                    // older monitor without one, a command line naming this run's script
                    // (`jobs/` beside the `runs/` its record is in, whichever directory an
                    // agent of that time kept them in).
                    let script = super::records_root(path)
                        .unwrap_or(&self.config.runtime_dir)
                        .join(JOBS)
                        .join(run_name(id))
                        .join(SCRIPT);
                    let recorded = crate::shim::read_group(&dir);
                    let pgid = pgid.filter(|p| match recorded {
                        Some((_, Some(started))) => crate::shim::leader_start(*p) == Some(started),
                        _ => std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                            String::from_utf8_lossy(&c).contains(&*script.to_string_lossy())
                        }),
                    });
                    let unconfined = self.holdings().get(&id).is_none_or(|h| h.cgroup.is_none());
                    if unconfined {
                        signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
                    }
                    break;
                }
            }
        }
        let outcome = self.recorded_exit(id, &dir, None);
        let seen = self.observe(id);
        self.step(Input::Ended(id, outcome, seen));
    }

    /// How a run ended, as its monitor recorded it; a monitor that died without recording
    /// anything means the run was lost.
    fn recorded_exit(
        &self,
        id: RunId,
        dir: &RootDir,
        monitor_status: Option<std::process::ExitStatus>,
    ) -> Outcome {
        match crate::shim::read_exit(dir) {
            Some(crate::shim::RecordedEnd {
                launch_error: Some(why),
                ..
            }) => Outcome::LaunchFailed(why),
            Some(end) => Outcome::Exited {
                code: end.code,
                signal: end.signal,
            },
            None => {
                let log = dir.read_text(MONITOR_LOG).unwrap_or_default();
                tracing::warn!(job = id.0, ?monitor_status, monitor_log = %log.trim(), "the job's monitor recorded no exit");
                Outcome::Lost
            }
        }
    }
}

/// Names what failed in an I/O error's message.
fn failed(what: &str) -> impl FnOnce(std::io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The job's user, if this agent may run jobs as them (as root, or as that very user).
fn job_user(l: &pb::Launch) -> Result<nix::unistd::User, String> {
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
    Ok(user)
}

/// What a step's tasks on this node start from: the run's user, limits, working directory,
/// the node's own variables of `env`, and the run's directory.
fn step_base(
    l: &pb::Launch,
    shim: &crate::shim::ShimArgs,
    env: &BTreeMap<String, String>,
    run_dir: &RootDir,
) -> crate::steps::StepBase {
    crate::steps::StepBase {
        user: l.user.clone(),
        uid: shim.uid,
        gid: shim.gid,
        rlimit_as: shim.rlimit_as,
        work_dir: shim.work_dir.clone(),
        node_env: env
            .iter()
            .filter(|(k, _)| crate::steps::NODE_VARIABLES.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        run_dir: run_dir.path().to_path_buf(),
    }
}
