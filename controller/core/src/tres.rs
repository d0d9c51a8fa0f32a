//! Trackable resources (Slurm's TRES): what a running job holds, and what it is billed.
//!
//! Fair-share usage is not only cpu-seconds: a job that takes a node's whole memory on one
//! cpu, or a GPU, keeps others off as surely as one that takes its cpus. As in Slurm, each
//! partition weighs the resources a job holds into one *billing* figure
//! (`TRESBillingWeights=CPU=1.0,Mem=0.25G,GRES/gpu=2.0`), and fair-share usage is billing x
//! seconds. The ledger also keeps each resource's own seconds, decayed alike, for reports.
//! The default weights (cpu 1, memory 0, gpu 0) make billing exactly cpu-seconds.

use serde::{Deserialize, Serialize};

use crate::partition::Milli;
use crate::quantity::MiB;

/// Resources held by one job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tres {
    pub cpus: u64,
    pub memory: MiB,
    pub gpus: u64,
}

/// How a partition weighs resources into billing (thousandths: 1000 = weight 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BillingWeights {
    /// Per cpu.
    pub cpu: Milli,
    /// Per GiB of memory.
    pub mem_per_gib: Milli,
    /// Per GPU.
    pub gpu: Milli,
    /// Slurm's `PriorityFlags=MAX_TRES`: bill the largest weighted resource, not the sum.
    pub max_tres: bool,
}

impl Default for BillingWeights {
    fn default() -> Self {
        BillingWeights {
            cpu: Milli::ONE,
            mem_per_gib: Milli::ZERO,
            gpu: Milli::ZERO,
            max_tres: false,
        }
    }
}

impl BillingWeights {
    /// The billing of holding `tres`.
    pub fn billing(&self, tres: &Tres) -> f64 {
        let parts = [
            self.cpu.as_f64() * tres.cpus as f64,
            self.mem_per_gib.as_f64() * tres.memory.0 as f64 / 1024.0,
            self.gpu.as_f64() * tres.gpus as f64,
        ];
        if self.max_tres {
            parts.into_iter().fold(0.0, f64::max)
        } else {
            parts.into_iter().sum()
        }
    }

    /// [`Self::billing`] in thousandths, exactly (integer arithmetic: the weights are
    /// thousandths already; memory rounds down to a thousandth), as replicated state keeps it.
    pub fn billing_milli(&self, tres: &Tres) -> u64 {
        let parts = [
            u128::from(self.cpu.0) * u128::from(tres.cpus),
            u128::from(self.mem_per_gib.0) * u128::from(tres.memory.0) / 1024,
            u128::from(self.gpu.0) * u128::from(tres.gpus),
        ];
        let total = if self.max_tres {
            parts.into_iter().max().unwrap_or(0)
        } else {
            parts.into_iter().sum()
        };
        u64::try_from(total).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_billing_is_cpus() {
        let t = Tres {
            cpus: 8,
            memory: MiB::gib(64),
            gpus: 2,
        };
        assert_eq!(BillingWeights::default().billing(&t), 8.0);
    }

    /// With the weights of Slurm's `TRESBillingWeights` example (CPU=1.0,Mem=0.25G,
    /// GRES/gpu=2.0), a job holding 2 cpus, 4 GiB and 1 GPU bills 2 + 1 + 2 = 5 summed, and
    /// 2 with MAX_TRES.
    #[test]
    fn weights_sum_or_take_the_largest() {
        let mut w = BillingWeights {
            cpu: Milli(1000),
            mem_per_gib: Milli(250),
            gpu: Milli(2000),
            max_tres: false,
        };
        let t = Tres {
            cpus: 2,
            memory: MiB::gib(4),
            gpus: 1,
        };
        assert_eq!(w.billing(&t), 5.0);
        assert_eq!(w.billing_milli(&t), 5000);
        w.max_tres = true;
        assert_eq!(w.billing(&t), 2.0);
        assert_eq!(w.billing_milli(&t), 2000);
    }

    /// Kept in integers: 0.58 x 50 cpus is 29 exactly (in floating point, 28.999...).
    #[test]
    fn billing_in_thousandths_is_exact() {
        let w = BillingWeights {
            cpu: Milli(580),
            ..BillingWeights::default()
        };
        let t = Tres {
            cpus: 50,
            memory: MiB(0),
            gpus: 0,
        };
        assert_eq!(w.billing_milli(&t), 29_000);
        let huge = Tres {
            cpus: u64::MAX,
            memory: MiB(u64::MAX),
            gpus: u64::MAX,
        };
        assert_eq!(BillingWeights::default().billing_milli(&huge), u64::MAX);
    }
}
