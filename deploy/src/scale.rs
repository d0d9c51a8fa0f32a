//! `docket-local scale`: many simulated agents against real controllers, for the figures of
//! a large machine on one host.
//!
//! Starts a cluster of `replicas` controllers and `agents` agents in simulated execution
//! (each its own process, name, state directory and declared 8 cpus / 8 GiB), waits until
//! every agent has registered and answers its heartbeats, submits `jobs` whole-node jobs of
//! `runtime` seconds in batches, and follows them to their end through the leader. It prints
//! what it measured — time to register every agent, the agents' memory, submission rate, time
//! until every job had started and ended, start and end rates, the controllers' cpu time —
//! and fails only when a job did not complete (nothing here is timed against a threshold).
//! The cluster is stopped at the end, whatever happened, and its state directory removed
//! unless a job did not complete (its logs are then kept for reading).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use docket_deploy::{Layout, LocalCluster, rpc};
use docket_proto::v1 as pb;

/// What to run.
#[derive(Debug, Clone)]
pub struct ScaleSpec {
    pub replicas: u32,
    pub agents: u32,
    pub jobs: u32,
    pub runtime_s: u32,
    pub heartbeat_ms: u64,
    pub batch: u32,
    /// The replicas' Raft heartbeat and election timeout range (ms).
    pub raft_heartbeat_ms: u64,
    pub election_timeout_ms: String,
    /// The agents' ping after silence (ms, 0 none); the agent's default (500 ms) unless set.
    pub agent_ping_ms: Option<u64>,
}

/// What was measured.
#[derive(Debug, Default)]
pub struct ScaleReport {
    pub registered_s: f64,
    pub agents_pss_mib: f64,
    pub submit_s: f64,
    pub all_started_s: f64,
    pub all_ended_s: f64,
    pub states: BTreeMap<String, usize>,
    pub controller_cpu_s: Vec<f64>,
    /// Raft terms from every agent responding to every job ended (elections meanwhile).
    pub terms: u64,
    /// Per job, from the replicated times: submitted to started, started to ended (ms).
    pub submit_to_start_ms: Vec<u64>,
    pub start_to_end_ms: Vec<u64>,
}

/// How long any phase may take before the run gives up.
const PHASE_DEADLINE: Duration = Duration::from_secs(900);

/// Runs the scale test in `state_dir` with the binaries in `bins`.
pub async fn run(
    spec: &ScaleSpec,
    state_dir: std::path::PathBuf,
    bins: std::path::PathBuf,
) -> Result<ScaleReport> {
    let mut layout = Layout::new(spec.replicas, 0, spec.agents, state_dir, bins);
    layout.agent_heartbeat_ms = spec.heartbeat_ms;
    layout.raft_heartbeat_ms = Some(spec.raft_heartbeat_ms);
    layout.election_timeout_ms = Some(spec.election_timeout_ms.clone());
    layout.agent_ping_ms = spec.agent_ping_ms;
    // A node is declared down after several missed heartbeats, never sooner than 10 s.
    layout.agent_fence_ms = spec.heartbeat_ms.saturating_mul(6).max(10_000);
    layout.node_down_margin_ms = spec.heartbeat_ms.saturating_mul(4).max(5_000);
    let start = Instant::now();
    let cluster = LocalCluster::start(&layout)?;
    let outcome = tokio::select! {
        o = measure(spec, &cluster, start) => o,
        signal = docket_deploy::interrupted() => {
            Err(anyhow!("interrupted by {signal}; stopping the cluster"))
        }
    };
    // A run that went wrong keeps its logs for reading.
    let keep = !outcome.as_ref().is_ok_and(|r| r.all_completed(spec.jobs));
    let stopped = cluster.stop(!keep).await;
    if keep {
        eprintln!(
            "docket-local scale: the cluster's logs are kept in {}",
            layout.state_dir.join("logs").display()
        );
    }
    let report = outcome?;
    stopped?;
    Ok(report)
}

