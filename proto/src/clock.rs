//! The wall clock in the unit every message carries times in.

/// Milliseconds since the Unix epoch on this host's clock (0 before 1970). Submit, start and
/// end times, credentials' issue and expiry times and proposals' times are all in it.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
