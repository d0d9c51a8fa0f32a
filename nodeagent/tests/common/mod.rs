//! What the agent tests share: a small in-test leader speaking the agents protocol over TLS,
//! the agent binary started against it, and launch instructions.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use docket_proto::v1 as pb;
use docket_proto::v1::agents_server::{Agents, AgentsServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

pub const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Default)]
pub struct Shared {
    /// The fence timeout handed out (0: 60 s).
    pub fence_ms: u64,
    /// Unreachable: every call fails as a dead leader's would.
    pub dark: bool,
    pub registered: Vec<pb::RegisterRequest>,
    pub events: Vec<pb::JobEvent>,
    pub held: Vec<pb::HeldJob>,
    pub tx: Option<mpsc::Sender<Result<pb::Instruction, Status>>>,
}

#[derive(Clone, Default)]
pub struct FakeLeader(pub Arc<Mutex<Shared>>);

#[tonic::async_trait]
impl Agents for FakeLeader {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let mut shared = self.0.lock().unwrap();
        if shared.dark {
            return Err(Status::unavailable("gone"));
        }
        shared.registered.push(request.into_inner());
        let fence = if shared.fence_ms == 0 {
            60_000
        } else {
            shared.fence_ms
        };
        Ok(Response::new(pb::RegisterResponse {
            session: "s1".into(),
            heartbeat_ms: 100,
            fence_timeout_ms: fence,
        }))
    }
    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let mut shared = self.0.lock().unwrap();
        if shared.dark {
            return Err(Status::unavailable("gone"));
        }
        shared.held = request.into_inner().jobs;
        Ok(Response::new(pb::HeartbeatResponse {}))
    }
    type InstructionsStream = ReceiverStream<Result<pb::Instruction, Status>>;
    async fn instructions(
        &self,
        _: Request<pb::InstructionsRequest>,
    ) -> Result<Response<Self::InstructionsStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        self.0.lock().unwrap().tx = Some(tx);
        Ok(Response::new(ReceiverStream::new(rx)))
    }
    async fn report_events(
        &self,
        request: Request<pb::ReportEventsRequest>,
    ) -> Result<Response<pb::ReportEventsResponse>, Status> {
        let events = request.into_inner().events;
        let n = events.len();
        self.0.lock().unwrap().events.extend(events);
        Ok(Response::new(pb::ReportEventsResponse {
            errors: vec![String::new(); n],
        }))
    }
}

/// True when running as root. Otherwise the test is skipped with `why` printed, unless
/// DOCKET_REQUIRE_PRIVILEGED is set, which turns the skip into a failure.
pub fn privileged(why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("DOCKET_REQUIRE_PRIVILEGED").is_none(),
        "DOCKET_REQUIRE_PRIVILEGED is set but this test runs as a user ({why})"
    );
    eprintln!("skipped: {why}");
    false
}

/// The test process's cluster secrets: a CA, the in-test leader's replica certificate
/// (127.0.0.1), and node certificates issued on demand.
pub fn secrets() -> &'static docket_auth::local::LocalSecrets {
    static SECRETS: std::sync::OnceLock<docket_auth::local::LocalSecrets> =
        std::sync::OnceLock::new();
    SECRETS.get_or_init(|| {
        let local = docket_auth::local::LocalSecrets::create(
            &docket_deploy::testing::process_dir().join("secrets"),
            "test",
        )
        .unwrap();
        local
            .issue(&docket_auth::tls::Role::Replica(1), &["127.0.0.1".into()])
            .unwrap();
        local
    })
}

/// The flags giving the agent of `node` its certificate.
pub fn tls_flags(node: &str) -> Vec<String> {
    let files = secrets()
        .issue(&docket_auth::tls::Role::Node(node.into()), &[])
        .unwrap();
    let (cert, key) = files.identity.unwrap();
    vec![
        "--tls-ca".into(),
        files.ca.display().to_string(),
        "--tls-cert".into(),
        cert.display().to_string(),
        "--tls-key".into(),
        key.display().to_string(),
    ]
}

