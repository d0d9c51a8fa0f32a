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

use crate::history::{History, Op, OpKind, Outcome, Try};

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

/// A status as a try records it: its code and message.
fn describe(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
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

/// A client of the jobs service, at one replica.
type JobsClient = pb::jobs_client::JobsClient<tonic::transport::Channel>;

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
    let turn = rng.random_range(0..addrs.len());
    let mut client = Client {
        id,
        w,
        history,
        stop,
        rng,
        mine: Vec::new(),
        seq: 0,
        replicas: Replicas::new(addrs, turn),
    };
    while !client.stop.load(Ordering::Relaxed) {
        client.step().await;
    }
}

/// The replicas a client talks to, in turn.
struct Replicas {
    addrs: Vec<String>,
    /// The replica asked last.
    turn: usize,
    /// A replica that timed out or that no connection could be made to (stopped, cut off,
    /// dead) is avoided for a while, as the commands ask it last.
    silent_until: Vec<Option<std::time::Instant>>,
}

impl Replicas {
    /// The replicas at `addrs`, starting after the one at `turn`.
    fn new(addrs: Vec<String>, turn: usize) -> Replicas {
        let silent_until = vec![None; addrs.len()];
        Replicas {
            addrs,
            turn,
            silent_until,
        }
    }

    /// Moves to the next replica not recently silent (all silent: the next one anyway) and
    /// returns its index.
    fn next(&mut self) -> usize {
        let now = std::time::Instant::now();
        let n = self.addrs.len();
        self.turn = (1..=n)
            .map(|k| (self.turn + k) % n)
            .find(|i| self.silent_until[*i].is_none_or(|t| t <= now))
            .unwrap_or((self.turn + 1) % n);
        self.turn
    }

    /// Avoids replica `i` for the next 5 s.
    fn silence(&mut self, i: usize) {
        self.silent_until[i] = Some(std::time::Instant::now() + Duration::from_secs(5));
    }
}

/// One client's state: its seeded choices, the jobs it submitted, the replicas it asks.
struct Client {
    id: u32,
    w: Workload,
    history: History,
    stop: Arc<AtomicBool>,
    rng: ChaCha8Rng,
    /// The jobs this client submitted and saw acknowledged: (name, id).
    mine: Vec<(String, u64)>,
    /// The last submission's number, for unique names.
    seq: u64,
    replicas: Replicas,
}

impl Client {
    /// One operation, recorded in the history, and the pause after it.
    async fn step(&mut self) {
        let (kind, name, job) = self.choose();
        let start_ms = self.history.now_ms();
        let (outcome, job_id, tries) = self.until_answered(kind, &name, job, start_ms).await;
        if kind == OpKind::Submit
            && outcome == Outcome::Acked
            && let Some(j) = job_id
        {
            self.mine.push((name.clone(), j));
        }
        self.history.op(Op {
            client: self.id,
            kind,
            job_name: name,
            job_id,
            outcome,
            start_ms,
            end_ms: self.history.now_ms(),
            tries,
        });
        let (least, most) = self.w.think_ms;
        tokio::time::sleep(Duration::from_millis(
            self.rng.random_range(least..=most.max(least)),
        ))
        .await;
    }

    /// The next operation, as the seed rolls: mostly a submission under a new name, else a
    /// cancel, hold, release, suspend or resume of a job this client submitted.
    fn choose(&mut self) -> (OpKind, String, Option<u64>) {
        let roll: u32 = self.rng.random_range(0..100);
        let target = (!self.mine.is_empty())
            .then(|| self.mine[self.rng.random_range(0..self.mine.len())].clone());
        match (roll, target) {
            (0..70, _) | (_, None) => {
                self.seq += 1;
                (OpKind::Submit, format!("c{}-{}", self.id, self.seq), None)
            }
            (70..80, Some((n, j))) => (OpKind::Cancel, n, Some(j)),
            (80..86, Some((n, j))) => (OpKind::Hold, n, Some(j)),
            (86..92, Some((n, j))) => (OpKind::Release, n, Some(j)),
            (92..96, Some((n, j))) => (OpKind::Suspend, n, Some(j)),
            (_, Some((n, j))) => (OpKind::Resume, n, Some(j)),
        }
    }

