//! One running replica: its storage, its Raft, its proposer, and the cluster operations an
//! operator (through the controller) performs on it.
//!
//! Lifecycle: [`Replica::open`] opens (or creates) the data directory and starts Raft, which
//! restores the latest snapshot and replays the committed log after it. The caller mounts
//! [`Replica::service`] on its gRPC server (or uses [`Replica::serve`] for a server of its
//! own). A brand-new cluster is started once with [`Replica::bootstrap`] on one replica;
//! replicas joining later are started empty and added by the leader
//! ([`Replica::add_learner`], [`Replica::add_voter`]). [`Replica::shutdown`] stops Raft; the
//! data directory closes when the last handle is gone.
//!
//! Membership changes, like writes, are made by the leader; asked elsewhere they fail with
//! [`ClusterError::NotLeader`] naming the leader, so the caller can go there.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use docket_proto::v1::raft_server::RaftServer;
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{ChangeMembers, SnapshotPolicy};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::db::{DataDir, DbError, FaultInjection};
use crate::election_gate::CommitSeen;
use crate::ids::{ReplicaAddr, ReplicaId};
use crate::log_store::{LogStore, persisted_vote};
use crate::machine::StateMachine;
use crate::machine_store::{Applied, MachineStore, OpenError};
use crate::network::{Channels, NetworkConfig, NetworkFactory, RaftGrpc};
use crate::proposer::{Proposer, ProposerConfig, WriteError};
use crate::read::ReadError;
use crate::read_index::{ReadIndexer, Reopened};
use crate::status::{ReplicaStatus, Role};
use crate::types::Raft;

/// Raft timing and log-compaction settings.
#[derive(Debug, Clone)]
pub struct RaftTuning {
    /// How often the leader sends heartbeats. Also openraft's deadline for one append RPC
    /// (which includes the follower's fsync), so not too short on a loaded machine.
    pub heartbeat: Duration,
    /// A follower that hears nothing for a random time in this range starts an election.
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Build a snapshot after this many entries since the last one.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot (so a slightly lagging replica catches up
    /// from the log rather than by snapshot).
    pub keep_entries_after_snapshot: u64,
    /// Size of one snapshot chunk on the wire.
    pub snapshot_chunk_bytes: u64,
    /// Most entries in one append RPC.
    pub max_entries_per_append: u64,
}

impl Default for RaftTuning {
    fn default() -> Self {
        RaftTuning {
            heartbeat: Duration::from_millis(150),
            election_timeout_min: Duration::from_millis(750),
            election_timeout_max: Duration::from_millis(1500),
            snapshot_every_entries: 10_000,
            keep_entries_after_snapshot: 1_000,
            snapshot_chunk_bytes: 4 << 20,
            max_entries_per_append: 1_000,
        }
    }
}

/// Everything a replica needs to start.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    pub id: ReplicaId,
    /// The `host:port` other replicas reach this one at.
    pub addr: String,
    /// The replica's data directory (RocksDB and snapshot files).
    pub data_dir: PathBuf,
    /// The cluster's name; replicas of different clusters refuse each other.
    pub cluster_name: String,
    pub tuning: RaftTuning,
    pub network: NetworkConfig,
    pub proposer: ProposerConfig,
    /// Where this replica serves its status page (an `http://` or `https://` URL), reported
    /// in its [`ReplicaStatus`] so other replicas' pages can link to the leader's.
    pub status_page: Option<String>,
    /// The newest command version the machine's build applies, reported in its status so a
    /// leader knows when every replica can apply a newer one.
    pub app_version: Option<u16>,
}

impl ReplicaConfig {
    /// Defaults for replica `id` at `addr` with data in `data_dir`.
    pub fn new(id: u64, addr: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        ReplicaConfig {
            id: ReplicaId(id),
            addr: addr.into(),
            data_dir: data_dir.into(),
            cluster_name: "docket".into(),
            tuning: RaftTuning::default(),
            network: NetworkConfig::default(),
            proposer: ProposerConfig::default(),
            status_page: None,
            app_version: None,
        }
    }

