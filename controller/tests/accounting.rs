//! Finished jobs leave the queue after MinJobAge and stay queryable from the archive on
//! every replica, across restarts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Act, Cluster, DEADLINE, act, as_user, job, list, submit};
use docket_proto::v1 as pb;
use docket_proto::v1::jobs_client::JobsClient;
use tonic::transport::Channel;

/// Submits two held jobs of alice's and cancels them while pending; their ids.
async fn two_cancelled_jobs(jobs: &mut JobsClient<Channel>) -> Vec<u64> {
    let mut held = job("gone", "");
    held.hold = true;
    let r = submit(jobs, "alice", vec![held.clone(), held])
        .await
        .unwrap();
    let ids: Vec<u64> = r
        .iter()
        .map(|r| match r.result {
            Some(pb::submit_result::Result::JobId(id)) => id,
            _ => panic!("{r:?}"),
        })
        .collect();
    act(jobs, "alice", Act::Cancel, &ids).await.unwrap();
    ids
}

/// Waits until jobs `ids` are no longer listed in the queue.
async fn wait_purged(jobs: &mut JobsClient<Channel>, ids: &[u64]) {
    let start = Instant::now();
    loop {
        let listed = list(
            jobs,
            "alice",
            pb::ListJobsRequest {
                job_ids: ids.to_vec(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        if listed.is_empty() {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "never purged: {listed:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks that `records` hold jobs `ids` (two of them), archived, cancelled, alice's, ended.
fn check_archived(records: &[pb::AccountingRecord], ids: &[u64]) {
    let mine: Vec<_> = records
        .iter()
        .filter(|r| ids.contains(&r.job.as_ref().unwrap().job_id))
        .collect();
    assert_eq!(mine.len(), 2, "{records:?}");
    for r in mine {
        assert!(r.archived);
        let j = r.job.as_ref().unwrap();
        assert_eq!(j.state, "CANCELLED");
        assert_eq!(j.user, "alice");
        assert!(j.end_time_ms.is_some());
    }
}

/// Waits until replica `id` answers for two archived jobs, and checks they are jobs `ids`.
async fn wait_answers_from_archive(cluster: &Cluster, id: u64, ids: &[u64]) {
    let mut c = cluster.jobs(id).await;
    let start = Instant::now();
    loop {
        let records = c
            .accounting(as_user(
                "alice",
                pb::AccountingRequest {
                    users: vec!["alice".into()],
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner()
            .records;
        if records.iter().filter(|r| r.archived).count() >= 2 {
            check_archived(&records, ids);
            break;
        }
        assert!(start.elapsed() < DEADLINE, "replica {id}: {records:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asks `c` for the accounting of jobs `ids` until it answers, and checks the answer.
async fn check_accounting_of(c: &mut JobsClient<Channel>, ids: &[u64]) {
    let start = Instant::now();
    loop {
        match c
            .accounting(as_user(
                "alice",
                pb::AccountingRequest {
                    job_ids: ids.to_vec(),
                    ..Default::default()
                },
            ))
            .await
        {
            Ok(r) => {
                check_archived(&r.into_inner().records, ids);
                break;
            }
            Err(e) => assert!(start.elapsed() < DEADLINE, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_move_to_the_archive_and_stay_queryable() {
    let config = common::site_config().with_file_name("short-job-age.toml");
    let mut cluster = Cluster::start_custom(3, config, &["--agent-fence-ms", "0"]).await;
    let leader = cluster.leader().await;
    let mut jobs = cluster.jobs(leader).await;
    // Held so they stay pending; cancelled while pending they end at once.
    let ids = two_cancelled_jobs(&mut jobs).await;

    // They leave the queue after MinJobAge (1 s) at a tick...
    wait_purged(&mut jobs, &ids).await;

    // ... and every replica still answers for them from its archive.
    for id in [1, 2, 3] {
        wait_answers_from_archive(&cluster, id, &ids).await;
    }

    // The archive survives a restart of every replica.
    for id in [1, 2, 3] {
        cluster.stop(id);
    }
    for id in [1, 2, 3] {
        cluster.spawn(id, None);
    }
    let leader = cluster.leader().await;
    let mut c = cluster.jobs(leader).await;
    check_accounting_of(&mut c, &ids).await;
    // Bad bounds are named.
    let e = c
        .accounting(as_user(
            "alice",
            pb::AccountingRequest {
                start_unix_ms: Some(-1),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert!(e.message().contains("start_unix_ms"), "{e}");
}

/// Every accounting record replica `id` holds for alice, archived ones only, as (job id,
/// state, charge).
async fn archived_on(cluster: &Cluster, id: u64) -> Result<Vec<(u64, String)>, tonic::Status> {
    let mut c = cluster.jobs(id).await;
    let records = c
        .accounting(as_user(
            "alice",
            pb::AccountingRequest {
                users: vec!["alice".into()],
                ..Default::default()
            },
        ))
        .await?
        .into_inner()
        .records;
    Ok(records
        .iter()
        .filter(|r| r.archived)
        .map(|r| {
            let j = r.job.as_ref().unwrap();
            (j.job_id, j.state.clone())
        })
        .collect())
}

fn status_of(cluster: &Cluster, id: u64) -> serde_json::Value {
    serde_json::from_str(&cluster.http_get(id, "/status")).unwrap()
}

/// Until replica `id` archives exactly `want`.
async fn wait_archived(cluster: &Cluster, id: u64, want: &[(u64, String)]) {
    let start = Instant::now();
    loop {
        let got = archived_on(cluster, id).await;
        if got.as_deref().is_ok_and(|g| g == want) {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "replica {id} archives {got:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The archive is part of the replicated state: a replica added after the purges' log
/// entries were compacted away receives the records in the snapshot, and after every
/// original replica has been replaced the history is still whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_reaches_replicas_added_later_and_outlives_every_original() {
    let config = common::site_config().with_file_name("short-job-age.toml");
    let mut cluster = Cluster::start_custom(
        3,
        config,
        &[
            "--agent-fence-ms",
            "0",
            "--snapshot-every-entries",
            "10",
            "--keep-entries-after-snapshot",
            "2",
        ],
    )
    .await;
    let leader = cluster.leader().await;
    let mut jobs = cluster.jobs(leader).await;
    // Twelve jobs, submitted and cancelled one by one (an entry each), then purged.
    let mut ids = Vec::new();
    for _ in 0..12 {
        let mut held = job("history", "");
        held.hold = true;
        let r = submit(&mut jobs, "alice", vec![held]).await.unwrap();
        match r[0].result {
            Some(pb::submit_result::Result::JobId(id)) => ids.push(id),
            _ => panic!("{r:?}"),
        }
        act(&mut jobs, "alice", Act::Cancel, &ids[ids.len() - 1..])
            .await
            .unwrap();
    }
    // What the leader archives once all are purged (with whatever else the cluster ran)
    // is what every replica must end with.
    let start = Instant::now();
    let want = loop {
        let got = archived_on(&cluster, leader).await.unwrap();
        if ids
            .iter()
            .all(|id| got.contains(&(*id, "CANCELLED".to_owned())))
        {
            break got;
        }
        assert!(start.elapsed() < DEADLINE, "never archived: {got:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The entries that purged them are compacted away behind a snapshot.
    let applied = status_of(&cluster, leader)["raft"]["applied_index"]
        .as_u64()
        .unwrap();
    let start = Instant::now();
    while status_of(&cluster, leader)["raft"]["purged_index"]
        .as_u64()
        .is_none_or(|p| p < applied)
    {
        assert!(start.elapsed() < DEADLINE, "the log was never compacted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Replace every original replica, one at a time, by a new one.
    for (old, new) in [(1u64, 4u64), (2, 5), (3, 6)] {
        cluster.spawn_extra(new);
        let leader = cluster.leader().await;
        let mut admin = cluster.admin(leader).await;
        admin
            .add_replica(as_user(
                "root",
                pb::AddReplicaRequest {
                    id: new,
                    addr: cluster.addrs[&new].clone(),
                    learner: false,
                },
            ))
            .await
            .unwrap();
        wait_archived(&cluster, new, &want).await;
        let leader = cluster.leader().await;
        cluster
            .admin(leader)
            .await
            .remove_replica(as_user("root", pb::RemoveReplicaRequest { id: old }))
            .await
            .unwrap();
        cluster.kill(old);
    }
    for id in [4, 5, 6] {
        wait_archived(&cluster, id, &want).await;
    }
}
