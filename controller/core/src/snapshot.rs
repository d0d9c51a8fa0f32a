//! Snapshots: the whole state as bytes, and back, exactly.
//!
//! Layout: the magic `DKTS`, a big-endian u16 format version, then the state in postcard
//! (a compact, deterministic serde encoding: the same state always gives the same bytes,
//! which is what lets replicas compare snapshots byte for byte). A snapshot from a newer
//! format is refused, not misread; one from an older format this build still reads is read in
//! its own layout ([`crate::layout`]). Derived indexes are not stored; restore rebuilds them
//! and checks every invariant before handing the state out.

use crate::invariants::InvariantViolation;
use crate::layout::{self, Layout};
use crate::state::State;

/// The snapshot format this build writes. Format 2 added job steps to every job record,
/// format 3 runtime predictions (each job's, each user's recent run times, the planners'
/// settings), format 4 the accounting archive's retention, format 5 jobs' comments.
pub const SNAPSHOT_FORMAT: u16 = 5;
/// The oldest format this build reads: fields added since are read as their defaults
/// ([`crate::layout`]). Formats before it changed the meaning of existing fields and are
/// refused with their version named, never misread.
pub const OLDEST_SNAPSHOT_FORMAT: u16 = 4;

/// The layout of the data in a snapshot of `format` (one this build reads).
pub fn layout_of(format: u16) -> Layout {
    if format < 5 { Layout::V1 } else { Layout::V2 }
}

const MAGIC: &[u8; 4] = b"DKTS";

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a docket-core snapshot (bad magic)")]
    BadMagic,
    #[error("snapshot format {found} is newer than format {supported} that this build reads")]
    NewerFormat { found: u16, supported: u16 },
    #[error(
        "snapshot format {found} is older than format {supported} that this build reads \
         (format 2 added job steps, format 3 runtime predictions, format 4 the archive's \
         retention); data written before it cannot be upgraded in place"
    )]
    OlderFormat { found: u16, supported: u16 },
    #[error("snapshot body does not decode: {0}")]
    Decode(#[from] postcard::Error),
    #[error("restored state is inconsistent: {0}")]
    Inconsistent(#[from] InvariantViolation),
}

impl State {
    /// What a snapshot holds of this state, to encode later: every replicated field, the
    /// jobs shared with this state (a job is copied when either side changes it, see
    /// [`crate::job_table`]), and none of the state's derived indexes, which snapshots do
    /// not hold (each user's entry is copied whole, its derived sets of live and stored jobs
    /// with it; the blobs, scripts and environments, are copied too). Its
    /// [`State::to_snapshot`] gives the same bytes as this state's did when it was taken, so
    /// a replica takes it under its machine's lock and encodes it after releasing the lock.
    /// Not a state to apply to: its indexes are empty.
    pub fn snapshot_copy(&self) -> State {
        // Every field by name, so that a field added to the state is a compile error here
        // until it is decided whether snapshots hold it.
        let State {
            applied,
            config,
            nodes,
            partitions,
            qos,
            reservations,
            accounts,
            assocs,
            users,
            jobs,
            blobs,
            usage,
            next_job_id,
            next_epoch,
            command_version,
            applying_version,
            holding: _,
            suspended_shares: _,
            relations: _,
            account_rules: _,
            partition_caps: _,
            partition_members: _,
            finished: _,
            queue_index: _,
            returns: _,
            ended: _,
            clocked: _,
        } = self;
        State {
            applied: *applied,
            config: config.clone(),
            nodes: nodes.clone(),
            partitions: partitions.clone(),
            qos: qos.clone(),
            reservations: reservations.clone(),
            accounts: accounts.clone(),
            assocs: assocs.clone(),
            users: users.clone(),
            jobs: jobs.clone(),
            blobs: blobs.clone(),
            usage: usage.clone(),
            next_job_id: *next_job_id,
            next_epoch: *next_epoch,
            command_version: *command_version,
            applying_version: *applying_version,
            holding: Default::default(),
            suspended_shares: Default::default(),
            relations: Default::default(),
            account_rules: Default::default(),
            partition_caps: Default::default(),
            partition_members: Default::default(),
            finished: Default::default(),
            queue_index: Default::default(),
            returns: Default::default(),
            ended: Default::default(),
            clocked: Default::default(),
        }
    }

    pub fn to_snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        let mut out = Vec::with_capacity(64 + self.jobs.len() * 256);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&SNAPSHOT_FORMAT.to_be_bytes());
        Ok(postcard::to_extend(self, out)?)
    }

    pub fn from_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
        let rest = bytes.strip_prefix(MAGIC).ok_or(SnapshotError::BadMagic)?;
        let (version, body) = rest.split_at_checked(2).ok_or(SnapshotError::BadMagic)?;
        let found = u16::from_be_bytes([version[0], version[1]]);
        if found > SNAPSHOT_FORMAT {
            return Err(SnapshotError::NewerFormat {
                found,
                supported: SNAPSHOT_FORMAT,
            });
        }
        if found < OLDEST_SNAPSHOT_FORMAT {
            return Err(SnapshotError::OlderFormat {
                found,
                supported: OLDEST_SNAPSHOT_FORMAT,
            });
        }
        let mut state: State = layout::reading(layout_of(found), || postcard::from_bytes(body))?;
        state.rebuild_indexes();
        state.check_invariants()?;
        Ok(state)
    }
}
