//! Snapshots: the whole state as bytes, and back, exactly.
//!
//! Layout: the magic `DKTS`, a big-endian u16 format version, then the state in postcard
//! (a compact, deterministic serde encoding: the same state always gives the same bytes,
//! which is what lets replicas compare snapshots byte for byte). A snapshot from a newer
//! format is refused, not misread. Derived indexes are not stored; restore rebuilds them
//! and checks every invariant before handing the state out.

use crate::invariants::InvariantViolation;
use crate::state::State;

/// The snapshot layout this build writes and the only one it reads. Format 2 added job
/// steps to every job record, format 3 runtime predictions (each job's, each user's recent
/// run times, the planners' settings), format 4 the accounting archive's retention; postcard has no optional fields, so an older body
/// cannot be read as the current format and is refused with its version named, never
/// misread.
pub const SNAPSHOT_FORMAT: u16 = 4;
const MAGIC: &[u8; 4] = b"DKTS";

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a docket-core snapshot (bad magic)")]
    BadMagic,
    #[error("snapshot format {found} is newer than format {supported} that this build reads")]
    NewerFormat { found: u16, supported: u16 },
    #[error(
        "snapshot format {found} is older than format {supported} that this build reads \
         (format 2 added job steps, format 3 runtime predictions, format 4 the archive's retention); data written before it cannot be upgraded in place"
    )]
    OlderFormat { found: u16, supported: u16 },
    #[error("snapshot body does not decode: {0}")]
    Decode(#[from] postcard::Error),
    #[error("restored state is inconsistent: {0}")]
    Inconsistent(#[from] InvariantViolation),
}

impl State {
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
        if found < SNAPSHOT_FORMAT {
            return Err(SnapshotError::OlderFormat {
                found,
                supported: SNAPSHOT_FORMAT,
            });
        }
        let mut state: State = postcard::from_bytes(body)?;
        state.rebuild_indexes();
        state.check_invariants()?;
        Ok(state)
    }
}