    /// Asks the replicas in turn until a definite answer, or 20 s of UNAVAILABLE since
    /// `start_ms`, or `stop`; the outcome, the job's id and each replica asked.
    async fn until_answered(
        &mut self,
        kind: OpKind,
        name: &str,
        job: Option<u64>,
        start_ms: u64,
    ) -> (Outcome, Option<u64>, Vec<Try>) {
        let mut outcome = Outcome::NotApplied;
        let mut job_id = job;
        let mut tries = Vec::new();
        // Until a definite answer, or 20 s of UNAVAILABLE.
        while start_ms + 20_000 > self.history.now_ms() && !self.stop.load(Ordering::Relaxed) {
            // The next replica not recently silent (all silent: the next one anyway).
            let turn = self.replicas.next();
            let try_start_ms = self.history.now_ms();
            let tried = |answer: String, history: &History| Try {
                replica: turn as u32 + 1,
                start_ms: try_start_ms,
                end_ms: history.now_ms(),
                answer,
            };
            // Connected first, as the commands send a write only over a connection made:
            // a replica no connection can be made to (stopped, cut off, dead) certainly was
            // not sent the operation, which goes to the next one; this one is avoided for a
            // while, as the commands ask it last.
            let mut c = match rpc::jobs_connected(&self.replicas.addrs[turn]).await {
                Ok(c) => c,
                Err(docket_deploy::LaunchError::Rpc(_)) => {
                    tries.push(tried("connect failed".into(), &self.history));
                    self.replicas.silence(turn);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(_) => break,
            };
            let answer;
            (outcome, answer) = match kind {
                OpKind::Submit => self.submit(&mut c, name, &mut job_id).await,
                _ => act(&mut c, kind, job).await,
            };
            tries.push(tried(answer, &self.history));
            if matches!(&outcome, Outcome::Unknown(why) if why.starts_with("DeadlineExceeded")) {
                self.replicas.silence(turn);
            }
            if outcome != Outcome::NotApplied {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (outcome, job_id, tries)
    }

    /// Submits job `name` (a script of a seeded length) through `c`; sets `job_id` when
    /// acknowledged. The outcome and what the replica answered.
    async fn submit(
        &mut self,
        c: &mut JobsClient,
        name: &str,
        job_id: &mut Option<u64>,
    ) -> (Outcome, String) {
        let spec = pb::JobSpec {
            name: name.to_owned(),
            partition: self.w.partition.clone(),
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 1,
            time_limit_seconds: Some(120),
            script: script(self.rng.random_range(1..=self.w.max_job_seconds)),
            work_dir: self.w.work_dir.clone(),
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
                    *job_id = Some(j);
                    (Outcome::Acked, "acked".into())
                }
                Some(pb::submit_result::Result::Error(e)) => (Outcome::Refused(e.clone()), e),
                None => (Outcome::Unknown("no result".into()), "no result".into()),
            },
            Err(s) => (classify(&s), describe(&s)),
        }
    }
}

/// Cancels, holds, releases, suspends or resumes (as `kind` says) job `job` through `c`;
/// the outcome and what the replica answered.
async fn act(c: &mut JobsClient, kind: OpKind, job: Option<u64>) -> (Outcome, String) {
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
            Some(x) if x.error.is_empty() => (Outcome::Acked, "acked".into()),
            Some(x) => (Outcome::Refused(x.error.clone()), x.error.clone()),
            None => (Outcome::Unknown("no result".into()), "no result".into()),
        },
        Err(s) => (classify(&s), describe(&s)),
    }
}
