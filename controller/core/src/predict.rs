//! Runtime predictions: how long a job is expected to run, for planning only.
//!
//! Users' time limits are poor estimates: most jobs use a small fraction of their limit, so
//! reservations made on limits sit far in the future and backfill picks by the wrong
//! numbers. Tsafrir, Etsion and Feitelson ("Backfilling using system-generated predictions
//! rather than user runtime estimates", IEEE TPDS 18(6), 2007) showed that a very simple
//! predictor does much better: the average run time of the same user's two most recent
//! jobs, never above the job's own limit. Their scheduler, EASY++, plans with that
//! prediction and backfills shortest-predicted first, while the limit alone still ends the
//! job: users see EASY's behaviour, only better packed.
//!
//! A prediction can be too short. Then the job is not killed; its prediction is corrected
//! upwards the moment it is proven wrong, in growing steps ([`CORRECTION_STEPS`]), never
//! above the limit, and every plan that depended on it is made again (plans are recomputed
//! from the state on every pass, so the next pass sees the corrected end).
//!
//! Everything here is a pure function of replicated fields (each user's last two run times,
//! kept in the state; the prediction stored on the job at submission; its run time so far),
//! so every replica and every replay predicts the same.

use serde::{Deserialize, Serialize};

use crate::job::{Job, JobState};
use crate::quantity::{Seconds, TimeMs};

/// How the planners estimate a job's run time (`SchedulerParameters.runtime_predictor`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuntimePredictor {
    /// The job's time limit, as Slurm, PBS and Maui plan (`time_limit`).
    #[default]
    TimeLimit,
    /// EASY++'s predictor: the average run time of the user's last two jobs that ran to
    /// their end, capped by the limit (`recent_average`).
    RecentAverage,
}

/// The run times of a user's most recent jobs that ran to their own end (exited, hit their
/// limit, ran out of memory or jobfs), newest first. Two are kept: that is all the predictor
/// reads, so the history per user is bounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecentRuntimes {
    newest: Option<Seconds>,
    previous: Option<Seconds>,
}

impl RecentRuntimes {
    /// Records a job's run time as the newest.
    pub fn record(&mut self, run: Seconds) {
        self.previous = self.newest;
        self.newest = Some(run);
    }

    /// The average of the (at most two) run times kept, rounded up; `None` without history.
    pub fn average(&self) -> Option<Seconds> {
        match (self.newest, self.previous) {
            (Some(a), Some(b)) => Some(Seconds((a.0 + b.0).div_ceil(2))),
            (Some(a), None) => Some(a),
            _ => None,
        }
    }
}

/// The prediction for a job submitted now: the user's recent average, at least one second
/// and never above the limit; `None` (plan on the limit) without history or with the
/// time-limit predictor.
pub fn predict(
    predictor: RuntimePredictor,
    history: Option<&RecentRuntimes>,
    limit: Option<Seconds>,
) -> Option<Seconds> {
    match predictor {
        RuntimePredictor::TimeLimit => None,
        RuntimePredictor::RecentAverage => {
            let average = history?.average()?.max(Seconds(1));
            Some(limit.map_or(average, |l| average.min(l)))
        }
    }
}

/// What a too-short prediction grows by, step after step, once the job outlives it: one
/// minute, then 5, 15 and 30 minutes, then 1, 2, 5, 10, 20, 50 and 100 hours (the last
/// step repeats). Small first, since most underpredicted jobs end soon after; large later,
/// so a long job is not re-planned every few minutes.
pub const CORRECTION_STEPS: [Seconds; 11] = [
    Seconds::minutes(1),
    Seconds::minutes(5),
    Seconds::minutes(15),
    Seconds::minutes(30),
    Seconds::hours(1),
    Seconds::hours(2),
    Seconds::hours(5),
    Seconds::hours(10),
    Seconds::hours(20),
    Seconds::hours(50),
    Seconds::hours(100),
];

/// The prediction corrected for a job that has run `elapsed` so far: the smallest
/// `predicted + steps` (see [`CORRECTION_STEPS`]) above `elapsed`, never above `limit`.
/// Unchanged while the job has not outlived it.
pub fn corrected(predicted: Seconds, elapsed: Seconds, limit: Option<Seconds>) -> Seconds {
    let mut p = predicted;
    let mut k = 0usize;
    while p <= elapsed {
        let step = CORRECTION_STEPS[k.min(CORRECTION_STEPS.len() - 1)];
        p += step;
        k += 1;
        if limit.is_some_and(|l| p >= l) {
            break;
        }
    }
    limit.map_or(p, |l| p.min(l))
}

