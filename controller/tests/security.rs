//! Attacks on the controllers' transport and roles, each refused with a clear error and
//! nothing changed: plain text; Raft calls (appends, votes, a forged `Forward` of an admin
//! command) from certificates that are not replicas', or from no certificate; credentials
//! expired, from the future, or too long-lived; a user over their request rate; a replica
//! answering at another's address.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Cluster, as_user, list};
use docket_core::{Actor, Command, Envelope};
use docket_proto::v1 as pb;
use docket_proto::v1::jobs_client::JobsClient;
use docket_proto::v1::raft_client::RaftClient;
use tonic::transport::Channel;

/// The Raft service at `addr`, over TLS with `role`'s certificate.
fn raft_as(addr: &str, role: docket_auth::tls::Role) -> RaftClient<tonic::transport::Channel> {
    let files = common::secrets().local.issue(&role, &[]).unwrap();
    let tls = docket_auth::tls::TlsContext::load(files).unwrap();
    RaftClient::new(
        docket_auth::tls::connect::channel(addr, &tls, Duration::from_secs(2), None).unwrap(),
    )
}

/// A forwarded batch: root draining node n01, as a follower would forward it.
fn forged_drain() -> pb::RaftPayload {
    let commands = vec![Envelope::new(
        Actor::Operator,
        Command::DrainNode {
            node: "n01".parse().unwrap(),
            reason: "forged".into(),
        },
    )];
    pb::RaftPayload {
        data: docket_raft::codec::encode(&commands).unwrap(),
    }
}

