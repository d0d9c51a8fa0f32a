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
/// id), `{addr}` (its `host:port`) and `{host}` are replaced. The replica is taken from the
/// cluster's status, which a replica writes: it must be one of the operator's own addresses
/// (`allowed`) and a plain host and port before it goes into a command line.
#[derive(Debug, Clone)]
pub struct Commands {
    pub inject: String,
    pub heal: String,
    /// The addresses the operator named; a command runs only against one of them.
    pub allowed: Vec<String>,
}

/// Whether `addr` is `host:port` with a DNS name, an IPv4 address or a bracketed IPv6
/// address: nothing a shell or a command's option parser would read as more than a word.
fn plain_addr(addr: &str) -> bool {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return false;
    };
    let port_ok = !port.is_empty() && port.len() <= 5 && port.chars().all(|c| c.is_ascii_digit());
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host.split('.').all(|label| {
                    !label.is_empty()
                        && !label.starts_with('-')
                        && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                })
        }
    };
    port_ok && host_ok
}

impl Commands {
    /// How long one command may run.
    const TIMEOUT: Duration = Duration::from_secs(60);

    fn run(&self, template: &str, replica: u64, addr: &str) -> Result<(), LaunchError> {
        if !self.allowed.iter().any(|a| a == addr) {
            return Err(LaunchError::Invalid(format!(
                "replica {replica} is at {addr:?} by the cluster's status, not one of the \
                 addresses given ({}); not running a command against it",
                self.allowed.join(",")
            )));
        }
        if !plain_addr(addr) {
            return Err(LaunchError::Invalid(format!(
                "replica {replica}'s address {addr:?} is not a plain host:port; \
                 not putting it in a shell command"
            )));
        }
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let line = template
            .replace("{id}", &replica.to_string())
            .replace("{addr}", addr)
            .replace("{host}", host.trim_matches(['[', ']']));
        run_bounded(&line, Self::TIMEOUT)
    }
}

