//! Job confinement with cgroups, on cgroup v2 hosts and on cgroup v1 hosts.
//!
//! The agent finds its own cgroup in each hierarchy (`/proc/self/cgroup`, mount points from
//! `/proc/self/mountinfo`) and keeps its jobs below it, in `docket-<node>/job_<id>_<epoch>`:
//! - **v2** (the `cgroup2` mount has the controllers): `cpuset.cpus`/`cpuset.mems`,
//!   `memory.max`, `memory.swap.max` (swap only: vmem − memory), `memory.oom.group` (an OOM
//!   kills the whole job), `pids.max`; suspend with `cgroup.freeze`. Because v2 forbids
//!   processes in a cgroup that delegates controllers, the agent first moves itself into a
//!   leaf `agent` cgroup next to its jobs (and a restarted agent started in that leaf, as
//!   systemd's `DelegateSubgroup=agent` does, delegates from its parent).
//! - **v1** (controllers mounted one per hierarchy, as on this build machine): `cpuset`,
//!   `memory` (`limit_in_bytes`, `memsw.limit_in_bytes` for vmem when the kernel accounts
//!   swap), `pids`, `freezer` (`FROZEN`/`THAWED`), `cpuacct` for cpu time, `devices` for the
//!   GPUs a job was not given.
//!
//! On both, the GPUs a job was not given are denied to it ([`crate::devices`]).
//!
//! A process joins its job's cgroups before it runs anything of the job (see
//! [`crate::shim`]), so nothing it forks escapes. Job cgroups are removed when the job ends,
//! and stale ones (an agent killed mid-job) are reaped at start.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What every job cgroup's name starts with (the sweep after a restart removes those it was
/// not told to keep).
const JOB_CGROUP_PREFIX: &str = "job_";

/// The cgroup of run `epoch` of job `job`, under the agent's own cgroup (the same name under
/// every controller on cgroup v1, once on v2).
pub fn job_cgroup_name(job: u64, epoch: u64) -> String {
    format!("{JOB_CGROUP_PREFIX}{job}_{epoch}")
}

/// Confinement could not be set up or applied.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no usable cgroup hierarchy: {0}. Run the agent as root on a host with cgroup v2 (with \
         the cpuset, memory and pids controllers) or the v1 memory and freezer controllers, \
         or start it with --confinement none"
    )]
    Unavailable(String),
    #[error(transparent)]
    Devices(#[from] crate::devices::DevicesError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io_err(path))
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Which kind of hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Version {
    V1,
    V2,
}

/// How long suspending or resuming a job waits for the freezer.
const FREEZE_WAIT: Duration = Duration::from_secs(2);
/// How long signalling a job waits for it to freeze before it signals it anyway.
const SIGNAL_FREEZE_WAIT: Duration = Duration::from_millis(500);

/// The limits of one job.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// Exclusive cpus, as a list (`0-3,8`); None leaves the parent's.
    pub cpus: Option<String>,
    pub memory_bytes: Option<u64>,
    /// Memory plus swap.
    pub vmem_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// Devices the job may not open (the node's GPUs it was not given).
    pub denied_devices: Vec<crate::devices::CharDevice>,
}

/// The agent's place in the cgroup hierarchies.
#[derive(Debug, Clone)]
pub struct Cgroups {
    version: Version,
    /// controller (or "unified") -> the agent's base directory for jobs.
    bases: BTreeMap<String, PathBuf>,
}

/// Controllers used on v1, and whether each is required.
const V1_CONTROLLERS: [(&str, bool); 6] = [
    ("memory", true),
    ("freezer", true),
    ("cpuset", false),
    ("pids", false),
    ("cpuacct", false),
    ("devices", false),
];

