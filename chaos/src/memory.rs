//! The daemons' memory over a run: every daemon's resident set (VmRSS) sampled on a period,
//! by process, so a soak shows whether any process grows after its first minutes. A process
//! restarted by a fault is a new process with a curve of its own; the summary takes, for
//! each daemon, the process that lived longest.
//!
//! Each reading splits the resident set as the kernel does (`/proc/PID/status`): anonymous
//! pages (the heaps, stacks and allocators' arenas: what a leak grows) and file-backed
//! pages (the executable's and libraries' code and data, paged in as code paths first run
//! and dropped under pressure). A daemon that first runs a snapshot install or an archive
//! scan late in its life grows in the second without allocating anything.

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
    /// Anonymous resident pages (`RssAnon`).
    pub anon_kib: u64,
    /// File-backed and shared resident pages (`RssFile` + `RssShmem`).
    pub file_kib: u64,
}

/// Readings by daemon (`controller-1`, `agent-n01`, `authd`).
pub type Samples = BTreeMap<String, Vec<Sample>>;

/// A process's resident set, anonymous and file-backed pages: `(rss, anon, file)` in KiB.
fn resident_kib(pid: i32) -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    let rss = field("VmRSS:")?;
    let anon = field("RssAnon:").unwrap_or(0);
    let file = field("RssFile:").unwrap_or(0) + field("RssShmem:").unwrap_or(0);
    Some((rss, anon, file))
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
            if let Some((rss_kib, anon_kib, file_kib)) = resident_kib(pid) {
                samples.entry(name).or_default().push(Sample {
                    at_s,
                    pid,
                    rss_kib,
                    anon_kib,
                    file_kib,
                });
            }
        }
        let until = Instant::now() + every;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    samples
}

/// Every reading as CSV: `seconds,daemon,pid,rss_kib,anon_kib,file_kib`.
pub fn csv(samples: &Samples) -> String {
    let mut out = String::from("seconds,daemon,pid,rss_kib,anon_kib,file_kib\n");
    for (name, list) in samples {
        for s in list {
            let _ = writeln!(
                out,
                "{},{name},{},{},{},{}",
                s.at_s, s.pid, s.rss_kib, s.anon_kib, s.file_kib
            );
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
            "  {name:<16} {} processes; longest-lived watched {} min: {} MiB after {} min, {} MiB at the end ({:+.1}%), at most {} MiB; anonymous {} -> {} MiB, file-backed {} -> {} MiB",
            by_pid.len(),
            (last.at_s - first.at_s) / 60,
            settled.rss_kib / 1024,
            (settled.at_s - first.at_s) / 60,
            last.rss_kib / 1024,
            growth * 100.0,
            max / 1024,
            settled.anon_kib / 1024,
            last.anon_kib / 1024,
            settled.file_kib / 1024,
            last.file_kib / 1024,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_splits_the_resident_set_into_anonymous_and_file_backed_pages() {
        let (rss, anon, file) = resident_kib(std::process::id() as i32).unwrap();
        assert!(anon > 0 && file > 0, "{rss} {anon} {file}");
        assert_eq!(rss, anon + file);
        assert_eq!(resident_kib(-1), None);
    }

    #[test]
    fn the_longest_lived_process_is_summarised_from_after_it_settles() {
        let mut samples = Samples::new();
        let s = |at_s, pid, rss_kib| Sample {
            at_s,
            pid,
            rss_kib,
            anon_kib: rss_kib * 3 / 4,
            file_kib: rss_kib / 4,
        };
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
        assert!(
            text.contains("anonymous 58 -> 60 MiB, file-backed 19 -> 20 MiB"),
            "{text}"
        );
        assert!(csv(&samples).starts_with(
            "seconds,daemon,pid,rss_kib,anon_kib,file_kib\n0,controller-1,10,50000,37500,12500\n"
        ));
    }
}
