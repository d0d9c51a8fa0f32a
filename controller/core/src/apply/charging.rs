//! Usage and charging: what running jobs cost their owners.
//!
//! Two ledgers, fed by the same run time:
//! - fair-share usage (billing-seconds of the resources held, weighed by the partition's
//!   `TRESBillingWeights`, x the partition's and the QOS's usage factors), accrued while a
//!   job runs (on every tick and at its end), decayed with the half-life;
//! - service units (NCI's PBS job scheduling documentation): walltime in the running state x cpus requested x the
//!   queue's charge rate, charged to the project's grant when the job ends. A project whose
//!   grant is spent runs only as bonus: its jobs move to the bonus QOS and are not charged.

use crate::ids::JobId;
use crate::quantity::TimeMs;
use crate::state::State;
use crate::usage::Accrual;

impl State {
    /// Accrues fair-share usage of every running job up to `now`.
    pub(crate) fn accrue_all_usage(&mut self, now: TimeMs) {
        let running: Vec<JobId> = self.holding.iter().copied().collect();
        for id in running {
            self.accrue_usage(id, now);
        }
    }

    /// Accrues one job's fair-share usage since it was last accrued.
    pub(crate) fn accrue_usage(&mut self, id: JobId, now: TimeMs) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let Some(since) = job.usage_until else {
            return;
        };
        job.usage_until = Some(now.max(since));
        if job.suspended_since.is_some() {
            return; // a frozen job uses no cpu
        }
        let seconds = now.ms_since(since) as f64 / 1000.0;
        let tres = job.tres_held();
        let partition = self.partitions.get(&job.resolved.partition);
        let weights = partition.map(|p| p.billing).unwrap_or_default();
        let partition_factor = partition.map_or(1.0, |p| p.usage_factor.as_f64());
        let qos_factor = self
            .qos
            .get(&job.resolved.qos)
            .map_or(1.0, |q| q.usage_factor.as_f64());
        let accrual = Accrual {
            billing: seconds * weights.billing(&tres) * partition_factor * qos_factor,
            seconds,
            tres,
        };
        let half_life = self.config.fairshare.half_life;
        self.usage.accrue(
            &job.resolved.account,
            &job.spec.user,
            accrual,
            now,
            half_life,
        );
    }

    /// Charges a job's service units to its project's grant (at its end).
    pub(crate) fn charge(&mut self, id: JobId, now: TimeMs) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        if self.config.bonus_qos.as_ref() == Some(&job.resolved.qos) {
            return;
        }
        let rate = self
            .partitions
            .get(&job.resolved.partition)
            .map_or(1000, |p| u64::from(p.charge_rate.0));
        let milli_su = service_units_milli(job.run_time(now).0, job.cpus(), rate);
        let account = job.resolved.account.clone();
        if let Some(grant) = self
            .accounts
            .accounts
            .get_mut(&account)
            .and_then(|a| a.grant.as_mut())
        {
            grant.used_milli_su = grant.used_milli_su.saturating_add(milli_su);
        }
    }
}

/// Thousandths of a service unit: run seconds x cpus x rate (in thousandths) / 3600.
/// One SU is one cpu-hour at rate 1.
pub fn service_units_milli(run_secs: u64, cpus: u64, rate_milli: u64) -> u64 {
    u128::from(run_secs)
        .checked_mul(u128::from(cpus))
        .and_then(|p| p.checked_mul(u128::from(rate_milli)))
        .and_then(|p| u64::try_from(p / 3600).ok())
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCI: SUs = walltime x cpus requested x queue rate (express 3, normal 1, bonus 0).
    #[test]
    fn service_units_follow_the_nci_formula() {
        // 2 hours on 16 cpus in express: 2 x 16 x 3 = 96 SU.
        assert_eq!(service_units_milli(7200, 16, 3000), 96_000);
        assert_eq!(service_units_milli(7200, 16, 1000), 32_000);
        assert_eq!(service_units_milli(7200, 16, 0), 0);
        // 90 s on 1 cpu at rate 1: 0.025 SU.
        assert_eq!(service_units_milli(90, 1, 1000), 25);
        assert_eq!(service_units_milli(u64::MAX, u64::MAX, 3000), u64::MAX);
    }
}
