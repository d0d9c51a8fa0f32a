//! Times as Slurm prints them: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`, `UNLIMITED`, and
//! instants as `2026-11-21T18:25:15` in local time; and the instants Slurm's time options
//! accept (`sacct -S`, `scontrol create reservation StartTime=`).

use anyhow::{Result, anyhow};

/// `5:23`, `1:02:03`, `2-03:04:05` (days and hours only when needed).
pub fn duration(seconds: u64) -> String {
    let (d, h, m, s) = days_hours_minutes_seconds(seconds);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// CPU time as sacct prints TotalCPU: `MM:SS.mmm` under an hour, `HH:MM:SS` under a day,
/// `D-HH:MM:SS` beyond.
pub fn cpu_time(ms: u64) -> String {
    let (d, h, m, s) = days_hours_minutes_seconds(ms / 1000);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h:02}:{m:02}:{s:02}")
    } else {
        format!("{m:02}:{s:02}.{:03}", ms % 1000)
    }
}

fn days_hours_minutes_seconds(seconds: u64) -> (u64, u64, u64, u64) {
    let (d, rem) = (seconds / 86_400, seconds % 86_400);
    (d, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A time limit: 0 is `UNLIMITED`.
pub fn limit(seconds: u64) -> String {
    if seconds == 0 {
        "UNLIMITED".into()
    } else {
        duration(seconds)
    }
}

/// An instant (ms since the epoch) as Slurm prints it: `2026-11-21T18:25:15`, local time;
/// `Unknown` for none.
pub fn timestamp(ms: Option<u64>) -> String {
    let Some(ms) = ms else {
        return "Unknown".into();
    };
    let Ok(ts) = jiff::Timestamp::from_millisecond(ms as i64) else {
        return "Unknown".into();
    };
    ts.to_zoned(jiff::tz::TimeZone::system())
        .strftime("%Y-%m-%dT%H:%M:%S")
        .to_string()
}

/// An instant in one of Slurm's forms, in ms since the epoch: `now`, `now[+-]N[units]`
/// (seconds, minutes, hours, days, weeks; default seconds), `YYYY-MM-DD[THH:MM[:SS]]` in
/// local time, `HH:MM[:SS]` (today), or `midnight`, `noon`, `today`, `tomorrow`.
pub fn parse_instant(text: &str, now_ms: u64) -> Result<u64> {
    let tz = jiff::tz::TimeZone::system();
    let now = jiff::Timestamp::from_millisecond(now_ms as i64)
        .map_err(|e| anyhow!("the clock: {e}"))?
        .to_zoned(tz.clone());
    let lower = text.trim().to_ascii_lowercase();
    let bad = || {
        anyhow!(
            "{text:?} is not a time: use YYYY-MM-DD[THH:MM[:SS]], HH:MM[:SS], now[-N{{minutes,hours,days,weeks}}], today, tomorrow, midnight or noon"
        )
    };
    if let Some(rest) = lower.strip_prefix("now") {
        if rest.is_empty() {
            return Ok(now_ms);
        }
        let (sign, rest) = if let Some(r) = rest.strip_prefix('+') {
            (1i64, r)
        } else if let Some(r) = rest.strip_prefix('-') {
            (-1i64, r)
        } else {
            return Err(bad());
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let n: i64 = digits.parse().map_err(|_| bad())?;
        let unit = &rest[digits.len()..];
        let seconds = match unit {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 7 * 86_400,
            _ => return Err(bad()),
        };
        let delta = n.checked_mul(seconds * 1000).ok_or_else(bad)?;
        let at = i64::try_from(now_ms)
            .ok()
            .and_then(|now| now.checked_add(sign * delta))
            .ok_or_else(bad)?;
        return u64::try_from(at).map_err(|_| bad());
    }
    let today = now.date();
    let at = |date: jiff::civil::Date, time: jiff::civil::Time| -> Result<u64> {
        let z = date
            .to_datetime(time)
            .to_zoned(tz.clone())
            .map_err(|e| anyhow!("{text:?}: {e}"))?;
        u64::try_from(z.timestamp().as_millisecond()).map_err(|_| bad())
    };
    match lower.as_str() {
        "today" | "midnight" => return at(today, jiff::civil::Time::midnight()),
        "noon" => return at(today, jiff::civil::time(12, 0, 0, 0)),
        "tomorrow" => {
            let d = today.tomorrow().map_err(|e| anyhow!("{text:?}: {e}"))?;
            return at(d, jiff::civil::Time::midnight());
        }
        _ => {}
    }
    if let Ok(dt) = lower.to_uppercase().parse::<jiff::civil::DateTime>() {
        return at(dt.date(), dt.time());
    }
    if let Ok(d) = lower.parse::<jiff::civil::Date>() {
        return at(d, jiff::civil::Time::midnight());
    }
    if let Ok(t) = lower.parse::<jiff::civil::Time>() {
        return at(today, t);
    }
    Err(bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_parse_in_slurms_forms() {
        let now = 1_795_000_000_000;
        assert_eq!(parse_instant("now", now).unwrap(), now);
        assert_eq!(parse_instant("now-2hours", now).unwrap(), now - 7_200_000);
        assert_eq!(parse_instant("now+30", now).unwrap(), now + 30_000);
        assert_eq!(parse_instant("NOW-1days", now).unwrap(), now - 86_400_000);
        let day = parse_instant("2026-11-21", now).unwrap();
        assert_eq!(
            parse_instant("2026-11-21T01:30", now).unwrap(),
            day + 5_400_000
        );
        assert_eq!(
            parse_instant("2026-11-21T01:30:05", now).unwrap(),
            day + 5_405_000
        );
        assert_eq!(timestamp(Some(day + 5_405_000)), "2026-11-21T01:30:05");
        assert_eq!(timestamp(None), "Unknown");
        for bad in [
            "yesterday-ish",
            "now-",
            "now*3",
            "2026-13-01",
            "now-5parsecs",
            // Found by the generated input (hostile.rs): a multi-byte sign, and a sum past
            // the end of time.
            "now\u{202e}5",
            "now+9223372036854775",
        ] {
            let e = parse_instant(bad, now).unwrap_err().to_string();
            assert!(e.contains("is not a time") || e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn times_print_as_slurm_prints_them() {
        assert_eq!(duration(0), "0:00");
        assert_eq!(duration(323), "5:23");
        assert_eq!(duration(3723), "1:02:03");
        assert_eq!(duration(2 * 86_400 + 3 * 3600 + 4 * 60 + 5), "2-03:04:05");
        assert_eq!(limit(0), "UNLIMITED");
        assert_eq!(limit(3600), "1:00:00");
        // TotalCPU keeps milliseconds under an hour.
        assert_eq!(cpu_time(4), "00:00.004");
        assert_eq!(cpu_time(65_123), "01:05.123");
        assert_eq!(cpu_time(3_723_000), "01:02:03");
        assert_eq!(cpu_time(90_000_000), "1-01:00:00");
    }
}
