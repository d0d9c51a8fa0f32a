//! `docket-controller`: one replica of the Docket control plane.
//!
//! Its subcommands (run, bootstrap, check-config) arrive with the controller issue; for now
//! the binary describes itself.

use clap::Parser;

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
struct Cli {}

fn main() {
    Cli::parse();
}
