//! The failover drills: take the leader out (SIGKILL, SIGSTOP, or a network partition) and
//! measure, from the fault, how long the cluster took to elect a new leader, to commit a write
//! (a submission) and to make a scheduling decision (that job started); then heal the fault
//! (restart, SIGCONT, reconnect) and measure how long the old leader took to rejoin as a
//! follower. Faults reach replicas through a [`FaultInjector`]: a cluster `docket-local`
//! started ([`LocalCluster`]), or any cluster through the operator's own commands
//! ([`Commands`]: `ssh {host} systemctl kill -s KILL docket-controller`, ...).

use std::time::{Duration, Instant};

use docket_proto::v1 as pb;

use crate::local::LocalCluster;
use crate::{LaunchError, rpc};

/// What a drill does to the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL; healed by starting it again on its data directory.
    Kill,
    /// SIGSTOP (a hung process, a long GC-like stall); healed by SIGCONT.
    Pause,
    /// Cut off from the other replicas; healed by reconnecting it.
    Partition,
}

impl Fault {
    pub fn describe(self) -> &'static str {
        match self {
            Fault::Kill => "kill -9",
            Fault::Pause => "SIGSTOP",
            Fault::Partition => "partition",
        }
    }
}

/// How a drill reaches a replica to break and heal it.
pub trait FaultInjector {
    fn inject(&mut self, fault: Fault, replica: u64, addr: &str) -> Result<(), LaunchError>;
    fn heal(&mut self, fault: Fault, replica: u64, addr: &str) -> Result<(), LaunchError>;
}

impl FaultInjector for LocalCluster {
    fn inject(&mut self, fault: Fault, replica: u64, _addr: &str) -> Result<(), LaunchError> {
        match fault {
            Fault::Kill => self.kill_replica(replica),
            Fault::Pause => self.pause_replica(replica, true),
            Fault::Partition => self.partition_replica(replica),
        }
    }

    fn heal(&mut self, fault: Fault, replica: u64, _addr: &str) -> Result<(), LaunchError> {
        match fault {
            Fault::Kill => self.start_replica(replica, false),
            Fault::Pause => self.pause_replica(replica, false),
            Fault::Partition => LocalCluster::heal(self, replica),
        }
    }
}

/// Faults by the operator's shell commands, run with `sh -c` after `{id}` (the replica's
/// id), `{addr}` (its `host:port`) and `{host}` are replaced.
#[derive(Debug, Clone)]
pub struct Commands {
    pub inject: String,
    pub heal: String,
}

impl Commands {
    /// How long one command may run.
    const TIMEOUT: Duration = Duration::from_secs(60);

