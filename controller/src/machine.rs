//! docket-core's state as the machine docket-raft replicates.
//!
//! Each log entry carries a batch of [`Envelope`]s (group commit); each is applied on its own
//! and answered on its own. docket-core refuses a command whose position is not after the
//! last one applied (so a replayed command can never apply twice), and it counts positions
//! in one sequence: a command's position is its entry's log index times 2^20 plus its place
//! in the batch ([`core_position`]). Batches are far smaller than 2^20 commands (the
//! proposer's limit is checked at start).

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::Arc;

use docket_core::quantity::TimeMs;
use docket_core::{ApplyCtx, Envelope, Rejection, Response, State};
use docket_raft::{ApplyContext, SnapshotTail, StateMachine};

use crate::archive::Archive;

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
    pub archive: Option<ArchiveSink>,
    /// Who is woken when commands apply.
    pub wakes: Wakes,
}

/// Where a replica keeps its accounting archive and exports expiring records.
#[derive(Debug, Clone)]
pub struct ArchiveSink {
    pub archive: Arc<Archive>,
    /// `<data dir>/archive-export`.
    pub export_dir: PathBuf,
}

/// The leader's loops that commits wake, so they act on a change within milliseconds of its
/// commit instead of at their next timer. Every replica applies and so wakes its own loops;
/// only the leader's act (a follower's loops wait for leadership, and a permit left behind
/// costs one pass when it leads).
#[derive(Debug, Clone, Default)]
pub struct Wakes {
    /// The direct scheduling pass: woken by a command that may let a job start
    /// ([`docket_core::Command::may_let_jobs_start`]).
    pub schedule: Arc<tokio::sync::Notify>,
    /// The dispatcher (what each agent should be running): woken by every accepted command.
    pub dispatch: Arc<tokio::sync::Notify>,
}

/// The snapshot layout: the magic `DKTM`, a big-endian u16 format, the u64 length of the
/// queue's snapshot and its bytes (docket-core's own format), then one byte: 1 if the
/// accounting archive's section ([`crate::archive::stream`]) follows, 0 if not.
const MAGIC: &[u8; 4] = b"DKTM";
const FORMAT: u16 = 1;

impl CoreMachine {
    pub fn new(state: State) -> Self {
        CoreMachine {
            state,
            archive: None,
            wakes: Wakes::default(),
        }
    }

    /// A machine that archives purged jobs in `sink`.
    pub fn with_archive(state: State, sink: ArchiveSink) -> Self {
        CoreMachine {
            state,
            archive: Some(sink),
            wakes: Wakes::default(),
        }
    }

    /// This machine, waking `wakes` as commands apply.
    pub fn waking(mut self, wakes: Wakes) -> Self {
        self.wakes = wakes;
        self
    }

    /// Hands what the apply at `position` purged, and the retention cut-off a tick named,
    /// to the archive. A replayed apply the archive already reflects does nothing (see
    /// [`crate::archive`]: its watermark).
    fn archive_outbox(&mut self, position: u64) {
        let finished = self.state.take_finished();
        let expiry = self.state.take_archive_expiry();
        let Some(sink) = &self.archive else {
            return;
        };
        if (finished.is_empty() && expiry.is_none()) || sink.archive.has_applied(position) {
            return;
        }
        // An I/O failure in apply is fatal: the replica stops rather than lose accounting
        // records or keep ones the others dropped; it redoes this apply when it replays the
        // log (a full export disk keeps it down until there is room).
        if !finished.is_empty()
            && let Err(e) = sink.archive.put(position, &finished)
        {
            panic!("archiving {} finished jobs failed: {e}", finished.len());
        }
        if let Some(before) = expiry {
            let retention = &self.state.config.retention;
            let expired = sink.archive.expire(position, before, |records| {
                if retention.archive_jobs {
                    crate::archive::export::write(
                        &sink.export_dir,
                        position,
                        retention.archive_format,
                        records,
                    )?;
                }
                Ok(())
            });
            match expired {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    jobs = n,
                    exported = retention.archive_jobs,
                    "accounting records past PurgeJobAfter left the archive"
                ),
                Err(e) => panic!("expiring accounting records failed: {e}"),
            }
        }
    }
}

