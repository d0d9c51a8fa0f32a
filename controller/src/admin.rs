//! The `docket.v1.Admin` service: the replicas, the replicated configuration, nodes,
//! reservations and the scheduler's diagnostics.
//!
//! Reads are open to every caller with a credential; changes need the admin role. Membership
//! changes are checked here (they are Raft's, not docket-core's); every other change carries
//! its proven actor into the log, where docket-core checks the role again at apply time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use docket_core::quantity::TimeMs;
use docket_core::{Actor, Command, Envelope};
use docket_proto::v1 as pb;
use docket_proto::v1::admin_server::{Admin, AdminServer};
use docket_raft::ReplicaId;
use docket_raft::network::Channels;
use docket_raft::replica::{ClusterError, Replica};
use docket_raft::status::Role;
use tonic::{Request, Response, Status};

use crate::identity::Authenticator;
use crate::machine::CoreMachine;
use crate::stats::LoopStats;
use crate::write::write;

/// The admin service of one replica.
#[derive(Debug, Clone)]
pub struct AdminService {
    replica: Replica<CoreMachine>,
    channels: Channels,
    stats: Arc<std::sync::Mutex<LoopStats>>,
    inflight: Arc<AtomicUsize>,
    /// The leader's agent sessions (which nodes respond).
    agents: Option<crate::agents::AgentHub>,
    /// Who is calling.
    auth: Authenticator,
}

impl AdminService {
    pub fn new(
        replica: Replica<CoreMachine>,
        stats: Arc<std::sync::Mutex<LoopStats>>,
        inflight: Arc<AtomicUsize>,
        agents: Option<crate::agents::AgentHub>,
        auth: Authenticator,
        channels: Channels,
    ) -> AdminServer<Self> {
        AdminServer::new(AdminService {
            replica,
            channels,
            stats,
            inflight,
            agents,
            auth,
        })
    }

    /// The caller, who must hold the admin role (a quick answer; apply checks again).
    async fn admin<T>(&self, request: &Request<T>) -> Result<Actor, Status> {
        let actor = self.auth.caller(request).await?;
        let ok = self
            .replica
            .read_stale(|a| a.machine.state.is_admin(&actor));
        if !ok {
            return Err(Status::permission_denied(format!(
                "{actor}: this needs the admin role (root, or a user with AdminLevel); nothing \
                 changed"
            )));
        }
        Ok(actor)
    }

    async fn command(
        &self,
        actor: Actor,
        command: Command,
    ) -> Result<Response<pb::AdminReply>, Status> {
        let response = write(&self.replica, Envelope::new(actor, command)).await?;
        Ok(Response::new(pb::AdminReply {
            message: format!("{response:?}"),
        }))
    }
}

