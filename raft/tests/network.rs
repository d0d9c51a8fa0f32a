//! The Raft transport's failure mapping, size limits and refusal of malformed payloads.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use docket_proto::v1::RaftPayload;
use docket_raft::kv::{KvCommand, KvMachine};
use docket_raft::network::{Channels, NetworkConfig, NetworkFactory};
use docket_raft::proposer::WriteError;
use docket_raft::replica::{Replica, ReplicaConfig, ReplicaError, ServerHandle};
use docket_raft::{ReplicaAddr, ReplicaId, TypeConfig};
use openraft::Vote;
use openraft::error::RPCError;
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::VoteRequest;

fn vote_request() -> VoteRequest<ReplicaId> {
    VoteRequest {
        vote: Vote::new(1, ReplicaId(1)),
        last_log_id: None,
    }
}

async fn peer(addr: &str) -> docket_raft::network::client::Peer {
    let mut factory = NetworkFactory::new(ReplicaId(1), Channels::tcp(NetworkConfig::default()));
    <NetworkFactory as RaftNetworkFactory<TypeConfig<KvMachine>>>::new_client(
        &mut factory,
        ReplicaId(2),
        &ReplicaAddr {
            addr: addr.to_owned(),
        },
    )
    .await
}

#[tokio::test]
async fn a_peer_nobody_listens_on_is_unreachable() {
    // A port that was free a moment ago: connection refused.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut peer = peer(&addr).await;
    let err = RaftNetwork::<TypeConfig<KvMachine>>::vote(
        &mut peer,
        vote_request(),
        RPCOption::new(Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
}

#[tokio::test]
async fn a_peer_that_never_answers_times_out_at_the_soft_ttl() {
    // Accepts TCP connections and never speaks HTTP/2.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let mut peer = peer(&addr).await;
    let option = RPCOption::new(Duration::from_millis(400));
    let start = Instant::now();
    let err = RaftNetwork::<TypeConfig<KvMachine>>::vote(&mut peer, vote_request(), option)
        .await
        .unwrap_err();
    assert!(matches!(err, RPCError::Timeout(_)), "{err:?}");
    // The deadline is the soft TTL (3/4 of 400 ms), not the connect timeout or forever.
    assert!(start.elapsed() < Duration::from_secs(5));
    hold.abort();
}

async fn one_replica(
    max_message_bytes: usize,
) -> (tempfile::TempDir, Replica<KvMachine>, ServerHandle, String) {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut config = ReplicaConfig::new(1, addr.clone(), dir.path().join("r1"));
    config.network.max_message_bytes = max_message_bytes;
    config.proposer.max_batch_bytes = max_message_bytes - (64 << 10);
    config.tuning.snapshot_chunk_bytes = 1024;
    let replica = Replica::open(config, KvMachine::default()).await.unwrap();
    let server = replica.serve(listener).unwrap();
    replica
        .bootstrap([(ReplicaId(1), addr.clone())].into())
        .await
        .unwrap();
    replica
        .wait_for_leader(Duration::from_secs(20))
        .await
        .unwrap();
    (dir, replica, server, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_messages_are_refused_and_change_nothing() {
    let (_dir, replica, server, addr) = one_replica(128 << 10).await;
    let before = replica.status();
    let channels = Channels::tcp(NetworkConfig {
        max_message_bytes: 4 << 20,
        ..Default::default()
    });
    let mut client = channels.client(&addr).unwrap();

    let garbage = RaftPayload {
        data: vec![0xff; 16],
    };
    let status = client.append_entries(garbage.clone()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("AppendEntries"), "{status}");
    let status = client.vote(garbage.clone()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let status = client.forward(garbage).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);

    // Bigger than the server's 128 KiB limit: refused by the transport.
    let big = RaftPayload {
        data: vec![0; 1 << 20],
    };
    let status = client.install_snapshot(big).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");

    // A write bigger than one entry may be is refused before it is proposed.
    let err = replica
        .write_one(KvCommand::Set {
            key: "k".into(),
            value: "x".repeat(200 << 10),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, WriteError::TooLarge { .. }), "{err}");
    assert!(err.certainly_not_applied());
    assert!(err.to_string().contains("limit"), "{err}");

    let after = replica.status();
    assert_eq!(before.last_log_index, after.last_log_index);
    assert_eq!(before.term, after.term);
    replica.shutdown().await;
    server.stop().await;
}

#[tokio::test]
async fn a_batch_limit_over_the_message_limit_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ReplicaConfig::new(1, "127.0.0.1:1", dir.path());
    config.network.max_message_bytes = 1 << 20;
    config.proposer.max_batch_bytes = 1 << 20;
    let err = Replica::open(config, KvMachine::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ReplicaError::Invalid(_)), "{err}");
    assert!(err.to_string().contains("max_batch_bytes"), "{err}");
}

#[tokio::test]
async fn a_write_forwarded_to_a_leader_nobody_listens_on_was_certainly_not_applied() {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let channels = Channels::tcp(NetworkConfig::default());
    assert_forward_not_applied(&channels, ReplicaId(1), &addr).await;
}

/// Forwards a write to `leader` at `addr` through `channels` and checks it failed as
/// certainly not applied (safe to send again).
async fn assert_forward_not_applied(channels: &Channels, leader: ReplicaId, addr: &str) {
    let err = channels
        .forward::<KvMachine>(
            leader,
            addr,
            vec![KvCommand::Set {
                key: "k".into(),
                value: "v".into(),
            }],
        )
        .await
        .unwrap_err();
    assert_eq!(err, WriteError::NoLeader, "{err}");
    assert!(err.certainly_not_applied());
}

/// The service a daemon mounts behind its TLS layer fails closed without that layer: no call
/// but `Status` is heard from a caller no transport proved to be a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mounted_service_refuses_callers_no_transport_proved() {
    let (_dir, replica, _server, _addr) = one_replica(4 << 20).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bare = listener.local_addr().unwrap().to_string();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let service = replica.service();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    let channels = Channels::tcp(NetworkConfig::default());
    let mut client = channels.client(&bare).unwrap();
    let vote = RaftPayload {
        data: docket_raft::codec::encode(&vote_request()).unwrap(),
    };
    let refused = client.vote(vote).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("Vote"), "{refused}");
    let empty = RaftPayload {
        data: docket_raft::codec::encode(&()).unwrap(),
    };
    for refused in [
        client.read_index(empty.clone()).await.unwrap_err(),
        client.forward(empty.clone()).await.unwrap_err(),
    ] {
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    }
    // Status stays open to tools.
    client.status(empty).await.unwrap();
    server.abort();
}

