//! Real `docket-controller` processes on loopback, and clients for them.
//!
//! Every child is killed when the cluster value is dropped, however the test ends; every
//! wait has a deadline.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use docket_auth::local::{LocalSecrets, Minter};
use docket_auth::tls::TlsContext;
use docket_proto::v1 as pb;
use docket_proto::v1::admin_client::AdminClient;
use docket_proto::v1::health_client::HealthClient;
use docket_proto::v1::jobs_client::JobsClient;
use docket_raft::network::{Channels, NetworkConfig};
use docket_raft::status::Role;
use tonic::transport::Channel;

pub const DEADLINE: Duration = Duration::from_secs(30);

/// The test process's cluster secrets: one CA and credential key shared by every cluster a
/// test starts, replica certificates for 127.0.0.1, and the harness's own tool certificate.
pub struct Secrets {
    pub local: LocalSecrets,
    pub minter: Minter,
    /// The harness's TLS: the CA, and a tool certificate (Raft status only).
    pub tls: TlsContext,
}

pub fn secrets() -> &'static Secrets {
    static SECRETS: std::sync::OnceLock<Secrets> = std::sync::OnceLock::new();
    SECRETS.get_or_init(|| {
        let local = LocalSecrets::create(
            &docket_deploy::testing::process_dir().join("secrets"),
            "test",
        )
        .unwrap();
        for id in 1..=9 {
            local
                .issue(
                    &docket_auth::tls::Role::Replica(id),
                    &["127.0.0.1".to_owned()],
                )
                .unwrap();
        }
        let tool = local
            .issue(&docket_auth::tls::Role::Tool("test".into()), &[])
            .unwrap();
        Secrets {
            minter: local.minter().unwrap(),
            tls: TlsContext::load(tool).unwrap(),
            local,
        }
    })
}

/// The flags giving replica `id` its certificate and the credential key.
pub fn secret_flags(id: u64) -> Vec<String> {
    secrets().local.controller_flags(id)
}

/// The flags giving the agent of `node` its certificate.
pub fn node_flags(node: &str) -> Vec<String> {
    secrets()
        .local
        .issue(&docket_auth::tls::Role::Node(node.into()), &[])
        .unwrap();
    secrets().local.agent_flags(node)
}

/// A TLS channel to `addr` with the harness's certificate.
pub fn channel(addr: &str) -> Channel {
    docket_auth::tls::connect::channel(addr, &secrets().tls, Duration::from_secs(2), None).unwrap()
}

/// Raft channels (status) over TLS with the harness's certificate.
pub fn raft_channels() -> Channels {
    Channels::with_maker(
        NetworkConfig::default(),
        std::sync::Arc::new(|_, addr: &str| {
            docket_auth::tls::connect::channel(addr, &secrets().tls, Duration::from_secs(2), None)
        }),
    )
}

/// A fresh credential for `user` (root is uid 0, the operator).
pub fn credential(user: &str) -> tonic::metadata::MetadataValue<tonic::metadata::Ascii> {
    secrets()
        .minter
        .credential_for(user)
        .unwrap()
        .parse()
        .unwrap()
}

pub fn site_config() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .join("tests/data/two-partitions.toml")
}

/// A loopback address no one listens on now.
pub fn free_addr() -> String {
    docket_auth::local::free_loopback_addr().unwrap()
}

