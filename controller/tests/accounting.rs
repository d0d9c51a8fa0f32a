//! Finished jobs leave the queue after MinJobAge and stay queryable from the archive on
//! every replica, across restarts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Act, Cluster, DEADLINE, act, as_user, job, list, submit};
use docket_proto::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_move_to_the_archive_and_stay_queryable() {
    let config = common::site_config().with_file_name("short-job-age.toml");
    let mut cluster = Cluster::start_custom(3, config, &["--agent-fence-ms", "0"]).await;
    let leader = cluster.leader().await;
    let mut jobs = cluster.jobs(leader).await;
    // Held so they stay pending; cancelled while pending they end at once.
    let mut held = job("gone", "");
    held.hold = true;
    let r = submit(&mut jobs, "alice", vec![held.clone(), held])
        .await
        .unwrap();
    let ids: Vec<u64> = r
        .iter()
        .map(|r| match r.result {
            Some(pb::submit_result::Result::JobId(id)) => id,
            _ => panic!("{r:?}"),
        })
        .collect();
    act(&mut jobs, "alice", Act::Cancel, &ids).await.unwrap();

    // They leave the queue after MinJobAge (1 s) at a tick...
    let start = Instant::now();
    loop {
        let listed = list(
            &mut jobs,
            "alice",
            pb::ListJobsRequest {
                job_ids: ids.clone(),
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

    // ... and every replica still answers for them from its archive.
    let check = |records: Vec<pb::AccountingRecord>| {
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
    };
    for id in [1, 2, 3] {
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
                check(records);
                break;
            }
            assert!(start.elapsed() < DEADLINE, "replica {id}: {records:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
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
    let start = Instant::now();
    loop {
        match c
            .accounting(as_user(
                "alice",
                pb::AccountingRequest {
                    job_ids: ids.clone(),
                    ..Default::default()
                },
            ))
            .await
        {
            Ok(r) => {
                check(r.into_inner().records);
                break;
            }
            Err(e) => assert!(start.elapsed() < DEADLINE, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
