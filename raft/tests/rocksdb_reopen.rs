//! A replica's RocksDB database survives close and reopen, and bad directories give errors.

// Integration tests: a panic is a failed test, which is what we want.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use docket_raft::db::cf;
use docket_raft::{DataDir, FORMAT_VERSION};

#[test]
fn synced_writes_survive_reopen_in_every_column_family() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = DataDir::open(dir.path()).unwrap();
        for (i, name) in cf::ALL.iter().enumerate() {
            // Log keys are big-endian indexes; use the same shape here.
            db.put_synced(name, &(i as u64).to_be_bytes(), name.as_bytes())
                .unwrap();
        }
    }
    let db = DataDir::open(dir.path()).unwrap();
    assert_eq!(db.format_version(), FORMAT_VERSION);
    for (i, name) in cf::ALL.iter().enumerate() {
        assert_eq!(
            db.get(name, &(i as u64).to_be_bytes()).unwrap().as_deref(),
            Some(name.as_bytes()),
            "column family {name}"
        );
    }
}

#[test]
fn a_regular_file_is_not_a_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"hello").unwrap();
    let err = DataDir::open(&file).unwrap_err();
    assert!(err.to_string().contains("not-a-dir"), "{err}");
}

#[test]
fn a_second_open_of_a_live_directory_is_refused() {
    // RocksDB's LOCK file keeps two replicas from sharing one data directory.
    let dir = tempfile::tempdir().unwrap();
    let _first = DataDir::open(dir.path()).unwrap();
    let err = DataDir::open(dir.path()).unwrap_err();
    assert!(err.to_string().to_lowercase().contains("lock"), "{err}");
}
