//! A cluster of in-process replicas over real tonic on loopback, for the cluster tests.
//!
//! Every wait has a deadline; a test that cannot reach its condition fails with what it saw.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use docket_raft::ReplicaId;
use docket_raft::kv::{KvCommand, KvMachine, KvResponse};
use docket_raft::proposer::{ProposerConfig, WriteError};
use docket_raft::replica::{RaftTuning, Replica, ReplicaConfig, ServerHandle};
use docket_raft::status::Role;

pub const DEADLINE: Duration = Duration::from_secs(20);

/// Fast timings for tests on a loaded 2-core machine; snapshots every `snapshot_every`.
pub fn tuning(snapshot_every: u64) -> RaftTuning {
    RaftTuning {
        heartbeat: Duration::from_millis(100),
        election_timeout_min: Duration::from_millis(800),
        election_timeout_max: Duration::from_millis(1600),
        snapshot_every_entries: snapshot_every,
        keep_entries_after_snapshot: 10,
        snapshot_chunk_bytes: 1024,
        max_entries_per_append: 100,
    }
}

pub struct Member {
    pub replica: Replica<KvMachine>,
    server: Option<ServerHandle>,
    pub config: ReplicaConfig,
}

pub struct TestCluster {
    pub members: BTreeMap<u64, Member>,
    pub stopped: BTreeMap<u64, ReplicaConfig>,
    /// Declared last, so dropped last: after the replicas whose data it holds.
    pub dir: tempfile::TempDir,
}

async fn listener() -> tokio::net::TcpListener {
    tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()
}

async fn start_member(config: ReplicaConfig, listener: tokio::net::TcpListener) -> Member {
    let replica = Replica::open(config.clone(), KvMachine::default())
        .await
        .unwrap();
    let server = replica.serve(listener).unwrap();
    Member {
        replica,
        server: Some(server),
        config,
    }
}

impl TestCluster {
    /// Starts `n` replicas and bootstraps them as one cluster with a leader.
    pub async fn start(n: u64, snapshot_every: u64) -> Self {
        Self::start_with(n, tuning(snapshot_every), ProposerConfig::default()).await
    }

    /// Like [`TestCluster::start`], with these timings and every replica's proposer
    /// configured as `proposer`.
    pub async fn start_with(n: u64, tuning: RaftTuning, proposer: ProposerConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut listeners = BTreeMap::new();
        for id in 1..=n {
            listeners.insert(id, listener().await);
        }
        let mut members = BTreeMap::new();
        for (id, l) in listeners {
            let addr = l.local_addr().unwrap().to_string();
            let mut config = ReplicaConfig::new(id, addr, dir.path().join(format!("r{id}")));
            config.tuning = tuning.clone();
            config.proposer = proposer.clone();
            members.insert(id, start_member(config, l).await);
        }
        let cluster = TestCluster {
            dir,
            members,
            stopped: BTreeMap::new(),
        };
        let voters: BTreeMap<ReplicaId, String> = cluster
            .members
            .iter()
            .map(|(id, m)| (ReplicaId(*id), m.config.addr.clone()))
            .collect();
        cluster.members[&1].replica.bootstrap(voters).await.unwrap();
        cluster.leader().await;
        cluster
    }

    /// A started replica that is not yet a member (for membership changes).
    pub async fn start_extra(&mut self, id: u64, snapshot_every: u64) -> String {
        let l = listener().await;
        let addr = l.local_addr().unwrap().to_string();
        let mut config =
            ReplicaConfig::new(id, addr.clone(), self.dir.path().join(format!("r{id}")));
        config.tuning = tuning(snapshot_every);
        self.members.insert(id, start_member(config, l).await);
        addr
    }

    pub fn replica(&self, id: u64) -> &Replica<KvMachine> {
        &self.members[&id].replica
    }