/// Serves `leader` on a fresh loopback port, over TLS as replica 1; its address and the
/// server task.
pub async fn serve(
    leader: &FakeLeader,
) -> (
    String,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let tls =
        docket_auth::tls::TlsContext::load(secrets().files(&docket_auth::tls::Role::Replica(1)))
            .unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentsServer::new(leader.clone()))
            .serve_with_incoming(docket_auth::tls::serve::incoming(listener, tls)),
    );
    (addr, server)
}

/// Whether this host has the cgroup v2 controllers (else v1).
pub fn cgroup_v2() -> bool {
    std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
}

/// On a cgroup v2 host, the cgroup a site's service manager gives the agent of `node`
/// (systemd's `Delegate=yes`): `docket.slice/docket-nodeagent@NODE.service`, with the
/// controllers enabled down to it and nothing else in it. None on v1.
pub fn service_cgroup(node: &str) -> Option<std::path::PathBuf> {
    let service = service_cgroup_path(node)?;
    std::fs::create_dir_all(&service).unwrap();
    let root = std::path::Path::new("/sys/fs/cgroup");
    for dir in [root, root.join("docket.slice").as_path()] {
        // Written only when a controller is missing: a write takes the kernel's cgroup locks
        // against every fork on the host, which a test need not add while its jobs fork.
        let control = dir.join("cgroup.subtree_control");
        let enabled = std::fs::read_to_string(&control).unwrap_or_default();
        let missing: Vec<&str> = ["cpuset", "memory", "pids"]
            .into_iter()
            .filter(|c| !enabled.split_whitespace().any(|e| e == *c))
            .collect();
        if !missing.is_empty() {
            let add: Vec<String> = missing.iter().map(|c| format!("+{c}")).collect();
            std::fs::write(&control, add.join(" ")).unwrap();
        }
    }
    Some(service)
}

/// Where [`service_cgroup`] is, without creating or changing anything. None on v1.
pub fn service_cgroup_path(node: &str) -> Option<std::path::PathBuf> {
    cgroup_v2().then(|| {
        std::path::Path::new("/sys/fs/cgroup/docket.slice")
            .join(format!("docket-nodeagent@{node}.service"))
    })
}

