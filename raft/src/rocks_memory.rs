//! What a RocksDB database holds in memory, as RocksDB itself counts it.
//!
//! A replica's resident memory is the state machine plus whatever RocksDB keeps: the
//! memtables (each column family fills one up to its write buffer size before flushing it),
//! the table readers' index and filter blocks, and the block cache. Operators watching a
//! controller's RSS need to tell these apart from the state, so both databases a controller
//! opens (the Raft log and the accounting archive) report them on `/metrics`.
//!
//! RocksDB's defaults suit a database that owns its machine: a 64 MiB write buffer per
//! column family and a 32 MiB block cache per table factory. A replica's log column family
//! takes the whole log (entries are deleted behind each snapshot, but a deletion frees
//! nothing until the memtable holding the entry is flushed), so its memtable grew by about
//! 1 MiB a minute under the chaos workload and a controller's RSS by 30 MiB an hour, with
//! nothing wrong. [`bounded_cf_options`] keeps every column family to a write buffer sized for
//! what it holds and one shared, bounded block cache per database; the write-ahead log is
//! bounded too ([`MAX_TOTAL_WAL_BYTES`]) so a column family with few writes is flushed rather
//! than keeping old log files alive. The log store also flushes the log's memtable after
//! each purge (`log_store.rs`), so purged entries do not wait for 8 MiB of new ones.

use rocksdb::{BlockBasedOptions, Cache, DB, DBCompressionType, Options};

/// Every database's block cache (shared by its column families).
pub const BLOCK_CACHE_BYTES: usize = 8 << 20;

/// When the write-ahead logs of a database pass this size, RocksDB flushes the column
/// families that keep the oldest alive.
pub const MAX_TOTAL_WAL_BYTES: u64 = 64 << 20;

/// Options of one column family: LZ4 blocks, memtables of `write_buffer_bytes` (at most two,
/// one filling while the other flushes) and `cache` for reads.
pub fn bounded_cf_options(write_buffer_bytes: usize, cache: &Cache) -> Options {
    let mut opts = Options::default();
    opts.set_compression_type(DBCompressionType::Lz4);
    opts.set_write_buffer_size(write_buffer_bytes);
    opts.set_max_write_buffer_number(2);
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    opts.set_block_based_table_factory(&table);
    opts
}

/// The block cache a database's column families share.
pub fn block_cache() -> Cache {
    Cache::new_lru_cache(BLOCK_CACHE_BYTES)
}

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
    fn a_bounded_column_family_flushes_at_its_write_buffer_size() {
        let dir = tempfile::tempdir().unwrap();
        let cache = block_cache();
        let mut opts = bounded_cf_options(1 << 20, &cache);
        opts.create_if_missing(true);
        let db = DB::open(&opts, dir.path()).unwrap();
        for i in 0..8_000u32 {
            db.put(i.to_be_bytes(), [7u8; 1_000]).unwrap();
        }
        db.flush_wal(true).unwrap();
        let memory = RocksMemory::of(&db, &[rocksdb::DEFAULT_COLUMN_FAMILY_NAME]);
        // 8 MB written; at most two 1 MiB memtables (and their arena slack) stay in memory.
        assert!(memory.memtables < 3 << 20, "{memory:?}");
        assert!(memory.block_cache <= BLOCK_CACHE_BYTES as u64, "{memory:?}");
    }

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
