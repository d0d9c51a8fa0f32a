//! Serving the HTTP port (status page, `/metrics`, `/status`) within bounds.
//!
//! The port is anonymous: whoever reaches it may connect. Left to itself a server would keep
//! every connection it accepts for as long as the peer likes, so a handful of peers that
//! open connections and send nothing, or send headers a byte at a time (slowloris), could
//! hold file descriptors and tasks without end. Here:
//! - at most [`HttpLimits::connections`] are served at once, and at most
//!   [`HttpLimits::per_peer`] from one peer (an IPv4 address, or an IPv6 /64, which one
//!   host commonly holds whole); a connection over either is closed as soon as it is
//!   accepted, so a few peers cannot take the whole budget;
//! - a request's headers must arrive within [`HttpLimits::header_read`] (hyper's timer, which
//!   also closes a kept-alive connection that sends no next request in that time), and be at
//!   most [`MAX_HEADER_BYTES`] (hyper answers 431 beyond);
//! - no connection lives longer than [`HttpLimits::lifetime`]: it is then shut down
//!   gracefully (a request in flight finishes).
//!
//! Rendering itself is bounded by the page's own turn ([`crate::web`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The largest request head (request line and headers) read.
pub const MAX_HEADER_BYTES: usize = 16 << 10;

/// How much the HTTP port serves at once, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub connections: usize,
    pub per_peer: usize,
    pub header_read: Duration,
    pub lifetime: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            connections: 256,
            per_peer: 8,
            header_read: Duration::from_secs(10),
            lifetime: Duration::from_secs(300),
        }
    }
}

/// Connections open per peer.
#[derive(Debug, Default, Clone)]
struct Peers(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// The peer a connection counts against: its IPv4 address (an IPv4-mapped IPv6 address
/// counts as the IPv4 one), or its IPv6 /64.
fn peer_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

/// Whether an accept error says the process or system is out of something (descriptors,
/// memory), so accepting again at once would fail again.
fn exhausted(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    e.raw_os_error().map(Errno::from_raw).is_some_and(|errno| {
        matches!(
            errno,
            Errno::EMFILE | Errno::ENFILE | Errno::ENOMEM | Errno::ENOBUFS
        )
    })
}

/// One connection counted against its peer until dropped.
#[derive(Debug)]
struct PeerSlot {
    peers: Peers,
    ip: IpAddr,
}

impl Peers {
    fn take(&self, ip: IpAddr, limit: usize) -> Option<PeerSlot> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_default();
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves `router` on `listener` within `limits` until the task is dropped.
pub async fn serve(listener: TcpListener, router: axum::Router, limits: HttpLimits) {
    let total = Arc::new(Semaphore::new(limits.connections.max(1)));
    let peers = Peers::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of descriptors or memory: wait a little instead of spinning. Anything else
            // (a connection reset before it was accepted) concerns that connection alone.
            Err(e) if exhausted(&e) => {
                tracing::warn!(error = %e, "cannot accept HTTP connections for now");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, "accepting an HTTP connection");
                continue;
            }
        };
        let Ok(permit) = total.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "HTTP connection refused: the port serves enough already");
            continue;
        };
        let Some(slot) = peers.take(peer_of(peer.ip()), limits.per_peer.max(1)) else {
            tracing::debug!(%peer, "HTTP connection refused: that address has enough open");
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let _held = (permit, slot);
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .max_header_size(MAX_HEADER_BYTES);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = tokio::time::sleep(limits.lifetime) => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(5), connection).await;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::peer_of;

    #[test]
    fn a_peer_is_an_ipv4_address_or_an_ipv6_slash_64() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(peer_of(ip("10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(peer_of(ip("::ffff:10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(peer_of(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(
            peer_of(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")),
            peer_of(ip("2001:db8:1:2::7"))
        );
        assert_ne!(
            peer_of(ip("2001:db8:1:3::7")),
            peer_of(ip("2001:db8:1:2::7"))
        );
    }
}
