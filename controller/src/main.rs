//! `docket-controller`: one replica of the Docket control plane.

mod bench;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use docket_controller::daemon::{self, DaemonConfig};
use docket_raft::ReplicaId;
use docket_raft::replica::RaftTuning;

/// mimalloc rather than glibc's malloc (measured: see the README's controller benchmark),
/// built without transparent huge pages (`no_thp`): its arenas asked for them, and a first
/// touch of a huge page zeroes 2 MiB in the faulting thread — 2–4 ms each in this build
/// machine's VM — which stretched 1 ms of converting a listing to 15–25 ms under a
/// submission storm (the same latency spikes that make Redis and MongoDB advise against
/// THP).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One replica of Docket's replicated control plane.
///
/// Several replicas agree on the whole queue through Raft; the elected leader runs the main
/// and backfill scheduling loops and dispatches jobs to node agents. Any replica answers
/// `docket`, `squeue`, `sbatch` and friends, forwarding writes to the leader.
#[derive(Debug, Parser)]
#[command(
    name = "docket-controller",
    version,
    about,
    long_about,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one replica until SIGTERM or Ctrl-C.
    Run(Box<RunArgs>),
    /// Validate a configuration file and print what it defines; errors name the key and what
    /// it accepts. Exit status 0 when valid, 1 when not.
    CheckConfig {
        /// The configuration file (docket.toml).
        #[arg(env = "DOCKET_CONFIG")]
        file: PathBuf,
    },
    /// Measure submissions per second and latency against a 3-replica cluster of this
    /// binary on loopback (fsync on), and a queue listing's latency during the storm.
    /// The cluster's certificate authority and its certificates: `init` makes a CA, `issue`
    /// a certificate for a replica, a node agent or an operator's tool.
    #[command(subcommand)]
    Certs(Certs),
    /// Write a new credential key file (32 random bytes, mode 0400) for auth/docket: copy it
    /// to every controller and every host running docket-authd.
    AuthKey {
        /// The file to create (never overwritten).
        #[arg(long, default_value = "/etc/docket/auth.key")]
        out: PathBuf,
    },
    Bench {
        /// Concurrent submitting clients per run, comma-separated.
        #[arg(
            long,
            env = "DOCKET_BENCH_CLIENTS",
            default_value = "1,16,64",
            value_delimiter = ','
        )]
        clients: Vec<usize>,
        /// Seconds per run.
        #[arg(long, env = "DOCKET_BENCH_SECONDS", default_value_t = 5)]
        seconds: u64,
        /// Print one JSON object instead of a table.
        #[arg(long, env = "DOCKET_BENCH_JSON")]
        json: bool,
        /// The site's `max_rpc_cnt`, comma-separated: the benchmark runs once per value, each
        /// on a fresh cluster (0: the passes never yield to RPCs).
        #[arg(
            long,
            env = "DOCKET_BENCH_MAX_RPC_CNT",
            default_value = "0",
            value_delimiter = ','
        )]
        max_rpc_cnt: Vec<u32>,
        /// The site's `bf_continue`.
        #[arg(long, env = "DOCKET_BENCH_BF_CONTINUE")]
        bf_continue: bool,
    },
}

