//! What a RocksDB database holds in memory, as RocksDB itself counts it.
//!
//! A replica's resident memory is the state machine plus whatever RocksDB keeps: the
//! memtables (each column family fills one up to its write buffer size before flushing it),
//! the table readers' index and filter blocks, and the block cache. Operators watching a
//! controller's RSS need to tell these apart from the state, so both databases a controller
//! opens (the Raft log and the accounting archive) report them on `/metrics`.

use rocksdb::DB;

/// Bytes RocksDB reports for one database, summed over the column families named.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RocksMemory {
    /// Active and immutable memtables not yet freed (`rocksdb.cur-size-all-mem-tables`).
    pub memtables: u64,
    /// Index and filter blocks of the open SST files (`rocksdb.estimate-table-readers-mem`).
    pub table_readers: u64,
    /// Blocks in the column families' block caches (`rocksdb.block-cache-usage`).
    pub block_cache: u64,
}

impl RocksMemory {
    /// Reads the properties of every column family in `cf_names` (`"default"` included by
    /// name). A property RocksDB does not answer counts as 0: this is for monitoring, and a
    /// scrape must not fail because one figure is missing.
    pub fn of(db: &DB, cf_names: &[&str]) -> Self {
        let mut total = RocksMemory::default();
        for name in cf_names {
            let read = |property: &str| -> u64 {
                let value = match db.cf_handle(name) {
                    Some(cf) => db.property_int_value_cf(cf, property),
                    None if *name == rocksdb::DEFAULT_COLUMN_FAMILY_NAME => {
                        db.property_int_value(property)
                    }
                    None => Ok(None),
                };
                value.ok().flatten().unwrap_or(0)
            };
            total.memtables += read("rocksdb.cur-size-all-mem-tables");
            total.table_readers += read("rocksdb.estimate-table-readers-mem");
            total.block_cache += read("rocksdb.block-cache-usage");
        }
        total
    }

    /// The three figures with the label each has on `/metrics`.
    pub fn by_kind(&self) -> [(&'static str, u64); 3] {
        [
            ("memtables", self.memtables),
            ("table_readers", self.table_readers),
            ("block_cache", self.block_cache),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_show_in_the_memtables_of_their_column_family() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let db = DB::open_cf(&opts, dir.path(), ["logs"]).unwrap();
        let empty = RocksMemory::of(&db, &["default", "logs"]);
        let logs = db.cf_handle("logs").unwrap();
        for i in 0..1_000u32 {
            db.put_cf(logs, i.to_be_bytes(), [7u8; 1_000]).unwrap();
        }
        let after = RocksMemory::of(&db, &["default", "logs"]);
        assert!(
            after.memtables >= empty.memtables + 1_000_000,
            "{empty:?} -> {after:?}"
        );
        assert_eq!(
            RocksMemory::of(&db, &["no-such-family"]),
            RocksMemory::default()
        );
    }
}
