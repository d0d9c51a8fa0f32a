//! Group commit and forwarding: how writes become log entries.
//!
//! Every write, local or forwarded from a follower, goes through one [`Proposer`] task per
//! replica. It takes whatever writes are waiting, up to [`ProposerConfig::max_batch_commands`]
//! commands and [`ProposerConfig::max_batch_bytes`] bytes, and proposes them as one entry (one
//! append, one fsync on each replica); up to [`ProposerConfig::max_in_flight`] entries are in
//! flight at once, and writes arriving meanwhile wait and form the next batch. Under load the
//! batch grows by itself; with one writer it is one command, and adds no delay unless that
//! writer writes back to back (below).
//!
//! An entry counts as in flight only while this replica leads the term it was proposed in. A
//! leader deposed with entries in its log (stopped, cut off) waits for them until the new
//! leader truncates or commits them, which may take seconds; were those entries to keep
//! their places, every write reaching this replica meanwhile would wait behind them instead
//! of being passed to the new leader at once.
//!
//! Writes from many separate clients can arrive one at a time, each a little after the last
//! entry was proposed (eight loops of `sbatch`, each a new process, reach the leader about
//! every 2 ms, more than an entry takes to commit), so each would be an entry of its own. A
//! write that finds the proposer busy (the last entry proposed less than
//! [`ProposerConfig::busy_within`] before) and nobody else waiting is held for
//! [`ProposerConfig::busy_hold`] so that the next ones join it, an idea similar to
//! PostgreSQL's `commit_delay`, which waits only while `commit_siblings` other transactions
//! are active. A write is held at most once: not again when it did not fit the entry it was
//! held for, nor on the leader after a follower held it. A writer alone whose writes come
//! further apart is never held; one writing back to back (the scheduler's proposals after a
//! pass) waits the hold before each write.
//!
//! On a follower the batch is forwarded to the leader's proposer over the Raft service, where
//! it joins the leader's own writes. A write is answered only after its entry is committed and
//! applied; the answer is the machine's response to each command.
//!
//! What a failed write means is in [`WriteError`]: some failures prove the write was not
//! applied (safe to retry), others leave the outcome unknown (retrying may apply it twice;
//! the application's own idempotency has to decide).

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::ServerState;
use openraft::error::{ClientWriteError, RaftError};
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::codec::encode;
use crate::ids::{ReplicaAddr, ReplicaId};
use crate::leader_contact::LeaderContact;
use crate::machine::StateMachine;
use crate::network::Channels;
use crate::types::{Batch, Raft};

/// Why a write was not answered with the machine's responses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum WriteError {
    /// No leader is known (an election is in progress), or the replica asked is no longer the
    /// leader. The write was not applied; retry after a short pause.
    #[error("no leader is known (an election is in progress); the write was not applied, retry")]
    NoLeader,
    /// The write may or may not have been applied (the leader was lost or the connection
    /// broke after the write was sent).
    #[error("the outcome of the write is unknown ({0}); it may or may not have been applied")]
    Indeterminate(String),
    /// The write is larger than one log entry may be.
    #[error("the write is {size} bytes, over the {limit}-byte limit of one log entry")]
    TooLarge { size: usize, limit: usize },
    /// This replica has stopped (shut down, or its storage failed).
    #[error("this replica has stopped: {0}")]
    Stopped(String),
}

impl WriteError {
    /// True when the write certainly was not applied, so sending it again cannot apply it twice.
    pub fn certainly_not_applied(&self) -> bool {
        matches!(self, WriteError::NoLeader | WriteError::TooLarge { .. })
    }

    /// True when trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, WriteError::NoLeader | WriteError::Indeterminate(_))
    }
}

/// Group-commit limits.
#[derive(Debug, Clone)]
pub struct ProposerConfig {
    /// Most commands in one log entry.
    pub max_batch_commands: usize,
    /// Most encoded bytes of commands in one log entry (keep below the RPC message limit).
    pub max_batch_bytes: usize,
    /// Most entries proposed and not yet applied at once. Two: each entry costs every
    /// replica a log append, an fsync, a replication message and an apply wake-up whatever
    /// its size, and with eight in flight a storm of 64 writers made entries of about eight
    /// commands; with two they carry about thirty, and the controller benchmark went from
    /// 5,500-5,900 to 7,200-7,900 submissions/s with lower latency (one in flight was no
    /// better under load and slower for a lone writer).
    pub max_in_flight: usize,
    /// How long a write waits for others to join its entry when the proposer is busy
    /// ([`ProposerConfig::busy_within`]) and nobody else is waiting; zero never waits. One
    /// millisecond, which the runtime's timer (1 ms ticks, rounding up) makes 1-2 ms: enough
    /// for eight `sbatch` loops' writes to share entries (a third fewer; what that gave is
    /// measured in docs/replication.md, "Group commit: the proposer").
    pub busy_hold: Duration,
    /// The proposer counts as busy while the last entry was proposed less than this long ago.
    /// Three milliseconds: over an entry's commit on a loaded machine, under the gap between
    /// the writes of a process-per-command loop of one user (7 ms and more).
    pub busy_within: Duration,
}