impl StateMachine for CoreMachine {
    type Command = Envelope;
    type Response = Result<Response, Rejection>;

    fn apply(&mut self, ctx: ApplyContext, envelope: Envelope) -> Self::Response {
        let position = core_position(ctx.index, ctx.position);
        let may_let_jobs_start = envelope.command.may_let_jobs_start();
        let response = self.state.apply(
            envelope,
            ApplyCtx {
                index: position,
                time_ms: TimeMs(ctx.time_ms),
            },
        );
        self.archive_outbox(position);
        if response.is_ok() {
            if may_let_jobs_start {
                self.wakes.schedule.notify_one();
            }
            self.wakes.dispatch.notify_one();
        }
        response
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        write_queue(&self.state, self.archive.is_some(), out)
    }

    /// The queue shares its jobs with a copy ([`State::snapshot_copy`]), so the copy is taken
    /// under the lock and encoded after it: with 240,000 jobs the encoding held the lock, and
    /// so every apply, for 0.2–0.3 s.
    fn freeze_snapshot(&self) -> io::Result<Option<SnapshotTail>> {
        let state = self.state.snapshot_copy();
        let archived = self.archive.is_some();
        let tail = self.snapshot_tail()?;
        Ok(Some(Box::new(move |out: &mut dyn io::Write| {
            write_queue(&state, archived, out)?;
            // Shares nothing from here on: changes to the queue copy no more jobs.
            drop(state);
            match tail {
                Some(tail) => tail(out),
                None => Ok(()),
            }
        })))
    }

    fn snapshot_tail(&self) -> io::Result<Option<SnapshotTail>> {
        let Some(sink) = &self.archive else {
            return Ok(None);
        };
        // Every purge this snapshot covers is durable here, and a restart that restores it
        // need not import its records again.
        let position = self.state.applied.index;
        sink.archive
            .sync_through(position)
            .map_err(io::Error::other)?;
        let checkpoint = sink.archive.checkpoint().map_err(io::Error::other)?;
        Ok(Some(Box::new(move |out: &mut dyn io::Write| {
            let count = crate::archive::stream::write(&checkpoint, position, out)?;
            tracing::debug!(records = count, "archive written into the snapshot");
            Ok(())
        })))
    }

    fn restore(&mut self, input: &mut dyn io::Read) -> io::Result<()> {
        let state = read_queue(input)?;
        if read_archive_flag(input)?
            && let Some(sink) = &self.archive
        {
            let records = archive_records(input, state.applied.index)?;
            // Restoring its own snapshot at start: the archive already reflects it (and
            // perhaps later applies, which the replay then leaves alone).
            if sink.archive.applied() < Some(records.position) {
                let position = records.position;
                let count = sink
                    .archive
                    .replace(position, records)
                    .map_err(io::Error::other)?;
                tracing::info!(
                    records = count,
                    position,
                    "accounting archive installed from a snapshot"
                );
            }
        }
        self.state = state;
        Ok(())
    }

