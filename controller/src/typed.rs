//! The closed sets the protocol names with enums (`docket.v1.JobState`, `NodeState`,
//! `ReplicaRole`, `ObjectKind`), to and from docket-core's own types.
//!
//! Replies carry each both ways: the enum, which clients decide on, and the name of the
//! first protocol (a string), which clients one release behind still read. Requests take
//! the enum, or the name from such clients.

use docket_core::job::JobState;
use docket_core::node::NodeState;
use docket_proto::v1 as pb;
use docket_raft::status::Role;

/// A job's or a step's state on the wire.
pub fn job_state(state: JobState) -> pb::JobState {
    match state {
        JobState::Pending => pb::JobState::Pending,
        JobState::Running => pb::JobState::Running,
        JobState::Suspended => pb::JobState::Suspended,
        JobState::Completing => pb::JobState::Completing,
        JobState::Completed => pb::JobState::Completed,
        JobState::Failed => pb::JobState::Failed,
        JobState::Cancelled => pb::JobState::Cancelled,
        JobState::Timeout => pb::JobState::Timeout,
        JobState::OutOfMemory => pb::JobState::OutOfMemory,
        JobState::NodeFail => pb::JobState::NodeFail,
        JobState::Preempted => pb::JobState::Preempted,
    }
}

/// The state a wire value names; none for an unspecified or unknown value.
pub fn job_state_of(value: i32) -> Option<JobState> {
    let state = pb::JobState::try_from(value).ok()?;
    JobState::ALL.into_iter().find(|s| job_state(*s) == state)
}

/// A node's state on the wire.
pub fn node_state(state: NodeState) -> pb::NodeState {
    match state {
        NodeState::Idle => pb::NodeState::Idle,
        NodeState::Mix => pb::NodeState::Mix,
        NodeState::Alloc => pb::NodeState::Alloc,
        NodeState::Draining => pb::NodeState::Draining,
        NodeState::Drain => pb::NodeState::Drain,
        NodeState::Down => pb::NodeState::Down,
    }
}

/// A replica's role on the wire, and its name in the first protocol.
pub fn replica_role(role: Role) -> (pb::ReplicaRole, &'static str) {
    match role {
        Role::Leader => (pb::ReplicaRole::Leader, "leader"),
        Role::Follower => (pb::ReplicaRole::Follower, "follower"),
        Role::Candidate => (pb::ReplicaRole::Candidate, "candidate"),
        Role::Learner => (pb::ReplicaRole::Learner, "learner"),
        Role::Shutdown => (pb::ReplicaRole::Shutdown, "shutdown"),
    }
}

/// The kind of object a remove request names: its enum when set, else the name the first
/// protocol sent (`node`, `partition`, `qos`, `account`, `user`, `reservation`); none when
/// neither names a kind.
pub fn object_kind(value: i32, name: &str) -> Option<pb::ObjectKind> {
    match pb::ObjectKind::try_from(value) {
        Ok(pb::ObjectKind::Unspecified) => match name {
            "node" => Some(pb::ObjectKind::Node),
            "partition" => Some(pb::ObjectKind::Partition),
            "qos" => Some(pb::ObjectKind::Qos),
            "account" => Some(pb::ObjectKind::Account),
            "user" => Some(pb::ObjectKind::User),
            "reservation" => Some(pb::ObjectKind::Reservation),
            _ => None,
        },
        Ok(kind) => Some(kind),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_state_has_its_own_wire_value_and_name() {
        for s in JobState::ALL {
            let wire = job_state(s);
            assert_eq!(job_state_of(wire as i32), Some(s));
            // The enum's name is the first protocol's name, prefixed.
            assert_eq!(wire.as_str_name(), format!("JOB_STATE_{}", s.name()));
        }
        assert_eq!(job_state_of(0), None, "unspecified names no state");
        assert_eq!(job_state_of(99), None);
    }

    #[test]
    fn every_node_state_and_role_keeps_its_name() {
        for (s, name) in [
            (NodeState::Idle, "idle"),
            (NodeState::Mix, "mix"),
            (NodeState::Alloc, "alloc"),
            (NodeState::Draining, "draining"),
            (NodeState::Drain, "drain"),
            (NodeState::Down, "down"),
        ] {
            assert_eq!(format!("{s:?}").to_lowercase(), name);
            let wire = node_state(s).as_str_name();
            assert_eq!(wire, format!("NODE_STATE_{}", name.to_uppercase()));
        }
        for role in [
            Role::Leader,
            Role::Follower,
            Role::Candidate,
            Role::Learner,
            Role::Shutdown,
        ] {
            let (wire, name) = replica_role(role);
            assert_eq!(
                wire.as_str_name(),
                format!("REPLICA_ROLE_{}", name.to_uppercase())
            );
        }
    }

    #[test]
    fn an_object_kind_comes_from_the_enum_or_else_the_name() {
        let node = pb::ObjectKind::Node as i32;
        assert_eq!(object_kind(node, "user"), Some(pb::ObjectKind::Node));
        assert_eq!(object_kind(0, "qos"), Some(pb::ObjectKind::Qos));
        assert_eq!(
            object_kind(0, "reservation"),
            Some(pb::ObjectKind::Reservation)
        );
        assert_eq!(
            object_kind(0, "Reservation"),
            None,
            "names as the first protocol sent them"
        );
        assert_eq!(object_kind(0, "unspecified"), None);
        assert_eq!(object_kind(0, "cluster"), None);
        assert_eq!(
            object_kind(42, "node"),
            None,
            "an unknown enum value is not guessed"
        );
    }
}
