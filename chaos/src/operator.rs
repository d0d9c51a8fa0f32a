//! The operator on call during a run: returns to service the nodes the controller declared
//! down for not responding once their agent is back.
//!
//! A node declared down stays down until an administrator resumes it, as in Slurm with
//! `ReturnToService=0` (its default). A site's operator does that after an outage; an hour
//! of faults without one leaves every node down in the end (a soak did: its backlog could
//! never drain). So the harness resumes, every few seconds, each node that is down for
//! not responding and whose agent the leader reports as responding again. Nothing else is
//! touched: a node an administrator drained or downed for another reason stays as it is.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use docket_deploy::rpc;
use docket_proto::v1 as pb;

/// What the controller's down declarations for silent agents say (`agents.rs`).
const NOT_RESPONDING: &str = "agent not responding";

/// Resumes returned nodes every `every` until `stop`; how many resumptions it made.
pub async fn return_to_service(addrs: Vec<String>, every: Duration, stop: Arc<AtomicBool>) -> u64 {
    let mut resumed = 0;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(every).await;
        let Some((_, leader)) = rpc::leader(&addrs).await else {
            continue;
        };
        let Ok(nodes) = rpc::nodes(&leader).await else {
            continue;
        };
        for node in nodes.iter().filter(|n| returned(n)) {
            let Ok(mut admin) = rpc::admin(&leader) else {
                break;
            };
            let req = rpc::as_user(
                "root",
                pb::NodeRequest {
                    node: node.name.clone(),
                },
            );
            if admin.resume_node(req).await.is_ok() {
                resumed += 1;
            }
        }
    }
    resumed
}

/// Down for not responding, and responding again.
fn returned(node: &pb::NodeInfo) -> bool {
    node.state == "down" && node.reason.starts_with(NOT_RESPONDING) && node.responding == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(state: &str, reason: &str, responding: Option<bool>) -> pb::NodeInfo {
        pb::NodeInfo {
            name: "n01".into(),
            state: state.into(),
            reason: reason.into(),
            responding,
            ..Default::default()
        }
    }

    #[test]
    fn only_nodes_down_for_silence_and_back_are_resumed() {
        assert!(returned(&node(
            "down",
            "agent not responding for 9 s",
            Some(true)
        )));
        // Still silent, or nobody knows: left down.
        assert!(!returned(&node(
            "down",
            "agent not responding for 9 s",
            Some(false)
        )));
        assert!(!returned(&node(
            "down",
            "agent not responding for 9 s",
            None
        )));
        // An administrator's decisions stay.
        assert!(!returned(&node("down", "bad DIMM", Some(true))));
        assert!(!returned(&node(
            "drain",
            "agent not responding",
            Some(true)
        )));
        assert!(!returned(&node("idle", "", Some(true))));
    }
}