/// Runs `line` with `sh -c` in a process group of its own, killing the whole group (an
/// `ssh` under the shell too) if it runs past `timeout`.
fn run_bounded(line: &str, timeout: Duration) -> Result<(), LaunchError> {
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new("sh")
        .args(["-c", line])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(LaunchError::io(format!("running {line:?}")))?;
    // Drained as it comes, so a talkative command never blocks on a full pipe.
    let stderr = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut e, &mut text);
            text
        })
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(LaunchError::io(format!("waiting for {line:?}")))?
        {
            break status;
        }
        if started.elapsed() > timeout {
            let group = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            return Err(LaunchError::Timeout(format!(
                "{line:?} still running after {} s; killed",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
    if !status.success() {
        return Err(LaunchError::Invalid(format!(
            "{line:?} failed ({status}): {}",
            stderr.trim()
        )));
    }
    Ok(())
}

impl FaultInjector for Commands {
    fn inject(&mut self, _fault: Fault, replica: u64, addr: &str) -> Result<(), LaunchError> {
        self.run(&self.inject, replica, addr)
    }

    fn heal(&mut self, _fault: Fault, replica: u64, addr: &str) -> Result<(), LaunchError> {
        self.run(&self.heal, replica, addr)
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

/// How long any one call to a replica may take: a replica that stops answering mid-call
/// (paused, partitioned, hostile) costs the drill this, never its deadline.
const CALL: Duration = Duration::from_secs(2);

/// `call`, or `None` after [`CALL`].
async fn bounded<T>(call: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout(CALL, call).await.ok()
}

/// The replicas the leader's status names, as (id, address); `addrs` are where to ask.
async fn members(addrs: &[String]) -> Result<(u64, String, Vec<(u64, String)>), LaunchError> {
    let status = bounded(rpc::cluster_status(addrs))
        .await
        .flatten()
        .ok_or_else(|| LaunchError::Rpc(format!("no replica of {addrs:?} answers")))?;
    let members: Vec<(u64, String)> = status
        .replicas
        .iter()
        .map(|r| (r.id, r.addr.clone()))
        .collect();
    let (leader, leader_addr) = bounded(rpc::leader(addrs))
        .await
        .flatten()
        .ok_or_else(|| LaunchError::Rpc("no leader to take out".into()))?;
    Ok((leader, leader_addr, members))
}

/// How long a drill waits for a leader that lists its jobs before its fault.
const SETTLE: Duration = Duration::from_secs(10);

/// The leader (id, address), the members, and the jobs the leader has not finished: what a
/// drill starts from. Asked again for up to [`SETTLE`]: right after a fault is healed (an
/// earlier drill's), leadership may still move (a resumed leader steps down once it hears
/// the newer term), and a replica that has just stopped leading fails the listing.
async fn before_fault(
    addrs: &[String],
) -> Result<
    (
        u64,
        String,
        Vec<(u64, String)>,
        std::collections::BTreeSet<u64>,
    ),
    LaunchError,
> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let failed = match members(addrs).await {
            Ok((old, old_addr, members)) => match unfinished(&old_addr).await {
                Some(before) => return Ok((old, old_addr, members, before)),
                None => LaunchError::Rpc(format!("the leader {old_addr} did not list its jobs")),
            },
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(failed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The jobs not yet finished in the queue the replica at `addr` serves (a finished job may
/// leave the queue for the archive during the drill; it is not lost).
async fn unfinished(addr: &str) -> Option<std::collections::BTreeSet<u64>> {
    let jobs = bounded(rpc::all_jobs(addr)).await?.ok()?;
    Some(
        jobs.iter()
            .filter(|j| !rpc::is_final(j))
            .map(|j| j.job_id)
            .collect(),
    )
}

/// A survivor that says it leads (each asked only for its own view, which costs it no calls
/// to the others).
async fn new_leader(others: &[String], old: u64) -> Option<u64> {
    for addr in others {
        let Ok(mut c) = rpc::admin(addr) else {
            continue;
        };
        let request = rpc::as_user("root", pb::ClusterStatusRequest { leader_only: true });
        if let Some(Ok(r)) = bounded(c.cluster_status(request)).await {
            let r = r.into_inner();
            if r.leader_id == Some(r.answered_by) && r.answered_by != old {
                return Some(r.answered_by);
            }
        }
    }
    None
}

/// Submits the probe job through any survivor; its id.
async fn probe(others: &[String], options: &DrillOptions) -> Option<u64> {
    for addr in others {
        let Ok(mut c) = rpc::jobs(addr) else { continue };
        let req = rpc::as_user(
            "root",
            pb::SubmitJobsRequest {
                jobs: vec![probe_spec(&options.partition, &options.work_dir)],
            },
        );
        if let Some(Ok(r)) = bounded(c.submit_jobs(req)).await
            && let Some(pb::submit_result::Result::JobId(id)) = r
                .into_inner()
                .results
                .first()
                .and_then(|x| x.result.clone())
        {
            return Some(id);
        }
    }
    None
}

/// Takes the leader out with `fault`, measures the recovery, and heals it (also when a
/// measurement fails: a drill never leaves the leader broken).
pub async fn run(
    injector: &mut dyn FaultInjector,
    fault: Fault,
    addrs: &[String],
    options: &DrillOptions,
) -> Result<DrillReport, LaunchError> {
    let (old, old_addr, members, before) = before_fault(addrs).await?;
    let others: Vec<String> = members
        .iter()
        .filter(|(id, _)| *id != old)
        .map(|(_, a)| a.clone())
        .collect();
    let faulted_at = Instant::now();
    if let Err(e) = injector.inject(fault, old, &old_addr) {
        // A command that failed or timed out may have done its work all the same.
        let _ = injector.heal(fault, old, &old_addr);
        return Err(e);
    }
    let measured = measure(fault, old, &others, before, faulted_at, options).await;
    if !options.heal {
        return measured;
    }
    tokio::time::sleep(options.hold.saturating_sub(faulted_at.elapsed())).await;
    let healed = injector.heal(fault, old, &old_addr);
    match (measured, healed) {
        (Ok(mut report), Ok(())) => {
            report.rejoined_ms = rejoined(&others, old).await;
            Ok(report)
        }
        (Ok(report), Err(e)) => Err(LaunchError::Invalid(format!(
            "{report}\nhealing replica {old} failed: {e}"
        ))),
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(heal)) => Err(LaunchError::Invalid(format!(
            "{e}; then healing replica {old} failed too: {heal}"
        ))),
    }
}

/// The measurements while the fault holds.
async fn measure(
    fault: Fault,
    old: u64,
    others: &[String],
    before: std::collections::BTreeSet<u64>,
    faulted_at: Instant,
    options: &DrillOptions,
) -> Result<DrillReport, LaunchError> {
    let deadline = options.deadline;
    let ms = |at: Instant| at.duration_since(faulted_at).as_millis() as u64;
    let mut elected = None;
    let mut written: Option<(u64, u64)> = None;
    while elected.is_none() || written.is_none() {
        if faulted_at.elapsed() > deadline {
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
            && let Some(id) = new_leader(others, old).await
        {
            elected = Some((id, ms(Instant::now())));
        }
        if written.is_none()
            && let Some(id) = probe(others, options).await
        {
            written = Some((id, ms(Instant::now())));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (Some((new_leader, elected_ms)), Some((probe_job, first_write_ms))) = (elected, written)
    else {
        return Err(LaunchError::Rpc("the drill lost its measurements".into()));
    };
    let first_start_ms = first_start(others, probe_job, faulted_at, deadline).await;
    // Every job unfinished before the fault is still known (in the queue, or finished and
    // answered for by accounting), as the new leader sees it.
    let mut lost_jobs = Vec::new();
    while faulted_at.elapsed() < deadline {
        let Some((_, addr)) = bounded(rpc::leader(others)).await.flatten() else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Some(jobs) = bounded(rpc::all_jobs(&addr)).await.and_then(Result::ok) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let known: std::collections::BTreeSet<u64> = jobs.iter().map(|j| j.job_id).collect();
        for id in before.iter().filter(|id| !known.contains(id)) {
            if !archived(&addr, *id).await {
                lost_jobs.push(*id);
            }
        }
        break;
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
        rejoined_ms: None,
    })
}

/// Whether the replica at `addr` answers for job `id` from accounting.
async fn archived(addr: &str, id: u64) -> bool {
    let Ok(mut c) = rpc::jobs(addr) else {
        return false;
    };
    let request = rpc::as_user(
        "root",
        pb::AccountingRequest {
            job_ids: vec![id],
            ..Default::default()
        },
    );
    matches!(bounded(c.accounting(request)).await, Some(Ok(r)) if !r.get_ref().records.is_empty())
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
            let Ok(mut c) = rpc::jobs(addr) else { continue };
            let request = rpc::as_user(
                "root",
                pb::GetJobRequest {
                    job_id: probe_job,
                    consistency: 0,
                },
            );
            if let Some(Ok(j)) = bounded(c.get_job(request)).await {
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
        let s = bounded(rpc::cluster_status(others)).await.flatten();
        if s.is_some_and(|s| {
            s.replicas
                .iter()
                .any(|r| r.id == old && r.reachable && r.role_typed() == pb::ReplicaRole::Follower)
        }) {
            return Some(start.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_get_the_replica_named_and_refuse_addresses_a_shell_would_read() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let template = format!("echo {{id}} {{addr}} {{host}} > {}", out.display());
        let hostile = [
            "h;rm -rf /:1",
            "$(reboot):1",
            "h`id`:1",
            "h 1:1",
            "",
            "-Jevil:22",
            "[*]:1",
        ];
        let mut allowed: Vec<String> = ["ctl2.example:6817", "[::1]:6817", "h:1"]
            .map(String::from)
            .to_vec();
        allowed.extend(hostile.iter().map(|h| h.to_string()));
        let c = Commands {
            inject: template.clone(),
            heal: "exit 4".into(),
            allowed,
        };
        c.run(&template, 2, "ctl2.example:6817").unwrap();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "2 ctl2.example:6817 ctl2.example\n"
        );
        c.run(&template, 3, "[::1]:6817").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "3 [::1]:6817 ::1\n");
        for h in hostile {
            let e = c.run("true", 1, h).unwrap_err();
            assert!(e.to_string().contains("not a plain host:port"), "{h}: {e}");
        }
        let e = c.run("true", 1, "elsewhere:6817").unwrap_err();
        assert!(
            e.to_string().contains("not one of the addresses given"),
            "{e}"
        );
        let e = c.run("exit 4", 1, "h:1").unwrap_err();
        assert!(e.to_string().contains("exit 4"), "{e}");
        // A command past its time is killed with everything it started.
        let started = Instant::now();
        let e = run_bounded("sleep 30 & sleep 30", Duration::from_millis(300)).unwrap_err();
        assert!(e.to_string().contains("killed"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