pub struct Cluster {
    /// Flags every replica gets besides the harness's own.
    pub extra: Vec<String>,
    /// The site file every replica is started with.
    pub config: PathBuf,
    pub dir: tempfile::TempDir,
    pub addrs: BTreeMap<u64, String>,
    /// Each replica's /metrics and /status address.
    pub http: BTreeMap<u64, String>,
    pub procs: BTreeMap<u64, Child>,
    pub raft: Channels,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.procs.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Cluster {
    /// Starts `n` replicas of a new cluster configured by the test site file, and waits until
    /// a leader has configured it.
    pub async fn start(n: u64) -> Cluster {
        // No agents here: node liveness off.
        Self::start_with(n, &["--agent-fence-ms", "0"]).await
    }

    /// Like [`Cluster::start`], every replica started with `extra` flags too.
    pub async fn start_with(n: u64, extra: &[&str]) -> Cluster {
        Self::start_custom(n, site_config(), extra).await
    }

    /// `n` replicas configured by the site file at `config`, with `extra` flags.
    pub async fn start_custom(n: u64, config: PathBuf, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let addrs: BTreeMap<u64, String> = (1..=n).map(|id| (id, free_addr())).collect();
        let http = (1..=n).map(|id| (id, free_addr())).collect();
        let mut cluster = Cluster {
            extra: extra.iter().map(|s| s.to_string()).collect(),
            config,
            dir,
            addrs,
            http,
            procs: BTreeMap::new(),
            raft: raft_channels(),
        };
        let bootstrap = cluster
            .addrs
            .iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect::<Vec<_>>()
            .join(",");
        for id in 1..=n {
            cluster.spawn(id, (id == 1).then_some(bootstrap.as_str()));
        }
        cluster.wait_configured().await;
        // A leader is elected by a majority: the last replica may not listen yet. Tests
        // talk to any replica, so wait for every one (gRPC and HTTP).
        let start = Instant::now();
        let every: Vec<String> = cluster
            .addrs
            .values()
            .chain(cluster.http.values())
            .cloned()
            .collect();
        for addr in &every {
            while std::net::TcpStream::connect(addr).is_err() {
                if start.elapsed() > DEADLINE {
                    let why = cluster.why_silent(addr);
                    panic!("{addr} never listened: {why}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        cluster
    }

    /// What became of the replica that should listen at `addr`: whether its process is
    /// still running, and the end of what it wrote on stderr.
    pub fn why_silent(&mut self, addr: &str) -> String {
        let id = self
            .addrs
            .iter()
            .chain(self.http.iter())
            .find(|(_, a)| *a == addr)
            .map(|(id, _)| *id);
        let Some(id) = id else {
            return "no replica of this cluster has that address".into();
        };
        let process = match self.procs.get_mut(&id).map(Child::try_wait) {
            Some(Ok(Some(status))) => format!("replica {id} exited ({status})"),
            Some(Ok(None)) => format!("replica {id} is still running"),
            Some(Err(e)) => format!("replica {id}: {e}"),
            None => format!("replica {id} was not started"),
        };
        let stderr = std::fs::read_to_string(self.stderr_path(id)).unwrap_or_default();
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("{process}; its stderr ends:\n{}", tail.join("\n"))
    }

    /// Where replica `id`'s stderr goes (unless `DOCKET_TEST_LOG` sends it to the test's).
    pub fn stderr_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("r{id}.stderr"))
    }

    /// Starts replica `id` on a fresh address, not yet a member (for membership changes).
    pub fn spawn_extra(&mut self, id: u64) {
        self.addrs.insert(id, free_addr());
        self.http.insert(id, free_addr());
        self.spawn(id, None);
    }

    pub fn spawn(&mut self, id: u64, bootstrap: Option<&str>) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_docket-controller"));
        cmd.args(["run", "--id", &id.to_string(), "--listen", &self.addrs[&id]])
            .args(["--http-listen", &self.http[&id]])
            .args(secret_flags(id))
            .args(&self.extra)
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("r{id}")))
            .arg("--config")
            .arg(&self.config)
            .args([
                "--log",
                &std::env::var("DOCKET_TEST_LOG").unwrap_or_else(|_| "off".into()),
            ])
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("DOCKET_TEST_LOG").is_some() {
                Stdio::inherit()
            } else {
                // Kept, so a replica that fails to start says why (see `why_silent`).
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.stderr_path(id))
                    .map_or_else(|_| Stdio::null(), Stdio::from)
            });
        if let Some(b) = bootstrap {
            cmd.args(["--bootstrap", b]);
        }
        self.procs.insert(id, cmd.spawn().unwrap());
    }

    /// SIGKILL.
    pub fn kill(&mut self, id: u64) {
        let mut child = self.procs.remove(&id).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop(&mut self, id: u64) {
        let mut child = self.procs.remove(&id).unwrap();
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "replica {id} exited with {status}");
                return;
            }
            if start.elapsed() > DEADLINE {
                let _ = child.kill();
                panic!("replica {id} did not stop on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The replica every running replica agrees leads: one claims the role, and every voter
    /// of its membership that answers is a follower that has heard from it (so a follower
    /// asked next names it, and reports itself a follower). Stopped replicas do not answer.
    pub async fn leader(&self) -> u64 {
        let start = Instant::now();
        loop {
            let mut seen = BTreeMap::new();
            for id in self.procs.keys() {
                if let Ok(s) = self
                    .raft
                    .status(&self.addrs[id], Duration::from_millis(500))
                    .await
                {
                    seen.insert(*id, s);
                }
            }
            let leaders: Vec<u64> = seen
                .iter()
                .filter(|(_, s)| s.role == Role::Leader)
                .map(|(id, _)| *id)
                .collect();
            if let [leader] = leaders[..] {
                let agreed = seen[&leader]
                    .members
                    .iter()
                    .filter(|m| m.voter && m.id.0 != leader)
                    .filter_map(|m| seen.get(&m.id.0))
                    .all(|s| s.role == Role::Follower && s.leader.map(|l| l.0) == Some(leader));
                if agreed {
                    return leader;
                }
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no single leader all voters follow: {:?}",
                seen.iter()
                    .map(|(id, s)| (*id, s.role, s.leader))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn follower_of(&self, leader: u64) -> u64 {
        *self.procs.keys().find(|id| **id != leader).unwrap()
    }

    pub async fn admin(&self, id: u64) -> AdminClient<Channel> {
        AdminClient::new(channel(&self.addrs[&id]))
    }

    /// GET `path` from replica `id`'s HTTP endpoint; the body.
    pub fn http_get(&self, id: u64, path: &str) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.http[&id]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(
            out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
            "{out}"
        );
        out.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default()
    }

    pub async fn jobs(&self, id: u64) -> JobsClient<Channel> {
        JobsClient::new(channel(&self.addrs[&id]))
    }

    pub async fn wait_configured(&self) {
        let start = Instant::now();
        loop {
            let leader = self.leader().await;
            let mut health = HealthClient::new(channel(&self.addrs[&leader]));
            let serving = health
                .check(pb::HealthCheckRequest {})
                .await
                .map(|r| {
                    r.into_inner().status
                        == pb::health_check_response::ServingStatus::Serving as i32
                })
                .unwrap_or(false);
            // Configured once a submission to the default partition is accepted.
            if serving {
                let mut jobs = self.jobs(leader).await;
                let probe = list(&mut jobs, "alice", pb::ListJobsRequest::default()).await;
                if probe.is_ok() && self.has_partitions(leader).await {
                    return;
                }
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the cluster never became configured"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn has_partitions(&self, id: u64) -> bool {
        // A dry submission that names an unknown partition is refused with "unknown
        // partition" only once partitions exist; before, everything is unknown. Ask plainly
        // instead: submit nothing, list partitions through a job listing filter (none yet).
        let mut jobs = self.jobs(id).await;
        let spec = job("probe", "");
        let req = as_user("alice", pb::SubmitJobsRequest { jobs: vec![spec] });
        // Held, so the probe never runs; cancelled right away.
        match jobs.submit_jobs(req).await {
            Ok(r) => match r.into_inner().results[0].result.clone() {
                Some(pb::submit_result::Result::JobId(id)) => {
                    let _ = act(&mut jobs, "alice", Act::Cancel, &[id]).await;
                    true
                }
                _ => false,
            },
            Err(_) => false,
        }
    }
}

/// A small held-or-not job named `name` in `partition` ("" = default).
pub fn job(name: &str, partition: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        partition: partition.into(),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        time_limit_seconds: Some(600),
        script: b"#!/bin/sh\nsleep 60\n".to_vec(),
        work_dir: "/tmp".into(),
        hold: name == "probe",
        ..Default::default()
    }
}

/// `request` with a fresh credential for `user`.
pub fn as_user<T>(user: &str, request: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(request);
    req.metadata_mut()
        .insert(docket_proto::metadata::CREDENTIAL, credential(user));
    req
}

pub async fn submit(
    client: &mut JobsClient<Channel>,
    user: &str,
    jobs: Vec<pb::JobSpec>,
) -> Result<Vec<pb::SubmitResult>, tonic::Status> {
    let req = as_user(user, pb::SubmitJobsRequest { jobs });
    client
        .submit_jobs(req)
        .await
        .map(|r| r.into_inner().results)
}

pub async fn list(
    client: &mut JobsClient<Channel>,
    user: &str,
    request: pb::ListJobsRequest,
) -> Result<Vec<pb::JobInfo>, tonic::Status> {
    let mut all = Vec::new();
    let mut request = request;
    loop {
        let req = as_user(user, request.clone());
        let page = client.list_jobs(req).await?.into_inner();
        all.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        request.page_token = page.next_page_token;
    }
}

pub enum Act {
    Cancel,
    Hold,
    Release,
    Suspend,
    Resume,
}

pub async fn act(
    client: &mut JobsClient<Channel>,
    user: &str,
    what: Act,
    ids: &[u64],
) -> Result<Vec<pb::JobResult>, tonic::Status> {
    let jobs = ids
        .iter()
        .map(|id| pb::JobRef {
            job_id: *id,
            task: None,
        })
        .collect();
    let req = as_user(user, pb::JobsRequest { jobs });
    let r = match what {
        Act::Cancel => client.cancel_jobs(req).await,
        Act::Hold => client.hold_jobs(req).await,
        Act::Release => client.release_jobs(req).await,
        Act::Suspend => client.suspend_jobs(req).await,
        Act::Resume => client.resume_jobs(req).await,
    };
    r.map(|r| r.into_inner().results)
}
