//! The accounting archive: finished jobs after they leave the replicated queue.
//!
//! docket-core purges a terminal job `MinJobAge` after its end and hands it, with the
//! service units it was charged, to the daemon ([`docket_core::State::take_finished`]); every
//! replica writes what its own applies purged into this RocksDB database
//! (`<data dir>/archive`). Apply is deterministic, so at the same log position every replica's
//! archive holds the same records.
//!
//! The archive is part of what replicas agree on, not a cache beside it:
//! - **Snapshots carry it.** A snapshot is the queue and then every archived record
//!   ([`stream`]), so a replica that catches up by installing a snapshot, or one added long
//!   after the jobs ended, ends with the same records as the others. Its records are read from
//!   a RocksDB checkpoint taken under the machine's read lock, and streamed after the lock is
//!   released: applies do not wait while a large history is written.
//! - **Installing replaces it atomically.** Records arrive into a new *generation* (a key
//!   prefix); a synced write then makes it current and the old one is deleted. A crash in
//!   between leaves the old generation current and the new one's keys are swept at open.
//! - **Every change carries its log position** (the *watermark*), in the same write batch:
//!   the archive reflects every apply up to it and none after. A crash loses at most a suffix
//!   of unsynced batches, so the watermark stays exact. After a restart the queue goes back
//!   to the last snapshot while the archive may be ahead of it; replayed applies at or below
//!   the watermark leave the archive alone, so a replayed retention tick never exports again
//!   (it would rewrite its file with fewer records). Building a snapshot syncs the WAL and
//!   raises the watermark to the snapshot's position; restoring a snapshot imports its
//!   records only when the watermark is below its position.
//! - **Records leave only by the site's retention** (`PurgeJobAfter`): a tick names the
//!   cut-off on the replicated clock, and every replica exports the expiring records to the
//!   same file ([`export`]) before it deletes them.
//!
//! - **Records of an older layout are rewritten at open** ([`docket_core::layout`]): the
//!   format key says which layout the current generation holds, and an upgrade replaces it
//!   with the same records in the current layout, so reads decode one layout only.
//!
//! Keys: `m` + name for metadata; `r` + generation (u32) + job id (u64) for records;
//! `e` + generation + end time (u64 ms) + job id for the end-time index retention walks. All
//! big-endian, so keys sort as the numbers do.

pub mod export;
pub mod stream;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use docket_core::JobId;
use docket_core::apply::purge::Finished;
use docket_core::job::Job;
use docket_core::layout::{self, Layout};
use docket_core::quantity::TimeMs;
use rocksdb::{DB, Direction, IteratorMode, Options, ReadOptions, WriteBatch, WriteOptions};
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
    #[error("accounting archive {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("accounting archive {path}: metadata key {key:?} holds {len} bytes, not {expected}")]
    BadMeta {
        path: PathBuf,
        key: &'static str,
        len: usize,
        expected: usize,
    },
    #[error(
        "accounting archive {path}: records of format {found}, newer than format {supported} \
         that this build reads"
    )]
    NewerFormat {
        path: PathBuf,
        found: u64,
        supported: u32,
    },
}

const GENERATION_KEY: &[u8] = b"mgeneration";
const APPLIED_KEY: &[u8] = b"mapplied";
/// The layout the records are written in ([`RECORD_FORMAT`]); absent before formats were
/// marked, when records were [`Layout::V1`].
const FORMAT_KEY: &[u8] = b"mformat";
/// The record format this build writes: 1 is [`Layout::V1`], 2 [`Layout::V2`].
const RECORD_FORMAT: u32 = 2;
const RECORD: u8 = b'r';
const BY_END: u8 = b'e';
/// Records written per batch while importing a snapshot's archive.
const IMPORT_BATCH: usize = 4096;

/// The archive's write buffer: records arrive a few per finished job and are read back by
/// `sacct` from the block cache or the files, so a small memtable costs nothing
/// ([`docket_raft::rocks_memory`]).
const WRITE_BUFFER_BYTES: usize = 4 << 20;
/// The most records one tick expires: the first tick after `PurgeJobAfter` is set on a long
/// history would otherwise hold applies while it exported and deleted all of it; the ticks
/// after it go on (the same bound on every replica, so they stay alike).
pub const EXPIRE_PER_TICK: usize = 10_000;

