//! Three `docket-controller` processes on loopback: submission through a follower, the
//! leader's loops starting jobs, permissions, bad requests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Act, Cluster, DEADLINE, act, job, list, submit};
use docket_proto::v1 as pb;
use docket_proto::v1::jobs_client::JobsClient;
use tonic::transport::Channel;

/// Waits until the three jobs `ids` run, checking "b" runs in the big partition.
async fn wait_all_running(client: &mut JobsClient<Channel>, ids: &[u64]) {
    let start = Instant::now();
    loop {
        let jobs = list(
            client,
            "alice",
            pb::ListJobsRequest {
                job_ids: ids.to_vec(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(jobs.len(), 3);
        if jobs.iter().all(|j| j.state == "RUNNING") {
            let big = jobs.iter().find(|j| j.name == "b").unwrap();
            assert_eq!(big.partition, "big");
            assert!(big.node_list.starts_with('g'), "{big:?}");
            break;
        }
        assert!(start.elapsed() < DEADLINE, "not started: {jobs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Submits a held job of alice's and checks its priority is explained factor by factor.
async fn explain_a_pending_job(client: &mut JobsClient<Channel>) {
    let mut held = job("waiting", "");
    held.hold = true;
    let r = submit(client, "alice", vec![held]).await.unwrap();
    let Some(pb::submit_result::Result::JobId(waiting)) = r[0].result else {
        panic!("{r:?}")
    };
    let mut req = tonic::Request::new(pb::ExplainPriorityRequest {
        job_ids: vec![waiting],
        users: vec![],
    });
    req.metadata_mut().insert(
        docket_proto::metadata::CREDENTIAL,
        common::credential("alice"),
    );
    let explained = client.explain_priority(req).await.unwrap().into_inner();
    assert_eq!(explained.jobs.len(), 1, "{explained:?}");
    assert!(!explained.jobs[0].factors.is_empty(), "{explained:?}");
    // The formula by name (it was once the whole configuration, Debug-printed).
    assert_eq!(explained.formula, "multifactor");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_submitted_through_a_follower_are_scheduled_by_the_leader() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.follower_of(leader);
    let mut client = cluster.jobs(follower).await;
    let results = submit(
        &mut client,
        "alice",
        vec![job("a", ""), job("b", "big"), job("c", "batch")],
    )
    .await
    .unwrap();
    let ids: Vec<u64> = results
        .iter()
        .map(|r| match &r.result {
            Some(pb::submit_result::Result::JobId(id)) => *id,
            other => panic!("refused: {other:?}"),
        })
        .collect();
    assert_eq!(ids.len(), 3);

    // Linearizable reads on a follower see them at once; the leader's loops start them.
    wait_all_running(&mut client, &ids).await;

    // Only the owner (or an admin) may act on a job; a denial changes nothing.
    let denied = act(&mut client, "bob", Act::Cancel, &ids[..1])
        .await
        .unwrap();
    assert!(!denied[0].error.is_empty(), "bob cancelled alice's job");
    let ok = act(&mut client, "alice", Act::Cancel, &ids[..1])
        .await
        .unwrap();
    assert!(ok[0].error.is_empty(), "{:?}", ok[0]);
    // Suspend is for admins.
    let denied = act(&mut client, "alice", Act::Suspend, &ids[1..2])
        .await
        .unwrap();
    assert!(!denied[0].error.is_empty());
    let jobs = list(&mut client, "alice", pb::ListJobsRequest::default())
        .await
        .unwrap();
    let states: Vec<(&str, &str)> = jobs
        .iter()
        .filter(|j| ids.contains(&j.job_id))
        .map(|j| (j.name.as_str(), j.state.as_str()))
        .collect();
    // Priority, factor by factor, for a pending job.
    explain_a_pending_job(&mut client).await;

    // A cancelled running job completes when its agent confirms the kill (no agents here).
    assert_eq!(
        states,
        vec![("a", "COMPLETING"), ("b", "RUNNING"), ("c", "RUNNING")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_change_nothing() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let mut client = cluster.jobs(leader).await;
    let before = list(&mut client, "alice", pb::ListJobsRequest::default())
        .await
        .unwrap();

    // Whole-request errors: the status names the field.
    let mut negative = job("neg", "");
    negative.time_limit_seconds = Some(-5);
    let e = submit(&mut client, "alice", vec![negative])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("jobs[0].time_limit_seconds"), "{e}");

    let mut bad_array = job("arr", "");
    bad_array.array = "5-1".into();
    let e = submit(&mut client, "alice", vec![bad_array])
        .await
        .unwrap_err();
    assert!(e.message().contains("jobs[0].array"), "{e}");

    let e = submit(&mut client, "alice", vec![]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    // A credential (validly signed) for a name Docket does not accept.
    let e = submit(&mut client, "bad name!", vec![job("x", "")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(e.message().contains("not a name Docket accepts"), "{e}");

    let e = client
        .submit_jobs(pb::SubmitJobsRequest {
            jobs: vec![job("anon", "")],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);

    // Per-job refusals from the core: the message names the field and the limit.
    let unknown = submit(&mut client, "alice", vec![job("u", "nosuch")])
        .await
        .unwrap();
    let Some(pb::submit_result::Result::Error(msg)) = &unknown[0].result else {
        panic!("accepted a job for an unknown partition");
    };
    assert!(msg.contains("nosuch"), "{msg}");
    let mut absurd = job("huge", "");
    absurd.nodes = 1_000_000;
    let refused = submit(&mut client, "alice", vec![absurd]).await.unwrap();
    assert!(
        matches!(
            &refused[0].result,
            Some(pb::submit_result::Result::Error(_))
        ),
        "{refused:?}"
    );
    let e = list(
        &mut client,
        "alice",
        pb::ListJobsRequest {
            states: vec!["SLEEPING".into()],
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(e.message().contains("states[0]"), "{e}");

    let after = list(&mut client, "alice", pb::ListJobsRequest::default())
        .await
        .unwrap();
    assert_eq!(
        before.len(),
        after.len(),
        "a refused request changed the queue"
    );
}
