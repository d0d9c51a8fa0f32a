//! The client side of the Raft transport: openraft's `RaftNetworkFactory` and `RaftNetwork`
//! over tonic, and forwarding of writes to the leader.
//!
//! One tonic `Channel` per peer address, made lazily and kept for the life of the replica:
//! openraft creates a new network client whenever it restarts replication to a peer, and every
//! one of them shares the peer's connection (tonic reconnects by itself after a failure).
//!
//! Failures map to openraft's kinds so its replication backs off or retries correctly:
//! - the peer cannot be reached (refused, reset, no route: tonic's `Unavailable`) →
//!   `Unreachable`, after which openraft backs off;
//! - the RPC's deadline (`RPCOption::soft_ttl`) passed → `Timeout`;
//! - the peer answered with a Raft error → `RemoteError`;
//! - anything else (a malformed answer, another status) → `Network`, retried at once;
//! - an append larger than the message limit → `PayloadTooLarge`, so fewer entries are sent.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use docket_proto::v1::RaftPayload;
use docket_proto::v1::raft_client::RaftClient;
use openraft::RPCTypes;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};

use super::NetworkConfig;
use crate::codec::{decode, encode};
use crate::ids::{ReplicaAddr, ReplicaId};
use crate::machine::StateMachine;
use crate::proposer::WriteError;
use crate::read::ReadError;
use crate::read_index::{ConfirmLeaderRequest, ReadIndexRequest};
use crate::status::ReplicaStatus;
use crate::types::{RaftError, RpcError, TypeConfig};

/// Builds the channel to a peer address (`host:port`): to the replica named, which must
/// prove it is that one (a TLS maker checks its certificate), or to whichever replica is
/// there when none is named (status probes by address). The default connects over TCP,
/// lazily, and proves nothing.
pub type ChannelMaker =
    Arc<dyn Fn(Option<ReplicaId>, &str) -> Result<Channel, String> + Send + Sync>;

/// How long a forwarded write may take, from sending it to the leader to its answer.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Which channel: the address, and the replica that must answer there (None: any).
type ChannelKey = (Option<ReplicaId>, String);

/// The channels to every peer this replica has talked to, one per address and replica
/// expected there, and what each voter last answered this replica's vote requests. Cheap to
/// clone; clones share.
#[derive(Clone)]
pub struct Channels {
    cache: Arc<Mutex<HashMap<ChannelKey, Channel>>>,
    maker: ChannelMaker,
    config: NetworkConfig,
    votes: Arc<Mutex<HashMap<ReplicaId, VoteAnswer>>>,
}

/// A voter's answer to one of this replica's vote requests, as the leader watch needs it to
/// tell a refused stand from one still being answered ([`crate::leader_watch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VoteAnswer {
    /// The term the vote was asked for.
    pub term: u64,
    pub granted: bool,
    /// The voter's last log id is above the candidate's (openraft's order: the leader id
    /// that wrote it, then the index): it refused for the candidate's log.
    pub voter_log_newer: bool,
}

