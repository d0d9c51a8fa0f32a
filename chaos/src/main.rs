//! `docket-chaos`: proves under faults that Docket loses nothing.
//!
//! `run` starts a real local cluster (3 or 5 replicas, real agents and simulated ones for
//! scale), drives a workload of submissions, cancels, holds and suspends from many
//! concurrent clients while injecting faults on a seeded schedule, then checks the recorded
//! history against every replica's queue and the jobs' own run log, and prints the figures
//! and the seed. `drill` performs one fault against a running `docket-local` cluster and
//! reports the same recovery figures.

mod check;
mod faults;
mod history;
mod launches;
mod memory;
mod observe;
mod sim;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use clap::{Parser, Subcommand, ValueEnum};
use docket_deploy::{Layout, LocalCluster, rpc};
use docket_proto::v1 as pb;

use crate::history::{FaultKind, History};

/// Fault injection and invariant checking for Docket.
///
/// Starts a real cluster, drives a concurrent workload, injects faults on a seeded schedule,
/// then checks the recorded history: every acknowledged job exists exactly once, no job ran
/// twice, every job finished, no replica leads an older term after a newer one, every replica
/// agrees. Prints the figures and the seed that reproduces the run.
#[derive(Debug, Parser)]
#[command(
    name = "docket-chaos",
    version,
    about,
    long_about,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    KillLeader,
    KillFollower,
    Pause,
    KillAgent,
    PartitionLeader,
    PartitionFollower,
    PartitionFromAgents,
    PartitionFollowerFromAgents,
    AgentCrashLaunch,
    AgentCrashExit,
    DiskFull,
    ClockJump,
}

