//! The RocksDB database in a replica's data directory.
//!
//! One database per replica, split into column families by concern so each can be tuned and
//! purged on its own:
//! - [`cf::LOGS`]: Raft log entries, keyed by big-endian index so byte order is log order.
//! - [`cf::META`]: small records (vote, committed id, the format stamp).
//! - [`cf::STATE`]: state-machine metadata (last applied id, membership, snapshot index).
//!
//! The database carries a format version ([`FORMAT_VERSION`]) stamped on first open. A binary
//! refuses a data directory written by a newer format rather than misreading it; upgrades
//! that change the layout bump the version and migrate explicitly.
//!
//! Durability: [`DataDir::put_synced`], [`DataDir::write`] with `sync` and
//! [`DataDir::sync_wal`] return only after the write-ahead log is synced, which is the rule
//! every acknowledgement in this crate follows (a vote saved or an entry appended that is not
//! on disk can break Raft's safety after a power loss). Every sync goes through one place so
//! [`FaultInjection`] can make it fail, as a dying disk would.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rocksdb::{
    ColumnFamilyDescriptor, DB, Direction, FlushOptions, IteratorMode, WriteBatch, WriteOptions,
};

/// The layout version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// Column family names.
pub mod cf {
    /// Raft log entries, big-endian index keys.
    pub const LOGS: &str = "logs";
    /// Vote, committed log id, format stamp.
    pub const META: &str = "meta";
    /// State-machine metadata.
    pub const STATE: &str = "state";
    /// Every column family this layout has, in creation order.
    pub const ALL: [&str; 3] = [LOGS, META, STATE];
}

/// The log column family's write buffer: it takes every entry, so it fills; bounded, its
/// memtables cost at most twice this ([`crate::rocks_memory`]).
const LOG_WRITE_BUFFER_BYTES: usize = 8 << 20;

/// The other column families' write buffers: a vote, a few ids, a membership.
const SMALL_WRITE_BUFFER_BYTES: usize = 1 << 20;

/// Key in [`cf::META`] holding the format version as a big-endian u32.
const FORMAT_KEY: &[u8] = b"format_version";

/// What can go wrong opening or using a data directory.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("rocksdb error in data directory {path}: {source}")]
    Rocks {
        path: PathBuf,
        #[source]
        source: rocksdb::Error,
    },
    #[error(
        "data directory {path} has format version {found}, newer than the {supported} this \
         build supports; run a newer docket-controller or restore a backup"
    )]
    NewerFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error(
        "data directory {path} has a malformed format stamp ({len} bytes, expected 4); it was \
         not written by docket or is corrupt"
    )]
    MalformedFormat { path: PathBuf, len: usize },
    #[error("data directory {path}: fsync of the write-ahead log failed (injected fault)")]
    InjectedSyncFailure { path: PathBuf },
    #[error("unknown column family {name:?} (known: {known:?})")]
    UnknownColumnFamily {
        name: String,
        known: [&'static str; 3],
    },
}

/// One key and its value, as a scan yields them.
pub type KeyValue = (Box<[u8]>, Box<[u8]>);

/// A switch that makes every sync of one data directory fail from the moment it is thrown,
/// for tests of what a replica does when its disk stops accepting writes. Cloning shares the
/// switch. Production code never throws it.
#[derive(Debug, Clone, Default)]
pub struct FaultInjection {
    fail_syncs: Arc<AtomicBool>,
}

impl FaultInjection {
    /// From now on every synced write and WAL sync of the directory fails.
    pub fn fail_syncs(&self) {
        self.fail_syncs.store(true, Ordering::SeqCst);
    }

    fn syncs_fail(&self) -> bool {
        self.fail_syncs.load(Ordering::SeqCst)
    }
}

/// An open replica database.
#[derive(Debug)]
pub struct DataDir {
    db: DB,
    path: PathBuf,
    format_version: u32,
    faults: FaultInjection,
}

