//! In-memory storage for simulated replicas: a log store and a state machine holding
//! docket-controller's own `CoreMachine`, applied exactly as a real replica applies it. A
//! "crash" drops the `Raft` and keeps the stores, as a replica keeps what it had synced.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard};

use docket_controller::machine::CoreMachine;
use docket_raft::{ApplyContext, StateMachine};
use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogId, RaftLogReader,
    RaftSnapshotBuilder, SnapshotMeta, StorageError, StoredMembership, Vote,
};

use super::SimConfig;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Default)]
struct Log {
    vote: Option<Vote<u64>>,
    committed: Option<LogId<u64>>,
    purged: Option<LogId<u64>>,
    entries: BTreeMap<u64, Entry<SimConfig>>,
}

/// One replica's log.
#[derive(Debug, Clone, Default)]
pub struct LogStore(Arc<Mutex<Log>>);

impl LogStore {
    /// Every entry it holds, for the log-matching check.
    pub fn entries(&self) -> Vec<Entry<SimConfig>> {
        lock(&self.0).entries.values().cloned().collect()
    }

    pub fn committed(&self) -> Option<LogId<u64>> {
        lock(&self.0).committed
    }

    /// A broken store, for proving the checkers: a crash loses the vote and the last
    /// `entries` entries, as a store that acknowledged writes before syncing them would.
    pub fn lose_unsynced(&self, entries: usize) {
        let mut log = lock(&self.0);
        log.vote = None;
        for _ in 0..entries {
            let Some(last) = log.entries.keys().next_back().copied() else {
                break;
            };
            log.entries.remove(&last);
        }
    }
}

impl RaftLogReader<SimConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<SimConfig>>, StorageError<u64>> {
        Ok(lock(&self.0)
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<SimConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<SimConfig>, StorageError<u64>> {
        let log = lock(&self.0);
        let last = log.entries.values().next_back().map(|e| *e.get_log_id());
        Ok(LogState {
            last_purged_log_id: log.purged,
            last_log_id: last.max(log.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        lock(&self.0).vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(lock(&self.0).vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        lock(&self.0).committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        Ok(lock(&self.0).committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<SimConfig>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<SimConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        {
            let mut log = lock(&self.0);
            for e in entries {
                log.entries.insert(e.get_log_id().index, e);
            }
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        lock(&self.0).entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let mut log = lock(&self.0);
        log.purged = Some(log_id);
        let keep = log.entries.split_off(&(log_id.index + 1));
        log.entries = keep;
        Ok(())
    }
}

struct Machine {
    machine: CoreMachine,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    snapshot: Option<(SnapshotMeta<u64, BasicNode>, Vec<u8>)>,
    snapshots_built: u64,
}

/// One replica's applied state.
#[derive(Clone)]
pub struct MachineStore(Arc<Mutex<Machine>>);

impl Debug for MachineStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MachineStore")
    }
}

impl Default for MachineStore {
    fn default() -> Self {
        MachineStore(Arc::new(Mutex::new(Machine {
            machine: CoreMachine::new(docket_core::State::default()),
            last_applied: None,
            membership: StoredMembership::default(),
            snapshot: None,
            snapshots_built: 0,
        })))
    }
}

impl MachineStore {
    /// The applied position and the state's snapshot bytes (for comparing replicas).
    pub fn fingerprint(&self) -> (Option<LogId<u64>>, Vec<u8>) {
        let m = lock(&self.0);
        let mut bytes = Vec::new();
        let _ = m.machine.write_snapshot(&mut bytes);
        (m.last_applied, bytes)
    }

    /// Job names and ids in the applied state.
    pub fn jobs(&self) -> Vec<(String, u64)> {
        let m = lock(&self.0);
        m.machine
            .state
            .jobs
            .values()
            .map(|j| (j.spec.name.to_string(), j.id.0))
            .collect()
    }

    // openraft's own error type, as its traits return it.
    #[allow(clippy::result_large_err)]
    fn build(&self) -> Result<Snapshot<SimConfig>, StorageError<u64>> {
        let mut m = lock(&self.0);
        let mut bytes = Vec::new();
        m.machine.write_snapshot(&mut bytes).map_err(|e| {
            StorageError::from_io_error(
                openraft::ErrorSubject::StateMachine,
                openraft::ErrorVerb::Read,
                e,
            )
        })?;
        m.snapshots_built += 1;
        let meta = SnapshotMeta {
            last_log_id: m.last_applied,
            last_membership: m.membership.clone(),
            snapshot_id: format!("s{}", m.snapshots_built),
        };
        m.snapshot = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftSnapshotBuilder<SimConfig> for MachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<SimConfig>, StorageError<u64>> {
        self.build()
    }
}

impl RaftStateMachine<SimConfig> for MachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let m = lock(&self.0);
        Ok((m.last_applied, m.membership.clone()))
    }

    async fn apply<I>(
        &mut self,
        entries: I,
    ) -> Result<Vec<<SimConfig as openraft::RaftTypeConfig>::R>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<SimConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut m = lock(&self.0);
        let mut out = Vec::new();
        for entry in entries {
            let log_id = *entry.get_log_id();
            m.last_applied = Some(log_id);
            match entry.payload {
                EntryPayload::Blank => out.push(Vec::new()),
                EntryPayload::Normal(batch) => {
                    let responses = batch
                        .commands
                        .into_iter()
                        .enumerate()
                        .map(|(position, command)| {
                            m.machine.apply(
                                ApplyContext {
                                    index: log_id.index,
                                    position: position as u32,
                                    term: log_id.leader_id.term,
                                    time_ms: batch.time_ms,
                                },
                                command,
                            )
                        })
                        .collect();
                    out.push(responses);
                }
                EntryPayload::Membership(mem) => {
                    m.membership = StoredMembership::new(Some(log_id), mem);
                    out.push(Vec::new());
                }
            }
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let bytes = snapshot.into_inner();
        let mut m = lock(&self.0);
        m.machine.restore(&mut bytes.as_slice()).map_err(|e| {
            StorageError::from_io_error(
                openraft::ErrorSubject::Snapshot(Some(meta.signature())),
                openraft::ErrorVerb::Write,
                e,
            )
        })?;
        m.last_applied = meta.last_log_id;
        m.membership = meta.last_membership.clone();
        m.snapshot = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<SimConfig>>, StorageError<u64>> {
        let m = lock(&self.0);
        Ok(m.snapshot.as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(bytes.clone())),
        }))
    }
}
