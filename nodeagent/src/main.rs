//! `docket-nodeagent`: the daemon on every compute node.
//!
//! Its run mode (registration, the instruction stream, cgroup confinement, jobfs, walltime,
//! suspend and resume) arrives with the node agent issue; for now the binary describes itself.

use clap::Parser;

/// Docket's agent on one compute node.
///
/// Registers the node with the controllers, launches each job it is told to start inside its
/// own cgroup (exclusive cpuset, memory and vmem limits, pids limit) with a size-capped jobfs
/// scratch directory, enforces walltime, suspends and resumes jobs through the cgroup
/// freezer, and reports every state change. Instructions older than the job's dispatch epoch
/// are refused, so a job never runs twice.
#[derive(Debug, Parser)]
#[command(
    name = "docket-nodeagent",
    version,
    about,
    long_about,
    arg_required_else_help = true
)]
struct Cli {}

fn main() {
    Cli::parse();
}
