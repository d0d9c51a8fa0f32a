//! A follower that finds its leader gone stands as soon as the others will vote.
//!
//! openraft 0.9 starts an election only after a follower has heard nothing for the leader's
//! lease (the election timeout's maximum) plus a random election timeout, so a leader that
//! dies costs about `MAX + MIN..MAX` (0.9–1.2 s with the controller's 300–600 ms) before
//! anyone stands, although the other voters would grant a vote as soon as the lease ends: the
//! random part is there for a follower that cannot tell a dead leader from a slow one.
//!
//! A follower can tell, when the leader's process or host is gone, or when the leader no longer
//! answers at all. When no append has come for two heartbeats it asks the leader for its
//! status. A refused or unreachable connection (the process died, the host is down), or no
//! answer within three heartbeats (the process is stopped, or cut off: it still holds its
//! TCP connections, so only silence tells), makes it stand the moment the lease it and the
//! other voters last renewed has run out, plus a margin — staggered by its rank among the
//! voters, one heartbeat apart, so two followers do not split the vote (voters ahead of it
//! whose own process is gone too are not counted) — instead of waiting out its random
//! timeout as well; first it asks the other voters for their logs and leaves the election to
//! one with a longer log (it would refuse this replica, and the term spent would block its
//! own campaign). A leader that answers is left to openraft's timer: it is alive and reaches
//! this replica, so its appends are only late. The lease is counted from the later of the
//! leader's last append and the moment this replica began following it.
//!
//! It stands once per silence, and again a heartbeat later while that stand was refused, for
//! at most a lease. openraft counts a voter's lease from its start too, and a voter refuses
//! every vote while its lease runs: when the leader dies just after another voter restarted
//! and was last heard more than half a heartbeat before that restart, this replica stands a
//! little before the restarted voter's lease ends and is refused (back-to-back failover
//! drills traced 6 ms and 0 ms before). It would otherwise wait out openraft's random
//! timeout, 300–600 ms more. "Refused" is what the other voters answered this replica's
//! vote requests (noted by its network, [`crate::network::client::VoteAnswer`]): every one
//! answered the current term, and none granted it or refused for the candidate's log (that
//! voter should stand, and a new term would stand in the way of its campaign). A voter that
//! has not answered yet may still grant: then there is no second stand, so no grant is ever
//! thrown away, and with a voter down or slow openraft's timer stands again as before. That
//! timer counts from the last stand.
//!
//! Standing against a silent leader costs nothing openraft's timer would not: the timer
//! stands against it too, a random timeout later, and no voter grants a vote before the lease
//! ends. A follower cut off from the leader alone (the others still hear it) stands and is
//! refused, as it would be on its timer; it stands again up to a lease's worth of heartbeats,
//! raising its term each time, where its timer would have raised it once or twice, which
//! changes nothing for the others: when the cut heals, any term above the leader's makes it
//! step down, whether one above or five. What the rank buys over the random timeout is that
//! two followers that lost the leader together do not split the vote.
//!
//! Only liveness changes: an election is safe whenever it starts. A follower the election gate
//! keeps out ([`crate::election_gate`]) does not stand. The cost is a status request to the
//! leader per heartbeat while it is silent, and one when a new leader is followed (which
//! opens the connection reads and writes are passed on over).

use std::time::Duration;

use openraft::{LeaderId, ServerState};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::ReplicaId;
use crate::election_gate::CommitSeen;
use crate::machine::StateMachine;
use crate::network::Channels;
use crate::network::client::Probe;
use crate::types::{Raft, ServerMetrics};

/// When a follower of rank `rank` among the voters that may stand does so, having last heard
/// from its leader at `heard_at`: once the lease renewed then has run out, plus a margin, plus
/// a heartbeat per rank.
pub fn stand_at(heard_at: Instant, lease: Duration, heartbeat: Duration, rank: u32) -> Instant {
    heard_at + lease + heartbeat / 2 + heartbeat * rank
}