impl std::fmt::Debug for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channels")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Channels {
    /// Channels over TCP.
    pub fn tcp(config: NetworkConfig) -> Self {
        let connect_timeout = config.connect_timeout;
        let maker: ChannelMaker = Arc::new(move |_, addr: &str| {
            let endpoint = Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| format!("bad replica address {addr:?}: {e}"))?
                .connect_timeout(connect_timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5));
            Ok(endpoint.connect_lazy())
        });
        Self::with_maker(config, maker)
    }

    /// Channels built by `maker` (a simulated network, a TLS connector, ...).
    pub fn with_maker(config: NetworkConfig, maker: ChannelMaker) -> Self {
        Channels {
            cache: Arc::new(Mutex::new(HashMap::new())),
            maker,
            config,
            votes: Arc::default(),
        }
    }

    /// What voter `id` last answered a vote request of this replica's (None: it has not
    /// answered one since this replica started, or the answer never came).
    pub fn vote_answer(&self, id: ReplicaId) -> Option<VoteAnswer> {
        self.votes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .copied()
    }

    /// Notes `answer` from voter `id`, unless an answer for a later term is noted already
    /// (a late answer to an earlier request).
    fn note_vote_answer(&self, id: ReplicaId, answer: VoteAnswer) {
        let mut votes = self.votes.lock().unwrap_or_else(|p| p.into_inner());
        if votes.get(&id).is_none_or(|noted| noted.term <= answer.term) {
            votes.insert(id, answer);
        }
    }

    /// The limits in force.
    pub fn config(&self) -> &NetworkConfig {
        &self.config
    }

    /// A client for the Raft service of whichever replica is at `addr` (status probes), on
    /// the shared channel.
    pub fn client(&self, addr: &str) -> Result<RaftClient<Channel>, String> {
        self.client_of(None, addr)
    }

    /// A client for the Raft service of replica `to` at `addr` (a peer's Raft messages,
    /// forwarded writes and reads), or of whichever replica is there when `to` is None.
    pub fn client_of(
        &self,
        to: Option<ReplicaId>,
        addr: &str,
    ) -> Result<RaftClient<Channel>, String> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let key = (to, addr.to_owned());
        let channel = match cache.get(&key) {
            Some(channel) => channel.clone(),
            None => {
                let channel = (self.maker)(to, addr)?;
                cache.insert(key, channel.clone());
                channel
            }
        };
        Ok(RaftClient::new(channel)
            .max_decoding_message_size(self.config.max_message_bytes)
            .max_encoding_message_size(self.config.max_message_bytes))
    }

    /// Sends `commands` to the leader `leader` at `addr` and returns its responses once
    /// applied.
    pub async fn forward<M: StateMachine>(
        &self,
        leader: ReplicaId,
        addr: &str,
        commands: Vec<M::Command>,
    ) -> Result<Vec<M::Response>, WriteError> {
        let mut client = self
            .client_of(Some(leader), addr)
            .map_err(WriteError::Indeterminate)?;
        let data = encode(&commands)
            .map_err(|e| WriteError::Stopped(format!("cannot encode the commands: {e}")))?;
        let call = client.forward(RaftPayload { data });
        let reply = match tokio::time::timeout(FORWARD_TIMEOUT, call).await {
            Err(_) => {
                return Err(WriteError::Indeterminate(format!(
                    "no answer from the leader at {addr} within {FORWARD_TIMEOUT:?}"
                )));
            }
            // No connection could be made (refused, unreachable, a handshake that failed, a
            // server that is not the leader named): the request never left, so it was not
            // applied.
            Ok(Err(status)) if never_sent(&status) => return Err(WriteError::NoLeader),
            Ok(Err(status)) => {
                return Err(WriteError::Indeterminate(format!(
                    "forwarding to the leader at {addr}: {status}"
                )));
            }
            Ok(Ok(reply)) => reply.into_inner(),
        };
        decode::<Result<Vec<M::Response>, WriteError>>(&reply.data).map_err(|e| {
            WriteError::Indeterminate(format!("malformed answer from the leader at {addr}: {e}"))
        })?
    }
}

impl Channels {
    /// Asks the leader `leader` at `addr` for the read index (see [`crate::read_index`]).
    pub async fn read_index(
        &self,
        leader: ReplicaId,
        addr: &str,
        request: &ReadIndexRequest,
        ttl: Duration,
    ) -> Result<Option<u64>, ReadError> {
        let unreachable = |message: String| ReadError::LeaderUnreachable {
            addr: addr.to_owned(),
            message,
        };
        let mut client = self.client_of(Some(leader), addr).map_err(unreachable)?;
        let data = encode(request).map_err(|e| unreachable(e.to_string()))?;
        let reply = match tokio::time::timeout(ttl, client.read_index(RaftPayload { data })).await {
            Err(_) => return Err(unreachable(format!("no answer within {ttl:?}"))),
            Ok(Err(status)) => return Err(unreachable(status.to_string())),
            Ok(Ok(reply)) => reply.into_inner(),
        };
        decode::<Result<Option<u64>, ReadError>>(&reply.data)
            .map_err(|e| unreachable(format!("malformed answer: {e}")))?
    }

    /// Whether the replica at `addr` answers, within `ttl`, that it is `request.to` and its
    /// saved vote holds `request.leadership` ([`crate::read_index`]). Any failure is a no.
    pub async fn confirm_leader(
        &self,
        addr: &str,
        request: &ConfirmLeaderRequest,
        ttl: Duration,
    ) -> bool {
        let answer = async {
            let mut client = self.client_of(Some(request.to), addr)?;
            let data = encode(request).map_err(|e| e.to_string())?;
            let call = client.confirm_leader(RaftPayload { data });
            let reply = match tokio::time::timeout(ttl, call).await {
                Err(_) => return Err(format!("no answer within {ttl:?}")),
                Ok(Err(status)) => return Err(status.to_string()),
                Ok(Ok(reply)) => reply.into_inner(),
            };
            decode::<bool>(&reply.data).map_err(|e| format!("malformed answer: {e}"))
        };
        answer.await.unwrap_or_else(|e| {
            tracing::debug!(%addr, error = %e, "no confirmation of the leadership");
            false
        })
    }

