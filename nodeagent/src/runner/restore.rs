//! What a restarted agent takes on from the one before, and what it cleans up: the state
//! file's runs re-adopted, job directories and run records nobody needs removed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::launch::ENVIRON;
use super::{Held, JOBS, JOBS_MODE, Mode, RUNS, RUNS_MODE, RunId, Runner, SavedRun};
use crate::lifecycle::{Input, Outcome};

/// How long a finished run's record stays in `runs/` (fault drills read them minutes after).
const RUN_RECORD_KEEP: Duration = Duration::from_secs(24 * 3600);
/// The inodes a finished run's record holds: its directory, the monitor's lock and log, the
/// environment (emptied), the process group, the exit.
const RECORD_INODES: u64 = 6;
/// Old records are looked for at start and after every this many acknowledged ends.
pub(super) const PRUNE_EVERY: u64 = 512;

impl Runner {
    /// Reads the state file a previous agent left and re-adopts its runs: ends not yet
    /// reported are reported; runs whose monitor still lives are watched to their end (with
    /// their walltime); runs whose monitor is gone without a recorded exit are reported as
    /// node failures. Returns the cgroup names and scratch mounts to keep when reaping.
    pub fn restore(&self) -> (BTreeSet<String>, BTreeSet<PathBuf>) {
        let mut keep_cgroups = BTreeSet::new();
        let mut keep_scratch = BTreeSet::new();
        let saved: Vec<SavedRun> = match self.load().map(|t| serde_json::from_slice(&t)) {
            None => Vec::new(),
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                tracing::error!(error = %e, "the agent state file is unreadable; starting afresh");
                Vec::new()
            }
        };
        let mut watch: Vec<(RunId, Option<PathBuf>)> = Vec::new();
        let mut stray_steps = Vec::new();
        let mut records = Vec::new();
        {
            let mut held = self.holdings();
            for s in saved {
                let id = (s.job, s.epoch);
                if s.record.running {
                    if s.cgroup.is_some() {
                        keep_cgroups.insert(crate::cgroup::job_cgroup_name(s.job, s.epoch));
                    }
                    if let Some(sc) = &s.scratch {
                        keep_scratch.insert(sc.path.clone());
                    }
                    tracing::info!(job = s.job, epoch = s.epoch, "re-adopting a run");
                    if let Some(cg) = &s.cgroup {
                        stray_steps.push((id, cg.clone()));
                    }
                    held.insert(
                        id,
                        Held {
                            cgroup: s.cgroup,
                            cpus: s.cpus,
                            gpus: s.gpus,
                            scratch: s.scratch,
                            monitor: s.monitor,
                            run_dir: s.run_dir.clone(),
                            pgid: s.pgid,
                            step_base: s.step_base.map(std::sync::Arc::new),
                        },
                    );
                    watch.push((id, s.run_dir));
                }
                records.push((id, s.record));
            }
        }
        let mut effects = Vec::new();
        self.book()
            .restore(self.now(), docket_proto::unix_ms(), records, &mut effects);
        self.execute(effects);
        if self.config.mode == Mode::Real {
            for (id, run_dir) in watch {
                match run_dir {
                    Some(dir) => {
                        let this = self.clone();
                        tokio::spawn(async move { this.readopt(id, &dir).await });
                    }
                    // Nothing was started for it (its run directory is recorded first): lost.
                    None => {
                        let seen = self.observe(id);
                        self.step(Input::Ended(id, Outcome::Lost, seen));
                    }
                }
            }
        }
        self.end_stray_steps(stray_steps);
        self.reap_directories();
        (keep_cgroups, keep_scratch)
    }

    /// Steps that ran under the agent before it restarted cannot go on: their srun's streams
    /// went with the old process (and srun, seeing them break, gives the step up). What their
    /// tasks left in the re-adopted jobs' step cgroups is killed, and each step is reported
    /// ended, so the leader frees its cpus even if its srun is gone too.
    fn end_stray_steps(&self, runs: Vec<(RunId, crate::cgroup::JobCgroup)>) {
        for ((job, epoch), cgroup) in runs {
            for step in cgroup.existing_steps() {
                match cgroup.step(step) {
                    Ok(cg) => cg.remove(),
                    Err(e) => tracing::warn!(job, step, error = %e, "a stray step's cgroups"),
                }
                tracing::info!(
                    job,
                    step,
                    "ended a step left by the agent before its restart"
                );
                self.steps
                    .report_lost(job, epoch, step, "the node's agent restarted while it ran");
            }
        }
    }

    /// Removes the job directories of runs this agent no longer holds running (an agent that
    /// died between recording an end and removing them leaves some), and old run records.
    fn reap_directories(&self) {
        self.prune_run_records();
        let keep: BTreeSet<String> = self
            .book()
            .held()
            .iter()
            .filter(|h| h.running)
            .map(|h| super::run_name((h.job_id, h.epoch)))
            .collect();
        for root in self.run_roots() {
            let Ok(jobs) = root.open_subdir(JOBS, JOBS_MODE) else {
                continue;
            };
            let Ok(entries) = std::fs::read_dir(jobs.path()) else {
                continue;
            };
            for e in entries.flatten() {
                let entry = e.file_name().to_string_lossy().into_owned();
                if !keep.contains(&entry)
                    && let Err(e) = jobs.remove_tree(&entry)
                {
                    tracing::warn!(error = %e, "removing a stale job directory");
                }
            }
        }
    }

    /// The directories `runs/` and `jobs/` are in: the runtime directory, then the state
    /// directory, where agents before the runtime directory kept them. Their runs are
    /// re-adopted from the paths the state file records, and what they leave is reaped and
    /// pruned like the rest.
    fn run_roots(&self) -> Vec<&crate::rootdir::RootDir> {
        [self.runtime_dir(), self.state_dir()]
            .into_iter()
            .flatten()
            .collect()
    }

    /// Removes the records (`runs/<job>.<epoch>`) of runs not held here that ended more than
    /// [`RUN_RECORD_KEEP`] ago or are not among the newest that fill half the file system's
    /// inodes ([`records_kept`]), so a node running millions of jobs does not keep them all
    /// and its launches always find room on the runtime tmpfs, whose inodes are capped.
    pub(super) fn prune_run_records(&self) {
        if self.config.mode == Mode::Simulated {
            return;
        }
        let held: BTreeSet<String> = self
            .book()
            .held()
            .iter()
            .map(|h| super::run_name((h.job_id, h.epoch)))
            .collect();
        let now = std::time::SystemTime::now();
        for root in self.run_roots() {
            let Ok(runs) = root.open_subdir(RUNS, RUNS_MODE) else {
                continue;
            };
            let Ok(entries) = std::fs::read_dir(runs.path()) else {
                continue;
            };
            let kept = records_kept(&runs);
            // Finished runs' records, newest first (one whose age cannot be read, first).
            let mut finished: Vec<(Duration, String)> = entries
                .flatten()
                .map(|e| {
                    let age = e
                        .metadata()
                        .and_then(|m| m.modified())
                        .map(|t| now.duration_since(t).unwrap_or_default())
                        .unwrap_or_default();
                    (age, e.file_name().to_string_lossy().into_owned())
                })
                .filter(|(_, name)| !held.contains(name))
                .collect();
            finished.sort_unstable();
            for (i, (age, name)) in finished.iter().enumerate() {
                if (i >= kept || *age > RUN_RECORD_KEEP)
                    && let Err(e) = runs.remove_tree(name)
                {
                    tracing::warn!(error = %e, "removing an old run record");
                }
            }
        }
    }

    /// Removes what a finished run no longer needs: the job's own directory, and the copy of
    /// its environment's contents. The run's record (`runs/<job>.<epoch>`: whether its monitor
    /// started it, or it was abandoned, and how it ended) stays, for fault drills to check
    /// launches against, until it is pruned; the environment's file stays in it, empty.
    ///
    /// Emptied, not removed: on an ext4 file system without a journal, allocating an inode
    /// skips one by one every inode of its group freed in the last minute (`find_inode_bit`,
    /// `recently_deleted`), and the run records' group allocates six per run. Removing the
    /// environment made each of those walk one more freed inode per run of the last minute
    /// (docs/node-agent.md has the measurements).
    ///
    /// They are where the run's record `run_dir` is (the runtime directory unless the run was
    /// re-adopted from an agent that kept them in the state directory).
    pub(super) fn remove_directories(&self, id: RunId, run_dir: Option<&Path>) {
        if self.config.mode == Mode::Simulated {
            return;
        }
        let Ok(root) = self.root_of(run_dir) else {
            return;
        };
        let name = super::run_name(id);
        if let Ok(jobs) = root.open_subdir(JOBS, JOBS_MODE)
            && let Err(e) = jobs.remove_tree(&name)
        {
            tracing::warn!(job = id.0, epoch = id.1, error = %e, "removing a finished job's directory");
        }
        if let Ok(run) = root
            .open_subdir(RUNS, RUNS_MODE)
            .and_then(|runs| runs.open_subdir(&name, crate::shim::RUN_DIR_MODE))
        {
            let _ = run.empty(ENVIRON);
        }
    }
}

/// How many finished runs' records `runs` may hold: half its file system's inodes' worth
/// (the default 512 MiB runtime tmpfs allows 131,072 inodes: 10,922 records).
fn records_kept(runs: &crate::rootdir::RootDir) -> usize {
    let inodes = nix::sys::statfs::fstatfs(runs.fd()).map_or(0, |fs| fs.files());
    match inodes {
        // Not counted (some file systems say 0): the age limit alone.
        0 => usize::MAX,
        n => usize::try_from(n / (2 * RECORD_INODES)).unwrap_or(usize::MAX),
    }
}
