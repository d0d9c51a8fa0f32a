//! Times as Slurm prints them: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`, and `UNLIMITED`.

/// `5:23`, `1:02:03`, `2-03:04:05` (days and hours only when needed).
pub fn duration(seconds: u64) -> String {
    let (d, rem) = (seconds / 86_400, seconds % 86_400);
    let (h, rem) = (rem / 3600, rem % 3600);
    let (m, s) = (rem / 60, rem % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// A time limit: 0 is `UNLIMITED`.
pub fn limit(seconds: u64) -> String {
    if seconds == 0 {
        "UNLIMITED".into()
    } else {
        duration(seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_slurm_prints_them() {
        assert_eq!(duration(0), "0:00");
        assert_eq!(duration(323), "5:23");
        assert_eq!(duration(3723), "1:02:03");
        assert_eq!(duration(2 * 86_400 + 3 * 3600 + 4 * 60 + 5), "2-03:04:05");
        assert_eq!(limit(0), "UNLIMITED");
        assert_eq!(limit(3600), "1:00:00");
    }
}
