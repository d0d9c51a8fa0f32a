//! The server side of the Raft transport: the `docket.v1.Raft` gRPC service.
//!
//! Each RPC decodes openraft's request, hands it to the local Raft, and encodes the `Result`
//! it returns, so a Raft-level refusal (a stale term, a vote denied) travels as data and the
//! caller sees it as a remote error. A payload that does not decode is refused with
//! `INVALID_ARGUMENT` naming the RPC, and changes nothing; so is an append whose entries do
//! not follow on from its `prev_log_id` in order (openraft takes their order on trust: a debug
//! build asserts and stops the replica, a release build would write them at the wrong place).

use std::sync::{Arc, Mutex};

use docket_proto::v1::RaftPayload;
use docket_proto::v1::raft_server::{Raft as RaftRpc, RaftServer};
use openraft::raft::AppendEntriesResponse;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use crate::codec::{decode, encode};
use crate::election_gate::CommitSeen;
use crate::machine::StateMachine;
use crate::machine_store::MachineStore;
use crate::proposer::Proposer;
use crate::read_index::{ConfirmLeaderRequest, ReadIndexRequest, ReadIndexer};
use crate::status::ReplicaStatus;
use crate::types::Raft;

/// The Raft service of one replica.
pub struct RaftGrpc<M: StateMachine> {
    raft: Raft<M>,
    proposer: Proposer<M>,
    /// Checks a received snapshot before openraft installs it.
    machine: MachineStore<M>,
    /// Reported in this replica's status.
    status_page: Option<String>,
    app_version: Option<u16>,
    /// Commit indexes of accepted appends, for [`crate::election_gate`].
    commit_seen: CommitSeen,
    /// Names read indexes and answers for this replica's vote ([`crate::read_index`]).
    reads: ReadIndexer<M>,
    /// Whether every call but `Status` must come with the replica its transport proved.
    proof: PeerProof,
    /// The snapshot being received and how many of its bytes arrived, so a chunk past them
    /// is refused ([`RaftGrpc::check_chunk`]).
    receiving: Arc<Mutex<Option<(String, u64)>>>,
}

/// What a replica's Raft service serves from.
pub struct ServiceParts<M: StateMachine> {
    pub raft: Raft<M>,
    /// Where forwarded writes go.
    pub proposer: Proposer<M>,
    pub machine: MachineStore<M>,
    pub max_message_bytes: usize,
    /// Reported in this replica's status.
    pub status_page: Option<String>,
    pub app_version: Option<u16>,
    /// Commit indexes of accepted appends, for [`crate::election_gate`].
    pub commit_seen: CommitSeen,
    pub reads: ReadIndexer<M>,
}

impl<M: StateMachine> std::fmt::Debug for ServiceParts<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceParts")
            .field("max_message_bytes", &self.max_message_bytes)
            .finish_non_exhaustive()
    }
}

/// What the transport under a Raft service proves of its callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerProof {
    /// Every call but `Status` carries a [`PeerReplica`] (the controller's TLS layer puts the
    /// client certificate's replica there); a call without one is refused, so a server
    /// built without that layer fails closed.
    Required,
    /// Nothing is proven (plain loopback in tests and the KV benchmark): calls are taken on
    /// their word.
    NotAvailable,
}

impl<M: StateMachine> std::fmt::Debug for RaftGrpc<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftGrpc").finish_non_exhaustive()
    }
}

impl<M: StateMachine> RaftGrpc<M> {
    /// The service over `parts`, as a tonic server that refuses messages over
    /// `parts.max_message_bytes`.
    pub fn server(parts: ServiceParts<M>, proof: PeerProof) -> RaftServer<Self> {
        let max_message_bytes = parts.max_message_bytes;
        RaftServer::new(RaftGrpc {
            raft: parts.raft,
            proposer: parts.proposer,
            machine: parts.machine,
            status_page: parts.status_page,
            app_version: parts.app_version,
            commit_seen: parts.commit_seen,
            reads: parts.reads,
            proof,
            receiving: Arc::default(),
        })
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes)
    }
}

/// The replica a Raft call comes from, as its transport proved it (the controller's TLS layer
/// puts the replica id of the client certificate here). When present, a call that speaks for
/// another replica (an append or snapshot from a leader, a vote request from a candidate) is
/// refused: one replica's certificate cannot lead or campaign in another's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerReplica(pub crate::ReplicaId);

/// Refuses `claimed` (the replica a call speaks for) unless it is the proven caller.
fn speaks_for_itself(
    rpc: &str,
    proven: Option<PeerReplica>,
    claimed: crate::ReplicaId,
) -> Result<(), Status> {
    match proven {
        Some(PeerReplica(peer)) if peer != claimed => Err(Status::permission_denied(format!(
            "{rpc} speaks for replica {}; the certificate is replica {}'s",
            claimed.0, peer.0
        ))),
        _ => Ok(()),
    }
}