    fn check_snapshot(input: &mut dyn io::Read) -> io::Result<()> {
        let state = read_queue(input)?;
        let position = state.applied.index;
        drop(state);
        if read_archive_flag(input)? {
            for record in archive_records(input, position)? {
                record.map_err(|e| invalid(format!("archive section: {e}")))?;
            }
        }
        Ok(())
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// The machine's part of a snapshot: the queue `state` (its magic, format and length, then
/// the state in its own format), then whether the archive's records follow.
fn write_queue(state: &State, archived: bool, out: &mut dyn io::Write) -> io::Result<()> {
    let bytes = state.to_snapshot().map_err(io::Error::other)?;
    out.write_all(MAGIC)?;
    out.write_all(&FORMAT.to_be_bytes())?;
    out.write_all(&(bytes.len() as u64).to_be_bytes())?;
    out.write_all(&bytes)?;
    out.write_all(&[u8::from(archived)])
}

/// The queue a snapshot holds: its magic, format and length, then the state.
fn read_queue(input: &mut dyn io::Read) -> io::Result<State> {
    let mut magic = [0u8; 4];
    input.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(invalid(format!(
            "not a Docket controller snapshot (magic {magic:?}, expected {MAGIC:?})"
        )));
    }
    let mut header = [0u8; 10];
    input.read_exact(&mut header)?;
    let format = u16::from_be_bytes([header[0], header[1]]);
    if format != FORMAT {
        return Err(invalid(format!(
            "controller snapshot format {format}; this build reads format {FORMAT}"
        )));
    }
    let len = u64::from_be_bytes(header[2..].try_into().unwrap_or_default());
    let mut bytes = Vec::new();
    input.take(len).read_to_end(&mut bytes)?;
    if bytes.len() as u64 != len {
        return Err(invalid("controller snapshot cut short in the queue".into()));
    }
    State::from_snapshot(&bytes).map_err(|e| invalid(e.to_string()))
}

/// Whether an archive section follows the queue.
fn read_archive_flag(input: &mut dyn io::Read) -> io::Result<bool> {
    let mut flag = [0u8; 1];
    input.read_exact(&mut flag)?;
    match flag[0] {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(invalid(format!("archive flag {other} is neither 0 nor 1"))),
    }
}

/// The archive section's records, which must run through the queue's `position`.
fn archive_records(
    input: &mut dyn io::Read,
    position: u64,
) -> io::Result<crate::archive::stream::Reader<'_>> {
    let records = crate::archive::stream::Reader::new(input)?;
    if records.position != position {
        return Err(invalid(format!(
            "archive section through position {} in a snapshot of position {position}",
            records.position
        )));
    }
    Ok(records)
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

    fn sink(dir: &std::path::Path, name: &str) -> ArchiveSink {
        ArchiveSink {
            archive: Arc::new(Archive::open(dir.join(name)).unwrap()),
            export_dir: dir.join(format!("{name}-export")),
        }
    }

    /// The whole snapshot, tail included, as the machine store writes it.
    fn snapshot_of(m: &CoreMachine) -> Vec<u8> {
        let mut bytes = Vec::new();
        m.write_snapshot(&mut bytes).unwrap();
        if let Some(tail) = m.snapshot_tail().unwrap() {
            tail(&mut bytes).unwrap();
        }
        bytes
    }

    /// What the machine store writes after the lock is released is the snapshot as it was
    /// when the machine froze it, archive included, whatever is applied meanwhile.
    #[test]
    fn a_frozen_snapshot_is_the_snapshot_at_the_freeze() {
        use crate::archive::tests::{finished, held_job, ids};
        use docket_core::job::{JobRef, JobState};
        let dir = tempfile::tempdir().unwrap();
        let (state, job, _) = held_job();
        let mut m = CoreMachine::with_archive(state, sink(dir.path(), "a"));
        let archive = m.archive.clone().unwrap().archive;
        archive.put(1, &finished([1, 2])).unwrap();
        let whole = snapshot_of(&m);
        let frozen = m
            .freeze_snapshot()
            .unwrap()
            .expect("the controller's machine freezes its snapshots");

        // After the freeze: the held job is cancelled, and the archive takes a record more.
        let cancel = Command::CancelJobs {
            jobs: vec![JobRef { job, task: None }],
        };
        m.apply(ctx(1_000, 0), Envelope::controller(cancel))
            .unwrap();
        assert_eq!(m.state.jobs[&job].state, JobState::Cancelled);
        archive
            .put(core_position(1_000, 1), &finished([3]))
            .unwrap();
        assert_eq!(ids(&archive), [1, 2, 3]);
        assert_ne!(snapshot_of(&m), whole, "the state changed");

        let mut bytes = Vec::new();
        frozen(&mut bytes).unwrap();
        assert_eq!(
            bytes, whole,
            "the frozen snapshot is the state at the freeze"
        );
        let mut restored = CoreMachine::new(State::new(SchedConfig::default()));
        restored.restore(&mut bytes.as_slice()).unwrap();
        assert_eq!(restored.state.jobs[&job].state, JobState::Pending);
    }

