//! Job states and pending reasons, in Slurm's vocabulary.
//!
//! Users read these verbatim in `squeue` (`ST` and `NODELIST(REASON)`), so the short codes and
//! reason names are Slurm's own. Every policy limit has its own reason: a blocked job always
//! says which rule blocks it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum JobState {
    /// PD: waiting; [`Reason`] says why.
    Pending,
    /// R: holds resources and runs.
    Running,
    /// S: holds its memory and jobfs but is frozen; its walltime clock is stopped.
    Suspended,
    /// CG: told to stop; waiting for the agent to confirm.
    Completing,
    /// CD: exited with code 0.
    Completed,
    /// F: exited non-zero or could not be launched.
    Failed,
    /// CA: cancelled by its owner or an admin.
    Cancelled,
    /// TO: killed at its time limit.
    Timeout,
    /// OOM: killed for exceeding its memory.
    OutOfMemory,
    /// NF: its node failed.
    NodeFail,
    /// PR: preempted and not requeued.
    Preempted,
}

impl JobState {
    /// Every state, for exhaustive tests and listings.
    pub const ALL: [JobState; 11] = [
        JobState::Pending,
        JobState::Running,
        JobState::Suspended,
        JobState::Completing,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::OutOfMemory,
        JobState::NodeFail,
        JobState::Preempted,
    ];

