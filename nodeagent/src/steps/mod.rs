//! Job steps on this node: the tasks `srun` starts inside a job's allocation.
//!
//! The leader tells the agent of each node of a step that the step exists and what its share
//! here is (a `StepGrant` on the instruction stream, with the SHA-256 of a secret only the
//! step's srun holds). srun then connects to the agent's step I/O service ([`serve`]) over
//! TLS, proves the step with the secret, and sends the command, its environment and working
//! directory. The agent starts the tasks as the job's user through the same shim as a batch
//! script (root's fixed environment, privileges dropped for good before anything of the
//! user's is touched), each in the step's cgroup below the job's, and streams their output
//! and exits back ([`tasks`]). A step's tasks die with it: cancelled, over its time limit, its
//! srun gone, or its job ended (the job's cgroup holds the step's).
//!
//! [`Grants`] is the registry between the two: grants arrive from the leader, at most one
//! srun attaches to each, and when the tasks here end (or no srun came) the node's end of
//! the step is reported to the leader, which ends the step once every node has.

pub mod serve;
mod signals;
mod streams;
pub mod tasks;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use docket_proto::v1 as pb;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc, watch};

/// What a job's run on this node gives its steps' tasks: who they run as, where, and the
/// environment that differs from node to node. Kept in the agent's state file (root's), so a
/// restarted agent starts new steps of the runs it re-adopts.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StepBase {
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub rlimit_as: Option<u64>,
    pub work_dir: PathBuf,
    /// Of the run's environment, the variables in [`NODE_VARIABLES`].
    pub node_env: Vec<(String, String)>,
    /// Root's private directory of the run (tasks' environments pass through it).
    pub run_dir: PathBuf,
}

/// Variables whose value is this node's own (its scratch, its GPUs, its name): a task gets
/// them from its node's run, whatever srun's environment says.
pub const NODE_VARIABLES: &[&str] = &[
    "TMPDIR",
    "PBS_JOBFS",
    "PBS_NODEFILE",
    "DOCKET_JOBFS",
    "SLURMD_NODENAME",
    "SLURM_CPUS_ON_NODE",
    "DOCKET_CPUS_ON_NODE",
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "SLURM_JOB_GPUS",
];

/// How long a granted step waits for its srun before it is ended as never launched.
pub const ATTACH_DEADLINE: Duration = Duration::from_secs(60);
/// Ended steps remembered (to refuse a late srun and ignore a repeated grant); the oldest
/// are forgotten beyond this, so a long job's 40,000 steps do not all stay in memory.
pub const MAX_ENDED: usize = 4096;

/// Why srun may not attach.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("step {0}.{1} has no tasks on this node (or the leader has not said so yet)")]
    NotGranted(u64, u32),
    #[error("step {0}.{1}: the secret is not the step's")]
    WrongSecret(u64, u32),
    #[error("step {0}.{1} already has its srun")]
    Taken(u64, u32),
    #[error("step {0}.{1} has ended")]
    Ended(u64, u32),
}

#[derive(Debug)]
enum Phase {
    Waiting,
    Attached,
    Ended,
}

#[derive(Debug)]
struct Entry {
    grant: pb::StepGrant,
    phase: Phase,
    /// Set when the step must stop (cancelled by the leader).
    stop: watch::Sender<Option<pb::EndCause>>,
}

/// The steps granted to this node, by (job, step).
#[derive(Debug)]
pub struct Grants {
    entries: Mutex<BTreeMap<(u64, u32), Entry>>,
    /// Ended steps in the order they ended (with the epoch they ended under), oldest first:
    /// beyond [`MAX_ENDED`] the oldest are forgotten.
    ended: Mutex<std::collections::VecDeque<((u64, u32), u64)>>,
    changed: Notify,
    events: mpsc::UnboundedSender<pb::JobEvent>,
}

/// What an attached srun gets: the grant, and the signal to stop.
#[derive(Debug)]
pub struct Attached {
    pub grant: pb::StepGrant,
    pub stop: watch::Receiver<Option<pb::EndCause>>,
}

