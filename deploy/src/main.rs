//! `docket-local`: a real Docket cluster on this host in one command.
//!
//! `up` starts N controller replicas and M node agents on loopback (default 3 and 4), waits
//! until a leader exists and every agent has registered, and prints the endpoints and the
//! `DOCKET_ADDR` line; `status`, `logs`, `drill` (kill the leader, measure the recovery),
//! `demo` (the quick start's workload and summary) and `down` (stop everything, leave nothing
//! behind) act on the cluster recorded in the state directory. `scale` is a benchmark: a
//! cluster of its own with many simulated agents, measured and then removed.

mod demo;
mod lifecycle;
mod scale;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::{Parser, Subcommand};
use docket_deploy::{Layout, LocalCluster, drill, rpc};

/// A local Docket cluster: controllers and agents on loopback.
#[derive(Debug, Parser)]
#[command(name = "docket-local", version, about, long_about)]
struct Cli {
    /// Where the cluster lives (data, logs, agent state, cluster.json).
    #[arg(
        long,
        env = "DOCKET_LOCAL_DIR",
        default_value = "/tmp/docket-local",
        global = true
    )]
    state_dir: PathBuf,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start a cluster (replacing a stopped one in the state directory).
    Up {
        #[arg(long, default_value_t = 3)]
        replicas: u32,
        /// Real agents n01.. (alternately 4 and 8 cpus, 1 GiB per cpu).
        #[arg(long, default_value_t = 4)]
        agents: u32,
        /// More agents s0001.. in simulated execution (partition `sim`).
        #[arg(long, default_value_t = 0)]
        simulated_agents: u32,
        /// Job confinement: auto (cgroups, as root) or none.
        #[arg(long)]
        confinement: Option<String>,
        /// Where docket-controller, docket-nodeagent and docket are (default: next to this).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Run each replica in a network namespace of its own, so that it can be partitioned
        /// (`docket-chaos drill partition`; root only).
        #[arg(long)]
        netns: bool,
    },
    /// Stop every process of the cluster and sweep what is left.
    Down {
        /// Delete the state directory too.
        #[arg(long)]
        remove: bool,
    },
    /// Processes, replicas (role, term, applied, lag) and nodes.
    Status,
    /// The last lines of every log, or of one (`controller-1`, `agent-n01`).
    Logs {
        name: Option<String>,
        #[arg(short = 'n', long, default_value_t = 20)]
        lines: usize,
    },
    /// Kill the leader (SIGKILL), report how long the cluster took to elect a new one, to
    /// commit a write and to start a job; restart the killed replica.
    Drill {
        #[arg(long, default_value = "batch")]
        partition: String,
    },
    /// Benchmark the job lifecycle on the running cluster: trivial jobs submitted by real
    /// `sbatch` processes from concurrent loops, then as one array, followed to their end;
    /// prints rates, latencies (p50/p99) and cpu time per job.
    Bench {
        /// Jobs in each phase.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        jobs: u32,
        /// Concurrent `sbatch` loops.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
        loops: u32,
        /// Skip the array phase.
        #[arg(long)]
        no_array: bool,
        /// First submit as many held jobs (`sbatch -H`) from the loops: the submission
        /// path alone, nothing runs; they are cancelled afterwards.
        #[arg(long)]
        held: bool,
    },
    /// Run the demo workload and print what happened.
    Demo,
    /// Benchmark: many agents in simulated execution, each its own process, running
    /// whole-node jobs; prints the figures, then stops the cluster and removes its state.
    Scale {
        #[arg(long, default_value_t = 3)]
        replicas: u32,
        /// Simulated agents (s0001.., 8 cpus and 8 GiB each), each a process.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=20_000))]
        agents: u32,
        /// Whole-node jobs to run (more than the agents queue up).
        #[arg(long, default_value_t = 2000)]
        jobs: u32,
        /// Each job's runtime, seconds.
        #[arg(long, default_value_t = 30)]
        runtime: u32,
        /// Agents' heartbeat period, ms.
        #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(50..=600_000))]
        heartbeat_ms: u64,
        /// Jobs per submission request.
        #[arg(long, default_value_t = 500)]
        batch: u32,
        /// The replicas' Raft heartbeat, ms.
        #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(10..=60_000))]
        raft_heartbeat_ms: u64,
        /// The replicas' election timeout range, `MIN-MAX` ms. Longer than the controller's
        /// default: here a thousand agent processes share the controllers' cores, which a
        /// production controller host does not.
        #[arg(long, default_value = "1500-3000")]
        election_timeout_ms: String,
        /// The agents' ping after silence, ms (`docket-nodeagent --ping-ms`; 0: none), to
        /// measure what the pings cost the leader. The agent's default unless set.
        #[arg(long, value_parser = clap::value_parser!(u64).range(0..=600_000))]
        agent_ping_ms: Option<u64>,
        #[arg(long)]
        bin_dir: Option<PathBuf>,
    },
    /// Print the shell lines that point the commands at this cluster:
    /// `eval "$(docket-local env)"`.
    Env,
}

