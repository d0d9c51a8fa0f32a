//! The quick start's demo: a workload that shows what Docket does, against a running local
//! cluster, then a summary a person can read.
//!
//! 1. A mixed queue: four batch jobs take most of the cpus; a job that wants every node
//!    exclusively waits for them; a short one-cpu job submitted after it starts at once
//!    (backfill: it ends before the wide job could start); a job that allocates far more than
//!    its memory limit is killed for it.
//! 2. The leader is killed with SIGKILL while jobs run: a new one is elected and schedules
//!    again; the killed replica restarts on its data and catches up.
//! 3. Preemption: batch jobs fill the cpus; a large express job (a higher tier) suspends some
//!    of them, runs, and they resume and finish afterwards.
//!
//! Every job appends `ID start` to `runs.log` when it starts, so the summary can say that no
//! job ran twice; every acknowledged job must reach a final state: none lost.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use docket_deploy::{LocalCluster, drill, rpc};
use docket_proto::v1 as pb;

/// The demo's outcome, for the summary and the tests.
#[derive(Debug, Default)]
pub struct DemoReport {
    pub submitted: Vec<u64>,
    pub states: BTreeMap<u64, String>,
    pub lost: Vec<u64>,
    pub ran_twice: Vec<u64>,
    pub oom_state: String,
    pub backfilled: bool,
    pub suspended: Vec<u64>,
    pub express_ran: bool,
    pub drill: Option<drill::DrillReport>,
    pub seconds: u64,
}

impl DemoReport {
    /// Whether everything the demo set out to show happened.
    pub fn ok(&self) -> bool {
        self.lost.is_empty()
            && self.ran_twice.is_empty()
            && self.oom_state == "OUT_OF_MEMORY"
            && self.backfilled
            && !self.suspended.is_empty()
            && self.express_ran
            && self.drill.as_ref().is_some_and(|d| d.lost_jobs.is_empty())
    }

    /// The summary printed at the end.
    pub fn summary(&self) -> String {
        let yes = |b: bool| if b { "yes" } else { "NO" };
        let mut s = String::from("\n=== Docket demo: what happened ===\n");
        s.push_str(&format!(
            "  jobs submitted:            {} (over partitions batch and express)\n",
            self.submitted.len()
        ));
        s.push_str(&format!(
            "  backfill:                  {} (a 1-cpu job submitted after a blocked 4-node job started first)\n",
            yes(self.backfilled)
        ));
        s.push_str(&format!(
            "  memory limit:              the job allocating 300 MB under a 64 MB limit ended {}\n",
            self.oom_state
        ));
        s.push_str(&format!(
            "  express preemption:        {} batch job(s) suspended for the express job ({}), all resumed and finished\n",
            self.suspended.len(),
            if self.express_ran { "it ran" } else { "it did NOT run" }
        ));
        if let Some(d) = &self.drill {
            s.push_str(&format!(
                "  leader killed (replica {}): new leader {} elected after {} ms; first write committed after {} ms; first job started after {}\n",
                d.killed,
                d.new_leader,
                d.elected_ms,
                d.first_write_ms,
                d.first_start_ms
                    .map_or("(not within the deadline)".into(), |m| format!("{m} ms"))
            ));
        }
        s.push_str(&format!(
            "  jobs lost:                 {}\n  jobs run twice:            {}\n",
            self.lost.len(),
            self.ran_twice.len()
        ));
        let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
        for st in self.states.values() {
            *by_state.entry(st.as_str()).or_default() += 1;
        }
        let states: Vec<String> = by_state.iter().map(|(k, v)| format!("{v} {k}")).collect();
        s.push_str(&format!(
            "  final states:              {}\n",
            states.join(", ")
        ));
        s.push_str(&format!(
            "  took:                      {} s\n  verdict:                   {}\n",
            self.seconds,
            if self.ok() {
                "everything shown, nothing lost"
            } else {
                "SOMETHING DID NOT HAPPEN (see above)"
            }
        ));
        s
    }
}

struct Demo<'a> {
    cluster: &'a mut LocalCluster,
    work: String,
    report: DemoReport,
    start: Instant,
}

const DEADLINE: Duration = Duration::from_secs(90);

fn spec(name: &str, partition: &str, cpus: u32, seconds: u32, limit: i64) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        partition: partition.into(),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: cpus,
        time_limit_seconds: Some(limit),
        script: format!("#!/bin/sh\necho \"$SLURM_JOB_ID start\" >> runs.log\nsleep {seconds}\n")
            .into_bytes(),
        stdout: "demo-%j.out".into(),
        ..Default::default()
    }
}

