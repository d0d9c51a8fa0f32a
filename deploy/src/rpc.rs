//! Calls to the controllers, as the launcher makes them: one short-timeout channel per call,
//! the caller named in `x-docket-user`.

use std::time::Duration;

use docket_proto::v1 as pb;
use docket_proto::v1::admin_client::AdminClient;
use docket_proto::v1::jobs_client::JobsClient;
use tonic::transport::{Channel, Endpoint};

use crate::LaunchError;

fn channel(addr: &str) -> Result<Channel, LaunchError> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| LaunchError::Invalid(format!("{addr}: {e}")))?
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(10))
        .connect_lazy())
}

pub fn admin(addr: &str) -> Result<AdminClient<Channel>, LaunchError> {
    Ok(AdminClient::new(channel(addr)?))
}

pub fn jobs(addr: &str) -> Result<JobsClient<Channel>, LaunchError> {
    Ok(JobsClient::new(channel(addr)?))
}

/// `message` from `user`.
pub fn as_user<T>(user: &str, message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Ok(v) = user.parse() {
        r.metadata_mut().insert("x-docket-user", v);
    }
    r
}

/// The cluster as the first answering replica of `addrs` sees it.
pub async fn cluster_status(addrs: &[String]) -> Option<pb::ClusterStatusResponse> {
    for a in addrs {
        if let Ok(mut c) = admin(a)
            && let Ok(r) = c
                .cluster_status(as_user("root", pb::ClusterStatusRequest {}))
                .await
        {
            return Some(r.into_inner());
        }
    }
    None
}

/// The leader's id and address, if one of `addrs` knows it and it answers as leader.
pub async fn leader(addrs: &[String]) -> Option<(u64, String)> {
    let s = cluster_status(addrs).await?;
    let id = s.leader_id?;
    let leader = s.replicas.iter().find(|r| r.id == id)?;
    (leader.role == "leader").then(|| (id, leader.addr.clone()))
}

/// Whether a job has reached a final state (not pending, running, suspended or completing).
pub fn is_final(j: &pb::JobInfo) -> bool {
    !matches!(j.state_code.as_str(), "PD" | "R" | "S" | "CG")
}

/// Nodes as the leader lists them (with `responding` filled).
pub async fn nodes(leader: &str) -> Result<Vec<pb::NodeInfo>, LaunchError> {
    let mut c = admin(leader)?;
    Ok(c.list_nodes(as_user("root", pb::ListNodesRequest {}))
        .await
        .map_err(|s| LaunchError::Rpc(format!("list nodes: {}", s.message())))?
        .into_inner()
        .nodes)
}

/// Every job in the queue (all pages).
pub async fn all_jobs(addr: &str) -> Result<Vec<pb::JobInfo>, LaunchError> {
    all_jobs_read(addr, pb::ReadConsistency::Linearizable).await
}

/// Every job in the queue as the replica at `addr` answers with `consistency` (stale: its
/// own applied view, without asking the leader).
pub async fn all_jobs_read(
    addr: &str,
    consistency: pb::ReadConsistency,
) -> Result<Vec<pb::JobInfo>, LaunchError> {
    let mut c = jobs(addr)?;
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list_jobs(as_user(
                "root",
                pb::ListJobsRequest {
                    page_size: 10_000,
                    page_token: token.clone(),
                    consistency: consistency as i32,
                    ..Default::default()
                },
            ))
            .await
            .map_err(|s| LaunchError::Rpc(format!("list jobs: {}", s.message())))?
            .into_inner();
        out.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}
