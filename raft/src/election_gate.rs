//! A follower that knows it is missing committed entries stays out of elections.
//!
//! Raft elects only a candidate whose log is at least as up to date as a majority's, so a
//! replica that lacks entries the leader has told it are committed can never win. Yet when
//! the leader dies it may still be the first whose election timer fires (a replica restarted
//! a moment ago, or one slowed by its disk, is behind exactly then). Its campaign is refused,
//! but it has raised the term and voted for itself in it; the up-to-date replica's campaign in
//! that same term is then refused too, and the cluster waits a whole election timeout more
//! (measured with `docket-local drill`: 2.2–2.7 s instead of about 1 s). openraft 0.9 has no
//! pre-vote round to avoid this, so each replica gates its own elections: it campaigns only
//! while its log reaches the highest commit index a leader of its current term sent it.
//!
//! The same holds for a replica that has just started on an existing data directory: until a
//! leader reaches it, it cannot know how far behind it is, and a leader that had backed off
//! from it while it was down may take a moment to come back. Such a replica stands only after
//! a grace period (the election timeout's maximum plus its minimum, within openraft's own
//! first expiry) unless a leader reaches it first.
//!
//! Neither rule stands in the way of an election that could succeed: a replica missing a
//! committed entry could not win one, and the grace only delays a replica that has heard of
//! no leader since it started (a cluster restarted whole elects after it). Only appends and
//! snapshot chunks that openraft accepted (from the leader of the replica's current vote)
//! count, so a stale or stray sender cannot silence a replica. A cluster of one voter is never gated.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use openraft::ServerState;
use tokio::task::JoinHandle;

use crate::machine::StateMachine;
use crate::types::Raft;

/// What accepted appends told this replica: the highest commit index they carried, and when
/// its leader last reached it.
#[derive(Debug, Clone)]
pub struct CommitSeen {
    /// The highest commit index, plus one (0: none yet).
    commit: Arc<AtomicU64>,
    /// When the leader last reached it: milliseconds after `origin`, plus one (0: never).
    heard_at_ms: Arc<AtomicU64>,
    origin: tokio::time::Instant,
    /// Whether the gate lets this replica stand now.
    standing: Arc<AtomicBool>,
}

impl Default for CommitSeen {
    fn default() -> Self {
        CommitSeen {
            commit: Arc::default(),
            heard_at_ms: Arc::default(),
            origin: tokio::time::Instant::now(),
            standing: Arc::new(AtomicBool::new(true)),
        }
    }
}

impl CommitSeen {
    /// An accepted append arrived, telling this replica that entries up to `commit` are
    /// committed.
    pub fn saw(&self, commit: Option<u64>) {
        self.contact();
        if let Some(index) = commit {
            self.commit
                .fetch_max(index.saturating_add(1), Ordering::Relaxed);
        }
    }

    /// The leader of this replica's vote reached it (an append it accepted, or one that
    /// conflicted with its log: either way that leader is alive and its lease renewed).
    pub fn contact(&self) {
        let at = u64::try_from(self.origin.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        // Never goes back, whatever order concurrent appends finish in.
        self.heard_at_ms.fetch_max(at, Ordering::Relaxed);
    }

    /// The highest committed index heard of.
    pub fn get(&self) -> Option<u64> {
        self.commit.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Whether a leader has reached this replica since it started.
    pub fn heard(&self) -> bool {
        self.heard_at_ms.load(Ordering::Relaxed) > 0
    }

    /// Whether the gate lets this replica stand for election now.
    pub fn standing(&self) -> bool {
        self.standing.load(Ordering::Relaxed)
    }

    /// When a leader last reached this replica, if one has.
    pub fn heard_at(&self) -> Option<tokio::time::Instant> {
        let ms = self.heard_at_ms.load(Ordering::Relaxed).checked_sub(1)?;
        Some(self.origin + Duration::from_millis(ms))
    }
}

/// Whether a replica whose log ends at `last_log_index` may campaign, having heard of
/// entries committed up to `committed`.
pub fn may_campaign(last_log_index: Option<u64>, committed: Option<u64>) -> bool {
    match (committed, last_log_index) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(c), Some(last)) => last >= c,
    }
}

/// Keeps `raft`'s elections enabled exactly while the replica leads, or [`may_campaign`]
/// holds and it has heard from a leader or started more than `grace` ago; checked on every
/// change of its role, vote, leader or membership and every `every` (a follower catching up
/// is seen within `every`: waking on every change of the whole metrics cost a wake-up of this
/// task at every turn of openraft's core). Ends with the replica.
pub fn spawn<M: StateMachine>(
    raft: Raft<M>,
    seen: CommitSeen,
    every: Duration,
    grace: Duration,
) -> JoinHandle<()> {
    let started = tokio::time::Instant::now();
    tokio::spawn(async move {
        let mut server = raft.server_metrics();
        let metrics = raft.metrics();
        let mut enabled = true;
        loop {
            // Role and voters from the server metrics, which may be newer than the whole
            // metrics that wake nothing here (openraft publishes them first).
            let (state, voters) = {
                let m = server.borrow_and_update();
                (
                    m.state,
                    m.membership_config.membership().voter_ids().count(),
                )
            };
            let last = metrics.borrow().last_log_index;
            let settled = seen.heard() || started.elapsed() >= grace;
            let allow = state == ServerState::Leader
                || voters <= 1
                || (settled && may_campaign(last, seen.get()));
            if allow != enabled {
                enabled = allow;
                seen.standing.store(allow, Ordering::Relaxed);
                raft.runtime_config().elect(allow);
                if allow {
                    tracing::info!("standing for election (caught up, or no leader reached it)");
                } else {
                    tracing::info!(
                        last_log_index = last,
                        committed = seen.get(),
                        heard_from_a_leader = seen.heard(),
                        "staying out of elections: behind the committed log, or just started"
                    );
                }
            }
            tokio::select! {
                changed = server.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep(every) => {}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_replica_holding_every_committed_entry_it_heard_of_campaigns() {
        assert!(may_campaign(None, None), "a new cluster elects");
        assert!(may_campaign(Some(3), None));
        assert!(may_campaign(Some(17), Some(17)));
        assert!(may_campaign(Some(20), Some(17)));
        assert!(!may_campaign(Some(14), Some(17)), "behind the commit");
        assert!(!may_campaign(None, Some(0)));
        let seen = CommitSeen::default();
        assert_eq!((seen.get(), seen.heard()), (None, false));
        seen.saw(None);
        assert_eq!((seen.get(), seen.heard()), (None, true));
        seen.saw(Some(0));
        assert_eq!(seen.get(), Some(0));
        seen.saw(Some(9));
        seen.saw(Some(4));
        assert_eq!(seen.get(), Some(9), "never goes back");
    }
}