impl Cgroups {
    /// Finds the hierarchies and prepares `dir_name` (normally `docket-<node>`) under the
    /// agent's own cgroups. Agents sharing a cgroup (several on one host) need distinct
    /// names: each reaps what it finds under its own as stale.
    pub fn detect(dir_name: &str) -> Result<Self, CgroupError> {
        check_dir_name(dir_name)?;
        let own = read(Path::new("/proc/self/cgroup"))
            .ok_or_else(|| CgroupError::Unavailable("cannot read /proc/self/cgroup".into()))?;
        let mounts = read(Path::new("/proc/self/mountinfo"))
            .ok_or_else(|| CgroupError::Unavailable("cannot read /proc/self/mountinfo".into()))?;
        let (v2_mount, v1_mounts) = cgroup_mounts(&mounts);
        let (v2_path, v1_paths) = own_cgroups(&own);
        // v2 with the controllers we need.
        if let (Some(mount), Some(path)) = (&v2_mount, &v2_path) {
            let own_dir = mount.join(path.trim_start_matches('/'));
            let controllers = read(&own_dir.join("cgroup.controllers")).unwrap_or_default();
            let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
            if has("memory") && has("pids") {
                return Self::setup_v2(&own_dir, dir_name, has("cpuset"));
            }
        }
        // v1.
        Self::setup_v1(&v1_mounts, &v1_paths, dir_name)
    }

    /// Sets up `dir_name` under the agent's own cgroup of each v1 controller mounted (a
    /// required one missing or unusable is an error).
    fn setup_v1(
        v1_mounts: &BTreeMap<String, PathBuf>,
        v1_paths: &BTreeMap<String, String>,
        dir_name: &str,
    ) -> Result<Self, CgroupError> {
        let mut bases = BTreeMap::new();
        for (ctrl, required) in V1_CONTROLLERS {
            match (v1_mounts.get(ctrl), v1_paths.get(ctrl)) {
                (Some(mount), Some(path)) => {
                    let base = mount.join(path.trim_start_matches('/')).join(dir_name);
                    if let Err(e) = std::fs::create_dir_all(&base) {
                        if required {
                            return Err(CgroupError::Unavailable(format!(
                                "cannot create {}: {e}",
                                base.display()
                            )));
                        }
                        continue;
                    }
                    if ctrl == "cpuset" {
                        inherit_v1_cpuset(&base, mount)?;
                    }
                    bases.insert(ctrl.to_owned(), base);
                }
                _ if required => {
                    return Err(CgroupError::Unavailable(format!(
                        "the v1 {ctrl} controller is not mounted, and cgroup v2 has no memory/pids controllers"
                    )));
                }
                _ => {}
            }
        }
        Ok(Cgroups {
            version: Version::V1,
            bases,
        })
    }

    /// Sets up under the agent's delegated cgroup (systemd's `Delegate=yes`): the agent moves
    /// into a leaf `agent` (v2 allows no processes in a cgroup that hands controllers down),
    /// enables the controllers it needs in the delegated cgroup's `cgroup.subtree_control`,
    /// and keeps its jobs in `dir_name` beside that leaf. An agent already in a leaf named
    /// `agent` (`DelegateSubgroup=agent`, or restarted into it) delegates from its parent.
    fn setup_v2(own: &Path, dir_name: &str, cpuset: bool) -> Result<Self, CgroupError> {
        let delegated = match own.parent() {
            Some(parent) if own.file_name().is_some_and(|n| n == "agent") => parent,
            _ => own,
        };
        let unusable = |e: CgroupError| {
            CgroupError::Unavailable(format!(
                "cgroup v2: cannot take {} as the agent's delegated cgroup ({e}); start the \
                 agent as root in a cgroup of its own (systemd: Delegate=yes)",
                delegated.display()
            ))
        };
        let agent = delegated.join("agent");
        std::fs::create_dir_all(&agent)
            .map_err(io_err(&agent))
            .map_err(unusable)?;
        write(&agent.join("cgroup.procs"), &std::process::id().to_string()).map_err(unusable)?;
        let enable = if cpuset {
            "+cpuset +memory +pids"
        } else {
            "+memory +pids"
        };
        write(&delegated.join("cgroup.subtree_control"), enable).map_err(unusable)?;
        let base = delegated.join(dir_name);
        std::fs::create_dir_all(&base)
            .map_err(io_err(&base))
            .map_err(unusable)?;
        write(&base.join("cgroup.subtree_control"), enable).map_err(unusable)?;
        Ok(Cgroups {
            version: Version::V2,
            bases: BTreeMap::from([("unified".to_owned(), base)]),
        })
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// Whether jobs can be kept off devices: v2 always (a device program), v1 with the devices
    /// controller.
    pub fn constrains_devices(&self) -> bool {
        self.version == Version::V2 || self.bases.contains_key("devices")
    }

    /// Removes job cgroups left by an agent that died mid-job (killing what is in them),
    /// except those of runs it re-adopted (`keep`: `job_<id>_<epoch>` names).
    pub fn reap_stale(&self, keep: &std::collections::BTreeSet<String>) {
        for base in self.bases.values() {
            let Ok(entries) = std::fs::read_dir(base) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(JOB_CGROUP_PREFIX) && !keep.contains(&name) {
                    tracing::warn!(path = %e.path().display(), "reaping a stale job cgroup");
                    kill_all(&e.path());
                    let _ = remove_dir_retrying(&e.path());
                }
            }
        }
    }