impl Default for ProposerConfig {
    fn default() -> Self {
        ProposerConfig {
            max_batch_commands: 1024,
            max_batch_bytes: 4 << 20,
            max_in_flight: 2,
            busy_hold: Duration::from_millis(1),
            busy_within: Duration::from_millis(3),
        }
    }
}

/// What the proposer knows of the write at the head of the next entry when it decides whether
/// to hold it.
#[derive(Debug, Clone, Copy)]
struct Head {
    /// Since the last entry was proposed (None: no entry yet).
    since_last: Option<Duration>,
    /// Other writes are already waiting: they join this entry without a hold.
    others_waiting: bool,
    /// The write has waited once already: it did not fit the last entry (carried over), or
    /// a follower held it before forwarding it here.
    waited: bool,
}

impl ProposerConfig {
    /// How long the write at the head of the next entry is held for others to join it.
    fn hold(&self, head: Head) -> Option<Duration> {
        let busy = head.since_last.is_some_and(|d| d < self.busy_within);
        let alone = !head.others_waiting && !head.waited;
        (busy && alone && !self.busy_hold.is_zero()).then_some(self.busy_hold)
    }
}

type Reply<M> = oneshot::Sender<Result<Vec<<M as StateMachine>::Response>, WriteError>>;

/// One caller's commands, waiting to be proposed.
struct Pending<M: StateMachine> {
    commands: Vec<M::Command>,
    bytes: usize,
    /// Forwarded by a follower: never forwarded again (a leader that lost its leadership
    /// answers `NoLeader` and the follower decides), so a write cannot loop between replicas.
    forwarded: bool,
    reply: Reply<M>,
}

/// The handle writes go through. Cheap to clone.
pub struct Proposer<M: StateMachine> {
    tx: mpsc::UnboundedSender<Pending<M>>,
    max_batch_bytes: usize,
}

impl<M: StateMachine> Clone for Proposer<M> {
    fn clone(&self) -> Self {
        Proposer {
            tx: self.tx.clone(),
            max_batch_bytes: self.max_batch_bytes,
        }
    }
}

impl<M: StateMachine> std::fmt::Debug for Proposer<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proposer").finish_non_exhaustive()
    }
}

impl<M: StateMachine> Proposer<M> {
    /// Starts the proposer task of a replica. It ends when every handle is dropped.
    /// `contact` tells it when the leader is lost ([`crate::leader_contact`]).
    pub fn start(
        raft: Raft<M>,
        channels: Channels,
        config: ProposerConfig,
        contact: LeaderContact,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let max_batch_bytes = config.max_batch_bytes;
        tokio::spawn(run(raft, channels, config, contact, rx));
        Proposer {
            tx,
            max_batch_bytes,
        }
    }

    /// Proposes `commands` (in one entry, possibly with others' commands) and returns the
    /// machine's response to each once applied.
    pub async fn write(&self, commands: Vec<M::Command>) -> Result<Vec<M::Response>, WriteError> {
        self.submit(commands, false).await
    }

    /// Like [`Proposer::write`] for a batch a follower forwarded.
    pub(crate) async fn write_forwarded(
        &self,
        commands: Vec<M::Command>,
    ) -> Result<Vec<M::Response>, WriteError> {
        self.submit(commands, true).await
    }

    async fn submit(
        &self,
        commands: Vec<M::Command>,
        forwarded: bool,
    ) -> Result<Vec<M::Response>, WriteError> {
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        let bytes = encode(&commands)
            .map_err(|e| WriteError::Stopped(format!("cannot encode the commands: {e}")))?
            .len();
        if bytes > self.max_batch_bytes {
            return Err(WriteError::TooLarge {
                size: bytes,
                limit: self.max_batch_bytes,
            });
        }
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Pending {
                commands,
                bytes,
                forwarded,
                reply,
            })
            .map_err(|_| WriteError::Stopped("the proposer has stopped".into()))?;
        answer.await.map_err(|_| {
            WriteError::Indeterminate("the proposer stopped before answering".into())
        })?
    }
}