fn record_key(generation: u32, id: u64) -> [u8; 13] {
    let mut k = [0u8; 13];
    k[0] = RECORD;
    k[1..5].copy_from_slice(&generation.to_be_bytes());
    k[5..].copy_from_slice(&id.to_be_bytes());
    k
}

fn end_key(generation: u32, end_ms: u64, id: u64) -> [u8; 21] {
    let mut k = [0u8; 21];
    k[0] = BY_END;
    k[1..5].copy_from_slice(&generation.to_be_bytes());
    k[5..13].copy_from_slice(&end_ms.to_be_bytes());
    k[13..].copy_from_slice(&id.to_be_bytes());
    k
}

/// The first key of `kind` in `generation`, and the first after it.
fn generation_range(kind: u8, generation: u32) -> ([u8; 5], [u8; 5]) {
    let mut from = [kind, 0, 0, 0, 0];
    from[1..].copy_from_slice(&generation.to_be_bytes());
    let mut to = [kind, 0, 0, 0, 0];
    match generation.checked_add(1) {
        Some(next) => to[1..].copy_from_slice(&next.to_be_bytes()),
        None => to = [kind + 1, 0, 0, 0, 0],
    }
    (from, to)
}

/// The archive database of one replica.
#[derive(Debug)]
pub struct Archive {
    db: DB,
    path: PathBuf,
    /// The generation whose records are current.
    generation: AtomicU32,
    /// Names checkpoints uniquely within this process.
    next_checkpoint: AtomicU64,
    /// The watermark (see the module docs), 0 for none; kept in step with [`APPLIED_KEY`].
    applied: AtomicU64,
}

