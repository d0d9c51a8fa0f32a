//! `docket`: the command users and admins live in.
//!
//! One binary: invoked through a symlink named `sbatch`, `squeue`, `qsub`, ... (see
//! `docket install-aliases`) it speaks that command's dialect; as `docket` it has its own
//! subcommands (cluster, config, node) and `docket sim`, which replays a workload trace
//! offline. Every command finds the controllers in `--addr` or `DOCKET_ADDR`, follows the
//! leader and waits out elections; its exit status says what happened (see `exit` below).

// Every command prints through these (they shadow std's for the whole crate): a reader that
// closes the pipe early ends the command quietly instead of in a panic (see `stdout`). Not in
// the unit tests, whose output libtest must capture, as it captures only std's macros.
#[cfg(not(test))]
macro_rules! println {
    () => {
        $crate::stdout::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::stdout::line(format_args!($($arg)*))
    };
}
#[cfg(not(test))]
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::stdout::text(format_args!($($arg)*))
    };
}

mod admin;
mod aliases;
mod allocation;
mod client;
mod cluster;
#[cfg(test)]
mod hostile;
mod listing;
mod pbs;
mod pbs_interactive;
mod pbsdsh;
mod pbsnodes;
mod plot;
mod sacct;
mod sacctmgr;
mod salloc;
mod sbatch;
mod scancel;
mod scontrol;
mod sim;
mod sim_compare;
mod sinfo;
mod slurm_json;
mod slurmtime;
mod sprio;
mod squeue;
mod squeue_format;
mod srun;
mod sshare;
mod stdout;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The Docket command line.
///
/// Submit and control jobs, look at queues, nodes and fair-share, administer the cluster.
/// Invoked as sbatch, squeue, scancel, sinfo, scontrol, sprio, sshare, sacct, qsub, qstat,
/// qdel, qhold, qrls or pbsnodes it speaks that command's dialect. `docket sim` replays a
/// workload trace through the scheduler offline.
///
/// Exit status: 0 done; 1 refused or failed (the message says why); 2 wrong command line;
/// 3 no controller answered or none led within DOCKET_RETRY_SECONDS (30): nothing was done;
/// 4 leadership was lost while applying or no answer came in time: the outcome is unknown,
/// look before repeating.
/// `sbatch -W` exits with the job's exit code.
#[derive(Debug, Parser)]
#[command(
    name = "docket",
    version,
    about,
    long_about,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Sim(sim::SimArgs),
    /// Submit a batch script (as sbatch).
    Submit(Box<sbatch::SbatchArgs>),
    /// Show the queue (as squeue).
    Queue(squeue::SqueueArgs),
    /// Cancel jobs (as scancel).
    Cancel(scancel::ScancelArgs),
    /// The controller replicas: status, add, remove.
    Cluster(cluster::ClusterArgs),
    /// The replicated configuration: show, apply (with a dry run), remove objects.
    Config(admin::ConfigArgs),
    /// Compute nodes: list, drain, resume.
    Node(admin::NodeArgs),
    /// Print a fresh credential proving who you are (from docket-authd, or munged with
    /// auth/munge), for scripts and portals that call the gRPC API directly: send it in the
    /// `x-docket-credential` metadata entry. Each is good for one request, within about a
    /// minute.
    Credential,
    /// Create DIR/sbatch, DIR/squeue, ... as symlinks to this binary.
    InstallAliases {
        /// Where to put the links (e.g. /usr/local/bin).
        dir: std::path::PathBuf,
    },
}

/// The command this binary was invoked as (`sbatch` through a symlink, ...).
fn invoked_as() -> String {
    std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default()
}

fn main() -> ExitCode {
    let invoked = invoked_as();
    let (name, result) = match invoked.as_str() {
        "sbatch" => ("sbatch", sbatch::run(sbatch::SbatchArgs::parse())),
        "squeue" => ("squeue", squeue::run(squeue::SqueueArgs::parse())),
        "scancel" => ("scancel", scancel::run(scancel::ScancelArgs::parse())),
        "sinfo" => ("sinfo", sinfo::sinfo(sinfo::SinfoArgs::parse())),
        "sacct" => ("sacct", sacct::sacct(sacct::SacctArgs::parse())),
        "sshare" => ("sshare", sshare::sshare(sshare::SshareArgs::parse())),
        "sacctmgr" => (
            "sacctmgr",
            sacctmgr::sacctmgr(sacctmgr::SacctmgrArgs::parse()),
        ),
        "pbsnodes" => (
            "pbsnodes",
            pbsnodes::pbsnodes(pbsnodes::PbsnodesArgs::parse()),
        ),
        "scontrol" => (
            "scontrol",
            scontrol::scontrol(scontrol::ScontrolArgs::parse()),
        ),
        "sprio" => ("sprio", sprio::sprio(sprio::SprioArgs::parse())),
        "srun" => return ExitCode::from(srun::main(srun::SrunArgs::parse())),
        "salloc" => return ExitCode::from(salloc::main(salloc::SallocArgs::parse())),
        "pbsdsh" => return ExitCode::from(pbsdsh::main(pbsdsh::PbsdshArgs::parse())),
        "qsub" => {
            let args = pbs::QsubArgs::parse();
            if args.interactive {
                return ExitCode::from(pbs_interactive::main(args));
            }
            ("qsub", pbs::qsub(args))
        }
        "qstat" => ("qstat", pbs::qstat(pbs::QstatArgs::parse())),
        verb @ ("qdel" | "qhold" | "qrls") => (verb, pbs::qctl(verb, pbs::QctlArgs::parse())),
        _ => {
            let cli = Cli::parse();
            let r = match cli.command {
                Command::Sim(args) => sim::run(&args),
                Command::Submit(args) => sbatch::run(*args),
                Command::Queue(args) => squeue::run(args),
                Command::Cancel(args) => scancel::run(args),
                Command::InstallAliases { dir } => aliases::install_aliases(&dir),
                Command::Credential => client::from_config_file()
                    .and_then(|site| client::credential_source(&site))
                    .and_then(|source| Ok(source.credential()?))
                    .map(|c| println!("{c}")),
                Command::Cluster(args) => cluster::run(args),
                Command::Config(args) => admin::config(args),
                Command::Node(args) => admin::node(args),
            };
            ("docket", r)
        }
    };
    match result {
        Ok(()) => ExitCode::from(client::exit::OK),
        Err(e) => {
            eprintln!("{name}: error: {e:#}");
            ExitCode::from(client::exit_code(&e))
        }
    }
}