fn bin_dir(explicit: Option<PathBuf>) -> Result<PathBuf> {
    Ok(docket_deploy::bin_dir(explicit)?)
}

fn print_endpoints(c: &LocalCluster, leader: u64) {
    println!(
        "\nDocket is running ({} replicas, {} agents):",
        c.record.replicas.len(),
        c.record.agents.len()
    );
    for r in &c.record.replicas {
        println!(
            "  controller {}  {}  metrics http://{}/metrics{}",
            r.id,
            r.addr,
            r.http,
            if r.id == leader { "  (leader)" } else { "" }
        );
    }
    for a in &c.record.agents {
        println!(
            "  agent {}  {} cpus, {} MiB{}",
            a.spec.name,
            a.spec.cpus,
            a.spec.memory_mib,
            if a.spec.simulated { ", simulated" } else { "" }
        );
    }
    let bin = c.record.state_dir.join("bin");
    println!("\nTo use it from a shell (or: eval \"$(docket-local env)\"):\n");
    for line in c.env_lines().unwrap_or_default() {
        println!("  {line}");
    }
    println!("  export PATH={}:$PATH", bin.display());
    println!(
        "\n  sinfo; squeue; printf '#!/bin/sh\\nsleep 30\\n' | sbatch -t 1; docket cluster status"
    );
    println!(
        "\nLogs: {}   Stop: docket-local down --state-dir {}",
        c.record.state_dir.join("logs").display(),
        c.record.state_dir.display()
    );
}