impl Archive {
    /// Opens (creating) the archive at `path`, sweeping what an interrupted install or
    /// snapshot left behind.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ArchiveError> {
        let path = path.as_ref().to_path_buf();
        let cache = docket_raft::rocks_memory::block_cache();
        let mut opts = docket_raft::rocks_memory::bounded_cf_options(WRITE_BUFFER_BYTES, &cache);
        opts.create_if_missing(true);
        opts.set_max_total_wal_size(docket_raft::rocks_memory::MAX_TOTAL_WAL_BYTES);
        let db = DB::open(&opts, &path).map_err(|source| ArchiveError::Rocks {
            path: path.clone(),
            source,
        })?;
        let archive = Archive {
            db,
            path,
            generation: AtomicU32::new(0),
            next_checkpoint: AtomicU64::new(0),
            applied: AtomicU64::new(0),
        };
        let applied = archive.read_u64_meta(APPLIED_KEY, "watermark", 8)?;
        archive
            .applied
            .store(applied.unwrap_or(0), Ordering::SeqCst);
        let generation = archive.read_u64_meta(GENERATION_KEY, "generation", 4)?;
        let generation = generation.map_or(0, |g| g as u32);
        archive.generation.store(generation, Ordering::SeqCst);
        archive.sweep_other_generations(generation)?;
        archive.remove_stale_checkpoints();
        archive.upgrade_records()?;
        Ok(archive)
    }

    /// What RocksDB holds in memory for the archive.
    pub fn memory(&self) -> docket_raft::rocks_memory::RocksMemory {
        docket_raft::rocks_memory::RocksMemory::of(&self.db, &[rocksdb::DEFAULT_COLUMN_FAMILY_NAME])
    }

    /// Rewrites records of an older format in the current one, as one replacement (so a
    /// crash midway leaves the old records current, to be upgraded at the next open). Every
    /// other read then decodes the current layout only.
    fn upgrade_records(&self) -> Result<(), ArchiveError> {
        let format = self.read_u64_meta(FORMAT_KEY, "format", 4)?.unwrap_or(1);
        if format == u64::from(RECORD_FORMAT) {
            return Ok(());
        }
        let layout = match format {
            1 => Layout::V1,
            _ => {
                return Err(ArchiveError::NewerFormat {
                    path: self.path.clone(),
                    found: format,
                    supported: RECORD_FORMAT,
                });
            }
        };
        let generation = self.current();
        let (from, to) = generation_range(RECORD, generation);
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(to);
        let old = self
            .db
            .iterator_opt(IteratorMode::From(&from, Direction::Forward), read)
            .map(|item| {
                let (key, value) = item.map_err(|e| self.rocks(e))?;
                let id = u64::from_be_bytes(key[5..].try_into().unwrap_or_default());
                layout::reading(layout, || decode(&self.path, id, &value))
            });
        let position = self.applied.load(Ordering::SeqCst);
        let count = self.replace(position, old)?;
        tracing::info!(count, from = format, to = RECORD_FORMAT, path = %self.path.display(),
            "upgraded the accounting archive's records");
        Ok(())
    }

    fn rocks(&self, source: rocksdb::Error) -> ArchiveError {
        ArchiveError::Rocks {
            path: self.path.clone(),
            source,
        }
    }

    fn read_u64_meta(
        &self,
        key: &'static [u8],
        name: &'static str,
        width: usize,
    ) -> Result<Option<u64>, ArchiveError> {
        let Some(bytes) = self.db.get(key).map_err(|e| self.rocks(e))? else {
            return Ok(None);
        };
        let bad = || ArchiveError::BadMeta {
            path: self.path.clone(),
            key: name,
            len: bytes.len(),
            expected: width,
        };
        match width {
            4 => Ok(Some(u64::from(u32::from_be_bytes(
                bytes.as_slice().try_into().map_err(|_| bad())?,
            )))),
            _ => Ok(Some(u64::from_be_bytes(
                bytes.as_slice().try_into().map_err(|_| bad())?,
            ))),
        }
    }

    fn current(&self) -> u32 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Deletes every record and index key not of `keep`.
    fn sweep_other_generations(&self, keep: u32) -> Result<(), ArchiveError> {
        let mut batch = WriteBatch::default();
        for kind in [RECORD, BY_END] {
            let (from, to) = generation_range(kind, keep);
            batch.delete_range(&[kind][..], &from[..]);
            if keep < u32::MAX {
                batch.delete_range(&to[..], &[kind + 1][..]);
            }
        }
        self.db.write(batch).map_err(|e| self.rocks(e))
    }

    fn checkpoint_prefix(&self) -> String {
        let name = self
            .path
            .file_name()
            .map_or_else(|| "archive".into(), |n| n.to_string_lossy().into_owned());
        format!("{name}.checkpoint-")
    }

    fn remove_stale_checkpoints(&self) {
        let (Some(parent), prefix) = (self.path.parent(), self.checkpoint_prefix()) else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(parent) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    /// Whether the apply at `position` has already changed the archive (a replay after a
    /// restart): its archive work is then done.
    pub fn has_applied(&self, position: u64) -> bool {
        position <= self.applied.load(Ordering::SeqCst)
    }

    /// Writes `batch` with the watermark raised to `position`.
    fn write_at(&self, mut batch: WriteBatch, position: u64) -> Result<(), ArchiveError> {
        let position = position.max(self.applied.load(Ordering::SeqCst));
        batch.put(APPLIED_KEY, position.to_be_bytes());
        self.db.write(batch).map_err(|e| self.rocks(e))?;
        self.applied.store(position, Ordering::SeqCst);
        Ok(())
    }

    /// Stores `finished`, purged by the apply at `position` (not synced: see the module
    /// docs).
    pub fn put(&self, position: u64, finished: &[Finished]) -> Result<(), ArchiveError> {
        let generation = self.current();
        let mut batch = WriteBatch::default();
        for f in finished {
            let record = ArchivedJob {
                job: (*f.job).clone(),
                charged_milli_su: f.charged_milli_su,
            };
            self.add_to(&mut batch, generation, &record)?;
        }
        self.write_at(batch, position)
    }

    fn add_to(
        &self,
        batch: &mut WriteBatch,
        generation: u32,
        record: &ArchivedJob,
    ) -> Result<(), ArchiveError> {
        let id = record.job.id.0;
        let bytes = postcard::to_stdvec(record).map_err(|source| ArchiveError::Encode {
            path: self.path.clone(),
            job: id,
            source,
        })?;
        batch.put(record_key(generation, id), bytes);
        let end = record.job.end_time.map_or(0, |t| t.0);
        batch.put(end_key(generation, end, id), []);
        Ok(())
    }

    /// Makes every record written so far durable.
    pub fn sync(&self) -> Result<(), ArchiveError> {
        self.db.flush_wal(true).map_err(|e| self.rocks(e))
    }

    /// The watermark: the log position (docket-core's) through which the archive reflects
    /// every apply. `None` for an archive nothing has changed.
    pub fn applied(&self) -> Option<u64> {
        Some(self.applied.load(Ordering::SeqCst)).filter(|p| *p > 0)
    }

    /// Makes every change durable and raises the watermark to `position`, durably: the state
    /// has applied through `position` and a snapshot of it is being taken.
    pub fn sync_through(&self, position: u64) -> Result<(), ArchiveError> {
        self.write_at(WriteBatch::default(), position)?;
        self.sync()
    }

    /// Visits records with ids after `after`, in id order, while `visit` returns true.
    pub fn scan(
        &self,
        after: Option<JobId>,
        visit: impl FnMut(ArchivedJob) -> bool,
    ) -> Result<(), ArchiveError> {
        scan_db(&self.db, &self.path, self.current(), after, visit)
    }

    /// Expires, at the apply at `position`, the records of jobs that ended before `before`
    /// (the [`EXPIRE_PER_TICK`] that ended first): hands them to `export` (which must have
    /// made them durable elsewhere when it returns `Ok`), then deletes them. On an export
    /// error nothing is deleted. Returns how many were expired.
    pub fn expire(
        &self,
        position: u64,
        before: TimeMs,
        export: impl FnOnce(&[ArchivedJob]) -> std::io::Result<()>,
    ) -> Result<usize, ArchiveError> {
        let generation = self.current();
        let (from, _) = generation_range(BY_END, generation);
        let mut due = Vec::new();
        let mut index_keys = Vec::new();
        let iter = self
            .db
            .iterator(IteratorMode::From(&from, Direction::Forward));
        for item in iter {
            let (key, _) = item.map_err(|e| self.rocks(e))?;
            if key.len() != 21 || key[..5] != from[..] {
                break;
            }
            let end = u64::from_be_bytes(key[5..13].try_into().unwrap_or_default());
            if end >= before.0 || index_keys.len() >= EXPIRE_PER_TICK {
                break;
            }
            let id = u64::from_be_bytes(key[13..].try_into().unwrap_or_default());
            if let Some(bytes) = self
                .db
                .get(record_key(generation, id))
                .map_err(|e| self.rocks(e))?
            {
                due.push(decode(&self.path, id, &bytes)?);
            }
            index_keys.push(key);
        }
        if index_keys.is_empty() {
            return Ok(0);
        }
        if !due.is_empty() {
            export(&due).map_err(|source| ArchiveError::Io {
                path: self.path.clone(),
                what: "exporting expiring records",
                source,
            })?;
        }
        let mut batch = WriteBatch::default();
        for a in &due {
            batch.delete(record_key(generation, a.job.id.0));
        }
        for key in &index_keys {
            batch.delete(key);
        }
        self.write_at(batch, position)?;
        Ok(due.len())
    }

    /// A consistent copy of the archive as it is now (a RocksDB checkpoint: hard links to
    /// its files, cheap to take), to read while the archive goes on changing.
    pub fn checkpoint(&self) -> Result<ArchiveCheckpoint, ArchiveError> {
        let n = self.next_checkpoint.fetch_add(1, Ordering::Relaxed);
        let dir = self.path.with_file_name(format!(
            "{}{}-{n}",
            self.checkpoint_prefix(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(&dir))
            .map_err(|e| self.rocks(e))?;
        let db = DB::open_for_read_only(&checkpoint_options(), &dir, false).map_err(|source| {
            let _ = std::fs::remove_dir_all(&dir);
            ArchiveError::Rocks {
                path: dir.clone(),
                source,
            }
        })?;
        Ok(ArchiveCheckpoint {
            db: Some(db),
            dir,
            generation: self.current(),
        })
    }

    /// Replaces every record with `records`, atomically: they are written into a new
    /// generation, which a synced write makes current, with the watermark `position`; then
    /// the old generation is deleted. On error the archive is as it was.
    pub fn replace(
        &self,
        position: u64,
        records: impl Iterator<Item = Result<ArchivedJob, ArchiveError>>,
    ) -> Result<u64, ArchiveError> {
        let old = self.current();
        let new = old.wrapping_add(1);
        let result = (|| {
            // Leftovers of an earlier attempt at this generation.
            self.sweep_generation(new)?;
            let mut batch = WriteBatch::default();
            let mut count = 0u64;
            for record in records {
                self.add_to(&mut batch, new, &record?)?;
                count += 1;
                if batch.len() >= 2 * IMPORT_BATCH {
                    self.db
                        .write(std::mem::take(&mut batch))
                        .map_err(|e| self.rocks(e))?;
                }
            }
            batch.put(GENERATION_KEY, new.to_be_bytes());
            batch.put(FORMAT_KEY, RECORD_FORMAT.to_be_bytes());
            batch.put(APPLIED_KEY, position.to_be_bytes());
            let mut sync = WriteOptions::default();
            sync.set_sync(true);
            self.db.write_opt(batch, &sync).map_err(|e| self.rocks(e))?;
            Ok(count)
        })();
        match result {
            Ok(count) => {
                self.generation.store(new, Ordering::SeqCst);
                self.applied.store(position, Ordering::SeqCst);
                // The replacement is done; what is left of the old generation is swept at the
                // next open if this fails.
                if let Err(e) = self.sweep_generation(old) {
                    tracing::warn!(error = %e, "sweeping the replaced archive generation");
                }
                Ok(count)
            }
            Err(e) => {
                let _ = self.sweep_generation(new);
                Err(e)
            }
        }
    }

    fn sweep_generation(&self, generation: u32) -> Result<(), ArchiveError> {
        let mut batch = WriteBatch::default();
        for kind in [RECORD, BY_END] {
            let (from, to) = generation_range(kind, generation);
            batch.delete_range(&from[..], &to[..]);
        }
        self.db.write(batch).map_err(|e| self.rocks(e))
    }
}

fn decode(path: &Path, id: u64, bytes: &[u8]) -> Result<ArchivedJob, ArchiveError> {
    postcard::from_bytes(bytes).map_err(|source| ArchiveError::Decode {
        path: path.to_path_buf(),
        job: id,
        source,
    })
}

fn scan_db(
    db: &DB,
    path: &Path,
    generation: u32,
    after: Option<JobId>,
    mut visit: impl FnMut(ArchivedJob) -> bool,
) -> Result<(), ArchiveError> {
    let first = after.map_or(Some(0), |a| a.0.checked_add(1));
    let Some(first) = first else {
        return Ok(());
    };
    let start = record_key(generation, first);
    let iter = db.iterator_opt(
        IteratorMode::From(&start, Direction::Forward),
        scan_read_options(),
    );
    for item in iter {
        let (key, value) = item.map_err(|source| ArchiveError::Rocks {
            path: path.to_path_buf(),
            source,
        })?;
        if key.len() != 13 || key[..5] != start[..5] {
            break;
        }
        let id = u64::from_be_bytes(key[5..].try_into().unwrap_or_default());
        if !visit(decode(path, id, &value)?) {
            break;
        }
    }
    Ok(())
}

/// How a scan reads: every record once, in key order, so nothing it reads is worth caching.
/// Through the block cache, a scan of a large archive would evict every block point reads
/// use and leave the cache full of blocks read once (RocksDB's advice for bulk scans is the
/// same: `fill_cache = false`).
fn scan_read_options() -> ReadOptions {
    let mut read = ReadOptions::default();
    read.fill_cache(false);
    read
}

/// How a checkpoint is opened: read once from end to end by a snapshot, then deleted, so
/// with no block cache at all. RocksDB's default gives every database it opens a block
/// cache of its own (32 MiB); a snapshot built every few hundred entries opened one each
/// time and filled it with the whole archive (cached blocks are uncompressed), which the
/// C++ allocator was then left holding in fragments after the checkpoint closed: under
/// the chaos workload a controller's memory rose with the archive's size.
fn checkpoint_options() -> Options {
    let mut table = rocksdb::BlockBasedOptions::default();
    table.disable_cache();
    let mut opts = Options::default();
    opts.set_block_based_table_factory(&table);
    opts
}

/// A read-only copy of the archive at one moment; its directory is removed when dropped.
#[derive(Debug)]
pub struct ArchiveCheckpoint {
    db: Option<DB>,
    dir: PathBuf,
    generation: u32,
}

impl ArchiveCheckpoint {
    /// Visits every record in id order while `visit` returns true.
    pub fn scan(&self, visit: impl FnMut(ArchivedJob) -> bool) -> Result<(), ArchiveError> {
        match &self.db {
            Some(db) => scan_db(db, &self.dir, self.generation, None, visit),
            None => Ok(()),
        }
    }
}

impl Drop for ArchiveCheckpoint {
    fn drop(&mut self) {
        drop(self.db.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
pub(crate) mod tests;
