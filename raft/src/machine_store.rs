//! The replicated state machine as openraft drives it: `RaftStateMachine` and
//! `RaftSnapshotBuilder` over an application [`StateMachine`].
//!
//! The machine lives in memory behind a read-write lock, with the id of the last entry applied
//! and the last membership. It is made durable by snapshots only: a restart restores the
//! latest snapshot from disk and openraft replays the committed log after it. So the log is
//! purged only behind a snapshot (openraft's rule), and nothing here writes per apply.
//!
//! Building a snapshot streams the machine into a file under a read lock (applies wait,
//! readers don't); installing one restores the machine from the received file under the write
//! lock. See [`crate::snapshot`] for how files become current.

use std::fmt::Debug;
use std::io::{self, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftLogId, RaftSnapshotBuilder, Snapshot,
    StorageIOError,
};

use crate::codec::{decode, encode, storage_error};
use crate::db::{DataDir, DbError, cf};
use crate::machine::{ApplyContext, StateMachine};
use crate::snapshot::{SnapshotDir, SnapshotFile};
use crate::types::{Entry, LogId, SnapshotMeta, StorageError, StoredMembership, TypeConfig};

/// Key in [`cf::STATE`] of the current snapshot's metadata.
const SNAPSHOT_META_KEY: &[u8] = b"snapshot";

/// The machine and what has been applied to it.
#[derive(Debug)]
pub struct Applied<M> {
    /// The application state.
    pub machine: M,
    /// The last log entry applied (blank and membership entries included).
    pub last_applied: Option<LogId>,
    /// The last membership applied.
    pub membership: StoredMembership,
}

/// Opening a machine store failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("snapshot metadata in {path} is unreadable: {source}")]
    Meta {
        path: std::path::PathBuf,
        source: postcard::Error,
    },
    #[error("snapshot file {path}: {source}")]
    Snapshot {
        path: std::path::PathBuf,
        source: io::Error,
    },
}

struct Shared<M> {
    applied: RwLock<Applied<M>>,
    /// A copy of `applied.last_applied`, set before the lock is released: readable while a
    /// long reader holds the machine and a writer waits, and waited on by a read for its
    /// read index, which then wakes as the entry is applied, not when openraft's core next
    /// publishes its metrics (between log flushes).
    last_applied: tokio::sync::watch::Sender<Option<LogId>>,
    db: Arc<DataDir>,
    snapshots: SnapshotDir,
    /// The current snapshot's metadata. Also serialises making a snapshot current.
    current: Mutex<Option<SnapshotMeta>>,
    /// Suffix that keeps snapshot ids unique (seeded from the clock at open, so unique across
    /// restarts too).
    next_snapshot: AtomicU64,
    /// The file the snapshot being received goes to (openraft receives one at a time).
    receiving: Mutex<Option<PathBuf>>,
}

/// The state-machine side of a replica's storage. Clones share the machine.
pub struct MachineStore<M> {
    shared: Arc<Shared<M>>,
}

impl<M> Clone for MachineStore<M> {
    fn clone(&self) -> Self {
        MachineStore {
            shared: self.shared.clone(),
        }
    }
}

impl<M> Debug for MachineStore<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachineStore")
            .field("path", &self.shared.db.path())
            .finish_non_exhaustive()
    }
}

impl<M: StateMachine> MachineStore<M> {
    /// Checks the snapshot received so far (every chunk openraft took) as the machine would
    /// restore it ([`StateMachine::check_snapshot`]), on the blocking pool.
    pub async fn check_received(&self) -> io::Result<()> {
        let path = self
            .lock_receiving()
            .clone()
            .ok_or_else(|| io::Error::other("no snapshot is being received"))?;
        tokio::task::spawn_blocking(move || {
            let mut input = BufReader::new(std::fs::File::open(&path)?);
            M::check_snapshot(&mut input)
        })
        .await
        .map_err(io::Error::other)?
    }

