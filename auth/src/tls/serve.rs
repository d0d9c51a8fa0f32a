//! Accepting TLS connections for a tonic server.
//!
//! Each accepted TCP connection is handshaken on a task of its own, under a deadline and a
//! bound on handshakes in flight, so a client that connects and says nothing (or speaks plain
//! text) neither blocks other clients nor costs more than a socket for a few seconds. The
//! handshake takes the server configuration in force at that moment ([`TlsContext`] reloads
//! it), and tonic sees each connection's peer certificates (`Request::peer_certs`).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use crate::tls::config::TlsContext;

/// Handshakes in progress at once; connections beyond wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 512;
/// How long a client has to finish its handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// The TLS connections accepted on `listener`, for `Server::serve_with_incoming`. Accepting
/// stops when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: TlsContext,
) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let slot = tokio::select! {
                _ = tx.closed() => return,
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(s) => s,
                    Err(_) => return,
                },
            };
            let (tcp, peer) = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors and the like: pause rather than spin.
                        tracing::warn!(error = %e, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let config = match tls.server_config() {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "no TLS configuration to serve with");
                    continue;
                }
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let acceptor = tokio_rustls::TlsAcceptor::from(config);
                match tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake refused");
                    }
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
