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
    /// Who is woken when commands apply.
    pub wakes: Wakes,
}

/// The leader's loops that commits wake, so they act on a change within milliseconds of its
/// commit instead of at their next timer. Every replica applies and so wakes its own loops;
/// only the leader's act (a follower's loops wait for leadership, and a permit left behind
/// costs one pass when it leads).
#[derive(Debug, Clone, Default)]
pub struct Wakes {
    /// The direct scheduling pass: woken by a command that may let a job start
    /// ([`docket_core::Command::may_let_jobs_start`]).
    pub schedule: std::sync::Arc<tokio::sync::Notify>,
    /// The dispatcher (what each agent should be running): woken by every accepted command.
    pub dispatch: std::sync::Arc<tokio::sync::Notify>,
}

impl CoreMachine {
    pub fn new(state: State) -> Self {
        CoreMachine {
            state,
            archive: None,
            wakes: Wakes::default(),
        }
    }

    /// A machine that archives purged jobs in `archive`.
    pub fn with_archive(state: State, archive: std::sync::Arc<crate::archive::Archive>) -> Self {
        CoreMachine {
            state,
            archive: Some(archive),
            wakes: Wakes::default(),
        }
    }

    /// This machine, waking `wakes` as commands apply.
    pub fn waking(mut self, wakes: Wakes) -> Self {
        self.wakes = wakes;
        self
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
        if response.is_ok() {
            if envelope.command.may_let_jobs_start() {
                self.wakes.schedule.notify_one();
            }
            self.wakes.dispatch.notify_one();
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

    /// Whether `n` holds a permit (takes it).
    fn woken(n: &tokio::sync::Notify) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_millis(1), n.notified())
                .await
                .is_ok()
        })
    }

    #[test]
    fn commits_wake_the_dispatcher_and_those_that_may_start_jobs_wake_the_scheduler() {
        let wakes = Wakes::default();
        let mut m = CoreMachine::new(State::new(SchedConfig::default())).waking(wakes.clone());
        // The timed tick (the main pass follows it) wakes only the dispatcher.
        m.apply(ctx(1, 0), Envelope::controller(Command::Tick))
            .unwrap();
        assert!(woken(&wakes.dispatch));
        assert!(!woken(&wakes.schedule));
        // An end report may free cpus: the direct pass runs.
        m.apply(
            ctx(2, 0),
            Envelope::controller(Command::EndJobs(Vec::new())),
        )
        .unwrap();
        assert!(woken(&wakes.schedule));
        assert!(woken(&wakes.dispatch));
        // A refused command changed nothing and wakes no one.
        assert!(
            m.apply(ctx(2, 0), Envelope::controller(Command::Tick))
                .is_err()
        );
        assert!(!woken(&wakes.dispatch));
        assert!(!woken(&wakes.schedule));
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