async fn run<M: StateMachine>(
    raft: Raft<M>,
    channels: Channels,
    config: ProposerConfig,
    contact: LeaderContact,
    mut rx: mpsc::UnboundedReceiver<Pending<M>>,
) {
    let in_flight = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let mut carry: Option<Pending<M>> = None;
    let mut last_proposed: Option<Instant> = None;
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let (first, carried) = match carry.take() {
            Some(p) => (p, true),
            None => match rx.recv().await {
                Some(p) => (p, false),
                None => return,
            },
        };
        let head = Head {
            since_last: last_proposed.map(|t| t.elapsed()),
            others_waiting: !rx.is_empty(),
            waited: carried || first.forwarded,
        };
        if let Some(hold) = config.hold(head) {
            tokio::time::sleep(hold).await;
        }
        last_proposed = Some(Instant::now());
        let mut commands = first.commands.len();
        let mut bytes = first.bytes;
        let mut group = vec![first];
        while commands < config.max_batch_commands {
            match rx.try_recv() {
                Ok(next) => {
                    if bytes + next.bytes > config.max_batch_bytes {
                        carry = Some(next);
                        break;
                    }
                    commands += next.commands.len();
                    bytes += next.bytes;
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        let channels = channels.clone();
        let contact = contact.clone();
        tokio::spawn(async move {
            propose(&raft, &channels, &contact, group, permit).await;
        });
    }
}

/// Proposes one group as one entry and answers each member. `permit` is its place among the
/// entries in flight, given up when the write ends or this replica stops leading the term
/// it was proposed in, whichever comes first. While the leader is lost
/// ([`crate::leader_contact`]) the group is refused with `NoLeader` instead.
async fn propose<M: StateMachine>(
    raft: &Raft<M>,
    channels: &Channels,
    contact: &LeaderContact,
    group: Vec<Pending<M>>,
    permit: OwnedSemaphorePermit,
) {
    let mut permit = Some(permit);
    let sizes: Vec<usize> = group.iter().map(|p| p.commands.len()).collect();
    let mut replies = Vec::with_capacity(group.len());
    let mut forwarded = Vec::with_capacity(group.len());
    let mut commands = Vec::with_capacity(sizes.iter().sum());
    for p in group {
        commands.extend(p.commands);
        replies.push(p.reply);
        forwarded.push(p.forwarded);
    }
    if contact.lost_now(&raft.metrics().borrow()) {
        return answer_all(replies, WriteError::NoLeader);
    }
    let batch = Batch {
        time_ms: crate::cluster_clock::now_ms(),
        commands,
    };
    let outcome = match write_while_leading(raft, contact, batch.clone(), &mut permit).await {
        Ok(response) => Ok(response.data),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(to_leader))) => {
            // Not proposed here, or truncated away: either way not applied.
            Err(to_leader.leader_id.zip(to_leader.leader_node))
        }
        Err(RaftError::APIError(e)) => {
            return answer_all(replies, WriteError::Indeterminate(e.to_string()));
        }
        Err(RaftError::Fatal(fatal)) => {
            return answer_all(replies, WriteError::Stopped(fatal.to_string()));
        }
    };
    match outcome {
        Ok(responses) => split(replies, &sizes, responses),
        Err(leader) => {
            // Forwarded writes go back to their follower; local ones go to the leader.
            let mut local = Vec::new();
            let mut offset = 0;
            let mut commands = batch.commands.into_iter();
            for ((reply, size), was_forwarded) in replies.into_iter().zip(&sizes).zip(forwarded) {
                let mine: Vec<_> = commands.by_ref().take(*size).collect();
                offset += size;
                match (&leader, was_forwarded) {
                    (Some(_), false) => local.push((reply, mine)),
                    _ => {
                        let _ = reply.send(Err(WriteError::NoLeader));
                    }
                }
            }
            debug_assert_eq!(offset, sizes.iter().sum::<usize>());
            if let (Some(leader), false) = (leader, local.is_empty()) {
                forward(raft, channels, leader, local).await;
            }
        }
    }
}

/// `client_write`, giving up `permit` as soon as this replica no longer leads the term it
/// proposed in (the write itself is still awaited: its outcome is what the caller answers).
/// Proposed on a follower, the write comes straight back to be forwarded, and the permit
/// stays, bounding the forwards in flight as it bounds the leader's entries.
async fn write_while_leading<M: StateMachine>(
    raft: &Raft<M>,
    contact: &LeaderContact,
    batch: Batch<M::Command>,
    permit: &mut Option<OwnedSemaphorePermit>,
) -> Result<
    openraft::raft::ClientWriteResponse<crate::types::TypeConfig<M>>,
    crate::types::RaftError<ClientWriteError<crate::ids::ReplicaId, ReplicaAddr>>,