impl<M: StateMachine> RaftGrpc<M> {
    /// The replica `req` comes from, as its transport proved it; a refusal when this server
    /// requires a proof and the call has none.
    fn proven<T>(&self, rpc: &str, req: &Request<T>) -> Result<Option<PeerReplica>, Status> {
        let proven = req.extensions().get::<PeerReplica>().copied();
        if proven.is_none() && self.proof == PeerProof::Required {
            return Err(Status::unauthenticated(format!(
                "{rpc} needs a caller proven to be a replica of the cluster; this call's \
                 transport proved none"
            )));
        }
        Ok(proven)
    }

    /// Refuses a chunk that starts past the bytes of its snapshot that arrived: openraft
    /// would seek there and write, making a sparse file of any size, or failing the write
    /// and stopping this replica's Raft for good. A chunk at 0 starts a snapshot (or starts
    /// it again); an earlier one is a retransmission.
    fn check_chunk(
        &self,
        rpc: &openraft::raft::InstallSnapshotRequest<crate::TypeConfig<M>>,
    ) -> Result<(), Status> {
        if rpc.offset == 0 {
            return Ok(());
        }
        let receiving = self.receiving.lock().unwrap_or_else(|p| p.into_inner());
        let arrived = match &*receiving {
            Some((id, arrived)) if *id == rpc.meta.snapshot_id => *arrived,
            _ => 0,
        };
        if rpc.offset > arrived {
            return Err(Status::invalid_argument(format!(
                "InstallSnapshot: a chunk at offset {} of snapshot {:?}, of which {arrived} \
                 bytes arrived: chunks follow one another",
                rpc.offset, rpc.meta.snapshot_id
            )));
        }
        Ok(())
    }

    /// The last chunk of a snapshot: openraft takes its bytes as one more chunk, the whole
    /// snapshot is checked as the machine would restore it, and only then is it finished
    /// (an empty last chunk), which installs it. A snapshot that would not restore is refused
    /// here (`InvalidArgument`, naming why) rather than failing openraft's install, which is
    /// fatal: the replica's Raft would stop for good.
    async fn install_checked(
        &self,
        mut rpc: openraft::raft::InstallSnapshotRequest<crate::TypeConfig<M>>,
        end: u64,
    ) -> Result<
        Result<
            openraft::raft::InstallSnapshotResponse<crate::ReplicaId>,
            crate::types::RaftError<openraft::error::InstallSnapshotError>,
        >,
        Status,
    > {
        let vote = rpc.vote;
        let mut last = rpc.clone();
        rpc.done = false;
        let taken = self.raft.install_snapshot(rpc).await;
        if !taken.as_ref().is_ok_and(|r| r.vote == vote) {
            return Ok(taken);
        }
        if let Err(e) = self.machine.check_received().await {
            // Starts over at 0 (openraft's stream of this id is overwritten from there).
            self.chunk_taken(last.meta.snapshot_id.clone(), 0, true);
            return Err(Status::invalid_argument(format!(
                "InstallSnapshot: snapshot {:?} ({end} bytes) would not restore: {e}",
                last.meta.snapshot_id
            )));
        }
        last.offset = end;
        last.data = Vec::new();
        Ok(self.raft.install_snapshot(last).await)
    }

    /// Notes a chunk openraft took: `end` bytes of snapshot `id` arrived (none after the
    /// last).
    fn chunk_taken(&self, id: String, end: u64, done: bool) {
        let mut receiving = self.receiving.lock().unwrap_or_else(|p| p.into_inner());
        *receiving = match receiving.take() {
            _ if done => None,
            Some((current, arrived)) if current == id => Some((id, arrived.max(end))),
            _ => Some((id, end)),
        };
    }
}

fn request<T: DeserializeOwned>(rpc: &str, request: Request<RaftPayload>) -> Result<T, Status> {
    decode(&request.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("{rpc}: malformed payload: {e}")))
}

