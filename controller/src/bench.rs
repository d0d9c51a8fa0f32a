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
//!
//! What the leader's scheduling passes did during each storm is read from its `/status`
//! before and after: passes run, their mean duration, how many stopped early and why (time,
//! `rpc pressure`), backfill cycles that started over, jobs started. With
//! `--max-rpc-cnt 0,32` the whole benchmark runs once per value on a fresh cluster, so the
//! passes' yielding under RPC pressure is seen side by side with it off (`0`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use docket_proto::v1 as pb;
use docket_proto::v1::jobs_client::JobsClient;
use tonic::transport::Channel;

/// The site the benchmark runs: 200 nodes of 64 cpus in one partition, loops every second;
/// `{params}` is replaced by the scheduler parameters a run adds.
const SITE: &str = r#"
ClusterName = "bench"
MaxSubmitJobsPerUser = 0

[SchedulerParameters]
sched_interval = 1
bf_interval = 1
max_sched_time = 1
bf_max_time = 1
{params}

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

    /// Like [`Self::client`], connected now.
    async fn connected_client(&self, addr: &str) -> Result<JobsClient<Channel>> {
        let channel =
            docket_auth::tls::connect::connect(addr, &self.tls, Duration::from_secs(2), None)
                .await
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
        docket_proto::metadata::insert_credential(req.metadata_mut(), &credential)
            .map_err(|_| tonic::Status::internal("the credential is not a header value"))?;
        Ok(req)
    }
}