> {
    // The server metrics change with the role and the vote only; the whole metrics change
    // at every turn of openraft's core, several times per entry, and woke each write in
    // flight at each of them.
    let mut server = raft.server_metrics();
    let (leading, term) = {
        let m = server.borrow_and_update();
        (m.state == ServerState::Leader, m.vote.leader_id().term)
    };
    let write = raft.client_write(batch);
    tokio::pin!(write);
    // Losing the quorum's acknowledgements changes no server metric: looked at on a timer.
    let every = contact.recheck_every();
    let mut recheck = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let watching = leading && permit.is_some();
        tokio::select! {
            result = &mut write => return result,
            changed = server.changed(), if watching => {
                let deposed = changed.is_err() || {
                    let m = server.borrow_and_update();
                    m.state != ServerState::Leader || m.vote.leader_id().term != term
                };
                if deposed {
                    *permit = None;
                }
            }
            _ = recheck.tick(), if watching => {
                if contact.lost_now(&raft.metrics().borrow()) {
                    *permit = None;
                }
            }
        }
    }
}

/// Sends local writes to the leader at `leader` in one forwarded batch, given up (outcome
/// unknown) once the term or the leader this replica knows changes after the batch is sent
/// (changes before are no reason: openraft named `leader` then).
async fn forward<M: StateMachine>(
    raft: &Raft<M>,
    channels: &Channels,
    (leader, at): (ReplicaId, ReplicaAddr),
    local: Vec<(Reply<M>, Vec<M::Command>)>,
) {
    let sizes: Vec<usize> = local.iter().map(|(_, c)| c.len()).collect();
    let mut replies = Vec::with_capacity(local.len());
    let mut commands = Vec::new();
    for (reply, mine) in local {
        replies.push(reply);
        commands.extend(mine);
    }
    let known = {
        let m = raft.server_metrics();
        let m = m.borrow();
        (m.vote.leader_id().term, m.current_leader)
    };
    let answer = tokio::select! {
        answer = channels.forward::<M>(leader, &at.addr, commands) => answer,
        why = crate::leader_contact::forward_abandoned(raft, known.1, known.0) => {
            Err(WriteError::Indeterminate(format!(
                "forwarded to the leader at {at}, given up because {why}"
            )))
        }
    };
    match answer {
        Ok(responses) => split(replies, &sizes, responses),
        Err(e) => answer_all(replies, e),
    }
}

fn split<R>(
    replies: Vec<oneshot::Sender<Result<Vec<R>, WriteError>>>,
    sizes: &[usize],
    responses: Vec<R>,
) {
    if responses.len() != sizes.iter().sum::<usize>() {
        let e = WriteError::Indeterminate(format!(
            "the machine answered {} responses for {} commands",
            responses.len(),
            sizes.iter().sum::<usize>()
        ));
        return answer_all(replies, e);
    }
    let mut responses = responses.into_iter();
    for (reply, size) in replies.into_iter().zip(sizes) {
        let _ = reply.send(Ok(responses.by_ref().take(*size).collect()));
    }
}

fn answer_all<R>(replies: Vec<oneshot::Sender<Result<Vec<R>, WriteError>>>, error: WriteError) {
    for reply in replies {
        let _ = reply.send(Err(error.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_held_only_while_the_proposer_is_busy_and_it_is_alone_and_has_not_waited() {
        let config = ProposerConfig::default();
        let ms = Duration::from_millis;
        let head = |since_last: Option<u64>, others_waiting, waited| Head {
            since_last: since_last.map(ms),
            others_waiting,
            waited,
        };
        // Busy (the last entry 2 ms ago), alone, not yet waited: held for busy_hold.
        assert_eq!(config.hold(head(Some(2), false, false)), Some(ms(1)));
        assert_eq!(config.hold(head(Some(0), false, false)), Some(ms(1)));
        // Others already waiting: they join this entry at once.
        assert_eq!(config.hold(head(Some(2), true, false)), None);
        // Carried over from the last entry, or held by a follower before it was forwarded.
        assert_eq!(config.hold(head(Some(2), false, true)), None);
        // A writer alone, its writes further apart than busy_within, or the very first write.
        assert_eq!(config.hold(head(Some(3), false, false)), None);
        assert_eq!(config.hold(head(Some(7), false, false)), None);
        assert_eq!(config.hold(head(None, false, false)), None);
        // A zero hold never waits; a longer one is what is configured.
        let never = ProposerConfig {
            busy_hold: Duration::ZERO,
            ..ProposerConfig::default()
        };
        assert_eq!(never.hold(head(Some(2), false, false)), None);
        let longer = ProposerConfig {
            busy_hold: ms(5),
            busy_within: ms(10),
            ..ProposerConfig::default()
        };
        assert_eq!(longer.hold(head(Some(7), false, false)), Some(ms(5)));
    }
}