/// Waits for every agent, submits the jobs and follows them to their end; the figures.
async fn measure(spec: &ScaleSpec, cluster: &LocalCluster, start: Instant) -> Result<ScaleReport> {
    let mut report = ScaleReport::default();
    let (_, leader) = cluster.wait_ready(PHASE_DEADLINE).await?;
    report.registered_s = start.elapsed().as_secs_f64();
    report.agents_pss_mib = agents_pss_mib(cluster);
    let cpu_before: Vec<f64> = cluster.record.replicas.iter().map(cpu_seconds).collect();
    let term_before = term(cluster).await;

    let submitted = Instant::now();
    let first_ms = docket_proto::unix_ms();
    let ids = submit_all(spec, cluster, &leader).await?;
    report.submit_s = submitted.elapsed().as_secs_f64();

    let (started, ended) = follow(cluster, &ids, submitted, first_ms, &mut report).await?;
    report.terms = term(cluster).await.saturating_sub(term_before);
    report.all_started_s = started.unwrap_or_default();
    report.all_ended_s = ended.unwrap_or_default();
    report.controller_cpu_s = cluster
        .record
        .replicas
        .iter()
        .map(cpu_seconds)
        .zip(cpu_before)
        .map(|(after, before)| after - before)
        .collect();
    Ok(report)
}

/// The agents' memory in all, MiB (their proportional set sizes summed).
fn agents_pss_mib(cluster: &LocalCluster) -> f64 {
    cluster
        .record
        .agents
        .iter()
        .filter_map(|a| a.pid)
        .map(pss_kib)
        .sum::<u64>() as f64
        / 1024.0
}

/// Submits the spec's whole-node jobs in batches through the leader; their ids.
async fn submit_all(
    spec: &ScaleSpec,
    cluster: &LocalCluster,
    leader: &str,
) -> Result<BTreeSet<u64>> {
    let mut ids = BTreeSet::new();
    let script = format!("#!/bin/sh\nsleep {}\n", spec.runtime_s).into_bytes();
    let mut left = spec.jobs;
    while left > 0 {
        let n = left.min(spec.batch.max(1));
        let jobs: Vec<pb::JobSpec> = (0..n)
            .map(|i| pb::JobSpec {
                name: format!("scale-{}", spec.jobs - left + i),
                partition: "sim".into(),
                nodes: 1,
                ntasks: 1,
                cpus_per_task: 8,
                time_limit_seconds: Some(i64::from(spec.runtime_s) + 600),
                script: script.clone(),
                work_dir: "/tmp".into(),
                ..Default::default()
            })
            .collect();
        let answer = submit(cluster, leader, jobs).await?;
        for r in answer {
            match r.result {
                Some(pb::submit_result::Result::JobId(id)) => {
                    ids.insert(id);
                }
                Some(pb::submit_result::Result::Error(e)) => bail!("a submission was refused: {e}"),
                None => bail!("a submission got no answer"),
            }
        }
        left -= n;
    }
    Ok(ids)
}