/// A peer's Raft messages go over a channel made for that replica (the daemon's TLS maker
/// then refuses any other replica answering at its address), and forwarded writes and read
/// indexes over one made for the leader they name; only status probes by address take
/// whichever replica is there.
#[tokio::test]
async fn raft_messages_go_over_channels_pinned_to_their_replica() {
    use std::sync::{Arc, Mutex};
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    type Made = Vec<(Option<ReplicaId>, String)>;
    let made: Arc<Mutex<Made>> = Arc::default();
    let record = made.clone();
    let maker: docket_raft::network::ChannelMaker = Arc::new(move |to, at: &str| {
        record.lock().unwrap().push((to, at.to_owned()));
        Ok(
            tonic::transport::Endpoint::from_shared(format!("http://{at}"))
                .map_err(|e| e.to_string())?
                .connect_timeout(Duration::from_millis(500))
                .connect_lazy(),
        )
    });
    let channels = Channels::with_maker(NetworkConfig::default(), maker);
    let mut factory = NetworkFactory::new(ReplicaId(1), channels.clone());
    let mut peer = <NetworkFactory as RaftNetworkFactory<TypeConfig<KvMachine>>>::new_client(
        &mut factory,
        ReplicaId(2),
        &ReplicaAddr { addr: addr.clone() },
    )
    .await;
    let _ = RaftNetwork::<TypeConfig<KvMachine>>::vote(
        &mut peer,
        vote_request(),
        RPCOption::new(Duration::from_secs(2)),
    )
    .await;
    let _ = channels
        .forward::<KvMachine>(ReplicaId(3), &addr, Vec::new())
        .await;
    let _ = channels.status(&addr, Duration::from_secs(1)).await;
    // A second message to replica 2 reuses its channel.
    let _ = RaftNetwork::<TypeConfig<KvMachine>>::vote(
        &mut peer,
        vote_request(),
        RPCOption::new(Duration::from_secs(2)),
    )
    .await;
    assert_eq!(
        *made.lock().unwrap(),
        vec![
            (Some(ReplicaId(2)), addr.clone()),
            (Some(ReplicaId(3)), addr.clone()),
            (None, addr.clone()),
        ]
    );
}

/// A connector that refuses every connection as a TLS layer refuses a server that is not the
/// replica dialled (after the handshake, before anything is sent).
#[derive(Clone)]
struct WrongReplica;

impl tower::Service<http::Uri> for WrongReplica {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        std::future::ready(Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "answered as replica 3, not replica 2",
        )))
    }
}

/// A write forwarded to a leader whose connection is refused by the connector (the server
/// at its address is another replica) was certainly not applied: nothing was sent, and the
/// caller may send it again.
#[tokio::test]
async fn a_write_whose_connection_the_connector_refused_was_certainly_not_applied() {
    let maker: docket_raft::network::ChannelMaker = std::sync::Arc::new(|_, at: &str| {
        Ok(
            tonic::transport::Endpoint::from_shared(format!("http://{at}"))
                .map_err(|e| e.to_string())?
                .connect_with_connector_lazy(WrongReplica),
        )
    });
    let channels = Channels::with_maker(NetworkConfig::default(), maker);
    assert_forward_not_applied(&channels, ReplicaId(2), "127.0.0.1:9").await;
}
