//! The server side of the Raft transport: the `docket.v1.Raft` gRPC service.
//!
//! Each RPC decodes openraft's request, hands it to the local Raft, and encodes the `Result`
//! it returns, so a Raft-level refusal (a stale term, a vote denied) travels as data and the
//! caller sees it as a remote error. A payload that does not decode is refused with
//! `INVALID_ARGUMENT` naming the RPC, and changes nothing.

use docket_proto::v1::RaftPayload;
use docket_proto::v1::raft_server::{Raft as RaftRpc, RaftServer};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use crate::codec::{decode, encode};
use crate::machine::StateMachine;
use crate::proposer::Proposer;
use crate::read::ReadError;
use crate::status::ReplicaStatus;
use crate::types::Raft;

/// The Raft service of one replica.
pub struct RaftGrpc<M: StateMachine> {
    raft: Raft<M>,
    proposer: Proposer<M>,
}

impl<M: StateMachine> std::fmt::Debug for RaftGrpc<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftGrpc").finish_non_exhaustive()
    }
}

impl<M: StateMachine> RaftGrpc<M> {
    /// The service over `raft`, forwarding writes into `proposer`, as a tonic server that
    /// refuses messages over `max_message_bytes`.
    pub fn server(
        raft: Raft<M>,
        proposer: Proposer<M>,
        max_message_bytes: usize,
    ) -> RaftServer<Self> {
        RaftServer::new(RaftGrpc { raft, proposer })
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

fn request<T: DeserializeOwned>(rpc: &str, request: Request<RaftPayload>) -> Result<T, Status> {
    decode(&request.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("{rpc}: malformed payload: {e}")))
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
        let rpc = request("AppendEntries", req)?;
        reply("AppendEntries", &self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = request("Vote", req)?;
        reply("Vote", &self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc = request("InstallSnapshot", req)?;
        reply("InstallSnapshot", &self.raft.install_snapshot(rpc).await)
    }

    async fn forward(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let commands: Vec<M::Command> = request("Forward", req)?;
        reply("Forward", &self.proposer.write_forwarded(commands).await)
    }

    async fn read_index(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let () = request("ReadIndex", req)?;
        let answer: Result<Option<u64>, ReadError> = match self.raft.get_read_log_id().await {
            Ok((read_log_id, _applied)) => Ok(read_log_id.map(|id| id.index)),
            Err(e) => Err(ReadError::from_leader_check(e)),
        };
        reply("ReadIndex", &answer)
    }

    async fn status(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let () = request("Status", req)?;
        let status = ReplicaStatus::from_metrics(&self.raft.metrics().borrow());
        reply("Status", &status)
    }
}