#[derive(Debug, Subcommand)]
enum Certs {
    /// Create a cluster CA in DIR: ca.pem (give it to every host) and ca.key (keep it where
    /// certificates are issued, nowhere else).
    Init {
        #[arg(long, default_value = "/etc/docket/tls")]
        dir: PathBuf,
        /// The cluster's name, in the CA's name.
        #[arg(long, default_value = "docket")]
        cluster: String,
        /// Validity, days.
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Issue a certificate signed by the CA in DIR, written as ROLE-NAME.pem and .key into
    /// --out (default DIR).
    Issue {
        #[arg(long, default_value = "/etc/docket/tls")]
        dir: PathBuf,
        /// replica, node or tool.
        role: String,
        /// The replica's id, the node's name, or the tool's name.
        name: String,
        /// Host names and IP addresses the holder is reached at (replicas: every name
        /// clients and peers use), repeated or comma-separated.
        #[arg(long = "host", value_delimiter = ',')]
        hosts: Vec<String>,
        /// Validity, days.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Where to write it (default: DIR).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// This replica's id: a small positive integer, unique in the cluster and stable for the
    /// life of its data directory.
    #[arg(long, env = "DOCKET_ID")]
    id: u64,
    /// Address the gRPC server (Raft, jobs, admin, agents, health) binds, host:port.
    #[arg(long, env = "DOCKET_LISTEN", default_value = "127.0.0.1:6817")]
    listen: String,
    /// Address other replicas and clients reach this one at; default: the bound address.
    #[arg(long, env = "DOCKET_ADVERTISE")]
    advertise: Option<String>,
    /// Data directory (RocksDB and snapshots); created if missing.
    #[arg(long, env = "DOCKET_DATA_DIR")]
    data_dir: PathBuf,
    /// Site configuration (docket.toml): nodes, partitions, QOS, accounts, users and
    /// scheduler parameters. The first leader of a new cluster applies it.
    #[arg(long, env = "DOCKET_CONFIG")]
    config: Option<PathBuf>,
    /// Start a new cluster with these voters, `ID=HOST:PORT,...` (this replica among them).
    /// Give it to one replica on the cluster's first start; ignored once initialized.
    #[arg(long, env = "DOCKET_BOOTSTRAP")]
    bootstrap: Option<String>,
    /// How long a linearizable read waits for this replica to catch up with the leader.
    #[arg(long, env = "DOCKET_READ_TIMEOUT_MS", default_value_t = 5_000)]
    read_timeout_ms: u64,
    /// Raft heartbeat interval in milliseconds (also the deadline of one append).
    #[arg(long, env = "DOCKET_HEARTBEAT_MS", default_value_t = 100)]
    heartbeat_ms: u64,
    /// Election timeout range in milliseconds, `MIN-MAX`. A follower that hears nothing
    /// from a leader for MAX (openraft's leader lease) plus a random time in the range starts
    /// an election, so a failover takes about MAX + MIN..MAX plus a round trip; the default
    /// keeps it near one second.
    #[arg(long, env = "DOCKET_ELECTION_TIMEOUT_MS", default_value = "300-600")]
    election_timeout_ms: String,
    /// Take a snapshot (the queue and the accounting archive) after this many log entries;
    /// the log behind it is then purged.
    #[arg(long, env = "DOCKET_SNAPSHOT_EVERY_ENTRIES", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_every_entries: u64,
    /// Entries kept behind a snapshot, so a replica that lags by fewer catches up from the
    /// log instead of by snapshot.
    #[arg(
        long,
        env = "DOCKET_KEEP_ENTRIES_AFTER_SNAPSHOT",
        default_value_t = 1_000
    )]
    keep_entries_after_snapshot: u64,
    /// Serve the status page, Prometheus `/metrics` and a JSON `/status` over HTTP at this
    /// host:port.
    #[arg(long, env = "DOCKET_HTTP_LISTEN")]
    http_listen: Option<String>,
    /// The URL other replicas' pages link to for this one's (default: http:// and the
    /// --http-listen address, its host taken from --advertise when it listens on all
    /// addresses).
    #[arg(long, env = "DOCKET_HTTP_ADVERTISE")]
    http_advertise: Option<String>,
    /// HTTP connections served at once; more are closed as they are accepted.
    #[arg(long, env = "DOCKET_HTTP_MAX_CONNECTIONS", default_value_t = 256)]
    http_max_connections: usize,
    /// HTTP connections served at once from one address.
    #[arg(
        long,
        env = "DOCKET_HTTP_MAX_CONNECTIONS_PER_PEER",
        default_value_t = 32
    )]
    http_max_connections_per_peer: usize,
    /// A request's headers must arrive within this (milliseconds); so must the next request
    /// on a kept-alive connection.
    #[arg(long, env = "DOCKET_HTTP_HEADER_TIMEOUT_MS", default_value_t = 10_000)]
    http_header_timeout_ms: u64,
    /// The status page's plots sample this often (milliseconds); six hours at the default.
    #[arg(long, env = "DOCKET_HISTORY_INTERVAL_MS", default_value_t = 60_000)]
    history_interval_ms: u64,
    /// Node agents heartbeat this often (milliseconds).
    #[arg(long, env = "DOCKET_AGENT_HEARTBEAT_MS", default_value_t = 2_000)]
    agent_heartbeat_ms: u64,
    /// An agent that reaches no leader for this long stops its jobs (milliseconds). The leader
    /// declares a silent node down after this plus --node-down-margin-ms, and a new leader
    /// waits that long before declaring anything. 0 turns node liveness off (clusters without
    /// agents, e.g. tests and simulations).
    #[arg(long, env = "DOCKET_AGENT_FENCE_MS", default_value_t = 20_000)]
    agent_fence_ms: u64,
    /// Margin added to the agents' fence timeout before a node is declared down (ms).
    #[arg(long, env = "DOCKET_NODE_DOWN_MARGIN_MS", default_value_t = 10_000)]
    node_down_margin_ms: u64,
    /// Slurm's ReturnToService: which down nodes return to service when their agent streams
    /// from the leader again. 0: none, an administrator resumes them; 1: nodes down for not
    /// responding; 2: nodes down for any reason. A drain is never cleared.
    #[arg(long, env = "DOCKET_RETURN_TO_SERVICE", default_value = "1")]
    return_to_service: docket_controller::agents::ReturnToService,
    /// The cluster CA's certificate: peers' and agents' certificates must chain to it.
    #[arg(long, env = "DOCKET_TLS_CA", default_value = "/etc/docket/tls/ca.pem")]
    tls_ca: PathBuf,
    /// This replica's certificate (`certs issue replica ID`), reloaded on SIGHUP or change.
    #[arg(
        long,
        env = "DOCKET_TLS_CERT",
        default_value = "/etc/docket/tls/replica.pem"
    )]
    tls_cert: PathBuf,
    /// This replica's private key (readable by the controller's user only).
    #[arg(
        long,
        env = "DOCKET_TLS_KEY",
        default_value = "/etc/docket/tls/replica.key"
    )]
    tls_key: PathBuf,
    /// How users prove who they are: auth/docket (credentials from docket-authd) or
    /// auth/munge (from the site's munged).
    #[arg(long, env = "DOCKET_AUTH_TYPE", default_value = "auth/docket")]
    auth_type: docket_auth::AuthType,
    /// The credential key file (auth/docket), reloaded on SIGHUP.
    #[arg(long, env = "DOCKET_AUTH_KEY", default_value = "/etc/docket/auth.key")]
    auth_key: PathBuf,
    /// munged's socket (auth/munge; default: libmunge's).
    #[arg(long, env = "DOCKET_MUNGE_SOCKET")]
    munge_socket: Option<PathBuf>,
    /// How far a credential's signer's clock may be from this host's, seconds.
    #[arg(long, env = "DOCKET_AUTH_CLOCK_SKEW_S", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    auth_clock_skew_s: u64,
    /// Requests per second one user may make to this replica, sustained (root is exempt;
    /// 0: no limit). Over it, requests are refused with RESOURCE_EXHAUSTED and the
    /// command line retries a second later.
    #[arg(long, env = "DOCKET_USER_RPC_RATE", default_value_t = 1000)]
    user_rpc_rate: u32,
    /// Requests one user may make in a burst above the sustained rate.
    #[arg(long, env = "DOCKET_USER_RPC_BURST", default_value_t = 2000)]
    user_rpc_burst: u32,
    /// Log filter (tracing's EnvFilter syntax), e.g. `info` or `docket_controller=debug`.
    #[arg(long, env = "DOCKET_LOG", default_value = "info")]
    log: String,
}

