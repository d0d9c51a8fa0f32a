//! Many concurrent clients: each submits short jobs under unique names, and now and then
//! cancels, holds and releases, suspends and resumes jobs it submitted, recording every
//! attempt and its outcome in the history.
//!
//! A submission is never retried once it may have been applied (ABORTED or a broken
//! connection): a retry would carry a new name, so a job appearing twice under one name can
//! only be the system's doing. UNAVAILABLE (certainly not applied) is retried on the next
//! replica, as the command line does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use docket_deploy::rpc;
use docket_proto::v1 as pb;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::history::{History, Op, OpKind, Outcome};

/// What the clients do.
#[derive(Debug, Clone)]
pub struct Workload {
    pub partition: String,
    /// Where jobs append their start and end lines (`runs.log`).
    pub work_dir: String,
    /// Jobs run 1..=max seconds.
    pub max_job_seconds: u32,
    /// A client's pause between two operations, ms (uniform in this range).
    pub think_ms: (u64, u64),
}

/// The script every job runs: `ID NAME start MS NODE` and `ID NAME end MS NODE` around a
/// sleep (the node's own clock, which no fault moves).
pub fn script(seconds: u32) -> Vec<u8> {
    format!(
        "#!/bin/sh\necho \"$SLURM_JOB_ID $SLURM_JOB_NAME start $(date +%s%3N) $SLURMD_NODENAME\" >> runs.log\nsleep {seconds}\necho \"$SLURM_JOB_ID $SLURM_JOB_NAME end $(date +%s%3N) $SLURMD_NODENAME\" >> runs.log\n"
    )
    .into_bytes()
}

fn classify(status: &tonic::Status) -> Outcome {
    match status.code() {
        tonic::Code::Unavailable => Outcome::NotApplied,
        tonic::Code::InvalidArgument
        | tonic::Code::PermissionDenied
        | tonic::Code::NotFound
        | tonic::Code::FailedPrecondition
        | tonic::Code::ResourceExhausted => Outcome::Refused(status.message().to_owned()),
        _ => Outcome::Unknown(format!("{:?}: {}", status.code(), status.message())),
    }
}

/// How long one attempt may take. A replica stopped with SIGSTOP accepts connections and
/// never answers; a client must give up on it and try another (the request may have been
/// applied: an unknown outcome).
const ATTEMPT: Duration = Duration::from_secs(2);