/// Watches `raft`'s leader from a follower: see the module docs.
pub fn spawn<M: StateMachine>(
    raft: Raft<M>,
    channels: Channels,
    seen: CommitSeen,
    heartbeat: Duration,
    lease: Duration,
) -> JoinHandle<()> {
    let watch = Watch {
        raft,
        channels,
        seen,
        heartbeat,
        lease,
        handled: None,
        following: None,
        warmed: None,
    };
    tokio::spawn(watch.run())
}

/// A follower's watch on its leader, and what it remembers from one look to the next.
struct Watch<M: StateMachine> {
    raft: Raft<M>,
    channels: Channels,
    seen: CommitSeen,
    heartbeat: Duration,
    lease: Duration,
    /// The silence already acted on (when the leader was last heard), so one stand each.
    handled: Option<Instant>,
    /// The leader and term followed, and since when: a lease is never older than that.
    following: Option<(u64, LeaderId<ReplicaId>, Instant)>,
    /// The leader, and its address, a connection was last opened to ([`Self::warm`]).
    warmed: Option<(ReplicaId, String)>,
}

/// What one look needs of the replica's metrics.
struct View {
    state: ServerState,
    me: ReplicaId,
    term: u64,
    /// The leader of the vote this replica holds.
    vote: LeaderId<ReplicaId>,
    leader: Option<ReplicaId>,
    /// The leader's address.
    addr: Option<String>,
    /// This replica's rank among the voters other than the leader (None: not a voter).
    rank: Option<usize>,
    /// The addresses of the voters ranked before this replica, the leader apart.
    ahead: Vec<String>,
    /// The addresses of the voters other than the leader and this replica.
    others: Vec<String>,
    /// Those voters' ids (a voter with no address in the membership has an id only).
    other_ids: Vec<ReplicaId>,
    /// This replica's last log index.
    last: Option<u64>,
}

impl View {
    /// The view of server metrics `m` and the last log index `last`. (openraft publishes its
    /// server metrics just before its whole metrics: woken by the former, the latter may
    /// still be the previous ones, so role, vote and leader come from the server metrics.)
    fn of(m: &ServerMetrics, last: Option<u64>) -> Self {
        let membership = m.membership_config.membership();
        let leader = m.current_leader;
        let addr = leader
            .and_then(|l| membership.get_node(&l))
            .map(|n| n.addr.clone());
        let mut voters: Vec<_> = membership
            .voter_ids()
            .filter(|v| Some(*v) != leader)
            .collect();
        voters.sort_unstable();
        let rank = voters.iter().position(|v| *v == m.id);
        let ahead = voters
            .iter()
            .take(rank.unwrap_or(0))
            .filter_map(|v| membership.get_node(v).map(|n| n.addr.clone()))
            .collect();
        let other_ids: Vec<ReplicaId> = voters.iter().copied().filter(|v| *v != m.id).collect();
        let others: Vec<String> = other_ids
            .iter()
            .filter_map(|v| membership.get_node(v).map(|n| n.addr.clone()))
            .collect();
        View {
            state: m.state,
            me: m.id,
            term: m.vote.leader_id().term,
            vote: *m.vote.leader_id(),
            leader,
            addr,
            rank,
            ahead,
            others,
            other_ids,
            last,
        }
    }
}

impl<M: StateMachine> Watch<M> {
    /// Looks at the leader whenever the role, the vote or the leader changes, when the
    /// leader has been silent for two heartbeats, and at least once a heartbeat, until the
    /// replica's metrics end. (Not at every change of the whole metrics: openraft publishes
    /// them at every turn of its core's loop, and each append woke this task.)
    async fn run(mut self) {
        let mut server = self.raft.server_metrics();
        let metrics = self.raft.metrics();
        loop {
            tokio::select! {
                changed = server.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep_until(self.next_look()) => {}
            }
            let last = metrics.borrow().last_log_index;
            let view = View::of(&server.borrow_and_update(), last);
            self.warm(&view);
            self.look(view).await;
        }
    }