    fn run(template: &str, replica: u64, addr: &str) -> Result<(), LaunchError> {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let line = template
            .replace("{id}", &replica.to_string())
            .replace("{addr}", addr)
            .replace("{host}", host.trim_matches(['[', ']']));
        let mut child = std::process::Command::new("sh")
            .args(["-c", &line])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(LaunchError::io(format!("running {line:?}")))?;
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child
                .try_wait()
                .map_err(LaunchError::io(format!("waiting for {line:?}")))?
            {
                break status;
            }
            if started.elapsed() > Self::TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(LaunchError::Timeout(format!(
                    "{line:?} still running after {} s; killed",
                    Self::TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if !status.success() {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
            }
            return Err(LaunchError::Invalid(format!(
                "{line:?} failed ({status}): {}",
                stderr.trim()
            )));
        }
        Ok(())
    }
}

impl FaultInjector for Commands {
    fn inject(&mut self, _fault: Fault, replica: u64, addr: &str) -> Result<(), LaunchError> {
        Self::run(&self.inject, replica, addr)
    }

    fn heal(&mut self, _fault: Fault, replica: u64, addr: &str) -> Result<(), LaunchError> {
        Self::run(&self.heal, replica, addr)
    }
}

/// What a drill measured (milliseconds from the fault).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrillReport {
    pub fault: Fault,
    /// The leader the fault hit.
    pub killed: u64,
    pub new_leader: u64,
    pub elected_ms: u64,
    pub first_write_ms: u64,
    /// `None`: the probe job did not start within the deadline (no free cpus?).
    pub first_start_ms: Option<u64>,
    pub probe_job: u64,
    /// Jobs in the queue before the fault that are missing after it (must be none).
    pub lost_jobs: Vec<u64>,
    /// From the heal to the old leader answering as a follower again (`None`: not within
    /// 30 s; not measured when the drill does not heal).
    pub rejoined_ms: Option<u64>,
}

impl std::fmt::Display for DrillReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "fault: {} leader (replica {})",
            self.fault.describe(),
            self.killed
        )?;
        writeln!(
            f,
            "  new leader {} after {} ms",
            self.new_leader, self.elected_ms
        )?;
        writeln!(
            f,
            "  first committed write after {} ms",
            self.first_write_ms
        )?;
        match self.first_start_ms {
            Some(ms) => writeln!(f, "  first scheduling decision after {ms} ms")?,
            None => writeln!(
                f,
                "  first scheduling decision after (none within the deadline)"
            )?,
        }
        writeln!(f, "  jobs lost: {}", self.lost_jobs.len())?;
        match self.rejoined_ms {
            Some(ms) => write!(
                f,
                "  old leader rejoined as follower {ms} ms after the fault ended"
            ),
            None => write!(f, "  old leader NOT rejoined as follower within 30 s"),
        }
    }
}

/// How a drill runs.
#[derive(Debug, Clone)]
pub struct DrillOptions {
    /// The partition the probe job runs in.
    pub partition: String,
    /// The probe job's working directory (on the nodes).
    pub work_dir: String,
    /// The fault lasts at least this long (and until the measurements are done).
    pub hold: Duration,
    /// Give up on a measurement after this long.
    pub deadline: Duration,
    /// Heal the fault at the end.
    pub heal: bool,
}

/// A one-cpu job that runs for a second.
pub fn probe_spec(partition: &str, work_dir: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: "failover-probe".into(),
        partition: partition.into(),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        time_limit_seconds: Some(60),
        script: b"#!/bin/sh\nsleep 1\n".to_vec(),
        work_dir: work_dir.into(),
        stdout: "/dev/null".into(),
        stderr: "/dev/null".into(),
        ..Default::default()
    }
}

/// Kills the leader of a cluster `docket-local` started and measures the recovery;
/// restarts the killed replica if `restart`.
pub async fn kill_leader(
    cluster: &mut LocalCluster,
    partition: &str,
    restart: bool,
    deadline: Duration,
) -> Result<DrillReport, LaunchError> {
    let addrs = cluster.addrs();
    let options = DrillOptions {
        partition: partition.to_owned(),
        work_dir: cluster.record.state_dir.display().to_string(),
        hold: Duration::ZERO,
        deadline,
        heal: restart,
    };
    run(cluster, Fault::Kill, &addrs, &options).await
}

/// The replicas the leader's status names, as (id, address); `addrs` are where to ask.
async fn members(addrs: &[String]) -> Result<(u64, String, Vec<(u64, String)>), LaunchError> {
    let status = rpc::cluster_status(addrs)
        .await
        .ok_or_else(|| LaunchError::Rpc(format!("no replica of {addrs:?} answers")))?;
    let members: Vec<(u64, String)> = status
        .replicas
        .iter()
        .map(|r| (r.id, r.addr.clone()))
        .collect();
    let (leader, leader_addr) = rpc::leader(addrs)
        .await
        .ok_or_else(|| LaunchError::Rpc("no leader to take out".into()))?;
    Ok((leader, leader_addr, members))
}

