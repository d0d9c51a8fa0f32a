//! `docket-local bench`: the whole job lifecycle on a running local cluster, as users feel it.
//!
//! Submission benchmarks (`docket-controller bench`) measure the gRPC path alone; what a user
//! of a high-throughput site waits on is `sbatch` as a process, the job starting on an agent,
//! and its end being recorded. So this drives the cluster `docket-local up` started in the
//! state directory with real `sbatch` processes (the cluster's own commands in `STATE/bin`,
//! run as `nobody` when root, like any user's): `loops` concurrent `bash` loops submit `jobs`
//! trivial jobs (`true`) one process each, then one array of `jobs` tasks is submitted. For
//! each phase it follows the jobs through the leader until every one is final and prints:
//! the `sbatch` processes' rate and latency, the jobs per second from the first submission
//! to the last end, submit-to-start and start-to-end latencies (p50/p99, from the replicated
//! submit, start and end times), and the cpu time the leader and the agents spent per job.
//! With `held`, a first phase submits the same number of jobs held (`sbatch -H`), so
//! nothing runs: the submission path alone, process to acknowledgement; they are cancelled
//! afterwards.
//! Nothing is timed against a threshold; it fails only when a job did not complete.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use docket_deploy::stats::{percentiles, process_cpu_ms, process_tree_cpu_ms};
use docket_deploy::{LocalCluster, rpc};
use docket_proto::unix_ms;
use docket_proto::v1 as pb;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    pub jobs: u32,
    pub loops: u32,
    /// Also run the array phase.
    pub array: bool,
    /// First run a phase of held submissions (nothing starts; cancelled after).
    pub held: bool,
}

/// How long a phase may take before the run gives up.
const PHASE_DEADLINE: Duration = Duration::from_secs(900);

/// What one phase measured.
#[derive(Debug, Default)]
pub struct Phase {
    pub name: String,
    pub jobs: usize,
    /// Held submissions: only the `sbatch` figures and the cpu mean anything.
    pub held: bool,
    /// Wall time of each `sbatch` process, ms (one for the array).
    pub sbatch_ms: Vec<u64>,
    /// From the first `sbatch` started to the last one exited, s.
    pub submit_s: f64,
    /// From the first `sbatch` started to the last job's recorded end, s.
    pub complete_s: f64,
    pub submit_to_start_ms: Vec<u64>,
    pub start_to_end_ms: Vec<u64>,
    /// Jobs that ended other than COMPLETED.
    pub not_completed: Vec<(u64, String)>,
    /// Cpu time spent meanwhile, ms: the leader, and each agent (with the processes of the
    /// jobs it ran).
    pub leader_cpu_ms: u64,
    pub agent_cpu_ms: Vec<u64>,
}

/// Runs the phases `spec` asks for against the cluster in `state_dir`, handing each to
/// `done` as it ends (a later phase that fails does not lose the figures of the earlier).
pub async fn run(
    spec: &BenchSpec,
    state_dir: &Path,
    mut done: impl FnMut(&Phase),
) -> Result<Vec<Phase>> {
    let cluster = LocalCluster::open(state_dir)?;
    let bin = state_dir.join("bin");
    let sbatch = bin.join("sbatch");
    if !sbatch.exists() {
        bail!(
            "{} is missing: start the cluster with `docket-local up` first",
            sbatch.display()
        );
    }
    let env: Vec<(String, String)> = cluster
        .env_lines()?
        .iter()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let nonce = unix_ms();
    let submitter = Submitter {
        bin,
        env,
        user: if nix::unistd::geteuid().is_root() {
            nix::unistd::User::from_name("nobody")?.map(|u| (u.uid.as_raw(), u.gid.as_raw()))
        } else {
            None
        },
    };
    let mut phases = Vec::new();
    if spec.held {
        let name = format!("bench-held-{nonce}");
        let phase = loops_phase(spec, &cluster, &submitter, &name, true).await?;
        done(&phase);
        phases.push(phase);
    }
    let name = format!("bench-loops-{nonce}");
    let phase = loops_phase(spec, &cluster, &submitter, &name, false).await?;
    done(&phase);
    phases.push(phase);
    if spec.array {
        let name = format!("bench-array-{nonce}");
        let phase = array_phase(spec, &cluster, &submitter, &name).await?;
        done(&phase);
        phases.push(phase);
    }
    Ok(phases)
}

