//! Starting, finding, faulting and stopping the processes of a local cluster.
//!
//! The record of what was started (`STATE/cluster.json`: every replica's id, address, data
//! directory and pid, every agent's spec, state directory, pid and cgroups) is written as soon
//! as the processes exist, so `down` from another invocation stops exactly those. Processes
//! run in sessions (and so process groups) of their own, as systemd starts services: a
//! launcher that exits leaves them running (the point of `up`), a signal meant for one of
//! them reaches no other, and the scheduler weighs each apart.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use docket_auth::local::LocalSecrets;
use docket_auth::tls::Role;

use crate::layout::{AgentSpec, Layout};
use crate::{LaunchError, rpc};

/// A controller replica.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicaProc {
    pub id: u64,
    pub addr: String,
    /// `/metrics` and `/status`.
    pub http: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    pub pid: Option<i32>,
}

/// A node agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentProc {
    pub spec: AgentSpec,
    pub state_dir: PathBuf,
    /// Its runs' records and its jobs' directories (`--runtime-dir`): `STATE/run/NODE`.
    #[serde(default)]
    pub runtime_dir: PathBuf,
    pub log: PathBuf,
    pub pid: Option<i32>,
    /// Its jobs' cgroup directory under the agent's cgroup in each hierarchy (removed at
    /// `down`).
    pub cgroups: Vec<PathBuf>,
    /// Where `srun` reaches its step service (`host:port`); none for simulated agents.
    #[serde(default)]
    pub step_address: Option<String>,
}

/// The credential signer (`docket-authd`) of the host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuthdProc {
    pub socket: PathBuf,
    pub log: PathBuf,
    pub pid: Option<i32>,
}

/// What was started: `STATE/cluster.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub state_dir: PathBuf,
    /// The cluster's CA, certificates and credential key (`STATE/secrets`, 0700).
    #[serde(default)]
    pub secrets: Option<PathBuf>,
    /// The host's credential signer.
    #[serde(default)]
    pub authd: Option<AuthdProc>,
    pub bin_dir: PathBuf,
    pub site: PathBuf,
    pub confinement: String,
    pub agent_heartbeat_ms: u64,
    pub agent_fence_ms: u64,
    pub node_down_margin_ms: u64,
    #[serde(default)]
    pub agent_ping_ms: Option<u64>,
    #[serde(default)]
    pub raft_heartbeat_ms: Option<u64>,
    #[serde(default)]
    pub election_timeout_ms: Option<String>,
    #[serde(default)]
    pub snapshot_every_entries: Option<u64>,
    #[serde(default)]
    pub snapshot_keep_entries: Option<u64>,
    pub kill_grace_s: u64,
    /// Distinguishes this cluster's agent cgroups from any other agent's on the host.
    pub cgroup_tag: String,
    /// The replicas' namespaces and links, when they can be partitioned.
    #[serde(default)]
    pub net: Option<crate::net::Net>,
    /// The size of each replica's own data disk (a tmpfs), when its disk can be filled.
    #[serde(default)]
    pub data_disk_mib: Option<u64>,
    /// libfaketime, when replicas' clocks can jump.
    #[serde(default)]
    pub faketime: Option<PathBuf>,
    pub replicas: Vec<ReplicaProc>,
    pub agents: Vec<AgentProc>,
}

/// A running local cluster.
#[derive(Debug)]
pub struct LocalCluster {
    pub record: Record,
    /// Processes this invocation started (reaped here; others are reparented to init).
    children: BTreeMap<i32, Child>,
}

/// Whether `pid` is a live process (not a zombie).
pub fn alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// A free loopback address for a daemon of a local cluster.
fn free_addr() -> Result<String, LaunchError> {
    docket_auth::local::free_loopback_addr().map_err(LaunchError::Invalid)
}

fn record_path(state_dir: &Path) -> PathBuf {
    state_dir.join("cluster.json")
}

/// Whether libfaketime is installed (clock jumps possible).
pub fn faketime_available() -> bool {
    find_faketime().is_ok()
}

/// libfaketime's preload library.
fn find_faketime() -> Result<PathBuf, LaunchError> {
    let dirs = std::fs::read_dir("/usr/lib")
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default();
    dirs.iter()
        .map(|d| d.join("faketime/libfaketime.so.1"))
        .chain(std::iter::once(PathBuf::from(
            "/usr/lib/faketime/libfaketime.so.1",
        )))
        .find(|p| p.exists())
        .ok_or_else(|| {
            LaunchError::Invalid(
                "clock jumps need libfaketime (apt-get install libfaketime)".into(),
            )
        })
}

/// The agents' runtime directories, `STATE/run/NODE`: each real agent mounts a tmpfs of its
/// own there (`docket-nodeagent --runtime-dir`), which lasts until `down`: restarted agents
/// find their runs' records in it.
pub const RUNTIME_DIR: &str = "run";

