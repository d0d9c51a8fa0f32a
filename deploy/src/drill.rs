//! The failover drill: kill the leader with SIGKILL and measure, from the kill, how long the
//! cluster took to elect a new leader, to commit a write (a submission) and to make a
//! scheduling decision (that job started); then restart the killed replica on its data.

use std::time::{Duration, Instant};

use docket_proto::v1 as pb;

use crate::local::LocalCluster;
use crate::{LaunchError, rpc};

/// What the drill measured (milliseconds from the kill).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrillReport {
    pub killed: u64,
    pub new_leader: u64,
    pub elected_ms: u64,
    pub first_write_ms: u64,
    /// `None`: the probe job did not start within the deadline (no free cpus?).
    pub first_start_ms: Option<u64>,
    pub probe_job: u64,
    /// Jobs in the queue before the kill that are missing after it (must be none).
    pub lost_jobs: Vec<u64>,
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

/// Kills the leader and measures the recovery; restarts the killed replica if `restart`.
pub async fn kill_leader(
    cluster: &mut LocalCluster,
    partition: &str,
    restart: bool,
    deadline: Duration,
) -> Result<DrillReport, LaunchError> {
    let (old, old_addr) = rpc::leader(&cluster.addrs())
        .await
        .ok_or_else(|| LaunchError::Rpc("no leader to kill".into()))?;
    let before: Vec<u64> = rpc::all_jobs(&old_addr)
        .await?
        .iter()
        .map(|j| j.job_id)
        .collect();
    let others = cluster.addrs_except(old);
    let work = cluster.record.state_dir.display().to_string();
    let killed_at = Instant::now();
    cluster.kill_replica(old)?;
    let ms = |at: Instant| at.duration_since(killed_at).as_millis() as u64;
    let mut elected = None;
    let mut written: Option<(u64, u64)> = None;
    while elected.is_none() || written.is_none() {
        if killed_at.elapsed() > deadline {
            return Err(LaunchError::Timeout(format!(
                "after killing replica {old}: {} within {} s",
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
                        jobs: vec![probe_spec(partition, &work)],
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
    let mut first_start_ms = None;
    while killed_at.elapsed() < deadline {
        let mut found = None;
        for addr in &others {
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
                found = Some(j.into_inner());
                break;
            }
        }
        if let Some(j) = found
            && j.start_time_ms.is_some()
        {
            first_start_ms = Some(ms(Instant::now()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after: std::collections::BTreeSet<u64> = match rpc::leader(&others).await {
        Some((_, addr)) => rpc::all_jobs(&addr)
            .await?
            .iter()
            .map(|j| j.job_id)
            .collect(),
        None => Default::default(),
    };
    let lost_jobs = before.into_iter().filter(|j| !after.contains(j)).collect();
    if restart {
        cluster.start_replica(old, false)?;
    }
    Ok(DrillReport {
        killed: old,
        new_leader,
        elected_ms,
        first_write_ms,
        first_start_ms,
        probe_job,
        lost_jobs,
    })
}
