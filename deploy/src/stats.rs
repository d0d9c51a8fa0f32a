//! Figures the benchmarks and the chaos harness print: nearest-rank percentiles, and the cpu
//! time a process of the cluster has spent.

/// p50, p99 and max of `v` (nearest rank), or None when empty.
pub fn percentiles(v: &[u64]) -> Option<(u64, u64, u64)> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let rank = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
    Some((rank(0.50), rank(0.99), s[s.len() - 1]))
}

/// User plus system cpu time of process `pid` so far, ms (with `children`, that of its
/// reaped children too); 0 when it is gone.
pub fn process_cpu_ms(pid: i32, children: bool) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command (which may hold spaces) start after its closing parenthesis.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime, stime, cutime, cstime: fields 14-17 of stat, 12-15 after the command.
    let last = if children { 14 } else { 12 };
    let ticks: u64 = (11..=last)
        .filter_map(|i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100)
        .max(1) as u64;
    ticks * 1000 / hz
}

/// [`process_cpu_ms`] with reaped children of `pid` and of each of its live children (an
/// agent's launcher reaps the job monitors it forks, so their cpu, and their jobs', is its
/// children's until it exits).
pub fn process_tree_cpu_ms(pid: i32) -> u64 {
    process_cpu_ms(pid, true)
        + children_of(pid)
            .into_iter()
            .map(|c| process_cpu_ms(c, true))
            .sum::<u64>()
}

/// The live children of `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                // The parent is the second field after the command's closing parenthesis.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_and_cpu_time_is_read() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentiles(&v), Some((50, 99, 100)));
        assert_eq!(percentiles(&[7]), Some((7, 7, 7)));
        assert_eq!(percentiles(&[]), None);
        let me = std::process::id() as i32;
        assert!(process_cpu_ms(me, true) >= process_cpu_ms(me, false));
        assert_eq!(process_cpu_ms(-1, false), 0);
    }
}