/// A short tag from the state directory: clusters in different directories never share an
/// agent cgroup name (FNV-1a, 32 bits).
fn tag_of(dir: &Path) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in dir.display().to_string().bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

/// The directory an agent keeps its jobs' cgroups in, under its own cgroup.
pub fn cgroup_name(tag: &str, node: &str) -> String {
    format!("docket-{node}-{tag}")
}

/// The `cgroup_name` directories an agent process creates under its cgroups.
fn agent_cgroups(pid: i32, name: &str) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut p = line.splitn(3, ':');
            let (_, ctrls, path) = (p.next()?, p.next()?, p.next()?);
            let mount = if ctrls.is_empty() {
                "/sys/fs/cgroup".to_owned()
            } else {
                let c = ctrls.split(',').find(|c| !c.starts_with("name="))?;
                format!("/sys/fs/cgroup/{c}")
            };
            Some(
                Path::new(&mount)
                    .join(path.trim_start_matches('/'))
                    .join(name),
            )
        })
        .collect()
}

impl LocalCluster {
    /// Starts the cluster `layout` describes. Refuses a state directory whose cluster still
    /// runs.
    pub fn start(layout: &Layout) -> Result<LocalCluster, LaunchError> {
        let state = &layout.state_dir;
        Self::check_startable(layout)?;
        let site = Self::prepare_state_dir(layout)?;
        let tag = tag_of(state);
        let net = Self::plan_network(layout, &tag)?;
        let (replicas, agents) = Self::plan_processes(layout, net.as_ref())?;
        let secrets_dir = Self::make_secrets(layout, &replicas)?;
        let mut cluster = LocalCluster {
            record: Record {
                state_dir: state.clone(),
                secrets: Some(secrets_dir),
                authd: Some(AuthdProc {
                    socket: state.join("authd.sock"),
                    log: state.join("logs").join("authd.log"),
                    pid: None,
                }),
                bin_dir: layout.bin_dir.clone(),
                site,
                confinement: layout.confinement.clone(),
                agent_heartbeat_ms: layout.agent_heartbeat_ms,
                agent_fence_ms: layout.agent_fence_ms,
                node_down_margin_ms: layout.node_down_margin_ms,
                agent_ping_ms: layout.agent_ping_ms,
                raft_heartbeat_ms: layout.raft_heartbeat_ms,
                election_timeout_ms: layout.election_timeout_ms.clone(),
                snapshot_every_entries: layout.snapshot_every_entries,
                snapshot_keep_entries: layout.snapshot_keep_entries,
                kill_grace_s: layout.kill_grace_s,
                cgroup_tag: tag,
                net,
                data_disk_mib: layout.data_disk_mib,
                faketime: if layout.fake_clocks {
                    Some(find_faketime()?)
                } else {
                    None
                },
                replicas,
                agents,
            },
            children: BTreeMap::new(),
        };
        cluster.mount_data_disks(layout.data_disk_mib)?;
        cluster.start_authd()?;
        let ids: Vec<u64> = cluster.record.replicas.iter().map(|r| r.id).collect();
        for id in ids {
            cluster.start_replica(id, id == 1)?;
        }
        let names: Vec<String> = cluster
            .record
            .agents
            .iter()
            .map(|a| a.spec.name.clone())
            .collect();
        for name in names {
            cluster.start_agent(&name)?;
        }
        cluster.save()?;
        Ok(cluster)
    }

    /// A state directory whose cluster is not running, the binaries built, a replica count
    /// within 1..=9.
    fn check_startable(layout: &Layout) -> Result<(), LaunchError> {
        let state = &layout.state_dir;
        if let Ok(old) = LocalCluster::open(state)
            && old.running() > 0
        {
            return Err(LaunchError::Invalid(format!(
                "a cluster already runs from {} ({} processes); stop it with `docket-local down --state-dir {}`",
                state.display(),
                old.running(),
                state.display()
            )));
        }
        for bin in ["docket-controller", "docket-nodeagent", "docket-authd"] {
            if !layout.bin_dir.join(bin).exists() {
                return Err(LaunchError::Invalid(format!(
                    "{} is missing: build the workspace first (cargo build --workspace --bins)",
                    layout.bin_dir.join(bin).display()
                )));
            }
        }
        if layout.replicas == 0 || layout.replicas > 9 {
            return Err(LaunchError::Invalid(format!(
                "replicas: {} is not between 1 and 9",
                layout.replicas
            )));
        }
        Ok(())
    }