/// How `sbatch` is run: the cluster's command, its environment, as whom.
#[derive(Debug, Clone)]
struct Submitter {
    /// The cluster's commands.
    bin: PathBuf,
    env: Vec<(String, String)>,
    user: Option<(u32, u32)>,
}

impl Submitter {
    /// The options of one `sbatch --parsable` of a trivial job named `name` with `extra`.
    fn sbatch_args<'a>(name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "--parsable",
            "-J",
            name,
            "-t",
            "5",
            "-o",
            "/dev/null",
            "-D",
            "/tmp",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--wrap", "true"]);
        args
    }

    /// One `sbatch --parsable` of a trivial job named `name` with `extra` options; its
    /// wall time.
    fn submit(&self, name: &str, extra: &[&str]) -> Result<Duration> {
        self.run("sbatch", &Self::sbatch_args(name, extra))
    }

    /// A shell loop, as a user writes one, of `n` such `sbatch` processes one after the
    /// other; each one's wall time, ms. The loop is a `bash` of the submitting user, so each
    /// `sbatch` costs what it costs from a user's loop (a fork of a small shell and the
    /// exec), not a fork of this multi-threaded process.
    fn submit_loop(&self, n: u32, name: &str, extra: &[&str]) -> Result<Vec<u64>> {
        const LOOP: &str = r#"n=$1; shift
for ((i = 0; i < n; i++)); do
    t0=$EPOCHREALTIME
    "$@" >/dev/null || exit 1
    t1=$EPOCHREALTIME
    echo "$t0 $t1"
done"#;
        let sbatch = self.bin.join("sbatch");
        let mut cmd = self.command(Path::new("bash"));
        cmd.args(["-c", LOOP, "bash", &n.to_string()])
            .arg(&sbatch)
            .args(Self::sbatch_args(name, extra));
        let out = cmd.output().context("running a bash loop of sbatch")?;
        if !out.status.success() {
            bail!(
                "a loop's sbatch failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|line| {
                let times = line
                    .split_once(' ')
                    .and_then(|(a, b)| Some((a.parse::<f64>().ok()?, b.parse::<f64>().ok()?)));
                let (t0, t1) = times.ok_or_else(|| anyhow!("the loop printed {line:?}"))?;
                Ok(((t1 - t0) * 1000.0).round().max(0.0) as u64)
            })
            .collect()
    }

    /// `program` with the cluster's environment, in /tmp, as the submitting user.
    fn command(&self, program: &Path) -> std::process::Command {
        let mut cmd = std::process::Command::new(program);
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir("/tmp")
            .stdin(std::process::Stdio::null());
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// One run of the cluster's command `program` with `args` as the submitting user; its
    /// wall time.
    fn run(&self, program: &str, args: &[&str]) -> Result<Duration> {
        let path = self.bin.join(program);
        let mut cmd = self.command(&path);
        cmd.args(args);
        let began = Instant::now();
        let out = cmd
            .output()
            .with_context(|| format!("running {}", path.display()))?;
        let took = began.elapsed();
        if !out.status.success() {
            bail!(
                "{program} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(took)
    }
}

/// `loops` concurrent loops of one `sbatch` process per job; with `held`, the jobs are
/// submitted held (the submission path alone, nothing runs) and cancelled afterwards.
async fn loops_phase(
    spec: &BenchSpec,
    cluster: &LocalCluster,
    submitter: &Submitter,
    name: &str,
    held: bool,
) -> Result<Phase> {
    let loops = spec.loops.clamp(1, spec.jobs.max(1));
    let (title, extra): (String, &'static [&'static str]) = if held {
        let t = format!(
            "{} held sbatch -H processes from {loops} loops (nothing runs)",
            spec.jobs
        );
        (t, &["-H"])
    } else {
        (
            format!("{} sbatch processes from {loops} loops", spec.jobs),
            &[],
        )
    };
    let phase = measure(cluster, name, spec.jobs, title, held, || {
        submit_loops(submitter, name, spec.jobs, loops, extra)
    })
    .await?;
    if held {
        submitter
            .run("scancel", &["-n", name])
            .context("cancelling the held jobs")?;
    }
    Ok(phase)
}

/// `jobs` submissions from `loops` concurrent shell loops, each running one `sbatch` process
/// at a time; every process's wall time, ms.
fn submit_loops(
    submitter: &Submitter,
    name: &str,
    jobs: u32,
    loops: u32,
    extra: &'static [&'static str],
) -> Result<Vec<u64>> {
    let mut handles = Vec::new();
    for k in 0..loops {
        let n = jobs / loops + u32::from(k < jobs % loops);
        let (s, name) = (submitter.clone(), name.to_owned());
        handles.push(std::thread::spawn(move || s.submit_loop(n, &name, extra)));
    }
    let mut sbatch_ms = Vec::new();
    for h in handles {
        sbatch_ms.extend(
            h.join()
                .map_err(|_| anyhow!("a submission loop panicked"))??,
        );
    }
    Ok(sbatch_ms)
}

