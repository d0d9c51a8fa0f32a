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
    pub(crate) swf: PathBuf,
    /// The controller's configuration (docket.toml): its nodes, partitions, QOS, accounts
    /// and every policy apply, and its [sim] table maps SWF queues and partitions.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// The scheduling policy (default: the configuration's, else easy): fcfs, easy,
    /// conservative, easy-sjbf (backfill shortest first), easy++ (Tsafrir et al.: easy-sjbf
    /// on runtime predictions), sjf, lxf, f1 (EASY with the queue by shortest expected run
    /// time, largest expansion factor, or Carastan-Santos and de Camargo's F1); modifiers
    /// +sjbf, +predict, +starve=SECONDS (e.g. sjf+predict+starve=86400). A policy sets the
    /// backfill mode, both orders, the predictor and the starvation bound, overriding the
    /// configuration's.
    #[arg(long, value_parser = Policy::parse, conflicts_with = "compare")]
    pub(crate) policy: Option<Policy>,
    /// Replay under each of these policies (comma-separated, as --policy names them) and
    /// print one row per policy; with --plot, an SVG comparing them.
    #[arg(long, value_parser = Policy::parse, value_delimiter = ',', value_name = "POLICY,...")]
    pub(crate) compare: Vec<Policy>,
    /// Replay sequences of this many consecutive jobs instead of the whole trace (each from
    /// time 0 on an empty machine) and report the mean of their figures, as published
    /// evaluations do (RLScheduler: 1,024).
    #[arg(long, value_name = "JOBS")]
    pub(crate) window: Option<usize>,
    /// Scale the intervals between submissions so the trace offers this load (processor
    /// time asked over processor time available, e.g. 0.9) on the machine.
    #[arg(long, value_name = "LOAD", value_parser = parse_load)]
    pub(crate) load: Option<f64>,
    /// How many sequences --window replays, evenly spaced through the trace.
    #[arg(long, value_name = "N", default_value_t = 10, requires = "window")]
    pub(crate) samples: usize,
    /// Processors of the machine (default: the trace's MaxProcs, else MaxNodes; a
    /// configuration that defines nodes defines the machine instead).
    #[arg(long, value_name = "N")]
    pub(crate) procs: Option<u64>,
    /// Replay only the first N jobs.
    #[arg(long, value_name = "N")]
    pub(crate) jobs: Option<usize>,
    /// Write one CSV row per job (id, user, procs, submit, start, end, wait, run, bsld).
    #[arg(long, value_name = "FILE.csv")]
    pub(crate) jobs_out: Option<PathBuf>,
    /// Draw utilization and queue length over time and the wait-time distribution (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// With --compare or --window: one JSON object per policy instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// No progress bar (it is drawn only on a terminal anyway).
    #[arg(long)]
    pub(crate) no_progress: bool,
}

pub fn run(args: &SimArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.swf)
        .with_context(|| format!("reading trace {}", args.swf.display()))?;
    let mut trace = sim::swf::parse(&text).with_context(|| format!("in {}", args.swf.display()))?;
    if let Some(load) = args.load {
        // Offered on the trace's machine (or --procs); a site's nodes may differ.
        let procs = trace
            .machine_procs(args.procs)
            .context("--load needs the machine size: give --procs")?;
        trace = trace.at_load(procs, load);
    }
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
    if !args.compare.is_empty() || args.window.is_some() {
        return crate::sim_compare::run(args, &trace, site);
    }
    let options = SimOptions {
        policy: args.policy,
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
        "policy_name": s.policy.name(),
        "jobs": s.jobs,
        "dropped": s.dropped,
        "refused": s.refused,
        "first_refusal": s.first_refusal,
        "unstarted": s.unstarted,
        "procs": s.procs,
        // The planner alone, what this field has always said.
        "policy": Policy::of(s.policy.backfill).name(),
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
            o.run.to_string(),
            o.estimate.to_string(),
            format!("{:.4}", o.bsld()),
        ])?;
    }
    w.flush()?;
    Ok(())
}

fn parse_load(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.01..=10.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "{text:?} is not a load between 0.01 and 10 (e.g. 0.9)"
        )),
    }
}
