//! `docket-chaos`: proves under faults that Docket loses nothing.
//!
//! The harness, fault injectors and checkers arrive with the chaos issue; for now the binary
//! describes itself.

use clap::Parser;

/// Fault injection and invariant checking for Docket.
///
/// Starts a real cluster, drives a concurrent workload, injects faults on a seeded schedule
/// (kills, pauses, partitions, full disks, clock jumps), then checks the recorded history:
/// every acknowledged job exists exactly once, no job ran twice, every job finished, and the
/// cluster recovered by itself. Prints the figures and the seed that reproduces the run.
#[derive(Debug, Parser)]
#[command(
    name = "docket-chaos",
    version,
    about,
    long_about,
    arg_required_else_help = true
)]
struct Cli {}

fn main() {
    Cli::parse();
}