    fn lock_receiving(&self) -> std::sync::MutexGuard<'_, Option<PathBuf>> {
        self.shared
            .receiving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Opens the store over `db`, keeping snapshot files in `<db path>/snapshots`. `fresh` is
    /// the machine's empty state; if a snapshot exists it is restored into it.
    pub fn open(db: Arc<DataDir>, mut fresh: M) -> Result<Self, OpenError> {
        let meta: Option<SnapshotMeta> = db
            .get(cf::STATE, SNAPSHOT_META_KEY)?
            .map(|bytes| {
                decode(&bytes).map_err(|source| OpenError::Meta {
                    path: db.path().to_path_buf(),
                    source,
                })
            })
            .transpose()?;
        let snapshots = SnapshotDir::open(
            db.path().join("snapshots"),
            meta.as_ref().map(|m| m.snapshot_id.as_str()),
        )
        .map_err(|source| OpenError::Snapshot {
            path: db.path().join("snapshots"),
            source,
        })?;
        let (last_applied, membership) = match &meta {
            None => (None, StoredMembership::default()),
            Some(meta) => {
                let path = snapshots.path_of(&meta.snapshot_id);
                let mut restore = || -> io::Result<()> {
                    let mut input = BufReader::new(std::fs::File::open(&path)?);
                    fresh.restore(&mut input)
                };
                restore().map_err(|source| OpenError::Snapshot {
                    path: path.clone(),
                    source,
                })?;
                (meta.last_log_id, meta.last_membership.clone())
            }
        };
        let seed = docket_proto::unix_ms();
        Ok(MachineStore {
            shared: Arc::new(Shared {
                applied: RwLock::new(Applied {
                    machine: fresh,
                    last_applied,
                    membership,
                }),
                last_applied: tokio::sync::watch::Sender::new(last_applied),
                db,
                snapshots,
                current: Mutex::new(meta),
                next_snapshot: AtomicU64::new(seed),
                receiving: Mutex::new(None),
            }),
        })
    }

    /// Runs `f` on the machine and what has been applied, under the read lock.
    pub fn read<T>(&self, f: impl FnOnce(&Applied<M>) -> T) -> T {
        f(&self.read_guard())
    }

    /// The current snapshot's metadata, if any.
    pub fn current_snapshot(&self) -> Option<SnapshotMeta> {
        self.shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn read_guard(&self) -> RwLockReadGuard<'_, Applied<M>> {
        // A panic while applying poisons the lock; apply panics only on a broken machine and
        // then the replica is going down anyway. Readers still see the last good state.
        self.shared
            .applied
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The last log entry applied, without waiting for the machine's lock.
    pub fn last_applied(&self) -> Option<LogId> {
        *self.shared.last_applied.borrow()
    }

    /// Waits until log index `index` is applied; false if `timeout` passed first.
    pub async fn wait_applied(&self, index: u64, timeout: std::time::Duration) -> bool {
        let mut applied = self.shared.last_applied.subscribe();
        let reached = applied.wait_for(|id| id.is_some_and(|id| id.index >= index));
        matches!(tokio::time::timeout(timeout, reached).await, Ok(Ok(_)))
    }

    fn set_last_applied(&self, log_id: Option<LogId>) {
        self.shared.last_applied.send_replace(log_id);
    }

    fn write_guard(&self) -> RwLockWriteGuard<'_, Applied<M>> {
        self.shared
            .applied
            .write()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Writes a snapshot of the machine as it is now and makes it current. The machine's
    /// own part is written under the read lock; its tail, if any, after it is released.
    fn build_blocking(&self) -> Result<Snapshot<TypeConfig<M>>, StorageError> {
        let temp = self.shared.snapshots.temp_path();
        let (meta, written) = {
            let applied = self.read_guard();
            let n = self.shared.next_snapshot.fetch_add(1, Ordering::Relaxed);
            let snapshot_id = match applied.last_applied {
                Some(id) => format!("{}-{}-{n}", id.leader_id.term, id.index),
                None => format!("0-0-{n}"),
            };
            let meta = SnapshotMeta {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
                snapshot_id,
            };
            let write = || -> io::Result<_> {
                let file = std::fs::File::create(&temp)?;
                let mut out = BufWriter::new(file);
                if let Some(frozen) = applied.machine.freeze_snapshot()? {
                    return Ok((out, Some(frozen)));
                }
                applied.machine.write_snapshot(&mut out)?;
                let tail = applied.machine.snapshot_tail()?;
                Ok((out, tail))
            };
            (meta, write())
        };
        let finish = || -> io::Result<()> {
            let (mut out, tail) = written?;
            if let Some(tail) = tail {
                tail(&mut out)?;
            }
            out.flush()?;
            out.get_ref().sync_all()
        };
        if let Err(e) = finish() {
            let _ = std::fs::remove_file(&temp);
            return Err(snapshot_error(&meta, ErrorVerb::Write, &e));
        }
        self.make_current(&temp, &meta)?;
        let path = self.shared.snapshots.path_of(&meta.snapshot_id);
        let file =
            std::fs::File::open(&path).map_err(|e| snapshot_error(&meta, ErrorVerb::Read, &e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(SnapshotFile::from_std(file, path)),
        })
    }

    /// Renames the finished file at `temp` to be the snapshot `meta` describes, records the
    /// metadata durably and removes the previous snapshot. A snapshot older than the current
    /// one is discarded instead.
    fn make_current(
        &self,
        temp: &std::path::Path,
        meta: &SnapshotMeta,
    ) -> Result<(), StorageError> {
        let mut current = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = current.as_ref()
            && existing.last_log_id > meta.last_log_id
        {
            let _ = std::fs::remove_file(temp);
            return Ok(());
        }
        self.shared
            .snapshots
            .commit(temp, &meta.snapshot_id)
            .map_err(|e| snapshot_error(meta, ErrorVerb::Write, &e))?;
        let bytes = encode(meta).map_err(|e| snapshot_error(meta, ErrorVerb::Write, &e))?;
        self.shared
            .db
            .put_synced(cf::STATE, SNAPSHOT_META_KEY, &bytes)
            .map_err(|e| snapshot_error(meta, ErrorVerb::Write, &e))?;
        if let Some(old) = current.replace(meta.clone())
            && old.snapshot_id != meta.snapshot_id
        {
            self.shared
                .snapshots
                .remove(&old.snapshot_id)
                .map_err(|e| snapshot_error(&old, ErrorVerb::Delete, &e))?;
        }
        Ok(())
    }

    /// Replaces the machine with the snapshot in the finished file at `temp`, then makes the
    /// file current.
    fn install_blocking(
        &self,
        temp: &std::path::Path,
        meta: &SnapshotMeta,
    ) -> Result<(), StorageError> {
        {
            let mut applied = self.write_guard();
            let restore = |machine: &mut M| -> io::Result<()> {
                let mut input = BufReader::new(std::fs::File::open(temp)?);
                machine.restore(&mut input)
            };
            restore(&mut applied.machine).map_err(|e| snapshot_error(meta, ErrorVerb::Read, &e))?;
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership.clone();
            self.set_last_applied(applied.last_applied);
        }
        self.make_current(temp, meta)
    }
}

fn snapshot_error(
    meta: &SnapshotMeta,
    verb: ErrorVerb,
    source: &(dyn std::error::Error + 'static),
) -> StorageError {
    storage_error(ErrorSubject::Snapshot(Some(meta.signature())), verb, source)
}

fn join_error(e: tokio::task::JoinError) -> StorageError {
    StorageError::IO {
        source: StorageIOError::write_snapshot(None, openraft::AnyError::new(&e)),
    }
}

impl<M: StateMachine> RaftSnapshotBuilder<TypeConfig<M>> for MachineStore<M> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig<M>>, StorageError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.build_blocking())
            .await
            .map_err(join_error)?
    }
}

