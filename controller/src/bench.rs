//! `docket-controller bench`: submissions per second and latency against a 3-replica cluster
//! of real `docket-controller` processes on loopback (fsync on), and the latency of a queue
//! listing while the storm runs and the leader's loops are busy.
//!
//! Each measured client submits one job per request, closed loop, to the leader (as the
//! `docket` command does: it follows the leader); the listing client reads from a follower.
//!
//! As in production, every connection is TLS and every request carries a fresh credential,
//! which the replica verifies (signature, lifetime, replay); the benchmark mints them with
//! the cluster key, as `docket-authd` would. One user submits everything, so its per-user
//! caps are lifted: the site sets `MaxSubmitJobsPerUser = 0` and the replicas run with
//! `--user-rpc-rate 0`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use docket_proto::v1 as pb;
use docket_proto::v1::jobs_client::JobsClient;
use tonic::transport::Channel;

/// The site the benchmark runs: 200 nodes of 64 cpus in one partition, loops every second.
const SITE: &str = r#"
ClusterName = "bench"
MaxSubmitJobsPerUser = 0

[SchedulerParameters]
sched_interval = 1
bf_interval = 1
max_sched_time = 1
bf_max_time = 1

[[nodes]]
NodeName = "b[001-200]"
CPUs = 64
RealMemory = "256G"

[[partitions]]
PartitionName = "batch"
Nodes = "ALL"
Default = true
MaxTime = "7-00:00:00"
DefaultTime = "1:00:00"

[[accounts]]
Name = "bench"

[[users]]
Name = "bench"
DefaultAccount = "bench"
"#;

/// The user the benchmark submits as (declared in [`SITE`]).
const BENCH_USER: &str = "bench";

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_addr() -> Result<String> {
    docket_auth::local::free_loopback_addr().map_err(anyhow::Error::msg)
}

/// What a benchmark client needs: TLS to the replicas, and credentials.
#[derive(Clone)]
struct Access {
    tls: docket_auth::tls::TlsContext,
    minter: docket_auth::local::Minter,
    /// The benchmark user's uid, looked up once (a lookup reads the user database).
    uid: u32,
}

impl Access {
    fn client(&self, addr: &str) -> Result<JobsClient<Channel>> {
        let channel =
            docket_auth::tls::connect::channel(addr, &self.tls, Duration::from_secs(2), None)
                .map_err(|e| anyhow::anyhow!(e))?;
        Ok(JobsClient::new(channel))
    }

    /// `message` with a fresh credential for the benchmark's user.
    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, tonic::Status> {
        let mut req = tonic::Request::new(message);
        let credential = self
            .minter
            .credential(self.uid, BENCH_USER)
            .map_err(|e| tonic::Status::internal(e.to_string()))?;
        req.metadata_mut().insert(
            docket_auth::CREDENTIAL_HEADER,
            credential
                .parse()
                .map_err(|_| tonic::Status::internal("credential is not ASCII"))?,
        );
        Ok(req)
    }
}

fn spec(i: u64) -> pb::JobSpec {
    pb::JobSpec {
        name: format!("bench-{i}"),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        time_limit_seconds: Some(3600),
        script: b"#!/bin/sh\nsleep 3600\n".to_vec(),
        work_dir: "/tmp".into(),
        ..Default::default()
    }
}

