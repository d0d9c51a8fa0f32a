//! Preemption (NCI's PBS job scheduling documentation): who may take whose cpus, and which victims suit best.
//!
//! - *Priority-run*: a job whose partition has a higher priority tier (NCI's express over
//!   normal), or whose QOS lists the victim's QOS as preemptable, may preempt it, in the
//!   mode of the victim's QOS (if it names one) or partition.
//! - *Parallel-run*: at the same tier, a job at least `min_size_ratio` times larger may
//!   suspend smaller jobs when the suspension score allows it.
//!
//! The suspension score weighs, for one preemptor and one victim: the victim's expansion
//! factor if suspended now for the preemptor's time limit (kept near 1, at most 1.25),
//! how much of the victim is done (jobs near completion are spared), how many jobs the two
//! owners run (the owner with many running jobs is the target), and how long the preemptor
//! has waited relative to its own time limit, plus its bypass count (a job passed over again
//! and again gains score until it must start: nobody starves). Positive = may suspend;
//! higher = better victim.
//!
//! Suspended jobs keep their memory and jobfs; their walltime stops; they resume when their
//! cpus are free again.

use serde::{Deserialize, Serialize};

use crate::job::{Job, JobState};
use crate::partition::PreemptMode;
use crate::quantity::TimeMs;
use crate::state::State;

/// NCI's parallel-run: large jobs suspending smaller ones at the same run priority.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParallelRun {
    /// The preemptor must ask for at least this many times the victim's cpus.
    pub min_size_ratio: u32,
    /// The largest expansion factor a victim may reach by being suspended (NCI: 1.25).
    pub max_expansion: f64,
    /// Weights of the score's terms.
    pub weight_expansion: f64,
    pub weight_done: f64,
    pub weight_running: f64,
    pub weight_wait: f64,
    pub weight_bypass: f64,
}

impl Default for ParallelRun {
    fn default() -> Self {
        ParallelRun {
            min_size_ratio: 4,
            max_expansion: 1.25,
            weight_expansion: 4.0,
            weight_done: 1.0,
            weight_running: 0.5,
            weight_wait: 1.0,
            weight_bypass: 0.1,
        }
    }
}

/// Preemption settings (replicated config).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PreemptConfig {
    /// `None`: no parallel-run (priority-run still applies where tiers or QOS allow).
    pub parallel_run: Option<ParallelRun>,
}

impl State {
    /// How `victim` may be preempted for `preemptor`, if it may (ignoring resources).
    pub fn preempt_mode(&self, preemptor: &Job, victim: &Job, now: TimeMs) -> Option<PreemptMode> {
        if victim.state != JobState::Running || victim.id == preemptor.id {
            return None;
        }
        let tier = |j: &Job| {
            self.partitions
                .get(&j.resolved.partition)
                .map_or(0, |p| p.priority_tier)
        };
        let victim_partition_mode = self
            .partitions
            .get(&victim.resolved.partition)
            .map_or(PreemptMode::Off, |p| p.preempt_mode);
        let victim_qos = self.qos.get(&victim.resolved.qos);
        let by_qos = self
            .qos
            .get(&preemptor.resolved.qos)
            .is_some_and(|q| q.preempt.contains(&victim.resolved.qos));
        let mode = if by_qos {
            victim_qos
                .map(|q| q.preempt_mode)
                .filter(|m| *m != PreemptMode::Off)
                .unwrap_or(victim_partition_mode)
        } else if tier(preemptor) > tier(victim) {
            victim_partition_mode
        } else if tier(preemptor) == tier(victim)
            && victim_partition_mode == PreemptMode::Suspend
            && let Some(pr) = &self.config.preempt.parallel_run
            && preemptor.cpus() >= u64::from(pr.min_size_ratio).saturating_mul(victim.cpus())
            && self.suspension_score(preemptor, victim, now) > 0.0
        {
            PreemptMode::Suspend
        } else {
            PreemptMode::Off
        };
        (mode != PreemptMode::Off).then_some(mode)
    }

    /// How suitable `victim` is to suspend for `preemptor` (see the module docs).
    pub fn suspension_score(&self, preemptor: &Job, victim: &Job, now: TimeMs) -> f64 {
        let w = self.config.preempt.parallel_run.clone().unwrap_or_default();
        let secs = |j: &Job| {
            j.resolved
                .time_limit
                .map_or(f64::MAX, |t| t.0.max(1) as f64)
        };
        let limit_v = secs(victim);
        let limit_p = secs(preemptor);
        let suspended_v = (victim.suspended_total.0) as f64;
        let expansion = (limit_v + suspended_v + limit_p.min(1e12)) / limit_v;
        let done = (victim.run_time(now).0 as f64 / limit_v).clamp(0.0, 1.0);
        let running = |user: &crate::ids::UserName| {
            self.live_jobs_of(user)
                .filter(|j| j.state == JobState::Running)
                .count() as f64
        };
        let owners =
            ((1.0 + running(&victim.spec.user)) / (1.0 + running(&preemptor.spec.user))).ln();
        let waited = preemptor.eligible_time(now).0 as f64 / limit_p;
        w.weight_expansion * (w.max_expansion - expansion)
            + w.weight_done * (0.5 - done)
            + w.weight_running * owners
            + w.weight_wait * waited
            + w.weight_bypass * f64::from(preemptor.bypass_count)
    }
}
