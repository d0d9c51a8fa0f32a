//! `docket`: the command users and admins live in.
//!
//! Its cluster subcommands and the Slurm/PBS entry points (`sbatch`, `squeue`, `qsub`, ...)
//! arrive with the CLI issue; `docket sim` replays a workload trace offline.

mod client;
mod cluster;
mod pbs;
mod plot;
mod sbatch;
mod scancel;
mod sim;
mod slurm_more;
mod slurmtime;
mod squeue;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The Docket command line.
///
/// Submit and control jobs, look at queues, nodes and fair-share, administer the cluster.
/// Invoked as sbatch, squeue, scancel, sinfo, scontrol, sprio, sshare, sacct, qsub, qstat or
/// qdel it speaks that command's dialect. `docket sim` replays a workload trace through the
/// scheduler offline.
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
        "sinfo" => ("sinfo", slurm_more::sinfo(slurm_more::SinfoArgs::parse())),
        "sacct" => ("sacct", slurm_more::sacct(slurm_more::SacctArgs::parse())),
        "scontrol" => (
            "scontrol",
            slurm_more::scontrol(slurm_more::ScontrolArgs::parse()),
        ),
        "sprio" => ("sprio", slurm_more::sprio(slurm_more::SprioArgs::parse())),
        "qsub" => ("qsub", pbs::qsub(pbs::QsubArgs::parse())),
        "qstat" => ("qstat", pbs::qstat(pbs::QstatArgs::parse())),
        verb @ ("qdel" | "qhold" | "qrls") => (verb, pbs::qctl(verb, pbs::QctlArgs::parse())),
        _ => {
            let cli = Cli::parse();
            let r = match cli.command {
                Command::Sim(args) => sim::run(&args),
                Command::Submit(args) => sbatch::run(*args),
                Command::Queue(args) => squeue::run(args),
                Command::Cancel(args) => scancel::run(args),
                Command::InstallAliases { dir } => slurm_more::install_aliases(&dir),
                Command::Cluster(args) => cluster::run(args),
            };
            ("docket", r)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
