//! Three replicas as separate processes on loopback; the leader is killed with SIGKILL while
//! eight clients write. Every acknowledged write must be on every replica exactly once after
//! the killed replica restarts from its data directory and catches up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use docket_raft::ReplicaId;
use docket_raft::kv::{KvCommand, KvMachine};
use docket_raft::network::{Channels, NetworkConfig};
use docket_raft::replica::{Replica, ReplicaConfig};
use docket_raft::status::Role;

const DEADLINE: Duration = Duration::from_secs(30);

/// Child replicas, killed when the test ends however it ends.
struct Procs(BTreeMap<u64, Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for child in self.0.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn spawn(id: u64, addr: &str, data: &Path, bootstrap: Option<&str>) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_docket-raft-kv"));
    cmd.args(["serve", "--id", &id.to_string(), "--listen", addr, "--data"])
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(b) = bootstrap {
        cmd.args(["--bootstrap", b]);
    }
    let mut child = cmd.spawn().unwrap();
    // Wait for "ready" on stdout, with a deadline enforced by a reader thread.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(DEADLINE).expect("replica never said ready");
    assert!(line.starts_with("ready"), "replica {id} said {line:?}");
    child
}

async fn leader_addr(
    channels: &Channels,
    addrs: &BTreeMap<u64, String>,
) -> Option<(ReplicaId, String)> {
    for (id, addr) in addrs {
        if let Ok(status) = channels.status(addr, Duration::from_millis(500)).await
            && status.role == Role::Leader
        {
            return Some((ReplicaId(*id), addr.clone()));
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_mid_write_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let addrs: BTreeMap<u64, String> = (1..=3).map(|id| (id, free_addr())).collect();
    let bootstrap = addrs
        .iter()
        .map(|(id, a)| format!("{id}={a}"))
        .collect::<Vec<_>>()
        .join(",");
    let data = |id: u64| dir.path().join(format!("r{id}"));
    let mut procs = Procs(BTreeMap::new());
    for (id, addr) in &addrs {
        let b = (*id == 1).then_some(bootstrap.as_str());
        procs.0.insert(*id, spawn(*id, addr, &data(*id), b));
    }
    let channels = Channels::tcp(NetworkConfig::default());
    let start = Instant::now();
    let first_leader = loop {
        if let Some(a) = leader_addr(&channels, &addrs).await {
            break a;
        }
        assert!(start.elapsed() < DEADLINE, "no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // Eight clients, 60 writes each, always to whoever leads now.
    let acked_total = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (channels, addrs, acked_total) =
                (channels.clone(), addrs.clone(), acked_total.clone());
            tokio::spawn(async move { write_sixty(w, &channels, &addrs, &acked_total).await })
        })
        .collect();

    // Kill the leader once a quarter of the writes are acknowledged.
    let start = Instant::now();
    while acked_total.load(Ordering::SeqCst) < 120 {
        assert!(start.elapsed() < DEADLINE, "writes stalled before the kill");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed = first_leader.0.0;
    let mut child = procs.0.remove(&killed).unwrap();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let mut acked = Vec::new();
    let mut written = Vec::new();
    for w in writers {
        let (a, wr) = w.await.unwrap();
        acked.extend(a);
        written.extend(wr);
    }
    let new_leader = leader_addr(&channels, &addrs).await.expect("a new leader");
    assert_ne!(new_leader, first_leader);
    assert!(acked.len() > 120, "writes continued after the kill");

    // The killed replica restarts from its data directory and catches up.
    procs
        .0
        .insert(killed, spawn(killed, &addrs[&killed], &data(killed), None));
    wait_until_every_replica_applied_everything(&channels, &addrs).await;

    // Stop everyone gracefully, then read each data directory.
    stop_gracefully(&mut procs);
    let mut maps = Vec::new();
    for id in addrs.keys() {
        maps.push(applied_exactly_once(*id, &data(*id), &acked, &written).await);
    }
    assert!(maps.windows(2).all(|w| w[0] == w[1]), "replicas diverged");
}

/// Client `w`: appends `w{w}-0` to `w{w}-59` under `k`, each to whoever leads at the time,
/// resent only while certainly not applied; (acknowledged, attempted).
async fn write_sixty(
    w: usize,
    channels: &Channels,
    addrs: &BTreeMap<u64, String>,
    acked_total: &AtomicUsize,
) -> (Vec<String>, Vec<String>) {
    let (mut acked, mut written) = (Vec::new(), Vec::new());
    for i in 0..60 {
        let value = format!("w{w}-{i}");
        written.push(value.clone());
        let begin = Instant::now();
        loop {
            let Some((leader, at)) = leader_addr(channels, addrs).await else {
                assert!(begin.elapsed() < DEADLINE, "no leader for {value}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let command = KvCommand::Append {
                key: "k".into(),
                value: value.clone(),
            };
            match channels
                .forward::<KvMachine>(leader, &at, vec![command])
                .await
            {
                Ok(_) => {
                    acked.push(value.clone());
                    acked_total.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                // Not applied: safe to send again.
                Err(e) if e.certainly_not_applied() && begin.elapsed() < DEADLINE => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                // Unknown outcome: never resend, or it could be applied twice.
                Err(_) => break,
            }
        }
    }
    (acked, written)
}

/// Waits (up to [`DEADLINE`]) until all three replicas answer and each has applied the
/// longest log any of them holds.
async fn wait_until_every_replica_applied_everything(
    channels: &Channels,
    addrs: &BTreeMap<u64, String>,
) {
    let start = Instant::now();
    loop {
        let mut applied = Vec::new();
        for addr in addrs.values() {
            if let Ok(s) = channels.status(addr, Duration::from_millis(500)).await {
                applied.push((s.applied_index, s.last_log_index));
            }
        }
        let target = applied.iter().map(|(_, last)| *last).max().flatten();
        if applied.len() == 3 && applied.iter().all(|(a, _)| *a == target) {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "replicas did not converge: {applied:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGTERM to every replica, then waits for each to exit (SIGKILL past [`DEADLINE`]).
fn stop_gracefully(procs: &mut Procs) {
    for child in procs.0.values_mut() {
        let pid = child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
    }
    for (_, mut child) in std::mem::take(&mut procs.0) {
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > DEADLINE {
                let _ = child.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Opens replica `id`'s stopped data directory `data` and checks that it applied every
/// acknowledged value exactly once and nothing never written; its values under `k`.
async fn applied_exactly_once(
    id: u64,
    data: &Path,
    acked: &[String],
    written: &[String],
) -> Vec<String> {
    let config = ReplicaConfig::new(id, free_addr(), data.to_path_buf());
    let replica = Replica::open(config, KvMachine::default()).await.unwrap();
    let values = replica.read_stale(|a| a.machine.map.get("k").cloned().unwrap_or_default());
    replica.shutdown().await;
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &values {
        *counts.entry(v.as_str()).or_default() += 1;
    }
    for v in acked {
        assert_eq!(
            counts.get(v.as_str()),
            Some(&1),
            "replica {id}: acknowledged {v}"
        );
    }
    for (v, n) in &counts {
        assert_eq!(*n, 1, "replica {id}: {v} applied {n} times");
        assert!(
            written.iter().any(|w| w == v),
            "replica {id}: {v} never written"
        );
    }
    values
}