fn parse_members(spec: &str) -> Result<BTreeMap<ReplicaId, String>> {
    docket_raft::parse_members(spec).map_err(|e| anyhow::anyhow!("--bootstrap: {e}"))
}

fn parse_range(spec: &str) -> Result<(u64, u64)> {
    let (lo, hi) = spec
        .split_once('-')
        .with_context(|| format!("--election-timeout-ms: {spec:?} is not MIN-MAX"))?;
    let lo: u64 = lo
        .trim()
        .parse()
        .context("--election-timeout-ms: MIN is not a number")?;
    let hi: u64 = hi
        .trim()
        .parse()
        .context("--election-timeout-ms: MAX is not a number")?;
    if lo == 0 || hi <= lo {
        bail!("--election-timeout-ms: need 0 < MIN < MAX, got {lo}-{hi}");
    }
    Ok((lo, hi))
}

fn read_site(path: &PathBuf) -> Result<docket_core::site::SiteFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    docket_core::site::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::CheckConfig { file } => match read_site(&file) {
            Ok(site) => {
                let s = &site.site;
                println!(
                    "{}: valid ({} nodes, {} partitions, {} QOS, {} accounts, {} users)",
                    file.display(),
                    s.nodes.len(),
                    s.partitions.len(),
                    s.qos.len(),
                    s.accounts.len(),
                    s.users.len()
                );
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("docket-controller: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
        Cmd::Bench {
            clients,
            seconds,
            json,
            max_rpc_cnt,
            bf_continue,
        } => match bench(&bench::BenchOptions {
            clients,
            seconds,
            json,
            max_rpc_cnt,
            bf_continue,
        }) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("docket-controller bench: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
        Cmd::Certs(c) => match certs(c) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("docket-controller certs: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
        Cmd::AuthKey { out } => match docket_auth::KeyRing::create_file(&out) {
            Ok(key) => {
                println!(
                    "{}: new credential key {} (mode 0400); copy it to every controller and \
                     every host that runs docket-authd",
                    out.display(),
                    key.id()
                );
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("docket-controller auth-key: {e}");
                std::process::ExitCode::FAILURE
            }
        },
        Cmd::Run(args) => match run(*args) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("docket-controller: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

fn certs(c: Certs) -> Result<()> {
    use docket_auth::tls::Role;
    use docket_auth::tls::pki::{self, CertAuthority};
    match c {
        Certs::Init { dir, cluster, days } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            CertAuthority::create(&cluster, days)?.save(&dir)?;
            println!(
                "{}: cluster CA created (ca.pem for every host; keep ca.key here only)",
                dir.display()
            );
        }
        Certs::Issue {
            dir,
            role,
            name,
            hosts,
            days,
            out,
        } => {
            let role = match role.as_str() {
                "replica" => Role::Replica(
                    name.parse()
                        .ok()
                        .filter(|id| *id > 0)
                        .with_context(|| format!("replica id {name:?}: give a positive integer"))?,
                ),
                "node" => Role::Node(name),
                "tool" => Role::Tool(name),
                other => bail!("role {other:?}: give replica, node or tool"),
            };
            if Role::from_uri(&role.uri()).is_none_or(|r| r.is_err()) {
                bail!("{role}: names are letters, digits, '-', '_' and '.', up to 64");
            }
            if matches!(role, Role::Replica(_)) && hosts.is_empty() {
                bail!(
                    "a replica's certificate needs --host: every name and address clients and peers reach it at"
                );
            }
            let ca = CertAuthority::load(&dir)?;
            let out = out.unwrap_or(dir);
            let (cert, key) = ca
                .issue(&role, &hosts, days)?
                .save(&out, &pki::stem(&role))?;
            println!("{role}: {} and {}", cert.display(), key.display());
        }
    }
    Ok(())
}

fn bench(options: &bench::BenchOptions) -> Result<()> {
    let exe = std::env::current_exe().context("locating this binary")?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(bench::run(&exe, options))
}

/// What the replica process runs with, from its flags and the site file.
fn daemon_config(args: RunArgs) -> Result<DaemonConfig> {
    let bootstrap = args.bootstrap.as_deref().map(parse_members).transpose()?;
    let (site, cluster_name) = match &args.config {
        Some(path) => {
            let file = read_site(path)?;
            let name = file.site.cluster_name.clone();
            (file.site.commands(), name)
        }
        None => (Vec::new(), None),
    };
    let (lo, hi) = parse_range(&args.election_timeout_ms)?;
    let tuning = RaftTuning {
        heartbeat: Duration::from_millis(args.heartbeat_ms.max(1)),
        election_timeout_min: Duration::from_millis(lo),
        election_timeout_max: Duration::from_millis(hi),
        snapshot_every_entries: args.snapshot_every_entries,
        keep_entries_after_snapshot: args.keep_entries_after_snapshot,
        ..RaftTuning::default()
    };
    Ok(DaemonConfig {
        id: args.id,
        listen: args.listen,
        advertise: args.advertise,
        data_dir: args.data_dir,
        bootstrap,
        site,
        cluster_name: cluster_name.unwrap_or_else(|| "docket".into()),
        read_timeout: Duration::from_millis(args.read_timeout_ms),
        tuning,
        http_listen: args.http_listen,
        http_advertise: args.http_advertise,
        http_limits: docket_controller::http_conn::HttpLimits {
            connections: args.http_max_connections,
            per_peer: args.http_max_connections_per_peer,
            header_read: Duration::from_millis(args.http_header_timeout_ms.max(1)),
            ..Default::default()
        },
        history_interval: Duration::from_millis(args.history_interval_ms.max(100)),
        agents: docket_controller::agents::AgentConfig {
            heartbeat: Duration::from_millis(args.agent_heartbeat_ms.max(1)),
            fence_timeout: Duration::from_millis(args.agent_fence_ms),
            down_margin: Duration::from_millis(args.node_down_margin_ms),
            return_to_service: args.return_to_service,
        },
        tls: docket_auth::tls::TlsFiles {
            ca: args.tls_ca,
            identity: Some((args.tls_cert, args.tls_key)),
        },
        auth: daemon::AuthConfig {
            kind: args.auth_type,
            key_file: args.auth_key,
            munge_socket: args.munge_socket,
            rules: docket_auth::TimeRules {
                skew_ms: args.auth_clock_skew_s * 1000,
                ..docket_auth::TimeRules::default()
            },
            rate: (args.user_rpc_rate > 0).then_some(docket_controller::identity::RateLimit {
                per_second: args.user_rpc_rate,
                burst: args.user_rpc_burst,
            }),
        },
    })
}

fn run(args: RunArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&args.log)
                .with_context(|| format!("--log {:?}", args.log))?,
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal, not in log files and journals.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let refused = docket_controller::native_heap::bound();
    if !refused.is_empty() {
        tracing::warn!(
            ?refused,
            "glibc refused malloc parameters; RocksDB's heap may grow"
        );
    }
    let config = daemon_config(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        daemon::run(config, async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await?;
        Ok(())
    })
}
