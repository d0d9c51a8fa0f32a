//! Time and resource quantities.
//!
//! Newtypes keep seconds from being added to milliseconds and MiB from being compared with
//! cpus. Arithmetic on them saturates or is checked: a quantity that came from user input may
//! be absurd, and overflow must become a clear rejection, never a panic or a wrap.
//!
//! Time in the core is never read from a clock: [`TimeMs`] values arrive in commands, stamped
//! by the Raft leader, so every replica computes with the same instants.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

use serde::{Deserialize, Serialize};

/// An instant: milliseconds since the Unix epoch, as stamped by the leader.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct TimeMs(pub u64);

impl TimeMs {
    /// The time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: TimeMs) -> Seconds {
        Seconds(self.0.saturating_sub(earlier.0) / 1000)
    }

    /// Milliseconds elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn ms_since(self, earlier: TimeMs) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    pub fn plus(self, d: Seconds) -> TimeMs {
        TimeMs(self.0.saturating_add(d.0.saturating_mul(1000)))
    }
}

/// A duration in whole seconds (walltimes, limits, ages).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Seconds(pub u64);

impl Seconds {
    pub const ZERO: Seconds = Seconds(0);

    pub const fn minutes(m: u64) -> Seconds {
        Seconds(m * 60)
    }

    pub const fn hours(h: u64) -> Seconds {
        Seconds(h * 3600)
    }

    pub const fn days(d: u64) -> Seconds {
        Seconds(d * 86_400)
    }

    pub fn saturating_sub(self, other: Seconds) -> Seconds {
        Seconds(self.0.saturating_sub(other.0))
    }
}

impl Add for Seconds {
    type Output = Seconds;
    fn add(self, rhs: Seconds) -> Seconds {
        Seconds(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for Seconds {
    fn add_assign(&mut self, rhs: Seconds) {
        *self = *self + rhs;
    }
}

impl Sub for Seconds {
    type Output = Seconds;
    fn sub(self, rhs: Seconds) -> Seconds {
        self.saturating_sub(rhs)
    }
}

/// Formats as Slurm prints durations: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`.
impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        let (d, h, m, sec) = (s / 86_400, (s / 3600) % 24, (s / 60) % 60, s % 60);
        if d > 0 {
            write!(f, "{d}-{h:02}:{m:02}:{sec:02}")
        } else if h > 0 {
            write!(f, "{h}:{m:02}:{sec:02}")
        } else {
            write!(f, "{m}:{sec:02}")
        }
    }
}

/// Memory or disk in mebibytes, Slurm's unit for `--mem`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct MiB(pub u64);

impl MiB {
    pub const ZERO: MiB = MiB(0);

    pub const fn gib(g: u64) -> MiB {
        MiB(g * 1024)
    }

    pub fn checked_mul(self, n: u64) -> Option<MiB> {
        self.0.checked_mul(n).map(MiB)
    }

    pub fn saturating_sub(self, other: MiB) -> MiB {
        MiB(self.0.saturating_sub(other.0))
    }
}

impl Add for MiB {
    type Output = MiB;
    fn add(self, rhs: MiB) -> MiB {
        MiB(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for MiB {
    fn add_assign(&mut self, rhs: MiB) {
        *self = *self + rhs;
    }
}

impl fmt::Display for MiB {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}M", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_like_slurm() {
        assert_eq!(Seconds(323).to_string(), "5:23");
        assert_eq!(Seconds(3723).to_string(), "1:02:03");
        assert_eq!(
            Seconds(2 * 86_400 + 3 * 3600 + 4 * 60 + 5).to_string(),
            "2-03:04:05"
        );
        assert_eq!(Seconds(0).to_string(), "0:00");
    }

    #[test]
    fn time_arithmetic_saturates() {
        assert_eq!(TimeMs(5_000).since(TimeMs(9_000)), Seconds(0));
        assert_eq!(TimeMs(9_500).since(TimeMs(5_000)), Seconds(4));
        assert_eq!(TimeMs(u64::MAX).plus(Seconds(10)), TimeMs(u64::MAX));
        assert_eq!(Seconds(u64::MAX) + Seconds(1), Seconds(u64::MAX));
        assert_eq!(MiB(u64::MAX).checked_mul(2), None);
    }
}