    /// Opens this replica's connection to a leader it has come to follow, at its first look
    /// after the change, so that the first read or write it passes on does not wait for TCP
    /// and the TLS handshake (12–21 ms on a loaded host: the first listing of every storm
    /// benchmark paid them). A status request makes it, in a task of its own; its answer does
    /// not matter. Once per leader and address (a leader re-elected at the same address is
    /// reached over the connection already made, or tonic reconnects on the first call).
    fn warm(&mut self, view: &View) {
        let (Some(leader), Some(addr)) = (view.leader, view.addr.as_ref()) else {
            return;
        };
        let wanted = (leader, addr.clone());
        if leader == view.me || self.warmed.as_ref() == Some(&wanted) {
            return;
        }
        self.warmed = Some(wanted);
        let (channels, addr, ttl) = (self.channels.clone(), addr.clone(), self.lease);
        // The channel its forwards and reads will take: to that replica, proven.
        tokio::spawn(async move {
            if let Err(why) = channels.status_of(Some(leader), &addr, ttl).await {
                tracing::debug!(%why, "opening the connection to the leader");
            }
        });
    }

    /// When to look next without a change: when the leader will have been silent for two
    /// heartbeats (what [`Self::look`] waits for), else a heartbeat from now.
    fn next_look(&self) -> Instant {
        let now = Instant::now();
        let periodic = now + self.heartbeat;
        self.seen
            .heard_at()
            .map(|heard| heard + self.heartbeat * 2)
            .filter(|due| *due > now)
            .map_or(periodic, |due| due.min(periodic))
    }

    /// One look: stands for election if the leader is gone or silent, once per silence.
    async fn look(&mut self, view: View) {
        let since = self.follow(view.term, view.vote);
        let (Some(heard_at), Some(leader), Some(addr), Some(_)) = (
            self.seen.heard_at(),
            view.leader,
            view.addr.clone(),
            view.rank,
        ) else {
            return;
        };
        let heard_at = heard_at.max(since);
        if view.state != ServerState::Follower
            || leader == view.me
            || self.handled == Some(heard_at)
            || heard_at.elapsed() < self.heartbeat * 2
            || !self.seen.standing()
        {
            return;
        }
        let patience = (self.heartbeat * 3).min(self.lease / 2);
        // A leader gone (its port refuses, its host is unreachable) or silent (stopped, cut
        // off) is stood against as its lease ends; one that answers is only late.
        let probe = self.channels.probe(&addr, patience).await;
        if !matches!(probe, Probe::Gone | Probe::Silent) {
            return;
        }
        // Ranked among the voters ahead that are still there: one whose process is gone too
        // would stand first in vain, and waiting out its turn only delays the election.
        let rank = live_voters(&self.channels, &view.ahead, patience).await;
        let at = stand_at(heard_at, self.lease, self.heartbeat, rank);
        tokio::time::sleep_until(at).await;
        self.handled = Some(heard_at);
        // Heard from a leader meanwhile, or a new one is known: nothing to do.
        if !self.still_silent(leader, heard_at, since) {
            return;
        }
        self.stand(leader, heard_at, probe, &view, patience).await;
    }

    /// Notes the term and leader followed now; since when this replica follows them.
    fn follow(&mut self, term: u64, vote: LeaderId<ReplicaId>) -> Instant {
        if self
            .following
            .as_ref()
            .is_none_or(|(t, v, _)| (*t, *v) != (term, vote))
        {
            self.following = Some((term, vote, Instant::now()));
        }
        self.following.as_ref().map_or_else(Instant::now, |f| f.2)
    }

