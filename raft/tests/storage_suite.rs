//! openraft's storage conformance suite on the RocksDB log store and the machine store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use docket_raft::kv::KvMachine;
use docket_raft::log_store::LogStore;
use docket_raft::machine_store::MachineStore;
use docket_raft::{DataDir, TypeConfig};
use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};

struct RocksBuilder;

impl
    StoreBuilder<
        TypeConfig<KvMachine>,
        LogStore<KvMachine>,
        MachineStore<KvMachine>,
        tempfile::TempDir,
    > for RocksBuilder
{
    async fn build(
        &self,
    ) -> Result<
        (
            tempfile::TempDir,
            LogStore<KvMachine>,
            MachineStore<KvMachine>,
        ),
        StorageError<docket_raft::ReplicaId>,
    > {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(DataDir::open(dir.path()).unwrap());
        let log = LogStore::new(db.clone()).unwrap();
        let sm = MachineStore::open(db, KvMachine::default()).unwrap();
        Ok((dir, log, sm))
    }
}

#[test]
fn rocksdb_store_passes_openraft_conformance_suite() {
    Suite::test_all(RocksBuilder).unwrap();
}
