//! The leader's read index, confirmed from what the replicas have on disk instead of through
//! openraft's core.
//!
//! Why not openraft's `get_read_log_id`: in openraft 0.9 it is a message to the leader's core,
//! which takes its next message only once the log's last append is flushed
//! (`RaftCore::append_to_log` awaits the fsync; openraft#1169 lifts this in the 0.10 line), and
//! it confirms leadership with a round of empty appends that each follower's core handles
//! between its own flushes. Under a write storm one read then waits on several fsyncs: 35–155 ms
//! at the tail against a 1 ms median, measured on a 64-client storm.
//!
//! What Raft's read index needs (Ongaro's thesis, §6.4) is a log index at or above every write
//! acknowledged before the read began, and proof that no other leader could have acknowledged
//! a write by then. The leader gathers both without its core:
//!
//! 1. **Its vote, as saved**, is committed (a quorum elected it) and names itself. openraft
//!    saves a vote before acting on it, so a replica that granted a newer vote, or followed a
//!    newer leader, has that vote on disk first ([`crate::log_store::persisted_vote`]).
//! 2. **The last entry it applied** was proposed in that same leadership. A new leader's
//!    first entry follows every entry its predecessors committed, so all of those are applied
//!    by then, and the leader acknowledges its own writes only once applied
//!    ([`crate::proposer`]). That entry's index is the read index. One exception: a leader
//!    restarted from disk comes back in the leadership it had, with no new first entry, and
//!    replays only up to the commit index it saved, which is written without a sync and may
//!    be behind what it acknowledged. So while it holds the leadership it reopened with, the
//!    read index is at least the log's last index at reopening ([`Reopened`]), here and on
//!    openraft's path, which has the same gap.
//! 3. **A quorum of voters still holds that vote**, each checked after the read began: the
//!    leader itself, the follower that asks (it reads its own saved vote when the read begins
//!    and sends it along), and, only if those are not a quorum, the other voters asked with
//!    `ConfirmLeader`. Votes never go back, and any later leader needed votes from a quorum,
//!    which meets this one: none was elected before the read began.
//!
//! The quorum is counted in the membership openraft publishes, and only when no membership
//! entry this replica appended is newer ([`crate::log_store::MembershipEntries`]); a joint
//! membership needs a quorum of each half. A voter answers only a request that names it
//! (`to`), so a replica reached at another voter's address does not answer for that voter.
//! (The transport proves that a replica answers, not which one: a process holding one
//! replica's certificate at another's address could still answer as it, as it could answer
//! openraft's appends.) With three replicas a read on a
//! follower needs no RPC beyond its request to the leader, and a read on the leader the first
//! of the other two voters' confirmations. Whatever
//! falls short (a new leader that has not applied its first entry, a membership change in
//! flight, voters that do not answer within a heartbeat) falls back to openraft's check,
//! which is slower, and is right once floored for a restarted leader as in step 2.
//!
//! Not done: reads that arrive together each run their own confirmation round, where one
//! round begun after all of them could serve them all (Ongaro §6.4). A read on a follower
//! needs no round with three replicas; one on the leader asks the other voters.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::LeaderId;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::db::DataDir;
use crate::ids::ReplicaId;
use crate::log_store::{MembershipEntries, persisted_vote};
use crate::machine::StateMachine;
use crate::machine_store::MachineStore;
use crate::network::Channels;
use crate::read::ReadError;
use crate::types::Raft;

/// A leadership: a term and the replica elected in it.
pub type Leadership = LeaderId<ReplicaId>;

/// What this replica's disk held when it opened: the leadership its vote named and the index
/// of the last log entry (step 2 of the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reopened {
    pub leadership: Option<Leadership>,
    pub last_index: Option<u64>,
}

impl Reopened {
    /// The least read index a leader in `leadership` may name.
    fn floor(&self, leadership: &Leadership) -> Option<u64> {
        if self.leadership.as_ref() == Some(leadership) {
            self.last_index
        } else {
            None
        }
    }
}

/// A leader's question to a voter: does your saved vote hold `leadership`? `to` is the voter
/// meant, which answers no if it is not that voter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmLeaderRequest {
    pub to: ReplicaId,
    pub leadership: Leadership,
}

