//! Quality of service: a priority, limits, a usage factor, and the right to preempt.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::ids::QosName;
use crate::partition::{Milli, PreemptMode};
use crate::quantity::Seconds;

/// Slurm-style per-user and group limits of a QOS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosLimits {
    pub max_wall: Option<Seconds>,
    pub max_jobs_per_user: Option<u32>,
    pub max_submit_jobs_per_user: Option<u32>,
    pub max_cpus_per_user: Option<u64>,
    /// GrpTRESRunMins=cpu: cpu-minutes still to run, summed over the QOS's running jobs.
    pub grp_cpu_run_mins: Option<u64>,
    /// GrpJobs: running jobs of the whole QOS.
    pub grp_jobs: Option<u32>,
    /// GrpTRES=cpu: running cpus of the whole QOS.
    pub grp_cpus: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qos {
    pub name: QosName,
    /// The QOS factor of multifactor priority (normalized by the largest).
    pub priority: u32,
    /// QOSes whose jobs this one may preempt.
    pub preempt: BTreeSet<QosName>,
    pub preempt_mode: PreemptMode,
    /// Multiplier on fair-share usage.
    pub usage_factor: Milli,
    /// Maui: the queue time this QOS aims for; priority grows exponentially as a job nears it.
    pub target_queue_time: Option<Seconds>,
    pub limits: QosLimits,
}

impl Qos {
    pub fn new(name: QosName) -> Qos {
        Qos {
            name,
            priority: 0,
            preempt: BTreeSet::new(),
            preempt_mode: PreemptMode::Off,
            usage_factor: Milli::ONE,
            target_queue_time: None,
            limits: QosLimits::default(),
        }
    }
}