/// Polls the leader every 500 ms until every job in `ids` has ended, recording their final
/// states and latencies in `report`; seconds from the first submission until every job had
/// started, and until every job had ended.
async fn follow(
    cluster: &LocalCluster,
    ids: &BTreeSet<u64>,
    submitted: Instant,
    first_ms: u64,
    report: &mut ScaleReport,
) -> Result<(Option<f64>, Option<f64>)> {
    let (mut started, mut ended) = (None, None);
    while ended.is_none() {
        if submitted.elapsed() > PHASE_DEADLINE {
            bail!(
                "the jobs had not all ended after {} s",
                PHASE_DEADLINE.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some((_, addr)) = rpc::leader(&cluster.addrs()).await else {
            continue;
        };
        let Ok(all) = rpc::all_jobs(&addr).await else {
            continue;
        };
        let ours: Vec<&pb::JobInfo> = all.iter().filter(|j| ids.contains(&j.job_id)).collect();
        if started.is_none()
            && ours.len() == ids.len()
            && ours.iter().all(|j| j.start_time_ms.is_some())
        {
            started = Some(submitted.elapsed().as_secs_f64());
        }
        if ours.len() == ids.len() && ours.iter().all(|j| rpc::is_final(j)) {
            // The last end as the replicated state recorded it, not when this poll saw it.
            let last_ms = ours.iter().filter_map(|j| j.end_time_ms).max();
            ended = Some(last_ms.map_or_else(
                || submitted.elapsed().as_secs_f64(),
                |l| l.saturating_sub(first_ms) as f64 / 1000.0,
            ));
            report.record_final(&ours);
        }
    }
    Ok((started, ended))
}

/// The cluster's current Raft term (0 when no replica answers).
async fn term(cluster: &LocalCluster) -> u64 {
    rpc::cluster_status(&cluster.addrs())
        .await
        .map_or(0, |s| s.term)
}

/// Submits a batch through the leader (or whichever replica leads by then).
async fn submit(
    cluster: &LocalCluster,
    leader: &str,
    jobs: Vec<pb::JobSpec>,
) -> Result<Vec<pb::SubmitResult>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut addr = leader.to_owned();
    loop {
        let mut c = rpc::jobs(&addr)?;
        let req = rpc::as_user("nobody", pb::SubmitJobsRequest { jobs: jobs.clone() });
        match c.submit_jobs(req).await {
            Ok(r) => return Ok(r.into_inner().results),
            Err(s) if Instant::now() < deadline => {
                eprintln!("docket-local scale: submission retried: {}", s.message());
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Some((_, a)) = rpc::leader(&cluster.addrs()).await {
                    addr = a;
                }
            }
            Err(s) => return Err(anyhow!("submitting: {}", s.message())),
        }
    }
}

/// Memory of a process, KiB: its proportional set size (pages it shares with the other
/// agents, such as the binary's, counted once across them), or 0 when it is gone.
fn pss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// User plus system cpu time of a replica's process so far, seconds.
fn cpu_seconds(r: &docket_deploy::local::ReplicaProc) -> f64 {
    r.pid.map_or(0.0, |pid| {
        docket_deploy::stats::process_cpu_ms(pid, false) as f64 / 1000.0
    })
}

impl ScaleReport {
    /// Counts the final states of `jobs`, with each one's time from submission to start and
    /// from start to end.
    fn record_final(&mut self, jobs: &[&pb::JobInfo]) {
        for j in jobs {
            *self.states.entry(j.state.clone()).or_default() += 1;
            if let (Some(s), Some(e)) = (j.start_time_ms, j.end_time_ms) {
                self.submit_to_start_ms
                    .push(s.saturating_sub(j.submit_time_ms));
                self.start_to_end_ms.push(e.saturating_sub(s));
            }
        }
    }

    /// The figures, one per line.
    pub fn render(&self, spec: &ScaleSpec) -> String {
        let states: Vec<String> = self
            .states
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect();
        let cpu: Vec<String> = self
            .controller_cpu_s
            .iter()
            .map(|c| format!("{c:.1}"))
            .collect();
        let rate = |n: u32, s: f64| if s > 0.0 { f64::from(n) / s } else { 0.0 };
        let p = |v: &[u64]| docket_deploy::stats::percentiles(v).unwrap_or((0, 0, 0));
        let (to_start, to_end) = (p(&self.submit_to_start_ms), p(&self.start_to_end_ms));
        format!(
            "=== docket-local scale: {} replicas, {} simulated agents, {} jobs of {} s, agent heartbeat {} ms, agent ping {}, raft heartbeat {} ms, election timeout {} ms ===\n\
             every agent registered and responding: {:.1} s after start\n\
             agents' memory (PSS):                  {:.0} MiB in all, {:.1} MiB each\n\
             submission:                            {:.2} s ({:.0} jobs/s, batches of {})\n\
             every job started:                     {:.1} s after the first submission ({:.0} starts/s)\n\
             every job ended:                       {:.1} s after the first submission ({:.0} jobs/s to completion)\n\
             submitted -> started, per job:         p50 {} ms, p99 {} ms, max {} ms\n\
             started -> ended, per job:             p50 {} ms, p99 {} ms, max {} ms\n\
             final states:                          {}\n\
             controllers' cpu time meanwhile (s):   {}\n\
             elections meanwhile (new Raft terms):  {}\n",
            spec.replicas,
            spec.agents,
            spec.jobs,
            spec.runtime_s,
            spec.heartbeat_ms,
            match spec.agent_ping_ms {
                None => "the agent's default".to_owned(),
                Some(0) => "none".to_owned(),
                Some(ms) => format!("{ms} ms"),
            },
            spec.raft_heartbeat_ms,
            spec.election_timeout_ms,
            self.registered_s,
            self.agents_pss_mib,
            self.agents_pss_mib / f64::from(spec.agents.max(1)),
            self.submit_s,
            rate(spec.jobs, self.submit_s),
            spec.batch,
            self.all_started_s,
            rate(spec.jobs, self.all_started_s),
            self.all_ended_s,
            rate(spec.jobs, self.all_ended_s),
            to_start.0,
            to_start.1,
            to_start.2,
            to_end.0,
            to_end.1,
            to_end.2,
            states.join(", "),
            cpu.join(" / "),
            self.terms,
        )
    }

    /// Whether every job completed.
    pub fn all_completed(&self, jobs: u32) -> bool {
        self.states.get("COMPLETED").copied().unwrap_or(0) == jobs as usize
    }
}
