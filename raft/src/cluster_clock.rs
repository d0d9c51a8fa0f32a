//! The cluster's time as a leader stamps it: the host's wall clock, disciplined by the
//! monotonic clock so that a step of the wall clock cannot step the cluster's time.
//!
//! Apply never reads a clock. The leader stamps each batch ([`crate::types::Batch`]'s
//! `time_ms`) and the state's time only moves forward, so a replica whose clock jumps back
//! cannot move the cluster's time back. Stamped straight from the wall clock, though, a
//! leader whose clock was stepped ahead (`date -s`, a virtual machine resumed with a stale
//! clock, a misconfigured time server; libfaketime in the chaos harness) moved the cluster's
//! time ahead for good: every later stamp fell behind it, so the queue's time stood still
//! until the wall clocks caught up, every job that ended meanwhile got the same end time,
//! and none was purged to the archive. Under the chaos workload a 46-minute step kept 6,933
//! finished jobs in the queue (and in every controller's memory) in 11 minutes.
//!
//! So stamps advance with the monotonic clock, which never steps, and follow the wall clock
//! only at a bounded rate, [`SLEW_PER_MILLE`] of the time elapsed, as `chronyd` and `ntpd`
//! slew a clock rather than step it. While the wall clock agrees with the monotonic one
//! (every host whose clock is kept by NTP, which corrects by slewing too), stamps are the
//! wall clock exactly. A step of the wall clock lasting `d` seconds moves the stamps by at
//! most a tenth of `d`; a lasting correction of `e` seconds is taken in `10 × e` seconds.
//! Stamps never go backwards within a process.
//!
//! A process starts from its wall clock as it is: a replica started with a wrong clock
//! stamps wrong times until its clock is put right (then slews to it). Keep clocks with NTP,
//! as Slurm and PBS require too.

use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How much of the time elapsed the stamps may move toward the wall clock, in thousandths
/// (100: a tenth; chrony's default `maxslewrate` is 83.3).
pub const SLEW_PER_MILLE: u64 = 100;

/// A wall clock this close to where the monotonic clock puts the stamps is taken as it
/// reads: the two clocks are read one after the other, and a thread preempted between the
/// reads sees them apart by its wait. Anything farther is a step, followed at the slew rate.
pub const TOLERANCE_US: u64 = 2_000;

/// A wall clock this far from the stamps is logged (at most once a minute).
const WARN_AFTER_US: u64 = 1_000_000;

/// Stamps from a monotonic and a wall reading, both in microseconds (a pure state machine:
/// [`now_ms`] feeds it the process's clocks, tests feed it any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Discipline {
    last_mono_us: u64,
    last_us: u64,
}

impl Discipline {
    /// Starts from the wall clock as it reads at `mono_us`.
    pub fn new(mono_us: u64, wall_us: u64) -> Discipline {
        Discipline {
            last_mono_us: mono_us,
            last_us: wall_us,
        }
    }

    /// The stamp for a monotonic reading `mono_us` and a wall reading `wall_us`: the last
    /// stamp advanced by the monotonic time since it, moved toward the wall clock by at most
    /// [`SLEW_PER_MILLE`] of that time (or onto it, within [`TOLERANCE_US`]); never less
    /// than the last stamp.
    pub fn at(&mut self, mono_us: u64, wall_us: u64) -> u64 {
        let elapsed = mono_us.saturating_sub(self.last_mono_us);
        let free = self.last_us.saturating_add(elapsed);
        let bound = elapsed / 1000 * SLEW_PER_MILLE + elapsed % 1000 * SLEW_PER_MILLE / 1000;
        let next = if wall_us.abs_diff(free) <= TOLERANCE_US {
            wall_us
        } else {
            wall_us.clamp(free.saturating_sub(bound), free.saturating_add(bound))
        };
        self.last_mono_us = self.last_mono_us.max(mono_us);
        self.last_us = self.last_us.max(next);
        self.last_us
    }
}

struct ProcessClock {
    origin: Instant,
    discipline: Discipline,
    warned_at: Option<Instant>,
}

static CLOCK: Mutex<Option<ProcessClock>> = Mutex::new(None);

fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The cluster's time now, in milliseconds since the Unix epoch, as this process's leader
/// stamps batches with it (see the module's documentation). Shared by every caller in the
/// process, so stamps from any of them never go backwards.
pub fn now_ms() -> u64 {
    let mut guard = CLOCK.lock().unwrap_or_else(|p| p.into_inner());
    let wall = wall_us();
    let clock = guard.get_or_insert_with(|| ProcessClock {
        origin: Instant::now(),
        discipline: Discipline::new(0, wall),
        warned_at: None,
    });
    let mono = u64::try_from(clock.origin.elapsed().as_micros()).unwrap_or(u64::MAX);
    let stamp = clock.discipline.at(mono, wall);
    if wall.abs_diff(stamp) > WARN_AFTER_US
        && clock
            .warned_at
            .is_none_or(|at| at.elapsed().as_secs() >= 60)
    {
        clock.warned_at = Some(Instant::now());
        let ahead_ms = (i128::from(wall) - i128::from(stamp)) / 1000;
        tracing::warn!(
            wall_ahead_ms = %ahead_ms,
            "this host's wall clock disagrees with the cluster's time (a stepped clock?); \
             following it at a tenth of the time elapsed"
        );
    }
    stamp / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;
    const MIN: u64 = 60 * S;
    const T0: u64 = 1_795_000_000 * S;

    /// Stamps every 10 ms for `seconds`, with the wall clock at `offset` from true time;
    /// the last stamp's distance from true time.
    fn run(d: &mut Discipline, mono: &mut u64, seconds: u64, offset: i64) -> i64 {
        for _ in 0..seconds * 100 {
            *mono += 10_000;
            let wall = (T0 + *mono).saturating_add_signed(offset);
            d.at(*mono, wall);
        }
        d.last_us as i64 - (T0 + *mono) as i64
    }

    #[test]
    fn a_clock_that_agrees_with_the_monotonic_one_is_stamped_exactly() {
        let mut d = Discipline::new(0, T0);
        let mut mono = 0;
        assert_eq!(run(&mut d, &mut mono, 60, 0), 0);
        // Called at any rate, even twice at one instant.
        assert_eq!(d.at(mono, T0 + mono), T0 + mono);
        assert_eq!(d.at(mono + 3, T0 + mono + 3), T0 + mono + 3);
    }

    #[test]
    fn a_step_ahead_for_three_seconds_moves_the_stamps_a_tenth_of_that() {
        let mut d = Discipline::new(0, T0);
        let mut mono = 0;
        run(&mut d, &mut mono, 10, 0);
        // The wall clock steps 46 minutes ahead for 3 s, then is put back.
        let during = run(&mut d, &mut mono, 3, (46 * MIN) as i64);
        assert!(during > 0 && during <= (3 * S / 10) as i64, "{during}");
        let after = run(&mut d, &mut mono, 1, 0);
        assert!(after > 0 && after < during, "{after}");
        // Back on the wall clock once the tenth has been given back (3 s).
        assert_eq!(run(&mut d, &mut mono, 3, 0), 0);
    }

    #[test]
    fn a_step_back_never_moves_the_stamps_back_and_slows_them_by_a_tenth() {
        let mut d = Discipline::new(0, T0);
        let mut mono = 0;
        run(&mut d, &mut mono, 5, 0);
        let mut last = d.last_us;
        for _ in 0..300 {
            mono += 10_000;
            let stamp = d.at(mono, T0 + mono - 111 * MIN);
            assert!(stamp > last, "stamps go forward at 0.9x the monotonic rate");
            assert_eq!(stamp - last, 9_000);
            last = stamp;
        }
        assert_eq!(run(&mut d, &mut mono, 3, 0), 0);
    }

    #[test]
    fn a_lasting_correction_is_taken_at_a_tenth_of_the_time_elapsed() {
        let mut d = Discipline::new(0, T0);
        let mut mono = 0;
        // NTP puts the wall clock 5 s ahead of where this process started it, for good.
        assert_eq!(run(&mut d, &mut mono, 10, 5 * S as i64), S as i64);
        assert_eq!(run(&mut d, &mut mono, 40, 5 * S as i64), 5 * S as i64);
        assert_eq!(run(&mut d, &mut mono, 10, 5 * S as i64), 5 * S as i64);
    }

    #[test]
    fn a_monotonic_reading_out_of_order_changes_nothing() {
        let mut d = Discipline::new(1_000, T0);
        let first = d.at(2_000, T0 + 1_000);
        assert_eq!(d.at(1_500, T0 + 500), first);
    }

    #[test]
    fn the_process_clock_follows_the_wall_clock_and_never_goes_back() {
        let mut last = now_ms();
        assert!(last.abs_diff(docket_proto::unix_ms()) < 1_000);
        for _ in 0..1_000 {
            let next = now_ms();
            assert!(next >= last);
            last = next;
        }
    }
}
