//! The simulated network: every RPC between replicas is a call into the target's `Raft`
//! after a seeded delay, unless the link is cut, the target is down, or the seeded loss drops
//! the request (or the answer, after the target handled it). Delays differ per message, so
//! messages overtake each other.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use super::{SimConfig, rt};

pub type SimRaft = openraft::Raft<SimConfig>;

/// Who is up, which links are cut, how lossy the network is.
#[derive(Default)]
pub struct World {
    pub nodes: Mutex<BTreeMap<u64, SimRaft>>,
    pub cut: Mutex<BTreeSet<(u64, u64)>>,
    /// Per mille of messages lost.
    pub loss: Mutex<u64>,
    pub delivered: Mutex<u64>,
    pub dropped: Mutex<u64>,
}

impl World {
    fn raft(&self, id: u64) -> Option<SimRaft> {
        self.nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    fn link_up(&self, a: u64, b: u64) -> bool {
        let cut = self.cut.lock().unwrap_or_else(|p| p.into_inner());
        !cut.contains(&(a, b)) && !cut.contains(&(b, a))
    }

    fn lost(&self) -> bool {
        let loss = *self.loss.lock().unwrap_or_else(|p| p.into_inner());
        rt::next_u64() % 1000 < loss
    }

    fn count(&self, delivered: bool) {
        let counter = if delivered {
            &self.delivered
        } else {
            &self.dropped
        };
        *counter.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Message(String);

/// Builds connections from one replica.
#[derive(Clone)]
pub struct Factory {
    pub world: Arc<World>,
    pub from: u64,
}

impl RaftNetworkFactory<SimConfig> for Factory {
    type Network = Link;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Link {
        Link {
            world: self.world.clone(),
            from: self.from,
            to: target,
        }
    }
}

/// One direction of one link.
pub struct Link {
    world: Arc<World>,
    from: u64,
    to: u64,
}

impl Link {
    /// Delivers through `call` after the delay, or fails as the network would.
    async fn deliver<T, E, F, Fut>(
        &self,
        call: F,
    ) -> Result<T, RPCError<u64, BasicNode, RaftError<u64, E>>>
    where
        E: std::error::Error,
        F: FnOnce(SimRaft) -> Fut,
        Fut: std::future::Future<Output = Result<T, RaftError<u64, E>>>,
    {
        let unreachable = |why: &str| {
            RPCError::Unreachable(Unreachable::new(&Message(format!(
                "{} -> {}: {why}",
                self.from, self.to
            ))))
        };
        tokio::time::sleep(Duration::from_millis(1 + rt::next_u64() % 15)).await;
        if !self.world.link_up(self.from, self.to) {
            self.world.count(false);
            return Err(unreachable("link cut"));
        }
        if self.world.lost() {
            self.world.count(false);
            return Err(unreachable("request lost"));
        }
        let Some(raft) = self.world.raft(self.to) else {
            self.world.count(false);
            return Err(unreachable("replica down"));
        };
        let answer = call(raft).await;
        tokio::time::sleep(Duration::from_millis(1 + rt::next_u64() % 15)).await;
        if !self.world.link_up(self.from, self.to) || self.world.lost() {
            self.world.count(false);
            return Err(unreachable("answer lost"));
        }
        self.world.count(true);
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }
}

impl RaftNetwork<SimConfig> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<SimConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.deliver(|r| async move { r.append_entries(rpc).await })
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<SimConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        self.deliver(|r| async move { r.install_snapshot(rpc).await })
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.deliver(|r| async move { r.vote(rpc).await }).await
    }
}