    /// Job `(job, epoch)`'s cgroups as far as they exist (a creation that failed half-way),
    /// so that they can be removed.
    pub fn existing(&self, job: u64, epoch: u64) -> JobCgroup {
        let name = job_cgroup_name(job, epoch);
        JobCgroup {
            version: self.version,
            dirs: self
                .bases
                .iter()
                .map(|(ctrl, base)| (ctrl.clone(), base.join(&name)))
                .filter(|(_, dir)| dir.exists())
                .collect(),
        }
    }

    /// Creates job `(job, epoch)`'s cgroups with `limits`.
    pub fn create(&self, job: u64, epoch: u64, limits: &Limits) -> Result<JobCgroup, CgroupError> {
        let name = job_cgroup_name(job, epoch);
        let mut dirs = BTreeMap::new();
        for (ctrl, base) in &self.bases {
            let dir = base.join(&name);
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            dirs.insert(ctrl.clone(), dir);
        }
        let cg = JobCgroup {
            version: self.version,
            dirs,
        };
        cg.limit(limits)?;
        Ok(cg)
    }
}

/// Refuses a name for the agent's jobs' cgroup that is not one short path component.
fn check_dir_name(dir_name: &str) -> Result<(), CgroupError> {
    if dir_name.is_empty()
        || dir_name.contains('/')
        || dir_name == "."
        || dir_name == ".."
        || dir_name.len() > 200
    {
        return Err(CgroupError::Unavailable(format!(
            "cgroup name {dir_name:?} must be one path component of at most 200 bytes"
        )));
    }
    Ok(())
}

/// The cgroup mount points in `mountinfo` (`/proc/self/mountinfo`): cgroup2's, and each v1
/// controller's.
fn cgroup_mounts(mountinfo: &str) -> (Option<PathBuf>, BTreeMap<String, PathBuf>) {
    // Mount points: "cgroup2" -> path; v1 controller -> path.
    let mut v2_mount = None;
    let mut v1_mounts: BTreeMap<String, PathBuf> = BTreeMap::new();
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(mount), Some(fstype), Some(opts)) =
            (fields.get(4), fields.get(sep + 1), fields.get(sep + 3))
        else {
            continue;
        };
        match *fstype {
            "cgroup2" => v2_mount = Some(PathBuf::from(mount)),
            "cgroup" => {
                for opt in opts.split(',') {
                    v1_mounts.insert(opt.to_owned(), PathBuf::from(mount));
                }
            }
            _ => {}
        }
    }
    (v2_mount, v1_mounts)
}

/// This process's cgroups in `proc_cgroup` (`/proc/self/cgroup`): its v2 path, and its path
/// under each v1 controller.
fn own_cgroups(proc_cgroup: &str) -> (Option<String>, BTreeMap<String, String>) {
    let mut v1_paths: BTreeMap<String, String> = BTreeMap::new();
    let mut v2_path = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if ctrls.is_empty() {
            v2_path = Some(path.to_owned());
        } else {
            for c in ctrls.split(',') {
                v1_paths.insert(c.to_owned(), path.to_owned());
            }
        }
    }
    (v2_path, v1_paths)
}

/// Gives the v1 cpuset cgroup `base` its parent's cpus and memory nodes where it has none
/// (mounted at `mount`).
fn inherit_v1_cpuset(base: &Path, mount: &Path) -> Result<(), CgroupError> {
    // A v1 cpuset cgroup takes no task until it has cpus and mems.
    let parent = base.parent().unwrap_or(mount);
    for f in ["cpuset.cpus", "cpuset.mems"] {
        if read(&base.join(f)).is_none_or(|v| v.trim().is_empty()) {
            let v = read(&parent.join(f)).unwrap_or_default();
            write(&base.join(f), v.trim())?;
        }
    }
    Ok(())
}