    /// The leader every running replica agrees on.
    pub async fn leader(&self) -> u64 {
        let start = Instant::now();
        loop {
            let statuses: Vec<_> = self.members.values().map(|m| m.replica.status()).collect();
            let leaders: Vec<_> = statuses
                .iter()
                .filter(|s| s.role == Role::Leader)
                .map(|s| s.id.0)
                .collect();
            if let [leader] = leaders[..]
                && statuses
                    .iter()
                    .filter(|s| s.role != Role::Shutdown)
                    .all(|s| s.leader == Some(ReplicaId(leader)))
            {
                return leader;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no agreed leader within {DEADLINE:?}: {statuses:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A running replica other than `leader`.
    pub fn follower_of(&self, leader: u64) -> u64 {
        *self
            .members
            .keys()
            .find(|id| **id != leader)
            .expect("a running replica besides the leader")
    }

    /// Waits until every running replica has applied what the leader has.
    pub async fn converge(&self) {
        let leader = self.leader().await;
        let target = self.replica(leader).status().last_log_index.unwrap_or(0);
        for m in self.members.values() {
            m.replica
                .wait_applied(target, DEADLINE)
                .await
                .unwrap_or_else(|e| panic!("{} did not apply {target}: {e}", m.replica.id()));
        }
    }

    /// The map of replica `id`.
    pub fn map(&self, id: u64) -> BTreeMap<String, Vec<String>> {
        self.replica(id).read_stale(|a| a.machine.map.clone())
    }

    /// Stops replica `id` gracefully and keeps its configuration for a restart.
    pub async fn stop(&mut self, id: u64) {
        let member = self.members.remove(&id).unwrap();
        member.replica.shutdown().await;
        if let Some(server) = member.server {
            server.stop().await;
        }
        self.stopped.insert(id, member.config);
    }

    /// Stops replica `id` abruptly: connections dropped at once, Raft stopped without waiting
    /// for anything in flight.
    pub async fn crash(&mut self, id: u64) {
        let member = self.members.remove(&id).unwrap();
        if let Some(server) = member.server {
            server.abort();
        }
        member.replica.shutdown().await;
        self.stopped.insert(id, member.config);
    }

    /// Restarts a stopped replica from its data directory, on its old address.
    pub async fn restart(&mut self, id: u64) {
        let config = self.stopped.remove(&id).unwrap();
        let start = Instant::now();
        let l = loop {
            // The old server's socket may take a moment to go.
            match tokio::net::TcpListener::bind(&config.addr).await {
                Ok(l) => break l,
                Err(e) if start.elapsed() < DEADLINE => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("rebinding {}: {e}", config.addr),
            }
        };
        // The data directory's lock goes when the last handle of the old replica is dropped.
        let member = loop {
            match Replica::open(config.clone(), KvMachine::default()).await {
                Ok(replica) => {
                    let server = replica.serve(l).unwrap();
                    break Member {
                        replica,
                        server: Some(server),
                        config,
                    };
                }
                Err(e) if start.elapsed() < DEADLINE => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("reopening replica {id}: {e}"),
            }
        };
        self.members.insert(id, member);
    }

    /// Stops every replica, then removes the data directories. A stopped replica's
    /// storage closes once the last of its tasks lets go, which can be just after `stop`
    /// returns; a file RocksDB writes while the directory is being removed fails that
    /// removal (`TempDir`'s drop would leave it all in /tmp, silently), so it is retried
    /// until it succeeds, up to [`DEADLINE`].
    pub async fn shutdown(mut self) {
        let ids: Vec<u64> = self.members.keys().copied().collect();
        for id in ids {
            self.stop(id).await;
        }
        let start = Instant::now();
        loop {
            match std::fs::remove_dir_all(self.dir.path()) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) => assert!(
                    start.elapsed() < DEADLINE,
                    "the test's data directory could not be removed: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("r{id}"))
    }
}

/// Appends `value` under `key` through `replica`, retrying only while the write certainly was
/// not applied (no leader yet). Returns what the last attempt answered.
pub async fn append(
    replica: &Replica<KvMachine>,
    key: &str,
    value: String,
) -> Result<KvResponse, WriteError> {
    let start = Instant::now();
    loop {
        let command = KvCommand::Append {
            key: key.to_owned(),
            value: value.clone(),
        };
        match replica.write_one(command).await {
            Err(e) if e.certainly_not_applied() && start.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

/// Asserts that every value in `acked` appears exactly once under `key` in `map`, and that
/// nothing appears that was never written (`written` is every value ever attempted).
pub fn assert_exactly_once(
    map: &BTreeMap<String, Vec<String>>,
    key: &str,
    acked: &[String],
    written: &[String],
) {
    let empty = Vec::new();
    let values = map.get(key).unwrap_or(&empty);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for v in values {
        *counts.entry(v.as_str()).or_default() += 1;
    }
    for v in acked {
        assert_eq!(
            counts.get(v.as_str()).copied().unwrap_or(0),
            1,
            "acknowledged write {v} must be present exactly once"
        );
    }
    for (v, n) in &counts {
        assert!(*n == 1, "{v} applied {n} times");
        assert!(written.iter().any(|w| w == v), "{v} was never written");
    }
}