async fn n01_drained(cluster: &Cluster) -> bool {
    let leader = cluster.leader().await;
    let mut admin = cluster.admin(leader).await;
    let nodes = admin
        .list_nodes(as_user("alice", pb::ListNodesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .nodes;
    nodes
        .iter()
        .any(|n| n.name == "n01" && !n.reason.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_answers_replicas_only() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let addr = cluster.addrs[&leader].clone();
    for role in [
        docket_auth::tls::Role::Node("n01".into()),
        docket_auth::tls::Role::Tool("intruder".into()),
    ] {
        let mut raft = raft_as(&addr, role.clone());
        let e = raft.forward(forged_drain()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{role}: {e:?}");
        assert!(
            e.message()
                .contains("Raft.Forward is for controller replicas"),
            "{e}"
        );
        let e = raft
            .append_entries(pb::RaftPayload { data: vec![] })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{role}: {e:?}");
        let e = raft
            .vote(pb::RaftPayload { data: vec![] })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{role}: {e:?}");
        // The status is for any certificate of the cluster (operators' tools read it).
        raft.status(pb::RaftPayload {
            data: docket_raft::codec::encode(&()).unwrap(),
        })
        .await
        .unwrap();
    }
    // No certificate at all (a user's command line): not even the status.
    let anonymous =
        docket_auth::tls::TlsContext::load(common::secrets().local.anonymous()).unwrap();
    let mut raft = RaftClient::new(
        docket_auth::tls::connect::channel(&addr, &anonymous, Duration::from_secs(2), None)
            .unwrap(),
    );
    let e = raft.forward(forged_drain()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = raft
        .status(pb::RaftPayload { data: vec![] })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    // Plain text: no TLS session, no answer.
    let mut plain = RaftClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .timeout(Duration::from_secs(5))
            .connect_lazy(),
    );
    assert!(plain.forward(forged_drain()).await.is_err());
    assert!(
        !n01_drained(&cluster).await,
        "the forged drain never applied"
    );
    // A replica's certificate is what Raft takes: the same forward from a replica's
    // identity applies (root may drain) — the refusals above were the role, not the payload.
    let mut replica = raft_as(&addr, docket_auth::tls::Role::Replica(9));
    replica.forward(forged_drain()).await.unwrap();
    assert!(n01_drained(&cluster).await);
}

/// The membership says replica 2 is at replica 3's address and 3 at 2's (ports moved, a
/// connection redirected): replica 1 dials each peer by its id and refuses the one that
/// answers there with another replica's certificate. No vote is counted for a replica that
/// did not cast it, so no leader is elected. (Taken on their word, the two answers would
/// make a quorum of impostors.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_answering_at_anothers_address_is_not_counted() {
    let dir = tempfile::tempdir().unwrap();
    let addrs: std::collections::BTreeMap<u64, String> =
        (1..=3).map(|id| (id, common::free_addr())).collect();
    let mut cluster = Cluster {
        extra: vec!["--agent-fence-ms".into(), "0".into()],
        config: common::site_config(),
        dir,
        http: (1..=3).map(|id| (id, common::free_addr())).collect(),
        addrs: addrs.clone(),
        procs: std::collections::BTreeMap::new(),
        raft: common::raft_channels(),
    };
    let swapped = format!("1={},2={},3={}", addrs[&1], addrs[&3], addrs[&2]);
    cluster.spawn(1, Some(&swapped));
    cluster.spawn(2, None);
    cluster.spawn(3, None);
    // Several election timeouts (300-600 ms each); a leader would be elected within one or
    // two of them.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let mut answered = false;
    while std::time::Instant::now() < until {
        for addr in addrs.values() {
            if let Ok(s) = cluster.raft.status(addr, Duration::from_millis(500)).await {
                answered = true;
                assert_eq!(s.leader, None, "{addr} knows a leader: {s:?}");
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(answered, "no replica ever answered a status request");
    // `docket cluster status` names what it found at each address.
    let status = cluster
        .admin(1)
        .await
        .cluster_status(as_user("root", pb::ClusterStatusRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let errors: Vec<(u64, String)> = status
        .replicas
        .iter()
        .map(|r| (r.id, r.error.clone()))
        .collect();
    for (id, other) in [(2, 3), (3, 2)] {
        let error = &errors.iter().find(|(i, _)| *i == id).unwrap().1;
        assert!(
            error.contains(&format!("replica {other} answers there, not replica {id}")),
            "{errors:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_out_of_their_time_are_refused() {
    let cluster = Cluster::start(1).await;
    let mut jobs = cluster.jobs(1).await;
    let before = list(&mut jobs, "alice", pb::ListJobsRequest::default())
        .await
        .unwrap();
    let key = docket_auth::KeyRing::load(&common::secrets().local.key_file()).unwrap();
    let now = docket_proto::unix_ms();
    let with = |issued_ms: u64, expires_ms: u64| {
        let claims = docket_auth::Claims {
            uid: 60_001,
            gid: 60_001,
            gids: vec![],
            user: "alice".into(),
            host: "login".into(),
            issued_ms,
            expires_ms,
            nonce: docket_auth::credential::nonce().unwrap(),
        };
        let token = docket_auth::credential::sign(&key, &claims).unwrap();
        let mut req = tonic::Request::new(pb::SubmitJobsRequest {
            jobs: vec![common::job("late", "")],
        });
        req.metadata_mut()
            .insert(docket_proto::metadata::CREDENTIAL, token.parse().unwrap());
        req
    };
    for (issued, expires, says) in [
        (now - 600_000, now - 300_000, "expired"),
        (now + 300_000, now + 360_000, "in the future"),
        (now, now + 24 * 3_600_000, "lifetime"),
    ] {
        let e = jobs.submit_jobs(with(issued, expires)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{says}: {e:?}");
        assert!(e.message().contains(says), "{says}: {e}");
    }
    // Within the skew allowance (issued 10 s ahead) it is fine.
    jobs.submit_jobs(with(now + 10_000, now + 70_000))
        .await
        .unwrap();
    let after = list(&mut jobs, "alice", pb::ListJobsRequest::default())
        .await
        .unwrap();
    assert_eq!(after.len(), before.len() + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_is_held_to_a_request_rate_and_root_is_not() {
    let cluster = Cluster::start_with(
        1,
        &[
            "--agent-fence-ms",
            "0",
            "--user-rpc-rate",
            "5",
            "--user-rpc-burst",
            "10",
        ],
    )
    .await;
    let mut jobs = cluster.jobs(1).await;
    let mut limited = 0;
    for _ in 0..40 {
        if let Err(e) = jobs
            .list_jobs(as_user("bob", pb::ListJobsRequest::default()))
            .await
        {
            assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
            assert!(e.message().contains("user bob: too many requests"), "{e}");
            limited += 1;
        }
    }
    assert!(limited >= 20, "only {limited} of 40 refused");
    // Another user is not held back by bob, nor is root.
    jobs.list_jobs(as_user("alice", pb::ListJobsRequest::default()))
        .await
        .unwrap();
    for _ in 0..40 {
        jobs.list_jobs(as_user("root", pb::ListJobsRequest::default()))
            .await
            .unwrap();
    }
}

/// The test site with `prefix` in front (top-level keys).
fn site_with(dir: &std::path::Path, prefix: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(common::site_config()).unwrap();
    let path = dir.join("site.toml");
    std::fs::write(&path, format!("{prefix}\n{text}")).unwrap();
    path
}

fn ids(jobs: &[pb::JobInfo]) -> Vec<u64> {
    jobs.iter().map(|j| j.job_id).collect()
}

/// A held job named `name`.
fn held(name: &str) -> pb::JobSpec {
    let mut j = common::job(name, "");
    j.hold = true;
    j
}

/// Submits a held job named `name` as `user`; its id.
async fn submit_held(jobs: &mut JobsClient<Channel>, user: &str, name: &str) -> u64 {
    let r = common::submit(jobs, user, vec![held(name)]).await.unwrap();
    match r[0].result {
        Some(pb::submit_result::Result::JobId(id)) => id,
        ref other => panic!("{other:?}"),
    }
}

/// Checks bob lists and gets only his job `b`, not alice's `a`, root both; root's listing.
async fn check_private_listings(
    jobs: &mut JobsClient<Channel>,
    a: u64,
    b: u64,
) -> Vec<pb::JobInfo> {
    // Listings: bob sees his own; root both.
    let mine = list(jobs, "bob", pb::ListJobsRequest::default())
        .await
        .unwrap();
    assert!(
        ids(&mine).contains(&b) && !ids(&mine).contains(&a),
        "{mine:?}"
    );
    let all = list(jobs, "root", pb::ListJobsRequest::default())
        .await
        .unwrap();
    assert!(ids(&all).contains(&a) && ids(&all).contains(&b));
    // A job bob may not see is, to him, not there.
    let get = |user: &str| {
        as_user(
            user,
            pb::GetJobRequest {
                job_id: a,
                ..Default::default()
            },
        )
    };
    let e = jobs.get_job(get("bob")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    jobs.get_job(get("alice")).await.unwrap();
    all
}

/// Checks bob's priorities, accounting and usage show his job `b` and row, not alice's.
async fn check_private_priority_accounting_and_usage(
    jobs: &mut JobsClient<Channel>,
    a: u64,
    b: u64,
) {
    let prio = jobs
        .explain_priority(as_user("bob", pb::ExplainPriorityRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(prio.jobs.iter().all(|j| j.user == "bob"), "{prio:?}");
    let acct = jobs
        .accounting(as_user("bob", pb::AccountingRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let seen: Vec<u64> = acct
        .records
        .iter()
        .filter_map(|r| r.job.as_ref().map(|j| j.job_id))
        .collect();
    assert!(seen.contains(&b) && !seen.contains(&a), "{seen:?}");
    // Usage: bob's own row, not alice's.
    let tree = jobs
        .share_tree(as_user("bob", pb::ShareTreeRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(tree.rows.iter().any(|r| r.user == "bob"), "{tree:?}");
    assert!(!tree.rows.iter().any(|r| r.user == "alice"), "{tree:?}");
}

/// The associations (sacctmgr show) as `who` sees them.
async fn associations(jobs: &mut JobsClient<Channel>, who: &str) -> pb::AssociationsResponse {
    jobs.associations(as_user(who, pb::AssociationsRequest {}))
        .await
        .unwrap()
        .into_inner()
}

/// Checks bob's associations show his, not alice's, nor who administers or coordinates.
async fn check_private_associations(jobs: &mut JobsClient<Channel>) {
    let bobs = associations(jobs, "bob").await;
    assert!(bobs.assocs.iter().any(|a| a.user == "bob"), "{bobs:?}");
    assert!(!bobs.assocs.iter().any(|a| a.user == "alice"), "{bobs:?}");
    assert!(!bobs.users.iter().any(|u| u.name == "alice"), "{bobs:?}");
    // Nor who administers or coordinates anything above him.
    assert!(bobs.users.iter().all(|u| !u.admin), "{bobs:?}");
    assert!(
        bobs.accounts.iter().all(|a| a.coordinators.is_empty()),
        "{bobs:?}"
    );
}

/// Checks replica 1's status page, which anyone may read, lists no job.
fn check_status_page_lists_no_job(cluster: &Cluster) {
    let page = cluster.http_get(1, "/");
    assert!(page.contains("Jobs are private"), "{page}");
    assert!(!page.contains("/jobs/"), "{page}");
    assert!(
        !page.contains("plot-pending") && page.contains("plot-utilization"),
        "{page}"
    );
    assert!(!page.contains("PENDING "), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_data_shows_users_only_their_own_and_batches_are_bounded_first() {
    let dir = tempfile::tempdir().unwrap();
    let site = site_with(
        dir.path(),
        "PrivateData = [\"jobs\", \"usage\"]\nMaxSubmitBatch = 2",
    );
    let cluster = Cluster::start_custom(1, site, &["--agent-fence-ms", "0"]).await;
    let mut jobs = cluster.jobs(1).await;
    let a = submit_held(&mut jobs, "alice", "a").await;
    let b = submit_held(&mut jobs, "bob", "b").await;
    let all = check_private_listings(&mut jobs, a, b).await;
    // Priorities and accounting likewise.
    check_private_priority_accounting_and_usage(&mut jobs, a, b).await;
    // Associations (sacctmgr show) by the same rule: bob's, not alice's; root sees both.
    check_private_associations(&mut jobs).await;
    // The status page, which anyone reaching the HTTP port may read, lists no job.
    check_status_page_lists_no_job(&cluster);
    let roots = associations(&mut jobs, "root").await;
    assert!(roots.assocs.iter().any(|a| a.user == "alice"), "{roots:?}");
    assert!(roots.users.iter().any(|u| u.name == "alice"), "{roots:?}");
    // Over MaxSubmitBatch: refused whole, before any job is read, naming the limit.
    let e = common::submit(&mut jobs, "alice", vec![held("x"), held("y"), held("z")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("MaxSubmitBatch"), "{e}");
    let after = list(&mut jobs, "root", pb::ListJobsRequest::default())
        .await
        .unwrap();
    assert_eq!(after.len(), all.len(), "nothing was queued");
}