    /// Checks the settings that openraft does not: one log entry must fit in one message.
    pub fn validate(&self) -> Result<(), ReplicaError> {
        // Room for the entry's framing and the append request around it.
        const ENVELOPE: usize = 64 << 10;
        let limit = self.network.max_message_bytes;
        if self.proposer.max_batch_bytes + ENVELOPE > limit {
            return Err(ReplicaError::Invalid(format!(
                "proposer.max_batch_bytes ({}) plus {ENVELOPE} bytes of envelope must fit in \
                 network.max_message_bytes ({limit})",
                self.proposer.max_batch_bytes
            )));
        }
        if self.tuning.snapshot_chunk_bytes as usize + ENVELOPE > limit {
            return Err(ReplicaError::Invalid(format!(
                "tuning.snapshot_chunk_bytes ({}) plus {ENVELOPE} bytes of envelope must fit in \
                 network.max_message_bytes ({limit})",
                self.tuning.snapshot_chunk_bytes
            )));
        }
        if self.proposer.max_batch_commands == 0 || self.proposer.max_in_flight == 0 {
            return Err(ReplicaError::Invalid(
                "proposer.max_batch_commands and proposer.max_in_flight must be at least 1".into(),
            ));
        }
        const MAX_HOLD: std::time::Duration = std::time::Duration::from_millis(100);
        if self.proposer.busy_hold > MAX_HOLD {
            return Err(ReplicaError::Invalid(format!(
                "proposer.busy_hold ({:?}) must be at most {MAX_HOLD:?}: every write may wait it",
                self.proposer.busy_hold
            )));
        }
        Ok(())
    }

    fn openraft_config(&self) -> Result<openraft::Config, openraft::ConfigError> {
        let t = &self.tuning;
        openraft::Config {
            cluster_name: self.cluster_name.clone(),
            heartbeat_interval: t.heartbeat.as_millis() as u64,
            election_timeout_min: t.election_timeout_min.as_millis() as u64,
            election_timeout_max: t.election_timeout_max.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(t.snapshot_every_entries),
            max_in_snapshot_log_to_keep: t.keep_entries_after_snapshot,
            snapshot_max_chunk_size: t.snapshot_chunk_bytes,
            max_payload_entries: t.max_entries_per_append,
            ..Default::default()
        }
        .validate()
    }
}

/// Starting a replica failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Machine(#[from] OpenError),
    #[error("invalid Raft settings: {0}")]
    Config(#[from] openraft::ConfigError),
    #[error("invalid replica settings: {0}")]
    Invalid(String),
    #[error("starting the WAL sync thread: {0}")]
    Thread(std::io::Error),
    #[error("starting Raft: {0}")]
    Raft(String),
}

/// A cluster operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error("replica {asked} is not the leader{}; ask the leader", match (leader, leader_addr) {
        (Some(id), Some(addr)) => format!(" (the leader is {id} at {addr})"),
        _ => " (no leader is known yet)".to_owned(),
    })]
    NotLeader {
        asked: ReplicaId,
        leader: Option<ReplicaId>,
        leader_addr: Option<String>,
    },
    #[error("the cluster is already initialized; bootstrap runs once, on a new cluster")]
    AlreadyInitialized,
    #[error("membership change refused: {0}")]
    Refused(String),
    #[error("this replica has stopped: {0}")]
    Stopped(String),
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
}

/// A running replica. Cheap to clone; clones share everything.
pub struct Replica<M: StateMachine> {
    id: ReplicaId,
    addr: String,
    raft: Raft<M>,
    machine: MachineStore<M>,
    proposer: Proposer<M>,
    channels: Channels,
    faults: FaultInjection,
    db: Arc<DataDir>,
    max_message_bytes: usize,
    status_page: Option<String>,
    app_version: Option<u16>,
    commit_seen: CommitSeen,
    /// Whether this replica's leader is lost ([`Replica::leader_lost`]).
    contact: crate::leader_contact::LeaderContact,
    /// Read indexes for linearizable reads ([`crate::read_index`]).
    reads: ReadIndexer<M>,
}

impl<M: StateMachine> Clone for Replica<M> {
    fn clone(&self) -> Self {
        Replica {
            id: self.id,
            addr: self.addr.clone(),
            raft: self.raft.clone(),
            machine: self.machine.clone(),
            proposer: self.proposer.clone(),
            channels: self.channels.clone(),
            faults: self.faults.clone(),
            db: self.db.clone(),
            max_message_bytes: self.max_message_bytes,
            status_page: self.status_page.clone(),
            app_version: self.app_version,
            commit_seen: self.commit_seen.clone(),
            contact: self.contact.clone(),
            reads: self.reads.clone(),
        }
    }
}

