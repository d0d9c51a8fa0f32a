//! What a replica reports about itself and, when it leads, about the others: the figures
//! `docket cluster status` prints and the controller exports as Raft gauges.

use std::collections::BTreeMap;

use openraft::ServerState;
use serde::{Deserialize, Serialize};

use crate::ids::ReplicaId;
use crate::types::RaftMetrics;

/// A replica's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Shutdown,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Shutdown => "shutdown",
        })
    }
}

/// One member of the cluster as this replica sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: ReplicaId,
    pub addr: String,
    /// Voter (counts in the quorum) or learner (receives the log only).
    pub voter: bool,
    /// Highest log index known to be on that replica (leader only).
    pub matched_index: Option<u64>,
    /// How many entries it is behind the leader's log (leader only).
    pub lag: Option<u64>,
}

/// A replica's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    pub id: ReplicaId,
    pub role: Role,
    pub term: u64,
    pub leader: Option<ReplicaId>,
    pub leader_addr: Option<String>,
    /// Index of the last entry in the log.
    pub last_log_index: Option<u64>,
    /// Index of the last entry applied to the machine.
    pub applied_index: Option<u64>,
    /// Index the latest snapshot covers.
    pub snapshot_index: Option<u64>,
    /// Index up to which the log has been purged.
    pub purged_index: Option<u64>,
    /// Milliseconds since a quorum last acknowledged this leader (leader only).
    pub millis_since_quorum_ack: Option<u64>,
    /// Every member of the current membership, voters first.
    pub members: Vec<Member>,
    /// Why the replica stopped, if it did (a storage failure, for one).
    pub stopped: Option<String>,
    /// Where it serves its status page, if it does. Last, and read as absent from a replica
    /// of a build before it (`trailing`), so a cluster mid-upgrade still reports every
    /// replica.
    #[serde(default, deserialize_with = "trailing")]
    pub status_page: Option<String>,
    /// The newest version of the replicated machine's commands its build applies, if it says
    /// (read as absent from older builds, like [`Self::status_page`]).
    #[serde(default, deserialize_with = "trailing")]
    pub app_version: Option<u16>,
}

/// A field added at the end of a message: absent when the sender's build wrote the message
/// without it (postcard then runs out of bytes right there).
fn trailing<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(T::deserialize(d).unwrap_or_default())
}

impl ReplicaStatus {
    /// The status openraft's metrics describe.
    pub fn from_metrics(m: &RaftMetrics) -> Self {
        let role = match m.state {
            ServerState::Leader => Role::Leader,
            ServerState::Follower => Role::Follower,
            ServerState::Candidate => Role::Candidate,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Shutdown,
        };
        let membership = m.membership_config.membership();
        let voters: Vec<ReplicaId> = membership.voter_ids().collect();
        let replication: BTreeMap<ReplicaId, Option<u64>> = m
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .map(|(id, log)| (*id, log.map(|l| l.index)))
                    .collect()
            })
            .unwrap_or_default();
        let leading = role == Role::Leader;
        let mut members: Vec<Member> = membership
            .nodes()
            .map(|(id, node)| {
                let matched_index = if leading {
                    replication.get(id).copied().flatten()
                } else {
                    None
                };
                let lag = leading.then(|| {
                    m.last_log_index
                        .unwrap_or(0)
                        .saturating_sub(matched_index.unwrap_or(0))
                });
                Member {
                    id: *id,
                    addr: node.addr.clone(),
                    voter: voters.contains(id),
                    matched_index,
                    lag,
                }
            })
            .collect();
        members.sort_by_key(|member| (!member.voter, member.id));
        let leader_addr = m
            .current_leader
            .and_then(|id| membership.get_node(&id))
            .map(|n| n.addr.clone());
        ReplicaStatus {
            id: m.id,
            role,
            term: m.current_term,
            leader: m.current_leader,
            leader_addr,
            last_log_index: m.last_log_index,
            applied_index: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            millis_since_quorum_ack: m.millis_since_quorum_ack,
            members,
            stopped: m.running_state.as_ref().err().map(|e| e.to_string()),
            status_page: None,
            app_version: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(page: Option<&str>) -> ReplicaStatus {
        ReplicaStatus {
            id: ReplicaId(2),
            role: Role::Follower,
            term: 7,
            leader: Some(ReplicaId(1)),
            leader_addr: Some("10.0.0.1:7100".into()),
            last_log_index: Some(40),
            applied_index: Some(40),
            snapshot_index: None,
            purged_index: None,
            millis_since_quorum_ack: None,
            members: Vec::new(),
            stopped: None,
            status_page: page.map(String::from),
            app_version: page.map(|_| 4),
        }
    }

    #[test]
    fn the_status_page_travels_and_an_older_replica_s_status_still_reads() {
        let new = status(Some("http://10.0.0.2:7180/"));
        let bytes = crate::codec::encode(&new).unwrap();
        assert_eq!(crate::codec::decode::<ReplicaStatus>(&bytes).unwrap(), new);
        // An older build's status is these bytes without the last fields (None: a byte each).
        let mut old = crate::codec::encode(&status(None)).unwrap();
        old.truncate(old.len() - 2);
        assert_eq!(
            crate::codec::decode::<ReplicaStatus>(&old).unwrap(),
            status(None)
        );
    }
}