/// Refuses an append whose entries do not follow `prev_log_id` one index at a time, in terms
/// that never go back and never pass the sender's own.
fn check_append<C: openraft::RaftTypeConfig>(
    rpc: &openraft::raft::AppendEntriesRequest<C>,
) -> Result<(), Status> {
    use openraft::{LogIdOptionExt, RaftLogId};
    let mut next = rpc.prev_log_id.next_index();
    let mut term = rpc.prev_log_id.as_ref().map_or(0, |l| l.leader_id.term);
    let sender = rpc.vote.leader_id.term;
    for entry in &rpc.entries {
        let id = entry.get_log_id();
        if id.index != next {
            return Err(Status::invalid_argument(format!(
                "AppendEntries: an entry at index {} where {next} follows prev_log_id",
                id.index
            )));
        }
        if id.leader_id.term < term || id.leader_id.term > sender {
            return Err(Status::invalid_argument(format!(
                "AppendEntries: an entry of term {} after term {term}, sent in term {sender}",
                id.leader_id.term
            )));
        }
        term = id.leader_id.term;
        next = next.saturating_add(1);
    }
    if let (Some(commit), Some(prev)) = (rpc.leader_commit.as_ref(), rpc.prev_log_id.as_ref())
        && commit.leader_id.term > sender
    {
        return Err(Status::invalid_argument(format!(
            "AppendEntries: leader_commit of term {} sent in term {sender} (after {})",
            commit.leader_id.term, prev.index
        )));
    }
    Ok(())
}

fn reply<T: Serialize>(rpc: &str, value: &T) -> Result<Response<RaftPayload>, Status> {
    let data = encode(value)
        .map_err(|e| Status::internal(format!("{rpc}: cannot encode the answer: {e}")))?;
    Ok(Response::new(RaftPayload { data }))
}

#[tonic::async_trait]
impl<M: StateMachine> RaftRpc for RaftGrpc<M> {
    async fn append_entries(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let proven = self.proven("AppendEntries", &req)?;
        let rpc: openraft::raft::AppendEntriesRequest<crate::TypeConfig<M>> =
            request("AppendEntries", req)?;
        speaks_for_itself("AppendEntries", proven, rpc.vote.leader_id().node_id)?;
        check_append(&rpc)?;
        let commit = rpc.leader_commit.map(|l| l.index);
        let answer = self.raft.append_entries(rpc).await;
        // Accepted: it came from the leader this replica follows.
        match &answer {
            Ok(AppendEntriesResponse::Success | AppendEntriesResponse::PartialSuccess(_)) => {
                self.commit_seen.saw(commit);
            }
            // The leader this replica follows, whose log it does not match yet: alive, but its
            // commit index says nothing of this replica's log.
            Ok(AppendEntriesResponse::Conflict) => self.commit_seen.contact(),
            _ => {}
        }
        reply("AppendEntries", &answer)
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let proven = self.proven("Vote", &req)?;
        let rpc: openraft::raft::VoteRequest<crate::ReplicaId> = request("Vote", req)?;
        speaks_for_itself("Vote", proven, rpc.vote.leader_id().node_id)?;
        reply("Vote", &self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let proven = self.proven("InstallSnapshot", &req)?;
        let rpc: openraft::raft::InstallSnapshotRequest<crate::TypeConfig<M>> =
            request("InstallSnapshot", req)?;
        speaks_for_itself("InstallSnapshot", proven, rpc.vote.leader_id().node_id)?;
        self.check_chunk(&rpc)?;
        let vote = rpc.vote;
        let (id, end, done) = (
            rpc.meta.snapshot_id.clone(),
            rpc.offset.saturating_add(rpc.data.len() as u64),
            rpc.done,
        );
        let answer = if done {
            self.install_checked(rpc, end).await?
        } else {
            self.raft.install_snapshot(rpc).await
        };
        // A chunk from the leader of this replica's vote (answered with that same vote): the
        // leader is alive. A large snapshot sends no appends while it streams, and must not
        // make the replica receiving it campaign ([`crate::election_gate`]).
        if answer.as_ref().is_ok_and(|r| r.vote == vote) {
            self.commit_seen.contact();
            self.chunk_taken(id, end, done);
        }
        reply("InstallSnapshot", &answer)
    }

    async fn forward(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.proven("Forward", &req)?;
        let commands: Vec<M::Command> = request("Forward", req)?;
        reply("Forward", &self.proposer.write_forwarded(commands).await)
    }

    async fn read_index(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let proven = self.proven("ReadIndex", &req)?;
        // An empty request is a replica that vouches for nobody.
        let vouch: Option<ReadIndexRequest> = if req.get_ref().data.is_empty() {
            None
        } else {
            Some(request("ReadIndex", req)?)
        };
        if let Some(v) = &vouch {
            speaks_for_itself("ReadIndex", proven, v.from)?;
        }
        reply("ReadIndex", &self.reads.read_index(vouch.as_ref()).await)
    }

    async fn confirm_leader(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.proven("ConfirmLeader", &req)?;
        let asked: ConfirmLeaderRequest = request("ConfirmLeader", req)?;
        reply("ConfirmLeader", &self.reads.confirms(&asked))
    }

    async fn status(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let () = request("Status", req)?;
        let mut status = ReplicaStatus::from_metrics(&self.raft.metrics().borrow());
        status.status_page.clone_from(&self.status_page);
        status.app_version = self.app_version;
        reply("Status", &status)
    }
}