fn spec(i: u64) -> pb::JobSpec {
    pb::JobSpec {
        name: format!("bench-{i}"),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        // A job that names no memory gets the whole node's, as in Slurm without
        // DefMemPerCPU: 1 GiB a cpu lets 64 share a node.
        memory: Some(pb::job_spec::Memory::MemPerCpuMib(1024)),
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

/// Lists the first page (1,000 jobs, linearizable) from `follower` every 50 ms until
/// `deadline`, and returns each listing's latency.
async fn list_until(access: &Access, follower: &str, deadline: Instant) -> Result<Vec<Duration>> {
    // Connected before the first timed listing, as the submitters' connections are in
    // effect: each of theirs is made once in hundreds of calls, while this client makes some
    // 90, and the one that made its connection (TCP and the TLS handshake, to a host busy
    // with the storm) was the slowest, which is what the p99 of 90 reports. If it cannot
    // connect now, it connects at its first listing, as before.
    let mut client = match access.connected_client(follower).await {
        Ok(client) => client,
        Err(_) => access.client(follower)?,
    };
    let mut latencies = Vec::new();
    while Instant::now() < deadline {
        let req = access
            .request(pb::ListJobsRequest {
                page_size: 1_000,
                ..Default::default()
            })
            .map_err(|e| anyhow::anyhow!("a credential for the listing: {e}"))?;
        let t0 = Instant::now();
        if client.list_jobs(req).await.is_ok() {
            latencies.push(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(latencies)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Concurrent submitting clients, one storm each.
    pub clients: Vec<usize>,
    pub seconds: u64,
    pub json: bool,
    /// `max_rpc_cnt` values: the benchmark runs once per value, each on a fresh cluster.
    pub max_rpc_cnt: Vec<u32>,
    /// Backfill's `bf_continue`.
    pub bf_continue: bool,
}

/// What one kind of pass did during a storm (the difference of the leader's `/status`).
#[derive(Debug, Default, serde::Serialize)]
pub struct PassFigures {
    pub runs: u64,
    pub mean_ms: f64,
    pub jobs_started: u64,
    /// Passes that stopped before the end of their order, by why.
    pub stopped_early: BTreeMap<String, u64>,
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
    pub max_rpc_cnt: u32,
    /// The leader's passes during the storm, by kind (`direct`, `main`, `backfill`).
    pub passes: BTreeMap<String, PassFigures>,
    /// Backfill cycles that ended after a yield because the state changed.
    pub backfill_started_over: u64,
    /// Cpu time per acknowledged submission, microseconds: the leader, each follower (the
    /// one serving the listings first), and the benchmark's own clients.
    pub leader_cpu_us: f64,
    pub followers_cpu_us: Vec<f64>,
    pub client_cpu_us: f64,
    /// Jobs running at the end, and the reasons of the first 1,000 pending (with counts).
    pub running_at_end: u64,
    pub pending_reasons: BTreeMap<String, u64>,
}

/// Runs the benchmark with the `docket-controller` binary at `exe`: once per `max_rpc_cnt`
/// value, each on a cluster of its own.
pub async fn run(exe: &Path, options: &BenchOptions) -> Result<()> {
    let mut runs = Vec::new();
    let values = if options.max_rpc_cnt.is_empty() {
        vec![0]
    } else {
        options.max_rpc_cnt.clone()
    };
    for max_rpc_cnt in values {
        if !options.json {
            println!(
                "max_rpc_cnt {max_rpc_cnt}, bf_continue {}:",
                options.bf_continue
            );
        }
        runs.extend(run_cluster(exe, options, max_rpc_cnt).await?);
    }
    if options.json {
        println!(
            "{}",
            serde_json::json!({ "replicas": 3, "fsync": true, "runs": runs })
        );
    }
    Ok(())
}

/// The scheduler parameters a run adds to [`SITE`].
fn site(max_rpc_cnt: u32, bf_continue: bool) -> String {
    SITE.replace(
        "{params}",
        &format!("max_rpc_cnt = {max_rpc_cnt}\nbf_continue = {bf_continue}"),
    )
}

/// One cluster, one storm per client count.
async fn run_cluster(exe: &Path, options: &BenchOptions, max_rpc_cnt: u32) -> Result<Vec<Run>> {
    let cluster = BenchCluster::start(exe, options, max_rpc_cnt).await?;
    let mut runs: Vec<Run> = Vec::new();
    let mut next_id = 1u64;
    for &n in &options.clients {
        let queued_before = runs.iter().map(|r| r.submissions).sum::<u64>();
        let mut run = cluster.storm(n, options.seconds, next_id).await?;
        next_id += (n as u64) * 1_000_000;
        run.max_rpc_cnt = max_rpc_cnt;
        run.queue_at_end += queued_before;
        if !options.json {
            run.print();
        }
        runs.push(run);
    }
    Ok(runs)
}

/// Three replicas of the binary under test, and who is who among them.
struct BenchCluster {
    /// Killed when dropped, before the directory goes.
    _procs: Procs,
    _dir: tempfile::TempDir,
    access: Access,
    leader: String,
    leader_http: String,
    /// The follower that serves the listings.
    follower: String,
    /// Process ids: the leader, the listing follower, the other follower.
    roles: Vec<i32>,
}

impl BenchCluster {
    /// Starts the replicas on `SITE` with `max_rpc_cnt`, waits until a submission is
    /// accepted, and finds the leader.
    async fn start(exe: &Path, options: &BenchOptions, max_rpc_cnt: u32) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("docket-bench").tempdir()?;
        let site_file = dir.path().join("site.toml");
        std::fs::write(&site_file, site(max_rpc_cnt, options.bf_continue))?;
        let secrets =
            docket_auth::local::LocalSecrets::create(&dir.path().join("secrets"), "bench")?;
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
        let http: BTreeMap<u64, String> = (1..=3)
            .map(|id| free_addr().map(|a| (id, a)))
            .collect::<Result<_>>()?;
        let procs = spawn_replicas(exe, dir.path(), &site_file, &secrets, &addrs, &http)?;
        // Ready when a submission is accepted.
        let start = Instant::now();
        let mut probe = access.client(&addrs[&1])?;
        while submit_one(&access, &mut probe, 0).await.is_err() {
            if start.elapsed() > Duration::from_secs(60) {
                bail!("the cluster did not accept a submission within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let leader = reported_leader(&access, &addrs).await?;
        let leader_http = addrs
            .iter()
            .find(|(_, a)| **a == leader)
            .map(|(id, _)| http[id].clone())
            .context("the leader is not one of the replicas started")?;
        let follower = addrs
            .values()
            .find(|a| **a != leader)
            .cloned()
            .context("no follower")?;
        // Whose cpu is whose: the leader, the follower serving the listings, the other one.
        let pid_of = |addr: &str| {
            addrs
                .iter()
                .find(|(_, a)| *a == addr)
                .map(|(id, _)| procs.0[(*id - 1) as usize].id() as i32)
        };
        let mut roles: Vec<i32> = [leader.as_str(), follower.as_str()]
            .iter()
            .filter_map(|a| pid_of(a))
            .collect();
        roles.extend(
            addrs
                .values()
                .filter(|a| **a != leader && **a != follower)
                .filter_map(|a| pid_of(a)),
        );
        Ok(BenchCluster {
            _procs: procs,
            _dir: dir,
            access,
            leader,
            leader_http,
            follower,
            roles,
        })
    }

    /// Cpu milliseconds so far of each replica (in `roles` order) and of this process.
    fn cpu_now(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .roles
            .iter()
            .map(|pid| docket_deploy::stats::process_cpu_ms(*pid, false))
            .collect();
        v.push(docket_deploy::stats::process_cpu_ms(
            std::process::id() as i32,
            false,
        ));
        v
    }

    /// `n` closed-loop submitters for `seconds` against the leader (ids from `first_id`),
    /// with a listing client on a follower; the figures (the queue counts this storm's
    /// submissions only).
    async fn storm(&self, n: usize, seconds: u64, first_id: u64) -> Result<Run> {
        let loops_before = loop_stats(&self.leader_http).await?;
        let cpu_before = self.cpu_now();
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let tasks = self.submitters(n, first_id, deadline)?;
        let lister = self.lister(deadline);
        let began = Instant::now();
        let mut latencies = Vec::new();
        for t in tasks {
            latencies.extend(t.await?);
        }
        let elapsed = began.elapsed();
        let mut listings = lister.await.context("the listing client stopped")??;
        let cpu_spent: Vec<f64> = self
            .cpu_now()
            .iter()
            .zip(&cpu_before)
            .map(|(a, b)| a.saturating_sub(*b) as f64 * 1000.0 / latencies.len().max(1) as f64)
            .collect();
        let loops_after = loop_stats(&self.leader_http).await?;
        let queue = queue_summary(&self.access, &self.leader).await?;
        latencies.sort_unstable();
        listings.sort_unstable();
        Ok(Run {
            clients: n,
            submissions: latencies.len() as u64,
            per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
            p50_ms: percentile(&latencies, 0.50),
            p99_ms: percentile(&latencies, 0.99),
            listings: listings.len() as u64,
            list_p50_ms: percentile(&listings, 0.50),
            list_p99_ms: percentile(&listings, 0.99),
            queue_at_end: latencies.len() as u64,
            max_rpc_cnt: 0,
            passes: pass_figures(&loops_before, &loops_after),
            backfill_started_over: counter(&loops_after, &["backfill_state_changed"])
                .saturating_sub(counter(&loops_before, &["backfill_state_changed"])),
            leader_cpu_us: cpu_spent.first().copied().unwrap_or(0.0),
            followers_cpu_us: cpu_spent
                .get(1..cpu_spent.len().saturating_sub(1))
                .map(<[f64]>::to_vec)
                .unwrap_or_default(),
            client_cpu_us: cpu_spent.last().copied().unwrap_or(0.0),
            running_at_end: queue.0,
            pending_reasons: queue.1,
        })
    }

    /// `n` tasks each submitting one job at a time until `deadline`; each task's latencies.
    fn submitters(
        &self,
        n: usize,
        first_id: u64,
        deadline: Instant,
    ) -> Result<Vec<tokio::task::JoinHandle<Vec<Duration>>>> {
        let mut tasks = Vec::new();
        for c in 0..n {
            let mut conn = self.access.client(&self.leader)?;
            let first = first_id + (c as u64) * 1_000_000;
            let access = self.access.clone();
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
        Ok(tasks)
    }

    /// A listing client: the first page (1,000 jobs), linearizable, from a follower. It runs
    /// on a thread and runtime of its own, as `squeue` runs in a process of its own: in the
    /// submitters' runtime its answers would wait behind 64 busy tasks.
    fn lister(&self, deadline: Instant) -> tokio::sync::oneshot::Receiver<Result<Vec<Duration>>> {
        let access = self.access.clone();
        let follower = self.follower.clone();
        let (done, finished) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let listings = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(list_until(&access, &follower, deadline)));
            let _ = done.send(listings);
        });
        finished
    }
}

/// Starts the three replicas (the first bootstraps the cluster).
fn spawn_replicas(
    exe: &Path,
    dir: &Path,
    site_file: &Path,
    secrets: &docket_auth::local::LocalSecrets,
    addrs: &BTreeMap<u64, String>,
    http: &BTreeMap<u64, String>,
) -> Result<Procs> {
    let bootstrap = addrs
        .iter()
        .map(|(id, a)| format!("{id}={a}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut procs = Procs(Vec::new());
    for (id, addr) in addrs {
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
        .arg(dir.join(format!("r{id}")))
        .arg("--config")
        .arg(site_file)
        .args(["--http-listen", &http[id]])
        .args(["--user-rpc-rate", "0"])
        .args(secrets.controller_flags(*id))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        if *id == 1 {
            cmd.args(["--bootstrap", &bootstrap]);
        }
        procs.0.push(cmd.spawn().context("starting a replica")?);
    }
    Ok(procs)
}

/// The leader's address, as the replicas report it.
async fn reported_leader(access: &Access, addrs: &BTreeMap<u64, String>) -> Result<String> {
    let channels = {
        let tls = access.tls.clone();
        docket_raft::network::Channels::with_maker(
            docket_raft::network::NetworkConfig::default(),
            std::sync::Arc::new(move |_, addr: &str| {
                docket_auth::tls::connect::channel(addr, &tls, Duration::from_secs(2), None)
            }),
        )
    };
    for addr in addrs.values() {
        if let Ok(s) = channels.status(addr, Duration::from_secs(2)).await
            && let Some(addr) = s.leader_addr
        {
            return Ok(addr);
        }
    }
    bail!("no replica names a leader")
}

impl Run {
    /// The figures, as lines for a reader.
    fn print(&self) {
        println!(
            "clients {:>3}: {:>7.0} submissions/s  p50 {:>6.2} ms  p99 {:>7.2} ms  | listing 1,000 of {} jobs: p50 {:>6.2} ms  p99 {:>7.2} ms",
            self.clients,
            self.per_second,
            self.p50_ms,
            self.p99_ms,
            self.queue_at_end,
            self.list_p50_ms,
            self.list_p99_ms
        );
        let followers: Vec<String> = self
            .followers_cpu_us
            .iter()
            .map(|us| format!("{us:.0}"))
            .collect();
        println!(
            "             cpu per submission: leader {:.0} us, followers {} us (the first serves the listings), clients {:.0} us",
            self.leader_cpu_us,
            followers.join(" / "),
            self.client_cpu_us
        );
        println!("             {}", self.passes_line());
        let reasons: Vec<String> = self
            .pending_reasons
            .iter()
            .map(|(r, n)| format!("{n} {r}"))
            .collect();
        println!(
            "             at the end: {} running; the first 1,000 pending: {}",
            self.running_at_end,
            reasons.join(", ")
        );
    }

    /// The leader's passes during the storm, one line.
    fn passes_line(&self) -> String {
        let mut parts: Vec<String> = self
            .passes
            .iter()
            .map(|(kind, p)| {
                let early = p
                    .stopped_early
                    .iter()
                    .map(|(why, n)| format!("{n} by {why}"))
                    .collect::<Vec<_>>();
                format!(
                    "{kind} {} x {:.1} ms, {} started{}",
                    p.runs,
                    p.mean_ms,
                    p.jobs_started,
                    if early.is_empty() {
                        String::new()
                    } else {
                        format!(", stopped {}", early.join(", "))
                    }
                )
            })
            .collect();
        if self.backfill_started_over > 0 {
            parts.push(format!(
                "{} backfill cycles started over",
                self.backfill_started_over
            ));
        }
        format!("passes: {}", parts.join("; "))
    }
}

/// Jobs running now, and the reasons of the first 1,000 pending jobs with their counts.
async fn queue_summary(access: &Access, addr: &str) -> Result<(u64, BTreeMap<String, u64>)> {
    let mut c = access.client(addr)?;
    let mut running = 0;
    let mut token = String::new();
    loop {
        let req = access.request(pb::ListJobsRequest {
            states: vec!["RUNNING".into()],
            page_size: 10_000,
            page_token: token,
            ..Default::default()
        })?;
        let page = c.list_jobs(req).await?.into_inner();
        running += page.jobs.len() as u64;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let req = access.request(pb::ListJobsRequest {
        states: vec!["PENDING".into()],
        page_size: 1_000,
        ..Default::default()
    })?;
    let mut reasons = BTreeMap::new();
    for j in c.list_jobs(req).await?.into_inner().jobs {
        *reasons.entry(j.reason).or_default() += 1;
    }
    Ok((running, reasons))
}

/// The `loops` object of a replica's `/status` (its HTTP endpoint at `addr`).
async fn loop_stats(addr: &str) -> Result<serde_json::Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(b"GET /status HTTP/1.0\r\nHost: bench\r\n\r\n")
            .await?;
        let mut out = Vec::new();
        s.take(64 << 20).read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    let out = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .with_context(|| format!("{addr}/status did not answer within 10 s"))?
        .with_context(|| format!("GET {addr}/status"))?;
    let text = String::from_utf8_lossy(&out);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .with_context(|| format!("{addr}/status: no HTTP body"))?;
    let status: serde_json::Value =
        serde_json::from_str(body).with_context(|| format!("{addr}/status is not JSON"))?;
    Ok(status["loops"].clone())
}

/// The number at `path` in a `/status` loops object (0 if absent).
fn counter(v: &serde_json::Value, path: &[&str]) -> u64 {
    path.iter().fold(v, |v, k| &v[*k]).as_u64().unwrap_or(0)
}

/// What each kind of pass did between two `/status` loops objects.
fn pass_figures(
    before: &serde_json::Value,
    after: &serde_json::Value,
) -> BTreeMap<String, PassFigures> {
    let mut out = BTreeMap::new();
    for kind in ["direct", "main", "backfill"] {
        let delta = |k: &str| {
            counter(after, &["passes", kind, k])
                .saturating_sub(counter(before, &["passes", kind, k]))
        };
        let runs = delta("runs");
        let stopped_early = after["passes"][kind]["stopped_early"]
            .as_object()
            .map(|m| {
                m.keys()
                    .map(|why| {
                        let n =
                            counter(after, &["passes", kind, "stopped_early", why]).saturating_sub(
                                counter(before, &["passes", kind, "stopped_early", why]),
                            );
                        (why.clone(), n)
                    })
                    .filter(|(_, n)| *n > 0)
                    .collect()
            })
            .unwrap_or_default();
        out.insert(
            kind.to_owned(),
            PassFigures {
                runs,
                mean_ms: if runs > 0 {
                    delta("total_us") as f64 / runs as f64 / 1000.0
                } else {
                    0.0
                },
                jobs_started: delta("jobs_started"),
                stopped_early,
            },
        );
    }
    out
}
