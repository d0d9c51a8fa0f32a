//! Signals to a step's processes on this node, sent off the async workers.
//!
//! Through the step's cgroup when confined (freeze, signal every member, thaw; SIGKILL
//! through `cgroup.kill` or until the cgroup is empty), which can take a while and must not
//! hold up the tokio worker that also carries other steps' I/O. So one task per step sends
//! them in order on the blocking pool, from a short queue: a flood of signals from srun costs
//! at most the queue, never a thread each. A SIGTERM's grace ends with SIGKILLs resent every
//! second, so a signal dropped from a full queue is only ever one the step no longer needs.
//!
//! Unconfined (`--confinement none`), each task's process group is signalled, but only while
//! its leader has not been reaped: the kernel does not give a live group's id to a new
//! process, but once a reaped leader's group is empty its number is free, and root must never
//! signal a stranger's group by a recycled number.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use crate::cgroup::JobCgroup;

/// Signals waiting to be sent at most.
const QUEUE: usize = 8;

/// The processes of one step here.
#[derive(Debug)]
pub struct Target {
    cgroup: Option<JobCgroup>,
    /// Leaders (task pids, their own process groups) not yet reaped.
    unreaped: Mutex<BTreeSet<i32>>,
}

impl Target {
    pub fn new(cgroup: Option<JobCgroup>, pids: impl IntoIterator<Item = i32>) -> Arc<Target> {
        Arc::new(Target {
            cgroup,
            unreaped: Mutex::new(pids.into_iter().filter(|p| *p > 0).collect()),
        })
    }

    /// Task `pid` was reaped: its group is no longer signalled by number.
    pub fn reaped(&self, pid: i32) {
        if let Ok(mut set) = self.unreaped.lock() {
            set.remove(&pid);
        }
    }

    /// Sends `sig` now, blocking (call it from the blocking pool).
    pub fn send(&self, sig: Signal) {
        match &self.cgroup {
            Some(cg) => {
                if let Err(e) = cg.signal_all(sig, false) {
                    tracing::warn!(error = %e, ?sig, "signalling a step's cgroup");
                }
            }
            None => {
                let groups: Vec<i32> = self
                    .unreaped
                    .lock()
                    .map(|s| s.iter().copied().collect())
                    .unwrap_or_default();
                for pid in groups {
                    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), sig);
                }
            }
        }
    }

    /// Sends `sig` from async code, waiting for it to be done.
    pub async fn send_now(self: &Arc<Self>, sig: Signal) {
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || me.send(sig)).await;
    }
}

/// The sending end of a step's signal queue.
#[derive(Debug, Clone)]
pub struct Signaller {
    tx: mpsc::Sender<Signal>,
}

impl Signaller {
    /// Starts the task that sends `target`'s signals in order; it ends when every
    /// `Signaller` is dropped.
    pub fn start(target: Arc<Target>) -> Signaller {
        let (tx, mut rx) = mpsc::channel::<Signal>(QUEUE);
        tokio::spawn(async move {
            while let Some(sig) = rx.recv().await {
                target.send_now(sig).await;
            }
        });
        Signaller { tx }
    }

    /// Queues `sig`; dropped when the queue is full (see the module's note).
    pub fn signal(&self, sig: Signal) {
        if self.tx.try_send(sig).is_err() {
            tracing::debug!(?sig, "a step's signal queue is full; signal dropped");
        }
    }
}
