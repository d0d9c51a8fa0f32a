//! What the scheduling loops did, for `sdiag`-style diagnostics and the metrics.
//!
//! Kept by the leader (a follower's figures stop at its last term as leader). Every pass
//! records its duration, how many jobs it considered (its depth), how many it started, and
//! why it stopped early if it did; the same figures go to the `/metrics` families
//! `docket_sched_pass_*`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// The kinds of pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PassKind {
    Direct,
    Main,
    Backfill,
}

impl PassKind {
    pub const ALL: [PassKind; 3] = [PassKind::Direct, PassKind::Main, PassKind::Backfill];

    pub fn name(self) -> &'static str {
        match self {
            PassKind::Direct => "direct",
            PassKind::Main => "main",
            PassKind::Backfill => "backfill",
        }
    }
}

/// Why a pass stopped before the end of its order (the `reason` label of
/// `docket_sched_pass_yields_total`): leadership lost, RPC pressure (`max_rpc_cnt`), or its
/// time budget (`max_sched_time`, `bf_yield_interval`).
pub const STOPPED_BY_LEADERSHIP: &str = "leadership lost";
pub const STOPPED_BY_RPC_PRESSURE: &str = "rpc pressure";
pub const STOPPED_BY_TIME: &str = "time";
pub const STOP_REASONS: [&str; 3] = [
    STOPPED_BY_LEADERSHIP,
    STOPPED_BY_RPC_PRESSURE,
    STOPPED_BY_TIME,
];

/// Figures of one kind of pass.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PassStats {
    pub runs: u64,
    pub total_us: u64,
    pub max_us: u64,
    pub last_us: u64,
    /// Jobs considered by the last pass and the most by any.
    pub last_depth: u64,
    pub max_depth: u64,
    pub jobs_started: u64,
    /// Passes that stopped before the end of their order, by why: `time`, `rpc pressure`,
    /// `leadership lost`.
    pub stopped_early: BTreeMap<&'static str, u64>,
}

impl PassStats {
    pub fn mean_us(&self) -> u64 {
        self.total_us.checked_div(self.runs).unwrap_or(0)
    }
}

/// Every kind of pass.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoopStats {
    pub passes: BTreeMap<PassKind, PassStats>,
    /// Terms this replica has led (scheduling loops started).
    pub leaderships: u64,
    /// Backfill cycles ended after a yield because the state changed meanwhile (without
    /// `bf_continue`; the next cycle starts over from the top of the order).
    pub backfill_state_changed: u64,
    /// The last leaders this replica saw come to power, oldest first (the status page's
    /// failovers), at most [`LEADERS_KEPT`].
    pub leaders_seen: std::collections::VecDeque<LeaderSeen>,
}

/// How many leader changes [`LoopStats::leaders_seen`] keeps.
pub const LEADERS_KEPT: usize = 10;

/// A leader this replica saw come to power.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LeaderSeen {
    /// Wall-clock milliseconds since the epoch, on this replica.
    pub at_ms: u64,
    pub leader: u64,
    pub term: u64,
}

impl LoopStats {
    /// Records a leader seen coming to power.
    pub fn leader_seen(&mut self, seen: LeaderSeen) {
        if self.leaders_seen.len() == LEADERS_KEPT {
            self.leaders_seen.pop_front();
        }
        self.leaders_seen.push_back(seen);
    }

    /// Records a backfill cycle that ended after a yield because the state changed.
    pub fn backfill_state_changed(&mut self) {
        self.backfill_state_changed += 1;
        metrics::counter!("docket_sched_backfill_state_changed_total").increment(1);
    }

    /// Records one pass.
    pub fn record(
        &mut self,
        kind: PassKind,
        took: Duration,
        considered: u64,
        started: u64,
        stopped_by: Option<&'static str>,
    ) {
        let us = took.as_micros() as u64;
        let s = self.passes.entry(kind).or_default();
        s.runs += 1;
        s.total_us += us;
        s.max_us = s.max_us.max(us);
        s.last_us = us;
        s.last_depth = considered;
        s.max_depth = s.max_depth.max(considered);
        s.jobs_started += started;
        let pass = kind.name();
        metrics::histogram!("docket_sched_pass_duration_seconds", "pass" => pass)
            .record(took.as_secs_f64());
        metrics::gauge!("docket_sched_pass_depth", "pass" => pass).set(considered as f64);
        metrics::counter!("docket_sched_jobs_started_total", "pass" => pass).increment(started);
        if let Some(why) = stopped_by {
            *s.stopped_early.entry(why).or_default() += 1;
            metrics::counter!("docket_sched_pass_yields_total", "pass" => pass, "reason" => why)
                .increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_accumulate_by_kind() {
        let mut s = LoopStats::default();
        s.record(PassKind::Main, Duration::from_millis(10), 100, 3, None);
        s.record(
            PassKind::Main,
            Duration::from_millis(30),
            50,
            1,
            Some("time"),
        );
        s.record(
            PassKind::Backfill,
            Duration::from_millis(5),
            7,
            0,
            Some("rpc pressure"),
        );
        let main = &s.passes[&PassKind::Main];
        assert_eq!(
            (main.runs, main.mean_us(), main.max_us),
            (2, 20_000, 30_000)
        );
        assert_eq!(
            (main.last_depth, main.max_depth, main.jobs_started),
            (50, 100, 4)
        );
        assert_eq!(main.stopped_early.get("time"), Some(&1));
        assert_eq!(
            s.passes[&PassKind::Backfill]
                .stopped_early
                .get("rpc pressure"),
            Some(&1)
        );
    }
}