impl DataDir {
    /// Opens (creating if needed) the database at `path`, with every column family of the
    /// layout, and checks or stamps its format version.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DbError> {
        let path = path.as_ref().to_path_buf();
        let cache = crate::rocks_memory::block_cache();
        let mut opts = crate::rocks_memory::bounded_cf_options(SMALL_WRITE_BUFFER_BYTES, &cache);
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_max_total_wal_size(crate::rocks_memory::MAX_TOTAL_WAL_BYTES);
        let cfs = cf::ALL.map(|name| {
            let buffer = if name == cf::LOGS {
                LOG_WRITE_BUFFER_BYTES
            } else {
                SMALL_WRITE_BUFFER_BYTES
            };
            let cf_opts = crate::rocks_memory::bounded_cf_options(buffer, &cache);
            ColumnFamilyDescriptor::new(name, cf_opts)
        });
        let db = DB::open_cf_descriptors(&opts, &path, cfs).map_err(|source| DbError::Rocks {
            path: path.clone(),
            source,
        })?;
        let mut this = DataDir {
            db,
            path,
            format_version: FORMAT_VERSION,
            faults: FaultInjection::default(),
        };
        this.format_version = this.check_or_stamp_format()?;
        Ok(this)
    }

    /// The directory the database lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version found on (or stamped at) open.
    pub fn format_version(&self) -> u32 {
        self.format_version
    }

    /// What RocksDB holds in memory for this database, over every column family.
    pub fn memory(&self) -> crate::rocks_memory::RocksMemory {
        let mut names = vec![rocksdb::DEFAULT_COLUMN_FAMILY_NAME];
        names.extend(cf::ALL);
        crate::rocks_memory::RocksMemory::of(&self.db, &names)
    }

    /// The fault switch of this directory.
    pub fn faults(&self) -> &FaultInjection {
        &self.faults
    }

    /// Writes `key = value` in column family `cf` and returns once the WAL is synced.
    pub fn put_synced(&self, cf: &str, key: &[u8], value: &[u8]) -> Result<(), DbError> {
        let handle = self.cf(cf)?;
        let mut batch = WriteBatch::default();
        batch.put_cf(handle, key, value);
        self.write(batch, true)
    }

    /// A write batch for this database; fill it with [`DataDir::batch_put`] and friends.
    pub fn batch(&self) -> WriteBatch {
        WriteBatch::default()
    }

    /// Adds `key = value` in `cf` to `batch`.
    pub fn batch_put(
        &self,
        batch: &mut WriteBatch,
        cf: &str,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), DbError> {
        batch.put_cf(self.cf(cf)?, key, value);
        Ok(())
    }

    /// Adds the deletion of keys in `[from, to)` of `cf` to `batch`.
    pub fn batch_delete_range(
        &self,
        batch: &mut WriteBatch,
        cf: &str,
        from: &[u8],
        to: &[u8],
    ) -> Result<(), DbError> {
        batch.delete_range_cf(self.cf(cf)?, from, to);
        Ok(())
    }

    /// Applies `batch` atomically; with `sync`, returns once the WAL is on disk. Without it the
    /// write is in the WAL's OS buffers and becomes durable at the next sync.
    pub fn write(&self, batch: WriteBatch, sync: bool) -> Result<(), DbError> {
        if sync && self.faults.syncs_fail() {
            return Err(DbError::InjectedSyncFailure {
                path: self.path.clone(),
            });
        }
        let mut write_opts = WriteOptions::default();
        write_opts.set_sync(sync);
        self.db
            .write_opt(batch, &write_opts)
            .map_err(|source| self.rocks(source))
    }

    /// Asks RocksDB to flush `cf`'s memtable in the background, if it holds at least
    /// `min_bytes`, and returns at once. Used after the log is purged behind a snapshot: the
    /// purged entries stay in memory until the memtable holding them is flushed, and a quiet
    /// cluster may take hours to fill it. Each flush also starts a new WAL file and an SST,
    /// hence the floor. Returns whether a flush was asked for.
    pub fn start_flush(&self, cf: &str, min_bytes: u64) -> Result<bool, DbError> {
        let handle = self.cf(cf)?;
        let active = self
            .db
            .property_int_value_cf(handle, "rocksdb.cur-size-active-mem-table")
            .map_err(|source| self.rocks(source))?
            .unwrap_or(0);
        if active < min_bytes {
            return Ok(false);
        }
        let mut opts = FlushOptions::default();
        opts.set_wait(false);
        self.db
            .flush_cf_opt(handle, &opts)
            .map_err(|source| self.rocks(source))?;
        Ok(true)
    }

    /// Syncs the write-ahead log: every write made before the call is durable when it returns.
    pub fn sync_wal(&self) -> Result<(), DbError> {
        if self.faults.syncs_fail() {
            return Err(DbError::InjectedSyncFailure {
                path: self.path.clone(),
            });
        }
        self.db.flush_wal(true).map_err(|source| self.rocks(source))
    }

    /// Key-value pairs of `cf` in key order from `start` (inclusive), forwards, or backwards
    /// from the last key when `start` is `None` and `reverse` is set.
    pub fn scan(
        &self,
        cf: &str,
        start: Option<&[u8]>,
        reverse: bool,
    ) -> Result<impl Iterator<Item = Result<KeyValue, DbError>> + '_, DbError> {
        let handle = self.cf(cf)?;
        let mode = match (start, reverse) {
            (Some(key), false) => IteratorMode::From(key, Direction::Forward),
            (Some(key), true) => IteratorMode::From(key, Direction::Reverse),
            (None, false) => IteratorMode::Start,
            (None, true) => IteratorMode::End,
        };
        Ok(self
            .db
            .iterator_cf(handle, mode)
            .map(|item| item.map_err(|source| self.rocks(source))))
    }

    /// Reads `key` from column family `cf`.
    pub fn get(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>, DbError> {
        let handle = self.cf(cf)?;
        self.db
            .get_cf(handle, key)
            .map_err(|source| self.rocks(source))
    }

    fn cf(&self, name: &str) -> Result<&rocksdb::ColumnFamily, DbError> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| DbError::UnknownColumnFamily {
                name: name.to_owned(),
                known: cf::ALL,
            })
    }

    fn rocks(&self, source: rocksdb::Error) -> DbError {
        DbError::Rocks {
            path: self.path.clone(),
            source,
        }
    }

    fn check_or_stamp_format(&self) -> Result<u32, DbError> {
        match self.get(cf::META, FORMAT_KEY)? {
            None => {
                self.put_synced(cf::META, FORMAT_KEY, &FORMAT_VERSION.to_be_bytes())?;
                Ok(FORMAT_VERSION)
            }
            Some(bytes) => {
                let raw: [u8; 4] =
                    bytes
                        .as_slice()
                        .try_into()
                        .map_err(|_| DbError::MalformedFormat {
                            path: self.path.clone(),
                            len: bytes.len(),
                        })?;
                let found = u32::from_be_bytes(raw);
                if found > FORMAT_VERSION {
                    return Err(DbError::NewerFormat {
                        path: self.path.clone(),
                        found,
                        supported: FORMAT_VERSION,
                    });
                }
                Ok(found)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_directory_is_stamped_with_current_format() {
        let dir = tempfile::tempdir().unwrap();
        let db = DataDir::open(dir.path()).unwrap();
        assert_eq!(db.format_version(), FORMAT_VERSION);
        assert_eq!(
            db.get(cf::META, FORMAT_KEY).unwrap(),
            Some(FORMAT_VERSION.to_be_bytes().to_vec())
        );
    }

    #[test]
    fn newer_format_is_refused_with_both_versions_named() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = DataDir::open(dir.path()).unwrap();
            db.put_synced(cf::META, FORMAT_KEY, &(FORMAT_VERSION + 1).to_be_bytes())
                .unwrap();
        }
        let err = DataDir::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, DbError::NewerFormat { found, supported, .. }
                if found == FORMAT_VERSION + 1 && supported == FORMAT_VERSION),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains(&format!("format version {}", FORMAT_VERSION + 1)));
    }

    #[test]
    fn malformed_format_stamp_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = DataDir::open(dir.path()).unwrap();
            db.put_synced(cf::META, FORMAT_KEY, b"xyz").unwrap();
        }
        let err = DataDir::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, DbError::MalformedFormat { len: 3, .. }),
            "{err}"
        );
    }

    #[test]
    fn unknown_column_family_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let db = DataDir::open(dir.path()).unwrap();
        let err = db.get("nope", b"k").unwrap_err();
        assert!(err.to_string().contains("\"nope\""), "{err}");
        assert!(db.put_synced("nope", b"k", b"v").is_err());
    }
}