impl Kind {
    fn fault(self) -> FaultKind {
        match self {
            Kind::KillLeader => FaultKind::KillLeader,
            Kind::KillFollower => FaultKind::KillFollower,
            Kind::Pause => FaultKind::PauseLeader,
            Kind::KillAgent => FaultKind::KillAgent,
            Kind::PartitionLeader => FaultKind::PartitionLeader,
            Kind::PartitionFollower => FaultKind::PartitionFollower,
            Kind::PartitionFromAgents => FaultKind::PartitionLeaderFromAgents,
            Kind::PartitionFollowerFromAgents => FaultKind::PartitionFollowerFromAgents,
            Kind::AgentCrashLaunch => FaultKind::AgentCrashAtLaunch,
            Kind::AgentCrashExit => FaultKind::AgentCrashAtExit,
            Kind::DiskFull => FaultKind::DiskFullLeader,
            Kind::ClockJump => FaultKind::ClockJump,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// A seeded run against a fresh local cluster.
    Run {
        /// The seed (default: from the clock; printed at the end).
        #[arg(long)]
        seed: Option<u64>,
        /// How many faults to inject.
        #[arg(long, default_value_t = 10)]
        faults: usize,
        /// A soak: run this long, with a fault every 10-30 s (instead of `--faults` 1.5-4 s
        /// apart), and report every daemon's memory over the run (`rss.csv` in the state
        /// directory).
        #[arg(long)]
        minutes: Option<u64>,
        /// Which kinds (default: all).
        #[arg(long, value_enum, value_delimiter = ',')]
        kinds: Vec<Kind>,
        /// Take the kinds in turn instead of at random (every kind in a short run).
        #[arg(long)]
        each: bool,
        #[arg(long, default_value_t = 3)]
        replicas: u32,
        /// Agents that run real jobs.
        #[arg(long, default_value_t = 3)]
        agents: u32,
        /// Agents in simulated execution, for scale.
        #[arg(long, default_value_t = 8)]
        simulated_agents: u32,
        #[arg(long, default_value_t = 8)]
        clients: u32,
        /// Jobs sleep 1..=this many seconds.
        #[arg(long, default_value_t = 2)]
        job_seconds: u32,
        /// Each client's mean pause between two operations, ms (drawn from a fifth of it to
        /// nine fifths). Paces the workload: a soak whose clients submit faster than the
        /// agents run jobs only grows its queue.
        #[arg(long, default_value_t = 110, value_parser = clap::value_parser!(u64).range(5..=60_000))]
        think_ms: u64,
        /// Where the cluster lives (default: a fresh temporary directory, removed after).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Where docket-controller and docket-nodeagent are (default: next to this binary).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
    },
    /// Deterministic simulation of the replicated core over many seeds.
    Sim {
        /// First seed.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// How many seeds (from, from+1, ...).
        #[arg(long, default_value_t = 100)]
        seeds: u64,
        /// Client steps per seed.
        #[arg(long, default_value_t = 150)]
        steps: u32,
        /// Run every seed twice and require the same trace (determinism).
        #[arg(long)]
        twice: bool,
        /// Replicas whose crashes lose unsynced writes (to see the checkers catch it).
        #[arg(long)]
        broken_store: bool,
    },
    /// One fault on the leader of a running cluster, with the recovery figures: time to a new
    /// leader, to the first committed write and to the first job started, and for the old
    /// leader to rejoin once healed. A docket-local cluster by default; any cluster with
    /// `--addrs`, `--ca` and the operator's own `--fault-cmd` / `--heal-cmd`.
    Drill {
        #[arg(value_enum)]
        kind: DrillKind,
        #[arg(long, env = "DOCKET_LOCAL_DIR", default_value = "/tmp/docket-local")]
        state_dir: PathBuf,
        /// How long the fault lasts at least (ms); a killed leader is restarted after the
        /// measurements.
        #[arg(long, alias = "pause-ms", default_value_t = 3000)]
        hold_ms: u64,
        /// Any cluster: its replicas' client addresses (`host:port`, comma-separated). Calls
        /// go as the commands' do: `--ca`, and the credential this host's docket-authd (or
        /// munged: `DOCKET_AUTH_TYPE`, `DOCKET_AUTH_SOCKET`) signs for whoever runs the drill
        /// (an administrator: root).
        #[arg(long, value_delimiter = ',', requires_all = ["ca", "fault_cmd", "heal_cmd"])]
        addrs: Vec<String>,
        /// The cluster CA's certificate (`[controller] CaFile`).
        #[arg(long)]
        ca: Option<PathBuf>,
        /// The shell command that breaks a replica: `{id}`, `{addr}` and `{host}` are
        /// replaced, e.g. `ssh {host} systemctl kill -s KILL docket-controller`.
        #[arg(long)]
        fault_cmd: Option<String>,
        /// The shell command that heals it, e.g. `ssh {host} systemctl start docket-controller`.
        #[arg(long)]
        heal_cmd: Option<String>,
        /// The partition the probe job (one cpu, one second) runs in.
        #[arg(long, default_value = "batch")]
        partition: String,
        /// The probe job's working directory on the nodes (a docket-local cluster's state
        /// directory by default).
        #[arg(long)]
        work_dir: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DrillKind {
    KillLeader,
    Pause,
    /// Cut the leader off from the other replicas (a cluster started with `--netns`).
    Partition,
}

fn bin_dir(explicit: Option<PathBuf>) -> Result<PathBuf> {
    Ok(docket_deploy::bin_dir(explicit)?)
}

/// Every job the replica at `addr` answers `sacct` for, queued or archived, all pages.
async fn accounting(addr: &str) -> Result<Vec<pb::AccountingRecord>> {
    let mut c = rpc::jobs(addr)?;
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .accounting(rpc::as_user(
                "root",
                pb::AccountingRequest {
                    page_size: 10_000,
                    page_token: token.clone(),
                    ..Default::default()
                },
            ))
            .await
            .map_err(|s| anyhow!("accounting: {}", s.message()))?
            .into_inner();
        out.extend(page.records);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

/// Every job the leader knows, queued or archived.
async fn queue_and_archive(leader: &str) -> Result<Vec<pb::JobInfo>> {
    Ok(accounting(leader)
        .await?
        .into_iter()
        .filter_map(|r| r.job)
        .collect())
}

/// Each replica's `sacct` answer as (job, state, charge, archived), once they agree (or after
/// `deadline`): the archive is replicated state, so every replica must answer alike.
async fn converged_accounting(
    cluster: &LocalCluster,
    deadline: Duration,
) -> Vec<(String, Vec<check::AccountingRow>)> {
    let start = Instant::now();
    loop {
        let mut views = Vec::new();
        for addr in cluster.addrs() {
            let rows = accounting(&addr)
                .await
                .map(|records| records.iter().map(check::AccountingRow::of).collect())
                .unwrap_or_default();
            views.push((addr, rows));
        }
        if views.windows(2).all(|w| w[0].1 == w[1].1) || start.elapsed() > deadline {
            return views;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Each replica's own (stale, all pages) view of the queue, once they agree (or after
/// `deadline`).
async fn converged(cluster: &LocalCluster, deadline: Duration) -> Vec<Vec<pb::JobInfo>> {
    let start = Instant::now();
    loop {
        let mut views = Vec::new();
        for addr in cluster.addrs() {
            views.push(
                rpc::all_jobs_read(&addr, pb::ReadConsistency::Stale)
                    .await
                    .unwrap_or_default(),
            );
        }
        let key = |v: &Vec<pb::JobInfo>| -> Vec<(u64, String)> {
            v.iter().map(|j| (j.job_id, j.state_code.clone())).collect()
        };
        if views.windows(2).all(|w| key(&w[0]) == key(&w[1])) || start.elapsed() > deadline {
            return views;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What one `docket-chaos run` does (its command-line options).
#[derive(Debug)]
struct RunSpec {
    seed: u64,
    faults: usize,
    minutes: Option<u64>,
    kinds: Vec<Kind>,
    each: bool,
    replicas: u32,
    agents: u32,
    simulated: u32,
    clients: u32,
    job_seconds: u32,
    /// A client's pause between two operations, ms (drawn uniformly from this range).
    think_ms: (u64, u64),
    state_dir: Option<PathBuf>,
    bins: PathBuf,
}

/// How many times the controllers returned a node to service on their own (their logs'
/// "returned to service" lines): nodes declared down for not responding whose agent came
/// back, with nobody resuming them (`--return-to-service 1`, the default).
fn returned_to_service(logs: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(logs) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("controller-"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|log| log.matches("node returned to service").count())
        .sum()
}

async fn run(spec: RunSpec) -> Result<bool> {
    // A temporary directory goes when the run ends; a chosen one stays for reading
    // (history.jsonl, logs/, work/runs.log).
    let temporary = spec.state_dir.is_none();
    let state = spec.state_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("docket-chaos-{}-{}", spec.seed, std::process::id()))
    });
    let kinds = fault_kinds(&spec.kinds);
    let layout = chaos_layout(&spec, &kinds, &state)?;
    let mut cluster = LocalCluster::start(&layout)?;
    let outcome = async {
        cluster.wait_ready(Duration::from_secs(60)).await?;
        let work = state.join("work");
        std::fs::create_dir_all(&work)?;
        let (history, memory) = drive(&spec, &kinds, &mut cluster, &state, &work).await?;
        // Every job must finish by itself now that the faults stopped (once the clients'
        // holds and suspensions are undone).
        let (_, leader) = cluster.wait_ready(Duration::from_secs(60)).await?;
        drain(&leader).await;
        let returned = returned_to_service(&state.join("logs"));
        println!(
            "the controllers returned {returned} nodes to service after their agents came back"
        );
        verdict(&cluster, &state, &work, &history, &memory, spec.seed).await
    };
    // Asked to stop (a test runner's timeout, Ctrl-C): the cluster goes all the same.
    let outcome = tokio::select! {
        o = outcome => o,
        signal = docket_deploy::interrupted() => {
            Err(anyhow::anyhow!("interrupted by {signal}; stopping the cluster"))
        }
    };
    let sweep = cluster.stop(temporary).await;
    if let Err(e) = sweep {
        eprintln!("docket-chaos: warning: stopping the cluster: {e}");
    }
    outcome
}

/// The kinds asked for, or every kind this host can inject (partitions and full disks need
/// root, clock jumps libfaketime).
fn fault_kinds(kinds: &[Kind]) -> Vec<FaultKind> {
    let root = nix::unistd::geteuid().is_root();
    if kinds.is_empty() {
        let mut all = vec![
            FaultKind::KillLeader,
            FaultKind::KillFollower,
            FaultKind::PauseLeader,
            FaultKind::KillAgent,
            FaultKind::AgentCrashAtLaunch,
            FaultKind::AgentCrashAtExit,
        ];
        if root {
            all.extend([
                FaultKind::PartitionLeader,
                FaultKind::PartitionFollower,
                FaultKind::PartitionLeaderFromAgents,
                FaultKind::PartitionFollowerFromAgents,
                FaultKind::DiskFullLeader,
            ]);
        }
        // Clock jumps need libfaketime; without it the run covers the rest.
        if docket_deploy::local::faketime_available() {
            all.push(FaultKind::ClockJump);
        }
        all
    } else {
        kinds.iter().map(|k| k.fault()).collect()
    }
}

/// The cluster a run starts: what its fault kinds need (namespaces, disks of their own, fake
/// clocks), liveness short enough that a killed agent's node recovers within the run, and
/// frequent archiving and snapshots.
fn chaos_layout(spec: &RunSpec, kinds: &[FaultKind], state: &std::path::Path) -> Result<Layout> {
    let root = nix::unistd::geteuid().is_root();
    let netns = kinds.iter().any(|k| k.needs_netns());
    if netns && !root {
        bail!("partitions need root (network namespaces)");
    }
    let own_disks = kinds.iter().any(|k| k.needs_own_disk());
    if own_disks && !root {
        bail!("filling a disk needs root (a tmpfs per replica)");
    }
    let mut layout = Layout::new(
        spec.replicas,
        spec.agents,
        spec.simulated,
        state.to_path_buf(),
        spec.bins.clone(),
    );
    layout.netns = netns;
    layout.data_disk_mib = own_disks.then_some(256);
    layout.fake_clocks = kinds.iter().any(|k| k.needs_fake_clock());
    // Liveness short enough that a killed agent's node recovers within a run.
    layout.agent_fence_ms = 6_000;
    layout.node_down_margin_ms = 3_000;
    layout.kill_grace_s = 1;
    // Jobs reach the archive within the run, and replicas snapshot (queue and archive)
    // often, so one that was down catches up by snapshot: the checkers then compare every
    // replica's archive, whichever path it took.
    layout.min_job_age_s = 5;
    layout.snapshot_every_entries = Some(500);
    layout.snapshot_keep_entries = Some(100);
    Ok(layout)
}

/// The faulty stretch: the clients and the leader observer run while the faults are
/// injected, then stop; every daemon's memory is sampled throughout (`rss.csv`).
async fn drive(
    spec: &RunSpec,
    kinds: &[FaultKind],
    cluster: &mut LocalCluster,
    state: &std::path::Path,
    work: &std::path::Path,
) -> Result<(History, memory::Samples)> {
    let RunSpec {
        seed,
        faults,
        minutes,
        each,
        replicas,
        agents,
        simulated,
        clients,
        job_seconds,
        think_ms,
        ..
    } = *spec;
    let (planned, until) = match minutes {
        Some(m) => (
            faults::plan(seed, (m * 3) as usize + 1, kinds, each, (10_000, 30_000)),
            Some(Instant::now() + Duration::from_secs(m * 60)),
        ),
        None => (
            faults::plan(seed, faults, kinds, each, (1_500, 4_000)),
            None,
        ),
    };
    println!(
        "docket-chaos: seed {seed}, {} replicas, {} agents ({} simulated), {clients} clients, {}{} faults",
        replicas,
        agents + simulated,
        simulated,
        if until.is_some() { "up to " } else { "" },
        planned.len()
    );
    let history = History::new();
    let stop = Arc::new(AtomicBool::new(false));
    let memory = tokio::spawn(memory::sample(
        state.to_path_buf(),
        Duration::from_secs(if minutes.is_some() { 30 } else { 5 }),
        stop.clone(),
    ));
    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(observe::leaders(
        cluster.addrs(),
        history.clone(),
        stop.clone(),
    )));
    for id in 0..clients {
        let partition = if simulated > 0 && id % 3 == 2 {
            "sim"
        } else {
            "batch"
        };
        let w = workload::Workload {
            partition: partition.into(),
            work_dir: work.display().to_string(),
            max_job_seconds: job_seconds,
            think_ms,
        };
        tasks.push(tokio::spawn(workload::client(
            id,
            seed,
            w,
            cluster.addrs(),
            history.clone(),
            stop.clone(),
        )));
    }
    let injected = faults::inject(cluster, &planned, &history, until).await;
    // A last quiet stretch, so the recovery after the last fault is measured too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let memory = memory.await.unwrap_or_default();
    let _ = std::fs::write(state.join("rss.csv"), memory::csv(&memory));
    injected?;
    Ok((history, memory))
}

/// Waits for the backlog the faults left: until every job is final, or none has ended for
/// `STALLED` (the cluster stopped making progress: the checker then names what never
/// finished), or `DRAIN_CAP`; prints what is still unfinished.
async fn drain(leader: &str) {
    workload::settle(leader).await;
    const STALLED: Duration = Duration::from_secs(60);
    const DRAIN_CAP: Duration = Duration::from_secs(900);
    let start = Instant::now();
    println!("faults over; waiting for every job to finish");
    let (mut backlog, mut fewest, mut progress) = (None, usize::MAX, Instant::now());
    loop {
        // A hold or suspension whose answer the client never got (it timed out during a
        // fault) may still commit after the first settling: undo those too.
        workload::settle(leader).await;
        let Ok(jobs) = rpc::all_jobs(leader).await else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let unfinished = jobs.iter().filter(|j| !rpc::is_final(j)).count();
        backlog.get_or_insert(unfinished);
        if unfinished < fewest {
            (fewest, progress) = (unfinished, Instant::now());
        }
        if unfinished == 0 || progress.elapsed() > STALLED || start.elapsed() > DRAIN_CAP {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "drained in {} s ({} jobs unfinished when the faults stopped, {} now)",
        start.elapsed().as_secs(),
        backlog.unwrap_or(0),
        fewest.min(backlog.unwrap_or(0))
    );
    // What is still unfinished, for whoever reads a failed run.
    if let Ok(jobs) = rpc::all_jobs(leader).await {
        for j in jobs.iter().filter(|j| !rpc::is_final(j)) {
            println!(
                "  unfinished: job {} {} reason {} held {} nodes {:?} started {:?} requeues {}",
                j.job_id, j.state, j.reason, j.held, j.node_list, j.start_time_ms, j.requeue_count
            );
        }
    }
}

/// Every checker over the history, the jobs (queue and archive), every replica's view and
/// accounting, and the agents' launch records; prints the report and the memory summary.
async fn verdict(
    cluster: &LocalCluster,
    state: &std::path::Path,
    work: &std::path::Path,
    history: &History,
    memory: &memory::Samples,
    seed: u64,
) -> Result<bool> {
    let wall_start = history.wall_at(0);
    let (_, leader) = cluster.wait_ready(Duration::from_secs(30)).await?;
    let mut views = converged(cluster, Duration::from_secs(30)).await;
    // The leader's view first.
    if let Some(pos) = cluster.addrs().iter().position(|a| *a == leader) {
        views.swap(0, pos);
    }
    let log = std::fs::read_to_string(work.join("runs.log")).unwrap_or_default();
    let _ = std::fs::write(state.join("history.jsonl"), history.to_jsonl());
    let all_jobs = queue_and_archive(&leader).await?;
    let mut report = check::check(&history.lock(), &all_jobs, &views, &log, wall_start);
    let answers = converged_accounting(cluster, Duration::from_secs(30)).await;
    report.accounting_diverged = check::accounting_divergence(&answers);
    report.archived = answers
        .first()
        .map_or(0, |(_, rows)| rows.iter().filter(|r| r.archived).count());
    let requeues = all_jobs
        .iter()
        .map(|j| (j.job_id, j.requeue_count))
        .collect();
    report.launches = launches::check(
        &launches::read(&state.join(docket_deploy::local::RUNTIME_DIR)),
        &log,
        &requeues,
    );
    print!("{}", check::render(&report, seed));
    println!(
        "memory (resident, every daemon; a process a fault restarted starts a new curve):\n{}",
        memory::summary(memory, 120)
    );
    Ok(report.ok())
}

/// The cluster a drill breaks.
enum DrillTarget {
    /// One `docket-local` started, by its state directory.
    Local(PathBuf),
    /// Any cluster, reached as the commands reach it, broken by the operator's commands.
    Any {
        addrs: Vec<String>,
        ca: PathBuf,
        commands: docket_deploy::drill::Commands,
    },
}

async fn drill(
    kind: DrillKind,
    target: DrillTarget,
    hold_ms: u64,
    partition: String,
    work_dir: Option<String>,
) -> Result<()> {
    use docket_deploy::drill::{self, DrillOptions, Fault};
    let fault = match kind {
        DrillKind::KillLeader => Fault::Kill,
        DrillKind::Pause => Fault::Pause,
        DrillKind::Partition => Fault::Partition,
    };
    let mut options = DrillOptions {
        partition,
        work_dir: work_dir.unwrap_or_else(|| "/tmp".into()),
        hold: Duration::from_millis(hold_ms),
        deadline: Duration::from_secs(60),
        heal: true,
    };
    let report = match target {
        DrillTarget::Local(state_dir) => {
            let mut cluster = LocalCluster::open(&state_dir)?;
            if options.work_dir == "/tmp" {
                options.work_dir = state_dir.display().to_string();
            }
            let addrs = cluster.addrs();
            drill::run(&mut cluster, fault, &addrs, &options).await?
        }
        DrillTarget::Any {
            addrs,
            ca,
            mut commands,
        } => {
            let source = docket_auth::source::CredentialSource::new(
                std::env::var("DOCKET_AUTH_TYPE")
                    .unwrap_or_else(|_| "auth/docket".into())
                    .parse()
                    .map_err(|e: String| anyhow!("DOCKET_AUTH_TYPE: {e}"))?,
                std::env::var_os("DOCKET_AUTH_SOCKET").map(PathBuf::from),
            )?;
            rpc::use_site(&ca, source)?;
            drill::run(&mut commands, fault, &addrs, &options).await?
        }
    };
    println!("{report}");
    if report.rejoined_ms.is_none() {
        bail!("replica {} did not rejoin as a follower", report.killed);
    }
    Ok(())
}

/// `docket-chaos sim`: each seed on its own single-threaded runtime with virtual time.
fn simulate(from: u64, seeds: u64, steps: u32, twice: bool, broken: bool) -> bool {
    let run = |seed| {
        if broken {
            sim::run_seed_broken(seed, steps)
        } else {
            sim::run_seed(seed, steps)
        }
    };
    let started = Instant::now();
    let mut failed = Vec::new();
    let (mut acked, mut crashes, mut partitions, mut lossy, mut dropped) = (0, 0, 0, 0, 0);
    for seed in from..from.saturating_add(seeds) {
        let r = run(seed);
        acked += r.acked;
        crashes += r.crashes;
        partitions += r.partitions;
        lossy += r.lossy_periods;
        dropped += r.messages_dropped;
        let mut problems = r.failures.clone();
        if twice {
            let again = run(seed);
            if again.trace != r.trace {
                problems.push(format!(
                    "not deterministic: trace {:x} then {:x}",
                    r.trace, again.trace
                ));
            }
        }
        if !problems.is_empty() {
            println!("seed {seed}: FAIL");
            for p in problems.iter().take(10) {
                println!("  {p}");
            }
            println!(
                "  reproduce: docket-chaos sim --from {seed} --seeds 1 --steps {steps}{}",
                if broken { " --broken-store" } else { "" }
            );
            failed.push(seed);
        }
    }
    println!(
        "docket-chaos sim: {seeds} seeds from {from}, {steps} steps each, {} s\n  faults: {crashes} crashes, {partitions} partitions, {lossy} lossy periods; {dropped} messages dropped\n  submissions acknowledged: {acked}\n  seeds failed: {}{}",
        started.elapsed().as_secs(),
        failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(" {failed:?}")
        }
    );
    failed.is_empty()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::Sim {
        from,
        seeds,
        steps,
        twice,
        broken_store,
    } = cli.command
    {
        return if simulate(from, seeds, steps, twice, broken_store) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("docket-chaos: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(execute(cli.command));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("docket-chaos: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `run` or `drill` (`sim` runs before the runtime); whether the run passed.
async fn execute(command: Cmd) -> Result<bool> {
    match command {
        Cmd::Run {
            seed,
            faults,
            minutes,
            kinds,
            each,
            replicas,
            agents,
            simulated_agents,
            clients,
            job_seconds,
            think_ms,
            state_dir,
            bin_dir: bins,
        } => {
            run(RunSpec {
                seed: seed.unwrap_or_else(docket_proto::unix_ms),
                faults,
                minutes,
                kinds,
                each,
                replicas,
                agents,
                simulated: simulated_agents,
                clients,
                job_seconds: job_seconds.max(1),
                think_ms: (think_ms / 5, think_ms * 9 / 5),
                state_dir,
                bins: bin_dir(bins)?,
            })
            .await
        }
        Cmd::Drill {
            kind,
            state_dir,
            hold_ms,
            addrs,
            ca,
            fault_cmd,
            heal_cmd,
            partition,
            work_dir,
        } => {
            let target = drill_target(state_dir, addrs, ca, fault_cmd, heal_cmd);
            drill(kind, target, hold_ms, partition, work_dir)
                .await
                .map(|()| true)
        }
        Cmd::Sim { .. } => unreachable!("handled before the runtime"),
    }
}

/// Any cluster when its addresses, CA and fault and heal commands are all given; else the
/// docket-local one in `state_dir`.
fn drill_target(
    state_dir: PathBuf,
    addrs: Vec<String>,
    ca: Option<PathBuf>,
    fault_cmd: Option<String>,
    heal_cmd: Option<String>,
) -> DrillTarget {
    match (ca, fault_cmd, heal_cmd) {
        (Some(ca), Some(inject), Some(heal)) if !addrs.is_empty() => DrillTarget::Any {
            commands: docket_deploy::drill::Commands {
                inject,
                heal,
                allowed: addrs.clone(),
            },
            addrs,
            ca,
        },
        _ => DrillTarget::Local(state_dir),
    }
}

#[cfg(test)]
mod cli_tests {
    use super::*;

    #[test]
    fn the_options_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