    #[test]
    fn a_snapshot_carries_the_archive_to_a_replica_that_never_saw_the_purges() {
        use crate::archive::tests::{finished, ids};
        let dir = tempfile::tempdir().unwrap();
        let mut m =
            CoreMachine::with_archive(State::new(SchedConfig::default()), sink(dir.path(), "a"));
        m.apply(ctx(1, 0), Envelope::controller(Command::Tick))
            .unwrap();
        let a = m.archive.clone().unwrap().archive;
        a.put(1, &finished([1, 2, 3])).unwrap();
        let bytes = snapshot_of(&m);
        assert_eq!(
            a.applied(),
            Some(core_position(1, 0)),
            "durable through the snapshot"
        );

        // A new replica: its archive is installed with the queue.
        let mut other =
            CoreMachine::with_archive(State::new(SchedConfig::default()), sink(dir.path(), "b"));
        let b = other.archive.clone().unwrap().archive;
        b.put(1, &finished([9])).unwrap();
        other.restore(&mut bytes.as_slice()).unwrap();
        assert_eq!(ids(&b), [1, 2, 3], "replaced, not merged");
        assert_eq!(
            other.state.to_snapshot().unwrap(),
            m.state.to_snapshot().unwrap()
        );

        // Restoring its own snapshot at start does not import what it already holds (a
        // record archived after the snapshot, which the log would replay, stays).
        a.put(1, &finished([4])).unwrap();
        m.restore(&mut bytes.as_slice()).unwrap();
        assert_eq!(ids(&a), [1, 2, 3, 4]);

        // A machine without an archive reads the queue and ignores the records.
        let mut bare = CoreMachine::new(State::new(SchedConfig::default()));
        bare.restore(&mut bytes.as_slice()).unwrap();
        // A snapshot cut inside its archive section is refused and changes nothing.
        let mut fresh =
            CoreMachine::with_archive(State::new(SchedConfig::default()), sink(dir.path(), "c"));
        let before = fresh.state.to_snapshot().unwrap();
        assert!(fresh.restore(&mut &bytes[..bytes.len() - 3]).is_err());
        assert_eq!(fresh.state.to_snapshot().unwrap(), before);
        assert!(ids(&fresh.archive.clone().unwrap().archive).is_empty());
    }

    #[test]
    fn a_snapshot_is_checked_as_restore_would_read_it() {
        use crate::archive::tests::finished;
        let dir = tempfile::tempdir().unwrap();
        let mut m =
            CoreMachine::with_archive(State::new(SchedConfig::default()), sink(dir.path(), "a"));
        m.apply(ctx(1, 0), Envelope::controller(Command::Tick))
            .unwrap();
        m.archive
            .clone()
            .unwrap()
            .archive
            .put(1, &finished([1, 2, 3]))
            .unwrap();
        let bytes = snapshot_of(&m);
        CoreMachine::check_snapshot(&mut bytes.as_slice()).unwrap();
        // Garbage, a snapshot cut in its queue or in its archive section, a bad flag: each
        // refused with what is wrong, as restore would refuse it.
        let refused = |bytes: &[u8]| CoreMachine::check_snapshot(&mut &bytes[..]).unwrap_err();
        assert!(refused(b"nonsense").to_string().contains("magic"));
        let queue_end = 14 + u64::from_be_bytes(bytes[6..14].try_into().unwrap()) as usize;
        assert!(
            refused(&bytes[..queue_end - 1])
                .to_string()
                .contains("cut short")
        );
        refused(&bytes[..bytes.len() - 3]);
        let mut flag = bytes[..=queue_end].to_vec();
        flag[queue_end] = 7;
        assert!(refused(&flag).to_string().contains("archive flag 7"));
        // A record that does not decode, inside an archive section of the right length.
        let mut corrupt = bytes.clone();
        let last = corrupt.len() - 20;
        corrupt[last..].fill(0xff);
        let mut restored =
            CoreMachine::with_archive(State::new(SchedConfig::default()), sink(dir.path(), "b"));
        let restore_error = restored.restore(&mut corrupt.as_slice()).is_err();
        assert_eq!(
            CoreMachine::check_snapshot(&mut corrupt.as_slice()).is_err(),
            restore_error,
            "check and restore disagree on a corrupt archive record"
        );
    }

