//! docket-core's state as the machine docket-raft replicates.
//!
//! Each log entry carries a batch of [`Envelope`]s (group commit); each is applied on its own
//! and answered on its own. docket-core refuses a command whose position is not after the
//! last one applied (so a replayed command can never apply twice), and it counts positions
//! in one sequence: a command's position is its entry's log index times 2^20 plus its place
//! in the batch ([`core_position`]). Batches are far smaller than 2^20 commands (the
//! proposer's limit is checked at start).

use std::io;

use docket_core::quantity::TimeMs;
use docket_core::{ApplyCtx, Envelope, Rejection, Response, State};
use docket_raft::{ApplyContext, StateMachine};

/// Most commands one log entry may carry.
pub const MAX_BATCH_COMMANDS: usize = 1 << 20;

/// The position docket-core sees for the command at `position` in entry `index`.
pub fn core_position(index: u64, position: u32) -> u64 {
    (index << 20) | u64::from(position)
}

/// The replicated scheduler state, and where jobs go when the state purges them.
#[derive(Debug)]
pub struct CoreMachine {
    pub state: State,
    pub archive: Option<std::sync::Arc<crate::archive::Archive>>,
}

impl CoreMachine {
    pub fn new(state: State) -> Self {
        CoreMachine {
            state,
            archive: None,
        }
    }

    /// A machine that archives purged jobs in `archive`.
    pub fn with_archive(state: State, archive: std::sync::Arc<crate::archive::Archive>) -> Self {
        CoreMachine {
            state,
            archive: Some(archive),
        }
    }
}

impl StateMachine for CoreMachine {
    type Command = Envelope;
    type Response = Result<Response, Rejection>;

    fn apply(&mut self, ctx: ApplyContext, envelope: Envelope) -> Self::Response {
        let response = self.state.apply(
            &envelope,
            ApplyCtx {
                index: core_position(ctx.index, ctx.position),
                time_ms: TimeMs(ctx.time_ms),
            },
        );
        let finished = self.state.take_finished();
        if !finished.is_empty()
            && let Some(archive) = &self.archive
            && let Err(e) = archive.put(&finished)
        {
            // An I/O failure in apply is fatal (BRIEF §2): the replica stops rather than
            // lose accounting records; it re-archives them when it replays the log.
            panic!("archiving {} finished jobs failed: {e}", finished.len());
        }
        response
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        // Purges this snapshot covers must have durable archive records.
        if let Some(archive) = &self.archive {
            archive.sync().map_err(io::Error::other)?;
        }
        let bytes = self.state.to_snapshot().map_err(io::Error::other)?;
        out.write_all(&bytes)
    }

    fn restore(&mut self, input: &mut dyn io::Read) -> io::Result<()> {
        let mut bytes = Vec::new();
        input.read_to_end(&mut bytes)?;
        let state = State::from_snapshot(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        self.state = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use docket_core::Command;
    use docket_core::config::SchedConfig;

    fn ctx(index: u64, position: u32) -> ApplyContext {
        ApplyContext {
            index,
            position,
            term: 1,
            time_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn commands_of_one_entry_apply_in_order_and_a_replay_is_refused() {
        let mut m = CoreMachine::new(State::new(SchedConfig::default()));
        let tick = || Envelope::controller(Command::Tick);
        assert!(m.apply(ctx(5, 0), tick()).is_ok());
        assert!(m.apply(ctx(5, 1), tick()).is_ok());
        assert!(m.apply(ctx(6, 0), tick()).is_ok());
        // The same command again (a replayed entry) changes nothing.
        assert!(matches!(
            m.apply(ctx(5, 1), tick()),
            Err(Rejection::AlreadyApplied { .. })
        ));
    }

    #[test]
    fn snapshot_restores_the_same_state() {
        let mut m = CoreMachine::new(State::new(SchedConfig::default()));
        m.apply(ctx(1, 0), Envelope::controller(Command::Tick))
            .unwrap();
        let mut bytes = Vec::new();
        m.write_snapshot(&mut bytes).unwrap();
        let mut other = CoreMachine::new(State::new(SchedConfig::default()));
        other.restore(&mut bytes.as_slice()).unwrap();
        assert_eq!(
            other.state.to_snapshot().unwrap(),
            m.state.to_snapshot().unwrap()
        );
        // Garbage is refused and leaves the state alone.
        let before = other.state.to_snapshot().unwrap();
        assert!(other.restore(&mut &b"nonsense"[..]).is_err());
        assert_eq!(other.state.to_snapshot().unwrap(), before);
    }
}
