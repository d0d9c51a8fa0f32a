//! A follower that finds its leader gone stands as soon as the others will vote.
//!
//! openraft 0.9 starts an election only after a follower has heard nothing for the leader's
//! lease (the election timeout's maximum) plus a random election timeout, so a leader that
//! dies costs about `MAX + MIN..MAX` (0.9–1.2 s with the controller's 300–600 ms) before
//! anyone stands, although the other voters would grant a vote as soon as the lease ends: the
//! random part is there for a follower that cannot tell a dead leader from a slow one.
//!
//! A follower can tell, often. When no append has come for two heartbeats it asks the leader
//! for its status, within three heartbeats (at most half the lease). An answer means the leader lives (slow, or cut off
//! from this follower alone) and nothing changes. No answer (the process is gone, the host or
//! the network is down, or the process is stopped) makes it stand the moment the lease it and
//! the other voters last renewed has run out, plus a margin — staggered by its rank among the
//! voters, one heartbeat apart, so two followers do not split the vote — instead of waiting
//! out its random timeout as well. It stands once per silence; openraft's own timer goes on
//! as before if that election fails.
//!
//! Only liveness changes: an election is safe whenever it starts. A follower the election gate
//! keeps out ([`crate::election_gate`]) does not stand. The cost is a status request to the
//! leader per heartbeat while it is silent.

use std::time::Duration;

use openraft::ServerState;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::election_gate::CommitSeen;
use crate::machine::StateMachine;
use crate::network::Channels;
use crate::types::Raft;

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
    tokio::spawn(async move {
        let mut metrics = raft.metrics();
        // The silence already acted on (when the leader was last heard), so one stand each.
        let mut handled: Option<Instant> = None;
        loop {
            tokio::select! {
                changed = metrics.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep(heartbeat) => {}
            }
            let (state, me, leader, addr, rank) = {
                let m = metrics.borrow_and_update();
                let membership = m.membership_config.membership();
                let leader = m.current_leader;
                let addr = leader
                    .and_then(|l| membership.get_node(&l))
                    .map(|n| n.addr.clone());
                let mut others: Vec<_> = membership
                    .voter_ids()
                    .filter(|v| Some(*v) != leader)
                    .collect();
                others.sort_unstable();
                let rank = others.iter().position(|v| *v == m.id);
                (m.state, m.id, leader, addr, rank)
            };
            let (Some(heard_at), Some(leader), Some(addr), Some(rank)) =
                (seen.heard_at(), leader, addr, rank)
            else {
                continue;
            };
            if state != ServerState::Follower
                || leader == me
                || handled == Some(heard_at)
                || heard_at.elapsed() < heartbeat * 2
                || !seen.standing()
            {
                continue;
            }
            let patience = (heartbeat * 3).min(lease / 2);
            if channels.status(&addr, patience).await.is_ok() {
                // Alive: slow, or cut off from this follower alone. Its lease holds elsewhere.
                continue;
            }
            let at = stand_at(
                heard_at,
                lease,
                heartbeat,
                u32::try_from(rank).unwrap_or(u32::MAX),
            );
            tokio::time::sleep_until(at).await;
            // Heard from a leader meanwhile, or a new one is known: nothing to do.
            let still = {
                let m = raft.metrics().borrow().clone();
                m.state == ServerState::Follower && m.current_leader == Some(leader)
            };
            handled = Some(heard_at);
            if !still || seen.heard_at() != Some(heard_at) || !seen.standing() {
                continue;
            }
            tracing::info!(
                leader = %leader,
                silent_ms = heard_at.elapsed().as_millis() as u64,
                "the leader does not answer; standing for election as its lease ends"
            );
            if let Err(e) = raft.trigger().elect().await {
                tracing::debug!(error = %e, "standing for election");
            }
        }
    })
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
}
