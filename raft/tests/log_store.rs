//! The RocksDB log store beyond openraft's suite: what survives a reopen, and what happens
//! once a WAL sync has failed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use docket_raft::kv::{KvCommand, KvMachine};
use docket_raft::log_store::LogStore;
use docket_raft::{Batch, DataDir, ReplicaId, TypeConfig};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, Vote};

fn entry(term: u64, index: u64) -> Entry<TypeConfig<KvMachine>> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, ReplicaId(1)), index),
        payload: EntryPayload::Normal(Batch {
            time_ms: 1_700_000_000_000 + index,
            commands: vec![KvCommand::Set {
                key: format!("k{index}"),
                value: "v".into(),
            }],
        }),
    }
}

fn open(dir: &std::path::Path) -> LogStore<KvMachine> {
    LogStore::new(Arc::new(DataDir::open(dir).unwrap())).unwrap()
}

#[tokio::test]
async fn vote_entries_and_purge_mark_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = open(dir.path());
        log.save_vote(&Vote::new(4, ReplicaId(2))).await.unwrap();
        log.blocking_append((1..=10).map(|i| entry(4, i)))
            .await
            .unwrap();
        log.purge(LogId::new(CommittedLeaderId::new(4, ReplicaId(1)), 3))
            .await
            .unwrap();
        log.truncate(LogId::new(CommittedLeaderId::new(4, ReplicaId(1)), 9))
            .await
            .unwrap();
    }
    let mut log = open(dir.path());
    assert_eq!(
        log.read_vote().await.unwrap(),
        Some(Vote::new(4, ReplicaId(2)))
    );
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(3));
    assert_eq!(state.last_log_id.map(|l| l.index), Some(8));
    let entries = log.try_get_log_entries(0..100).await.unwrap();
    let indexes: Vec<u64> = entries.iter().map(|e| e.log_id.index).collect();
    assert_eq!(indexes, (4..=8).collect::<Vec<_>>());
    assert_eq!(
        entries[0],
        entry(4, 4),
        "entries decode to what was appended"
    );
}

#[tokio::test]
async fn after_a_failed_sync_nothing_is_acknowledged_and_writes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(DataDir::open(dir.path()).unwrap());
    let mut log = LogStore::<KvMachine>::new(db.clone()).unwrap();
    log.blocking_append([entry(1, 1)]).await.unwrap();

    db.faults().fail_syncs();
    // The append's callback reports the failed sync instead of acknowledging.
    let err = log.blocking_append([entry(1, 2)]).await.unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("fsync") || err.to_string().contains("sync"),
        "{err}"
    );
    // From now on the store refuses every write, even if the disk came back.
    assert!(log.blocking_append([entry(1, 3)]).await.is_err());
    assert!(log.save_vote(&Vote::new(2, ReplicaId(1))).await.is_err());
    assert!(
        log.truncate(LogId::new(CommittedLeaderId::new(1, ReplicaId(1)), 1))
            .await
            .is_err()
    );
    // Reads still work: what was acknowledged is there.
    let entries = log.try_get_log_entries(1..2).await.unwrap();
    assert_eq!(entries, vec![entry(1, 1)]);
}

/// An entry whose command carries `bytes` of value.
fn big_entry(term: u64, index: u64, bytes: usize) -> Entry<TypeConfig<KvMachine>> {
    let mut e = entry(term, index);
    if let EntryPayload::Normal(batch) = &mut e.payload {
        batch.commands = vec![KvCommand::Set {
            key: format!("k{index}"),
            value: "v".repeat(bytes),
        }];
    }
    e
}

#[tokio::test]
async fn purged_entries_leave_memory_with_their_memtable() {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(DataDir::open(dir.path()).unwrap());
    let mut log = LogStore::<KvMachine>::new(db.clone()).unwrap();
    // 3 MiB of entries: more than the flush floor, less than the log's 8 MiB write buffer,
    // so only the purge's flush frees them.
    log.blocking_append((1..=96).map(|i| big_entry(1, i, 32 << 10)))
        .await
        .unwrap();
    let before = db.memory().memtables;
    assert!(before >= 3 << 20, "{before} bytes in memtables");
    log.purge(LogId::new(CommittedLeaderId::new(1, ReplicaId(1)), 95))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while db.memory().memtables > 1 << 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} bytes still in memtables 20 s after the purge",
            db.memory().memtables
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // What was not purged is still there, from the flushed table.
    let kept = log.try_get_log_entries(0..200).await.unwrap();
    assert_eq!(
        kept.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
        [96]
    );
}