    /// Whether the replica at `addr` is certainly gone: a connection to it is refused or
    /// unreachable (its process or host is down), as opposed to slow or silent.
    pub async fn certainly_gone(&self, addr: &str, ttl: Duration) -> bool {
        self.probe(addr, ttl).await == Probe::Gone
    }

    /// Asks the replica at `addr` for its status, waiting at most `ttl`, and tells only how
    /// it answered (see [`Probe`]).
    pub async fn probe(&self, addr: &str, ttl: Duration) -> Probe {
        let Ok(mut client) = self.client(addr) else {
            return Probe::Unknown;
        };
        let Ok(data) = encode(&()) else {
            return Probe::Unknown;
        };
        match tokio::time::timeout(ttl, client.status(RaftPayload { data })).await {
            Err(_) => Probe::Silent,
            Ok(Err(status)) if connect_failed(&status) => Probe::Gone,
            Ok(_) => Probe::Answered,
        }
    }

    /// Asks the replica at `addr` for its status.
    pub async fn status(&self, addr: &str, ttl: Duration) -> Result<ReplicaStatus, String> {
        self.status_of(None, addr, ttl).await
    }

    /// Asks replica `to` at `addr` (whichever is there when None) for its status.
    pub async fn status_of(
        &self,
        to: Option<ReplicaId>,
        addr: &str,
        ttl: Duration,
    ) -> Result<ReplicaStatus, String> {
        let mut client = self.client_of(to, addr)?;
        let data = encode(&()).map_err(|e| e.to_string())?;
        let reply = match tokio::time::timeout(ttl, client.status(RaftPayload { data })).await {
            Err(_) => return Err(format!("{addr}: no answer within {ttl:?}")),
            Ok(Err(status)) => return Err(format!("{addr}: {status}")),
            Ok(Ok(reply)) => reply.into_inner(),
        };
        decode(&reply.data).map_err(|e| format!("{addr}: malformed status: {e}"))
    }
}

/// How a replica answered a status request ([`Channels::probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// It answered, with its status or an error of its own: its process runs and reads.
    Answered,
    /// No connection could be made (refused, unreachable): its process or host is gone.
    Gone,
    /// Nothing came back in time: it is stopped, cut off, or too loaded to answer.
    Silent,
    /// It could not be asked (its address is not one): nothing is known.
    Unknown,
}

/// `status`'s sources, the nearest first.
fn sources(status: &tonic::Status) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    std::iter::successors(std::error::Error::source(status), |e| e.source())
}

/// True when `status` reports that no connection could be made (refused, unreachable, timed
/// out connecting): the request was never sent. Found by walking the error's sources for the
/// I/O error of a failed connect.
pub fn connect_failed(status: &tonic::Status) -> bool {
    sources(status)
        .find_map(|e| e.downcast_ref::<std::io::Error>())
        .is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::AddrNotAvailable
            )
        })
}

/// True when `status` says the call's connection was never made, so nothing of the call was
/// sent: a failed connect ([`connect_failed`]) or any failure of the connector (tonic wraps
/// those, and only those, in a `ConnectError`: a TLS handshake refused, a server whose
/// certificate names another replica than the one dialled).
pub fn never_sent(status: &tonic::Status) -> bool {
    connect_failed(status) || sources(status).any(|e| e.is::<tonic::ConnectError>())
}

/// openraft's network factory: one [`Peer`] per target, sharing [`Channels`].
#[derive(Debug, Clone)]
pub struct NetworkFactory {
    id: ReplicaId,
    channels: Channels,
}

impl NetworkFactory {
    /// The factory of replica `id`.
    pub fn new(id: ReplicaId, channels: Channels) -> Self {
        NetworkFactory { id, channels }
    }
}

impl<M: StateMachine> RaftNetworkFactory<TypeConfig<M>> for NetworkFactory {
    type Network = Peer;

    async fn new_client(&mut self, target: ReplicaId, node: &ReplicaAddr) -> Peer {
        Peer {
            id: self.id,
            target,
            node: node.clone(),
            channels: self.channels.clone(),
        }
    }
}

/// The connection from this replica to one peer.
#[derive(Debug)]
pub struct Peer {
    id: ReplicaId,
    target: ReplicaId,
    node: ReplicaAddr,
    channels: Channels,
}

