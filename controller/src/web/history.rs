//! The status page's plots: what this replica saw over the last hours, sampled at a fixed
//! interval (a minute by default, `--history-interval-ms`) into a bounded ring.
//!
//! Each sample holds running totals (job ids issued, jobs the passes started, the passes'
//! time and count) and levels (busy and total cpus, pending and running jobs), so the rates
//! between two samples are exact whatever the interval. Kept in memory on each replica,
//! never replicated: a replica that restarts starts its plots afresh, and a follower's
//! starts and pass times stay flat (only a leader runs passes).

use std::collections::VecDeque;

use docket_core::State;
use docket_core::job::JobState;

use crate::stats::LoopStats;

/// Samples kept: six hours at one a minute.
pub const KEEP: usize = 360;

/// One sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    pub at_ms: u64,
    pub busy_cpus: u64,
    pub total_cpus: u64,
    pub pending: u64,
    pub running: u64,
    /// Job ids issued so far (submissions, array tasks split off).
    pub submitted: u64,
    /// Jobs the passes started, all kinds of pass.
    pub started: u64,
    pub pass_us: u64,
    pub pass_runs: u64,
}

impl Sample {
    /// What `state` and `loops` say at `at_ms`.
    pub fn of(state: &State, loops: &LoopStats, at_ms: u64) -> Sample {
        let mut s = Sample {
            at_ms,
            submitted: state.next_job_id.saturating_sub(1),
            ..Sample::default()
        };
        for n in state.nodes.values() {
            s.busy_cpus += u64::from(n.used_cpus());
            s.total_cpus += u64::from(n.spec.cpus);
        }
        for j in state.jobs.values() {
            match j.state {
                JobState::Pending => s.pending += j.pending_count(),
                st if st.holds_resources() => s.running += 1,
                _ => {}
            }
        }
        for p in loops.passes.values() {
            s.started += p.jobs_started;
            s.pass_us += p.total_us;
            s.pass_runs += p.runs;
        }
        s
    }
}

/// The ring of samples.
#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<Sample>,
}

/// One plot, ready to draw: an SVG polyline's points in a 300 x 60 box.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    pub id: &'static str,
    pub title: &'static str,
    pub points: String,
    pub last: String,
    pub max: String,
}

impl History {
    pub fn push(&mut self, s: Sample) {
        if self.samples.len() == KEEP {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The plots, oldest sample on the left. Rates need two samples; with fewer, the plots
    /// have no points. Where jobs are private, only utilization and pass durations (no
    /// counts of jobs).
    pub fn plots_for(&self, jobs_private: bool) -> Vec<Plot> {
        let mut plots = self.plots();
        if jobs_private {
            plots.retain(|p| matches!(p.id, "utilization" | "pass-ms"));
        }
        plots
    }

    /// Every plot.
    pub fn plots(&self) -> Vec<Plot> {
        let levels =
            |f: &dyn Fn(&Sample) -> f64| -> Vec<f64> { self.samples.iter().map(f).collect() };
        let rates = |f: &dyn Fn(&Sample, &Sample) -> f64| -> Vec<f64> {
            self.samples
                .iter()
                .zip(self.samples.iter().skip(1))
                .map(|(a, b)| f(a, b))
                .collect()
        };
        let per_minute = |a: u64, b: u64, from: &Sample, to: &Sample| {
            let minutes = to.at_ms.saturating_sub(from.at_ms) as f64 / 60_000.0;
            if minutes > 0.0 {
                b.saturating_sub(a) as f64 / minutes
            } else {
                0.0
            }
        };
        vec![
            plot(
                "utilization",
                "Utilization (% of cpus busy)",
                levels(&|s| {
                    if s.total_cpus == 0 {
                        0.0
                    } else {
                        100.0 * s.busy_cpus as f64 / s.total_cpus as f64
                    }
                }),
            ),
            plot("pending", "Jobs pending", levels(&|s| s.pending as f64)),
            plot("running", "Jobs running", levels(&|s| s.running as f64)),
            plot(
                "submissions",
                "Submissions per minute",
                rates(&|a, b| per_minute(a.submitted, b.submitted, a, b)),
            ),
            plot(
                "starts",
                "Starts per minute",
                rates(&|a, b| per_minute(a.started, b.started, a, b)),
            ),
            plot(
                "pass-ms",
                "Mean pass duration (ms)",
                rates(&|a, b| {
                    let runs = b.pass_runs.saturating_sub(a.pass_runs);
                    if runs == 0 {
                        0.0
                    } else {
                        b.pass_us.saturating_sub(a.pass_us) as f64 / runs as f64 / 1000.0
                    }
                }),
            ),
        ]
    }
}

fn plot(id: &'static str, title: &'static str, values: Vec<f64>) -> Plot {
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    let scale = if max > 0.0 { max } else { 1.0 };
    let n = values.len();
    let points = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let x = if n > 1 {
                300.0 * i as f64 / (n - 1) as f64
            } else {
                0.0
            };
            let y = 58.0 - 56.0 * v / scale;
            format!("{x:.1},{y:.1}")
        })
        .collect::<Vec<_>>()
        .join(" ");
    let show = |v: f64| {
        if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    };
    Plot {
        id,
        title,
        points,
        last: values.last().map_or_else(String::new, |v| show(*v)),
        max: show(max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(minute: u64, submitted: u64, started: u64, busy: u64) -> Sample {
        Sample {
            at_ms: minute * 60_000,
            busy_cpus: busy,
            total_cpus: 8,
            pending: 3,
            running: busy,
            submitted,
            started,
            pass_us: minute * 2_000,
            pass_runs: minute,
        }
    }

    #[test]
    fn rates_come_from_totals_between_samples_and_the_ring_is_bounded() {
        let mut h = History::default();
        h.push(sample(0, 0, 0, 0));
        h.push(sample(1, 30, 10, 4));
        h.push(sample(3, 90, 50, 8));
        let plots = h.plots();
        let by = |id: &str| plots.iter().find(|p| p.id == id).unwrap().clone();
        assert_eq!(by("submissions").last, "30.0", "60 over two minutes");
        assert_eq!(by("submissions").max, "30.0");
        assert_eq!(by("starts").last, "20.0");
        assert_eq!(by("starts").max, "20.0");
        assert_eq!(by("utilization").last, "100");
        assert_eq!(by("pass-ms").last, "2.0");
        assert_eq!(by("utilization").points.split(' ').count(), 3);
        assert_eq!(by("starts").points, "0.0,30.0 300.0,2.0");
        for m in 0..(KEEP as u64 + 10) {
            h.push(sample(m, m, m, 1));
        }
        assert_eq!(h.len(), KEEP);
    }
}