async fn up(
    state_dir: PathBuf,
    replicas: u32,
    agents: u32,
    simulated: u32,
    confinement: Option<String>,
    bins: PathBuf,
    netns: bool,
) -> Result<()> {
    let mut layout = Layout::new(replicas, agents, simulated, state_dir, bins.clone());
    layout.netns = netns;
    if let Some(c) = confinement {
        layout.confinement = c;
    }
    let cluster = LocalCluster::start(&layout)?;
    println!(
        "started {} controllers and {} agents in {}; waiting for a leader and every agent",
        layout.replicas,
        layout.agents.len(),
        layout.state_dir.display()
    );
    let (leader, _) = cluster.wait_ready(Duration::from_secs(60)).await?;
    // The commands in STATE/bin: a copy of `docket` and its Slurm and PBS names linked to
    // that copy, so that any user (jobs run as users, and their scripts call srun) can run
    // them wherever the build directory is.
    let docket = bins.join("docket");
    if docket.exists() {
        let bin = layout.state_dir.join("bin");
        let copy = bin.join("docket");
        std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
        std::fs::copy(&docket, &copy).with_context(|| format!("copying {}", docket.display()))?;
        let out = std::process::Command::new(&copy)
            .arg("install-aliases")
            .arg(&bin)
            .output()
            .context("installing the command aliases")?;
        if !out.status.success() {
            eprintln!(
                "docket-local: warning: install-aliases: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    print_endpoints(&cluster, leader);
    Ok(())
}

async fn status(state_dir: PathBuf) -> Result<()> {
    let c = LocalCluster::open(&state_dir)?;
    println!("{:<14} {:>8} {:<6} LOG", "PROCESS", "PID", "ALIVE");
    for r in &c.record.replicas {
        println!(
            "{:<14} {:>8} {:<6} {}",
            format!("controller-{}", r.id),
            r.pid.map_or("-".into(), |p| p.to_string()),
            r.pid.is_some_and(docket_deploy::local::alive),
            r.log.display()
        );
    }
    for a in &c.record.agents {
        println!(
            "{:<14} {:>8} {:<6} {}",
            format!("agent-{}", a.spec.name),
            a.pid.map_or("-".into(), |p| p.to_string()),
            a.pid.is_some_and(docket_deploy::local::alive),
            a.log.display()
        );
    }
    match rpc::cluster_status(&c.addrs()).await {
        Some(s) => {
            println!(
                "\n{:<4} {:<22} {:<11} {:>6} {:>8} {:>6}",
                "ID", "ADDRESS", "ROLE", "TERM", "APPLIED", "LAG"
            );
            for r in &s.replicas {
                let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
                println!(
                    "{:<4} {:<22} {:<11} {:>6} {:>8} {:>6}",
                    r.id,
                    r.addr,
                    r.role,
                    r.term,
                    opt(r.applied_index),
                    opt(r.lag)
                );
            }
            if let Some((_, leader)) = rpc::leader(&c.addrs()).await {
                let nodes = rpc::nodes(&leader).await?;
                println!(
                    "\n{:<8} {:<9} {:>9} {:>11}",
                    "NODE", "STATE", "CPUS", "RESPONDING"
                );
                for n in nodes {
                    println!(
                        "{:<8} {:<9} {:>9} {:>11}",
                        n.name,
                        n.state,
                        format!("{}/{}", n.cpus_used, n.cpus),
                        n.responding.map_or("?", |r| if r { "yes" } else { "no" })
                    );
                }
            }
        }
        None => println!("\nno controller answers"),
    }
    Ok(())
}

fn logs(state_dir: PathBuf, name: Option<String>, lines: usize) -> Result<()> {
    let dir = state_dir.join("logs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            name.as_ref().is_none_or(|n| {
                p.file_stem()
                    .is_some_and(|s| s.to_string_lossy() == n.as_str())
            })
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(anyhow!(
            "no log {} in {}",
            name.unwrap_or_default(),
            dir.display()
        ));
    }
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        println!("==> {} <==", f.display());
        for l in &all[all.len().saturating_sub(lines)..] {
            println!("{l}");
        }
    }
    Ok(())
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Cmd::Up {
            replicas,
            agents,
            simulated_agents,
            confinement,
            bin_dir: bins,
            netns,
        } => {
            up(
                cli.state_dir,
                replicas,
                agents,
                simulated_agents,
                confinement,
                bin_dir(bins)?,
                netns,
            )
            .await
        }
        Cmd::Down { remove } => down(&cli.state_dir, remove).await,
        Cmd::Status => status(cli.state_dir).await,
        Cmd::Env => env(&cli.state_dir),
        Cmd::Logs { name, lines } => logs(cli.state_dir, name, lines),
        Cmd::Drill { partition } => run_drill(&cli.state_dir, &partition).await,
        Cmd::Scale {
            replicas,
            agents,
            jobs,
            runtime,
            heartbeat_ms,
            batch,
            raft_heartbeat_ms,
            election_timeout_ms,
            agent_ping_ms,
            bin_dir: bins,
        } => {
            let spec = scale::ScaleSpec {
                raft_heartbeat_ms,
                election_timeout_ms,
                agent_ping_ms,
                replicas,
                agents,
                jobs,
                runtime_s: runtime,
                heartbeat_ms,
                batch,
            };
            run_scale(&spec, cli.state_dir, bins).await
        }
        Cmd::Bench {
            jobs,
            loops,
            no_array,
            held,
        } => {
            let spec = lifecycle::BenchSpec {
                jobs,
                loops,
                array: !no_array,
                held,
            };
            run_bench(&spec, &cli.state_dir).await
        }
        Cmd::Demo => run_demo(&cli.state_dir).await,
    }
}

