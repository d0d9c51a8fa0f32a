//! `docket`: the command users and admins live in.
//!
//! Its subcommands and the Slurm/PBS entry points (`sbatch`, `squeue`, `qsub`, ...) arrive
//! with the CLI issue, `docket sim` with the planner issue; for now the binary describes
//! itself.

use clap::Parser;

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
struct Cli {}

fn main() {
    Cli::parse();
}
