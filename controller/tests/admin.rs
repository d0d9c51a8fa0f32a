//! The admin API and the HTTP endpoints against three `docket-controller` processes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, DEADLINE, as_user, job, submit};
use docket_proto::v1 as pb;
use docket_proto::v1::admin_client::AdminClient;
use tonic::transport::Channel;

/// Checks `admin` (on `follower`) reports all three replicas, `leader` leading, with their lag.
async fn check_cluster_status(admin: &mut AdminClient<Channel>, leader: u64, follower: u64) {
    let status = admin
        .cluster_status(as_user("alice", pb::ClusterStatusRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.leader_id, Some(leader));
    assert_eq!(status.answered_by, follower);
    assert_eq!(status.replicas.len(), 3);
    let roles: Vec<&str> = status.replicas.iter().map(|r| r.role.as_str()).collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "leader").count(),
        1,
        "{roles:?}"
    );
    assert_eq!(
        roles.iter().filter(|r| **r == "follower").count(),
        2,
        "{roles:?}"
    );
    assert!(
        status
            .replicas
            .iter()
            .all(|r| r.reachable && r.voter && r.lag.is_some())
    );
}

/// `user` drains node n01 for `reason`.
async fn drain_n01(
    admin: &mut AdminClient<Channel>,
    user: &str,
    reason: &str,
) -> Result<pb::AdminReply, tonic::Status> {
    let request = pb::DrainNodeRequest {
        node: "n01".into(),
        reason: reason.into(),
    };
    admin
        .drain_node(as_user(user, request))
        .await
        .map(tonic::Response::into_inner)
}