/// One array of `jobs` tasks.
async fn array_phase(
    spec: &BenchSpec,
    cluster: &LocalCluster,
    submitter: &Submitter,
    name: &str,
) -> Result<Phase> {
    let range = format!("--array=0-{}", spec.jobs.saturating_sub(1));
    let title = format!("an array of {} tasks", spec.jobs);
    measure(cluster, name, spec.jobs, title, false, || {
        Ok(vec![submitter.submit(name, &[&range])?.as_millis() as u64])
    })
    .await
}

/// One phase: `submit` runs the `sbatch` processes (their wall times, ms), then the `jobs`
/// jobs named `name` are followed to their end (unless `held`: nothing will run), and the
/// cpu spent meanwhile is charged.
async fn measure(
    cluster: &LocalCluster,
    name: &str,
    jobs: u32,
    title: String,
    held: bool,
    submit: impl FnOnce() -> Result<Vec<u64>>,
) -> Result<Phase> {
    let before = cpu(cluster).await;
    let first_ms = unix_ms();
    let began = Instant::now();
    let sbatch_ms = submit()?;
    let submit_s = began.elapsed().as_secs_f64();
    let mut phase = if held {
        Phase {
            jobs: sbatch_ms.len(),
            held: true,
            ..Default::default()
        }
    } else {
        follow(cluster, name, jobs as usize, first_ms).await?
    };
    let after = cpu(cluster).await;
    phase.name = title;
    phase.sbatch_ms = sbatch_ms;
    phase.submit_s = submit_s;
    phase.leader_cpu_ms = after.0.saturating_sub(before.0);
    phase.agent_cpu_ms = after
        .1
        .iter()
        .zip(before.1.iter().chain(std::iter::repeat(&0)))
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    Ok(phase)
}