    #[test]
    fn a_tick_under_retention_exports_then_drops_old_records_on_every_replica_alike() {
        use crate::archive::tests::{finished, ids};
        use docket_core::quantity::Seconds;
        let dir = tempfile::tempdir().unwrap();
        let mut replicas: Vec<CoreMachine> = ["a", "b"]
            .iter()
            .map(|n| {
                CoreMachine::with_archive(State::new(SchedConfig::default()), sink(dir.path(), n))
            })
            .collect();
        for m in &mut replicas {
            m.state.config.retention.purge_job_after = Some(Seconds::hours(1));
            m.state.config.retention.archive_jobs = true;
            // Jobs that ended at 1,000 s and 2,000 s after the epoch, and one just now.
            let now_s = 1_700_000_000;
            let mut jobs = finished([1000, 2000]);
            jobs.extend(finished([now_s]));
            m.archive.as_ref().unwrap().archive.put(1, &jobs).unwrap();
            m.apply(ctx(7, 0), Envelope::controller(Command::Tick))
                .unwrap();
            assert_eq!(ids(&m.archive.as_ref().unwrap().archive), [now_s]);
        }
        let export = |name: &str| {
            std::fs::read_to_string(
                dir.path()
                    .join(format!("{name}-export"))
                    .join(format!("jobs-{:020}.csv", core_position(7, 0))),
            )
            .unwrap()
        };
        let a = export("a");
        assert_eq!(
            a.lines().count(),
            3,
            "a header and the two expired jobs: {a}"
        );
        assert_eq!(a, export("b"), "every replica exports the same file");
    }

    /// After a restart the queue is back at the last snapshot while the archive is ahead of
    /// it; replaying the log must not redo archive work, or a replayed retention tick would
    /// rewrite its export with only the records archived since the snapshot.
    #[test]
    fn a_replayed_tick_leaves_the_archive_and_its_export_alone() {
        use crate::archive::tests::{cancelled_job, finished, ids};
        use docket_core::quantity::Seconds;
        let hour_ms = 3_600_000;
        let at = |index: u64, hours: u64| ApplyContext {
            index,
            position: 0,
            term: 1,
            time_ms: 1_700_000_000_000 + hours * hour_ms,
        };
        let retain = |m: &mut CoreMachine| {
            m.state.config.min_job_age = Seconds(0);
            m.state.config.retention.purge_job_after = Some(Seconds::hours(1));
            m.state.config.retention.archive_jobs = true;
        };
        let dir = tempfile::tempdir().unwrap();
        let export = dir
            .path()
            .join("a-export")
            .join(format!("jobs-{:020}.csv", core_position(5, 0)));
        // The log: a snapshot with a job archived before it; a tick purges the queue's
        // cancelled job into the archive; two hours later a tick expires both.
        let (state, cancelled) = cancelled_job();
        let snapshot = {
            let mut m = CoreMachine::with_archive(state.clone(), sink(dir.path(), "a"));
            let a = m.archive.clone().unwrap().archive;
            let mut recent = finished([1000]);
            recent[0].job.end_time = Some(TimeMs(1_700_000_000_000));
            a.put(1, &recent).unwrap();
            let snapshot = snapshot_of(&m);
            retain(&mut m);
            m.apply(at(4, 0), Envelope::controller(Command::Tick))
                .unwrap();
            assert_eq!(ids(&a), [cancelled.0, 1000], "purged into the archive");
            m.apply(at(5, 2), Envelope::controller(Command::Tick))
                .unwrap();
            assert!(ids(&a).is_empty(), "both expired");
            snapshot
        };
        let exported = std::fs::read_to_string(&export).unwrap();
        assert_eq!(exported.lines().count(), 3, "{exported}");

        // The restart: the same data directory, the queue restored from the snapshot, the
        // log replayed after it.
        let mut m = CoreMachine::with_archive(state, sink(dir.path(), "a"));
        m.restore(&mut snapshot.as_slice()).unwrap();
        let a = m.archive.clone().unwrap().archive;
        retain(&mut m);
        m.apply(at(4, 0), Envelope::controller(Command::Tick))
            .unwrap();
        m.apply(at(5, 2), Envelope::controller(Command::Tick))
            .unwrap();
        assert!(
            ids(&a).is_empty(),
            "the replayed purge archived nothing again"
        );
        assert_eq!(std::fs::read_to_string(&export).unwrap(), exported);
        // A tick the archive has not seen does its work.
        a.put(core_position(5, 0), &finished([3000])).unwrap();
        m.apply(at(6, 3), Envelope::controller(Command::Tick))
            .unwrap();
        assert!(ids(&a).is_empty());
    }
}