async fn submit_one(
    access: &Access,
    c: &mut JobsClient<Channel>,
    i: u64,
) -> Result<(), tonic::Status> {
    let req = access.request(pb::SubmitJobsRequest {
        jobs: vec![spec(i)],
    })?;
    let r = c.submit_jobs(req).await?.into_inner();
    match r.results.first().and_then(|r| r.result.clone()) {
        Some(pb::submit_result::Result::JobId(_)) => Ok(()),
        other => Err(tonic::Status::internal(format!("refused: {other:?}"))),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

/// One measured storm.
#[derive(Debug, serde::Serialize)]
pub struct Run {
    pub clients: usize,
    pub submissions: u64,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub listings: u64,
    pub list_p50_ms: f64,
    pub list_p99_ms: f64,
    pub queue_at_end: u64,
}

/// Runs the benchmark with the `docket-controller` binary at `exe`.
pub async fn run(exe: &Path, clients: &[usize], seconds: u64, json: bool) -> Result<()> {
    let dir = tempfile::Builder::new().prefix("docket-bench").tempdir()?;
    let site = dir.path().join("site.toml");
    std::fs::write(&site, SITE)?;
    let secrets = docket_auth::local::LocalSecrets::create(&dir.path().join("secrets"), "bench")?;
    for id in 1..=3 {
        secrets.issue(
            &docket_auth::tls::Role::Replica(id),
            &["127.0.0.1".to_owned()],
        )?;
    }
    let tool = docket_auth::tls::Role::Tool("bench".into());
    let access = Access {
        tls: docket_auth::tls::TlsContext::load(secrets.issue(&tool, &[])?)?,
        minter: secrets.minter()?,
        uid: docket_auth::local::uid_for(BENCH_USER),
    };
    let addrs: BTreeMap<u64, String> = (1..=3)
        .map(|id| free_addr().map(|a| (id, a)))
        .collect::<Result<_>>()?;
    let bootstrap = addrs
        .iter()
        .map(|(id, a)| format!("{id}={a}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut procs = Procs(Vec::new());
    for (id, addr) in &addrs {
        let mut cmd = Command::new(exe);
        cmd.args([
            "run",
            "--id",
            &id.to_string(),
            "--listen",
            addr,
            "--log",
            "error,openraft=off",
            "--agent-fence-ms",
            "0",
        ])
        .arg("--data-dir")
        .arg(dir.path().join(format!("r{id}")))
        .arg("--config")
        .arg(&site)
        .args(["--user-rpc-rate", "0"])
        .args(secrets.controller_flags(*id))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        if *id == 1 {
            cmd.args(["--bootstrap", &bootstrap]);
        }
        procs.0.push(cmd.spawn().context("starting a replica")?);
    }
    // Ready when a submission is accepted.
    let start = Instant::now();
    let mut probe = access.client(&addrs[&1])?;
    while submit_one(&access, &mut probe, 0).await.is_err() {
        if start.elapsed() > Duration::from_secs(60) {
            bail!("the cluster did not accept a submission within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The leader, as the replicas report it.
    let channels = {
        let tls = access.tls.clone();
        docket_raft::network::Channels::with_maker(
            docket_raft::network::NetworkConfig::default(),
            std::sync::Arc::new(move |addr: &str| {
                docket_auth::tls::connect::channel(addr, &tls, Duration::from_secs(2), None)
            }),
        )
    };
    let mut leader = None;
    for addr in addrs.values() {
        if let Ok(s) = channels.status(addr, Duration::from_secs(2)).await
            && let Some(addr) = s.leader_addr
        {
            leader = Some(addr);
            break;
        }
    }
    let leader = leader.context("no replica names a leader")?;
    let follower = addrs
        .values()
        .find(|a| **a != leader)
        .cloned()
        .context("no follower")?;
    let mut runs = Vec::new();
    let mut next_id = 1u64;
    for &n in clients {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let mut tasks = Vec::new();
        for c in 0..n {
            let mut conn = access.client(&leader)?;
            let first = next_id + (c as u64) * 1_000_000;
            let access = access.clone();
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = first;
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    if submit_one(&access, &mut conn, i).await.is_ok() {
                        latencies.push(t0.elapsed());
                    }
                    i += 1;
                }
                latencies
            }));
        }
        next_id += (n as u64) * 1_000_000;
        // A listing client: the first page (1,000 jobs), linearizable, from a follower.
        let lister = {
            let mut c = access.client(&follower)?;
            let access = access.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let Ok(req) = access.request(pb::ListJobsRequest {
                        page_size: 1_000,
                        ..Default::default()
                    }) else {
                        break;
                    };
                    let t0 = Instant::now();
                    if c.list_jobs(req).await.is_ok() {
                        latencies.push(t0.elapsed());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                latencies
            })
        };
        let began = Instant::now();
        let mut latencies = Vec::new();
        for t in tasks {
            latencies.extend(t.await?);
        }
        let elapsed = began.elapsed();
        let mut listings = lister.await?;
        latencies.sort_unstable();
        listings.sort_unstable();
        let run = Run {
            clients: n,
            submissions: latencies.len() as u64,
            per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
            p50_ms: percentile(&latencies, 0.50),
            p99_ms: percentile(&latencies, 0.99),
            listings: listings.len() as u64,
            list_p50_ms: percentile(&listings, 0.50),
            list_p99_ms: percentile(&listings, 0.99),
            queue_at_end: runs.iter().map(|r: &Run| r.submissions).sum::<u64>()
                + latencies.len() as u64,
        };
        if !json {
            println!(
                "clients {:>3}: {:>7.0} submissions/s  p50 {:>6.2} ms  p99 {:>7.2} ms  | listing 1,000 of {} jobs: p50 {:>6.2} ms  p99 {:>7.2} ms",
                run.clients,
                run.per_second,
                run.p50_ms,
                run.p99_ms,
                run.queue_at_end,
                run.list_p50_ms,
                run.list_p99_ms
            );
        }
        runs.push(run);
    }
    if json {
        println!(
            "{}",
            serde_json::json!({ "replicas": 3, "fsync": true, "runs": runs })
        );
    }
    Ok(())
}
