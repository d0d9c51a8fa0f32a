//! The Raft log on RocksDB: openraft's `RaftLogStorage` and `RaftLogReader`.
//!
//! Layout, in the replica's [`DataDir`]:
//! - [`cf::LOGS`]: one entry per key, the key the big-endian log index (byte order is log
//!   order, so range scans and range deletes are index ranges).
//! - [`cf::META`]: `vote`, `committed` and `last_purged`, each a postcard value.
//!
//! Durability, the rule openraft's safety rests on:
//! - `save_vote` returns only after the WAL is synced (a vote forgotten in a crash lets a
//!   replica vote twice in one term).
//! - `append` writes the entries without syncing and hands openraft's callback to the
//!   `Flusher`, which syncs the WAL and only then fires it. Appends that arrive while a sync
//!   runs share the next sync: this is the log's group commit, many appends per fsync.
//! - `truncate` syncs before returning; `purge` and `save_committed` need not (losing either
//!   only makes a restart do a little more work), and they become durable with the next sync.
//! - Once a sync has failed, the store refuses every later write and fails every later
//!   callback: nothing written after the failure can ever be acknowledged, and openraft stops
//!   the replica on the first storage error.

use std::fmt::Debug;
use std::io;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, LogState, OptionalSend, RaftLogId, RaftLogReader,
};

use crate::codec::{decode, encode, storage_error};
use crate::db::{DataDir, cf};
use crate::machine::StateMachine;
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

const VOTE_KEY: &[u8] = b"vote";
const COMMITTED_KEY: &[u8] = b"committed";
const LAST_PURGED_KEY: &[u8] = b"last_purged";

/// After a purge, the log's memtable is flushed if it holds at least this much: the log then
/// keeps in memory about what was appended since the last snapshot, not 8 MiB of entries
/// already purged.
pub const FLUSH_AFTER_PURGE_BYTES: u64 = 1 << 20;

/// The key of log index `index`.
fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// The vote `db` holds now: what this replica has promised, on disk. openraft saves a vote
/// before it acts on it (grants it, or follows the leader it names), so no replica has
/// acted on a vote newer than the one this returns.
pub fn persisted_vote(db: &DataDir) -> Result<Option<Vote>, StorageError> {
    get_meta(db, VOTE_KEY, ErrorSubject::Vote)
}

/// The value under `key` in the meta column family.
fn get_meta<T: serde::de::DeserializeOwned>(
    db: &DataDir,
    key: &[u8],
    subject: ErrorSubject<crate::ReplicaId>,
) -> Result<Option<T>, StorageError> {
    let bytes = db
        .get(cf::META, key)
        .map_err(|e| storage_error(subject.clone(), ErrorVerb::Read, &e))?;
    bytes
        .map(|b| decode(&b).map_err(|e| storage_error(subject, ErrorVerb::Read, &e)))
        .transpose()
}

/// The indexes of the membership entries this process appended that are still in the log.
///
/// openraft's effective membership is the last one in the log, committed or not, and its
/// metrics publish it only after the core has handled the append: [`crate::read_index`]
/// counts its quorum in the published membership only when no entry here is newer.
/// Membership entries are rare (an operator adds or removes a replica), and those a purge
/// or a truncation removes leave this list with them: the check needs only what the log
/// still holds.
#[derive(Debug, Clone, Default)]
pub struct MembershipEntries(Arc<Mutex<Vec<u64>>>);

impl MembershipEntries {
    /// The index of the last membership entry appended and still in the log, if any.
    pub fn last(&self) -> Option<u64> {
        self.lock().last().copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn appended(&self, index: u64) {
        let mut entries = self.lock();
        entries.retain(|i| *i < index);
        entries.push(index);
    }

    fn truncated_from(&self, index: u64) {
        self.lock().retain(|i| *i < index);
    }

    /// Drops the entries a purge removed from the log.
    fn purged_upto(&self, index: u64) {
        self.lock().retain(|i| *i > index);
    }
}

/// The RocksDB log store of one replica. Clones share the database and the flusher.
pub struct LogStore<M> {
    db: Arc<DataDir>,
    flusher: Arc<Flusher>,
    memberships: MembershipEntries,
    _machine: PhantomData<fn() -> M>,
}

impl<M> Clone for LogStore<M> {
    fn clone(&self) -> Self {
        LogStore {
            db: self.db.clone(),
            flusher: self.flusher.clone(),
            memberships: self.memberships.clone(),
            _machine: PhantomData,
        }
    }
}

impl<M> Debug for LogStore<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("path", &self.db.path())
            .finish_non_exhaustive()
    }
}

impl<M: StateMachine> LogStore<M> {
    /// The log store over `db`. Starts the flusher thread.
    pub fn new(db: Arc<DataDir>) -> io::Result<Self> {
        let flusher = Arc::new(Flusher::start(db.clone())?);
        Ok(LogStore {
            db,
            flusher,
            memberships: MembershipEntries::default(),
            _machine: PhantomData,
        })
    }

    /// The membership entries this store appends, as they stand ([`MembershipEntries`]).
    pub fn memberships(&self) -> MembershipEntries {
        self.memberships.clone()
    }

