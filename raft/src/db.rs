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
//! Durability: [`DataDir::put_synced`] returns only after the write-ahead log is synced, which
//! is the rule every acknowledgement in this crate follows (a vote saved or an entry appended
//! that is not on disk can break Raft's safety after a power loss).

use std::path::{Path, PathBuf};

use rocksdb::{ColumnFamilyDescriptor, DB, DBCompressionType, Options, WriteOptions};

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
    #[error("unknown column family {name:?} (known: {known:?})")]
    UnknownColumnFamily {
        name: String,
        known: [&'static str; 3],
    },
}

/// An open replica database.
#[derive(Debug)]
pub struct DataDir {
    db: DB,
    path: PathBuf,
    format_version: u32,
}

impl DataDir {
    /// Opens (creating if needed) the database at `path`, with every column family of the
    /// layout, and checks or stamps its format version.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DbError> {
        let path = path.as_ref().to_path_buf();
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_compression_type(DBCompressionType::Lz4);
        let cfs = cf::ALL.map(|name| {
            let mut cf_opts = Options::default();
            cf_opts.set_compression_type(DBCompressionType::Lz4);
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

    /// Writes `key = value` in column family `cf` and returns once the WAL is synced.
    pub fn put_synced(&self, cf: &str, key: &[u8], value: &[u8]) -> Result<(), DbError> {
        let handle = self.cf(cf)?;
        let mut write_opts = WriteOptions::default();
        write_opts.set_sync(true);
        self.db
            .put_cf_opt(handle, key, value, &write_opts)
            .map_err(|source| self.rocks(source))
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