impl Demo<'_> {
    fn say(&self, what: &str) {
        println!("[{:>5.1}s] {what}", self.start.elapsed().as_secs_f64());
    }

    /// Submits as `nobody`, through any replica (retried through elections).
    async fn submit(&mut self, mut job: pb::JobSpec) -> Result<u64> {
        job.work_dir = self.work.clone();
        let start = Instant::now();
        loop {
            for addr in self.cluster.addrs() {
                let Ok(mut c) = rpc::jobs(&addr) else {
                    continue;
                };
                let req = rpc::as_user(
                    "nobody",
                    pb::SubmitJobsRequest {
                        jobs: vec![job.clone()],
                    },
                );
                match c.submit_jobs(req).await {
                    Ok(r) => match r
                        .into_inner()
                        .results
                        .first()
                        .and_then(|x| x.result.clone())
                    {
                        Some(pb::submit_result::Result::JobId(id)) => {
                            self.report.submitted.push(id);
                            return Ok(id);
                        }
                        Some(pb::submit_result::Result::Error(e)) => {
                            bail!("submitting {}: {e}", job.name)
                        }
                        None => bail!("submitting {}: no answer", job.name),
                    },
                    Err(s) if s.code() == tonic::Code::Unavailable => {}
                    Err(_) => {}
                }
            }
            if start.elapsed() > DEADLINE {
                bail!(
                    "no replica accepted {} within {} s",
                    job.name,
                    DEADLINE.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn jobs(&self) -> Result<BTreeMap<u64, pb::JobInfo>> {
        for addr in self.cluster.addrs() {
            if let Ok(jobs) = rpc::all_jobs(&addr).await {
                return Ok(jobs.into_iter().map(|j| (j.job_id, j)).collect());
            }
        }
        Err(anyhow!("no replica answered"))
    }

    /// Polls until `done` says so, giving it the queue.
    async fn until(
        &self,
        what: &str,
        mut done: impl FnMut(&BTreeMap<u64, pb::JobInfo>) -> bool,
    ) -> Result<BTreeMap<u64, pb::JobInfo>> {
        let start = Instant::now();
        loop {
            if let Ok(jobs) = self.jobs().await
                && done(&jobs)
            {
                return Ok(jobs);
            }
            if start.elapsed() > DEADLINE {
                bail!("waited {} s for {what}", DEADLINE.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn running(jobs: &BTreeMap<u64, pb::JobInfo>, ids: &[u64]) -> bool {
    ids.iter()
        .all(|id| jobs.get(id).is_some_and(|j| j.start_time_ms.is_some()))
}

/// Runs the demo against `cluster`.
pub async fn run(cluster: &mut LocalCluster) -> Result<DemoReport> {
    let work = cluster.record.state_dir.join("demo");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    std::fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .with_context(|| format!("opening {} to the demo's user", work.display()))?;
    let mut demo = Demo {
        cluster,
        work: work.display().to_string(),
        report: DemoReport::default(),
        start: Instant::now(),
    };

    // 1. A mixed queue, a blocked wide job, a backfilled one, a memory hog.
    let (first, wide) = demo.mixed_queue().await?;

    // 2. Kill the leader while jobs run.
    demo.kill_leader().await?;

    // 3. Express preemption: wait for the first wave to clear, fill, then go express.
    demo.express_preemption(&first, wide).await?;

    // Every acknowledged job final, none twice.
    demo.final_states().await;
    let runs = std::fs::read_to_string(work.join("runs.log")).unwrap_or_default();
    demo.report.ran_twice = ran_twice(&runs);
    demo.report.seconds = demo.start.elapsed().as_secs();
    Ok(demo.report)
}

impl Demo<'_> {
    /// Part 1: four batch jobs take most of the cpus, a wide exclusive job waits for them, a
    /// small one is backfilled and a memory hog is killed; the batch jobs' and the wide job's
    /// ids.
    async fn mixed_queue(&mut self) -> Result<(Vec<u64>, u64)> {
        self.say("submitting four 4-cpu batch jobs (20 s each, 1 min limit)");
        let mut first = Vec::new();
        for i in 1..=4 {
            first.push(
                self.submit(spec(&format!("batch-{i}"), "batch", 4, 20, 60))
                    .await?,
            );
        }
        self.until("the four batch jobs to start", |j| running(j, &first))
            .await?;
        let mut wide = spec("wide", "batch", 1, 3, 60);
        wide.nodes = 4;
        wide.ntasks = 4;
        wide.exclusive = true;
        let wide = self.submit(wide).await?;
        self.say("submitted a job wanting all four nodes exclusively: it must wait");
        let small = self.submit(spec("small", "batch", 1, 3, 20)).await?;
        self.say("submitted a 1-cpu, 20 s-limit job after it");
        let mut hog = spec("memory-hog", "batch", 1, 0, 60);
        hog.memory = Some(pb::job_spec::Memory::MemPerNodeMib(64));
        hog.script = b"#!/bin/sh\necho \"$SLURM_JOB_ID start\" >> runs.log\ndd if=/dev/zero of=/dev/null bs=300M count=1\n".to_vec();
        let hog = self.submit(hog).await?;
        self.say("submitted a job that allocates 300 MB with a 64 MB limit");
        let jobs = self
            .until("the small job and the memory hog to end", |j| {
                [small, hog]
                    .iter()
                    .all(|id| j.get(id).is_some_and(rpc::is_final))
            })
            .await?;
        self.judge_backfill_and_memory(&jobs, wide, small, hog);
        Ok((first, wide))
    }

    /// Whether the small job started before the wide one (backfill), and how the memory hog
    /// ended, from the queue `jobs`.
    fn judge_backfill_and_memory(
        &mut self,
        jobs: &BTreeMap<u64, pb::JobInfo>,
        wide: u64,
        small: u64,
        hog: u64,
    ) {
        let started = |id: u64| jobs.get(&id).and_then(|j| j.start_time_ms);
        self.report.backfilled = match (started(small), started(wide)) {
            (Some(_), None) => true,
            (Some(s), Some(w)) => s < w,
            _ => false,
        };
        self.report.oom_state = jobs.get(&hog).map(|j| j.state.clone()).unwrap_or_default();
        self.say(&format!(
            "the small job {} the wide one; the memory hog ended {}",
            if self.report.backfilled {
                "started before (backfill)"
            } else {
                "did NOT start before"
            },
            self.report.oom_state
        ));
    }

    /// Part 2: kills the leader with SIGKILL while jobs run, and records the drill.
    async fn kill_leader(&mut self) -> Result<()> {
        self.say("killing the leader (SIGKILL) while jobs run");
        let report = drill::kill_leader(self.cluster, "batch", true, DEADLINE).await?;
        self.say(&format!(
            "replica {} killed; replica {} leads after {} ms; a write committed after {} ms; scheduling again after {}; replica {} restarted",
            report.killed,
            report.new_leader,
            report.elected_ms,
            report.first_write_ms,
            report
                .first_start_ms
                .map_or("(not yet)".into(), |m| format!("{m} ms")),
            report.killed
        ));
        self.report.submitted.push(report.probe_job);
        self.report.drill = Some(report);
        Ok(())
    }

    /// Part 3: once the `first` wave and the `wide` job are over, six batch jobs fill the
    /// cpus and an express job suspends some of them to run.
    async fn express_preemption(&mut self, first: &[u64], wide: u64) -> Result<()> {
        self.until("the first wave to finish", |j| {
            first
                .iter()
                .chain([&wide])
                .all(|id| j.get(id).is_some_and(rpc::is_final))
        })
        .await?;
        self.say("the first wave finished; the wide job ran after it");
        let mut fill = Vec::new();
        for i in 1..=6 {
            fill.push(
                self.submit(spec(&format!("normal-{i}"), "batch", 4, 12, 120))
                    .await?,
            );
        }
        self.until("six batch jobs to fill the cluster", |j| running(j, &fill))
            .await?;
        self.say("six 4-cpu batch jobs fill all 24 cpus");
        let mut express = spec("express-big", "express", 4, 4, 60);
        express.nodes = 2;
        express.ntasks = 2;
        let express = self.submit(express).await?;
        self.say("submitted an 8-cpu express job (a higher tier)");
        let mut suspended = std::collections::BTreeSet::new();
        let jobs = self
            .until("the express job to end and the batch jobs to finish", |j| {
                for id in &fill {
                    if j.get(id).is_some_and(|x| x.state_code == "S") {
                        suspended.insert(*id);
                    }
                }
                fill.iter()
                    .chain([&express])
                    .all(|id| j.get(id).is_some_and(rpc::is_final))
            })
            .await?;
        self.report.express_ran = jobs
            .get(&express)
            .is_some_and(|j| j.state_typed() == pb::JobState::Completed);
        self.report.suspended = suspended.into_iter().collect();
        self.say(&format!(
            "the express job {}; batch jobs {:?} were suspended for it and resumed",
            if self.report.express_ran {
                "ran"
            } else {
                "did NOT run"
            },
            self.report.suspended
        ));
        Ok(())
    }

    /// Waits for every acknowledged job to reach a final state; records those lost and the
    /// final states of the others.
    async fn final_states(&mut self) {
        let ids = self.report.submitted.clone();
        let jobs = self
            .until("every job to reach a final state", |j| {
                ids.iter().all(|id| j.get(id).is_some_and(rpc::is_final))
            })
            .await
            .unwrap_or_default();
        self.report.lost = ids
            .iter()
            .copied()
            .filter(|id| !jobs.contains_key(id))
            .collect();
        self.report.states = jobs
            .iter()
            .filter(|(id, _)| ids.contains(id))
            .map(|(id, j)| (*id, j.state.clone()))
            .collect();
    }
}

/// The jobs `runs.log` (`ID start` lines) shows starting more than once.
fn ran_twice(runs: &str) -> Vec<u64> {
    let mut starts: BTreeMap<u64, usize> = BTreeMap::new();
    for line in runs.lines() {
        if let Some(id) = line.split_whitespace().next().and_then(|x| x.parse().ok()) {
            *starts.entry(id).or_default() += 1;
        }
    }
    starts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| *id)
        .collect()
}
