//! The accounting archive: finished jobs after they leave the replicated state.
//!
//! docket-core purges a terminal job `min_job_age` after its end and hands it, with the
//! service units it was charged, to the daemon ([`docket_core::State::take_finished`]); every
//! replica writes what its own applies purged into this RocksDB database
//! (`<data dir>/archive`), keyed by big-endian job id. The archive is derived data: a replica
//! that replays the log re-archives what it purges again (same key, same record). Before a
//! snapshot is taken the archive's WAL is synced, so no purge covered by a snapshot can have
//! lost its record in a crash. A replica that catches up by installing a snapshot does not
//! get the records of jobs purged in the entries it skipped; ask the leader for complete
//! history.

use std::path::{Path, PathBuf};

use docket_core::JobId;
use docket_core::apply::purge::Finished;
use docket_core::job::Job;
use rocksdb::{DB, IteratorMode, Options, WriteBatch};
use serde::{Deserialize, Serialize};

/// One archived job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchivedJob {
    pub job: Job,
    /// Thousandths of a service unit charged to its account.
    pub charged_milli_su: u64,
}

/// What can go wrong with the archive.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("accounting archive {path}: {source}")]
    Rocks {
        path: PathBuf,
        #[source]
        source: rocksdb::Error,
    },
    #[error("accounting archive {path}: record of job {job} does not decode: {source}")]
    Decode {
        path: PathBuf,
        job: u64,
        #[source]
        source: postcard::Error,
    },
    #[error("accounting archive {path}: cannot encode job {job}: {source}")]
    Encode {
        path: PathBuf,
        job: u64,
        #[source]
        source: postcard::Error,
    },
}

/// The archive database of one replica.
#[derive(Debug)]
pub struct Archive {
    db: DB,
    path: PathBuf,
}

impl Archive {
    /// Opens (creating) the archive at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ArchiveError> {
        let path = path.as_ref().to_path_buf();
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let db = DB::open(&opts, &path).map_err(|source| ArchiveError::Rocks {
            path: path.clone(),
            source,
        })?;
        Ok(Archive { db, path })
    }

    fn rocks(&self, source: rocksdb::Error) -> ArchiveError {
        ArchiveError::Rocks {
            path: self.path.clone(),
            source,
        }
    }

    /// Stores `finished` (not synced: see the module docs).
    pub fn put(&self, finished: &[Finished]) -> Result<(), ArchiveError> {
        let mut batch = WriteBatch::default();
        for f in finished {
            let record = ArchivedJob {
                job: (*f.job).clone(),
                charged_milli_su: f.charged_milli_su,
            };
            let bytes = postcard::to_stdvec(&record).map_err(|source| ArchiveError::Encode {
                path: self.path.clone(),
                job: f.job.id.0,
                source,
            })?;
            batch.put(f.job.id.0.to_be_bytes(), bytes);
        }
        self.db.write(batch).map_err(|e| self.rocks(e))
    }

    /// Makes every record written so far durable.
    pub fn sync(&self) -> Result<(), ArchiveError> {
        self.db.flush_wal(true).map_err(|e| self.rocks(e))
    }

    /// Visits records with ids after `after`, in id order, while `visit` returns true.
    pub fn scan(
        &self,
        after: Option<JobId>,
        mut visit: impl FnMut(ArchivedJob) -> bool,
    ) -> Result<(), ArchiveError> {
        let start = after.map_or(0, |a| a.0.saturating_add(1)).to_be_bytes();
        let iter = self
            .db
            .iterator(IteratorMode::From(&start, rocksdb::Direction::Forward));
        for item in iter {
            let (key, value) = item.map_err(|e| self.rocks(e))?;
            let id = <[u8; 8]>::try_from(&*key)
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            let record: ArchivedJob =
                postcard::from_bytes(&value).map_err(|source| ArchiveError::Decode {
                    path: self.path.clone(),
                    job: id,
                    source,
                })?;
            if !visit(record) {
                break;
            }
        }
        Ok(())
    }
}