    /// Whether this replica still follows `leader`, has not heard from it since
    /// `heard_at` (counted from `since`), and may stand.
    fn still_silent(&self, leader: ReplicaId, heard_at: Instant, since: Instant) -> bool {
        let still = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            m.state == ServerState::Follower && m.current_leader == Some(leader)
        };
        still
            && self.seen.heard_at().map(|h| h.max(since)) == Some(heard_at)
            && self.seen.standing()
    }

    /// Stands for election, unless one of the other voters in `view` has a log longer than
    /// this replica's.
    async fn stand(
        &self,
        leader: ReplicaId,
        heard_at: Instant,
        probe: Probe,
        view: &View,
        patience: Duration,
    ) {
        // A voter with a longer log would refuse this replica and then be refused in the
        // same term: leave the election to it.
        if longer_log_elsewhere(&self.channels, &view.others, view.last, patience).await {
            tracing::info!(
                "the leader is gone, but another voter has a longer log: leaving it to stand"
            );
            return;
        }
        tracing::info!(
            leader = %leader,
            leader_probe = ?probe,
            silent_ms = heard_at.elapsed().as_millis() as u64,
            "the leader is gone or silent; standing for election as its lease ends"
        );
        if let Err(e) = self.raft.trigger().elect().await {
            tracing::debug!(error = %e, "standing for election");
            return;
        }
        self.stand_again_while_refused(&view.other_ids).await;
    }

    /// Stands again a heartbeat after each refused stand, for at most a lease: see the module
    /// docs.
    async fn stand_again_while_refused(&self, others: &[ReplicaId]) {
        let until = Instant::now() + self.lease;
        loop {
            tokio::time::sleep(self.heartbeat).await;
            if Instant::now() >= until {
                return;
            }
            let Some(term) = self.campaigning() else {
                return;
            };
            if !all_refused(&self.channels, others, term) {
                return;
            }
            tracing::info!(
                term,
                "every other voter refused the stand (a lease still ran): standing again"
            );
            if let Err(e) = self.raft.trigger().elect().await {
                tracing::debug!(error = %e, "standing for election again");
                return;
            }
        }
    }

    /// This replica's term while it campaigns and the election gate lets it.
    fn campaigning(&self) -> Option<u64> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        (m.state == ServerState::Candidate && self.seen.standing()).then_some(m.current_term)
    }
}

/// Whether every voter in `others` has answered this replica's vote request for `term`, and
/// refused it for a reason other than this replica's log (a lease still running). A voter
/// that has not answered may yet grant the vote; one that refused for the log should stand
/// itself, and a new term would stand in its way.
fn all_refused(channels: &Channels, others: &[ReplicaId], term: u64) -> bool {
    !others.is_empty()
        && others.iter().all(|id| {
            channels
                .vote_answer(*id)
                .is_some_and(|a| a.term == term && !a.granted && !a.voter_log_newer)
        })
}

/// How many of the voters at `addrs` are not certainly gone (each asked at once, for at
/// most `patience`): a slow or silent one counts as there.
pub(crate) async fn live_voters(channels: &Channels, addrs: &[String], patience: Duration) -> u32 {
    let mut asks = tokio::task::JoinSet::new();
    for addr in addrs {
        let (channels, addr) = (channels.clone(), addr.clone());
        asks.spawn(async move { channels.certainly_gone(&addr, patience).await });
    }
    let mut live = 0u32;
    while let Some(gone) = asks.join_next().await {
        if !matches!(gone, Ok(true)) {
            live = live.saturating_add(1);
        }
    }
    live
}

/// Whether a voter at one of `others` reports a log longer than `mine`.
async fn longer_log_elsewhere(
    channels: &Channels,
    others: &[String],
    mine: Option<u64>,
    patience: Duration,
) -> bool {
    for addr in others {
        if let Ok(status) = channels.status(addr, patience).await
            && status.last_log_index > mine
        {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn followers_stand_one_heartbeat_apart_after_the_lease_and_a_margin() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(stand_at(t, ms(600), ms(100), 0), t + ms(650));
        assert_eq!(stand_at(t, ms(600), ms(100), 1), t + ms(750));
    }

    #[tokio::test]
    async fn a_voter_ahead_whose_process_is_gone_does_not_hold_up_the_stand() {
        // Ahead: one voter whose port refuses (its process is gone) and one that accepts and
        // never answers (slow, or cut off: it may still stand first, so it counts).
        let gone = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_addr = silent.local_addr().unwrap().to_string();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                held.push(socket);
            }
        });
        let channels = Channels::tcp(crate::network::NetworkConfig::default());
        let patience = Duration::from_millis(300);
        assert_eq!(
            live_voters(&channels, std::slice::from_ref(&gone), patience).await,
            0
        );
        assert_eq!(
            live_voters(&channels, &[gone, silent_addr], patience).await,
            1
        );
        assert_eq!(live_voters(&channels, &[], patience).await, 0);
        hold.abort();
    }
}