/// Takes the leader out with `fault`, measures the recovery, and heals it.
pub async fn run(
    injector: &mut dyn FaultInjector,
    fault: Fault,
    addrs: &[String],
    options: &DrillOptions,
) -> Result<DrillReport, LaunchError> {
    let (old, old_addr, members) = members(addrs).await?;
    let before: Vec<u64> = rpc::all_jobs(&old_addr)
        .await?
        .iter()
        .map(|j| j.job_id)
        .collect();
    let others: Vec<String> = members
        .iter()
        .filter(|(id, _)| *id != old)
        .map(|(_, a)| a.clone())
        .collect();
    let deadline = options.deadline;
    let faulted_at = Instant::now();
    injector.inject(fault, old, &old_addr)?;
    let ms = |at: Instant| at.duration_since(faulted_at).as_millis() as u64;
    let mut elected = None;
    let mut written: Option<(u64, u64)> = None;
    while elected.is_none() || written.is_none() {
        if faulted_at.elapsed() > deadline {
            let _ = injector.heal(fault, old, &old_addr);
            return Err(LaunchError::Timeout(format!(
                "after the fault on replica {old}: {} within {} s",
                if elected.is_none() {
                    "no new leader"
                } else {
                    "no write committed"
                },
                deadline.as_secs()
            )));
        }
        if elected.is_none()
            && let Some((id, _)) = rpc::leader(&others).await
            && id != old
        {
            elected = Some((id, ms(Instant::now())));
        }
        if written.is_none() {
            for addr in &others {
                let Ok(mut c) = rpc::jobs(addr) else { continue };
                let req = rpc::as_user(
                    "root",
                    pb::SubmitJobsRequest {
                        jobs: vec![probe_spec(&options.partition, &options.work_dir)],
                    },
                );
                if let Ok(r) = c.submit_jobs(req).await
                    && let Some(pb::submit_result::Result::JobId(id)) = r
                        .into_inner()
                        .results
                        .first()
                        .and_then(|x| x.result.clone())
                {
                    written = Some((id, ms(Instant::now())));
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (Some((new_leader, elected_ms)), Some((probe_job, first_write_ms))) = (elected, written)
    else {
        return Err(LaunchError::Rpc("the drill lost its measurements".into()));
    };
    let first_start_ms = first_start(&others, probe_job, faulted_at, deadline).await;
    let after: std::collections::BTreeSet<u64> = match rpc::leader(&others).await {
        Some((_, addr)) => rpc::all_jobs(&addr)
            .await?
            .iter()
            .map(|j| j.job_id)
            .collect(),
        None => Default::default(),
    };
    let lost_jobs = before.into_iter().filter(|j| !after.contains(j)).collect();
    let mut rejoined_ms = None;
    if options.heal {
        tokio::time::sleep(options.hold.saturating_sub(faulted_at.elapsed())).await;
        injector.heal(fault, old, &old_addr)?;
        rejoined_ms = rejoined(&others, old).await;
    }
    Ok(DrillReport {
        fault,
        killed: old,
        new_leader,
        elected_ms,
        first_write_ms,
        first_start_ms,
        probe_job,
        lost_jobs,
        rejoined_ms,
    })
}

/// Milliseconds from `faulted_at` to the probe job's start, as the survivors see it.
async fn first_start(
    others: &[String],
    probe_job: u64,
    faulted_at: Instant,
    deadline: Duration,
) -> Option<u64> {
    while faulted_at.elapsed() < deadline {
        for addr in others {
            if let Ok(mut c) = rpc::jobs(addr)
                && let Ok(j) = c
                    .get_job(rpc::as_user(
                        "root",
                        pb::GetJobRequest {
                            job_id: probe_job,
                            consistency: 0,
                        },
                    ))
                    .await
            {
                if j.into_inner().start_time_ms.is_some() {
                    return Some(faulted_at.elapsed().as_millis() as u64);
                }
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Milliseconds until replica `old` answers as a reachable follower in the status the
/// survivors give (`None` after 30 s).
async fn rejoined(others: &[String], old: u64) -> Option<u64> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let s = rpc::cluster_status(others).await;
        if s.is_some_and(|s| {
            s.replicas
                .iter()
                .any(|r| r.id == old && r.reachable && r.role == "follower")
        }) {
            return Some(start.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}