fn cluster_status(e: ClusterError) -> Status {
    match &e {
        ClusterError::NotLeader { leader_addr, .. } => {
            let mut status = Status::failed_precondition(e.to_string());
            if let Some(addr) = leader_addr
                && let Ok(v) = addr.parse()
            {
                status
                    .metadata_mut()
                    .insert(docket_proto::metadata::LEADER, v);
            }
            status
        }
        ClusterError::AlreadyInitialized | ClusterError::Refused(_) => {
            Status::failed_precondition(e.to_string())
        }
        ClusterError::Stopped(_) | ClusterError::Timeout(..) => Status::unavailable(e.to_string()),
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn cluster_status(
        &self,
        request: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        self.auth.caller(&request).await?;
        let me = self.replica.status();
        if request.get_ref().leader_only {
            return Ok(Response::new(pb::ClusterStatusResponse {
                leader_id: me.leader.map(|l| l.0),
                leader_addr: me.leader_addr.unwrap_or_default(),
                term: me.term,
                answered_by: me.id.0,
                ..Default::default()
            }));
        }
        // The leader's view has every member's lag; ask it when we are not it.
        let leader_view = match (&me.role, me.leader.zip(me.leader_addr.as_ref())) {
            (Role::Leader, _) => Some(me.clone()),
            (_, Some((leader, addr))) => self
                .channels
                .status_of(Some(leader), addr, Duration::from_secs(1))
                .await
                .ok(),
            _ => None,
        };
        let lag: BTreeMap<ReplicaId, Option<u64>> = leader_view
            .as_ref()
            .map(|l| l.members.iter().map(|m| (m.id, m.lag)).collect())
            .unwrap_or_default();
        let mut replicas = Vec::new();
        for member in &me.members {
            let answer = if member.id == me.id {
                Ok(me.clone())
            } else {
                // Whichever replica answers there, so that one in the wrong place is named.
                self.channels
                    .status(&member.addr, Duration::from_secs(1))
                    .await
                    .and_then(|s| {
                        if s.id == member.id {
                            Ok(s)
                        } else {
                            Err(format!(
                                "{}: replica {} answers there, not replica {}",
                                member.addr, s.id.0, member.id.0
                            ))
                        }
                    })
            };
            replicas.push(match answer {
                Ok(s) => pb::ReplicaInfo {
                    id: member.id.0,
                    addr: member.addr.clone(),
                    role: crate::typed::replica_role(s.role).1.into(),
                    replica_role: crate::typed::replica_role(s.role).0.into(),
                    voter: member.voter,
                    term: s.term,
                    last_log_index: s.last_log_index,
                    applied_index: s.applied_index,
                    snapshot_index: s.snapshot_index,
                    lag: lag.get(&member.id).copied().flatten(),
                    reachable: true,
                    error: s.stopped.unwrap_or_default(),
                },
                Err(e) => pb::ReplicaInfo {
                    id: member.id.0,
                    addr: member.addr.clone(),
                    role: "unreachable".into(),
                    replica_role: pb::ReplicaRole::Unreachable.into(),
                    voter: member.voter,
                    lag: lag.get(&member.id).copied().flatten(),
                    reachable: false,
                    error: e,
                    ..Default::default()
                },
            });
        }
        Ok(Response::new(pb::ClusterStatusResponse {
            leader_id: me.leader.map(|l| l.0),
            leader_addr: me.leader_addr.unwrap_or_default(),
            term: me.term,
            replicas,
            answered_by: me.id.0,
        }))
    }

    async fn add_replica(
        &self,
        request: Request<pb::AddReplicaRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        self.admin(&request).await?;
        let req = request.into_inner();
        if req.id == 0 {
            return Err(Status::invalid_argument("id: replica ids start at 1"));
        }
        if req.addr.parse::<std::net::SocketAddr>().is_err() && !req.addr.contains(':') {
            return Err(Status::invalid_argument(format!(
                "addr: {:?} is not HOST:PORT",
                req.addr
            )));
        }
        let id = ReplicaId(req.id);
        let result = if req.learner {
            self.replica.add_learner(id, &req.addr).await
        } else {
            self.replica.add_voter(id, &req.addr).await
        };
        result.map_err(cluster_status)?;
        Ok(Response::new(pb::AdminReply {
            message: format!(
                "replica {id} at {} added as a {}",
                req.addr,
                if req.learner { "learner" } else { "voter" }
            ),
        }))
    }

    async fn remove_replica(
        &self,
        request: Request<pb::RemoveReplicaRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        self.admin(&request).await?;
        let id = ReplicaId(request.into_inner().id);
        let known = self.replica.status().members.iter().any(|m| m.id == id);
        if !known {
            return Err(Status::not_found(format!("replica {id} is not a member")));
        }
        self.replica.remove(id).await.map_err(cluster_status)?;
        Ok(Response::new(pb::AdminReply {
            message: format!(
                "replica {id} removed; stop its process and retire its data directory"
            ),
        }))
    }

    async fn get_config(
        &self,
        request: Request<pb::GetConfigRequest>,
    ) -> Result<Response<pb::GetConfigResponse>, Status> {
        self.auth.caller(&request).await?;
        let reply = crate::write::read(&self.replica, false, Duration::from_secs(5), |s| {
            let mut users: Vec<String> = s.users.keys().map(|u| u.to_string()).collect();
            users.sort();
            pb::GetConfigResponse {
                sched_config_json: serde_json::to_string_pretty(&s.config).unwrap_or_default(),
                partitions: s.partitions.keys().map(|p| p.to_string()).collect(),
                qos: s.qos.keys().map(|q| q.to_string()).collect(),
                accounts: s.accounts.accounts.keys().map(|a| a.to_string()).collect(),
                users,
                nodes: s.nodes.len() as u64,
            }
        })
        .await?;
        Ok(Response::new(reply))
    }

    async fn apply_config(
        &self,
        request: Request<pb::ApplyConfigRequest>,
    ) -> Result<Response<pb::ApplyConfigResponse>, Status> {
        let actor = self.admin(&request).await?;
        let req = request.into_inner();
        let site = docket_core::site::parse(&req.toml)
            .map_err(|e| Status::invalid_argument(format!("toml: {e}")))?;
        let mut commands = site.site.commands();
        if req.objects_only {
            // Neither the parameters nor the default QOS a whole file implies, which would
            // replace the one in force.
            let defined: BTreeSet<String> =
                site.site.qos.iter().map(|q| q.name.to_string()).collect();
            commands.retain(|c| match c {
                Command::SetConfig(_) => false,
                Command::UpsertQos(q) => defined.contains(q.name.as_str()),
                _ => true,
            });
        }
        let changes: Vec<String> = commands.iter().map(describe).collect();
        if req.dry_run {
            let now = docket_raft::cluster_clock::now_ms();
            let outcome = crate::write::read(&self.replica, false, Duration::from_secs(5), |s| {
                crate::dry_run::dry_run(s, &actor, &commands, now)
            })
            .await?;
            return Ok(Response::new(pb::ApplyConfigResponse {
                errors: outcome.errors,
                changes,
                applied: false,
                order_changes: outcome.order_changes,
                pending_jobs: outcome.pending_jobs as u64,
            }));
        }
        let mut errors = Vec::with_capacity(commands.len());
        for command in commands {
            errors.push(
                match write(&self.replica, Envelope::new(actor.clone(), command)).await {
                    Ok(_) => String::new(),
                    Err(status) if status.code() == tonic::Code::Unavailable => return Err(status),
                    Err(status) => status.message().to_owned(),
                },
            );
        }
        let applied = errors.iter().all(String::is_empty);
        Ok(Response::new(pb::ApplyConfigResponse {
            changes,
            errors,
            applied,
            ..Default::default()
        }))
    }

    async fn remove_object(
        &self,
        request: Request<pb::RemoveObjectRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        let actor = self.admin(&request).await?;
        let req = request.into_inner();
        fn parse<T: std::str::FromStr>(name: &str) -> Result<T, Status>
        where
            T::Err: std::fmt::Display,
        {
            name.parse()
                .map_err(|e| Status::invalid_argument(format!("name: {e}")))
        }
        use pb::ObjectKind as Kind;
        let command = match crate::typed::object_kind(req.object_kind, &req.kind) {
            Some(Kind::Node) => Command::RemoveNode(parse(&req.name)?),
            Some(Kind::Partition) => Command::RemovePartition(parse(&req.name)?),
            Some(Kind::Qos) => Command::RemoveQos(parse(&req.name)?),
            Some(Kind::Account) => Command::RemoveAccount(parse(&req.name)?),
            Some(Kind::User) => Command::RemoveUser(parse(&req.name)?),
            Some(Kind::Reservation) => Command::RemoveReservation(parse(&req.name)?),
            Some(Kind::Unspecified) | None => {
                return Err(Status::invalid_argument(format!(
                    "kind: {:?} (object_kind {}) is not node, partition, qos, account, user or \
                     reservation",
                    req.kind, req.object_kind
                )));
            }
        };
        self.command(actor, command).await
    }

    async fn drain_node(
        &self,
        request: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        let actor = self.admin(&request).await?;
        let req = request.into_inner();
        if req.reason.trim().is_empty() {
            return Err(Status::invalid_argument(
                "reason: say why the node is drained (Slurm requires a reason too)",
            ));
        }
        let node = req
            .node
            .parse()
            .map_err(|e| Status::invalid_argument(format!("node: {e}")))?;
        self.command(
            actor,
            Command::DrainNode {
                node,
                reason: req.reason,
            },
        )
        .await
    }

    async fn resume_node(
        &self,
        request: Request<pb::NodeRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        let actor = self.admin(&request).await?;
        let node = request
            .into_inner()
            .node
            .parse()
            .map_err(|e| Status::invalid_argument(format!("node: {e}")))?;
        self.command(actor, Command::ResumeNode(node)).await
    }

    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        self.auth.caller(&request).await?;
        let responding = self.agents.as_ref().and_then(|a| a.responding());
        let nodes = crate::write::read(&self.replica, false, Duration::from_secs(5), |s| {
            s.nodes
                .iter()
                .map(|(name, n)| pb::NodeInfo {
                    name: name.to_string(),
                    state: format!("{:?}", n.state()).to_lowercase(),
                    node_state: crate::typed::node_state(n.state()).into(),
                    cpus: n.spec.cpus,
                    cpus_used: n.used_cpus(),
                    memory_mib: n.spec.memory.0,
                    memory_used_mib: n.used_memory().0,
                    gpus: n.spec.gpus,
                    gpus_used: n.used_gpus(),
                    partitions: s
                        .partitions
                        .values()
                        .filter(|p| p.nodes.contains(name))
                        .map(|p| p.name.to_string())
                        .collect(),
                    reason: n
                        .down
                        .clone()
                        .or_else(|| n.drain.clone())
                        .unwrap_or_default(),
                    features: n.spec.features.iter().cloned().collect(),
                    responding: responding.as_ref().map(|r| r.contains(name)),
                })
                .collect()
        })
        .await?;
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }

    async fn list_partitions(
        &self,
        request: Request<pb::ListPartitionsRequest>,
    ) -> Result<Response<pb::ListPartitionsResponse>, Status> {
        self.auth.caller(&request).await?;
        let partitions = crate::write::read(&self.replica, false, Duration::from_secs(5), |s| {
            s.partitions
                .values()
                .map(|p| {
                    let names: Vec<String> = p.nodes.iter().map(|n| n.to_string()).collect();
                    pb::PartitionInfo {
                        name: p.name.to_string(),
                        nodes: docket_core::hostlist::compress(&names),
                        total_nodes: p.nodes.len() as u32,
                        total_cpus: p
                            .nodes
                            .iter()
                            .filter_map(|n| s.nodes.get(n))
                            .map(|n| u64::from(n.spec.cpus))
                            .sum(),
                        is_default: p.is_default,
                        up: p.up,
                        priority_tier: p.priority_tier,
                        priority_job_factor: p.priority_job_factor,
                        default_time_seconds: p.default_time.map_or(0, |t| t.0),
                        max_time_seconds: p.max_time.map_or(0, |t| t.0),
                        max_nodes: p.max_nodes.unwrap_or(0),
                        preempt_mode: format!("{:?}", p.preempt_mode).to_lowercase(),
                        allow_qos: p
                            .allowed_qos
                            .iter()
                            .flatten()
                            .map(|q| q.to_string())
                            .collect(),
                        allow_accounts: p
                            .allowed_accounts
                            .iter()
                            .flatten()
                            .map(|a| a.to_string())
                            .collect(),
                        default_qos: p
                            .default_qos
                            .as_ref()
                            .map(|q| q.to_string())
                            .unwrap_or_default(),
                        charge_rate: p.charge_rate.as_f64(),
                        def_mem_per_cpu_mib: p.def_mem_per_cpu.map_or(0, |m| m.0),
                    }
                })
                .collect()
        })
        .await?;
        Ok(Response::new(pb::ListPartitionsResponse { partitions }))
    }

    async fn upsert_reservation(
        &self,
        request: Request<pb::Reservation>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        let actor = self.admin(&request).await?;
        let r = request.into_inner();
        let bad = |field: &str, e: &dyn std::fmt::Display| {
            Status::invalid_argument(format!("{field}: {e}"))
        };
        if r.start_unix_ms < 0 || r.end_unix_ms <= r.start_unix_ms {
            return Err(Status::invalid_argument(format!(
                "end_unix_ms: the reservation must end after it starts ({} .. {})",
                r.start_unix_ms, r.end_unix_ms
            )));
        }
        let nodes = docket_core::hostlist::expand(&r.nodes).map_err(|e| bad("nodes", &e))?;
        let reservation = docket_core::reservation::Reservation {
            name: r.name.parse().map_err(|e| bad("name", &e))?,
            nodes: nodes
                .iter()
                .map(|n| n.parse().map_err(|e| bad("nodes", &e)))
                .collect::<Result<BTreeSet<_>, _>>()?,
            start: TimeMs(r.start_unix_ms as u64),
            end: TimeMs(r.end_unix_ms as u64),
            users: r
                .users
                .iter()
                .map(|u| u.parse().map_err(|e| bad("users", &e)))
                .collect::<Result<_, _>>()?,
            accounts: r
                .accounts
                .iter()
                .map(|a| a.parse().map_err(|e| bad("accounts", &e)))
                .collect::<Result<_, _>>()?,
        };
        self.command(actor, Command::UpsertReservation(Box::new(reservation)))
            .await
    }

    async fn list_reservations(
        &self,
        request: Request<pb::ListReservationsRequest>,
    ) -> Result<Response<pb::ListReservationsResponse>, Status> {
        self.auth.caller(&request).await?;
        let reservations = crate::write::read(&self.replica, false, Duration::from_secs(5), |s| {
            s.reservations
                .values()
                .map(|r| {
                    let nodes: Vec<&str> = r.nodes.iter().map(|n| n.as_str()).collect();
                    pb::Reservation {
                        name: r.name.to_string(),
                        nodes: docket_core::hostlist::compress(&nodes),
                        start_unix_ms: r.start.0 as i64,
                        end_unix_ms: r.end.0 as i64,
                        users: r.users.iter().map(|u| u.to_string()).collect(),
                        accounts: r.accounts.iter().map(|a| a.to_string()).collect(),
                    }
                })
                .collect()
        })
        .await?;
        Ok(Response::new(pb::ListReservationsResponse { reservations }))
    }

    async fn scheduler_diagnostics(
        &self,
        request: Request<pb::DiagnosticsRequest>,
    ) -> Result<Response<pb::DiagnosticsResponse>, Status> {
        self.auth.caller(&request).await?;
        let stats = self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let jobs = self.replica.read_stale(|a| {
            let mut by_state: BTreeMap<String, u64> = BTreeMap::new();
            for job in a.machine.state.jobs.values() {
                *by_state.entry(job.state.name().to_owned()).or_default() += 1;
            }
            by_state
        });
        let me = self.replica.status();
        Ok(Response::new(pb::DiagnosticsResponse {
            replica: me.id.0,
            leader: me.role == Role::Leader,
            leaderships: stats.leaderships,
            passes: stats
                .passes
                .iter()
                .map(|(kind, s)| pb::PassDiagnostics {
                    pass: kind.name().into(),
                    runs: s.runs,
                    last_us: s.last_us,
                    mean_us: s.mean_us(),
                    max_us: s.max_us,
                    last_depth: s.last_depth,
                    max_depth: s.max_depth,
                    jobs_started: s.jobs_started,
                    stopped_early: s
                        .stopped_early
                        .iter()
                        .map(|(why, n)| format!("{why}={n}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                })
                .collect(),
            rpcs_in_flight: self.inflight.load(Ordering::Relaxed) as u64,
            jobs,
        }))
    }
}

/// One line saying what a configuration command does.
pub fn describe(command: &Command) -> String {
    match command {
        Command::SetConfig(_) => "set scheduler parameters".into(),
        Command::UpsertNode(n) => format!("upsert node {}", n.name),
        Command::UpsertPartition(p) => format!("upsert partition {}", p.name),
        Command::UpsertQos(q) => format!("upsert qos {}", q.name),
        Command::UpsertAccount { name, .. } => format!("upsert account {name}"),
        Command::UpsertUser { user, .. } => format!("upsert user {}", user.name),
        other => format!("{other:?}").chars().take(80).collect(),
    }
}
