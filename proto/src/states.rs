//! The typed states of replies, read the same way by every client.
//!
//! A reply carries each closed set twice: the enum (`job_state`, `node_state`,
//! `replica_role`) and the name the first protocol sent (`state`, `role`). Clients decide
//! on the enum; these accessors fall back on the name only when the enum is unspecified,
//! which is what a controller one release behind sends. The enums' value names are the
//! names prefixed (`JOB_STATE_RUNNING` for `RUNNING`, `NODE_STATE_IDLE` for `idle`), which
//! the controller's tests check for every value.

use crate::v1;

impl v1::JobState {
    /// Slurm's name of the state (`RUNNING`, `OUT_OF_MEMORY`); `UNSPECIFIED` for none.
    pub fn slurm_name(self) -> &'static str {
        self.as_str_name()
            .strip_prefix("JOB_STATE_")
            .unwrap_or("UNSPECIFIED")
    }

    /// The state Slurm calls `name` (`RUNNING`); unspecified when none is.
    pub fn from_slurm_name(name: &str) -> Self {
        Self::from_str_name(&format!("JOB_STATE_{}", name.to_ascii_uppercase())).unwrap_or_default()
    }
}

/// `value` when it names a value, else what `fallback` gives.
fn typed_or<T: Default + PartialEq + TryFrom<i32>>(value: i32, fallback: impl FnOnce() -> T) -> T {
    match T::try_from(value) {
        Ok(t) if t != T::default() => t,
        _ => fallback(),
    }
}

impl v1::JobInfo {
    /// The job's state.
    pub fn state_typed(&self) -> v1::JobState {
        typed_or(self.job_state, || {
            v1::JobState::from_slurm_name(&self.state)
        })
    }
}

impl v1::StepInfo {
    /// The step's state.
    pub fn state_typed(&self) -> v1::JobState {
        typed_or(self.step_state, || {
            v1::JobState::from_slurm_name(&self.state)
        })
    }
}

impl v1::NodeInfo {
    /// The node's state.
    pub fn state_typed(&self) -> v1::NodeState {
        typed_or(self.node_state, || {
            v1::NodeState::from_str_name(&format!("NODE_STATE_{}", self.state.to_ascii_uppercase()))
                .unwrap_or_default()
        })
    }
}

impl v1::ReplicaInfo {
    /// The replica's role.
    pub fn role_typed(&self) -> v1::ReplicaRole {
        typed_or(self.replica_role, || {
            v1::ReplicaRole::from_str_name(&format!(
                "REPLICA_ROLE_{}",
                self.role.to_ascii_uppercase()
            ))
            .unwrap_or_default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_enum_wins_and_the_name_is_read_only_without_it() {
        let mut job = v1::JobInfo {
            state: "PENDING".into(),
            ..Default::default()
        };
        assert_eq!(
            job.state_typed(),
            v1::JobState::Pending,
            "an older controller"
        );
        job.job_state = v1::JobState::Running.into();
        assert_eq!(job.state_typed(), v1::JobState::Running);
        let node = v1::NodeInfo {
            state: "draining".into(),
            ..Default::default()
        };
        assert_eq!(node.state_typed(), v1::NodeState::Draining);
        let replica = v1::ReplicaInfo {
            role: "unreachable".into(),
            ..Default::default()
        };
        assert_eq!(replica.role_typed(), v1::ReplicaRole::Unreachable);
        let nothing = v1::StepInfo::default();
        assert_eq!(nothing.state_typed(), v1::JobState::Unspecified);
    }

    #[test]
    fn slurm_names_round_trip() {
        assert_eq!(v1::JobState::OutOfMemory.slurm_name(), "OUT_OF_MEMORY");
        assert_eq!(
            v1::JobState::from_slurm_name("node_fail"),
            v1::JobState::NodeFail
        );
        assert_eq!(
            v1::JobState::from_slurm_name("R"),
            v1::JobState::Unspecified
        );
        assert_eq!(v1::JobState::Unspecified.slurm_name(), "UNSPECIFIED");
    }
}
