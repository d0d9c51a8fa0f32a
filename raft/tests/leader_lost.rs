//! A leader cut off from the others (or stopped: it accepts connections and never answers)
//! no longer holds writes: the leader refuses new ones once no quorum has acknowledged it
//! for a lease, and a follower gives up a write it forwarded to it once it is lost or
//! replaced. Before, the leader's writes hung until the cut healed and the follower's forward
//! waited out its 10 s deadline, holding the follower's places in flight.
//!
//! Every replica reaches every other through a link of its own, a TCP relay the test can
//! freeze: a frozen link accepts connections and keeps the bytes, as a stopped process or a
//! dropping firewall does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{DEADLINE, tuning};
use docket_raft::ReplicaId;
use docket_raft::kv::{KvCommand, KvMachine};
use docket_raft::network::{ChannelMaker, Channels, NetworkConfig};
use docket_raft::proposer::WriteError;
use docket_raft::read_index::ConfirmLeaderRequest;
use docket_raft::replica::{Replica, ReplicaConfig, ServerHandle};
use docket_raft::status::Role;
use openraft::LeaderId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A relay to `upstream` that stops moving bytes (and holds new connections) while frozen,
/// counting the connections made through it in `dialed`.
async fn link(upstream: String, frozen: Arc<AtomicBool>, dialed: Arc<AtomicUsize>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            dialed.fetch_add(1, Ordering::SeqCst);
            let (upstream, frozen) = (upstream.clone(), frozen.clone());
            tokio::spawn(async move {
                while frozen.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let Ok(outbound) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                tokio::spawn(pump(ri, wo, frozen.clone()));
                tokio::spawn(pump(ro, wi, frozen));
            });
        }
    });
    addr
}

/// Copies `from` to `to`, holding what it read while the link is frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Three replicas, each reaching each other one through a freezable link.
struct LinkedCluster {
    replicas: BTreeMap<u64, Replica<KvMachine>>,
    _servers: Vec<ServerHandle>,
    /// The switch of the link from one replica to another.
    links: BTreeMap<(u64, u64), Arc<AtomicBool>>,
    /// How many connections each link has carried.
    dialed: BTreeMap<(u64, u64), Arc<AtomicUsize>>,
    /// Declared last, so dropped last: after the replicas whose data it holds.
    _dir: tempfile::TempDir,
}