impl Grants {
    pub fn new(events: mpsc::UnboundedSender<pb::JobEvent>) -> Arc<Self> {
        Arc::new(Grants {
            entries: Mutex::new(BTreeMap::new()),
            ended: Mutex::new(std::collections::VecDeque::new()),
            changed: Notify::new(),
            events,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u64, u32), Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The leader granted a step (again, after a reconnection: then nothing changes). A
    /// grant of a newer run of the job (requeued here under a new epoch) replaces what an
    /// older run left.
    pub fn grant(self: &Arc<Self>, grant: pb::StepGrant) {
        let key = (grant.job_id, grant.step_id);
        let epoch = grant.epoch;
        {
            let mut entries = self.lock();
            if let Some(old) = entries.get(&key) {
                if old.grant.epoch >= grant.epoch {
                    return;
                }
                old.stop.send_replace(Some(pb::EndCause::Cancelled));
            }
            entries.insert(
                key,
                Entry {
                    grant,
                    phase: Phase::Waiting,
                    stop: watch::channel(None).0,
                },
            );
        }
        self.changed.notify_waiters();
        // A step whose srun never comes must not hold its cpus until the job ends.
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ATTACH_DEADLINE).await;
            let waiting = this
                .lock()
                .get(&key)
                .is_some_and(|e| matches!(e.phase, Phase::Waiting) && e.grant.epoch == epoch);
            if waiting {
                this.end(
                    key,
                    epoch,
                    pb::Ended {
                        cause: pb::EndCause::LaunchFailed as i32,
                        reason: format!("no srun attached within {} s", ATTACH_DEADLINE.as_secs()),
                        ..Default::default()
                    },
                );
            }
        });
    }

    /// The leader cancelled a step: its tasks here are stopped (or, with no srun yet, it
    /// ends at once). A step this agent never heard of (its grant was lost with a restart)
    /// is reported ended, so the leader does not wait for it until the job ends.
    pub fn cancel(&self, job: u64, epoch: u64, step: u32) {
        let waiting = {
            let entries = self.lock();
            match entries.get(&(job, step)).filter(|e| e.grant.epoch == epoch) {
                Some(Entry {
                    phase: Phase::Waiting,
                    ..
                }) => true,
                Some(e) => {
                    e.stop.send_replace(Some(pb::EndCause::Cancelled));
                    false
                }
                None => {
                    self.report(
                        (job, step),
                        epoch,
                        pb::Ended {
                            cause: pb::EndCause::Cancelled as i32,
                            reason: "the step was never granted on this node".into(),
                            ..Default::default()
                        },
                    );
                    false
                }
            }
        };
        if waiting {
            self.end(
                (job, step),
                epoch,
                pb::Ended {
                    cause: pb::EndCause::Cancelled as i32,
                    ..Default::default()
                },
            );
        }
    }

    /// srun attaches to step (job, step) with `secret`, waiting up to `wait` for the leader's
    /// grant (srun may be faster than the instruction stream).
    pub async fn attach(
        &self,
        job: u64,
        step: u32,
        secret: &[u8],
        wait: Duration,
    ) -> Result<Attached, AttachError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before the look, so that a grant arriving in between wakes us.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let found = {
                let mut entries = self.lock();
                entries.get_mut(&(job, step)).map(|e| {
                    // The hash is compared whole, in constant time.
                    let hash = Sha256::digest(secret);
                    if !constant_time_eq(hash.as_slice(), &e.grant.io_key) {
                        return Err(AttachError::WrongSecret(job, step));
                    }
                    match e.phase {
                        Phase::Waiting => {
                            e.phase = Phase::Attached;
                            Ok(Attached {
                                grant: e.grant.clone(),
                                stop: e.stop.subscribe(),
                            })
                        }
                        Phase::Attached => Err(AttachError::Taken(job, step)),
                        Phase::Ended => Err(AttachError::Ended(job, step)),
                    }
                })
            };
            match found {
                Some(Err(AttachError::WrongSecret(..))) => {
                    // Refused when a missing grant would be: a stranger learns nothing of
                    // which steps run here, by the answer or by its time.
                    tokio::time::sleep_until(deadline).await;
                    return Err(AttachError::WrongSecret(job, step));
                }
                Some(outcome) => return outcome,
                None => {}
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(AttachError::NotGranted(job, step));
            }
        }
    }

    /// The step's tasks on this node ended (or never started) in the run of `epoch`: tell
    /// the leader, once. An end from an older run of the job changes nothing of a newer one.
    pub fn end(&self, key: (u64, u32), epoch: u64, ended: pb::Ended) {
        {
            let mut entries = self.lock();
            let Some(e) = entries.get_mut(&key).filter(|e| e.grant.epoch == epoch) else {
                return;
            };
            if matches!(e.phase, Phase::Ended) {
                return;
            }
            e.phase = Phase::Ended;
            let mut order = self.ended.lock().unwrap_or_else(|p| p.into_inner());
            order.push_back((key, epoch));
            while order.len() > MAX_ENDED {
                if let Some((old, old_epoch)) = order.pop_front()
                    && entries.get(&old).is_some_and(|e| {
                        e.grant.epoch == old_epoch && matches!(e.phase, Phase::Ended)
                    })
                {
                    entries.remove(&old);
                }
            }
        }
        self.report(key, epoch, ended);
    }

    /// Step `step` of the run (`job`, `epoch`) ended here without this agent knowing it
    /// (its tasks were left by an agent that restarted, and killed): tell the leader.
    pub fn report_lost(&self, job: u64, epoch: u64, step: u32, reason: &str) {
        self.report(
            (job, step),
            epoch,
            pb::Ended {
                cause: pb::EndCause::NodeFailure as i32,
                reason: reason.to_owned(),
                ..Default::default()
            },
        );
    }

    /// Tells the leader how step `key` of the run of `epoch` ended on this node.
    fn report(&self, key: (u64, u32), epoch: u64, ended: pb::Ended) {
        let _ = self.events.send(pb::JobEvent {
            job_id: key.0,
            epoch,
            event: Some(pb::job_event::Event::StepEnded(pb::StepEnded {
                step_id: key.1,
                ended: Some(ended),
            })),
        });
    }

    /// The job's run here ended: its steps go with it (their tasks died with its cgroup).
    pub fn forget_job(&self, job: u64, epoch: u64) {
        let mut entries = self.lock();
        for (_, e) in entries.range((job, 0)..=(job, u32::MAX)) {
            if e.grant.epoch <= epoch {
                e.stop.send_replace(Some(pb::EndCause::Cancelled));
            }
        }
        entries.retain(|(j, _), e| *j != job || e.grant.epoch > epoch);
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(job: u64, step: u32, secret: &[u8]) -> pb::StepGrant {
        pb::StepGrant {
            job_id: job,
            epoch: 1,
            step_id: step,
            tasks: 1,
            io_key: Sha256::digest(secret).to_vec(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn only_the_holder_of_the_secret_attaches_and_only_once() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let grants = Grants::new(tx);
        grants.grant(grant(7, 0, b"right"));
        let wait = Duration::from_millis(50);
        assert_eq!(
            grants.attach(7, 0, b"wrong", wait).await.err(),
            Some(AttachError::WrongSecret(7, 0))
        );
        assert_eq!(
            grants.attach(7, 1, b"right", wait).await.err(),
            Some(AttachError::NotGranted(7, 1))
        );
        assert!(grants.attach(7, 0, b"right", wait).await.is_ok());
        assert_eq!(
            grants.attach(7, 0, b"right", wait).await.err(),
            Some(AttachError::Taken(7, 0))
        );
    }

    #[tokio::test]
    async fn an_attach_waits_for_a_grant_that_is_on_its_way() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let grants = Grants::new(tx);
        let later = grants.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            later.grant(grant(3, 2, b"s"));
        });
        let attached = grants.attach(3, 2, b"s", Duration::from_secs(5)).await;
        assert_eq!(attached.map(|a| a.grant.step_id).ok(), Some(2));
    }

    #[tokio::test]
    async fn a_step_cancelled_before_its_srun_came_ends_once_as_cancelled() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let grants = Grants::new(tx);
        grants.grant(grant(5, 0, b"s"));
        grants.cancel(5, 1, 0);
        grants.cancel(5, 1, 0);
        let event = rx.try_recv().ok();
        let Some(pb::job_event::Event::StepEnded(ended)) = event.and_then(|e| e.event) else {
            panic!("no step end reported");
        };
        assert_eq!(
            ended.ended.map(|e| e.cause),
            Some(pb::EndCause::Cancelled as i32)
        );
        assert!(rx.try_recv().is_err(), "reported twice");
        assert_eq!(
            grants
                .attach(5, 0, b"s", Duration::from_millis(10))
                .await
                .err(),
            Some(AttachError::Ended(5, 0))
        );
    }

    #[tokio::test]
    async fn a_cancel_for_a_step_never_granted_here_is_reported_ended() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let grants = Grants::new(tx);
        grants.cancel(8, 3, 1);
        let event = rx.try_recv().expect("reported");
        assert_eq!((event.job_id, event.epoch), (8, 3));
        let Some(pb::job_event::Event::StepEnded(ended)) = event.event else {
            panic!("not a step end");
        };
        assert_eq!(ended.step_id, 1);
        assert_eq!(
            ended.ended.map(|e| e.cause),
            Some(pb::EndCause::Cancelled as i32)
        );
    }

    #[tokio::test]
    async fn a_newer_run_s_grant_replaces_an_older_one_and_ended_steps_are_bounded() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let grants = Grants::new(tx);
        grants.grant(grant(9, 0, b"old"));
        let mut newer = grant(9, 0, b"new");
        newer.epoch = 2;
        grants.grant(newer);
        let wait = Duration::from_millis(10);
        assert_eq!(
            grants.attach(9, 0, b"old", wait).await.err(),
            Some(AttachError::WrongSecret(9, 0))
        );
        assert!(grants.attach(9, 0, b"new", wait).await.is_ok());
        // A repeated (or older) grant changes nothing.
        grants.grant(grant(9, 0, b"old"));
        assert_eq!(
            grants.attach(9, 0, b"new", wait).await.err(),
            Some(AttachError::Taken(9, 0))
        );
        for step in 0..(MAX_ENDED as u32 + 10) {
            grants.grant(grant(10, step, b"s"));
            grants.end((10, step), 1, pb::Ended::default());
        }
        assert!(grants.lock().len() <= MAX_ENDED + 1);
    }
}