async fn within<T>(
    call: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, tonic::Status> {
    match tokio::time::timeout(ATTEMPT, call).await {
        Ok(r) => r,
        Err(_) => Err(tonic::Status::deadline_exceeded("no answer within 2 s")),
    }
}

/// After the run: releases every held job and resumes every suspended one, undoing the
/// clients' holds and suspensions so that every job can finish.
pub async fn settle(leader: &str) {
    let Ok(jobs) = rpc::all_jobs(leader).await else {
        return;
    };
    let refs = |pick: &dyn Fn(&pb::JobInfo) -> bool| -> Vec<pb::JobRef> {
        jobs.iter()
            .filter(|j| pick(j))
            .map(|j| pb::JobRef {
                job_id: j.job_id,
                task: j.array_task,
            })
            .collect()
    };
    let held = refs(&|j| j.held && j.state_code == "PD");
    let suspended = refs(&|j| j.state_code == "S");
    if let Ok(mut c) = rpc::jobs(leader) {
        if !held.is_empty() {
            let _ = c
                .release_jobs(rpc::as_user("root", pb::JobsRequest { jobs: held }))
                .await;
        }
        if !suspended.is_empty() {
            let _ = c
                .resume_jobs(rpc::as_user("root", pb::JobsRequest { jobs: suspended }))
                .await;
        }
    }
}

/// One client until `stop`.
pub async fn client(
    id: u32,
    seed: u64,
    w: Workload,
    addrs: Vec<String>,
    history: History,
    stop: Arc<AtomicBool>,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (u64::from(id) << 32));
    let mut mine: Vec<(String, u64)> = Vec::new();
    let mut seq = 0u64;
    let mut turn = rng.random_range(0..addrs.len());
    // A replica that timed out (stopped, or cut off) is avoided for a while, as a smart
    // client would.
    let mut silent_until: Vec<Option<std::time::Instant>> = vec![None; addrs.len()];
    while !stop.load(Ordering::Relaxed) {
        let roll: u32 = rng.random_range(0..100);
        let target = (!mine.is_empty()).then(|| mine[rng.random_range(0..mine.len())].clone());
        let (kind, name, job) = match (roll, target) {
            (0..70, _) | (_, None) => {
                seq += 1;
                (OpKind::Submit, format!("c{id}-{seq}"), None)
            }
            (70..80, Some((n, j))) => (OpKind::Cancel, n, Some(j)),
            (80..86, Some((n, j))) => (OpKind::Hold, n, Some(j)),
            (86..92, Some((n, j))) => (OpKind::Release, n, Some(j)),
            (92..96, Some((n, j))) => (OpKind::Suspend, n, Some(j)),
            (_, Some((n, j))) => (OpKind::Resume, n, Some(j)),
        };
        let start_ms = history.now_ms();
        let mut outcome = Outcome::NotApplied;
        let mut job_id = job;
        // Until a definite answer, or 20 s of UNAVAILABLE.
        while start_ms + 20_000 > history.now_ms() && !stop.load(Ordering::Relaxed) {
            // The next replica not recently silent (all silent: the next one anyway).
            let now = std::time::Instant::now();
            turn = (1..=addrs.len())
                .map(|k| (turn + k) % addrs.len())
                .find(|i| silent_until[*i].is_none_or(|t| t <= now))
                .unwrap_or((turn + 1) % addrs.len());
            let Ok(mut c) = rpc::jobs(&addrs[turn]) else {
                break;
            };
            outcome = match kind {
                OpKind::Submit => {
                    let spec = pb::JobSpec {
                        name: name.clone(),
                        partition: w.partition.clone(),
                        nodes: 1,
                        ntasks: 1,
                        cpus_per_task: 1,
                        time_limit_seconds: Some(120),
                        script: script(rng.random_range(1..=w.max_job_seconds)),
                        work_dir: w.work_dir.clone(),
                        stdout: "/dev/null".into(),
                        stderr: "/dev/null".into(),
                        requeue: true,
                        ..Default::default()
                    };
                    let req = rpc::as_user("root", pb::SubmitJobsRequest { jobs: vec![spec] });
                    match within(c.submit_jobs(req)).await {
                        Ok(r) => match r
                            .into_inner()
                            .results
                            .first()
                            .and_then(|x| x.result.clone())
                        {
                            Some(pb::submit_result::Result::JobId(j)) => {
                                job_id = Some(j);
                                Outcome::Acked
                            }
                            Some(pb::submit_result::Result::Error(e)) => Outcome::Refused(e),
                            None => Outcome::Unknown("no result".into()),
                        },
                        Err(s) => classify(&s),
                    }
                }
                _ => {
                    let refs = vec![pb::JobRef {
                        job_id: job.unwrap_or(0),
                        task: None,
                    }];
                    let req = rpc::as_user("root", pb::JobsRequest { jobs: refs });
                    let r = match kind {
                        OpKind::Cancel => within(c.cancel_jobs(req)).await,
                        OpKind::Hold => within(c.hold_jobs(req)).await,
                        OpKind::Release => within(c.release_jobs(req)).await,
                        OpKind::Suspend => within(c.suspend_jobs(req)).await,
                        _ => within(c.resume_jobs(req)).await,
                    };
                    match r {
                        Ok(r) => match r.into_inner().results.first() {
                            Some(x) if x.error.is_empty() => Outcome::Acked,
                            Some(x) => Outcome::Refused(x.error.clone()),
                            None => Outcome::Unknown("no result".into()),
                        },
                        Err(s) => classify(&s),
                    }
                }
            };
            if matches!(&outcome, Outcome::Unknown(why) if why.starts_with("DeadlineExceeded")) {
                silent_until[turn] = Some(std::time::Instant::now() + Duration::from_secs(5));
            }
            if outcome != Outcome::NotApplied {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if kind == OpKind::Submit
            && outcome == Outcome::Acked
            && let Some(j) = job_id
        {
            mine.push((name.clone(), j));
        }
        history.op(Op {
            client: id,
            kind,
            job_name: name,
            job_id,
            outcome,
            start_ms,
            end_ms: history.now_ms(),
        });
        let (least, most) = w.think_ms;
        tokio::time::sleep(Duration::from_millis(
            rng.random_range(least..=most.max(least)),
        ))
        .await;
    }
}
