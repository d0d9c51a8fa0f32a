//! Node agents on the leader: sessions and leases, dispatch with epochs, reconciliation,
//! event reports, and node liveness.
//!
//! Only the leader keeps sessions; they live in memory (heartbeats never go through Raft) and
//! die with its leadership, so after a failover every agent registers again with the new
//! leader, telling it which jobs (and epochs) it holds. The leader dispatches to an agent only
//! once it has registered in this term, and then drives it toward what the replicated state
//! says: launch jobs it should run and does not hold, suspend, resume, kill, and kill anything
//! it holds that is not a current run (a stale epoch, a job that is gone). Agents refuse
//! instructions older than the epoch they hold, so nothing sent twice runs twice.
//!
//! Liveness: a node whose agent has not been heard from for `fence_timeout + down_margin` is
//! declared down (committed), which requeues or fails its jobs. The agent stops its own jobs
//! after `fence_timeout` without a leader, so by then they are stopped. A new leader first
//! waits out a grace period of the same length, so agents have time to find it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use docket_core::command::{EndCause, EndReport};
use docket_core::job::{ArrayPart, ExitStatus, Job, JobState};
use docket_core::{Actor, Command, Envelope, JobId, NodeName, State};
use docket_proto::v1 as pb;
use docket_proto::v1::agents_server::{Agents, AgentsServer};
use docket_raft::replica::Replica;
use docket_raft::status::Role;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::machine::CoreMachine;
use crate::write::write;

/// Agent timing.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Agents heartbeat this often.
    pub heartbeat: Duration,
    /// An agent that reaches no leader for this long stops its jobs. Zero: node liveness is
    /// off (no node is ever declared down for a silent agent; for clusters without agents).
    pub fence_timeout: Duration,
    /// Added to the fence timeout before the leader declares a silent node down.
    pub down_margin: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            heartbeat: Duration::from_secs(2),
            fence_timeout: Duration::from_secs(20),
            down_margin: Duration::from_secs(10),
        }
    }
}

/// Most events one report may carry.
const MAX_EVENTS: usize = 10_000;

/// What the leader wants an agent to do with one job run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    Run,
    Suspend,
    Kill,
}

#[derive(Debug)]
struct Session {
    id: String,
    last_seen: Instant,
    tx: Option<mpsc::Sender<Result<pb::Instruction, Status>>>,
    /// What the agent last said it holds: job -> (epoch, running).
    held: BTreeMap<JobId, (u64, bool)>,
    /// What was last sent per job on this stream: (epoch, want).
    sent: BTreeMap<JobId, (u64, Want)>,
    /// The time limit each run was last told (seconds, 0 unlimited), per job: (epoch, limit).
    limits: BTreeMap<JobId, (u64, u64)>,
    /// Where srun reaches the agent; empty: it starts no steps.
    step_address: String,
    /// The steps granted and cancelled on this stream.
    steps: crate::step_grants::Sent,
}

#[derive(Debug, Default)]
struct Hub {
    sessions: BTreeMap<NodeName, Session>,
    /// When this replica last became leader (None while not leading).
    leader_since: Option<Instant>,
    next_session: u64,
    /// Nodes already declared down by this leader (not declared twice).
    declared_down: BTreeSet<NodeName>,
}

/// The agents' side of the leader. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AgentHub {
    replica: Replica<CoreMachine>,
    config: AgentConfig,
    hub: Arc<std::sync::Mutex<Hub>>,
    wake: Arc<Notify>,
}

fn held_map(jobs: &[pb::HeldJob]) -> BTreeMap<JobId, (u64, bool)> {
    jobs.iter()
        .map(|j| (JobId(j.job_id), (j.epoch, j.running)))
        .collect()
}

