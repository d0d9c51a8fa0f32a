//! `docket-raft-kv`: docket-raft carrying a small key-value machine, for tests and measurement.
//!
//! - `serve` runs one replica as its own process (the process-kill tests use it).
//! - `bench` starts a 3-replica cluster on loopback with fsync on and prints acknowledged
//!   writes per second and latency percentiles at several writer counts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use docket_raft::ReplicaId;
use docket_raft::kv::{KvCommand, KvMachine};
use docket_raft::replica::{Replica, ReplicaConfig, ServerHandle};
use docket_raft::status::Role;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "docket-raft with a key-value machine: one replica, or a benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one replica until SIGTERM or Ctrl-C.
    Serve {
        /// This replica's id (a small positive integer, stable for its data directory).
        #[arg(long, env = "DOCKET_RAFT_ID")]
        id: u64,
        /// Address to listen on and advertise, host:port.
        #[arg(long, env = "DOCKET_RAFT_LISTEN")]
        listen: String,
        /// Data directory (created if missing).
        #[arg(long, env = "DOCKET_RAFT_DATA")]
        data: PathBuf,
        /// Start a new cluster with these voters, `ID=HOST:PORT,...` (once, on one replica).
        #[arg(long, env = "DOCKET_RAFT_BOOTSTRAP")]
        bootstrap: Option<String>,
    },
    /// Measure acknowledged writes per second on a 3-replica loopback cluster, fsync on.
    Bench {
        /// Writer counts to measure, comma-separated.
        #[arg(long, default_value = "1,16,64", value_delimiter = ',')]
        writers: Vec<usize>,
        /// Seconds measured at each writer count (after one second of warm-up).
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Where the replicas' data directories go (a real disk: the point is fsync).
        /// Default: a temporary directory under the system's temp dir.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Bytes of value per write.
        #[arg(long, default_value_t = 64)]
        value_bytes: usize,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // RUST_LOG overrides. The benchmark keeps quiet about RPCs that time out under load and
    // are resent (openraft logs each at error level); a replica logs warnings.
    let default_filter = match cli.command {
        Command::Bench { .. } => "error,openraft=off",
        Command::Serve { .. } => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match cli.command {
        Command::Serve {
            id,
            listen,
            data,
            bootstrap,
        } => runtime.block_on(serve(id, listen, data, bootstrap)),
        Command::Bench {
            writers,
            seconds,
            dir,
            value_bytes,
            json,
        } => runtime.block_on(bench(writers, seconds, dir, value_bytes, json)),
    }
}

fn parse_members(spec: &str) -> Result<BTreeMap<ReplicaId, String>> {
    docket_raft::parse_members(spec).map_err(|e| anyhow::anyhow!("--bootstrap: {e}"))
}

async fn serve(id: u64, listen: String, data: PathBuf, bootstrap: Option<String>) -> Result<()> {
    let members = bootstrap.as_deref().map(parse_members).transpose()?;
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let config = ReplicaConfig::new(id, listen.clone(), data);
    let replica = Replica::open(config, KvMachine::default()).await?;
    let server = replica.serve(listener)?;
    if let Some(members) = members {
        match replica.bootstrap(members).await {
            Ok(()) | Err(docket_raft::replica::ClusterError::AlreadyInitialized) => {}
            Err(e) => return Err(e.into()),
        }
    }
    println!("ready {id} {listen}");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    replica.shutdown().await;
    server.stop().await;
    Ok(())
}

/// One measured run at a writer count.
#[derive(Debug, serde::Serialize)]
struct Run {
    writers: usize,
    acknowledged: u64,
    seconds: f64,
    writes_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    log_entries: u64,
}

async fn bench(
    writer_counts: Vec<usize>,
    seconds: u64,
    dir: Option<PathBuf>,
    value_bytes: usize,
    json: bool,
) -> Result<()> {
    let temp = match &dir {
        Some(d) => tempfile::Builder::new()
            .prefix("raft-bench")
            .tempdir_in(d)?,
        None => tempfile::Builder::new().prefix("raft-bench").tempdir()?,
    };
    let (replicas, servers) = start_cluster(temp.path()).await?;
    let leader = find_leader(&replicas).await?;
    let value = "x".repeat(value_bytes);
    let mut runs = Vec::new();
    for &writers in &writer_counts {
        let run = measure(&leader, writers, seconds, &value).await;
        if !json {
            print_run(&run);
        }
        runs.push(run);
    }
    if json {
        println!(
            "{}",
            serde_json::json!({
                "replicas": 3,
                "fsync": true,
                "value_bytes": value_bytes,
                "runs": runs,
            })
        );
    }
    for r in &replicas {
        r.shutdown().await;
    }
    for s in servers {
        s.stop().await;
    }
    Ok(())
}

/// Starts three replicas on loopback with their data under `dir`, serving, and bootstraps
/// them as one cluster.
async fn start_cluster(dir: &Path) -> Result<(Vec<Replica<KvMachine>>, Vec<ServerHandle>)> {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await?);
    }
    let mut replicas = Vec::new();
    let mut servers = Vec::new();
    let mut members = BTreeMap::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let id = i as u64 + 1;
        let addr = listener.local_addr()?.to_string();
        members.insert(ReplicaId(id), addr.clone());
        let config = ReplicaConfig::new(id, addr, dir.join(format!("r{id}")));
        let replica = Replica::open(config, KvMachine::default()).await?;
        servers.push(replica.serve(listener)?);
        replicas.push(replica);
    }
    replicas[0].bootstrap(members).await?;
    Ok((replicas, servers))
}

