//! Partitions (PBS queues): named, possibly overlapping sets of nodes with their own
//! policies: priority tier and factor, time limits, preemption, charging and who may use them.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::ids::{AccountName, NodeName, PartitionName, QosName};
use crate::quantity::{MiB, Seconds};

/// What happens to a job another job preempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PreemptMode {
    /// Never preempted.
    Off,
    /// Frozen, keeping its memory and jobfs; resumed later (NCI).
    Suspend,
    /// Killed and put back in the queue.
    Requeue,
    /// Killed.
    Cancel,
}

/// A rate in thousandths, kept integral so every replica computes charges identically.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Milli(pub u32);

impl Milli {
    pub const ONE: Milli = Milli(1000);
    pub const ZERO: Milli = Milli(0);

    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / 1000.0
    }
}

/// Per-user limits on one partition (Slurm's partition QOS in spirit).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionLimits {
    pub max_jobs_per_user: Option<u32>,
    /// Jobs a user may have queued or running in the partition; more are refused.
    pub max_submit_jobs_per_user: Option<u32>,
    pub max_cpus_per_user: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    pub name: PartitionName,
    pub nodes: BTreeSet<NodeName>,
    /// Jobs without `-p` go to the default partition.
    pub is_default: bool,
    /// A down partition queues jobs but starts none.
    pub up: bool,
    /// Considered before lower tiers regardless of job priority; preempts lower tiers.
    pub priority_tier: u32,
    /// The partition factor of multifactor priority (normalized by the largest).
    pub priority_job_factor: u32,
    pub default_time: Option<Seconds>,
    /// `None` = UNLIMITED.
    pub max_time: Option<Seconds>,
    pub max_nodes: Option<u32>,
    pub def_mem_per_cpu: Option<MiB>,
    pub preempt_mode: PreemptMode,
    /// Service units per cpu-hour (NCI: express 3, normal 1, bonus 0).
    pub charge_rate: Milli,
    /// Multiplier on fair-share usage; 0 = not charged to fair-share (IT4I's qexp).
    pub usage_factor: Milli,
    /// How held resources are weighed into fair-share billing (`TRESBillingWeights`).
    pub billing: crate::tres::BillingWeights,
    pub allowed_qos: Option<BTreeSet<QosName>>,
    pub allowed_accounts: Option<BTreeSet<AccountName>>,
    pub default_qos: Option<QosName>,
    pub limits: PartitionLimits,
}

impl Partition {
    /// A plain partition: tier 1, factor 1, unlimited time, charge and usage rate 1.
    pub fn new(name: PartitionName, nodes: BTreeSet<NodeName>) -> Partition {
        Partition {
            name,
            nodes,
            is_default: false,
            up: true,
            priority_tier: 1,
            priority_job_factor: 1,
            default_time: None,
            max_time: None,
            max_nodes: None,
            def_mem_per_cpu: None,
            preempt_mode: PreemptMode::Off,
            charge_rate: Milli::ONE,
            usage_factor: Milli::ONE,
            billing: crate::tres::BillingWeights::default(),
            allowed_qos: None,
            allowed_accounts: None,
            default_qos: None,
            limits: PartitionLimits::default(),
        }
    }

    pub fn allows_qos(&self, qos: &QosName) -> bool {
        self.allowed_qos
            .as_ref()
            .is_none_or(|set| set.contains(qos))
    }

    pub fn allows_account(&self, account: &AccountName) -> bool {
        self.allowed_accounts
            .as_ref()
            .is_none_or(|set| set.contains(account))
    }
}
