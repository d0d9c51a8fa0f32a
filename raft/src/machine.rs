//! The state machine a replicated log drives, as the application (the controller) defines it.
//!
//! docket-raft knows nothing of jobs: it orders and persists opaque commands and hands them,
//! committed and in log order, to a [`StateMachine`]. The controller implements it over
//! docket-core's state; the tests and the benchmark implement it over a small key-value map
//! ([`crate::kv`]).
//!
//! The contract every implementation keeps:
//! - **Deterministic apply.** Every replica applies the same commands in the same order and
//!   must reach the same state and the same responses. Apply never reads a clock (the
//!   proposing leader's wall clock arrives in [`ApplyContext::time_ms`]), never iterates a
//!   hash map in a way that shows, and never draws OS randomness.
//! - **A rejected command is a response, not an error.** Apply cannot fail: a command the
//!   state refuses (an invalid job, a stale decision) produces a response saying so and changes
//!   nothing. An I/O failure inside apply is a bug in the machine; it should panic.
//! - **Snapshots are the whole state.** [`StateMachine::write_snapshot`] streams the state to a
//!   writer (a file on disk, so a large state is never held twice in memory), and
//!   [`StateMachine::restore`] replaces the state with what such a stream holds. A machine
//!   with a large part kept outside memory (the controller's accounting archive) captures a
//!   consistent view of it in [`StateMachine::snapshot_tail`] and writes it after the read
//!   lock is released, so applies do not wait for it. A machine that can copy its state
//!   cheaply (the controller's shares its jobs) takes the copy in
//!   [`StateMachine::freeze_snapshot`] and encodes all of it after the lock is released.

use std::fmt::Debug;
use std::io;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// What apply may know about the entry a command came in, beyond the command itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplyContext {
    /// The Raft log index of the entry.
    pub index: u64,
    /// The command's position in its entry's batch (0 for the first): `(index, position)`
    /// orders every command ever applied.
    pub position: u32,
    /// The term of the leader that proposed it.
    pub term: u64,
    /// Wall-clock milliseconds since the Unix epoch on the leader when it proposed the batch.
    /// Not monotonic across leaders (their clocks differ); a machine that needs monotonic time
    /// keeps the largest it has seen.
    pub time_ms: u64,
}

/// The part of a snapshot written after the machine's read lock is released.
pub type SnapshotTail = Box<dyn FnOnce(&mut dyn io::Write) -> io::Result<()> + Send>;

/// A deterministic state machine replicated by docket-raft.
pub trait StateMachine: Send + Sync + 'static {
    /// One request to change the state.
    type Command: Serialize + DeserializeOwned + Clone + Debug + Send + Sync + 'static;
    /// What applying a command answered.
    type Response: Serialize + DeserializeOwned + Clone + Debug + Send + Sync + 'static;

    /// Applies one committed command. See the module docs for the rules.
    fn apply(&mut self, ctx: ApplyContext, command: Self::Command) -> Self::Response;

    /// Writes the whole state to `out` (followed by the tail, if any).
    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()>;

    /// Called under the same read lock as [`StateMachine::write_snapshot`]: captures the rest
    /// of the snapshot as it is now, and returns what writes it after the lock is released.
    /// `None` (the default): the snapshot is complete.
    fn snapshot_tail(&self) -> io::Result<Option<SnapshotTail>> {
        Ok(None)
    }

    /// Called under the read lock instead of [`StateMachine::write_snapshot`] and
    /// [`StateMachine::snapshot_tail`]: captures the whole snapshot as the state is now, and
    /// returns what writes it (the same bytes they would) after the lock is released, so
    /// applies do not wait for the encoding. `None` (the default): they run under the lock.
    fn freeze_snapshot(&self) -> io::Result<Option<SnapshotTail>> {
        Ok(None)
    }

    /// Replaces the whole state with the one `input` holds (written by `write_snapshot`).
    /// On error the state must be left as it was.
    fn restore(&mut self, input: &mut dyn io::Read) -> io::Result<()>;

    /// Reads a snapshot as [`StateMachine::restore`] would, changing nothing, and fails as
    /// it would fail. A received snapshot is checked so before openraft installs it: a failed
    /// install is fatal to openraft (the replica's Raft stops for good), a refused chunk is
    /// not.
    fn check_snapshot(input: &mut dyn io::Read) -> io::Result<()>
    where
        Self: Sized;
}