impl LinkedCluster {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut listeners = BTreeMap::new();
        for id in 1..=3u64 {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            listeners.insert(id, (l.local_addr().unwrap().to_string(), l));
        }
        let addrs: BTreeMap<u64, String> = listeners
            .iter()
            .map(|(id, (a, _))| (*id, a.clone()))
            .collect();
        let (mut links, mut dialed) = (BTreeMap::new(), BTreeMap::new());
        let (mut replicas, mut servers) = (BTreeMap::new(), Vec::new());
        for (id, (addr, listener)) in listeners {
            // Replica `id` reaches the others' addresses through its own links to them.
            let mut via = BTreeMap::new();
            for (other, other_addr) in &addrs {
                if *other != id {
                    let frozen = Arc::new(AtomicBool::new(false));
                    let count = Arc::new(AtomicUsize::new(0));
                    via.insert(
                        other_addr.clone(),
                        link(other_addr.clone(), frozen.clone(), count.clone()).await,
                    );
                    links.insert((id, *other), frozen);
                    dialed.insert((id, *other), count);
                }
            }
            let maker: ChannelMaker = Arc::new(move |_, target: &str| {
                let relay = via
                    .get(target)
                    .cloned()
                    .unwrap_or_else(|| target.to_owned());
                Ok(
                    tonic::transport::Endpoint::from_shared(format!("http://{relay}"))
                        .map_err(|e| e.to_string())?
                        .connect_timeout(Duration::from_secs(1))
                        .connect_lazy(),
                )
            });
            let mut config = ReplicaConfig::new(id, addr, dir.path().join(format!("r{id}")));
            config.tuning = tuning(1_000);
            let channels = Channels::with_maker(NetworkConfig::default(), maker);
            let replica = Replica::open_with_channels(config, KvMachine::default(), channels)
                .await
                .unwrap();
            servers.push(replica.serve(listener).unwrap());
            replicas.insert(id, replica);
        }
        let voters = addrs
            .iter()
            .map(|(id, a)| (ReplicaId(*id), a.clone()))
            .collect();
        replicas[&1].bootstrap(voters).await.unwrap();
        LinkedCluster {
            _dir: dir,
            replicas,
            _servers: servers,
            links,
            dialed,
        }
    }

    /// The replica that leads, once the replicas in `among` agree on it.
    async fn leader(&self, among: &[u64]) -> u64 {
        let start = Instant::now();
        loop {
            let statuses: Vec<_> = among.iter().map(|id| self.replicas[id].status()).collect();
            let leaders: Vec<u64> = statuses
                .iter()
                .filter(|s| s.role == Role::Leader)
                .map(|s| s.id.0)
                .collect();
            if let [leader] = leaders[..]
                && statuses.iter().all(|s| s.leader == Some(ReplicaId(leader)))
            {
                return leader;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no leader among {among:?}: {statuses:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Freezes (or thaws) every link to and from replica `id`.
    fn cut(&self, id: u64, frozen: bool) {
        for ((from, to), switch) in &self.links {
            if *from == id || *to == id {
                switch.store(frozen, Ordering::SeqCst);
            }
        }
    }
}

fn append(value: &str) -> KvCommand {
    KvCommand::Append {
        key: "k".into(),
        value: value.into(),
    }
}

/// `write` with the test's deadline: hanging past it fails the test with `what`.
async fn within<T>(what: &str, write: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, write)
        .await
        .unwrap_or_else(|_| panic!("{what} still hung after {DEADLINE:?}"))
}

/// A follower opens its connection to the leader as soon as it follows it, before it has
/// anything to pass on: the first read or write it forwards does not wait for a handshake.
/// While the leader is heard, only a campaign of its own would make a follower dial it (the
/// leader dials the followers for its appends); replica 1 bootstraps the cluster and almost
/// always wins the first election before the others' timers run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_connects_to_its_leader_before_it_passes_anything_on() {
    let cluster = LinkedCluster::start().await;
    let leader = cluster.leader(&[1, 2, 3]).await;
    let start = Instant::now();
    for follower in (1..=3).filter(|id| *id != leader) {
        let dialed = &cluster.dialed[&(follower, leader)];
        while dialed.load(Ordering::SeqCst) == 0 {
            assert!(
                start.elapsed() < DEADLINE,
                "replica {follower} never connected to its leader {leader}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_refuses_writes_and_a_forward_to_it_is_given_up() {
    let cluster = LinkedCluster::start().await;
    let old = cluster.leader(&[1, 2, 3]).await;
    let others: Vec<u64> = (1..=3).filter(|id| *id != old).collect();
    let follower = others[0];
    cluster.replicas[&follower]
        .write_one(append("before"))
        .await
        .unwrap();

    cluster.cut(old, true);
    // A write through a follower, forwarded to the leader just cut off: it cannot be
    // answered, and its outcome is unknown (the old leader may have appended it).
    let forwarded = within(
        "a write forwarded to the cut-off leader",
        cluster.replicas[&follower].write_one(append("forwarded")),
    )
    .await;
    match &forwarded {
        Err(WriteError::Indeterminate(why)) => {
            assert!(why.contains("given up because"), "{why}")
        }
        // Refused before it was sent, had the follower already judged the leader lost.
        Err(WriteError::NoLeader) => {}
        other => panic!("a forward to a cut-off leader answered {other:?}"),
    }

    // The old leader, which no quorum acknowledges any more, refuses writes outright: they
    // are certainly not applied.
    let lease = tuning(1_000).election_timeout_max;
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let refused = within(
        "a write at the cut-off leader",
        cluster.replicas[&old].write_one(append("at-old-leader")),
    )
    .await;
    assert_eq!(refused, Err(WriteError::NoLeader));

    // The others elect a new leader and take writes.
    let new = cluster.leader(&others).await;
    assert_ne!(new, old);
    let start = Instant::now();
    loop {
        match cluster.replicas[&follower].write_one(append("after")).await {
            Ok(_) => break,
            Err(e) if e.certainly_not_applied() && start.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("a write after the election: {e}"),
        }
    }

    // Healed, the old leader follows, and the write it refused was never applied.
    cluster.cut(old, false);
    let leader = cluster.leader(&[1, 2, 3]).await;
    let last = cluster.replicas[&leader]
        .status()
        .last_log_index
        .unwrap_or(0);
    for r in cluster.replicas.values() {
        r.wait_applied(last, DEADLINE).await.unwrap();
    }
    let values = cluster.replicas[&old].read_stale(|a| a.machine.map.get("k").cloned());
    let values = values.unwrap_or_default();
    assert!(!values.contains(&"at-old-leader".to_owned()), "{values:?}");
    assert_eq!(values.iter().filter(|v| *v == "before").count(), 1);
    assert_eq!(values.iter().filter(|v| *v == "after").count(), 1);
}

/// A leader cut off (or stopped: it holds its connections and never answers) is replaced as
/// its lease ends. The followers' status requests to it go unanswered, so the first of them
/// stands then, instead of a random election timeout later: the earliest openraft's own timer
/// lets a follower stand is the lease plus the election timeout's minimum after the leader was
/// last heard, at most a heartbeat before the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_leader_is_replaced_as_its_lease_ends() {
    let cluster = LinkedCluster::start().await;
    let old = cluster.leader(&[1, 2, 3]).await;
    let others: Vec<u64> = (1..=3).filter(|id| *id != old).collect();
    cluster.replicas[&others[0]]
        .write_one(append("before"))
        .await
        .unwrap();

    let t = tuning(1_000);
    let cut_at = Instant::now();
    cluster.cut(old, true);
    let new = cluster.leader(&others).await;
    let took = cut_at.elapsed();
    assert_ne!(new, old);
    let openraft_earliest = t.election_timeout_max + t.election_timeout_min - t.heartbeat;
    assert!(
        took < openraft_earliest - t.heartbeat,
        "a new leader {took:?} after the cut; openraft's own timer alone stands after \
         {openraft_earliest:?} at the earliest"
    );

    // Healed, the old leader follows the new one.
    cluster.cut(old, false);
    let leader = cluster.leader(&[1, 2, 3]).await;
    assert_ne!(leader, old);
}

/// A leader cut off from the others still holds its saved vote, has applied its own entries
/// and believes it leads for a while: only the quorum of saved votes stops it from naming a
/// read index that misses what the new leader acknowledged. Its read fails; the new side reads
/// the new write, confirmed from the saved votes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_names_no_read_index_that_misses_a_newer_leaders_write() {
    let cluster = LinkedCluster::start().await;
    let old = cluster.leader(&[1, 2, 3]).await;
    let others: Vec<u64> = (1..=3).filter(|id| *id != old).collect();
    let read = |id: u64| {
        cluster.replicas[&id].read_linearizable(Duration::from_secs(2), |a| {
            a.machine.map.get("k").cloned().unwrap_or_default()
        })
    };
    cluster.replicas[&old]
        .write_one(append("before"))
        .await
        .unwrap();
    assert_eq!(
        within("a read on the leader", read(old)).await.unwrap(),
        ["before"]
    );
    assert_eq!(cluster.replicas[&old].read_index_counts(), (1, 0));

    let old_leadership = LeaderId::new(cluster.replicas[&old].status().term, ReplicaId(old));
    cluster.cut(old, true);
    let new = cluster.leader(&others).await;
    cluster.replicas[&new]
        .write_one(append("after"))
        .await
        .unwrap();
    // Asked directly, the new side's voters hold the new leadership and not the old one.
    let new_leadership = LeaderId::new(cluster.replicas[&new].status().term, ReplicaId(new));
    let direct = Channels::tcp(NetworkConfig::default());
    let ask = |to: u64, leadership| ConfirmLeaderRequest {
        to: ReplicaId(to),
        leadership,
    };
    let ttl = Duration::from_secs(2);
    for id in &others {
        let addr = cluster.replicas[id].addr();
        let held = direct
            .confirm_leader(addr, &ask(*id, new_leadership), ttl)
            .await;
        assert!(held, "replica {id}");
        let held = direct
            .confirm_leader(addr, &ask(*id, old_leadership), ttl)
            .await;
        assert!(!held, "replica {id} holds the old leadership");
        // Asked as another voter, it does not answer for that one.
        let other = (1..=3).find(|o| o != id).unwrap();
        let held = direct
            .confirm_leader(addr, &ask(other, new_leadership), ttl)
            .await;
        assert!(!held, "replica {id} answered as replica {other}");
    }
    let (votes_before, _) = cluster.replicas[&old].read_index_counts();
    let stale = within("a read on the cut-off leader", read(old)).await;
    assert!(stale.is_err(), "the cut-off leader served {stale:?}");
    assert_eq!(
        cluster.replicas[&old].read_index_counts().0,
        votes_before,
        "no quorum of saved votes confirmed the cut-off leader"
    );
    for id in &others {
        let seen = within("a read on the new side", read(*id)).await.unwrap();
        assert_eq!(seen, ["before", "after"], "replica {id}");
    }
    assert!(cluster.replicas[&new].read_index_counts().0 >= 2);
    cluster.cut(old, false);
}