impl Limits {
    /// The memory limit and the memory-plus-swap limit, bytes, if either is set. vmem bounds
    /// memory and swap together (PBS's `vmem`, NCI: the job's whole virtual memory), so it
    /// also caps memory alone: a vmem under the memory limit lowers it, and a vmem without a
    /// memory limit is both. Without vmem no swap is allowed beyond memory.
    pub fn memory_and_swap(&self) -> Option<(u64, u64)> {
        let memory = match (self.memory_bytes, self.vmem_bytes) {
            (Some(m), Some(v)) => m.min(v),
            (Some(m), None) => m,
            (None, Some(v)) => v,
            (None, None) => return None,
        };
        Some((memory, self.vmem_bytes.unwrap_or(memory).max(memory)))
    }
}

/// One job's cgroups (serializable, so a restarted agent finds them again).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobCgroup {
    version: Version,
    dirs: BTreeMap<String, PathBuf>,
}

impl JobCgroup {
    fn dir(&self, ctrl: &str) -> Option<&Path> {
        let key = if self.version == Version::V2 {
            "unified"
        } else {
            ctrl
        };
        self.dirs.get(key).map(PathBuf::as_path)
    }

    fn limit(&self, l: &Limits) -> Result<(), CgroupError> {
        match self.version {
            Version::V2 => {
                let Some(d) = self.dir("unified") else {
                    return Ok(());
                };
                if let Some(cpus) = &l.cpus
                    && d.join("cpuset.cpus").exists()
                {
                    write(&d.join("cpuset.cpus"), cpus)?;
                }
                if let Some((m, with_swap)) = l.memory_and_swap() {
                    write(&d.join("memory.max"), &m.to_string())?;
                    // v2's file is swap only: Slurm's memsw limit less the memory limit.
                    if d.join("memory.swap.max").exists() {
                        write(&d.join("memory.swap.max"), &(with_swap - m).to_string())?;
                    }
                }
                write(&d.join("memory.oom.group"), "1")?;
                if let Some(p) = l.pids {
                    write(&d.join("pids.max"), &p.to_string())?;
                }
                crate::devices::deny_v2(d, &l.denied_devices)?;
            }
            Version::V1 => {
                if let Some(d) = self.dir("cpuset") {
                    let parent_mems = d
                        .parent()
                        .and_then(|p| read(&p.join("cpuset.mems")))
                        .unwrap_or_default();
                    let cpus = match &l.cpus {
                        Some(c) => c.clone(),
                        None => d
                            .parent()
                            .and_then(|p| read(&p.join("cpuset.cpus")))
                            .unwrap_or_default(),
                    };
                    write(&d.join("cpuset.cpus"), cpus.trim())?;
                    write(&d.join("cpuset.mems"), parent_mems.trim())?;
                }
                if let Some(d) = self.dir("memory")
                    && let Some((m, with_swap)) = l.memory_and_swap()
                {
                    write(&d.join("memory.limit_in_bytes"), &m.to_string())?;
                    let memsw = d.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write(&memsw, &with_swap.to_string())?;
                    } else if l.vmem_bytes.is_some() {
                        tracing::warn!(
                            "this kernel does not account swap (swapaccount=0): vmem limits \
                             memory only"
                        );
                    }
                }
                if let Some(d) = self.dir("pids")
                    && let Some(p) = l.pids
                {
                    write(&d.join("pids.max"), &p.to_string())?;
                }
                if !l.denied_devices.is_empty() {
                    let d = self.dir("devices").ok_or_else(|| {
                        CgroupError::Unavailable(
                            "the v1 devices controller is not mounted: GPUs cannot be kept \
                             apart"
                                .into(),
                        )
                    })?;
                    crate::devices::deny_v1(d, &l.denied_devices)?;
                }
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files a process writes its pid into to join this job.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.values().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Freezes or thaws every process of the job, waiting (up to 2 s) until it took effect.
    pub fn freeze(&self, frozen: bool) -> Result<(), CgroupError> {
        self.freeze_within(frozen, FREEZE_WAIT)
    }

    fn freeze_within(&self, frozen: bool, wait: Duration) -> Result<(), CgroupError> {
        let (file, value, check, want) = match self.version {
            Version::V2 => (
                "cgroup.freeze",
                if frozen { "1" } else { "0" },
                "cgroup.events",
                if frozen { "frozen 1" } else { "frozen 0" },
            ),
            Version::V1 => (
                "freezer.state",
                if frozen { "FROZEN" } else { "THAWED" },
                "freezer.state",
                if frozen { "FROZEN" } else { "THAWED" },
            ),
        };
        let Some(d) = self.dir("freezer") else {
            return Err(CgroupError::Unavailable("no freezer for this job".into()));
        };
        write(&d.join(file), value)?;
        let start = Instant::now();
        loop {
            if read(&d.join(check)).is_some_and(|s| s.contains(want)) {
                return Ok(());
            }
            if start.elapsed() >= wait {
                return Err(CgroupError::Io {
                    path: d.join(check),
                    source: io::Error::other(format!(
                        "did not reach {want} within {} ms",
                        wait.as_millis()
                    )),
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Whether the kernel's OOM killer killed something of the job.
    pub fn oom_killed(&self) -> bool {
        let (file, key) = match self.version {
            Version::V2 => ("memory.events", "oom_kill"),
            Version::V1 => ("memory.oom_control", "oom_kill"),
        };
        self.dir("memory")
            .and_then(|d| read(&d.join(file)))
            .is_some_and(|text| {
                text.lines().any(|l| {
                    let mut it = l.split_whitespace();
                    it.next() == Some(key)
                        && it.next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0) > 0
                })
            })
    }

    /// Peak memory, MiB.
    pub fn peak_memory_mib(&self) -> u64 {
        let file = match self.version {
            Version::V2 => "memory.peak",
            Version::V1 => "memory.max_usage_in_bytes",
        };
        self.dir("memory")
            .and_then(|d| read(&d.join(file)))
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or(0, |b| b >> 20)
    }

    /// CPU time used, milliseconds.
    pub fn cpu_time_ms(&self) -> u64 {
        match self.version {
            Version::V2 => self
                .dir("cpu")
                .and_then(|d| read(&d.join("cpu.stat")))
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("usage_usec ").map(|v| v.trim().to_owned()))
                })
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(0, |us| us / 1000),
            Version::V1 => self
                .dir("cpuacct")
                .and_then(|d| read(&d.join("cpuacct.usage")))
                .and_then(|s| s.trim().parse::<u64>().ok())
                .map_or(0, |ns| ns / 1_000_000),
        }
    }

    /// Sends `signal` to every process of the job. SIGKILL on v2 is `cgroup.kill` (the
    /// kernel kills every member, forks included). Otherwise the job is frozen first, so no
    /// member can fork a child the signal would miss, each member is signalled, and the job is
    /// thawed again — unless `stay_frozen` (a suspended job keeps the signal pending until it
    /// is resumed). A job that cannot be frozen (a member stuck in the kernel, on a hung
    /// network filesystem, say) is signalled all the same: the freezer's failure is returned
    /// after the signal went out, never instead of it. A SIGKILL is repeated until the job's
    /// cgroup is empty (a member forked while the first round went out dies in the next),
    /// for up to a second.
    pub fn signal_all(
        &self,
        signal: nix::sys::signal::Signal,
        stay_frozen: bool,
    ) -> Result<(), CgroupError> {
        let Some(d) = self.dir("freezer") else {
            return Err(CgroupError::Unavailable("no freezer for this job".into()));
        };
        if signal == nix::sys::signal::Signal::SIGKILL
            && d.join("cgroup.kill").exists()
            && write(&d.join("cgroup.kill"), "1").is_ok()
        {
            return Ok(());
        }
        let frozen = self.freeze_within(true, SIGNAL_FREEZE_WAIT);
        let procs = d.join("cgroup.procs");
        std::fs::metadata(&procs).map_err(io_err(&procs))?;
        for pid in members_of(d) {
            match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => tracing::warn!(pid, ?signal, error = %e, "signalling a job process"),
            }
        }
        if stay_frozen && frozen.is_ok() {
            return Ok(());
        }
        let thawed = self.freeze_within(false, SIGNAL_FREEZE_WAIT);
        if signal == nix::sys::signal::Signal::SIGKILL {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(1) && !members_of(d).is_empty() {
                kill_members(d);
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        frozen.and(thawed)
    }

    /// The steps whose cgroups exist below the job's (`step_N`), in any controller.
    pub fn existing_steps(&self) -> Vec<u32> {
        let mut steps = std::collections::BTreeSet::new();
        for d in self.dirs.values() {
            let Ok(entries) = std::fs::read_dir(d) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name();
                if let Some(n) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("step_"))
                    .and_then(|n| n.parse::<u32>().ok())
                    && e.file_type().is_ok_and(|t| t.is_dir())
                {
                    steps.insert(n);
                }
            }
        }
        steps.into_iter().collect()
    }

    /// The cgroups of step `step` of this job, created below the job's: the step's tasks are
    /// held by the job's limits and its own are counted apart (cpu time), signalled and
    /// killed apart. On v2 the job's cgroup enables no controller for its children (it holds
    /// the batch script's processes itself, and v2 forbids both), so a step has the core
    /// files only: `cgroup.procs`, `cgroup.freeze`, `cgroup.kill`, `cpu.stat`. On v1 a cpuset
    /// child starts empty and gets its parent's cpus and memory nodes.
    pub fn step(&self, step: u32) -> Result<JobCgroup, CgroupError> {
        let name = format!("step_{step}");
        let mut dirs = BTreeMap::new();
        for (ctrl, parent) in &self.dirs {
            let dir = parent.join(&name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(&dir)(e)),
            }
            if self.version == Version::V1 && ctrl == "cpuset" {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let value = read(&parent.join(file)).unwrap_or_default();
                    write(&dir.join(file), value.trim())?;
                }
            }
            dirs.insert(ctrl.clone(), dir);
        }
        Ok(JobCgroup {
            version: self.version,
            dirs,
        })
    }

