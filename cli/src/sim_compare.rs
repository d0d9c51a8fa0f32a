//! `docket sim --compare` and `--window`: one trace under several policies, side by side.
//!
//! Each policy replays the same trace on a fresh machine through the real state machine and
//! planners (see `docket_core::sim`). With `--window N`, each replays `--samples` sequences
//! of N consecutive jobs instead (each from time 0 on an empty machine) and the figures are
//! the means over the sequences, the protocol of the published comparisons (RLScheduler,
//! SC'20: sequences of 1,024 jobs).

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result};
use docket_core::sim::swf::Trace;
use docket_core::sim::{self, Policy, SimOptions, SimSite, Summary};

use crate::sim::SimArgs;

/// One policy's figures: a whole replay's, or the means over its sequences.
#[derive(Debug, Clone)]
pub struct Row {
    pub policy: String,
    /// Replays behind the figures (1, or the sequences of `--window`).
    pub replays: usize,
    pub jobs: f64,
    pub utilization: f64,
    pub mean_wait_s: f64,
    pub p95_wait_s: f64,
    pub max_wait_s: f64,
    pub mean_bsld: f64,
    pub makespan_s: f64,
    pub wall_s: f64,
}

impl Row {
    fn mean_of(policy: String, summaries: &[Summary], wall_s: f64) -> Row {
        let n = summaries.len().max(1) as f64;
        let mean = |f: fn(&Summary) -> f64| summaries.iter().map(f).sum::<f64>() / n;
        Row {
            policy,
            replays: summaries.len(),
            jobs: mean(|s| s.jobs as f64),
            utilization: mean(|s| s.utilization),
            mean_wait_s: mean(|s| s.mean_wait_s),
            p95_wait_s: mean(|s| s.p95_wait_s),
            max_wait_s: mean(|s| s.max_wait_s),
            mean_bsld: mean(|s| s.mean_bsld),
            makespan_s: mean(|s| s.makespan_s),
            wall_s,
        }
    }
}

pub fn run(args: &SimArgs, trace: &Trace, site: Option<SimSite>) -> Result<()> {
    // `None`: the configuration's own policy, else EASY.
    let policies: Vec<Option<Policy>> = if args.compare.is_empty() {
        vec![args.policy]
    } else {
        args.compare.iter().copied().map(Some).collect()
    };
    let traces = match args.window {
        Some(size) => trace.windows(size, args.samples),
        None => vec![trace.clone()],
    };
    let mut rows = Vec::new();
    for policy in policies {
        let options = SimOptions {
            policy,
            procs: args.procs,
            max_jobs: args.jobs,
            site: site.clone(),
        };
        let started = Instant::now();
        let mut summaries = Vec::new();
        let mut name = String::new();
        for t in &traces {
            let replay = sim::replay(t, &options, &mut |_, _| {})
                .with_context(|| format!("replaying under {}", describe(policy)))?;
            name = replay.summary.policy.name();
            summaries.push(replay.summary);
        }
        rows.push(Row::mean_of(
            name,
            &summaries,
            started.elapsed().as_secs_f64(),
        ));
    }
    if let Some(path) = &args.plot {
        crate::plot::write_compare(&rows, path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        for r in &rows {
            let row = serde_json::json!({
                "policy": r.policy,
                "replays": r.replays,
                "jobs": r.jobs,
                "utilization": r.utilization,
                "mean_wait_s": r.mean_wait_s,
                "p95_wait_s": r.p95_wait_s,
                "max_wait_s": r.max_wait_s,
                "mean_bsld": r.mean_bsld,
                "makespan_s": r.makespan_s,
                "sim_wall_s": r.wall_s,
            });
            writeln!(out, "{row}")?;
        }
        return Ok(());
    }
    write_table(&mut out, &rows, args.window, traces.len())?;
    Ok(())
}

fn describe(policy: Option<Policy>) -> String {
    policy.map_or_else(|| "the configuration's policy".to_owned(), |p| p.name())
}

/// The table: one row per policy, bounded slowdown with its change against the first row.
fn write_table(
    out: &mut impl Write,
    rows: &[Row],
    window: Option<usize>,
    replays: usize,
) -> Result<()> {
    if let Some(w) = window {
        writeln!(
            out,
            "means over {replays} sequences of {w} jobs (bounded slowdown with a 10 s floor)"
        )?;
    } else {
        writeln!(out, "whole trace (bounded slowdown with a 10 s floor)")?;
    }
    writeln!(
        out,
        "{:<26} {:>8} {:>6} {:>11} {:>11} {:>11} {:>10} {:>8} {:>12} {:>7}",
        "policy",
        "jobs",
        "util",
        "mean wait",
        "p95 wait",
        "max wait",
        "mean bsld",
        "vs 1st",
        "makespan",
        "wall",
    )?;
    let first = rows.first().map_or(0.0, |r| r.mean_bsld);
    for r in rows {
        let change = if first > 0.0 {
            format!("{:+.0}%", (r.mean_bsld / first - 1.0) * 100.0)
        } else {
            "-".to_owned()
        };
        writeln!(
            out,
            "{:<26} {:>8.0} {:>6.3} {:>10.0}s {:>10.0}s {:>10.0}s {:>10.2} {:>8} {:>11.0}s {:>6.2}s",
            r.policy,
            r.jobs,
            r.utilization,
            r.mean_wait_s,
            r.p95_wait_s,
            r.max_wait_s,
            r.mean_bsld,
            change,
            r.makespan_s,
            r.wall_s,
        )?;
    }
    Ok(())
}
