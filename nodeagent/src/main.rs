//! `docket-nodeagent`: the daemon on every compute node.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use docket_nodeagent::runner::{Mode, Runner, RunnerConfig};
use docket_nodeagent::session::{self, SessionConfig};

/// The state directory's lock file, held by the agent that uses the directory.
const AGENT_LOCK: &str = "agent.lock";
/// How long a starting agent waits for the state directory's lock.
const AGENT_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Docket's agent on one compute node.
///
/// Registers the node with the leader, launches each job it is told to start as the
/// submitting user, enforces walltime, suspends and resumes jobs, and reports every state
/// change. Instructions older than the job's dispatch epoch are refused, so a job never runs
/// twice.
#[derive(Debug, Parser)]
#[command(
    name = "docket-nodeagent",
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
    /// Run the agent until SIGTERM or Ctrl-C.
    Run(Box<RunArgs>),
    /// (Internal) A job's monitor: runs the job and records how it ended.
    #[command(hide = true)]
    ExecJob(ExecJobArgs),
    /// (Internal) Becomes the job: joins its cgroups, takes the user's identity, execs.
    #[command(hide = true)]
    ExecAsUser(ExecJobArgs),
    /// (Internal) Forks the monitors of the agent whose socket is standard input.
    #[command(hide = true)]
    Launcher {
        /// The agent's state directory (named so that what names it can be found).
        #[arg(long)]
        state_dir: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct ExecJobArgs {
    /// The run's directory, where the monitor records the job's process group and exit.
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// A cgroup.procs file to join (repeated).
    #[arg(long)]
    join: Vec<PathBuf>,
    #[arg(long)]
    user: String,
    #[arg(long)]
    uid: u32,
    #[arg(long)]
    gid: u32,
    /// RLIMIT_AS in bytes.
    #[arg(long)]
    rlimit_as: Option<u64>,
    /// The job's environment (NUL-separated NAME=value), in the run's private directory.
    #[arg(long)]
    env_file: Option<PathBuf>,
    /// NAME=VALUE set over the environment file (a step task's own place in its step).
    #[arg(long = "set")]
    set: Vec<String>,
    /// The job's working directory, entered as the user.
    #[arg(long)]
    work_dir: PathBuf,
    /// The job's output files, opened as the user.
    #[arg(long)]
    stdout: PathBuf,
    #[arg(long)]
    stderr: PathBuf,
    /// Keep the standard streams this process was given (a step's task) instead of opening
    /// --stdout and --stderr.
    #[arg(long)]
    inherit_stdio: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum JobfsArg {
    Loop,
    Tmpfs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Confinement {
    /// cgroup v2 or v1, whichever the host has; a clear error if neither is writable.
    Auto,
    /// No confinement (for hosts without cgroups, and for many agents on one test host).
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Execution {
    /// Run the batch script.
    Real,
    /// Occupy the allocation for the script's `sleep N` without running anything.
    Simulated,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// This node's name, as the configuration's [[nodes]] defines it.
    #[arg(long, env = "DOCKET_NODE")]
    node: String,
    /// Controller replicas, host:port, comma-separated (any of them; the agent follows the
    /// leader).
    #[arg(
        long,
        env = "DOCKET_CONTROLLERS",
        value_delimiter = ',',
        required = true
    )]
    controllers: Vec<String>,
    /// Where the agent keeps what must outlive a reboot: its state file (the runs it holds
    /// and the ends not yet acknowledged), and jobfs images unless `--jobfs-dir` says.
    #[arg(long, env = "DOCKET_STATE_DIR")]
    state_dir: PathBuf,
    /// Where the agent keeps what lasts as long as the runs it describes: each run's record
    /// (its monitor's lock, the job's process group and exit) and the job's script and node
    /// file. In memory: a reboot ends the runs too, and a disk pays for every file each job
    /// creates and removes.
    #[arg(
        long,
        env = "DOCKET_RUNTIME_DIR",
        default_value = "/run/docket-nodeagent"
    )]
    runtime_dir: PathBuf,
    /// The tmpfs the agent mounts on `--runtime-dir` when that is not a mount point already
    /// (its own, capped, apart from the host's /run), MiB; it allows 256 inodes per MiB.
    /// 0: use the directory as it is.
    #[arg(long, env = "DOCKET_RUNTIME_TMPFS_MIB", default_value_t = 512)]
    runtime_tmpfs_mib: u64,
    /// Cpus this agent declares.
    #[arg(long, env = "DOCKET_CPUS")]
    cpus: u32,
    /// Memory this agent declares, MiB.
    #[arg(long, env = "DOCKET_MEMORY_MIB")]
    memory_mib: u64,
    /// GPUs this agent declares.
    #[arg(long, env = "DOCKET_GPUS", default_value_t = 0)]
    gpus: u32,
    /// The device files of those GPUs, in index order, comma-separated (default: /dev/nvidia0,
    /// /dev/nvidia1, ...). Each job is kept off the ones it was not given.
    #[arg(long, env = "DOCKET_GPU_DEVICES", value_delimiter = ',')]
    gpu_devices: Vec<PathBuf>,
    /// Real or simulated execution.
    #[arg(long, env = "DOCKET_EXECUTION", value_enum, default_value = "real")]
    execution: Execution,
    /// Seconds between SIGTERM and SIGKILL when a job is killed or reaches its limit.
    #[arg(long, env = "DOCKET_KILL_GRACE_S", default_value_t = 30)]
    kill_grace_s: u64,
    /// How jobs are confined.
    #[arg(long, env = "DOCKET_CONFINEMENT", value_enum, default_value = "auto")]
    confinement: Confinement,
    /// Host cpus this agent gives jobs exclusively, as a list (`0-15`); default: the first
    /// --cpus cpus of the agent's own cpuset.
    #[arg(long, env = "DOCKET_CPUSET")]
    cpuset: Option<String>,
    /// Where each job's scratch (jobfs) is mounted; default: STATE_DIR/jobfs.
    #[arg(long, env = "DOCKET_JOBFS_DIR")]
    jobfs_dir: Option<PathBuf>,
    /// How jobfs is mounted: a loop-mounted ext4 image on local disk, or tmpfs (in RAM).
    #[arg(long, env = "DOCKET_JOBFS", value_enum, default_value = "loop")]
    jobfs: JobfsArg,
    /// Most processes one job may have.
    #[arg(long, env = "DOCKET_JOB_PIDS_MAX", default_value_t = 4096)]
    job_pids_max: u64,
    /// The directory under the agent's own cgroups that holds its jobs' cgroups (default
    /// `docket-NODE`). Agents sharing a cgroup on one host need distinct names.
    #[arg(long, env = "DOCKET_CGROUP_NAME")]
    cgroup_name: Option<String>,
    /// Cluster name for SLURM_CLUSTER_NAME.
    #[arg(long, env = "DOCKET_CLUSTER", default_value = "docket")]
    cluster: String,
    /// The cluster CA's certificate: the controllers' certificates must chain to it.
    #[arg(long, env = "DOCKET_TLS_CA", default_value = "/etc/docket/tls/ca.pem")]
    tls_ca: PathBuf,
    /// This node's certificate (`docket-controller certs issue node NAME`): the agent
    /// speaks for the node it names, and only for it. Reloaded on SIGHUP or change.
    #[arg(
        long,
        env = "DOCKET_TLS_CERT",
        default_value = "/etc/docket/tls/node.pem"
    )]
    tls_cert: PathBuf,
    /// This node's private key (readable by root only).
    #[arg(
        long,
        env = "DOCKET_TLS_KEY",
        default_value = "/etc/docket/tls/node.key"
    )]
    tls_key: PathBuf,
    /// Where srun reaches this agent to start a step's tasks (TLS with the node's
    /// certificate, which must name the host srun dials); `none`: this node runs no steps.
    #[arg(long, env = "DOCKET_STEP_LISTEN", default_value = "0.0.0.0:6818")]
    step_listen: String,
    /// The host:port srun dials (default: the listening address, or this host's name with
    /// its port when listening on every address).
    #[arg(long, env = "DOCKET_STEP_ADDRESS")]
    step_address: Option<String>,
    /// How long the connection to the controller may be silent before the agent pings it;
    /// a ping unanswered for as long ends the session, so a stopped or cut-off leader is
    /// left within about twice this. 0: no pings (a stopped leader is then noticed only when
    /// a call's 10 s deadline passes).
    #[arg(long, env = "DOCKET_PING_MS", default_value_t = session::PING.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(0..=600_000))]
    ping_ms: u64,
    /// Log filter (tracing's EnvFilter syntax).
    #[arg(long, env = "DOCKET_LOG", default_value = "info")]
    log: String,
    /// Fault drills only: SIGKILL this agent the first time a run reaches POINT (a crash
    /// aimed at a launch or an exit; see `docket-chaos`).
    #[arg(long, value_enum, value_name = "POINT")]
    crash_at: Option<docket_nodeagent::crash::CrashPoint>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Cmd::Run(args) => args,
        Cmd::ExecJob(a) => return std::process::ExitCode::from(exec_job(a)),
        Cmd::Launcher { state_dir: _ } => {
            let socket = match std::io::stdin().as_fd().try_clone_to_owned() {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("docket-nodeagent launcher: its socket: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            return match docket_nodeagent::launcher::serve(socket, launched_monitor) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("docket-nodeagent launcher: {e}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        Cmd::ExecAsUser(a) => {
            // The reason went to the monitor (and the job's stderr, if it was open).
            let _ = docket_nodeagent::shim::exec_as_user(&shim_args(a));
            return std::process::ExitCode::from(docket_nodeagent::shim::LAUNCH_FAILED as u8);
        }
    };
    match run(*args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("docket-nodeagent: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The monitor (`exec-job`): runs the job and records its end; the exit status.
fn exec_job(a: ExecJobArgs) -> u8 {
    let Some(run_dir) = a.run_dir.clone() else {
        eprintln!("docket-nodeagent exec-job: --run-dir is required");
        return 2;
    };
    match docket_nodeagent::shim::monitor(&run_dir, &shim_args(a)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("docket-nodeagent exec-job: {e:#}");
            127
        }
    }
}

/// A monitor the launcher forked, with `exec-job`'s arguments.
fn launched_monitor(args: &[std::ffi::OsString]) -> i32 {
    match Cli::try_parse_from(docket_nodeagent::launcher::exec_job_argv(args)) {
        Ok(Cli {
            command: Cmd::ExecJob(a),
        }) => i32::from(exec_job(a)),
        Ok(_) => {
            eprintln!("docket-nodeagent launcher: a request that is not a monitor's");
            2
        }
        Err(e) => {
            eprintln!("docket-nodeagent launcher: {e}");
            2
        }
    }
}

fn run(args: RunArgs) -> Result<()> {
    init_logging(&args.log)?;
    if let Some(point) = args.crash_at {
        docket_nodeagent::crash::arm(point).map_err(anyhow::Error::msg)?;
    }
    let tls = load_tls(&args)?;
    // Held while this process lives (close-on-exec: neither the launcher nor a job has it).
    let _one_agent = prepare_state_dir(&args)?;
    let runner_config = runner_config(&args)?;
    let cgroups_for_reaping = runner_config.cgroups.clone();
    let jobfs_for_reaping = runner_config.jobfs.clone();
    let (runner, events) = Runner::new(runner_config);
    let step_listen = args.step_listen.clone();
    let step_address = args.step_address.clone();
    let mut config = SessionConfig {
        node: args.node,
        controllers: args.controllers,
        cpus: args.cpus,
        memory_mib: args.memory_mib,
        gpus: args.gpus,
        tls: tls.clone(),
        step_address: String::new(),
        ping: (args.ping_ms > 0).then(|| Duration::from_millis(args.ping_ms)),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        // Runs a previous agent left: re-adopt them, then reap what nobody owns.
        let (keep_cgroups, keep_scratch) = runner.restore();
        let clock = tokio::spawn(runner.clone().clock());
        if let Some(cg) = &cgroups_for_reaping {
            cg.reap_stale(&keep_cgroups);
        }
        if let Some(j) = &jobfs_for_reaping {
            j.reap_stale(&keep_scratch);
        }
        let tls_watch = tls.watch(Duration::from_secs(5));
        let steps = match serve_steps(&step_listen, step_address, &runner, &tls).await {
            Ok(Some((address, task))) => {
                config.step_address = address;
                Some(task)
            }
            Ok(None) => None,
            // A listen address that is no address at all is the operator's mistake.
            Err(e) => {
                anyhow::bail!("{e:#} (give host:port, or `none` for a node that runs no steps)")
            }
        };
        let agent = tokio::spawn(session::run(config, runner, events));
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        agent.abort();
        clock.abort();
        if let Some(s) = steps {
            s.abort();
        }
        tls_watch.abort();
        Ok(())
    })
}

/// Logs to standard error through `filter` (tracing's EnvFilter syntax).
fn init_logging(filter: &str) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(filter)
                .with_context(|| format!("--log {filter:?}"))?,
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal, not in log files and journals.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    Ok(())
}

/// Loads the node's TLS files and checks that the certificate is this node's.
fn load_tls(args: &RunArgs) -> Result<docket_auth::tls::TlsContext> {
    let tls = docket_auth::tls::TlsContext::load(docket_auth::tls::TlsFiles {
        ca: args.tls_ca.clone(),
        identity: Some((args.tls_cert.clone(), args.tls_key.clone())),
    })
    .context("TLS")?;
    match tls.role() {
        Some(docket_auth::tls::Role::Node(name)) if name == args.node => {}
        other => anyhow::bail!(
            "--tls-cert is {}, not node {}'s certificate; issue one with `docket-controller \
             certs issue node {}`",
            other.map_or_else(|| "no certificate".to_owned(), |r| format!("{r}'s")),
            args.node,
            args.node
        ),
    }
    Ok(tls)
}

/// Checks that only root can replace the state, runtime and jobfs directories, makes the
/// state and runtime directories, and takes the state directory's lock: one agent per state
/// directory. A second one would re-adopt, reap and prune the first one's runs under it, save
/// the same state file, and stack a second tmpfs on the runtime directory, hiding the first
/// one's records.
fn prepare_state_dir(args: &RunArgs) -> Result<nix::fcntl::Flock<std::fs::File>> {
    // Nobody but root may be able to replace them from above.
    docket_nodeagent::rootdir::check_ancestors(&args.state_dir).context("--state-dir")?;
    docket_nodeagent::rootdir::check_ancestors(&args.runtime_dir).context("--runtime-dir")?;
    if let Some(dir) = &args.jobfs_dir {
        docket_nodeagent::rootdir::check_ancestors(dir).context("--jobfs-dir")?;
    }
    // Root's own (0711: jobs reach their own directories in them, nobody lists them).
    let open = |flag: &str, dir: &std::path::Path| -> Result<_> {
        let handle = docket_nodeagent::rootdir::RootDir::open_or_create(
            dir,
            docket_nodeagent::runner::STATE_DIR_MODE,
        )
        .with_context(|| format!("{flag} {}", dir.display()))?;
        // Again, now that the directories on the way exist: one made meanwhile under a
        // sticky directory could be a user's.
        docket_nodeagent::rootdir::check_ancestors(dir).context(flag.to_owned())?;
        warn_if_unreachable(flag, dir);
        Ok(handle)
    };
    let state = open("--state-dir", &args.state_dir)?;
    let one_agent = lock_state_dir(&state, &args.state_dir)?;
    let runtime = open("--runtime-dir", &args.runtime_dir)?;
    // Simulated runs keep nothing there: no mount for them (scale tests run thousands).
    if matches!(args.execution, Execution::Real) {
        use docket_nodeagent::runtimedir::{Prepared, prepare};
        match prepare(
            &runtime,
            args.runtime_tmpfs_mib,
            docket_nodeagent::runner::STATE_DIR_MODE,
            &args.state_dir,
        )
        .context("--runtime-dir")?
        {
            Prepared::Mounted => tracing::info!(
                directory = %args.runtime_dir.display(),
                mib = args.runtime_tmpfs_mib,
                "mounted the runtime directory's tmpfs"
            ),
            Prepared::Found => warn_if_not_in_memory(&args.runtime_dir),
            Prepared::Plain(why) => {
                tracing::info!(
                    directory = %args.runtime_dir.display(),
                    why,
                    "no tmpfs of its own on the runtime directory"
                );
                warn_if_not_in_memory(&args.runtime_dir);
            }
        }
    }
    Ok(one_agent)
}

/// Takes the state directory's lock. A previous agent just killed may still be exiting (a
/// supervisor that restarts it at once): the lock is waited for [`AGENT_LOCK_WAIT`], then
/// refused.
fn lock_state_dir(
    state: &docket_nodeagent::rootdir::RootDir,
    path: &std::path::Path,
) -> Result<nix::fcntl::Flock<std::fs::File>> {
    use nix::fcntl::{Flock, FlockArg};
    let deadline = std::time::Instant::now() + AGENT_LOCK_WAIT;
    let mut lock = state
        .open_lock(AGENT_LOCK)
        .with_context(|| format!("--state-dir {}", path.display()))?;
    let mut waited = false;
    loop {
        match Flock::lock(lock, FlockArg::LockExclusiveNonblock) {
            Ok(held) => return Ok(held),
            Err((file, nix::errno::Errno::EWOULDBLOCK)) if std::time::Instant::now() < deadline => {
                if !waited {
                    tracing::warn!(
                        lock = %path.join(AGENT_LOCK).display(),
                        "another agent holds the state directory; waiting for it to exit"
                    );
                    waited = true;
                }
                lock = file;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => anyhow::bail!(
                "--state-dir {}: another docket-nodeagent holds {AGENT_LOCK} (waited \
                 {AGENT_LOCK_WAIT:?}); one agent per state directory",
                path.display()
            ),
            Err((_, e)) => anyhow::bail!(
                "--state-dir {}: locking {AGENT_LOCK}: {e} (one agent per state directory; \
                 keep the state directory on a local file system)",
                path.display()
            ),
        }
    }
}

/// Sets up what runs jobs on this node (cgroups, cpus, jobfs, GPUs), in that order.
fn runner_config(args: &RunArgs) -> Result<RunnerConfig> {
    let cgroups = detect_cgroups(args)?;
    let cpu_pool = match &args.cpuset {
        Some(list) => parse_cpu_list(list).with_context(|| format!("--cpuset {list:?}"))?,
        None => own_cpus().into_iter().take(args.cpus as usize).collect(),
    };
    let shim = std::env::current_exe().context("locating this binary (the job shim)")?;
    let jobfs = open_jobfs(args)?;
    let gpus = discover_gpus(args, cgroups.as_ref())?;
    Ok(RunnerConfig {
        node: args.node.clone(),
        cluster: args.cluster.clone(),
        state_dir: args.state_dir.clone(),
        runtime_dir: args.runtime_dir.clone(),
        mode: match args.execution {
            Execution::Real => Mode::Real,
            Execution::Simulated => Mode::Simulated,
        },
        kill_grace: Duration::from_secs(args.kill_grace_s),
        cgroups,
        cpu_pool,
        pids_max: args.job_pids_max,
        shim,
        jobfs,
        gpus,
    })
}

/// The host's cgroups, with the agent's place in them prepared, when jobs are confined.
fn detect_cgroups(args: &RunArgs) -> Result<Option<docket_nodeagent::cgroup::Cgroups>> {
    Ok(match (args.confinement, args.execution) {
        (_, Execution::Simulated) | (Confinement::None, _) => None,
        (Confinement::Auto, Execution::Real) => Some(
            docket_nodeagent::cgroup::Cgroups::detect(
                &args
                    .cgroup_name
                    .clone()
                    .unwrap_or_else(|| format!("docket-{}", args.node)),
            )
            .context("--confinement auto")?,
        ),
    })
}

/// The jobfs area, for real execution.
fn open_jobfs(args: &RunArgs) -> Result<Option<docket_nodeagent::jobfs::Jobfs>> {
    Ok(match args.execution {
        Execution::Simulated => None,
        Execution::Real => Some(
            docket_nodeagent::jobfs::Jobfs::open(
                args.jobfs_dir
                    .clone()
                    .unwrap_or_else(|| args.state_dir.join("jobfs")),
                match args.jobfs {
                    JobfsArg::Loop => docket_nodeagent::jobfs::JobfsKind::Loop,
                    JobfsArg::Tmpfs => docket_nodeagent::jobfs::JobfsKind::Tmpfs,
                },
            )
            .context("--jobfs-dir")?,
        ),
    })
}

/// The node's GPUs (none when simulated); refused if `cgroups` cannot keep jobs off them.
fn discover_gpus(
    args: &RunArgs,
    cgroups: Option<&docket_nodeagent::cgroup::Cgroups>,
) -> Result<docket_nodeagent::gpu::Gpus> {
    let gpus = match args.execution {
        Execution::Simulated => docket_nodeagent::gpu::Gpus::default(),
        Execution::Real => docket_nodeagent::gpu::Gpus::discover(args.gpus, &args.gpu_devices)?,
    };
    if gpus.count() > 0
        && let Some(cg) = cgroups
        && !cg.constrains_devices()
    {
        anyhow::bail!(
            "--gpus {}: this host's cgroups cannot keep jobs off each other's GPUs (the v1 \
             devices controller is not mounted); mount it, or start with --confinement none",
            args.gpus
        );
    }
    Ok(gpus)
}

/// Serves the step I/O service on `listen` (unless `none`); the address srun dials.
///
/// The port is bound by a task of its own that keeps trying while another process holds
/// it: the node goes on running jobs meanwhile (its steps wait, srun refusing whatever else
/// answers there for want of the node's certificate), so no local user who takes the port
/// first keeps the agent from starting.
async fn serve_steps(
    listen: &str,
    advertised: Option<String>,
    runner: &Runner,
    tls: &docket_auth::tls::TlsContext,
) -> Result<Option<(String, tokio::task::JoinHandle<()>)>> {
    if listen == "none" {
        return Ok(None);
    }
    let wanted: std::net::SocketAddr = tokio::net::lookup_host(listen)
        .await
        .with_context(|| format!("--step-listen {listen}"))?
        .next()
        .with_context(|| format!("--step-listen {listen}: no address"))?;
    let first = tokio::net::TcpListener::bind(wanted).await;
    // Port 0 (tests) is known only once bound; a named port is known now.
    let port = match &first {
        Ok(l) => l
            .local_addr()
            .context("the step listener's address")?
            .port(),
        Err(_) => wanted.port(),
    };
    let address = match advertised {
        Some(a) => a,
        None if wanted.ip().is_unspecified() => {
            let host = nix::unistd::gethostname()
                .context("this host's name")?
                .to_string_lossy()
                .into_owned();
            format!("{host}:{port}")
        }
        None => std::net::SocketAddr::new(wanted.ip(), port).to_string(),
    };
    let tls = tls.clone();
    let service = runner.step_service();
    let task = tokio::spawn(async move {
        let mut bound = first;
        let mut said = None::<std::time::Instant>;
        let listener = loop {
            match bound {
                Ok(l) => break l,
                Err(e) => {
                    if said.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                        tracing::error!(
                            address = %wanted, error = %e,
                            "cannot bind the step port (another process holds it?); no step \
                             starts on this node until it can, retrying"
                        );
                        said = Some(std::time::Instant::now());
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    bound = tokio::net::TcpListener::bind(wanted).await;
                }
            }
        };
        let incoming = docket_auth::tls::serve::incoming(listener, tls);
        // srun opens one stream per node it runs on: a connection needs few.
        let served = tonic::transport::Server::builder()
            .max_concurrent_streams(Some(16))
            .layer(docket_proto::malformed::MalformedLayer)
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the step I/O service stopped");
        }
    });
    tracing::info!(%address, "srun reaches this agent's steps here");
    Ok(Some((address, task)))
}

fn shim_args(a: ExecJobArgs) -> docket_nodeagent::shim::ShimArgs {
    docket_nodeagent::shim::ShimArgs {
        join: a.join,
        user: a.user,
        uid: a.uid,
        gid: a.gid,
        rlimit_as: a.rlimit_as,
        env_file: a.env_file,
        set: a
            .set
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        work_dir: a.work_dir,
        stdout: a.stdout,
        stderr: a.stderr,
        inherit_stdio: a.inherit_stdio,
        command: a.command,
    }
}

/// Jobs read their scripts under the runtime directory and reach their jobfs under the state
/// directory as their users: every directory above them must let others pass (mode o+x).
fn warn_if_unreachable(flag: &str, dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(full) = std::fs::canonicalize(dir) else {
        return;
    };
    for above in full.ancestors().skip(1) {
        if let Ok(m) = std::fs::metadata(above)
            && m.permissions().mode() & 0o001 == 0
        {
            tracing::warn!(
                directory = %above.display(),
                "jobs of users other than root cannot reach their files under {flag}: \
                 this directory does not let others pass (chmod o+x)"
            );
        }
    }
}

/// Every run creates and removes files in the runtime directory. On a disk that costs more
/// than the rest of the run's bookkeeping (on an ext4 without a journal each new inode skips
/// the ones freed in the last minutes), and nothing there needs to outlive a reboot.
fn warn_if_not_in_memory(dir: &std::path::Path) {
    match nix::sys::statfs::statfs(dir) {
        Ok(fs) if fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC => {}
        Ok(fs) => tracing::warn!(
            directory = %dir.display(),
            filesystem = ?fs.filesystem_type(),
            "--runtime-dir is not on a tmpfs: every job's files there cost disk work \
             (leave --runtime-tmpfs-mib above 0 and the directory empty at start)"
        ),
        Err(e) => {
            tracing::warn!(directory = %dir.display(), error = %e, "checking --runtime-dir's file system")
        }
    }
}

/// `0-3,8` → [0, 1, 2, 3, 8].
fn parse_cpu_list(text: &str) -> Result<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse()?, b.trim().parse()?);
                anyhow::ensure!(a <= b, "{part}: the range runs backwards");
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The cpus this process may run on (`Cpus_allowed_list` in /proc/self/status).
fn own_cpus() -> Vec<u32> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Cpus_allowed_list:")
                    .map(|v| v.trim().to_owned())
            })
        })
        .and_then(|list| parse_cpu_list(&list).ok())
        .unwrap_or_default()
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
