//! The agents' own launch records, checked against the jobs' run log.
//!
//! Every real agent keeps a directory per run it was told to launch, in its runtime
//! directory, `STATE/run/NODE/runs/JOB.EPOCH/`: its monitor writes `pgid` once it has started
//! the job, and an agent that found no monitor after a restart writes `abandoned` (a monitor
//! must then never start the job). The jobs themselves append `ID NAME start MS NODE` to
//! `runs.log`. So, whatever crashed in between:
//!
//! - every start a job logged on a node is backed by a run its agent started there;
//! - no abandoned run was started;
//! - no job was started by agents more often than 1 + its requeues.

use std::collections::BTreeMap;
use std::path::Path;

/// One run an agent was told to launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchRecord {
    pub node: String,
    pub job: u64,
    pub epoch: u64,
    /// Its monitor started the job (recorded the job's process group).
    pub started: bool,
    /// An agent gave it up before a monitor was found.
    pub abandoned: bool,
}

/// Reads every agent's run directories under `runtime_dirs` (`NODE/runs/JOB.EPOCH`).
pub fn read(runtime_dirs: &Path) -> Vec<LaunchRecord> {
    let mut out = Vec::new();
    let Ok(nodes) = std::fs::read_dir(runtime_dirs) else {
        return out;
    };
    for node in nodes.flatten() {
        let name = node.file_name().to_string_lossy().into_owned();
        let Ok(runs) = std::fs::read_dir(node.path().join("runs")) else {
            continue;
        };
        for run in runs.flatten() {
            let file = run.file_name().to_string_lossy().into_owned();
            let Some((job, epoch)) = file.split_once('.') else {
                continue;
            };
            let (Ok(job), Ok(epoch)) = (job.parse(), epoch.parse()) else {
                continue;
            };
            out.push(LaunchRecord {
                node: name.clone(),
                job,
                epoch,
                started: run.path().join("pgid").exists(),
                abandoned: run.path().join("abandoned").exists(),
            });
        }
    }
    out.sort_by(|a, b| (a.job, a.epoch, &a.node).cmp(&(b.job, b.epoch, &b.node)));
    out
}

/// What the launch records show.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings {
    pub records: usize,
    pub started: usize,
    pub abandoned: usize,
    /// Jobs that logged a start on a node where no run of theirs was started.
    pub unbacked: Vec<u64>,
    /// Jobs with a run both abandoned and started.
    pub abandoned_started: Vec<u64>,
    /// Jobs started by agents more often than 1 + their requeues.
    pub started_too_often: Vec<u64>,
}

impl Findings {
    pub fn ok(&self) -> bool {
        self.unbacked.is_empty()
            && self.abandoned_started.is_empty()
            && self.started_too_often.is_empty()
    }
}

/// Checks `records` against `runs_log` and each job's requeue count.
pub fn check(records: &[LaunchRecord], runs_log: &str, requeues: &BTreeMap<u64, u32>) -> Findings {
    let mut f = Findings {
        records: records.len(),
        started: records.iter().filter(|r| r.started).count(),
        abandoned: records.iter().filter(|r| r.abandoned).count(),
        ..Findings::default()
    };
    let mut started_at: BTreeMap<(u64, &str), usize> = BTreeMap::new();
    let mut started_by_job: BTreeMap<u64, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| r.started) {
        *started_at.entry((r.job, r.node.as_str())).or_default() += 1;
        *started_by_job.entry(r.job).or_default() += 1;
        if r.abandoned {
            f.abandoned_started.push(r.job);
        }
    }
    let mut logged_at: BTreeMap<(u64, &str), usize> = BTreeMap::new();
    for line in runs_log.lines() {
        if let [id, _name, "start", _ms, node] = line.split_whitespace().collect::<Vec<_>>()[..]
            && let Ok(id) = id.parse::<u64>()
        {
            *logged_at.entry((id, node)).or_default() += 1;
        }
    }
    for ((job, node), logged) in logged_at {
        if started_at.get(&(job, node)).copied().unwrap_or(0) < logged {
            f.unbacked.push(job);
        }
    }
    for (job, started) in started_by_job {
        if started > 1 + requeues.get(&job).copied().unwrap_or(0) as usize {
            f.started_too_often.push(job);
        }
    }
    f.unbacked.dedup();
    f.abandoned_started.dedup();
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(node: &str, job: u64, epoch: u64, started: bool, abandoned: bool) -> LaunchRecord {
        LaunchRecord {
            node: node.into(),
            job,
            epoch,
            started,
            abandoned,
        }
    }

    #[test]
    fn agents_run_dirs_are_read_as_launch_records() {
        let dir = tempfile::tempdir().unwrap();
        let run = |node: &str, name: &str, files: &[&str]| {
            let d = dir.path().join(node).join("runs").join(name);
            std::fs::create_dir_all(&d).unwrap();
            for f in files {
                std::fs::write(d.join(f), "").unwrap();
            }
        };
        run("n01", "7.3", &["pgid", "exit"]);
        run("n02", "7.5", &["abandoned"]);
        run("n02", "notarun", &[]);
        assert_eq!(
            read(dir.path()),
            [rec("n01", 7, 3, true, false), rec("n02", 7, 5, false, true)]
        );
    }

    #[test]
    fn starts_must_be_backed_abandoned_runs_never_start_and_attempts_are_bounded() {
        let log = "1 a start 10 n01\n1 a end 20 n01\n2 b start 30 n02\n";
        let requeues = BTreeMap::from([(1, 0), (2, 0), (3, 1)]);
        let good = [
            rec("n01", 1, 1, true, false),
            rec("n02", 2, 1, true, false),
            rec("n01", 3, 1, true, false),
            rec("n02", 3, 2, true, false),
            rec("n03", 3, 3, false, true),
        ];
        let f = check(&good, log, &requeues);
        assert!(f.ok(), "{f:?}");
        assert_eq!((f.records, f.started, f.abandoned), (5, 4, 1));

        // Job 2 logged a start on n02 but n02 never started it; job 1 was started twice
        // without a requeue; job 3's abandoned run started anyway.
        let bad = [
            rec("n01", 1, 1, true, false),
            rec("n03", 1, 2, true, false),
            rec("n02", 2, 1, false, false),
            rec("n01", 3, 1, true, true),
        ];
        let f = check(&bad, log, &requeues);
        assert_eq!(f.unbacked, [2]);
        assert_eq!(f.started_too_often, [1]);
        assert_eq!(f.abandoned_started, [3]);
        assert!(!f.ok());
    }
}
