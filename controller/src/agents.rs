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
//!
//! Return to service: when the agent of a node declared down streams from the leader again,
//! the leader clears the down (committed, [`Command::ReturnToService`]) as Slurm's
//! `ReturnToService=1` does on a node's registration, unless the site keeps such nodes for an
//! administrator ([`ReturnToService::Never`], Slurm's `0`). A drain is never cleared.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use docket_core::command::{EndCause, EndReport};
use docket_core::job::ExitStatus;
use docket_core::{Actor, Command, Envelope, JobId, NodeName, State};
use docket_proto::v1 as pb;
use docket_proto::v1::agents_server::{Agents, AgentsServer};
use docket_raft::replica::Replica;
use docket_raft::status::Role;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::dispatch;
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
    /// Which down nodes come back by themselves when their agent does.
    pub return_to_service: ReturnToService,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            heartbeat: Duration::from_secs(2),
            fence_timeout: Duration::from_secs(20),
            down_margin: Duration::from_secs(10),
            return_to_service: ReturnToService::NotResponding,
        }
    }
}

/// Slurm's `ReturnToService`: which down nodes return to service when their agent streams
/// from the leader again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnToService {
    /// `0`: a down node stays down until an administrator resumes it.
    Never,
    /// `1`: a node down for not responding returns ([`docket_core::node::NOT_RESPONDING`]).
    NotResponding,
    /// `2`: a node down for any reason returns.
    AnyReason,
}

impl std::str::FromStr for ReturnToService {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "0" => Ok(ReturnToService::Never),
            "1" => Ok(ReturnToService::NotResponding),
            "2" => Ok(ReturnToService::AnyReason),
            other => Err(format!(
                "return_to_service: {other:?} is not 0 (never), 1 (nodes down for not \
                 responding) or 2 (nodes down for any reason)"
            )),
        }
    }
}

impl ReturnToService {
    /// Whether a node down for `reason` returns when its agent does.
    pub fn returns(self, reason: &str) -> bool {
        match self {
            ReturnToService::Never => false,
            ReturnToService::NotResponding => reason.starts_with(docket_core::node::NOT_RESPONDING),
            ReturnToService::AnyReason => true,
        }
    }
}

/// How often the leader looks for silent nodes when nothing wakes its dispatcher.
const LIVENESS_PERIOD: Duration = Duration::from_millis(500);

/// Most events one report may carry.
const MAX_EVENTS: usize = 10_000;

#[derive(Debug)]
struct Session {
    id: String,
    last_seen: Instant,
    tx: Option<mpsc::Sender<Result<pb::Instruction, Status>>>,
    /// What it holds and what its stream was told.
    link: dispatch::Link,
    /// Where srun reaches the agent; empty: it starts no steps.
    step_address: String,
}