/// A transport failure, before it is typed for the RPC at hand.
enum Failure {
    Unreachable(String),
    Timeout,
    Network(String),
    TooLarge(usize),
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Message(String);

impl Peer {
    /// Sends `request` through `call` and decodes the answer, within `ttl`.
    async fn unary<Req, Resp, E, F, Fut>(
        &self,
        request: &Req,
        ttl: Duration,
        call: F,
    ) -> Result<Result<Resp, RaftError<E>>, Failure>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: DeserializeOwned + std::error::Error,
        F: FnOnce(RaftClient<Channel>, RaftPayload) -> Fut,
        Fut: Future<Output = Result<tonic::Response<RaftPayload>, tonic::Status>>,
    {
        let data = encode(request).map_err(|e| Failure::Network(format!("encode: {e}")))?;
        if data.len() > self.channels.config().max_message_bytes {
            return Err(Failure::TooLarge(data.len()));
        }
        let client = self
            .channels
            .client_of(Some(self.target), &self.node.addr)
            .map_err(Failure::Unreachable)?;
        let reply = match tokio::time::timeout(ttl, call(client, RaftPayload { data })).await {
            Err(_) => return Err(Failure::Timeout),
            Ok(Err(status)) => {
                return Err(match status.code() {
                    tonic::Code::Unavailable => Failure::Unreachable(status.to_string()),
                    tonic::Code::DeadlineExceeded => Failure::Timeout,
                    _ => Failure::Network(status.to_string()),
                });
            }
            Ok(Ok(reply)) => reply.into_inner(),
        };
        decode(&reply.data).map_err(|e| Failure::Network(format!("malformed answer: {e}")))
    }

    /// Types a failure or a remote error for openraft.
    fn typed<Resp, E: std::error::Error>(
        &self,
        action: RPCTypes,
        ttl: Duration,
        outcome: Result<Result<Resp, RaftError<E>>, Failure>,
        entries: u64,
    ) -> Result<Resp, RpcError<E>> {
        match outcome {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(remote)) => Err(RpcError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                remote,
            ))),
            Err(Failure::Unreachable(msg)) => {
                Err(RpcError::Unreachable(Unreachable::new(&Message(msg))))
            }
            Err(Failure::Timeout) => Err(RpcError::Timeout(Timeout {
                action,
                id: self.id,
                target: self.target,
                timeout: ttl,
            })),
            Err(Failure::TooLarge(size)) if action == RPCTypes::AppendEntries && entries > 1 => {
                tracing::debug!(target = %self.target, size, entries, "append too large; asking openraft to send fewer entries");
                Err(RpcError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint((entries / 2).max(1)),
                ))
            }
            Err(Failure::TooLarge(size)) => {
                Err(RpcError::Network(NetworkError::new(&Message(format!(
                    "{action} message of {size} bytes is over the {}-byte limit",
                    self.channels.config().max_message_bytes
                )))))
            }
            Err(Failure::Network(msg)) => Err(RpcError::Network(NetworkError::new(&Message(msg)))),
        }
    }
}

impl<M: StateMachine> RaftNetwork<TypeConfig<M>> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig<M>>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<ReplicaId>, RpcError> {
        let ttl = option.soft_ttl();
        let entries = rpc.entries.len() as u64;
        let outcome = self
            .unary(
                &rpc,
                ttl,
                |mut c, p| async move { c.append_entries(p).await },
            )
            .await;
        self.typed(RPCTypes::AppendEntries, ttl, outcome, entries)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig<M>>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<ReplicaId>, RpcError<InstallSnapshotError>> {
        let ttl = option.soft_ttl();
        let outcome = self
            .unary(
                &rpc,
                ttl,
                |mut c, p| async move { c.install_snapshot(p).await },
            )
            .await;
        self.typed(RPCTypes::InstallSnapshot, ttl, outcome, 0)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<ReplicaId>,
        option: RPCOption,
    ) -> Result<VoteResponse<ReplicaId>, RpcError> {
        let ttl = option.soft_ttl();
        let outcome = self
            .unary(&rpc, ttl, |mut c, p| async move { c.vote(p).await })
            .await;
        let answer: Result<VoteResponse<ReplicaId>, RpcError> =
            self.typed(RPCTypes::Vote, ttl, outcome, 0);
        if let Ok(response) = &answer {
            self.channels.note_vote_answer(
                self.target,
                VoteAnswer {
                    term: rpc.vote.leader_id().term,
                    granted: response.vote_granted,
                    voter_log_newer: response.last_log_id > rpc.last_log_id,
                },
            );
        }
        answer
    }
}