fn end_cause(cause: i32) -> Result<EndCause, String> {
    Ok(match pb::EndCause::try_from(cause) {
        Ok(pb::EndCause::Completed | pb::EndCause::Failed) => EndCause::Exited,
        Ok(pb::EndCause::Timeout) => EndCause::Timeout,
        Ok(pb::EndCause::OutOfMemory) => EndCause::OutOfMemory,
        Ok(pb::EndCause::JobfsExceeded) => EndCause::JobfsExceeded,
        Ok(pb::EndCause::Cancelled) => EndCause::Cancelled,
        Ok(pb::EndCause::NodeFailure) => EndCause::NodeFail,
        Ok(pb::EndCause::LaunchFailed) => EndCause::LaunchFailed,
        Ok(pb::EndCause::Preempted) => EndCause::Preempted,
        Ok(pb::EndCause::Unspecified) | Err(_) => {
            return Err(format!(
                "cause: {cause} is not a cause of EndCause (completed, failed, timeout, \
                 out_of_memory, jobfs_exceeded, cancelled, node_failure, launch_failed or \
                 preempted)"
            ));
        }
    })
}

impl AgentHub {
    pub fn new(replica: Replica<CoreMachine>, config: AgentConfig) -> Self {
        AgentHub {
            replica,
            config,
            hub: Arc::new(std::sync::Mutex::new(Hub::default())),
            wake: Arc::new(Notify::new()),
        }
    }

    /// The gRPC service.
    pub fn service(&self) -> AgentsServer<AgentsService> {
        AgentsServer::new(AgentsService { hub: self.clone() })
    }

    /// The nodes whose agent heartbeated within three heartbeat periods, when this replica
    /// leads; `None` on a follower (only the leader holds the sessions).
    pub fn responding(&self) -> Option<BTreeSet<NodeName>> {
        if self.replica.status().role != Role::Leader {
            return None;
        }
        let hub = self.lock();
        hub.leader_since?;
        let window = self.config.heartbeat * 3;
        let now = Instant::now();
        Some(
            hub.sessions
                .iter()
                .filter(|(_, s)| now.duration_since(s.last_seen) <= window)
                .map(|(n, _)| n.clone())
                .collect(),
        )
    }

    /// Sends `signal` to one run through its node's instruction stream.
    pub fn signal(
        &self,
        run: &docket_core::apply::SignalTarget,
        signal: i32,
    ) -> Result<(), String> {
        let hub = self.lock();
        let tx = hub
            .sessions
            .get(&run.node)
            .and_then(|s| s.tx.as_ref())
            .ok_or_else(|| format!("the agent of node {} is not connected", run.node))?;
        tx.try_send(Ok(pb::Instruction {
            kind: Some(pb::instruction::Kind::Signal(pb::SignalJob {
                job_id: run.job.0,
                epoch: run.epoch,
                signal,
            })),
        }))
        .map_err(|e| format!("node {}: {e}", run.node))
    }

    /// Where srun reaches each of `nodes`' agents, as they registered with this leader.
    pub fn step_addresses(&self, nodes: &[NodeName]) -> BTreeMap<NodeName, String> {
        let hub = self.lock();
        nodes
            .iter()
            .filter_map(|n| {
                let s = hub.sessions.get(n)?;
                (!s.step_address.is_empty()).then(|| (n.clone(), s.step_address.clone()))
            })
            .collect()
    }

    /// Wakes the dispatch loop (a step was created).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Hub> {
        self.hub.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses unless this replica leads, naming the leader.
    pub fn require_leader(&self) -> Result<(), Status> {
        self.require_leader_to("agents talk to the leader")
    }

    /// [`AgentHub::require_leader`] for a request that only the leader serves, `purpose`
    /// saying which ("steps are created by the leader").
    pub fn require_leader_to(&self, purpose: &str) -> Result<(), Status> {
        let status = self.replica.status();
        match (status.role, status.leader_addr) {
            (Role::Leader, _) => Ok(()),
            (_, Some(addr)) => {
                let mut s = Status::failed_precondition(format!(
                    "replica {} is not the leader; {purpose} at {addr}",
                    status.id
                ));
                if let Ok(v) = addr.parse() {
                    s.metadata_mut().insert("x-docket-leader", v);
                }
                Err(s)
            }
            (_, None) => Err(Status::unavailable(
                "no leader is known (an election is in progress); retry",
            )),
        }
    }

