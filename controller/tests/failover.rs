//! `kill -9` of the leader during a burst of 1,000 submissions, and a full stop and restart:
//! every acknowledged job is present exactly once, and the new leader schedules again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Cluster, DEADLINE, job, list, submit};
use docket_proto::v1 as pb;

/// Submits `n` uniquely named jobs from `clients` concurrent clients, each to a replica in
/// turn, resending only when the cluster said the job was not queued (UNAVAILABLE).
/// Returns (acknowledged name -> id, every name attempted).
async fn burst(
    addrs: Vec<String>,
    clients: usize,
    n: usize,
    acked_count: Arc<AtomicUsize>,
) -> (BTreeMap<String, u64>, Vec<String>) {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut conns: Vec<_> = addrs
            .iter()
            .map(|a| docket_proto::v1::jobs_client::JobsClient::new(common::channel(a)))
            .collect();
        let acked_count = acked_count.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = BTreeMap::new();
            let mut attempted = Vec::new();
            let mut turn = c;
            for i in (c..n).step_by(clients) {
                let name = format!("burst-{i}");
                attempted.push(name.clone());
                let begin = Instant::now();
                loop {
                    let replicas = conns.len();
                    let conn = &mut conns[turn % replicas];
                    turn += 1;
                    match submit(conn, "alice", vec![job(&name, "")]).await {
                        Ok(results) => {
                            if let Some(pb::submit_result::Result::JobId(id)) = results[0].result {
                                acked.insert(name.clone(), id);
                                acked_count.fetch_add(1, Ordering::SeqCst);
                            }
                            break;
                        }
                        // Not queued (no leader, or that replica is down): try another.
                        Err(s)
                            if s.code() == tonic::Code::Unavailable
                                && begin.elapsed() < DEADLINE =>
                        {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        // Outcome unknown: never resend, or it could be queued twice.
                        Err(_) => break,
                    }
                }
            }
            (acked, attempted)
        }));
    }
    let mut acked = BTreeMap::new();
    let mut attempted = Vec::new();
    for t in tasks {
        let (a, n) = t.await.unwrap();
        acked.extend(a);
        attempted.extend(n);
    }
    (acked, attempted)
}

/// Every acknowledged job exactly once, nothing that was never submitted, as `replica` sees it.
async fn check_queue(
    cluster: &Cluster,
    replica: u64,
    acked: &BTreeMap<String, u64>,
    attempted: &[String],
) {
    // A replica just restarted may not listen yet: asked again until the deadline.
    let start = Instant::now();
    let jobs = loop {
        let mut client = cluster.jobs(replica).await;
        match list(&mut client, "alice", pb::ListJobsRequest::default()).await {
            Ok(jobs) => break jobs,
            Err(e) if e.code() == tonic::Code::Unavailable && start.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("replica {replica} does not list the queue: {e:?}"),
        }
    };
    let mut by_name: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for j in jobs.iter().filter(|j| j.name.starts_with("burst-")) {
        by_name.entry(j.name.as_str()).or_default().push(j.job_id);
    }
    for (name, id) in acked {
        assert_eq!(
            by_name.get(name.as_str()),
            Some(&vec![*id]),
            "acknowledged {name} (job {id}) must be queued exactly once"
        );
    }
    for (name, ids) in &by_name {
        assert_eq!(ids.len(), 1, "{name} queued {} times", ids.len());
        assert!(
            attempted.iter().any(|a| a == name),
            "{name} was never submitted"
        );
    }
}

