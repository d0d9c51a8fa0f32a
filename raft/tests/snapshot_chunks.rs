//! Snapshot chunks from the leader a replica follows, as the receiver checks them.
//!
//! openraft writes a received chunk at the offset the chunk names, seeking there first. A
//! chunk far past what arrived of its snapshot would make a sparse file of any size, or fail
//! the write, which stops the receiver's Raft for good. The leader's own sends are
//! contiguous; a buggy or hostile leader's (any holder of a replica certificate) need not be.
//! Nor need a complete snapshot be one the receiver can restore, and a failed install is as
//! fatal to openraft as a failed write: the receiver checks the whole snapshot before it lets
//! openraft install it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::TestCluster;
use docket_proto::v1::RaftPayload;
use docket_raft::kv::KvMachine;
use docket_raft::network::{Channels, NetworkConfig};
use docket_raft::status::Role;
use docket_raft::{ReplicaId, TypeConfig};
use openraft::{CommittedLeaderId, LogId, SnapshotMeta, StoredMembership};

/// One chunk of a snapshot, sent in the name of the leader of `vote`.
fn chunk(vote: openraft::Vote<ReplicaId>, offset: u64, data: Vec<u8>) -> RaftPayload {
    chunk_of("sent-by-a-faulty-leader", vote, offset, data, false)
}

/// Chunk `offset` of snapshot `id`; `done` for its last.
fn chunk_of(
    id: &str,
    vote: openraft::Vote<ReplicaId>,
    offset: u64,
    data: Vec<u8>,
    done: bool,
) -> RaftPayload {
    let leader = vote.leader_id();
    let request = openraft::raft::InstallSnapshotRequest::<TypeConfig<KvMachine>> {
        vote,
        meta: SnapshotMeta {
            last_log_id: Some(LogId::new(
                CommittedLeaderId::new(leader.term, leader.node_id),
                1_000_000,
            )),
            last_membership: StoredMembership::default(),
            snapshot_id: id.into(),
        },
        offset,
        data,
        done,
    };
    RaftPayload {
        data: docket_raft::codec::encode(&request).unwrap(),
    }
}

/// The largest file under `dir`, in bytes as its size says (a sparse file counts whole).
fn largest_file(dir: &std::path::Path) -> u64 {
    let mut largest = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        largest = largest.max(if meta.is_dir() {
            largest_file(&entry.path())
        } else {
            meta.len()
        });
    }
    largest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_past_what_arrived_is_refused_and_the_follower_goes_on() {
    let cluster = TestCluster::start(3, 100_000).await;
    let leader = cluster.leader().await;
    let follower = cluster.follower_of(leader);
    let vote = cluster.replica(leader).raft().metrics().borrow().vote;
    let addr = cluster.members[&follower].config.addr.clone();
    let channels = Channels::tcp(NetworkConfig::default());
    let mut client = channels.client(&addr).unwrap();

    // The first 100 bytes, twice (a retransmission): taken.
    for _ in 0..2 {
        client
            .install_snapshot(chunk(vote, 0, vec![7; 100]))
            .await
            .unwrap();
    }
    // Past them: refused, naming where the chunk starts and what arrived.
    for far in [101, 1 << 40, 1 << 50, u64::MAX - 10] {
        let refused = client
            .install_snapshot(chunk(vote, far, vec![7; 10]))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        let message = refused.message();
        assert!(
            message.contains(&format!("offset {far}")) && message.contains("of which 100 bytes"),
            "{message}"
        );
    }
    // The next chunk, and an earlier one again: taken.
    client
        .install_snapshot(chunk(vote, 100, vec![7; 10]))
        .await
        .unwrap();
    client
        .install_snapshot(chunk(vote, 50, vec![7; 10]))
        .await
        .unwrap();
    let largest = largest_file(&cluster.data_dir(follower));
    assert!(largest < 64 << 20, "a file of {largest} bytes");
    // Its Raft goes on: it follows and applies what the leader commits.
    assert_ne!(cluster.replica(follower).status().role, Role::Shutdown);
    common::append(cluster.replica(leader), "after", "the chunks".into())
        .await
        .unwrap();
    cluster.converge().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_snapshot_that_would_not_restore_is_refused_and_the_follower_goes_on() {
    let cluster = TestCluster::start(3, 100_000).await;
    let leader = cluster.leader().await;
    let follower = cluster.follower_of(leader);
    common::append(cluster.replica(leader), "before", "garbage".into())
        .await
        .unwrap();
    cluster.converge().await;
    let vote = cluster.replica(leader).raft().metrics().borrow().vote;
    let addr = cluster.members[&follower].config.addr.clone();
    let channels = Channels::tcp(NetworkConfig::default());
    let mut client = channels.client(&addr).unwrap();

    // Two chunks of bytes that are no key-value map, the second the last.
    let garbage = vec![0xff; 64];
    client
        .install_snapshot(chunk_of("garbage", vote, 0, garbage.clone(), false))
        .await
        .unwrap();
    let refused = client
        .install_snapshot(chunk_of("garbage", vote, 64, garbage, true))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("would not restore")
            && refused.message().contains("kv snapshot"),
        "{}",
        refused.message()
    );
    // Nothing was installed, and its Raft goes on: it keeps what it had and applies what
    // the leader commits next.
    assert_ne!(cluster.replica(follower).status().role, Role::Shutdown);
    common::append(cluster.replica(leader), "after", "garbage".into())
        .await
        .unwrap();
    cluster.converge().await;
    let map = cluster.map(follower);
    assert_eq!(map.get("before").map(Vec::len), Some(1), "{map:?}");
    assert_eq!(map.get("after").map(Vec::len), Some(1), "{map:?}");
    cluster.shutdown().await;
}