/// `down`: stops the cluster in `state_dir` and sweeps what is left (`remove`: its state
/// directory too).
async fn down(state_dir: &std::path::Path, remove: bool) -> Result<()> {
    let c = LocalCluster::open(state_dir)?;
    let sweep = c.stop(remove).await?;
    println!(
        "stopped; swept {} leftover processes, {} mounts, {} cgroups",
        sweep.processes, sweep.mounts, sweep.cgroups
    );
    Ok(())
}

/// `env`: prints the shell lines that point the commands at the cluster in `state_dir`.
fn env(state_dir: &std::path::Path) -> Result<()> {
    let c = LocalCluster::open(state_dir)?;
    for line in c.env_lines()? {
        println!("{line}");
    }
    println!(
        "export PATH={}:\"$PATH\"",
        c.record.state_dir.join("bin").display()
    );
    Ok(())
}

/// `drill`: kills the leader of the cluster in `state_dir` and prints the recovery figures.
async fn run_drill(state_dir: &std::path::Path, partition: &str) -> Result<()> {
    let mut c = LocalCluster::open(state_dir)?;
    let r = drill::kill_leader(&mut c, partition, true, Duration::from_secs(60)).await?;
    println!(
        "killed leader {} (SIGKILL)\n  new leader:            {} after {} ms\n  first committed write: {} ms\n  first job started:     {}\n  jobs lost:             {}\n  replica {} restarted on its data",
        r.killed,
        r.new_leader,
        r.elected_ms,
        r.first_write_ms,
        r.first_start_ms
            .map_or("not within 60 s".into(), |m| format!("{m} ms")),
        r.lost_jobs.len(),
        r.killed
    );
    Ok(())
}

/// `scale`: the benchmark on a cluster of its own in `state_dir`, with the binaries in
/// `bins`; fails when a job did not complete.
async fn run_scale(
    spec: &scale::ScaleSpec,
    state_dir: PathBuf,
    bins: Option<PathBuf>,
) -> Result<()> {
    println!(
        "starting {} controllers and {} simulated agents in {}",
        spec.replicas,
        spec.agents,
        state_dir.display()
    );
    let report = scale::run(spec, state_dir, bin_dir(bins)?).await?;
    print!("{}", report.render(spec));
    if report.all_completed(spec.jobs) {
        Ok(())
    } else {
        Err(anyhow!("not every job completed"))
    }
}

/// `bench`: the lifecycle benchmark on the running cluster in `state_dir`; fails when a job
/// did not complete.
async fn run_bench(spec: &lifecycle::BenchSpec, state_dir: &std::path::Path) -> Result<()> {
    let c = LocalCluster::open(state_dir)?;
    let bins = c.record.bin_dir.display().to_string();
    println!(
        "lifecycle benchmark on {} ({} replicas, {} agents; binaries in {bins})",
        state_dir.display(),
        c.record.replicas.len(),
        c.record.agents.len()
    );
    drop(c);
    let phases = lifecycle::run(spec, state_dir, |p| print!("{}", p.render())).await?;
    if phases.iter().all(|p| p.not_completed.is_empty()) {
        Ok(())
    } else {
        Err(anyhow!("not every job completed"))
    }
}

/// `demo`: runs the demo on the cluster in `state_dir` and prints its summary; fails when it
/// did not show everything.
async fn run_demo(state_dir: &std::path::Path) -> Result<()> {
    let mut c = LocalCluster::open(state_dir)?;
    c.wait_ready(Duration::from_secs(60)).await?;
    let report = demo::run(&mut c).await?;
    print!("{}", report.summary());
    if report.ok() {
        Ok(())
    } else {
        Err(anyhow!("the demo did not show everything it should"))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("docket-local: error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("docket-local: error: {e:#}");
            ExitCode::FAILURE
        }
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