/// Follows the `expected` jobs named `name` until every one is final; their latencies.
async fn follow(
    cluster: &LocalCluster,
    name: &str,
    expected: usize,
    first_ms: u64,
) -> Result<Phase> {
    let started = Instant::now();
    loop {
        if started.elapsed() > PHASE_DEADLINE {
            bail!(
                "the jobs had not all ended after {} s",
                PHASE_DEADLINE.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        let Some((_, addr)) = rpc::leader(&cluster.addrs()).await else {
            continue;
        };
        let Ok(all) = rpc::all_jobs(&addr).await else {
            continue;
        };
        // An array's master stands for its tasks until the last one splits off.
        let ours: Vec<&pb::JobInfo> = all
            .iter()
            .filter(|j| j.name == name && j.array.is_empty())
            .collect();
        if ours.len() < expected || !ours.iter().all(|j| rpc::is_final(j)) {
            continue;
        }
        let mut phase = Phase {
            jobs: ours.len(),
            ..Default::default()
        };
        let mut last_end = first_ms;
        for j in &ours {
            if let (Some(s), Some(e)) = (j.start_time_ms, j.end_time_ms) {
                phase
                    .submit_to_start_ms
                    .push(s.saturating_sub(j.submit_time_ms));
                phase.start_to_end_ms.push(e.saturating_sub(s));
            }
            last_end = last_end.max(j.end_time_ms.unwrap_or(0));
            if j.state_typed() != pb::JobState::Completed {
                phase.not_completed.push((j.job_id, j.state.clone()));
            }
        }
        phase.complete_s = last_end.saturating_sub(first_ms) as f64 / 1000.0;
        return Ok(phase);
    }
}

/// Cpu time so far, ms, of the leader and of each agent.
async fn cpu(cluster: &LocalCluster) -> (u64, Vec<u64>) {
    let leader = rpc::leader(&cluster.addrs()).await.map(|(id, _)| id);
    let leader_ms = cluster
        .record
        .replicas
        .iter()
        .filter(|r| Some(r.id) == leader)
        .filter_map(|r| r.pid)
        .map(|pid| process_cpu_ms(pid, true))
        .sum();
    let agents_ms = cluster
        .record
        .agents
        .iter()
        .map(|a| a.pid.map_or(0, process_tree_cpu_ms))
        .collect();
    (leader_ms, agents_ms)
}

impl Phase {
    /// The figures of this phase, a few lines.
    pub fn render(&self) -> String {
        let per_job = |ms: u64| ms as f64 / self.jobs.max(1) as f64;
        let sbatch = p50_p99(&self.sbatch_ms);
        let mut out = format!("{}:\n", self.name);
        if self.sbatch_ms.len() > 1 {
            out.push_str(&format!(
                "  sbatch processes:   {} in {:.1} s = {:.0}/s; each p50 {} ms, p99 {} ms\n",
                self.sbatch_ms.len(),
                self.submit_s,
                per_s(self.sbatch_ms.len(), self.submit_s),
                sbatch.0,
                sbatch.1,
            ));
        } else {
            out.push_str(&format!(
                "  sbatch:             {} ms\n",
                self.sbatch_ms.first().copied().unwrap_or(0)
            ));
        }
        if !self.held {
            self.render_lifecycle(&mut out);
        }
        let each: Vec<String> = self
            .agent_cpu_ms
            .iter()
            .map(|ms| format!("{:.1}", per_job(*ms)))
            .collect();
        out.push_str(&format!(
            "  cpu per job:        leader {:.1} ms, agents {:.1} ms (each: {})\n",
            per_job(self.leader_cpu_ms),
            per_job(self.agent_cpu_ms.iter().sum()),
            each.join(" / ")
        ));
        if !self.not_completed.is_empty() {
            let states: BTreeSet<&str> =
                self.not_completed.iter().map(|(_, s)| s.as_str()).collect();
            out.push_str(&format!(
                "  NOT COMPLETED:      {} jobs ({})\n",
                self.not_completed.len(),
                states.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
        out
    }

    /// The lines of a phase whose jobs ran: to completion, and the latencies.
    fn render_lifecycle(&self, out: &mut String) {
        let (to_start, to_end) = (
            p50_p99(&self.submit_to_start_ms),
            p50_p99(&self.start_to_end_ms),
        );
        out.push_str(&format!(
            "  to completion:      {} jobs, first submission to last end {:.1} s = {:.1} jobs/s\n",
            self.jobs,
            self.complete_s,
            per_s(self.jobs, self.complete_s)
        ));
        out.push_str(&format!(
            "  submit -> start:    p50 {} ms, p99 {} ms\n",
            to_start.0, to_start.1
        ));
        out.push_str(&format!(
            "  start -> end:       p50 {} ms, p99 {} ms\n",
            to_end.0, to_end.1
        ));
    }
}

/// `n` per second over `s` seconds (0 when no time passed).
fn per_s(n: usize, s: f64) -> f64 {
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

/// The p50 and p99 of `v` (zeros when empty).
fn p50_p99(v: &[u64]) -> (u64, u64) {
    percentiles(v).map_or((0, 0), |(p50, p99, _)| (p50, p99))
}
