//! `docket`: the command users and admins live in.
//!
//! Its cluster subcommands and the Slurm/PBS entry points (`sbatch`, `squeue`, `qsub`, ...)
//! arrive with the CLI issue; `docket sim` replays a workload trace offline.

mod plot;
mod sim;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Sim(args) => sim::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("docket: {e:#}");
            ExitCode::FAILURE
        }
    }
}