    /// A fresh, marked state directory with its `logs/` and the site's `docket.toml` (whose
    /// path it returns).
    fn prepare_state_dir(layout: &Layout) -> Result<PathBuf, LaunchError> {
        let state = &layout.state_dir;
        // A fresh start: old data would bring back an old cluster. Only a directory a
        // launcher created is emptied (see `state_dir`).
        crate::state_dir::prepare(state)?;
        std::fs::create_dir_all(state.join("logs"))
            .map_err(LaunchError::io(format!("creating {}", state.display())))?;
        let site = state.join("docket.toml");
        std::fs::write(&site, layout.site_toml())
            .map_err(LaunchError::io(format!("writing {}", site.display())))?;
        Ok(site)
    }

    /// With `netns`, a network namespace per replica behind a bridge (root only).
    fn plan_network(layout: &Layout, tag: &str) -> Result<Option<crate::net::Net>, LaunchError> {
        Ok(if layout.netns {
            if !nix::unistd::geteuid().is_root() {
                return Err(LaunchError::Invalid(
                    "network namespaces (for partitions) need root".into(),
                ));
            }
            let net = crate::net::Net::plan(tag, u64::from(layout.replicas));
            net.create()?;
            Some(net)
        } else {
            None
        })
    }

    /// Every replica's and agent's addresses, data and log paths (nothing started yet).
    fn plan_processes(
        layout: &Layout,
        net: Option<&crate::net::Net>,
    ) -> Result<(Vec<ReplicaProc>, Vec<AgentProc>), LaunchError> {
        let state = &layout.state_dir;
        let mut replicas = Vec::new();
        for id in 1..=u64::from(layout.replicas) {
            let (addr, http) = match net {
                // Each namespace has its own ports.
                Some(n) => (
                    format!("{}:6817", n.addr(id)),
                    format!("{}:6819", n.addr(id)),
                ),
                None => (free_addr()?, free_addr()?),
            };
            replicas.push(ReplicaProc {
                id,
                addr,
                http,
                data_dir: state.join(format!("controller-{id}")),
                log: state.join("logs").join(format!("controller-{id}.log")),
                pid: None,
            });
        }
        let agents = layout
            .agents
            .iter()
            .map(|spec| AgentProc {
                spec: spec.clone(),
                state_dir: state.join("agents").join(&spec.name),
                runtime_dir: state.join(RUNTIME_DIR).join(&spec.name),
                log: state.join("logs").join(format!("agent-{}.log", spec.name)),
                pid: None,
                cgroups: Vec::new(),
                step_address: None,
            })
            .collect();
        Ok((replicas, agents))
    }

    /// The cluster's secrets in `secrets/`: a CA, a certificate per replica (for the address
    /// it is reached at), per agent and for this launcher, and the credential key; the CA
    /// certificate copied where every user can read it.
    fn make_secrets(layout: &Layout, replicas: &[ReplicaProc]) -> Result<PathBuf, LaunchError> {
        let state = &layout.state_dir;
        let secrets_dir = state.join("secrets");
        let secrets = LocalSecrets::create(&secrets_dir, "local")
            .map_err(|e| LaunchError::Invalid(format!("making the cluster's secrets: {e}")))?;
        let issue = |role: Role, hosts: Vec<String>| {
            secrets
                .issue(&role, &hosts)
                .map(|_| ())
                .map_err(|e| LaunchError::Invalid(format!("issuing {role}'s certificate: {e}")))
        };
        for r in replicas {
            let host = r.addr.rsplit_once(':').map_or(r.addr.as_str(), |(h, _)| h);
            issue(Role::Replica(r.id), vec![host.to_owned()])?;
        }
        for a in &layout.agents {
            // Agents serve srun on loopback.
            issue(Role::Node(a.name.clone()), vec!["127.0.0.1".to_owned()])?;
        }
        // The CA certificate every user's commands need, where every user can read it.
        std::fs::copy(secrets.ca(), state.join("ca.pem"))
            .map_err(LaunchError::io("copying the CA certificate"))?;
        rpc::use_secrets(&secrets)?;
        Ok(secrets_dir)
    }

    /// With a data disk size, a tmpfs of that size on each replica's data directory (root
    /// only), so that a fault can fill it.
    fn mount_data_disks(&self, mib: Option<u64>) -> Result<(), LaunchError> {
        let Some(mib) = mib else {
            return Ok(());
        };
        if !nix::unistd::geteuid().is_root() {
            return Err(LaunchError::Invalid(
                "data disks of their own (for filling) need root".into(),
            ));
        }
        for r in &self.record.replicas {
            std::fs::create_dir_all(&r.data_dir).map_err(LaunchError::io(format!(
                "creating {}",
                r.data_dir.display()
            )))?;
            nix::mount::mount(
                Some("tmpfs"),
                &r.data_dir,
                Some("tmpfs"),
                nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                Some(format!("size={mib}m,mode=0700").as_str()),
            )
            .map_err(|e| {
                LaunchError::Invalid(format!(
                    "mounting a {mib} MiB tmpfs on {}: {e}",
                    r.data_dir.display()
                ))
            })?;
        }
        Ok(())
    }

