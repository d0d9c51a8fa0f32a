//! How replicas talk: the gRPC `docket.v1.Raft` service ([`service`]) and the client side
//! ([`client`]), openraft's `RaftNetworkFactory` over tonic.
//!
//! Payloads are openraft's own messages, postcard-encoded (see the proto file for why).
//! Both sides refuse messages over [`NetworkConfig::max_message_bytes`]: the server through
//! tonic's decoding limit, the client before sending (an oversized append is answered with
//! openraft's `PayloadTooLarge`, which makes the leader send fewer entries).
//!
//! The transport is injectable: the server is a tonic service the caller mounts on any
//! server (TCP in production, a simulated network in chaos tests), and the client builds its
//! channels through a [`ChannelMaker`] (lazy TCP connections by default).

pub mod client;
pub mod service;

pub use client::{ChannelMaker, Channels, NetworkFactory};
pub use service::{PeerProof, PeerReplica, RaftGrpc};

/// Limits of the replica-to-replica transport.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// Largest message sent or accepted, in bytes.
    pub max_message_bytes: usize,
    /// How long to wait for a TCP connection to a peer.
    pub connect_timeout: std::time::Duration,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            max_message_bytes: 64 << 20,
            connect_timeout: std::time::Duration::from_millis(500),
        }
    }
}