/// Waits until `acked_count` reaches `n` while the burst `task` still runs.
async fn wait_acked<T>(acked_count: &AtomicUsize, task: &tokio::task::JoinHandle<T>, n: usize) {
    let start = Instant::now();
    while acked_count.load(Ordering::SeqCst) < n {
        assert!(
            start.elapsed() < DEADLINE,
            "the burst stalled before the kill"
        );
        assert!(!task.is_finished(), "the burst ended before the kill");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Submits a probe job through any of `addrs` every 100 ms until one is queued; its id.
fn spawn_probe(addrs: Vec<String>, killed_at: Instant) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut turn = 0;
        loop {
            let addr = &addrs[turn % addrs.len()];
            turn += 1;
            let mut c = docket_proto::v1::jobs_client::JobsClient::new(common::channel(addr));
            if let Ok(r) = submit(&mut c, "alice", vec![job("probe-after-kill", "big")]).await
                && let Some(pb::submit_result::Result::JobId(id)) = r[0].result
            {
                return id;
            }
            assert!(
                killed_at.elapsed() < DEADLINE,
                "no submission accepted after the kill"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Waits until `leader` runs job `probe_id`, and prints how long after `killed_ms` it started.
async fn wait_probe_started(
    cluster: &Cluster,
    leader: u64,
    probe_id: u64,
    killed_at: Instant,
    killed_ms: u64,
) {
    let mut client = cluster.jobs(leader).await;
    loop {
        let j = list(
            &mut client,
            "alice",
            pb::ListJobsRequest {
                job_ids: vec![probe_id],
                ..Default::default()
            },
        )
        .await
        .unwrap();
        if j[0].state == "RUNNING" {
            let started = j[0].start_time_ms.unwrap();
            println!(
                "failover: the new leader started a job {} ms after the leader was killed \
                 (election, first submission accepted, direct pass)",
                started.saturating_sub(killed_ms)
            );
            break;
        }
        assert!(
            killed_at.elapsed() < DEADLINE,
            "nothing scheduled after failover: {j:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until replica `id` (just restarted) answers a listing.
async fn wait_answering(cluster: &Cluster, id: u64) {
    let start = Instant::now();
    loop {
        let mut c = cluster.jobs(id).await;
        if list(&mut c, "alice", pb::ListJobsRequest::default())
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "restarted replica never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_during_a_submission_burst_loses_no_acknowledged_job() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let acked_count = Arc::new(AtomicUsize::new(0));

    // Kill the leader once a quarter of the burst is acknowledged.
    let addrs: Vec<String> = cluster.addrs.values().cloned().collect();
    let task = tokio::spawn(burst(addrs, 16, 1_000, acked_count.clone()));
    wait_acked(&acked_count, &task, 250).await;
    cluster.kill(leader);
    let killed_at = Instant::now();
    let killed_ms = docket_proto::unix_ms();

    // Probe: every 100 ms, submit a small job to the idle partition through any replica,
    // until one is queued; it starts as soon as a leader schedules again.
    let probe = spawn_probe(cluster.addrs.values().cloned().collect(), killed_at);
    let (acked, attempted) = task.await.unwrap();
    assert!(
        acked.len() > 250,
        "submissions continued after the kill: {}",
        acked.len()
    );
    let probe_id = probe.await.unwrap();

    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    check_queue(&cluster, new_leader, &acked, &attempted).await;

    // Scheduling resumed on the new leader: the probe started.
    wait_probe_started(&cluster, new_leader, probe_id, killed_at, killed_ms).await;

    // The killed replica restarts from its data directory and sees the same queue.
    cluster.spawn(leader, None);
    tokio::time::sleep(Duration::from_millis(500)).await;
    wait_answering(&cluster, leader).await;
    check_queue(&cluster, leader, &acked, &attempted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_and_restarting_every_replica_loses_nothing() {
    let mut cluster = Cluster::start(3).await;
    let addrs: Vec<String> = cluster.addrs.values().cloned().collect();
    let (acked, attempted) = burst(addrs, 4, 100, Arc::new(AtomicUsize::new(0))).await;
    assert_eq!(acked.len(), 100);
    for id in [1, 2, 3] {
        cluster.stop(id);
    }
    for id in [1, 2, 3] {
        cluster.spawn(id, None);
    }
    let leader = cluster.leader().await;
    check_queue(&cluster, leader, &acked, &attempted).await;
    for id in [1, 2, 3] {
        check_queue(&cluster, id, &acked, &attempted).await;
    }
}