    /// Slurm's two-or-three-letter code (`squeue` ST column).
    pub fn code(self) -> &'static str {
        match self {
            JobState::Pending => "PD",
            JobState::Running => "R",
            JobState::Suspended => "S",
            JobState::Completing => "CG",
            JobState::Completed => "CD",
            JobState::Failed => "F",
            JobState::Cancelled => "CA",
            JobState::Timeout => "TO",
            JobState::OutOfMemory => "OOM",
            JobState::NodeFail => "NF",
            JobState::Preempted => "PR",
        }
    }

    /// Slurm's long name (`squeue -l` STATE column, `sacct` State).
    pub fn name(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Suspended => "SUSPENDED",
            JobState::Completing => "COMPLETING",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
            JobState::NodeFail => "NODE_FAIL",
            JobState::Preempted => "PREEMPTED",
        }
    }

    /// Parses a code or a long name, case-insensitively (`squeue -t`).
    pub fn parse(s: &str) -> Option<JobState> {
        let up = s.to_ascii_uppercase();
        JobState::ALL
            .into_iter()
            .find(|st| st.code() == up || st.name() == up)
    }

    /// The job is over; nothing will change it again (except a requeue of a failed job).
    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            JobState::Pending | JobState::Running | JobState::Suspended | JobState::Completing
        )
    }

    /// The job holds node resources (cpus, memory, jobfs).
    pub fn holds_resources(self) -> bool {
        matches!(
            self,
            JobState::Running | JobState::Suspended | JobState::Completing
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a pending job is not running (or, for `None`, that nothing stops it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// Eligible; the scheduler has not looked at it yet.
    None,
    /// Eligible; waiting for resources to free up.
    Resources,
    /// Eligible; higher-priority jobs go first.
    Priority,
    /// Waiting for its dependencies.
    Dependency,
    /// A dependency can never be satisfied (e.g. `afterok` on a job that failed).
    DependencyNeverSatisfied,
    /// Held by its owner (`-H`, `scontrol hold`).
    JobHeldUser,
    /// Held by an administrator.
    JobHeldAdmin,
    /// Its `--begin` time has not come.
    BeginTime,
    /// Its array's `%N` throttle is reached.
    JobArrayTaskLimit,
    /// Its partition is down or inactive.
    PartitionDown,
    /// Its time limit exceeds the partition's MaxTime.
    PartitionTimeLimit,
    /// It asks for more nodes than the partition has or allows.
    PartitionNodeLimit,
    /// Maui: the owner already has the maximum number of idle (eligible) jobs.
    MaxIdleJobsPerUser,
    /// Maui: the owner already has the maximum number of running plus idle jobs.
    MaxJobsPerUser,
    /// Maui MAXPS: processor-seconds of the owner's running jobs plus this job exceed the soft
    /// limit; it may still run when nothing else is eligible.
    MaxPsSoftLimit,
    /// Maui MAXPS: this job would exceed the hard limit; it waits for running jobs to finish.
    MaxPsHardLimit,
    /// The job alone exceeds the hard MAXPS limit: it can never run.
    MaxPsHardLimitNever,
    /// Time limit above the QOS's MaxWall.
    QosMaxWallDurationPerJobLimit,
    /// The user already runs the QOS's MaxJobsPerUser.
    QosMaxJobsPerUserLimit,
    /// The user already has the QOS's MaxSubmitJobsPerUser in the queue.
    QosMaxSubmitJobPerUserLimit,
    /// Running cpus of the user in this QOS would exceed MaxTRESPerUser=cpu.
    QosMaxCpuPerUserLimit,
    /// Running cpu-minutes of the QOS group would exceed GrpTRESRunMins=cpu.
    QosGrpCpuRunMinutesLimit,
    /// The QOS already runs its GrpJobs.
    QosGrpJobsLimit,
    /// Running cpus of the QOS would exceed GrpTRES=cpu.
    QosGrpCpuLimit,
    /// The user already runs the partition's MaxJobsPerUser.
    PartitionMaxJobsPerUserLimit,
    /// Running cpus of the user in this partition would exceed its per-user cpu limit.
    PartitionMaxCpuPerUserLimit,
    /// The account's association already runs its MaxJobs.
    AssocMaxJobsLimit,
    /// The account's group running cpu-minutes would exceed GrpTRESRunMins=cpu.
    AssocGrpCpuRunMinutesLimit,
    /// The project's grant is spent and bonus running is not allowed for it.
    AccountGrantExhausted,
    /// A node it names explicitly is down, drained or not in its partition.
    ReqNodeNotAvail,
    /// Its advance reservation's window has not begun.
    Reservation,
    /// Its advance reservation was deleted or its window has passed.
    ReservationDeleted,
}

impl Reason {
    /// Whether the reason can change with nothing but time passing: a begin time, or a
    /// limit on the processor-seconds or cpu-minutes that running jobs still have to run.
    pub fn depends_on_time(self) -> bool {
        matches!(
            self,
            Reason::BeginTime
                | Reason::Reservation
                | Reason::ReservationDeleted
                | Reason::MaxPsSoftLimit
                | Reason::MaxPsHardLimit
                | Reason::QosGrpCpuRunMinutesLimit
                | Reason::AssocGrpCpuRunMinutesLimit
        )
    }

    /// The name squeue prints in parentheses.
    pub fn name(self) -> &'static str {
        match self {
            Reason::None => "None",
            Reason::Resources => "Resources",
            Reason::Priority => "Priority",
            Reason::Dependency => "Dependency",
            Reason::DependencyNeverSatisfied => "DependencyNeverSatisfied",
            Reason::JobHeldUser => "JobHeldUser",
            Reason::JobHeldAdmin => "JobHeldAdmin",
            Reason::BeginTime => "BeginTime",
            Reason::JobArrayTaskLimit => "JobArrayTaskLimit",
            Reason::PartitionDown => "PartitionDown",
            Reason::PartitionTimeLimit => "PartitionTimeLimit",
            Reason::PartitionNodeLimit => "PartitionNodeLimit",
            Reason::MaxIdleJobsPerUser => "MaxIdleJobsPerUser",
            Reason::MaxJobsPerUser => "MaxJobsPerUser",
            Reason::MaxPsSoftLimit => "MaxPSSoftLimit",
            Reason::MaxPsHardLimit => "MaxPSHardLimit",
            Reason::MaxPsHardLimitNever => "MaxPSHardLimitNever",
            Reason::QosMaxWallDurationPerJobLimit => "QOSMaxWallDurationPerJobLimit",
            Reason::QosMaxJobsPerUserLimit => "QOSMaxJobsPerUserLimit",
            Reason::QosMaxSubmitJobPerUserLimit => "QOSMaxSubmitJobPerUserLimit",
            Reason::QosMaxCpuPerUserLimit => "QOSMaxCpuPerUserLimit",
            Reason::QosGrpCpuRunMinutesLimit => "QOSGrpCPURunMinutesLimit",
            Reason::QosGrpJobsLimit => "QOSGrpJobsLimit",
            Reason::QosGrpCpuLimit => "QOSGrpCpuLimit",
            Reason::PartitionMaxJobsPerUserLimit => "PartitionMaxJobsPerUserLimit",
            Reason::PartitionMaxCpuPerUserLimit => "PartitionMaxCpuPerUserLimit",
            Reason::AssocMaxJobsLimit => "AssocMaxJobsLimit",
            Reason::AssocGrpCpuRunMinutesLimit => "AssocGrpCPURunMinutesLimit",
            Reason::AccountGrantExhausted => "AccountGrantExhausted",
            Reason::ReqNodeNotAvail => "ReqNodeNotAvail",
            Reason::Reservation => "Reservation",
            Reason::ReservationDeleted => "ReservationDeleted",
        }
    }

    /// The job could start if resources allowed: the scheduler considers it (Maui's "idle"
    /// part of the queue). Everything else is blocked by a rule, a hold or time.
    pub fn is_eligible(self) -> bool {
        matches!(self, Reason::None | Reason::Resources | Reason::Priority)
    }

    /// Maui's soft MAXPS is the one block that the scheduler may lift, when nothing else is
    /// eligible.
    pub fn is_soft(self) -> bool {
        matches!(self, Reason::MaxPsSoftLimit)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_match_slurm() {
        let codes: Vec<&str> = JobState::ALL.iter().map(|s| s.code()).collect();
        assert_eq!(
            codes,
            [
                "PD", "R", "S", "CG", "CD", "F", "CA", "TO", "OOM", "NF", "PR"
            ]
        );
        for st in JobState::ALL {
            assert_eq!(JobState::parse(st.code()), Some(st));
            assert_eq!(JobState::parse(&st.name().to_lowercase()), Some(st));
        }
        assert_eq!(JobState::parse("XX"), None);
    }

    #[test]
    fn terminal_and_resource_holding_states_partition_the_live_ones() {
        for st in JobState::ALL {
            if st.holds_resources() {
                assert!(!st.is_terminal(), "{st}");
            }
        }
        assert!(!JobState::Pending.is_terminal());
        assert!(!JobState::Pending.holds_resources());
        assert!(JobState::Suspended.holds_resources());
    }

    #[test]
    fn only_scheduler_reasons_are_eligible() {
        assert!(Reason::Priority.is_eligible());
        assert!(!Reason::MaxIdleJobsPerUser.is_eligible());
        assert!(!Reason::MaxPsSoftLimit.is_eligible());
        assert!(Reason::MaxPsSoftLimit.is_soft());
        assert_eq!(Reason::MaxPsSoftLimit.to_string(), "MaxPSSoftLimit");
    }
}