/// Starts the agent binary for `node` talking to `addr`, state in `state`, with `extra` flags.
/// On a cgroup v2 host it starts in a delegated service cgroup of its own, as under systemd.
pub fn agent(node: &str, addr: &str, state: &std::path::Path, extra: &[&str]) -> Agent {
    let bin = env!("CARGO_BIN_EXE_docket-nodeagent");
    let mut command = match service_cgroup(node) {
        Some(service) => {
            let mut c = Command::new("/bin/sh");
            // Into the service's cgroup, as systemd's Delegate=yes starts it; once the first
            // agent has handed controllers down from there (no process may join it then), into
            // its `agent` leaf, as systemd's DelegateSubgroup=agent does.
            c.args([
                "-c",
                "{ echo $$ > \"$0/cgroup.procs\" || echo $$ > \"$0/agent/cgroup.procs\"; } \
                 2>/dev/null && exec \"$@\"",
            ])
            .arg(service)
            .arg(bin);
            c
        }
        None => Command::new(bin),
    };
    Agent(
        command
            .args([
                "run",
                "--node",
                node,
                "--controllers",
                addr,
                "--log",
                "warn",
            ])
            // Its own port unless the test names one: tests run agents side by side.
            .args(if extra.contains(&"--step-listen") {
                &[][..]
            } else {
                &["--step-listen", "127.0.0.1:0"][..]
            })
            .arg("--state-dir")
            .arg(state)
            // Its runs' records and jobs' directories beside the state file, where the tests
            // look for them (`run/runs`, `run/jobs`), not in the host's /run; on a tmpfs of
            // its own only where a test asks (and unmounts it).
            .args(if extra.contains(&"--runtime-dir") {
                Vec::new()
            } else {
                vec!["--runtime-dir".into(), state.join("run")]
            })
            .args(if extra.contains(&"--runtime-tmpfs-mib") {
                &[][..]
            } else {
                &["--runtime-tmpfs-mib", "0"][..]
            })
            .args(tls_flags(node))
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Removes the agent's (empty) `docket-<node>` cgroups, so a test leaves nothing behind.
pub fn remove_agent_cgroups(node: &str) {
    if let Some(service) = service_cgroup(node) {
        for dir in [
            service.join(format!("docket-{node}")),
            service.join("agent"),
            service,
        ] {
            let _ = std::fs::remove_dir(dir);
        }
        return;
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in own.lines() {
        let mut p = line.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (p.next(), p.next(), p.next()) else {
            continue;
        };
        let mount = if ctrls.is_empty() {
            "/sys/fs/cgroup".to_owned()
        } else if let Some(c) = ctrls.split(',').find(|c| !c.starts_with("name=")) {
            format!("/sys/fs/cgroup/{c}")
        } else {
            continue;
        };
        let dir = std::path::Path::new(&mount)
            .join(path.trim_start_matches('/'))
            .join(format!("docket-{node}"));
        let _ = std::fs::remove_dir(&dir);
    }
}

pub struct Agent(pub Child);
impl Drop for Agent {
    /// Kills the agent and reaps it, waiting at most [`DEADLINE`]: an agent stuck in the
    /// kernel (state D) cannot die, and a test that waited for it would hang instead of
    /// failing. Such an agent is reported with where the kernel holds it, and left; the test
    /// fails on it.
    fn drop(&mut self) {
        let _ = self.0.kill();
        let start = Instant::now();
        while start.elapsed() < DEADLINE {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = self.0.id();
        let read =
            |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_default();
        let report = format!(
            "the agent (pid {pid}) did not die within {DEADLINE:?} of SIGKILL; stat: {} kernel stack:\n{}",
            read("stat").trim(),
            read("stack")
        );
        // A test that passed fails on it; one already failing keeps its own message.
        if std::thread::panicking() {
            eprintln!("{report}");
        } else {
            panic!("{report}");
        }
    }
}

impl FakeLeader {
    pub async fn send(&self, kind: pb::instruction::Kind) {
        let start = Instant::now();
        let tx = loop {
            if let Some(tx) = self.0.lock().unwrap().tx.clone() {
                break tx;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the agent never opened its stream"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        tx.send(Ok(pb::Instruction { kind: Some(kind) }))
            .await
            .unwrap();
    }

    pub async fn ended(&self, job: u64) -> (u64, pb::Ended) {
        let start = Instant::now();
        loop {
            let found = self
                .0
                .lock()
                .unwrap()
                .events
                .iter()
                .find_map(|e| match &e.event {
                    Some(pb::job_event::Event::Ended(x)) if e.job_id == job => {
                        Some((e.epoch, x.clone()))
                    }
                    _ => None,
                });
            if let Some(f) = found {
                return f;
            }
            assert!(start.elapsed() < DEADLINE, "job {job} never ended");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn started(&self, job: u64) -> bool {
        self.0
            .lock()
            .unwrap()
            .events
            .iter()
            .any(|e| e.job_id == job && matches!(e.event, Some(pb::job_event::Event::Started(_))))
    }
}

pub fn launch(
    job: u64,
    epoch: u64,
    dir: &std::path::Path,
    script: &str,
    limit: u64,
) -> pb::instruction::Kind {
    pb::instruction::Kind::Launch(pb::Launch {
        job_id: job,
        epoch,
        name: format!("t{job}"),
        user: "root".into(),
        account: "acct".into(),
        partition: "batch".into(),
        work_dir: dir.display().to_string(),
        script: script.as_bytes().to_vec(),
        cpus: 2,
        memory_mib: 1024,
        time_limit_seconds: limit,
        node_list: "n01".into(),
        node_count: 1,
        ntasks: 1,
        cpus_per_task: 2,
        submit_host_dir: dir.display().to_string(),
        ..Default::default()
    })
}

pub fn control(job: u64, epoch: u64) -> pb::JobControl {
    pb::JobControl {
        job_id: job,
        epoch,
        reason: "test".into(),
    }
}

/// Where the agent (started by this process, so in its cgroups) puts job memory cgroups, and
/// the memory limit's file name there: cgroup v2 when the unified hierarchy has the memory
/// controller, else v1.
pub fn memory_cgroup_base() -> (std::path::PathBuf, &'static str) {
    if let Some(service) = service_cgroup("n01") {
        (service.join("docket-n01"), "memory.max")
    } else {
        (
            own_cgroup_dir("memory").join("docket-n01"),
            "memory.limit_in_bytes",
        )
    }
}

/// This process's cgroup directory in the v1 `controller` hierarchy (the agent it starts
/// inherits it).
pub fn own_cgroup_dir(controller: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let path = text
        .lines()
        .find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, c, path) = (p.next()?, p.next()?, p.next()?);
            c.split(',')
                .any(|x| x == controller)
                .then(|| path.to_owned())
        })
        .unwrap_or_else(|| panic!("no {controller} cgroup in {text}"));
    std::path::Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(path.trim_start_matches('/'))
}

/// Makes `name` under `tmp` a directory of `user`'s (mode 0700) and lets others pass through
/// `tmp` (a test's temporary directory is 0700), as a home directory is reached on a node.
pub fn user_dir(tmp: &std::path::Path, name: &str, user: &nix::unistd::User) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o711)).unwrap();
    let dir = tmp.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(user.uid.as_raw()), Some(user.gid.as_raw())).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// A reported end's cause by its short name (`completed`, `out_of_memory`, ...).
pub fn cause(end: &pb::Ended) -> &'static str {
    match end.cause() {
        pb::EndCause::Unspecified => "unspecified",
        pb::EndCause::Completed => "completed",
        pb::EndCause::Failed => "failed",
        pb::EndCause::Timeout => "timeout",
        pb::EndCause::OutOfMemory => "out_of_memory",
        pb::EndCause::JobfsExceeded => "jobfs_exceeded",
        pb::EndCause::Cancelled => "cancelled",
        pb::EndCause::NodeFailure => "node_failure",
        pb::EndCause::LaunchFailed => "launch_failed",
        pb::EndCause::Preempted => "preempted",
    }
}

/// The unprivileged user jobs run as in these tests.
pub fn nobody() -> nix::unistd::User {
    nix::unistd::User::from_name("nobody").unwrap().unwrap()
}

/// Waits (up to [`DEADLINE`]) until `ready`.
pub async fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < DEADLINE, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The directory of job (job, epoch)'s cgroup under the agent of `node` (started by this
/// process, so under its cgroups), in the v1 hierarchy of `controller`, or in the unified
/// hierarchy on a v2 host.
pub fn job_cgroup(node: &str, controller: &str, job: u64, epoch: u64) -> std::path::PathBuf {
    let base = service_cgroup_path(node).unwrap_or_else(|| own_cgroup_dir(controller));
    base.join(format!("docket-{node}"))
        .join(format!("job_{job}_{epoch}"))
}

/// CPU time the job's cgroup has used, microseconds (v1 `cpuacct.usage`, v2 `cpu.stat`).
pub fn job_cpu_usage_us(node: &str, job: u64, epoch: u64) -> Option<u64> {
    let dir = job_cgroup(node, "cpuacct", job, epoch);
    if let Ok(ns) = std::fs::read_to_string(dir.join("cpuacct.usage")) {
        return ns.trim().parse::<u64>().ok().map(|ns| ns / 1000);
    }
    std::fs::read_to_string(dir.join("cpu.stat"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether the job's cgroup is frozen (v1 `freezer.state`, v2 `cgroup.events`).
pub fn job_frozen(node: &str, job: u64, epoch: u64) -> bool {
    let dir = job_cgroup(node, "freezer", job, epoch);
    std::fs::read_to_string(dir.join("freezer.state"))
        .map(|s| s.trim() == "FROZEN")
        .or_else(|_| {
            std::fs::read_to_string(dir.join("cgroup.events"))
                .map(|s| s.lines().any(|l| l == "frozen 1"))
        })
        .unwrap_or(false)
}

/// Detaches the mount on its path when dropped (every one stacked there).
pub struct Unmount(pub std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        while nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH).is_ok() {}
    }
}

/// How many mounts are stacked on `path` (as it resolves: mountinfo names them so).
pub fn mounts_at(path: &std::path::Path) -> usize {
    let here = std::fs::canonicalize(path).unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mounts
        .lines()
        .filter(|l| l.split(' ').nth(4) == here.to_str())
        .count()
}