/// A replica's request for the read index: who asks, and the leadership its saved vote names
/// as the read begins (its vouch for the leader).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadIndexRequest {
    pub from: ReplicaId,
    pub holds: Option<Leadership>,
}

/// Names the read index on the leader ([`ReadIndexer::read_index`]) and answers for this
/// replica's vote ([`ReadIndexer::holds`]). Clones share everything.
pub struct ReadIndexer<M: StateMachine> {
    id: ReplicaId,
    raft: Raft<M>,
    db: Arc<DataDir>,
    machine: MachineStore<M>,
    channels: Channels,
    memberships: MembershipEntries,
    reopened: Reopened,
    /// How long the other voters get to confirm: openraft's deadline for a heartbeat.
    confirm_ttl: Duration,
    counts: Arc<ReadIndexCounts>,
}

/// How the read indexes this replica named as leader were confirmed.
#[derive(Debug, Default)]
pub struct ReadIndexCounts {
    /// From the saved votes of a quorum (the module doc).
    pub by_votes: AtomicU64,
    /// By openraft's check, after the votes fell short.
    pub by_openraft: AtomicU64,
}

impl ReadIndexCounts {
    /// (by votes, by openraft), as they stand.
    pub fn get(&self) -> (u64, u64) {
        (
            self.by_votes.load(Ordering::Relaxed),
            self.by_openraft.load(Ordering::Relaxed),
        )
    }
}

impl<M: StateMachine> Clone for ReadIndexer<M> {
    fn clone(&self) -> Self {
        ReadIndexer {
            id: self.id,
            raft: self.raft.clone(),
            db: self.db.clone(),
            machine: self.machine.clone(),
            channels: self.channels.clone(),
            memberships: self.memberships.clone(),
            reopened: self.reopened,
            confirm_ttl: self.confirm_ttl,
            counts: self.counts.clone(),
        }
    }
}

impl<M: StateMachine> std::fmt::Debug for ReadIndexer<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadIndexer")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// What a read index rests on, as the leader found it before asking anyone.
struct Basis {
    leadership: Leadership,
    index: u64,
}

impl<M: StateMachine> ReadIndexer<M> {
    /// The indexer of replica `id`: the membership entries its log store tracks, and what its
    /// disk held before Raft started ([`Reopened`]).
    pub fn new(
        id: ReplicaId,
        raft: Raft<M>,
        db: Arc<DataDir>,
        machine: MachineStore<M>,
        channels: Channels,
        (memberships, reopened): (MembershipEntries, Reopened),
        confirm_ttl: Duration,
    ) -> Self {
        ReadIndexer {
            id,
            raft,
            db,
            machine,
            channels,
            memberships,
            reopened,
            confirm_ttl,
            counts: Arc::default(),
        }
    }

    /// How the read indexes named here were confirmed so far.
    pub fn counts(&self) -> &ReadIndexCounts {
        &self.counts
    }

