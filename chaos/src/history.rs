//! What happened during a run, as the harness saw it: every operation a client attempted
//! with its outcome and timing, every fault injected, every leader observed per term.
//!
//! Outcomes follow the controller's contract: acknowledged (applied), refused (not applied,
//! with a reason), not applied (UNAVAILABLE), or unknown (ABORTED or a lost connection: it
//! may or may not have been applied). The checkers treat an unknown submission as allowed
//! to exist, never as required to.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use std::time::Instant;

/// What a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum OpKind {
    Submit,
    Cancel,
    Hold,
    Release,
    Suspend,
    Resume,
}

/// What the cluster answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Outcome {
    Acked,
    Refused(String),
    NotApplied,
    Unknown(String),
}

/// One operation.
#[derive(Debug, Clone, Serialize)]
pub struct Op {
    pub client: u32,
    pub kind: OpKind,
    /// The job's unique name (submissions) or the job acted on.
    pub job_name: String,
    pub job_id: Option<u64>,
    pub outcome: Outcome,
    /// Milliseconds since the run began.
    pub start_ms: u64,
    pub end_ms: u64,
    /// Each replica asked, in order, until the outcome: where a slow operation waited.
    pub tries: Vec<Try>,
}

/// One replica asked for one operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Try {
    /// The replica's id (1-based, as the daemons are named).
    pub replica: u32,
    /// Milliseconds since the run began.
    pub start_ms: u64,
    pub end_ms: u64,
    /// What it answered: `connect failed`, `acked`, or the status or refusal.
    pub answer: String,
}

/// A fault the harness injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum FaultKind {
    KillLeader,
    KillFollower,
    PauseLeader,
    KillAgent,
    /// The leader cut off from the other replicas (clients and agents still reach it).
    PartitionLeader,
    /// A follower cut off from the other replicas.
    PartitionFollower,
    /// The leader cut off from the agents and clients (the replicas still reach it).
    PartitionLeaderFromAgents,
    /// A follower cut off from the agents and clients (they must not depend on it).
    PartitionFollowerFromAgents,
    /// An agent killed exactly as it launches a job: after recording the launch, or after
    /// starting the job's monitor but before recording it.
    AgentCrashAtLaunch,
    /// An agent killed exactly as a job ends: after the job exited but before the agent
    /// recorded it, or after recording but before reporting it.
    AgentCrashAtExit,
    /// The leader's data disk filled until writes fail; then freed and the replica
    /// restarted (what an operator does).
    DiskFullLeader,
    /// One replica's wall clock jumps (forwards or backwards), then returns.
    ClockJump,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill -9 leader",
            FaultKind::KillFollower => "kill -9 follower",
            FaultKind::PauseLeader => "SIGSTOP leader",
            FaultKind::KillAgent => "kill -9 agent",
            FaultKind::PartitionLeader => "partition leader",
            FaultKind::PartitionFollower => "partition follower",
            FaultKind::PartitionLeaderFromAgents => "partition leader from agents",
            FaultKind::PartitionFollowerFromAgents => "partition follower from agents",
            FaultKind::AgentCrashAtLaunch => "agent crash at launch",
            FaultKind::AgentCrashAtExit => "agent crash at exit",
            FaultKind::DiskFullLeader => "disk full on leader",
            FaultKind::ClockJump => "clock jump",
        }
    }

    /// Faults after which the cluster must elect a new leader.
    pub fn removes_leader(self) -> bool {
        matches!(
            self,
            FaultKind::KillLeader
                | FaultKind::PauseLeader
                | FaultKind::PartitionLeader
                | FaultKind::DiskFullLeader
        )
    }

    /// Faults that need the replicas' data on disks of their own.
    pub fn needs_own_disk(self) -> bool {
        self == FaultKind::DiskFullLeader
    }

    /// Faults that need the replicas under libfaketime.
    pub fn needs_fake_clock(self) -> bool {
        self == FaultKind::ClockJump
    }

    /// Faults that need the replicas in network namespaces.
    pub fn needs_netns(self) -> bool {
        matches!(
            self,
            FaultKind::PartitionLeader
                | FaultKind::PartitionFollower
                | FaultKind::PartitionLeaderFromAgents
                | FaultKind::PartitionFollowerFromAgents
        )
    }
}

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub kind: FaultKind,
    pub target: String,
    pub at_ms: u64,
    /// Wall clock (ms since the epoch), to compare with job start times.
    pub at_wall_ms: u64,
    pub healed_ms: u64,
}

/// A replica that reported itself leader of a term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LeaderSeen {
    pub term: u64,
    pub replica: u64,
    pub at_ms: u64,
}

#[derive(Debug, Default)]
pub struct Records {
    pub ops: Vec<Op>,
    pub faults: Vec<Fault>,
    pub leaders: Vec<LeaderSeen>,
}

/// The shared recorder.
#[derive(Debug, Clone)]
pub struct History {
    start: Instant,
    wall_start_ms: u64,
    records: Arc<Mutex<Records>>,
}

impl History {
    pub fn new() -> History {
        History {
            start: Instant::now(),
            wall_start_ms: docket_proto::unix_ms(),
            records: Arc::new(Mutex::new(Records::default())),
        }
    }

    /// Milliseconds since the run began.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The wall clock at `ms` into the run.
    pub fn wall_at(&self, ms: u64) -> u64 {
        self.wall_start_ms + ms
    }

    pub fn lock(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The whole history as JSON lines (ops, faults, leaders), for reading after a run.
    pub fn to_jsonl(&self) -> String {
        let r = self.lock();
        let mut out = String::new();
        for op in &r.ops {
            out.push_str(&serde_json::json!({ "op": op }).to_string());
            out.push('\n');
        }
        for f in &r.faults {
            out.push_str(&serde_json::json!({ "fault": f }).to_string());
            out.push('\n');
        }
        for l in &r.leaders {
            out.push_str(&serde_json::json!({ "leader": l }).to_string());
            out.push('\n');
        }
        out
    }

    pub fn op(&self, op: Op) {
        self.lock().ops.push(op);
    }

    pub fn fault(&self, fault: Fault) {
        self.lock().faults.push(fault);
    }

    /// Records a leadership sighting when it differs from that replica's last one, so a
    /// replica that went back to an older term shows in the records.
    pub fn leader(&self, seen: LeaderSeen) {
        let mut r = self.lock();
        let last = r.leaders.iter().rev().find(|l| l.replica == seen.replica);
        if last.is_none_or(|l| l.term != seen.term) {
            r.leaders.push(seen);
        }
    }
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}