impl Job {
    /// How long the planners expect this job to run in all (`None` = for ever): its
    /// prediction, corrected if it has outlived it, else its time limit.
    pub fn expected_runtime(&self, now: TimeMs) -> Option<Seconds> {
        let limit = self.resolved.time_limit;
        let Some(predicted) = self.predicted else {
            return limit;
        };
        if self.state == JobState::Pending {
            // The limit may have been lowered since the prediction was made.
            return Some(limit.map_or(predicted, |l| predicted.min(l)));
        }
        Some(corrected(predicted, self.run_time(now), limit))
    }

    /// When a running job's current prediction runs out (`None` without one, or once it is
    /// the limit): the instant a replay re-plans, since the corrected end may open room.
    pub fn prediction_expires(&self, now: TimeMs) -> Option<TimeMs> {
        let predicted = self.predicted?;
        let start = self.start_time?;
        let expected = corrected(predicted, self.run_time(now), self.resolved.time_limit);
        if self.resolved.time_limit.is_some_and(|l| expected >= l) {
            return None;
        }
        // Suspension stops the clock; a suspended job's end is unknown anyway.
        (self.state == JobState::Running && self.suspended_total == Seconds::ZERO)
            .then(|| start.plus(expected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_of_the_last_two() {
        let mut h = RecentRuntimes::default();
        assert_eq!(h.average(), None);
        h.record(Seconds(100));
        assert_eq!(h.average(), Some(Seconds(100)));
        h.record(Seconds(301));
        assert_eq!(h.average(), Some(Seconds(201)));
        h.record(Seconds(1));
        // The oldest (100) is forgotten.
        assert_eq!(h.average(), Some(Seconds(151)));
    }

    #[test]
    fn a_prediction_never_exceeds_the_limit() {
        let mut h = RecentRuntimes::default();
        h.record(Seconds(7200));
        let p = |limit| predict(RuntimePredictor::RecentAverage, Some(&h), limit);
        assert_eq!(p(Some(Seconds(3600))), Some(Seconds(3600)));
        assert_eq!(p(Some(Seconds(86_400))), Some(Seconds(7200)));
        assert_eq!(p(None), Some(Seconds(7200)));
        assert_eq!(
            predict(RuntimePredictor::TimeLimit, Some(&h), Some(Seconds(60))),
            None
        );
        assert_eq!(
            predict(RuntimePredictor::RecentAverage, None, Some(Seconds(60))),
            None
        );
        // Jobs that ran 0 s predict 1 s: a job always holds its nodes for a moment.
        let mut z = RecentRuntimes::default();
        z.record(Seconds(0));
        assert_eq!(
            predict(RuntimePredictor::RecentAverage, Some(&z), None),
            Some(Seconds(1))
        );
    }

    #[test]
    fn an_outlived_prediction_grows_by_steps_up_to_the_limit() {
        let limit = Some(Seconds::hours(10));
        // Not outlived: unchanged.
        assert_eq!(corrected(Seconds(600), Seconds(599), limit), Seconds(600));
        // Outlived: +1 min, then +5 min more, ...
        assert_eq!(corrected(Seconds(600), Seconds(600), limit), Seconds(660));
        assert_eq!(corrected(Seconds(600), Seconds(700), limit), Seconds(960));
        assert_eq!(
            corrected(Seconds(600), Seconds(960), limit),
            Seconds(960 + 900)
        );
        // 600 + 1, 5, 15, 30 min + 1, 2, 5 h = 32,460 s: the first above 9 h.
        assert_eq!(
            corrected(Seconds(600), Seconds::hours(9), limit),
            Seconds(32_460)
        );
        // Never above the limit: the next step (+10 h) is cut to it.
        assert_eq!(
            corrected(Seconds(600), Seconds(34_200), limit),
            Seconds::hours(10)
        );
        // Without a limit the last step repeats.
        let long = corrected(Seconds(1), Seconds::hours(1000), None);
        assert!(long > Seconds::hours(1000) && long <= Seconds::hours(1100));
    }
}