/// Waits for the cluster of `replicas` to elect a leader; the leader.
async fn find_leader(replicas: &[Replica<KvMachine>]) -> Result<Replica<KvMachine>> {
    let leader_id = replicas[0].wait_for_leader(Duration::from_secs(20)).await?;
    let leader = replicas
        .iter()
        .find(|r| r.id() == leader_id)
        .context("leader is not one of ours")?
        .clone();
    if leader.status().role != Role::Leader {
        bail!("replica {leader_id} was reported leader but is not");
    }
    Ok(leader)
}

/// Measures `writers` writers of `value` on `leader` for `seconds`, after a second of warm-up.
async fn measure(leader: &Replica<KvMachine>, writers: usize, seconds: u64, value: &str) -> Run {
    // Warm up, then measure.
    let _ = drive(leader, writers, Duration::from_secs(1), value).await;
    let entries_before = leader.status().last_log_index.unwrap_or(0);
    let (mut latencies, elapsed) =
        drive(leader, writers, Duration::from_secs(seconds), value).await;
    let entries = leader.status().last_log_index.unwrap_or(0) - entries_before;
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1000.0
    };
    let acknowledged = latencies.len() as u64;
    Run {
        writers,
        acknowledged,
        seconds: elapsed.as_secs_f64(),
        writes_per_second: acknowledged as f64 / elapsed.as_secs_f64(),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        log_entries: entries,
    }
}

/// Prints one measured run as a line of the table.
fn print_run(run: &Run) {
    println!(
        "writers {:>3}: {:>8.0} writes/s  p50 {:>7.2} ms  p99 {:>7.2} ms  ({} writes in {} log entries, {:.1} s)",
        run.writers,
        run.writes_per_second,
        run.p50_ms,
        run.p99_ms,
        run.acknowledged,
        run.log_entries,
        run.seconds
    );
}

/// Runs `writers` closed-loop writers for `period`; returns every acknowledged write's latency.
async fn drive(
    leader: &Replica<KvMachine>,
    writers: usize,
    period: Duration,
    value: &str,
) -> (Vec<Duration>, Duration) {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let leader = leader.clone();
        let value = value.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let key = format!("w{w}");
            while start.elapsed() < period {
                let t0 = Instant::now();
                let command = KvCommand::Set {
                    key: key.clone(),
                    value: value.clone(),
                };
                if leader.write_one(command).await.is_ok() {
                    latencies.push(t0.elapsed());
                }
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        if let Ok(latencies) = t.await {
            all.extend(latencies);
        }
    }
    (all, start.elapsed())
}
