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

/// A duration as Slurm writes it in `-t`, `MaxTime` or `PriorityDecayHalfLife`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlurmDuration {
    Limit(Seconds),
    /// `UNLIMITED` or `INFINITE`.
    Unlimited,
}

/// The formats [`parse_duration`] accepts, for error messages.
pub const DURATION_FORMATS: &str =
    "M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, UNLIMITED or INFINITE (M = minutes)";

/// Why a quantity did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not {expected}")]
pub struct QuantityError {
    pub value: String,
    pub expected: &'static str,
}

/// Parses Slurm's time formats: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`, and
/// `UNLIMITED`/`INFINITE`. `0` is a zero limit; what it means (Slurm's `-t 0` = no limit) is
/// the caller's business.
pub fn parse_duration(text: &str) -> Result<SlurmDuration, QuantityError> {
    let err = || QuantityError {
        value: text.to_string(),
        expected: DURATION_FORMATS,
    };
    let t = text.trim();
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("infinite") {
        return Ok(SlurmDuration::Unlimited);
    }
    let number = |s: &str| -> Result<u64, QuantityError> {
        if s.is_empty() || s.len() > 12 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        s.parse().map_err(|_| err())
    };
    let (days, rest) = match t.split_once('-') {
        Some((d, rest)) => (Some(number(d)?), rest),
        None => (None, t),
    };
    let parts = rest
        .split(':')
        .map(number)
        .collect::<Result<Vec<u64>, _>>()?;
    let secs = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(d), [h]) => d * 86_400 + h * 3600,
        (Some(d), [h, m]) => d * 86_400 + h * 3600 + m * 60,
        (Some(d), [h, m, s]) => d * 86_400 + h * 3600 + m * 60 + s,
        _ => return Err(err()),
    };
    Ok(SlurmDuration::Limit(Seconds(secs)))
}

/// Parses a size as Slurm writes memory: a number with an optional unit `K`, `M` (the
/// default), `G` or `T` (binary multiples). Kibibytes round up to whole MiB.
pub fn parse_size(text: &str) -> Result<MiB, QuantityError> {
    let err = || QuantityError {
        value: text.to_string(),
        expected: "a size: a number with an optional unit K, M (default), G or T",
    };
    let t = text.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    if digits.is_empty() || digits.len() > 15 {
        return Err(err());
    }
    let n: u64 = digits.parse().map_err(|_| err())?;
    let mib = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "K" => n.div_ceil(1024),
        "" | "M" => n,
        "G" => n.checked_mul(1024).ok_or_else(err)?,
        "T" => n.checked_mul(1024 * 1024).ok_or_else(err)?,
        _ => return Err(err()),
    };
    Ok(MiB(mib))
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn slurm_time_formats() {
        let ok = |s: &str, secs: u64| {
            assert_eq!(
                parse_duration(s),
                Ok(SlurmDuration::Limit(Seconds(secs))),
                "{s}"
            )
        };
        ok("30", 1800);
        ok("5:30", 330);
        ok("1:02:03", 3723);
        ok("2-3", 2 * 86_400 + 3 * 3600);
        ok("2-03:04", 2 * 86_400 + 3 * 3600 + 4 * 60);
        ok("2-03:04:05", 2 * 86_400 + 3 * 3600 + 4 * 60 + 5);
        ok("0", 0);
        assert_eq!(parse_duration("UNLIMITED"), Ok(SlurmDuration::Unlimited));
        assert_eq!(parse_duration("infinite"), Ok(SlurmDuration::Unlimited));
        for bad in [
            "",
            "1:2:3:4",
            "a",
            "1-",
            "-1",
            "1-2:3:4:5",
            "99999999999999999",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.to_string().contains("D-H:M:S"), "{bad}: {e}");
        }
    }

    #[test]
    fn slurm_sizes() {
        assert_eq!(parse_size("512"), Ok(MiB(512)));
        assert_eq!(parse_size("4G"), Ok(MiB(4096)));
        assert_eq!(parse_size("4GB"), Ok(MiB(4096)));
        assert_eq!(parse_size("1t"), Ok(MiB(1 << 20)));
        assert_eq!(parse_size("1500K"), Ok(MiB(2)));
        for bad in ["", "G", "4X", "-1", "99999999999999999999"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