    /// The leadership this replica's saved vote names, if it can be read.
    pub fn holds(&self) -> Option<Leadership> {
        match persisted_vote(&self.db) {
            Ok(vote) => vote.map(|v| *v.leader_id()),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read this replica's saved vote");
                None
            }
        }
    }

    /// The answer to a leader's [`ConfirmLeaderRequest`].
    pub fn confirms(&self, request: &ConfirmLeaderRequest) -> bool {
        request.to == self.id && self.holds() == Some(request.leadership)
    }

    /// The request a replica sends its leader for the read index, vouching for it.
    pub fn request(&self) -> ReadIndexRequest {
        ReadIndexRequest {
            from: self.id,
            holds: self.holds(),
        }
    }

    /// The read index, on the leader: the log index every write acknowledged before this call
    /// is at or below, once a quorum confirmed this replica still leads. `vouch` is the asking
    /// replica's [`ReadIndexRequest`]; where the transport proves who calls, the caller has
    /// checked that it comes from the replica it names.
    pub async fn read_index(
        &self,
        vouch: Option<&ReadIndexRequest>,
    ) -> Result<Option<u64>, ReadError> {
        if let Some(index) = self.confirmed(vouch).await {
            self.counts.by_votes.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(index));
        }
        // openraft's check has the restarted leader's gap too (module doc, step 2). The floor
        // is taken before the check: a vote saved after it (a newer leadership) must not
        // lift the floor from a read index the check confirmed in the old one.
        let floor = persisted_vote(&self.db)
            .ok()
            .flatten()
            .and_then(|vote| self.reopened.floor(vote.leader_id()));
        let (read_log_id, _applied) = self
            .raft
            .get_read_log_id()
            .await
            .map_err(ReadError::from_leader_check)?;
        self.counts.by_openraft.fetch_add(1, Ordering::Relaxed);
        Ok(read_log_id.map(|id| id.index).max(floor))
    }

    /// Steps 1 and 2 of the module doc: this replica leads, by its saved vote, and has
    /// applied an entry of its own leadership.
    fn basis(&self) -> Option<Basis> {
        let applied = self.machine.last_applied()?;
        let vote = persisted_vote(&self.db).ok()??;
        let leadership = *vote.leader_id();
        let own = vote.is_committed()
            && leadership.voted_for() == Some(self.id)
            && applied.leader_id == leadership
            && Some(applied.index) >= self.reopened.floor(&leadership);
        own.then_some(Basis {
            leadership,
            index: applied.index,
        })
    }

    /// The read index if steps 1–3 hold, `None` if anything falls short.
    async fn confirmed(&self, vouch: Option<&ReadIndexRequest>) -> Option<u64> {
        // Read before the published membership: an entry appended after this is one the
        // published membership may lack, and it came after the read began.
        let newest_appended = self.memberships.last();
        let basis = self.basis()?;
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let published = membership.log_id().map(|id| id.index);
        if newest_appended > published {
            return None;
        }
        let membership = membership.membership();
        let joint = membership.get_joint_config();
        let mut granted = BTreeSet::from([self.id]);
        if let Some(v) = vouch
            && v.holds == Some(basis.leadership)
        {
            granted.insert(v.from);
        }
        if is_quorum(joint, &granted) {
            return Some(basis.index);
        }
        let mut asks = JoinSet::new();
        for voter in membership.voter_ids() {
            if granted.contains(&voter) {
                continue;
            }
            let Some(node) = membership.get_node(&voter) else {
                continue;
            };
            let (channels, addr, ttl) =
                (self.channels.clone(), node.addr.clone(), self.confirm_ttl);
            let request = ConfirmLeaderRequest {
                to: voter,
                leadership: basis.leadership,
            };
            asks.spawn(async move {
                let held = channels.confirm_leader(&addr, &request, ttl).await;
                (voter, held)
            });
        }
        while let Some(answer) = asks.join_next().await {
            if let Ok((voter, true)) = answer {
                granted.insert(voter);
                if is_quorum(joint, &granted) {
                    return Some(basis.index);
                }
            }
        }
        None
    }
}

/// Whether `granted` holds a majority of every configuration of `joint` (one configuration
/// outside a membership change, two during one).
pub fn is_quorum(joint: &[BTreeSet<ReplicaId>], granted: &BTreeSet<ReplicaId>) -> bool {
    !joint.is_empty()
        && joint.iter().all(|voters| {
            let held = voters.iter().filter(|v| granted.contains(v)).count();
            held * 2 > voters.len()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u64]) -> BTreeSet<ReplicaId> {
        ids.iter().map(|i| ReplicaId(*i)).collect()
    }

    #[test]
    fn a_quorum_is_a_majority_of_every_configuration() {
        let three = vec![set(&[1, 2, 3])];
        assert!(!is_quorum(&three, &set(&[1])));
        assert!(is_quorum(&three, &set(&[1, 2])));
        // Replicas outside the membership count for nothing.
        assert!(!is_quorum(&three, &set(&[1, 4, 5])));

        let four = vec![set(&[1, 2, 3, 4])];
        assert!(!is_quorum(&four, &set(&[1, 2])), "half is not a majority");
        assert!(is_quorum(&four, &set(&[1, 2, 3])));

        // Replacing 3 by 4: a majority of the old set and of the new one.
        let joint = vec![set(&[1, 2, 3]), set(&[1, 2, 4])];
        assert!(is_quorum(&joint, &set(&[1, 2])));
        assert!(
            !is_quorum(&joint, &set(&[1, 3])),
            "no majority of the new set"
        );
        assert!(is_quorum(&joint, &set(&[1, 3, 4])));

        assert!(
            !is_quorum(&[], &set(&[1, 2, 3])),
            "no membership, no quorum"
        );
    }
}
