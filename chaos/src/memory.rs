//! The daemons' memory over a run: every daemon's resident set (VmRSS) sampled on a period,
//! by process, so a soak shows whether any process grows after its first minutes. A process
//! restarted by a fault is a new process with a curve of its own; the summary takes, for
//! each daemon, the process that lived longest.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Seconds since the sampling began.
    pub at_s: u64,
    pub pid: i32,
    pub rss_kib: u64,
}

/// Readings by daemon (`controller-1`, `agent-n01`, `authd`).
pub type Samples = BTreeMap<String, Vec<Sample>>;

fn rss_kib(pid: i32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The daemons of the cluster in `state` now, by name, with their pids.
fn daemons(state: &std::path::Path) -> Vec<(String, i32)> {
    let Ok(record) = docket_deploy::LocalCluster::read_record(state) else {
        return Vec::new();
    };
    let r = &record;
    let mut out: Vec<(String, i32)> = r
        .replicas
        .iter()
        .filter_map(|p| Some((format!("controller-{}", p.id), p.pid?)))
        .collect();
    out.extend(
        r.agents
            .iter()
            .filter_map(|a| Some((format!("agent-{}", a.spec.name), a.pid?))),
    );
    if let Some(pid) = r.authd.as_ref().and_then(|a| a.pid) {
        out.push(("authd".into(), pid));
    }
    out
}

/// Samples every `every` until `stop`.
pub async fn sample(state: PathBuf, every: Duration, stop: Arc<AtomicBool>) -> Samples {
    let started = Instant::now();
    let mut samples = Samples::new();
    while !stop.load(Ordering::Relaxed) {
        let at_s = started.elapsed().as_secs();
        for (name, pid) in daemons(&state) {
            if let Some(rss_kib) = rss_kib(pid) {
                samples
                    .entry(name)
                    .or_default()
                    .push(Sample { at_s, pid, rss_kib });
            }
        }
        let until = Instant::now() + every;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    samples
}

/// Every reading as CSV: `seconds,daemon,pid,rss_kib`.
pub fn csv(samples: &Samples) -> String {
    let mut out = String::from("seconds,daemon,pid,rss_kib\n");
    for (name, list) in samples {
        for s in list {
            let _ = writeln!(out, "{},{name},{},{}", s.at_s, s.pid, s.rss_kib);
        }
    }
    out
}

/// For each daemon, its longest-lived process: how long it was watched, its RSS `settle_s`
/// into its life (or at its first reading), at its last reading, and its largest.
pub fn summary(samples: &Samples, settle_s: u64) -> String {
    let mut out = String::new();
    for (name, list) in samples {
        let mut by_pid: BTreeMap<i32, Vec<Sample>> = BTreeMap::new();
        for s in list {
            by_pid.entry(s.pid).or_default().push(*s);
        }
        let Some(longest) = by_pid
            .values()
            .max_by_key(|v| v.last().map_or(0, |l| l.at_s) - v.first().map_or(0, |f| f.at_s))
        else {
            continue;
        };
        let (Some(first), Some(last)) = (longest.first(), longest.last()) else {
            continue;
        };
        let settled = longest
            .iter()
            .find(|s| s.at_s >= first.at_s + settle_s)
            .unwrap_or(first);
        let max = longest.iter().map(|s| s.rss_kib).max().unwrap_or(0);
        let growth = last.rss_kib as f64 / settled.rss_kib.max(1) as f64 - 1.0;
        let _ = writeln!(
            out,
            "  {name:<16} {} processes; longest-lived watched {} min: {} MiB after {} min, {} MiB at the end ({:+.1}%), at most {} MiB",
            by_pid.len(),
            (last.at_s - first.at_s) / 60,
            settled.rss_kib / 1024,
            (settled.at_s - first.at_s) / 60,
            last.rss_kib / 1024,
            growth * 100.0,
            max / 1024
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_lived_process_is_summarised_from_after_it_settles() {
        let mut samples = Samples::new();
        let s = |at_s, pid, rss_kib| Sample { at_s, pid, rss_kib };
        samples.insert(
            "controller-1".into(),
            vec![
                s(0, 10, 50_000),
                s(60, 10, 60_000),
                s(120, 11, 40_000),
                s(300, 11, 80_000),
                s(900, 11, 82_000),
            ],
        );
        let text = summary(&samples, 120);
        assert!(text.contains("2 processes"), "{text}");
        assert!(text.contains("watched 13 min"), "{text}");
        assert!(text.contains("78 MiB after 3 min"), "{text}");
        assert!(text.contains("80 MiB at the end (+2.5%)"), "{text}");
        assert!(csv(&samples).starts_with("seconds,daemon,pid,rss_kib\n0,controller-1,10,50000\n"));
    }
}
