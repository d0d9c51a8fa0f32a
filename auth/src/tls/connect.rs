//! TLS channels for tonic clients: to the controllers (replicas to each other, agents, the
//! command line) and to one node's agent (srun).
//!
//! [`Connector`] is the tower service tonic's `Endpoint::connect_with_connector_lazy` calls
//! for each new connection: TCP (no Nagle delay), then a TLS handshake with the client
//! configuration in force at that moment, checking that the server is a controller replica
//! for the name dialled (and, between replicas, the very replica dialled). The channel itself
//! speaks plain `http://` to that stream.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint};

use crate::tls::config::TlsContext;
use crate::tls::role::Role;

/// Makes TLS connections to controllers, to one replica, or to the agent of one node.
#[derive(Debug, Clone)]
pub struct Connector {
    tls: TlsContext,
    dialled: Dialled,
}

/// Whom a connection must reach.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Dialled {
    /// Any controller replica (the command line, agents, status probes).
    AnyReplica,
    /// This replica and no other: a replica's Raft messages to a peer. Without the check, a
    /// replica answering at another's address (a moved port, a redirected connection, a
    /// compromised host) would be counted as that other in every quorum.
    Replica(u64),
    /// The agent of this node.
    Node(String),
}

impl Connector {
    pub fn new(tls: TlsContext) -> Self {
        Connector {
            tls,
            dialled: Dialled::AnyReplica,
        }
    }

    /// Connections that accept only replica `id`.
    pub fn to_replica(tls: TlsContext, id: u64) -> Self {
        Connector {
            tls,
            dialled: Dialled::Replica(id),
        }
    }

    /// Connections that accept only the agent of `node`.
    pub fn to_node(tls: TlsContext, node: &str) -> Self {
        Connector {
            tls,
            dialled: Dialled::Node(node.to_owned()),
        }
    }
}

/// Refuses a connection whose server is not replica `want` (its certificate, verified
/// during the handshake as a replica's of the cluster CA, names another).
fn check_replica(stream: &TlsStream<TcpStream>, want: u64, at: &str) -> std::io::Result<()> {
    let role = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .map(|leaf| Role::of_certificate(leaf));
    let why = match role {
        Some(Ok(Role::Replica(id))) if id == want => return Ok(()),
        Some(Ok(other)) => format!("{at} answered as {other}, not replica {want}"),
        Some(Err(e)) => format!("{at}: the server's certificate: {e}"),
        None => format!("{at} presented no certificate"),
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        why,
    ))
}

type Connecting =
    Pin<Box<dyn Future<Output = Result<TokioIo<TlsStream<TcpStream>>, std::io::Error>> + Send>>;

impl tower::Service<http::Uri> for Connector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let config = match &self.dialled {
            Dialled::AnyReplica | Dialled::Replica(_) => Ok(self.tls.client_config()),
            Dialled::Node(node) => self.tls.node_client_config(node),
        };
        let pinned = match self.dialled {
            Dialled::Replica(id) => Some(id),
            _ => None,
        };
        Box::pin(async move {
            let invalid =
                |what: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
            let config = config.map_err(|e| invalid(e.to_string()))?;
            let host = uri
                .host()
                .ok_or_else(|| invalid(format!("{uri}: no host")))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri
                .port_u16()
                .ok_or_else(|| invalid(format!("{uri}: no port")))?;
            let name = ServerName::try_from(host.clone())
                .map_err(|e| invalid(format!("{host}: not a server name: {e}")))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            if let Some(id) = pinned {
                check_replica(&stream, id, &format!("{host}:{port}"))?;
            }
            Ok(TokioIo::new(stream))
        })
    }
}

/// A lazily connected TLS channel to the controller at `addr` (`host:port`).
pub fn channel(
    addr: &str,
    tls: &TlsContext,
    connect_timeout: Duration,
    timeout: Option<Duration>,
) -> Result<Channel, String> {
    let mut endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("{addr:?} is not host:port: {e}"))?
        .connect_timeout(connect_timeout);
    if let Some(t) = timeout {
        endpoint = endpoint.timeout(t);
    }
    Ok(endpoint.connect_with_connector_lazy(Connector::new(tls.clone())))
}

/// Like [`channel`], connected now: TCP and the TLS handshake within `connect_timeout`, or
/// the reason they failed (and then nothing was sent on it).
pub async fn connect(
    addr: &str,
    tls: &TlsContext,
    connect_timeout: Duration,
    timeout: Option<Duration>,
) -> Result<Channel, String> {
    let mut endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("{addr:?} is not host:port: {e}"))?
        .connect_timeout(connect_timeout);
    if let Some(t) = timeout {
        endpoint = endpoint.timeout(t);
    }
    endpoint
        .connect_with_connector(Connector::new(tls.clone()))
        .await
        .map_err(|e| {
            let why =
                std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
            format!("{addr}: cannot connect: {why}")
        })
}

/// Like [`channel`], with HTTP/2 keep-alives (for long-lived channels between replicas and
/// from agents, which must notice a dead peer). With `replica`, to that replica at `addr`
/// and to no other: a connection whose server presents another replica's certificate is
/// refused before anything is sent on it.
pub fn channel_with_keepalive(
    addr: &str,
    replica: Option<u64>,
    tls: &TlsContext,
    connect_timeout: Duration,
) -> Result<Channel, String> {
    let endpoint = keepalive_endpoint(addr, connect_timeout, Duration::from_secs(5))?;
    let connector = match replica {
        Some(id) => Connector::to_replica(tls.clone(), id),
        None => Connector::new(tls.clone()),
    };
    Ok(endpoint.connect_with_connector_lazy(connector))
}

/// Like [`channel`], with an HTTP/2 ping whenever nothing has arrived for `ping`: when one is
/// not answered within `ping`, the peer is taken for gone and every call on the connection
/// fails at once. A stopped process (SIGSTOP, a hung host) holds its TCP connections, so only
/// silence tells; this is for a node agent's channel to its leader, which must notice such a
/// leader within a second or two to find the new one.
pub fn pinged_channel(
    addr: &str,
    tls: &TlsContext,
    connect_timeout: Duration,
    timeout: Option<Duration>,
    ping: Duration,
) -> Result<Channel, String> {
    let mut endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("{addr:?} is not host:port: {e}"))?
        .connect_timeout(connect_timeout)
        .http2_keep_alive_interval(ping)
        .keep_alive_timeout(ping)
        .keep_alive_while_idle(true);
    if let Some(t) = timeout {
        endpoint = endpoint.timeout(t);
    }
    Ok(endpoint.connect_with_connector_lazy(Connector::new(tls.clone())))
}

/// An endpoint for a long-lived channel: HTTP/2 pings every 10 s, the peer dead after
/// `keep_alive_timeout` without an answer.
fn keepalive_endpoint(
    addr: &str,
    connect_timeout: Duration,
    keep_alive_timeout: Duration,
) -> Result<Endpoint, String> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("{addr:?} is not host:port: {e}"))?
        .connect_timeout(connect_timeout)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(keep_alive_timeout))
}

/// A lazily connected TLS channel to the agent of `node` at `addr` (`host:port`), which must
/// present that node's certificate.
pub fn node_channel(
    addr: &str,
    node: &str,
    tls: &TlsContext,
    connect_timeout: Duration,
) -> Result<Channel, String> {
    let endpoint = keepalive_endpoint(addr, connect_timeout, Duration::from_secs(20))?;
    Ok(endpoint.connect_with_connector_lazy(Connector::to_node(tls.clone(), node)))
}