    /// Removes the job's cgroups; one that still holds a straggler is emptied first.
    ///
    /// Each is first removed as it is: the kernel refuses (`EBUSY`) to remove a cgroup that
    /// still has a member or a child, so a removal that succeeds left nothing behind to kill.
    /// Only a refused one is emptied (its members killed, its steps' cgroups removed) and
    /// removed again. At the usual end (every process of the job gone, no step) this spares
    /// reading each controller's `cgroup.procs` and listing its directory twice: 18 opens
    /// of a job's 43 on cgroup v1.
    pub fn remove(&self) {
        let busy: Vec<&PathBuf> = self
            .dirs
            .values()
            .filter(|d| match std::fs::remove_dir(d) {
                Ok(()) => false,
                Err(e) => e.kind() != io::ErrorKind::NotFound,
            })
            .collect();
        for d in &busy {
            kill_all(d);
        }
        for d in busy {
            if let Err(e) = remove_dir_retrying(d) {
                tracing::warn!(path = %d.display(), error = %e, "could not remove a job cgroup");
            }
        }
    }
}

/// SIGKILLs every process in the cgroup `dir`: `cgroup.kill` where the kernel has it (v2
/// from Linux 5.14); otherwise frozen first (v1 `freezer.state`, v2 `cgroup.freeze`) so nothing
/// forks meanwhile, every member killed, then thawed so the signals are delivered. A job's
/// memory or cpuset cgroup on v1 holds the same processes as its freezer cgroup, which is
/// emptied this way too.
///
/// A cgroup with no member (the usual end: every process of the job has exited) is left
/// alone: nothing is left that could fork, and a process enters a cgroup only by a member's
/// fork or by a root write to `cgroup.procs`, which freezing would not stop either. On cgroup
/// v1 each freeze and thaw also patches the kernel's text (the freezer's static key, turned on
/// while any cgroup is frozen), paid on every cpu: at hundreds of short jobs a second this
/// was a tenth of the agent's cpu.
fn kill_all(dir: &Path) {
    if members_of(dir).is_empty() {
        return;
    }
    if dir.join("cgroup.kill").exists() && std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    let freezer = if dir.join("freezer.state").exists() {
        Some((
            "freezer.state",
            "FROZEN",
            "THAWED",
            "freezer.state",
            "FROZEN",
        ))
    } else if dir.join("cgroup.freeze").exists() {
        Some(("cgroup.freeze", "1", "0", "cgroup.events", "frozen 1"))
    } else {
        None
    };
    if let Some((file, freeze, _, check, frozen)) = freezer {
        let _ = std::fs::write(dir.join(file), freeze);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(1)
            && !read(&dir.join(check)).is_some_and(|s| s.contains(frozen))
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    kill_members(dir);
    // A frozen cgroup must be thawed for its processes to die.
    if let Some((file, _, thaw, _, _)) = freezer {
        let _ = std::fs::write(dir.join(file), thaw);
    }
}

/// The cgroups below `dir` (a job's steps), one level down.
fn children_of(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// The pids in the cgroup `dir` and in its steps' cgroups.
fn members_of(dir: &Path) -> Vec<i32> {
    let mut pids = own_members(dir);
    for child in children_of(dir) {
        pids.extend(own_members(&child));
    }
    pids
}

/// The processes in the cgroup `d` itself: `cgroup.procs`, or, when that lists none, its
/// threads (`tasks` on v1, `cgroup.threads` on v2). Kernels before 5.3 leave out of
/// `cgroup.procs` a process whose main thread has exited while its other threads run on,
/// which would let such a job outlive its end; a signal sent to any thread's id reaches
/// its whole process.
fn own_members(d: &Path) -> Vec<i32> {
    let ids = |file: &str| -> Vec<i32> {
        read(&d.join(file))
            .map(|ids| {
                ids.lines()
                    .filter_map(|l| l.trim().parse::<i32>().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let procs = ids("cgroup.procs");
    if !procs.is_empty() {
        return procs;
    }
    ["tasks", "cgroup.threads"]
        .into_iter()
        .map(ids)
        .find(|threads| !threads.is_empty())
        .unwrap_or_default()
}

fn kill_members(dir: &Path) {
    for pid in members_of(dir) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn remove_dir_retrying(dir: &Path) -> io::Result<()> {
    for child in children_of(dir) {
        remove_dir_retrying(&child)?;
    }
    let start = Instant::now();
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if start.elapsed() > Duration::from_secs(5) => return Err(e),
            Err(_) => {
                kill_all(dir);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmem_bounds_memory_and_swap_together() {
        let l = |memory_bytes, vmem_bytes| Limits {
            memory_bytes,
            vmem_bytes,
            ..Limits::default()
        };
        assert_eq!(l(None, None).memory_and_swap(), None);
        assert_eq!(l(Some(100), None).memory_and_swap(), Some((100, 100)));
        assert_eq!(l(Some(100), Some(300)).memory_and_swap(), Some((100, 300)));
        assert_eq!(l(Some(100), Some(40)).memory_and_swap(), Some((40, 40)));
        assert_eq!(l(None, Some(40)).memory_and_swap(), Some((40, 40)));
    }

    /// A process whose main thread has exited is missing from `cgroup.procs` on kernels
    /// before 5.3 while its other threads run: its threads' ids are its members then.
    #[test]
    fn members_fall_back_to_the_threads_when_no_process_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("cgroup.procs"), "").unwrap();
        std::fs::write(d.join("tasks"), "41\n42\n").unwrap();
        assert_eq!(own_members(d), vec![41, 42]);
        // Listed processes are the members, not their threads.
        std::fs::write(d.join("cgroup.procs"), "40\n").unwrap();
        assert_eq!(own_members(d), vec![40]);
        // v2 names the threads' file `cgroup.threads`; a step's cgroup counts too.
        std::fs::write(d.join("cgroup.procs"), "").unwrap();
        std::fs::remove_file(d.join("tasks")).unwrap();
        std::fs::write(d.join("cgroup.threads"), "43\n").unwrap();
        let step = d.join("step_0");
        std::fs::create_dir(&step).unwrap();
        std::fs::write(step.join("cgroup.procs"), "44\n").unwrap();
        assert_eq!(members_of(d), vec![43, 44]);
    }

    #[test]
    fn a_cgroup_name_is_one_path_component() {
        for bad in ["", "a/b", "..", ".", &"x".repeat(201)] {
            let e = Cgroups::detect(bad).err().map(|e| e.to_string());
            assert!(
                e.as_deref()
                    .is_some_and(|e| e.contains("one path component")),
                "{bad:?}: {e:?}"
            );
        }
    }
}