    fn get_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        subject: ErrorSubject<crate::ReplicaId>,
    ) -> Result<Option<T>, StorageError> {
        get_meta(&self.db, key, subject)
    }

    fn refuse_if_failed(&self) -> Result<(), StorageError> {
        if self.flusher.failed() {
            let err = io::Error::other("an earlier WAL sync failed; this log accepts no writes");
            return Err(storage_error(ErrorSubject::Logs, ErrorVerb::Write, &err));
        }
        Ok(())
    }

    /// The id of the last entry in the log (not counting the purge mark).
    pub fn last_entry_log_id(&self) -> Result<Option<LogId>, StorageError> {
        let read_err = |e: &(dyn std::error::Error + 'static)| {
            let e = io::Error::other(e.to_string());
            storage_error(ErrorSubject::Logs, ErrorVerb::Read, &e)
        };
        let mut iter = self
            .db
            .scan(cf::LOGS, None, true)
            .map_err(|e| read_err(&e))?;
        match iter.next() {
            None => Ok(None),
            Some(item) => {
                let (_, value) = item.map_err(|e| read_err(&e))?;
                let entry: Entry<M> = decode(&value).map_err(|e| read_err(&e))?;
                Ok(Some(*entry.get_log_id()))
            }
        }
    }
}

impl<M: StateMachine> RaftLogReader<TypeConfig<M>> for LogStore<M> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<M>>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let read_err = |e: &(dyn std::error::Error + 'static)| {
            storage_error(ErrorSubject::Logs, ErrorVerb::Read, e)
        };
        let mut entries = Vec::new();
        let from = index_key(start);
        let iter = self
            .db
            .scan(cf::LOGS, Some(&from), false)
            .map_err(|e| read_err(&e))?;
        for item in iter {
            let (key, value) = item.map_err(|e| read_err(&e))?;
            let index = <[u8; 8]>::try_from(&*key)
                .map(u64::from_be_bytes)
                .map_err(|_| {
                    read_err(&io::Error::other(format!(
                        "log key of {} bytes, expected 8",
                        key.len()
                    )))
                })?;
            if !range.contains(&index) {
                break;
            }
            entries.push(decode(&value).map_err(|e| read_err(&e))?);
        }
        Ok(entries)
    }
}