impl<M: StateMachine> std::fmt::Debug for Replica<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.id)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl<M: StateMachine> Replica<M> {
    /// Opens the replica's data directory and starts Raft, talking to peers over TCP.
    /// `fresh` is the machine's empty state.
    pub async fn open(config: ReplicaConfig, fresh: M) -> Result<Self, ReplicaError> {
        let channels = Channels::tcp(config.network.clone());
        Self::open_with_channels(config, fresh, channels).await
    }

    /// Like [`Replica::open`], reaching peers through `channels` (an injected transport).
    pub async fn open_with_channels(
        config: ReplicaConfig,
        fresh: M,
        channels: Channels,
    ) -> Result<Self, ReplicaError> {
        config.validate()?;
        let raft_config = Arc::new(config.openraft_config()?);
        let db = Arc::new(DataDir::open(&config.data_dir)?);
        let faults = db.faults().clone();
        let log = LogStore::<M>::new(db.clone()).map_err(ReplicaError::Thread)?;
        let memberships = log.memberships();
        let reopened = Reopened {
            leadership: persisted_vote(&db)
                .map_err(|e| ReplicaError::Raft(e.to_string()))?
                .map(|v| *v.leader_id()),
            last_index: log
                .last_entry_log_id()
                .map_err(|e| ReplicaError::Raft(e.to_string()))?
                .map(|id| id.index),
        };
        let machine = MachineStore::open(db.clone(), fresh)?;
        let network = NetworkFactory::new(config.id, channels.clone());
        let raft = openraft::Raft::new(config.id, raft_config, network, log, machine.clone())
            .await
            .map_err(|e| ReplicaError::Raft(e.to_string()))?;
        let commit_seen = CommitSeen::default();
        let contact = crate::leader_contact::LeaderContact {
            seen: commit_seen.clone(),
            lease: config.tuning.election_timeout_max,
        };
        let proposer = Proposer::start(
            raft.clone(),
            channels.clone(),
            config.proposer.clone(),
            contact.clone(),
        );
        crate::election_gate::spawn(
            raft.clone(),
            commit_seen.clone(),
            config.tuning.heartbeat,
            // Within openraft's own first expiry (lease + a timeout in MIN..MAX), so a cluster
            // restarted whole keeps the random timeouts that spread its first candidates.
            config.tuning.election_timeout_max + config.tuning.election_timeout_min,
        );
        crate::leader_watch::spawn(
            raft.clone(),
            channels.clone(),
            commit_seen.clone(),
            config.tuning.heartbeat,
            config.tuning.election_timeout_max,
        );
        let reads = ReadIndexer::new(
            config.id,
            raft.clone(),
            db.clone(),
            machine.clone(),
            channels.clone(),
            (memberships, reopened),
            config.tuning.heartbeat,
        );
        Ok(Replica {
            id: config.id,
            addr: config.addr,
            reads,
            raft,
            machine,
            proposer,
            channels,
            faults,
            db,
            max_message_bytes: config.network.max_message_bytes,
            status_page: config.status_page,
            app_version: config.app_version,
            commit_seen,
            contact,
        })
    }