    /// What `state_dir` records of its cluster, read only (no access to it is set up).
    pub fn read_record(state_dir: &Path) -> Result<Record, LaunchError> {
        let path = record_path(state_dir);
        let text = std::fs::read_to_string(&path)
            .map_err(LaunchError::io(format!("reading {}", path.display())))?;
        serde_json::from_str(&text)
            .map_err(|e| LaunchError::Invalid(format!("{}: {e}", path.display())))
    }

    /// The cluster recorded in `state_dir`.
    pub fn open(state_dir: &Path) -> Result<LocalCluster, LaunchError> {
        let record = Self::read_record(state_dir)?;
        if let Some(dir) = &record.secrets
            && dir.exists()
        {
            rpc::use_secrets(&LocalSecrets::open(dir))?;
        }
        Ok(LocalCluster {
            record,
            children: BTreeMap::new(),
        })
    }

    pub fn save(&self) -> Result<(), LaunchError> {
        let path = record_path(&self.record.state_dir);
        let text = serde_json::to_string_pretty(&self.record)
            .map_err(|e| LaunchError::Invalid(format!("encoding the record: {e}")))?;
        // Written aside and renamed over: a reader (the soak's memory sampler) never sees
        // half a record.
        let temp = path.with_extension("json.partial");
        std::fs::write(&temp, text)
            .map_err(LaunchError::io(format!("writing {}", temp.display())))?;
        std::fs::rename(&temp, &path).map_err(LaunchError::io(format!(
            "renaming {} to {}",
            temp.display(),
            path.display()
        )))
    }

    /// Every replica's address.
    pub fn addrs(&self) -> Vec<String> {
        self.record
            .replicas
            .iter()
            .map(|r| r.addr.clone())
            .collect()
    }

    /// Every replica's address but replica `id`'s (the survivors of a fault on it).
    pub fn addrs_except(&self, id: u64) -> Vec<String> {
        self.record
            .replicas
            .iter()
            .filter(|r| r.id != id)
            .map(|r| r.addr.clone())
            .collect()
    }

    /// The `DOCKET_ADDR` value.
    pub fn docket_addr(&self) -> String {
        self.addrs().join(",")
    }

    /// Live processes among those recorded.
    pub fn running(&self) -> usize {
        self.pids().into_iter().filter(|p| alive(*p)).count()
    }

    fn pids(&self) -> Vec<i32> {
        self.record
            .replicas
            .iter()
            .filter_map(|r| r.pid)
            .chain(self.record.agents.iter().filter_map(|a| a.pid))
            .chain(self.record.authd.iter().filter_map(|a| a.pid))
            .collect()
    }

    /// The cluster's secrets.
    pub fn secrets(&self) -> Result<LocalSecrets, LaunchError> {
        self.record
            .secrets
            .as_deref()
            .map(LocalSecrets::open)
            .ok_or_else(|| LaunchError::Invalid("this cluster was started without secrets".into()))
    }

    /// The credential signer's socket (`DOCKET_AUTH_SOCKET` for the commands).
    pub fn auth_socket(&self) -> Option<&Path> {
        self.record.authd.as_ref().map(|a| a.socket.as_path())
    }

    /// The shell lines pointing the commands at this cluster.
    pub fn env_lines(&self) -> Result<Vec<String>, LaunchError> {
        let mut lines = vec![
            format!("export DOCKET_ADDR={}", self.docket_addr()),
            format!(
                "export DOCKET_TLS_CA={}",
                self.record.state_dir.join("ca.pem").display()
            ),
        ];
        if let Some(socket) = self.auth_socket() {
            lines.push(format!("export DOCKET_AUTH_SOCKET={}", socket.display()));
        }
        Ok(lines)
    }

