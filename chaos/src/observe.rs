//! Watching the replicas: each replica is asked for its own Raft status every 50 ms (one
//! poller per replica, so a stopped one delays only its own poller); every replica that
//! reports itself leader is recorded with its term, for the at-most-one-leader-per-term
//! check.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use docket_raft::network::{Channels, NetworkConfig};
use docket_raft::status::Role;

use crate::history::{History, LeaderSeen};

/// Polls every replica until `stop`.
pub async fn leaders(addrs: Vec<String>, history: History, stop: Arc<AtomicBool>) {
    // Over TLS, as the launcher's tool certificate (which may read Raft status, nothing else).
    let Ok(access) = docket_deploy::rpc::access() else {
        return;
    };
    let channels = Channels::with_maker(
        NetworkConfig::default(),
        Arc::new(move |_, addr: &str| {
            docket_auth::tls::connect::channel(addr, &access.tls, Duration::from_millis(500), None)
        }),
    );
    let pollers: Vec<_> = addrs
        .into_iter()
        .map(|addr| {
            let (channels, history, stop) = (channels.clone(), history.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(s) = channels.status(&addr, Duration::from_millis(500)).await
                        && s.role == Role::Leader
                    {
                        history.leader(LeaderSeen {
                            term: s.term,
                            replica: s.id.0,
                            at_ms: history.now_ms(),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect();
    for p in pollers {
        let _ = p.await;
    }
}