#[derive(Debug, Default)]
struct Hub {
    sessions: BTreeMap<NodeName, Session>,
    /// When this replica last became leader, or last found itself lost while leading
    /// ([`AgentHub::run`]): silent agents are counted from then (None while not leading).
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

fn held_map(jobs: &[pb::HeldJob]) -> BTreeMap<JobId, crate::dispatch::Held> {
    jobs.iter().map(crate::dispatch::Held::of).collect()
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
    /// The hub of `replica`'s leaderships; `wake` is notified by every commit
    /// ([`crate::machine::Wakes::dispatch`]).
    pub fn new(replica: Replica<CoreMachine>, config: AgentConfig, wake: Arc<Notify>) -> Self {
        AgentHub {
            replica,
            config,
            hub: Arc::new(std::sync::Mutex::new(Hub::default())),
            wake,
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
            // Cut off from the other replicas: they are electing another leader, which the
            // agents must find (a follower names it once it is elected).
            (Role::Leader, _) if self.replica.leader_lost() => Err(Status::unavailable(format!(
                "replica {} leads but no quorum has acknowledged it for the election timeout: \
                 it is cut off and another is being elected; ask the other controllers",
                status.id
            ))),
            (Role::Leader, _) => Ok(()),
            (_, Some(addr)) => {
                let mut s = Status::failed_precondition(format!(
                    "replica {} is not the leader; {purpose} at {addr}",
                    status.id
                ));
                if let Ok(v) = addr.parse() {
                    s.metadata_mut().insert(docket_proto::metadata::LEADER, v);
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
    ///
    /// A dispatch round runs when something may have changed what an agent should run: a
    /// command committed (the state machine wakes it), an agent registered or opened its
    /// stream, or a step was created. Between them, a round every `LIVENESS_PERIOD` finds
    /// silent nodes. Raft's server metrics only tell when leadership changes (not the whole
    /// metrics, published at every turn of openraft's core).
    pub async fn run(self) {
        let mut metrics = self.replica.raft().server_metrics();
        loop {
            let leading = metrics.borrow_and_update().state == openraft::ServerState::Leader;
            let became = {
                let mut hub = self.lock();
                match (leading, hub.leader_since) {
                    (true, None) => {
                        hub.leader_since = Some(Instant::now());
                        hub.sessions.clear();
                        hub.declared_down.clear();
                        true
                    }
                    (false, Some(_)) => {
                        hub.leader_since = None;
                        // Ending the streams tells agents to find the new leader.
                        hub.sessions.clear();
                        false
                    }
                    _ => false,
                }
            };
            if !leading {
                if metrics.changed().await.is_err() {
                    return;
                }
                continue;
            }
            if became {
                self.tick().await;
            }
            // Rounds until leadership may have changed. An interval, not a sleep: a change of
            // the server metrics that leaves this replica leading must not restart it.
            let mut liveness = tokio::time::interval(LIVENESS_PERIOD);
            liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = liveness.tick() => {}
                    _ = self.wake.notified() => {}
                    r = metrics.changed() => {
                        if r.is_err() {
                            return;
                        }
                        let m = metrics.borrow();
                        if m.state != openraft::ServerState::Leader {
                            break;
                        }
                        continue;
                    }
                }
                if self.replica.leader_lost() {
                    self.end_sessions_of_lost_leadership();
                    continue;
                }
                self.tick().await;
            }
        }
    }

    /// Ends every agent's session while this leader is lost (no quorum has acknowledged it
    /// for the election timeout: the others are electing another). Its agents find the new
    /// leader through the other controllers instead of waiting on one that can start nothing;
    /// until its quorum is back it refuses them ([`AgentHub::require_leader`]). Should the
    /// quorum come back with this replica still leading, the agents get the whole fence
    /// timeout from then to register again before a node is declared down.
    fn end_sessions_of_lost_leadership(&self) {
        let mut hub = self.lock();
        hub.leader_since = Some(Instant::now());
        if hub.sessions.is_empty() {
            return;
        }
        tracing::warn!(
            sessions = hub.sessions.len(),
            "no quorum has acknowledged this leader for the election timeout: ending the \
             agents' sessions so that they find the next leader"
        );
        hub.sessions.clear();
    }

    /// One round: drive every registered agent toward the state; declare silent nodes down;
    /// return to service the down nodes whose agents are back.
    async fn tick(&self) {
        let (instructions, down, back) = self.replica.read_stale(|a| {
            let state = &a.machine.state;
            let (instructions, down) = self.plan(state);
            (instructions, down, self.returned_nodes(state))
        });
        for (node, instruction) in instructions {
            let mut hub = self.lock();
            let Some(session) = hub.sessions.get_mut(&node) else {
                continue;
            };
            let Some(tx) = &session.tx else { continue };
            if tx.try_send(Ok(instruction)).is_err() {
                // Full or gone: the agent reconnects and gets everything again.
                session.tx = None;
                session.link.new_stream();
            }
        }
        for node in down {
            let reason = format!(
                "{} for {} s",
                docket_core::node::NOT_RESPONDING,
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
        for node in back {
            let command = Command::ReturnToService {
                node: node.clone(),
                any_reason: self.config.return_to_service == ReturnToService::AnyReason,
            };
            match write(&self.replica, Envelope::controller(command)).await {
                Ok(_) => {
                    tracing::info!(%node, "agent back: node returned to service");
                    // It may be declared down again, should it fall silent again.
                    self.lock().declared_down.remove(&node);
                }
                // Resumed or downed otherwise meanwhile; the next round sees the new state.
                Err(e) => tracing::debug!(%node, error = %e, "not returned to service"),
            }
        }
    }

    /// Down nodes that return to service ([`AgentConfig::return_to_service`]): their agent
    /// streams from this leader and was heard from within a heartbeat's margin.
    fn returned_nodes(&self, state: &State) -> Vec<NodeName> {
        if self.config.return_to_service == ReturnToService::Never {
            return Vec::new();
        }
        let hub = self.lock();
        let now = Instant::now();
        let fresh = self.config.heartbeat * 3;
        hub.sessions
            .iter()
            .filter(|(_, s)| s.tx.is_some() && now.duration_since(s.last_seen) <= fresh)
            .filter(|(name, _)| {
                state.nodes.get(*name).is_some_and(|n| {
                    n.down
                        .as_deref()
                        .is_some_and(|r| self.config.return_to_service.returns(r))
                })
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// What to send to whom ([`dispatch::instruct`] for every connected agent), and which
    /// nodes to declare down, given the state.
    fn plan(&self, state: &State) -> (Vec<(NodeName, pb::Instruction)>, Vec<NodeName>) {
        let mut hub = self.lock();
        let streaming = hub.sessions.values().any(|s| s.tx.is_some());
        let liveness = !self.config.fence_timeout.is_zero();
        if !streaming && !liveness {
            return (Vec::new(), Vec::new());
        }
        let mut out = Vec::new();
        if streaming {
            let wanted = dispatch::Wanted::of(state);
            for (node, session) in hub.sessions.iter_mut() {
                if session.tx.is_some() {
                    let told = dispatch::instruct(state, &wanted, node, &mut session.link);
                    out.extend(told.into_iter().map(|i| (node.clone(), i)));
                }
            }
        }
        let down = self.silent_nodes(&hub, state);
        for name in &down {
            hub.sessions.remove(name);
        }
        (out, down)
    }

    /// Nodes whose agent has not been heard from for the fence timeout and the margin, and
    /// that are not down yet (none in the first such period of a leadership: agents are
    /// still finding the new leader).
    fn silent_nodes(&self, hub: &Hub, state: &State) -> Vec<NodeName> {
        let Some(since) = hub.leader_since else {
            return Vec::new();
        };
        if self.config.fence_timeout.is_zero() {
            return Vec::new();
        }
        let now = Instant::now();
        let limit = self.config.fence_timeout + self.config.down_margin;
        if now.duration_since(since) <= limit {
            return Vec::new();
        }
        state
            .nodes
            .iter()
            .filter(|(name, node)| node.down.is_none() && !hub.declared_down.contains(*name))
            .filter(|(name, _)| {
                let seen = hub.sessions.get(*name).map_or(since, |s| s.last_seen);
                now.duration_since(seen) > limit
            })
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// A node's report that its run of a job ended (a launch that failed is logged with its
/// reason).
fn job_end(node: &NodeName, event: &pb::JobEvent, ended: &pb::Ended) -> Result<EndReport, String> {
    let cause = end_cause(ended.cause)?;
    if !ended.reason.is_empty() {
        tracing::warn!(
            job = event.job_id,
            epoch = event.epoch,
            %node,
            reason = %ended.reason,
            "a job could not be launched"
        );
    }
    Ok(EndReport {
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

impl AgentHub {
    /// Where each reported job's current run is when not on `node` (and whether `node`
    /// holds part of its allocation), for a clear answer to a report on another node's run
    /// (apply refuses it regardless).
    fn runs_elsewhere(
        &self,
        node: &NodeName,
        events: &[pb::JobEvent],
    ) -> BTreeMap<(u64, u64), (NodeName, bool)> {
        self.replica.read_stale(|a| {
            events
                .iter()
                .filter_map(|e| {
                    let job = a.machine.state.jobs.get(&JobId(e.job_id))?;
                    let alloc = job.alloc.as_ref().filter(|al| al.epoch == e.epoch)?;
                    let on = &alloc.shares.first()?.node;
                    let holder = alloc.shares.iter().any(|s| s.node == *node);
                    (on != node).then(|| ((e.job_id, e.epoch), (on.clone(), holder)))
                })
                .collect()
        })
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
            // Elected, but the dispatcher has not yet taken up the leadership, which starts
            // with no sessions: a session made now would be dropped with the others.
            if hub.leader_since.is_none() {
                return Err(Status::unavailable(
                    "this replica has just been elected and is taking up its agents; retry",
                ));
            }
            hub.next_session += 1;
            let id = format!("{}-{}", self.hub.replica.status().term, hub.next_session);
            hub.sessions.insert(
                node.clone(),
                Session {
                    id: id.clone(),
                    last_seen: Instant::now(),
                    tx: None,
                    link: dispatch::Link {
                        held: held_map(&req.jobs),
                        ..Default::default()
                    },
                    step_address: req.step_address.clone(),
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
            s.link.held = held_map(&req.jobs);
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
                s.link.new_stream();
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
        let runs_elsewhere = self.hub.runs_elsewhere(&node, &req.events);
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
                Some(pb::job_event::Event::Ended(ended)) => match job_end(&node, event, ended) {
                    Ok(report) => reports.push(report),
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