impl<M: StateMachine> RaftLogStorage<TypeConfig<M>> for LogStore<M> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig<M>>, StorageError> {
        let last_purged_log_id: Option<LogId> =
            self.get_meta(LAST_PURGED_KEY, ErrorSubject::Logs)?;
        // An entry at or below the purge mark is not in the log (it can exist only if a crash
        // came between the mark and the deletion); the log ends at whichever is later.
        let last_log_id = self.last_entry_log_id()?.max(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.refuse_if_failed()?;
        let bytes =
            encode(vote).map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, &e))?;
        self.db.put_synced(cf::META, VOTE_KEY, &bytes).map_err(|e| {
            self.flusher.mark_failed();
            storage_error(ErrorSubject::Vote, ErrorVerb::Write, &e)
        })
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(VOTE_KEY, ErrorSubject::Vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.refuse_if_failed()?;
        let write_err = |e: &(dyn std::error::Error + 'static)| {
            storage_error(ErrorSubject::Store, ErrorVerb::Write, e)
        };
        let bytes = encode(&committed).map_err(|e| write_err(&e))?;
        let mut batch = self.db.batch();
        self.db
            .batch_put(&mut batch, cf::META, COMMITTED_KEY, &bytes)
            .map_err(|e| write_err(&e))?;
        self.db.write(batch, false).map_err(|e| write_err(&e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self
            .get_meta::<Option<LogId>>(COMMITTED_KEY, ErrorSubject::Store)?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig<M>>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<M>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.refuse_if_failed()?;
        let write_err = |e: &(dyn std::error::Error + 'static)| {
            storage_error(ErrorSubject::Logs, ErrorVerb::Write, e)
        };
        let mut batch = self.db.batch();
        let mut memberships = Vec::new();
        for entry in entries {
            if matches!(entry.payload, EntryPayload::Membership(_)) {
                memberships.push(entry.get_log_id().index);
            }
            let bytes = encode(&entry).map_err(|e| write_err(&e))?;
            self.db
                .batch_put(
                    &mut batch,
                    cf::LOGS,
                    &index_key(entry.get_log_id().index),
                    &bytes,
                )
                .map_err(|e| write_err(&e))?;
        }
        // Before they can be read back (replicated) or published as the effective membership.
        for index in memberships {
            self.memberships.appended(index);
        }
        self.db.write(batch, false).map_err(|e| write_err(&e))?;
        // Durable (and acknowledged) only when the flusher has synced the WAL.
        self.flusher
            .sync_then(Box::new(move |result| callback.log_io_completed(result)));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.refuse_if_failed()?;
        let write_err = |e: &(dyn std::error::Error + 'static)| {
            storage_error(ErrorSubject::Log(log_id), ErrorVerb::Delete, e)
        };
        let mut batch = self.db.batch();
        self.db
            .batch_delete_range(
                &mut batch,
                cf::LOGS,
                &index_key(log_id.index),
                &index_key(u64::MAX),
            )
            .map_err(|e| write_err(&e))?;
        // delete_range's end is exclusive: index u64::MAX goes by itself.
        self.db
            .batch_delete_range(&mut batch, cf::LOGS, &index_key(u64::MAX), &[0xff; 9])
            .map_err(|e| write_err(&e))?;
        self.db.write(batch, true).map_err(|e| {
            self.flusher.mark_failed();
            write_err(&e)
        })?;
        self.memberships.truncated_from(log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.refuse_if_failed()?;
        let write_err = |e: &(dyn std::error::Error + 'static)| {
            storage_error(ErrorSubject::Log(log_id), ErrorVerb::Delete, e)
        };
        let bytes = encode(&log_id).map_err(|e| write_err(&e))?;
        let mut batch = self.db.batch();
        // The purge mark and the deletion land together, so the log never has a gap that
        // last_purged does not explain.
        self.db
            .batch_put(&mut batch, cf::META, LAST_PURGED_KEY, &bytes)
            .map_err(|e| write_err(&e))?;
        self.db
            .batch_delete_range(
                &mut batch,
                cf::LOGS,
                &index_key(0),
                &index_key(log_id.index.saturating_add(1)),
            )
            .map_err(|e| write_err(&e))?;
        self.db.write(batch, false).map_err(|e| write_err(&e))?;
        self.memberships.purged_upto(log_id.index);
        // What was purged leaves memory only with the memtable that holds it; without a
        // flush the log's memtable fills to its write buffer (8 MiB) before anything of a
        // purged entry is freed. A failed request costs memory, not correctness: logged.
        if let Err(e) = self.db.start_flush(cf::LOGS, FLUSH_AFTER_PURGE_BYTES) {
            tracing::warn!(error = %e, "could not flush the log after a purge");
        }
        Ok(())
    }
}

/// What to do once a sync has finished: openraft's append callback.
type AfterSync = Box<dyn FnOnce(Result<(), io::Error>) + Send>;

/// The thread that syncs the WAL for appends and fires their callbacks, in order.
///
/// It takes every request waiting when it wakes, syncs once, and answers them all: under load
/// one fsync acknowledges many appends.
#[derive(Debug)]
struct Flusher {
    requests: std::sync::Mutex<Option<mpsc::Sender<AfterSync>>>,
    failed: Arc<AtomicBool>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Flusher {
    fn start(db: Arc<DataDir>) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel::<AfterSync>();
        let failed = Arc::new(AtomicBool::new(false));
        let thread_failed = failed.clone();
        let thread = std::thread::Builder::new()
            .name("docket-raft-wal-sync".into())
            .spawn(move || Self::run(db, rx, thread_failed))?;
        Ok(Flusher {
            requests: std::sync::Mutex::new(Some(tx)),
            failed,
            thread: std::sync::Mutex::new(Some(thread)),
        })
    }

    fn run(db: Arc<DataDir>, rx: mpsc::Receiver<AfterSync>, failed: Arc<AtomicBool>) {
        while let Ok(first) = rx.recv() {
            let mut waiting = vec![first];
            waiting.extend(rx.try_iter());
            let result = if failed.load(Ordering::SeqCst) {
                Err("an earlier WAL sync failed".to_owned())
            } else {
                db.sync_wal().map_err(|e| e.to_string())
            };
            if let Err(message) = &result {
                failed.store(true, Ordering::SeqCst);
                tracing::error!(path = %db.path().display(), error = %message, "WAL sync failed; this replica's log stops accepting writes");
            }
            for callback in waiting {
                callback(result.clone().map_err(io::Error::other));
            }
        }
    }

    fn sync_then(&self, callback: AfterSync) {
        let sent = match self.requests.lock() {
            Ok(guard) => match guard.as_ref() {
                Some(tx) => tx.send(callback).map_err(|e| e.0),
                None => Err(callback),
            },
            Err(_) => Err(callback),
        };
        if let Err(callback) = sent {
            callback(Err(io::Error::other("the WAL sync thread has stopped")));
        }
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    fn mark_failed(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has answered what is queued.
        if let Ok(mut guard) = self.requests.lock() {
            guard.take();
        }
        if let Ok(mut guard) = self.thread.lock()
            && let Some(thread) = guard.take()
        {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MembershipEntries;

    #[test]
    fn membership_entries_follow_appends_truncations_and_purges() {
        let m = MembershipEntries::default();
        assert_eq!(m.last(), None);
        for index in [3, 10, 20] {
            m.appended(index);
        }
        assert_eq!(m.last(), Some(20));
        // A truncation removes the entries at and after it.
        m.truncated_from(20);
        assert_eq!(m.last(), Some(10));
        // An entry appended again at an index replaces what was there and after.
        m.appended(25);
        m.appended(8);
        assert_eq!(m.last(), Some(8));
        assert_eq!(*m.lock(), [3, 8]);
        // A purge drops what it removed from the log.
        m.appended(30);
        m.purged_upto(8);
        assert_eq!(*m.lock(), [30]);
        m.purged_upto(40);
        assert_eq!(m.last(), None);
    }
}