    fn check_session(&self, node: &NodeName, session: &str) -> Result<(), Status> {
        let hub = self.lock();
        match hub.sessions.get(node) {
            Some(s) if s.id == session => Ok(()),
            _ => Err(Status::failed_precondition(format!(
                "session {session:?} of node {node} is not known to this leader; register again"
            ))),
        }
    }

    /// Runs forever: on this replica's leaderships, dispatches and watches liveness.
    pub async fn run(self) {
        let mut metrics = self.replica.raft().metrics();
        loop {
            let leading = metrics.borrow_and_update().state == openraft::ServerState::Leader;
            {
                let mut hub = self.lock();
                match (leading, hub.leader_since) {
                    (true, None) => {
                        hub.leader_since = Some(Instant::now());
                        hub.sessions.clear();
                        hub.declared_down.clear();
                    }
                    (false, Some(_)) => {
                        hub.leader_since = None;
                        // Ending the streams tells agents to find the new leader.
                        hub.sessions.clear();
                    }
                    _ => {}
                }
            }
            if leading {
                self.tick().await;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = self.wake.notified() => {}
                    r = metrics.changed() => if r.is_err() { return },
                }
            } else if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// One round: drive every registered agent toward the state; declare silent nodes down.
    async fn tick(&self) {
        let (instructions, down) = self.replica.read_stale(|a| self.plan(&a.machine.state));
        for (node, instruction) in instructions {
            let mut hub = self.lock();
            let Some(session) = hub.sessions.get_mut(&node) else {
                continue;
            };
            let Some(tx) = &session.tx else { continue };
            if tx.try_send(Ok(instruction)).is_err() {
                // Full or gone: the agent reconnects and gets everything again.
                session.tx = None;
                session.sent.clear();
            }
        }
        for node in down {
            let reason = format!(
                "agent not responding for {} s",
                (self.config.fence_timeout + self.config.down_margin).as_secs()
            );
            tracing::warn!(%node, %reason, "declaring node down");
            let command = Command::DownNode {
                node: node.clone(),
                reason,
            };
            if write(&self.replica, Envelope::controller(command))
                .await
                .is_ok()
            {
                self.lock().declared_down.insert(node);
            }
        }
    }

    /// What to send to whom, and which nodes to declare down, given the state.
    fn plan(&self, state: &State) -> (Vec<(NodeName, pb::Instruction)>, Vec<NodeName>) {
        let mut hub = self.lock();
        let now = Instant::now();
        let streaming = hub.sessions.values().any(|s| s.tx.is_some());
        let liveness = !self.config.fence_timeout.is_zero();
        if !streaming && !liveness {
            return (Vec::new(), Vec::new());
        }
        // Where each live run should be, and in which state.
        let mut want: BTreeMap<NodeName, BTreeMap<JobId, (u64, Want)>> = BTreeMap::new();
        let mut limit_of: BTreeMap<JobId, u64> = BTreeMap::new();
        for job in state.holding_jobs() {
            let Some(alloc) = &job.alloc else { continue };
            let w = match job.state {
                JobState::Running => Want::Run,
                JobState::Suspended => Want::Suspend,
                JobState::Completing => Want::Kill,
                _ => continue,
            };
            // The batch script runs on the first node; every other node of the allocation
            // holds it for the job's steps (Slurm's extern step).
            for share in &alloc.shares {
                want.entry(share.node.clone())
                    .or_default()
                    .insert(job.id, (alloc.epoch, w));
            }
            limit_of.insert(job.id, job.resolved.time_limit.map_or(0, |t| t.0));
        }
        let mut out = Vec::new();
        for (node, session) in hub.sessions.iter_mut() {
            if session.tx.is_none() {
                continue;
            }
            let wanted = want.get(node);
            for (job_id, (epoch, w)) in wanted.into_iter().flatten() {
                let held = session.held.get(job_id).copied();
                let sent = session.sent.get(job_id).copied();
                let control = |kind: fn(pb::JobControl) -> pb::instruction::Kind, reason: &str| {
                    pb::Instruction {
                        kind: Some(kind(pb::JobControl {
                            job_id: job_id.0,
                            epoch: *epoch,
                            reason: reason.into(),
                        })),
                    }
                };
                let instruction = match w {
                    Want::Run => match (sent, held) {
                        (Some((e, Want::Run)), _) if e == *epoch => None,
                        (Some((e, Want::Suspend)), _) if e == *epoch => {
                            Some(control(pb::instruction::Kind::Resume, "resumed"))
                        }
                        (_, Some((e, true))) if e == *epoch => None,
                        _ => state.jobs.get(job_id).map(|job| pb::Instruction {
                            kind: Some(pb::instruction::Kind::Launch(launch(state, job, node))),
                        }),
                    },
                    Want::Suspend => match sent {
                        Some((e, Want::Suspend)) if e == *epoch => None,
                        _ => Some(control(pb::instruction::Kind::Suspend, "suspended")),
                    },
                    Want::Kill => match sent {
                        Some((e, Want::Kill)) if e == *epoch => None,
                        _ => Some(control(pb::instruction::Kind::Kill, "cancelled")),
                    },
                };
                let launching = matches!(
                    &instruction,
                    Some(pb::Instruction {
                        kind: Some(pb::instruction::Kind::Launch(_))
                    })
                );
                let limit = limit_of.get(job_id).copied().unwrap_or(0);
                if let Some(i) = instruction {
                    session.sent.insert(*job_id, (*epoch, *w));
                    out.push((node.clone(), i));
                }
                if launching {
                    session.limits.insert(*job_id, (*epoch, limit));
                } else if *w != Want::Kill {
                    // A run the agent has: tell it a changed time limit.
                    match session.limits.get(job_id) {
                        Some((e, l)) if e == epoch && *l == limit => {}
                        Some((e, _)) if e == epoch => {
                            session.limits.insert(*job_id, (*epoch, limit));
                            out.push((
                                node.clone(),
                                pb::Instruction {
                                    kind: Some(pb::instruction::Kind::TimeLimit(pb::TimeLimit {
                                        job_id: job_id.0,
                                        epoch: *epoch,
                                        time_limit_seconds: limit,
                                    })),
                                },
                            ));
                        }
                        // Not launched by this leader: take the current limit as the
                        // agent's (an update made while no leader was there reaches it only
                        // with the next change).
                        _ => {
                            session.limits.insert(*job_id, (*epoch, limit));
                        }
                    }
                }
            }
            crate::step_grants::plan(state, node, wanted, &mut session.steps, &mut out);
            // Anything the agent runs that is not a current run here: kill it.
            for (job_id, (epoch, running)) in &session.held {
                let current = wanted
                    .and_then(|w| w.get(job_id))
                    .is_some_and(|(e, _)| e == epoch);
                let already = session.sent.get(job_id) == Some(&(*epoch, Want::Kill));
                if *running && !current && !already {
                    session.sent.insert(*job_id, (*epoch, Want::Kill));
                    out.push((
                        node.clone(),
                        pb::Instruction {
                            kind: Some(pb::instruction::Kind::Kill(pb::JobControl {
                                job_id: job_id.0,
                                epoch: *epoch,
                                reason: "stale: not this job's current run".into(),
                            })),
                        },
                    ));
                }
            }
        }
        // Liveness.
        let mut down = Vec::new();
        if !self.config.fence_timeout.is_zero()
            && let Some(since) = hub.leader_since
        {
            let limit = self.config.fence_timeout + self.config.down_margin;
            if now.duration_since(since) > limit {
                for (name, node) in &state.nodes {
                    if node.down.is_some() || hub.declared_down.contains(name) {
                        continue;
                    }
                    let seen = hub.sessions.get(name).map_or(since, |s| s.last_seen);
                    if now.duration_since(seen) > limit {
                        down.push(name.clone());
                    }
                }
            }
        }
        for name in &down {
            hub.sessions.remove(name);
        }
        (out, down)
    }
}

/// A node's report that its tasks of a step ended.
fn step_end(
    node: &NodeName,
    event: &pb::JobEvent,
    step: &pb::StepEnded,
) -> Result<docket_core::command::StepEndReport, String> {
    let ended = step.ended.as_ref().ok_or("ended: missing")?;
    Ok(docket_core::command::StepEndReport {
        step: docket_core::job::StepRef {
            job: JobId(event.job_id),
            step: docket_core::job::StepId(step.step_id),
        },
        epoch: event.epoch,
        node: node.clone(),
        cause: end_cause(ended.cause).map_err(|e| format!("ended.{e}"))?,
        exit: ExitStatus {
            code: ended.exit_code,
            signal: ended.signal,
            cpu_time_ms: ended.cpu_time_ms,
            max_rss_mib: ended.max_rss_mib,
        },
    })
}

/// What a node that is not the batch node runs for the job: nothing but a process that holds
/// the allocation's cgroups until the job ends (Slurm's `extern` step).
const EXTERN_SCRIPT: &[u8] = b"#!/bin/sh\nexec sleep infinity\n";

/// The launch instruction for `job`'s current run on `node`: the batch script on the first
/// node of the allocation, the holder of the allocation on the others.
fn launch(state: &State, job: &Job, node: &NodeName) -> pb::Launch {
    let alloc = job.alloc.as_ref();
    let first = alloc
        .and_then(|a| a.shares.first())
        .is_none_or(|s| &s.node == node);
    let share = alloc.and_then(|a| a.shares.iter().find(|s| &s.node == node));
    let nodes: Vec<&str> = alloc
        .map(|a| a.shares.iter().map(|s| s.node.as_str()).collect())
        .unwrap_or_default();
    let (array_job_id, array_task_id) = match &job.array {
        Some(ArrayPart::Task { array_job, index }) => (Some(array_job.0), Some(*index)),
        _ => (None, None),
    };
    let tasks_per_node = alloc
        .map(|a| job_tasks_per_node(job, a))
        .unwrap_or_default();
    let mut launch = pb::Launch {
        job_id: job.id.0,
        epoch: alloc.map_or(0, |a| a.epoch),
        name: job.spec.name.to_string(),
        user: job.spec.user.to_string(),
        account: job.resolved.account.to_string(),
        partition: job.resolved.partition.to_string(),
        work_dir: job.spec.work_dir.to_string(),
        stdout: job.spec.stdout.as_deref().unwrap_or_default().to_owned(),
        stderr: job.spec.stderr.as_deref().unwrap_or_default().to_owned(),
        script: state
            .blobs
            .get(&job.spec.script)
            .map(|b| b.data.clone())
            .unwrap_or_default(),
        environment: job
            .spec
            .env
            .and_then(|id| state.blobs.get(&id))
            .map(|b| b.data.clone()),
        cpus: share.map_or(0, |s| s.cpus),
        memory_mib: share.map_or(0, |s| s.memory.0),
        vmem_mib: job.spec.vmem.map(|v| v.0),
        address_space_limit: job.spec.address_space_limit,
        jobfs_mib: share.map_or(0, |s| s.jobfs.0),
        gpus: share.map_or(0, |s| s.gpus),
        time_limit_seconds: job.resolved.time_limit.map_or(0, |t| t.0),
        node_count: nodes.len() as u32,
        node_list: docket_core::hostlist::compress(&nodes),
        ntasks: job.spec.ntasks,
        cpus_per_task: job.spec.cpus_per_task,
        array_job_id,
        array_task_id,
        submit_host_dir: job.spec.work_dir.to_string(),
        extern_only: false,
        tasks_per_node,
    };
    if !first {
        launch.extern_only = true;
        launch.script = EXTERN_SCRIPT.to_vec();
        launch.environment = None;
        launch.stdout = "/dev/null".into();
        launch.stderr = "/dev/null".into();
    }
    launch
}

/// The job's tasks on each node of `alloc`, as Slurm writes `SLURM_TASKS_PER_NODE` ("2(x3),1"):
/// the job's `-n` placed on its whole allocation as a step with no other step beside it
/// would be, which is where `srun` inside it puts them and where MPI launchers that read the
/// variable (MPICH's Hydra) start their ranks.
fn job_tasks_per_node(job: &docket_core::job::Job, alloc: &docket_core::job::Allocation) -> String {
    let spec = docket_core::job::StepSpec {
        name: String::new(),
        ntasks: Some(job.spec.ntasks.max(1)),
        nodes: Some(alloc.shares.len() as u32),
        ntasks_per_node: job.spec.ntasks_per_node,
        cpus_per_task: job.spec.cpus_per_task.max(1),
        nodelist: Vec::new(),
        overlap: true,
        time_limit: None,
        io_key: Vec::new(),
    };
    match docket_core::job::step::place(alloc, &|_| 0, &spec) {
        docket_core::job::step::Placement::Placed(shares) => {
            let counts: Vec<u32> = alloc
                .shares
                .iter()
                .map(|a| {
                    shares
                        .iter()
                        .find(|s| s.node == a.node)
                        .map_or(0, |s| s.tasks)
                })
                .collect();
            crate::step_grants::tasks_per_node(&counts)
        }
        _ => String::new(),
    }
}

/// The gRPC face of the hub.
#[derive(Debug, Clone)]
pub struct AgentsService {
    hub: AgentHub,
}

#[tonic::async_trait]
impl Agents for AgentsService {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let node = crate::identity::node_of(&request, &request.get_ref().node)?;
        self.hub.require_leader()?;
        let req = request.into_inner();
        let spec = self
            .hub
            .replica
            .read_stale(|a| a.machine.state.nodes.get(&node).map(|n| n.spec.clone()));
        let Some(spec) = spec else {
            return Err(Status::not_found(format!(
                "node {node} is not in the configuration; add it to [[nodes]] first"
            )));
        };
        if spec.cpus != req.cpus || spec.memory.0 != req.memory_mib {
            tracing::warn!(
                %node,
                configured_cpus = spec.cpus,
                declared_cpus = req.cpus,
                configured_memory_mib = spec.memory.0,
                declared_memory_mib = req.memory_mib,
                "agent declares other resources than the configuration; the configuration wins"
            );
        }
        let id = {
            let mut hub = self.hub.lock();
            hub.next_session += 1;
            let id = format!("{}-{}", self.hub.replica.status().term, hub.next_session);
            hub.sessions.insert(
                node.clone(),
                Session {
                    id: id.clone(),
                    last_seen: Instant::now(),
                    tx: None,
                    held: held_map(&req.jobs),
                    sent: BTreeMap::new(),
                    limits: BTreeMap::new(),
                    step_address: req.step_address.clone(),
                    steps: Default::default(),
                },
            );
            hub.declared_down.remove(&node);
            id
        };
        tracing::info!(%node, session = %id, held = req.jobs.len(), "agent registered");
        self.hub.wake.notify_one();
        Ok(Response::new(pb::RegisterResponse {
            session: id,
            heartbeat_ms: self.hub.config.heartbeat.as_millis() as u64,
            fence_timeout_ms: self.hub.config.fence_timeout.as_millis() as u64,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let node = crate::identity::node_of(&request, &request.get_ref().node)?;
        self.hub.require_leader()?;
        let req = request.into_inner();
        self.hub.check_session(&node, &req.session)?;
        let mut hub = self.hub.lock();
        if let Some(s) = hub.sessions.get_mut(&node) {
            s.last_seen = Instant::now();
            s.held = held_map(&req.jobs);
        }
        Ok(Response::new(pb::HeartbeatResponse {}))
    }

    type InstructionsStream = ReceiverStream<Result<pb::Instruction, Status>>;

    async fn instructions(
        &self,
        request: Request<pb::InstructionsRequest>,
    ) -> Result<Response<Self::InstructionsStream>, Status> {
        let node = crate::identity::node_of(&request, &request.get_ref().node)?;
        self.hub.require_leader()?;
        let req = request.into_inner();
        self.hub.check_session(&node, &req.session)?;
        let (tx, rx) = mpsc::channel(4096);
        {
            let mut hub = self.hub.lock();
            if let Some(s) = hub.sessions.get_mut(&node) {
                s.tx = Some(tx);
                // A new stream gets everything again; the agent ignores what it already has.
                s.sent.clear();
                s.limits.clear();
                s.steps = Default::default();
                s.last_seen = Instant::now();
            }
        }
        self.hub.wake.notify_one();
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn report_events(
        &self,
        request: Request<pb::ReportEventsRequest>,
    ) -> Result<Response<pb::ReportEventsResponse>, Status> {
        let node = crate::identity::node_of(&request, &request.get_ref().node)?;
        self.hub.require_leader()?;
        let req = request.into_inner();
        self.hub.check_session(&node, &req.session)?;
        if req.events.len() > MAX_EVENTS {
            return Err(Status::invalid_argument(format!(
                "events: {} in one report; the limit is {MAX_EVENTS}",
                req.events.len()
            )));
        }
        let mut errors = vec![String::new(); req.events.len()];
        let mut reports = Vec::new();
        // Where each reported job's current run is, for a clear answer to a report on
        // another node's run (apply refuses it regardless).
        let runs_elsewhere: BTreeMap<(u64, u64), (NodeName, bool)> =
            self.hub.replica.read_stale(|a| {
                req.events
                    .iter()
                    .filter_map(|e| {
                        let job = a.machine.state.jobs.get(&JobId(e.job_id))?;
                        let alloc = job.alloc.as_ref().filter(|al| al.epoch == e.epoch)?;
                        let on = &alloc.shares.first()?.node;
                        let holder = alloc.shares.iter().any(|s| s.node == node);
                        (on != &node).then(|| ((e.job_id, e.epoch), (on.clone(), holder)))
                    })
                    .collect()
            });
        let mut step_reports = Vec::new();
        for (i, event) in req.events.iter().enumerate() {
            // A step runs on several nodes: each node reports its own tasks (apply checks
            // that the node is in the step).
            if let Some(pb::job_event::Event::StepEnded(step)) = &event.event {
                match step_end(&node, event, step) {
                    Ok(r) => step_reports.push(r),
                    Err(e) => errors[i] = format!("events[{i}].step_ended.{e}"),
                }
                continue;
            }
            if let Some((on, holder)) = runs_elsewhere.get(&(event.job_id, event.epoch)) {
                if *holder {
                    // The node holds the allocation for steps; its holder's end ends nothing.
                    continue;
                }
                errors[i] = format!(
                    "events[{i}]: job {}'s run is on node {on}; node {node} may report only \
                     on its own runs",
                    event.job_id
                );
                continue;
            }
            match &event.event {
                Some(pb::job_event::Event::Ended(ended)) => match end_cause(ended.cause) {
                    Ok(cause) => {
                        if !ended.reason.is_empty() {
                            tracing::warn!(
                                job = event.job_id,
                                epoch = event.epoch,
                                %node,
                                reason = %ended.reason,
                                "a job could not be launched"
                            );
                        }
                        reports.push(EndReport {
                            job: JobId(event.job_id),
                            epoch: event.epoch,
                            cause,
                            exit: ExitStatus {
                                code: ended.exit_code,
                                signal: ended.signal,
                                cpu_time_ms: ended.cpu_time_ms,
                                max_rss_mib: ended.max_rss_mib,
                            },
                        })
                    }
                    Err(e) => errors[i] = format!("events[{i}].ended.{e}"),
                },
                Some(pb::job_event::Event::Started(_)) => {
                    tracing::debug!(job = event.job_id, epoch = event.epoch, %node, "job started");
                }
                Some(pb::job_event::Event::StepEnded(_)) => {}
                None => errors[i] = format!("events[{i}]: no event"),
            }
        }
        if !step_reports.is_empty() {
            let envelope =
                Envelope::new(Actor::Node(node.clone()), Command::EndSteps(step_reports));
            write(&self.hub.replica, envelope).await?;
        }
        if !reports.is_empty() {
            let envelope = Envelope::new(Actor::Node(node.clone()), Command::EndJobs(reports));
            write(&self.hub.replica, envelope).await?;
            self.hub.wake.notify_one();
        }
        if let Some(s) = self.hub.lock().sessions.get_mut(&node) {
            s.last_seen = Instant::now();
        }
        Ok(Response::new(pb::ReportEventsResponse { errors }))
    }
}