    pub fn id(&self) -> ReplicaId {
        self.id
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The channels this replica reaches its peers through (to ask them for their status
    /// over the same transport).
    pub fn channels(&self) -> &Channels {
        &self.channels
    }

    /// The fault switch of this replica's data directory (tests only).
    /// What RocksDB holds in memory for this replica's log and metadata.
    pub fn rocks_memory(&self) -> crate::rocks_memory::RocksMemory {
        self.db.memory()
    }

    pub fn faults(&self) -> &FaultInjection {
        &self.faults
    }

    /// openraft's handle, for what this type does not wrap.
    pub fn raft(&self) -> &Raft<M> {
        &self.raft
    }

    /// The `docket.v1.Raft` gRPC service of this replica, to mount on a tonic server behind a
    /// layer that proves which replica calls ([`crate::network::PeerReplica`]): a call
    /// without that proof is refused, `Status` excepted.
    pub fn service(&self) -> RaftServer<RaftGrpc<M>> {
        self.service_with(crate::network::PeerProof::Required)
    }

    /// The Raft service for a transport that proves which replica calls
    /// ([`crate::network::PeerProof`]) or not.
    fn service_with(&self, proof: crate::network::PeerProof) -> RaftServer<RaftGrpc<M>> {
        let parts = crate::network::service::ServiceParts {
            raft: self.raft.clone(),
            proposer: self.proposer.clone(),
            machine: self.machine.clone(),
            max_message_bytes: self.max_message_bytes,
            status_page: self.status_page.clone(),
            app_version: self.app_version,
            commit_seen: self.commit_seen.clone(),
            reads: self.reads.clone(),
        };
        RaftGrpc::server(parts, proof)
    }

    /// Serves this replica's Raft service alone on `listener`, over plain TCP that proves no
    /// caller (loopback tests, the KV benchmark), until the returned handle is stopped.
    pub fn serve(&self, listener: tokio::net::TcpListener) -> std::io::Result<ServerHandle> {
        let local = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        // Plain TCP proves no caller: calls are taken on their word (loopback only).
        let service = self.service_with(crate::network::PeerProof::NotAvailable);
        let task = tokio::spawn(async move {
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await
            {
                tracing::error!(error = %e, "raft gRPC server failed");
            }
        });
        Ok(ServerHandle {
            local,
            stop: Some(stop),
            task,
        })
    }

    /// Starts a new cluster whose voters are `members` (id to address; this replica among
    /// them). Run once, on one replica of a cluster that has never run.
    pub async fn bootstrap(
        &self,
        members: BTreeMap<ReplicaId, String>,
    ) -> Result<(), ClusterError> {
        let members: BTreeMap<ReplicaId, ReplicaAddr> = members
            .into_iter()
            .map(|(id, addr)| (id, ReplicaAddr { addr }))
            .collect();
        match self.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                Err(ClusterError::AlreadyInitialized)
            }
            Err(RaftError::APIError(e)) => Err(ClusterError::Refused(e.to_string())),
            Err(RaftError::Fatal(e)) => Err(ClusterError::Stopped(e.to_string())),
        }
    }

    /// Whether this replica belongs to an initialized cluster (has a log or a vote).
    pub async fn is_initialized(&self) -> Result<bool, ClusterError> {
        self.raft
            .is_initialized()
            .await
            .map_err(|e| ClusterError::Stopped(e.to_string()))
    }

    /// Adds replica `id` at `addr` as a learner and returns once it has caught up with the log.
    pub async fn add_learner(&self, id: ReplicaId, addr: &str) -> Result<(), ClusterError> {
        let node = ReplicaAddr {
            addr: addr.to_owned(),
        };
        self.membership_result(self.raft.add_learner(id, node, true).await)
    }

    /// Adds replica `id` at `addr` as a voter: first as a learner until it has caught up, then
    /// into the voting set.
    pub async fn add_voter(&self, id: ReplicaId, addr: &str) -> Result<(), ClusterError> {
        self.add_learner(id, addr).await?;
        self.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
            .await
    }

    /// Removes replica `id` from the cluster (voter or learner). The removed replica stops
    /// receiving the log; its process and data directory are the operator's to retire.
    pub async fn remove(&self, id: ReplicaId) -> Result<(), ClusterError> {
        let status = self.status();
        let is_voter = status.members.iter().any(|m| m.id == id && m.voter);
        // Removing a voter without retaining it as a learner removes the node too. A second
        // change would be asked of a leader that, when it removed itself, is no longer a
        // member (openraft asserts a leader is in its membership).
        let change = if is_voter {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        self.change_membership(change).await
    }

    /// Makes exactly `voters` the voting set (each must already be a member).
    pub async fn set_voters(&self, voters: BTreeSet<ReplicaId>) -> Result<(), ClusterError> {
        self.change_membership(ChangeMembers::ReplaceAllVoters(voters))
            .await
    }

    async fn change_membership(
        &self,
        change: ChangeMembers<ReplicaId, ReplicaAddr>,
    ) -> Result<(), ClusterError> {
        let result = self.raft.change_membership(change, false).await;
        self.membership_result(result)
    }

    fn membership_result<T>(
        &self,
        result: Result<T, RaftError<ReplicaId, ClientWriteError<ReplicaId, ReplicaAddr>>>,
    ) -> Result<(), ClusterError> {
        match result {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(ClusterError::NotLeader {
                    asked: self.id,
                    leader: f.leader_id,
                    leader_addr: f.leader_node.map(|n| n.addr),
                })
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(ClusterError::Refused(e.to_string()))
            }
            Err(RaftError::Fatal(e)) => Err(ClusterError::Stopped(e.to_string())),
        }
    }

    /// This replica's view of the cluster.
    pub fn status(&self) -> ReplicaStatus {
        let mut status = ReplicaStatus::from_metrics(&self.raft.metrics().borrow());
        status.status_page.clone_from(&self.status_page);
        status.app_version = self.app_version;
        status
    }