impl<M: StateMachine> RaftStateMachine<TypeConfig<M>> for MachineStore<M> {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let applied = self.read_guard();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<M::Response>>, StorageError>
    where
        I: IntoIterator<Item = Entry<M>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut applied = self.write_guard();
        let mut responses = Vec::new();
        for entry in entries {
            let log_id = *entry.get_log_id();
            applied.last_applied = Some(log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(Vec::new()),
                EntryPayload::Normal(batch) => {
                    let out = batch
                        .commands
                        .into_iter()
                        .enumerate()
                        .map(|(position, command)| {
                            let ctx = ApplyContext {
                                index: log_id.index,
                                position: position as u32,
                                term: log_id.leader_id.term,
                                time_ms: batch.time_ms,
                            };
                            applied.machine.apply(ctx, command)
                        })
                        .collect();
                    responses.push(out);
                }
                EntryPayload::Membership(membership) => {
                    applied.membership = StoredMembership::new(Some(log_id), membership);
                    responses.push(Vec::new());
                }
            }
        }
        // Before openraft answers any of these writes.
        self.set_last_applied(applied.last_applied);
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, StorageError> {
        let path = self.shared.snapshots.temp_path();
        let file = SnapshotFile::create(path.clone())
            .await
            .map_err(|e| storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Write, &e))?;
        *self.lock_receiving() = Some(path);
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotFile>,
    ) -> Result<(), StorageError> {
        let temp = snapshot
            .finish()
            .await
            .map_err(|e| snapshot_error(meta, ErrorVerb::Write, &e))?;
        let this = self.clone();
        let meta = meta.clone();
        tokio::task::spawn_blocking(move || this.install_blocking(&temp, &meta))
            .await
            .map_err(join_error)?
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig<M>>>, StorageError> {
        let Some(meta) = self.current_snapshot() else {
            return Ok(None);
        };
        let path = self.shared.snapshots.path_of(&meta.snapshot_id);
        let file = SnapshotFile::open(path)
            .await
            .map_err(|e| snapshot_error(&meta, ErrorVerb::Read, &e))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }
}
