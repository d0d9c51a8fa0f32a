//! Whether a write can be placed through this replica now, or its leader is lost.
//!
//! openraft 0.9 has no check-quorum. A leader cut off from the other voters goes on leading
//! in its own eyes, accepting writes it cannot commit, until it hears of a newer term. A
//! follower goes on forwarding to a leader that is stopped or cut off until an election
//! ends, and each forward waits out its whole deadline. Either way a write waits on a leader
//! that cannot commit it, and takes one of the proposer's places in flight meanwhile, so
//! every write behind it waits too. In the chaos runs this was the whole failover tail of
//! stopped and cut-off leaders: the first write after one took 2–3.5 s, and up to 10 s when
//! a forward to the stopped leader held the new leader's places.
//!
//! Both sides know better after openraft's lease (the election timeout's maximum): the
//! other voters start an election once it has run out without word from the leader.
//! - A leader that no quorum has acknowledged for longer than the lease is lost.
//! - A follower that has not heard from its leader for longer than the lease has lost it.
//!
//! From then on the proposer refuses new writes with `NoLeader`. They were never proposed,
//! so they are safe to retry anywhere, and clients retry at once. A write already proposed on
//! such a leader gives up its place in flight; its own outcome still waits, because it may
//! yet commit. A forward in flight is given up as soon as the term or the leader changes (an
//! election, which follows a real loss). Its outcome is unknown, because the old leader may
//! have appended it before it went.
//!
//! Only liveness changes: refusing a write that was never proposed is always safe. The price
//! is that a leader or follower whose heartbeats stall for longer than the lease (an
//! overloaded host) refuses writes until they resume, which is what an election would cost it
//! anyway.

use std::time::Duration;

use openraft::ServerState;

use crate::election_gate::CommitSeen;
use crate::ids::ReplicaId;
use crate::types::{Raft, RaftMetrics};

/// What the proposer reads to tell whether its leader is lost.
#[derive(Debug, Clone)]
pub struct LeaderContact {
    /// When this replica's leader last reached it.
    pub seen: CommitSeen,
    /// openraft's lease: how long without word from the leader before the voters elect
    /// another.
    pub lease: Duration,
}

/// One look at the replica, as [`lost`] needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// This replica leads.
    pub leading: bool,
    /// Leading: how long ago a quorum last acknowledged it (openraft's own figure).
    pub quorum_ack_ago: Option<Duration>,
    /// Following: another replica is known to lead.
    pub follows: bool,
    /// Following: how long ago the leader last reached this replica (never since it started:
    /// `None`).
    pub heard_ago: Option<Duration>,
}

/// Whether the leader a write would go through is lost: no quorum has acknowledged this
/// leader, or this follower has not heard from its leader, for longer than `lease`. A replica
/// that has not heard from any leader since it started is not judged: the write goes to
/// whoever openraft names (or fails with `NoLeader` if none).
pub fn lost(view: View, lease: Duration) -> bool {
    if view.leading {
        view.quorum_ack_ago.is_some_and(|ago| ago > lease)
    } else {
        view.follows && view.heard_ago.is_some_and(|ago| ago > lease)
    }
}

impl LeaderContact {
    /// How `metrics` and the last contact look now.
    pub fn view(&self, metrics: &RaftMetrics) -> View {
        let leading = metrics.state == ServerState::Leader;
        View {
            leading,
            quorum_ack_ago: metrics.millis_since_quorum_ack.map(Duration::from_millis),
            follows: !leading && metrics.current_leader.is_some_and(|l| l != metrics.id),
            heard_ago: self.seen.heard_at().map(|at| at.elapsed()),
        }
    }

    /// How often a wait that gives up on a lost leader looks again: nothing wakes it when
    /// acknowledgements or appends stop coming, so it looks eight times a lease (before, it
    /// looked at each turn of openraft's core, which a lost leader's ticks still make).
    pub fn recheck_every(&self) -> Duration {
        (self.lease / 8).max(Duration::from_millis(10))
    }

    /// Whether the leader is lost, as `metrics` and the last contact say now.
    pub fn lost_now(&self, metrics: &RaftMetrics) -> bool {
        lost(self.view(metrics), self.lease)
    }
}

/// Returns once a forward to `leader`, sent in `term`, should be given up: the term
/// moved on or another leader is known. Checked on every change of the server metrics
/// (the vote, the role, the leader; the term is the saved vote's). Silence
/// alone is no reason: on a host too loaded to deliver heartbeats in time the forward
/// would most likely still succeed, and giving it up leaves its client an unknown
/// outcome; an election, which does follow a real loss, changes the term.
pub async fn forward_abandoned(
    raft: &Raft<impl crate::machine::StateMachine>,
    leader: Option<ReplicaId>,
    term: u64,
) -> String {
    let mut metrics = raft.server_metrics();
    loop {
        {
            let m = metrics.borrow_and_update();
            let now = m.vote.leader_id().term;
            if now != term {
                return format!("the term moved on from {term} to {now}");
            }
            if m.current_leader != leader {
                return format!(
                    "the leader changed from {} to {}",
                    shown(leader),
                    shown(m.current_leader)
                );
            }
        }
        if metrics.changed().await.is_err() {
            return "this replica stopped".into();
        }
    }
}

fn shown(id: Option<ReplicaId>) -> String {
    id.map_or_else(|| "none".into(), |id| id.0.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(600);

    fn ms(n: u64) -> Option<Duration> {
        Some(Duration::from_millis(n))
    }

    fn leader(quorum_ack_ago: Option<Duration>) -> View {
        View {
            leading: true,
            quorum_ack_ago,
            follows: false,
            heard_ago: None,
        }
    }

    fn follower(heard_ago: Option<Duration>) -> View {
        View {
            leading: false,
            quorum_ack_ago: None,
            follows: true,
            heard_ago,
        }
    }

    #[test]
    fn a_leader_is_lost_only_once_no_quorum_acknowledged_it_for_longer_than_the_lease() {
        assert!(!lost(leader(ms(100)), LEASE));
        assert!(!lost(leader(ms(600)), LEASE));
        assert!(lost(leader(ms(601)), LEASE));
        // Just elected, no acknowledgement yet: not judged.
        assert!(!lost(leader(None), LEASE));
    }

    #[test]
    fn a_follower_has_lost_its_leader_once_silent_for_longer_than_the_lease() {
        assert!(!lost(follower(ms(50)), LEASE));
        assert!(lost(follower(ms(601)), LEASE));
        // Never heard from a leader since it started: left to openraft.
        assert!(!lost(follower(None), LEASE));
        // No leader known (an election): openraft already answers that no leader is known.
        let electing = View {
            follows: false,
            ..follower(ms(5_000))
        };
        assert!(!lost(electing, LEASE));
    }

    #[test]
    fn a_leaders_own_silence_as_a_follower_does_not_count_while_it_leads() {
        // A leader's last contact as a follower is from before its election: irrelevant.
        let view = View {
            heard_ago: ms(60_000),
            ..leader(ms(10))
        };
        assert!(!lost(view, LEASE));
    }
}