    /// Starts the host's credential signer (`docket-authd`) with the cluster key.
    fn start_authd(&mut self) -> Result<(), LaunchError> {
        let Some(authd) = self.record.authd.clone() else {
            return Ok(());
        };
        let key = self.secrets()?.key_file();
        let mut cmd = Command::new(self.record.bin_dir.join("docket-authd"));
        cmd.arg("--socket")
            .arg(&authd.socket)
            .arg("--key")
            .arg(&key)
            .args(["--log", "info"]);
        let pid = self.spawn(cmd, &authd.log)?;
        if let Some(a) = &mut self.record.authd {
            a.pid = Some(pid);
        }
        // Ready when its socket answers.
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&authd.socket).is_err() {
            if !alive(pid) || start.elapsed() > Duration::from_secs(10) {
                let log = std::fs::read_to_string(&authd.log).unwrap_or_default();
                return Err(LaunchError::Invalid(format!(
                    "docket-authd did not start; see {} ({})",
                    authd.log.display(),
                    log.lines().last().unwrap_or_default()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.save()
    }

    /// Starts a daemon of the cluster (a replica, an agent, the credential signer) in a
    /// session of its own, as systemd starts each service and as Slurm's daemons detach.
    ///
    /// A session is also the kernel's scheduling group when autogroups are on (Debian's
    /// default, `kernel.sched_autogroup_enabled`): the cpu is shared fairly between groups
    /// first. Started in this launcher's session, all seven daemons of a local cluster were
    /// one group, weighing as much as one user's shell running `sbatch` in a loop or one
    /// job: under `docket-local bench`'s 8 loops the agents started jobs 0.7–1.2 s after
    /// their submission (p50) instead of 6–12 ms in five runs of six (the README's
    /// Benchmarks).
    fn spawn(&mut self, mut cmd: Command, log: &Path) -> Result<i32, LaunchError> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(LaunchError::io(format!("opening {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(LaunchError::io(format!("opening {}", log.display())))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: `setsid` is async-signal-safe and the closure allocates nothing, so it may
        // run between fork and exec. The new session is also a process group of its own
        // whose id is the daemon's pid, as with `process_group(0)` before: `down` signals
        // each daemon by pid, and the sweep of leftovers kills each one's group.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid()
                    .map(drop)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .spawn()
            .map_err(LaunchError::io(format!("starting {cmd:?}")))?;
        let pid = child.id() as i32;
        self.children.insert(pid, child);
        Ok(pid)
    }

    /// Starts replica `id` on its data directory (bootstrapping the cluster if asked).
    pub fn start_replica(&mut self, id: u64, bootstrap: bool) -> Result<(), LaunchError> {
        let members: String = self
            .record
            .replicas
            .iter()
            .map(|r| format!("{}={}", r.id, r.addr))
            .collect::<Vec<_>>()
            .join(",");
        let r = self
            .record
            .replicas
            .iter()
            .find(|r| r.id == id)
            .cloned()
            .ok_or_else(|| LaunchError::Invalid(format!("no replica {id}")))?;
        let controller = self.record.bin_dir.join("docket-controller");
        let mut cmd = match &self.record.net {
            Some(net) => {
                let mut c = Command::new("ip");
                c.args(net.exec_prefix(id)?).arg(&controller);
                c
            }
            None => Command::new(&controller),
        };
        if let Some(lib) = &self.record.faketime {
            // Only the wall clock moves; monotonic time (timers, leases) stays true.
            let file = self.clock_file(id);
            if !file.exists() {
                std::fs::write(&file, "+0")
                    .map_err(LaunchError::io(format!("writing {}", file.display())))?;
            }
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", &file)
                .env("FAKETIME_CACHE_DURATION", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        cmd.args(["run", "--id", &id.to_string(), "--listen", &r.addr])
            .args(["--http-listen", &r.http])
            .arg("--data-dir")
            .arg(&r.data_dir)
            .arg("--config")
            .arg(&self.record.site)
            .args([
                "--agent-heartbeat-ms",
                &self.record.agent_heartbeat_ms.to_string(),
                "--agent-fence-ms",
                &self.record.agent_fence_ms.to_string(),
                "--node-down-margin-ms",
                &self.record.node_down_margin_ms.to_string(),
                "--log",
                "info",
            ])
            .args(self.secrets()?.controller_flags(id));
        if let Some(ms) = self.record.raft_heartbeat_ms {
            cmd.args(["--heartbeat-ms", &ms.to_string()]);
        }
        if let Some(range) = &self.record.election_timeout_ms {
            cmd.args(["--election-timeout-ms", range]);
        }
        if let Some(n) = self.record.snapshot_every_entries {
            cmd.args(["--snapshot-every-entries", &n.to_string()]);
        }
        if let Some(n) = self.record.snapshot_keep_entries {
            cmd.args(["--keep-entries-after-snapshot", &n.to_string()]);
        }
        if bootstrap {
            cmd.args(["--bootstrap", &members]);
        }
        let pid = self.spawn(cmd, &r.log)?;
        if let Some(r) = self.record.replicas.iter_mut().find(|r| r.id == id) {
            r.pid = Some(pid);
        }
        self.save()
    }

    /// Starts the agent of node `name` on its state directory.
    pub fn start_agent(&mut self, name: &str) -> Result<(), LaunchError> {
        self.start_agent_crashing_at(name, None)
    }

    /// Starts the agent of node `name`, armed to SIGKILL itself when a run first reaches
    /// `crash_at` (one of `docket-nodeagent --crash-at`'s points), if given.
    pub fn start_agent_crashing_at(
        &mut self,
        name: &str,
        crash_at: Option<&str>,
    ) -> Result<(), LaunchError> {
        let a = self
            .record
            .agents
            .iter()
            .find(|a| a.spec.name == name)
            .cloned()
            .ok_or_else(|| LaunchError::Invalid(format!("no agent {name}")))?;
        let cgroup = cgroup_name(&self.record.cgroup_tag, name);
        let mut cmd = Command::new(self.record.bin_dir.join("docket-nodeagent"));
        cmd.args(["run", "--node", name, "--controllers", &self.docket_addr()])
            .args(["--cgroup-name", &cgroup])
            .arg("--state-dir")
            .arg(&a.state_dir)
            .arg("--runtime-dir")
            .arg(if a.runtime_dir.as_os_str().is_empty() {
                // Recorded before runtime directories: in its state directory (never the
                // state directory itself, which a tmpfs would hide).
                a.state_dir.join(RUNTIME_DIR)
            } else {
                a.runtime_dir.clone()
            })
            // Room for a long soak's run records (chaos checks every launch against them):
            // about 43,000 per agent, in memory only as they are written.
            .args(["--runtime-tmpfs-mib", "2048"])
            .args([
                "--cpus",
                &a.spec.cpus.to_string(),
                "--memory-mib",
                &a.spec.memory_mib.to_string(),
                "--kill-grace-s",
                &self.record.kill_grace_s.to_string(),
                "--log",
                "info",
            ])
            .args(self.secrets()?.agent_flags(name));
        let step_address = if a.spec.simulated {
            cmd.args(["--execution", "simulated", "--confinement", "none"]);
            cmd.args(["--step-listen", "none"]);
            None
        } else {
            cmd.args(["--confinement", &self.record.confinement]);
            // srun reaches the agent here, on loopback (its certificate names 127.0.0.1).
            let steps = docket_auth::local::free_loopback_addr().map_err(LaunchError::Invalid)?;
            cmd.args(["--step-listen", &steps]);
            Some(steps)
        };
        if let Some(point) = crash_at {
            cmd.args(["--crash-at", point]);
        }
        if let Some(ms) = self.record.agent_ping_ms {
            cmd.args(["--ping-ms", &ms.to_string()]);
        }
        let pid = self.spawn(cmd, &a.log)?;
        let cgroups = agent_cgroups(pid, &cgroup);
        if let Some(a) = self.record.agents.iter_mut().find(|a| a.spec.name == name) {
            a.pid = Some(pid);
            a.step_address = step_address;
            if !cgroups.is_empty() {
                a.cgroups = cgroups;
            }
        }
        self.save()
    }

    /// Sends `signal` to a process of this cluster; SIGKILL also reaps it.
    fn signal(&mut self, pid: i32, signal: Signal) -> Result<(), LaunchError> {
        match kill(Pid::from_raw(pid), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(LaunchError::Rpc(format!("signal {signal} to {pid}: {e}"))),
        }
        if signal == Signal::SIGKILL
            && let Some(mut child) = self.children.remove(&pid)
        {
            let _ = child.wait();
            self.forget_fake_clock(pid);
        }
        Ok(())
    }

    /// Removes what libfaketime left in `/dev/shm` for `pid`, a replica this cluster started
    /// with a fake clock and has reaped. The library makes a shared-memory segment and a
    /// semaphore named after its process (`faketime_shm_PID`, `sem.faketime_sem_PID`) and
    /// removes them only when the process exits normally: every replica killed in a chaos run
    /// left two files behind.
    fn forget_fake_clock(&self, pid: i32) {
        if self.record.faketime.is_none() {
            return;
        }
        for name in [
            format!("faketime_shm_{pid}"),
            format!("sem.faketime_sem_{pid}"),
        ] {
            // `remove_file` unlinks the name itself, never what a link there points to.
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(name));
        }
    }

    fn replica_pid(&self, id: u64) -> Result<i32, LaunchError> {
        self.record
            .replicas
            .iter()
            .find(|r| r.id == id)
            .and_then(|r| r.pid)
            .ok_or_else(|| LaunchError::Invalid(format!("replica {id} was never started")))
    }

    fn clock_file(&self, id: u64) -> PathBuf {
        self.record.state_dir.join(format!("clock-{id}"))
    }

    /// Sets replica `id`'s wall clock offset (libfaketime's syntax: `+1h`, `-30m`, `+0`); it
    /// takes effect within a second, without a restart.
    pub fn set_clock(&self, id: u64, offset: &str) -> Result<(), LaunchError> {
        if self.record.faketime.is_none() {
            return Err(LaunchError::Invalid(
                "this cluster was started without fake clocks".into(),
            ));
        }
        let file = self.clock_file(id);
        std::fs::write(&file, offset)
            .map_err(LaunchError::io(format!("writing {}", file.display())))
    }

    /// Whether replica `id`'s process runs (and reaps it if it exited).
    pub fn replica_alive(&mut self, id: u64) -> bool {
        let Ok(pid) = self.replica_pid(id) else {
            return false;
        };
        if let Some(child) = self.children.get_mut(&pid) {
            return matches!(child.try_wait(), Ok(None));
        }
        alive(pid)
    }

    /// `kill -9` of replica `id`.
    pub fn kill_replica(&mut self, id: u64) -> Result<(), LaunchError> {
        let pid = self.replica_pid(id)?;
        self.signal(pid, Signal::SIGKILL)
    }

    /// SIGSTOP (`true`) or SIGCONT to replica `id`.
    pub fn pause_replica(&mut self, id: u64, pause: bool) -> Result<(), LaunchError> {
        let pid = self.replica_pid(id)?;
        self.signal(
            pid,
            if pause {
                Signal::SIGSTOP
            } else {
                Signal::SIGCONT
            },
        )
    }

    fn agent_pid(&self, name: &str) -> Result<i32, LaunchError> {
        self.record
            .agents
            .iter()
            .find(|a| a.spec.name == name)
            .and_then(|a| a.pid)
            .ok_or_else(|| LaunchError::Invalid(format!("agent {name} was never started")))
    }

    /// `kill -9` of the agent of node `name` (its jobs' monitors live on).
    pub fn kill_agent(&mut self, name: &str) -> Result<(), LaunchError> {
        let pid = self.agent_pid(name)?;
        self.signal(pid, Signal::SIGKILL)
    }

    /// Stops the agent of node `name` as an operator's restart does (SIGTERM; its jobs'
    /// monitors live on), waiting up to 5 s for it to exit, then SIGKILL and up to 5 s more,
    /// so the next agent finds the state directory's lock free.
    pub fn stop_agent(&mut self, name: &str) -> Result<(), LaunchError> {
        let pid = self.agent_pid(name)?;
        self.signal(pid, Signal::SIGTERM)?;
        let mut deadline = Instant::now() + Duration::from_secs(5);
        let mut killed = false;
        while self.agent_alive(name) {
            if Instant::now() >= deadline {
                if killed {
                    // In the kernel (state D): a new agent would find its lock held.
                    return Err(LaunchError::Invalid(format!(
                        "agent {name} (pid {pid}) is still alive 5 s after SIGKILL"
                    )));
                }
                self.signal(pid, Signal::SIGKILL)?;
                killed = true;
                deadline = Instant::now() + Duration::from_secs(5);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Exited and reaped: its pid may already be another process's.
        self.children.remove(&pid);
        Ok(())
    }

    /// Whether the agent of node `name` runs (and reaps it if it exited).
    pub fn agent_alive(&mut self, name: &str) -> bool {
        let Ok(pid) = self.agent_pid(name) else {
            return false;
        };
        if let Some(child) = self.children.get_mut(&pid) {
            return matches!(child.try_wait(), Ok(None));
        }
        alive(pid)
    }

    fn net(&self) -> Result<&crate::net::Net, LaunchError> {
        self.record.net.as_ref().ok_or_else(|| {
            LaunchError::Invalid("this cluster was started without network namespaces".into())
        })
    }

    /// Cuts replica `id` off from the other replicas (clients and agents still reach it).
    pub fn partition_replica(&self, id: u64) -> Result<(), LaunchError> {
        let net = self.net()?;
        for r in &self.record.replicas {
            if r.id != id {
                net.cut(id, r.id)?;
            }
        }
        Ok(())
    }

    /// Cuts replica `id` off from the host's namespace: agents and clients (it still reaches
    /// the other replicas).
    pub fn partition_from_host(&self, id: u64) -> Result<(), LaunchError> {
        self.net()?.cut_from_host(id)
    }

    /// Removes every cut involving replica `id`.
    pub fn heal(&self, id: u64) -> Result<(), LaunchError> {
        self.net()?.heal(id)
    }

    fn replica(&self, id: u64) -> Result<&ReplicaProc, LaunchError> {
        self.record
            .replicas
            .iter()
            .find(|r| r.id == id)
            .ok_or_else(|| LaunchError::Invalid(format!("no replica {id}")))
    }

    /// Fills replica `id`'s data disk until the filesystem refuses more (ENOSPC); the bytes
    /// written.
    pub fn fill_disk(&self, id: u64) -> Result<u64, LaunchError> {
        if self.record.data_disk_mib.is_none() {
            return Err(LaunchError::Invalid(
                "this cluster was started without data disks of its own".into(),
            ));
        }
        let r = self.replica(id)?;
        let path = r.data_dir.join("disk-filler");
        let mut f = std::fs::File::create(&path)
            .map_err(LaunchError::io(format!("creating {}", path.display())))?;
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match std::io::Write::write(&mut f, &chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => return Err(LaunchError::io(format!("filling {}", path.display()))(e)),
            }
        }
        Ok(written)
    }

    /// Frees what [`LocalCluster::fill_disk`] took.
    pub fn free_disk(&self, id: u64) -> Result<(), LaunchError> {
        let r = self.replica(id)?;
        match std::fs::remove_file(r.data_dir.join("disk-filler")) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(LaunchError::io("freeing the data disk")(e)),
        }
    }

    /// Waits until a leader answers and every agent responds to it; the leader's id and
    /// address.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(u64, String), LaunchError> {
        let start = Instant::now();
        let want: Vec<&str> = self
            .record
            .agents
            .iter()
            .map(|a| a.spec.name.as_str())
            .collect();
        let mut last = String::from("no leader yet");
        while start.elapsed() < timeout {
            if let Some((id, addr)) = rpc::leader(&self.addrs()).await {
                match rpc::nodes(&addr).await {
                    Ok(nodes) => {
                        let missing: Vec<&str> = want
                            .iter()
                            .copied()
                            .filter(|w| {
                                !nodes
                                    .iter()
                                    .any(|n| n.name == *w && n.responding == Some(true))
                            })
                            .collect();
                        if missing.is_empty() {
                            return Ok((id, addr));
                        }
                        last = format!("agents not registered yet: {}", missing.join(", "));
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            for r in &self.record.replicas {
                if let Some(pid) = r.pid
                    && !alive(pid)
                {
                    let log = std::fs::read_to_string(&r.log).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(3).collect();
                    return Err(LaunchError::Invalid(format!(
                        "controller {} exited; see {} (last lines: {})",
                        r.id,
                        r.log.display(),
                        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    )));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(LaunchError::Timeout(format!(
            "the cluster was not ready within {} s: {last}; see {}",
            timeout.as_secs(),
            self.record.state_dir.join("logs").display()
        )))
    }

    /// Stops everything: cancels every job (so no job process outlives its agent), stops
    /// agents then controllers (SIGTERM, SIGKILL after 10 s), then sweeps what is left: job
    /// monitors, mounts and cgroups. The state directory stays unless `remove` (and then
    /// only if a launcher created it: see `state_dir`).
    pub async fn stop(mut self, remove: bool) -> Result<crate::cleanup::Sweep, LaunchError> {
        if let Some((_, leader)) = rpc::leader(&self.addrs()).await {
            crate::cleanup::cancel_everything(&leader, Duration::from_secs(15)).await;
        }
        let agents: Vec<i32> = self.record.agents.iter().filter_map(|a| a.pid).collect();
        let replicas: Vec<i32> = self.record.replicas.iter().filter_map(|r| r.pid).collect();
        let authd: Vec<i32> = self.record.authd.iter().filter_map(|a| a.pid).collect();
        for group in [agents, replicas, authd] {
            for pid in &group {
                let _ = self.signal(*pid, Signal::SIGTERM);
            }
            let start = Instant::now();
            while group.iter().any(|p| alive(*p)) && start.elapsed() < Duration::from_secs(10) {
                for pid in &group {
                    if let Some(child) = self.children.get_mut(pid) {
                        let _ = child.try_wait();
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            for pid in &group {
                if alive(*pid) {
                    let _ = self.signal(*pid, Signal::SIGKILL);
                }
                if let Some(mut child) = self.children.remove(pid) {
                    let _ = child.wait();
                    self.forget_fake_clock(*pid);
                }
            }
        }
        let cgroups: Vec<PathBuf> = self
            .record
            .agents
            .iter()
            .flat_map(|a| a.cgroups.clone())
            .collect();
        // The agents' runtime tmpfs are this cluster's own, not leftovers: unmounted before
        // the sweep counts what was left behind.
        for a in &self.record.agents {
            let _ = nix::mount::umount2(&a.runtime_dir, nix::mount::MntFlags::MNT_DETACH);
        }
        let sweep = crate::cleanup::sweep(&self.record.state_dir, &cgroups);
        if let Some(net) = &self.record.net {
            net.destroy();
        }
        for r in &mut self.record.replicas {
            r.pid = None;
        }
        for a in &mut self.record.agents {
            a.pid = None;
        }
        if let Some(a) = &mut self.record.authd {
            a.pid = None;
        }
        if remove {
            if let Err(refused) = crate::state_dir::remove(&self.record.state_dir) {
                self.save()?;
                return Err(refused);
            }
        } else {
            self.save()?;
        }
        Ok(sweep)
    }
}

impl Drop for LocalCluster {
    /// Reaps children that already exited (a kept cluster's live ones keep running).
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.try_wait();
        }
    }
}