/// Checks draining n01 needs root and a reason and shows in the listing; resumes n01.
async fn check_drain_and_resume(admin: &mut AdminClient<Channel>) {
    let e = drain_n01(admin, "alice", "disk").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let e = drain_n01(admin, "root", " ").await.unwrap_err();
    assert!(e.message().contains("reason"), "{e}");
    drain_n01(admin, "root", "disk replacement").await.unwrap();
    let nodes = admin
        .list_nodes(as_user("alice", pb::ListNodesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .nodes;
    let n01 = nodes.iter().find(|n| n.name == "n01").unwrap();
    assert!(n01.state.starts_with("drain"), "{n01:?}");
    assert_eq!(n01.reason, "disk replacement");
    assert_eq!(n01.partitions, vec!["batch".to_owned()]);
    admin
        .resume_node(as_user("root", pb::NodeRequest { node: "n01".into() }))
        .await
        .unwrap();
}

/// Root's ApplyConfig of `toml`.
async fn apply_config(
    admin: &mut AdminClient<Channel>,
    toml: &str,
    dry_run: bool,
    objects_only: bool,
) -> Result<pb::ApplyConfigResponse, tonic::Status> {
    let request = pb::ApplyConfigRequest {
        toml: toml.into(),
        dry_run,
        objects_only,
    };
    admin
        .apply_config(as_user("root", request))
        .await
        .map(tonic::Response::into_inner)
}

/// Checks dry runs of `toml` and of a user in no account report changes and change nothing.
async fn check_dry_runs(admin: &mut AdminClient<Channel>, toml: &str) {
    let dry = apply_config(admin, toml, true, false).await.unwrap();
    assert!(
        dry.changes.iter().any(|c| c == "upsert partition debug"),
        "{dry:?}"
    );
    assert!(!dry.applied);
    assert!(dry.errors.iter().all(String::is_empty), "{dry:?}");
    // A dry run applies to a copy: a user in an account that does not exist is refused
    // there, with the core's own words; objects_only keeps the scheduler parameters out.
    let carol = "[[users]]\nName = \"carol\"\nDefaultAccount = \"nosuch\"\n";
    let bad_user = apply_config(admin, carol, true, true).await.unwrap();
    assert!(bad_user.changes == ["upsert user carol"], "{bad_user:?}");
    let refused: Vec<&String> = bad_user.errors.iter().filter(|e| !e.is_empty()).collect();
    assert_eq!(refused.len(), 1, "{bad_user:?}");
    assert!(refused[0].contains("nosuch"), "{bad_user:?}");
    let config = admin
        .get_config(as_user("alice", pb::GetConfigRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert!(!config.partitions.contains(&"debug".to_owned()));
    assert!(config.sched_config_json.contains("max_array_size"));
}

/// Waits until the leader's diagnostics show the main pass has run twice and a job runs.
async fn wait_scheduler_ran(admin: &mut AdminClient<Channel>) {
    let start = Instant::now();
    loop {
        let d = admin
            .scheduler_diagnostics(as_user("alice", pb::DiagnosticsRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert!(d.leader);
        let main = d.passes.iter().find(|p| p.pass == "main");
        if main.is_some_and(|m| m.runs >= 2) && d.jobs.get("RUNNING").copied().unwrap_or(0) >= 1 {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "{d:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks the leader's Prometheus metrics and a follower's JSON status.
fn check_http_endpoints(cluster: &Cluster, leader: u64, follower: u64) {
    let metrics = cluster.http_get(leader, "/metrics");
    for family in [
        "docket_jobs{state=\"running\"}",
        "docket_raft_term",
        "docket_raft_is_leader 1",
        "docket_raft_replica_lag_entries",
        "docket_sched_pass_duration_seconds",
        "docket_rpc_duration_seconds",
    ] {
        assert!(metrics.contains(family), "no {family} in\n{metrics}");
    }
    let status: serde_json::Value =
        serde_json::from_str(&cluster.http_get(follower, "/status")).unwrap();
    assert_eq!(status["raft"]["role"], "follower");
    assert!(status["jobs"]["running"].as_u64().unwrap() >= 1, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_nodes_config_and_diagnostics() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.follower_of(leader);
    let mut admin = cluster.admin(follower).await;

    // Any replica reports every replica, with the leader's view of their lag.
    check_cluster_status(&mut admin, leader, follower).await;

    // Changing anything needs the admin role; a denial changes nothing.
    check_drain_and_resume(&mut admin).await;

    // Config: a dry run says what it would do and changes nothing; applying adds a partition.
    // ApplyConfig takes the whole file, as `scontrol reconfigure` rereads slurm.conf.
    let toml = std::fs::read_to_string(common::site_config()).unwrap()
        + "\n[[partitions]]\nPartitionName = \"debug\"\nNodes = \"n[01-02]\"\nMaxTime = \"30:00\"\n";
    check_dry_runs(&mut admin, &toml).await;
    let applied = apply_config(&mut admin, &toml, false, false).await.unwrap();
    assert!(applied.applied, "{applied:?}");
    let mut jobs = cluster.jobs(follower).await;
    let r = submit(&mut jobs, "alice", vec![job("dbg", "debug")])
        .await
        .unwrap();
    assert!(
        matches!(r[0].result, Some(pb::submit_result::Result::JobId(_))),
        "{r:?}"
    );
    let bad_time = "[[partitions]]\nPartitionName = \"x\"\nMaxTime = \"5 days\"\n";
    let e = apply_config(&mut admin, bad_time, true, false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    // Diagnostics: the leader's loops have run.
    wait_scheduler_ran(&mut cluster.admin(leader).await).await;

    // HTTP: Prometheus metrics and a JSON status on every replica.
    check_http_endpoints(&cluster, leader, follower);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_added_and_removed_at_run_time() {
    let mut cluster = Cluster::start(3).await;
    cluster.spawn_extra(4);
    let leader = cluster.leader().await;
    let follower = cluster.follower_of(leader);

    // Asked of a follower, membership changes name the leader.
    let e = cluster
        .admin(follower)
        .await
        .add_replica(as_user(
            "root",
            pb::AddReplicaRequest {
                id: 4,
                addr: cluster.addrs[&4].clone(),
                learner: false,
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        e.metadata()
            .get(docket_proto::metadata::LEADER)
            .unwrap()
            .to_str()
            .unwrap(),
        cluster.addrs[&leader]
    );

    let mut admin = cluster.admin(leader).await;
    admin
        .add_replica(as_user(
            "root",
            pb::AddReplicaRequest {
                id: 4,
                addr: cluster.addrs[&4].clone(),
                learner: false,
            },
        ))
        .await
        .unwrap();
    // Every member answers; the new one may take a moment to accept the leader's first
    // status call after it joined.
    let start = Instant::now();
    loop {
        let status = admin
            .cluster_status(as_user("root", pb::ClusterStatusRequest::default()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(status.replicas.len(), 4);
        assert!(status.replicas.iter().all(|r| r.voter), "{status:?}");
        if status.replicas.iter().all(|r| r.reachable) {
            break;
        }
        eprintln!("not yet all reachable: {status:?}");
        assert!(start.elapsed() < DEADLINE, "{status:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The new replica serves reads of the whole queue.
    // (UNAVAILABLE, retryable, until it has heard from the leader.)
    let mut jobs = cluster.jobs(4).await;
    let start = Instant::now();
    loop {
        match common::list(&mut jobs, "alice", pb::ListJobsRequest::default()).await {
            Ok(_) => break,
            Err(e) if e.code() == tonic::Code::Unavailable && start.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("replica 4 cannot serve reads: {e}"),
        }
    }

    admin
        .remove_replica(as_user("root", pb::RemoveReplicaRequest { id: 4 }))
        .await
        .unwrap();
    let status = admin
        .cluster_status(as_user("root", pb::ClusterStatusRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.replicas.len(), 3, "{status:?}");
    let e = admin
        .remove_replica(as_user("root", pb::RemoveReplicaRequest { id: 9 }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
}

/// A new cluster takes its site file in one log entry, not one per node: a thousand-node site
/// waited for a thousand commits before its agents could register (11 minutes on a starved
/// host), and a leader lost halfway left a cluster with part of its nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_takes_its_site_file_in_one_entry() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("docket.toml");
    let toml = std::fs::read_to_string(common::site_config()).unwrap()
        + "\n[[nodes]]\nNodeName = \"w[001-300]\"\nCPUs = 4\nRealMemory = \"8G\"\n\
           \n[[partitions]]\nPartitionName = \"wide\"\nNodes = \"w[001-300]\"\n";
    std::fs::write(&site, toml).unwrap();
    let cluster = Cluster::start_custom(3, site, &["--agent-fence-ms", "0"]).await;
    let leader = cluster.leader().await;
    let mut admin = cluster.admin(leader).await;
    let status = admin
        .cluster_status(as_user("alice", pb::ClusterStatusRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let applied = status
        .replicas
        .iter()
        .find(|r| r.id == leader)
        .and_then(|r| r.applied_index)
        .unwrap();
    // Membership, the leader's blank entry, the site and a few of the loops' own writes;
    // one entry per command would be over 300.
    assert!(applied < 100, "configured at log index {applied}");
}
