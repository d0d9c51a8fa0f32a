//! `docket sim`: replay a workload trace (SWF) through the scheduler core, offline.
//!
//! The replay runs the controller's own state machine and planners on a virtual clock (see
//! `docket_core::sim`). This module reads the trace, reports progress, prints the JSON
//! summary, and writes the optional per-job CSV and SVG plot.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use docket_core::sim::{self, Policy, Replay, SimOptions, SimSite};

/// Replay a workload trace (Standard Workload Format) through Docket's scheduler.
///
/// Prints one JSON object: jobs, procs, policy, utilization, mean_wait_s, p95_wait_s,
/// max_wait_s, mean_bsld, makespan_s, sim_wall_s (and dropped, refused, unstarted).
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// The trace to replay (SWF).
    #[arg(long, value_name = "FILE")]
    swf: PathBuf,
    /// The controller's configuration (docket.toml): its nodes, partitions, QOS, accounts
    /// and every policy apply, and its [sim] table maps SWF queues and partitions.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The scheduling policy: first come first served, EASY backfill, or conservative
    /// backfill (default: the configuration's, else easy).
    #[arg(long, value_enum)]
    policy: Option<PolicyArg>,
    /// Processors of the machine (default: the trace's MaxProcs, else MaxNodes; a
    /// configuration that defines nodes defines the machine instead).
    #[arg(long, value_name = "N")]
    procs: Option<u64>,
    /// Replay only the first N jobs.
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
    /// Write one CSV row per job (id, user, procs, submit, start, end, wait, run, bsld).
    #[arg(long, value_name = "FILE.csv")]
    jobs_out: Option<PathBuf>,
    /// Draw utilization and queue length over time and the wait-time distribution (SVG).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// No progress bar (it is drawn only on a terminal anyway).
    #[arg(long)]
    no_progress: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PolicyArg {
    Fcfs,
    Easy,
    Conservative,
}

impl From<PolicyArg> for Policy {
    fn from(p: PolicyArg) -> Policy {
        match p {
            PolicyArg::Fcfs => Policy::Fcfs,
            PolicyArg::Easy => Policy::Easy,
            PolicyArg::Conservative => Policy::Conservative,
        }
    }
}

pub fn run(args: &SimArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.swf)
        .with_context(|| format!("reading trace {}", args.swf.display()))?;
    let trace = sim::swf::parse(&text).with_context(|| format!("in {}", args.swf.display()))?;
    let site = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading configuration {}", path.display()))?;
            let file = docket_core::site::parse(&text)
                .with_context(|| format!("in configuration {}", path.display()))?;
            Some(
                SimSite::from_file(&file)
                    .with_context(|| format!("in configuration {}", path.display()))?,
            )
        }
        None => None,
    };
    let options = SimOptions {
        policy: args.policy.map(Policy::from),
        procs: args.procs,
        max_jobs: args.jobs,
        site,
    };
    let bar = if args.no_progress {
        indicatif::ProgressBar::hidden()
    } else {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} replaying [{bar:40}] {pos}/{len} jobs done ({eta} left)",
            )
            .context("progress bar template")?,
        );
        bar
    };
    let started = Instant::now();
    let replay = sim::replay(&trace, &options, &mut |done, total| {
        if done % 256 == 0 || done == total {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
    })?;
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    if let Some(path) = &args.jobs_out {
        write_csv(&replay, path).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        crate::plot::write(&replay, path).with_context(|| format!("writing {}", path.display()))?;
    }
    let s = &replay.summary;
    let summary = serde_json::json!({
        "jobs": s.jobs,
        "dropped": s.dropped,
        "refused": s.refused,
        "first_refusal": s.first_refusal,
        "unstarted": s.unstarted,
        "procs": s.procs,
        "policy": s.policy.name(),
        "utilization": s.utilization,
        "mean_wait_s": s.mean_wait_s,
        "p95_wait_s": s.p95_wait_s,
        "max_wait_s": s.max_wait_s,
        "mean_bsld": s.mean_bsld,
        "makespan_s": s.makespan_s,
        "sim_wall_s": wall,
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{summary}")?;
    Ok(())
}

fn write_csv(replay: &Replay, path: &PathBuf) -> Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    w.write_record([
        "swf_id",
        "user",
        "procs",
        "submit",
        "start",
        "end",
        "wait_s",
        "run_s",
        "estimate_s",
        "bsld",
    ])?;
    for o in &replay.outcomes {
        w.write_record([
            o.swf_id.to_string(),
            o.user.to_string(),
            o.procs.to_string(),
            o.submit.to_string(),
            o.start.to_string(),
            o.end.to_string(),
            o.wait().to_string(),
            o.run().to_string(),
            o.estimate.to_string(),
            format!("{:.4}", o.bsld()),
        ])?;
    }
    w.flush()?;
    Ok(())
}