    /// Whether the leader a write through this replica would go to is lost
    /// ([`crate::leader_contact`]): leading, no quorum has acknowledged this replica for
    /// openraft's lease; following, it has not heard from its leader for as long. The others
    /// elect a new leader then; what serves only the leader should stop serving.
    pub fn leader_lost(&self) -> bool {
        self.contact.lost_now(&self.raft.metrics().borrow())
    }

    /// Waits until some replica is known to lead, and returns its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<ReplicaId, ClusterError> {
        let metrics = self
            .raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "a leader")
            .await
            .map_err(|e| ClusterError::Timeout(timeout, e.to_string()))?;
        metrics
            .current_leader
            .ok_or_else(|| ClusterError::Timeout(timeout, "a leader".into()))
    }

    /// Waits until this replica has applied log index `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<(), ClusterError> {
        self.raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "applied index")
            .await
            .map(|_| ())
            .map_err(|e| ClusterError::Timeout(timeout, e.to_string()))
    }

    /// Writes `commands` (see [`crate::proposer`]) and returns the machine's responses.
    pub async fn write(&self, commands: Vec<M::Command>) -> Result<Vec<M::Response>, WriteError> {
        self.proposer.write(commands).await
    }

    /// Writes one command and returns its response.
    pub async fn write_one(&self, command: M::Command) -> Result<M::Response, WriteError> {
        let mut responses = self.write(vec![command]).await?;
        responses
            .pop()
            .ok_or_else(|| WriteError::Indeterminate("the machine gave no response".into()))
    }

    /// How the read indexes this replica named as leader were confirmed
    /// ([`crate::read_index`]): (from a quorum's saved votes, by openraft's check).
    pub fn read_index_counts(&self) -> (u64, u64) {
        self.reads.counts().get()
    }

    /// Reads what this replica has applied, without asking anyone (may be behind the leader).
    pub fn read_stale<T>(&self, f: impl FnOnce(&Applied<M>) -> T) -> T {
        self.machine.read(f)
    }

    /// Reads after every write acknowledged before the call is applied here (see
    /// [`crate::read`]), waiting at most `timeout` for this replica to catch up.
    pub async fn read_linearizable<T>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&Applied<M>) -> T,
    ) -> Result<T, ReadError> {
        let status = self.status();
        let read_index = match (status.role, status.leader.zip(status.leader_addr)) {
            (Role::Leader, _) => self.reads.read_index(None).await?,
            (Role::Shutdown, _) => {
                return Err(ReadError::Stopped(status.stopped.unwrap_or_default()));
            }
            (_, None) => return Err(ReadError::NoLeader),
            (_, Some((leader, addr))) => {
                let request = self.reads.request();
                self.channels
                    .read_index(leader, &addr, &request, timeout)
                    .await?
            }
        };
        // On the machine's own record of what it applied, not openraft's metrics, which its
        // core publishes only between log flushes.
        if let Some(index) = read_index
            && !self.machine.wait_applied(index, timeout).await
        {
            return Err(ReadError::Lagging {
                index,
                timeout_ms: timeout.as_millis() as u64,
            });
        }
        Ok(self.machine.read(f))
    }

    /// Asks Raft to build a snapshot now (normally it does so every
    /// [`RaftTuning::snapshot_every_entries`]).
    pub async fn trigger_snapshot(&self) -> Result<(), ClusterError> {
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| ClusterError::Stopped(e.to_string()))
    }

    /// Stops Raft. In-flight writes fail; the data directory closes once every handle to this
    /// replica (and its server) is gone.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(replica = %self.id, error = %e, "raft shutdown");
        }
    }
}

/// A running gRPC server started by [`Replica::serve`].
#[derive(Debug)]
pub struct ServerHandle {
    local: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl ServerHandle {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stops accepting, lets running RPCs finish, and waits for the server to end.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Drops every connection at once, as a crash would.
    pub fn abort(self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_longer_than_a_tenth_of_a_second_is_refused_naming_the_field() {
        let mut config = ReplicaConfig::new(1, "127.0.0.1:1", "/nonexistent");
        assert!(config.validate().is_ok());
        config.proposer.busy_hold = std::time::Duration::from_millis(101);
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("proposer.busy_hold"), "{err}");
        config.proposer.busy_hold = std::time::Duration::from_millis(100);
        assert!(config.validate().is_ok());
    }
}
