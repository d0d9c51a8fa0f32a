//! The SVG `docket sim --plot` draws: utilization and queue length over time, and the
//! distribution of waits.

use std::path::Path;

use anyhow::{Result, anyhow};
use docket_core::sim::Replay;

use crate::sim_compare::Row;
use plotters::prelude::*;

pub fn write(replay: &Replay, path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (1000, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let (top, bottom) = root.split_vertically(600);
    let (util, queue) = top.split_vertically(300);
    let samples = &replay.samples;
    let t0 = samples.first().map_or(0, |s| s.time);
    let hours = |t: u64| (t - t0) as f64 / 3600.0;
    let end = samples.last().map_or(1.0, |s| hours(s.time).max(1.0));
    let procs = replay.summary.procs.max(1) as f64;

    let busy: Vec<(f64, f64)> = samples
        .iter()
        .map(|s| (hours(s.time), s.busy_procs as f64 / procs))
        .collect();
    line_chart(&util, "busy processors (fraction)", end, 1.0, &busy, &BLUE)?;
    let queued: Vec<(f64, f64)> = samples
        .iter()
        .map(|s| (hours(s.time), s.queued_jobs as f64))
        .collect();
    let max_q = queued.iter().map(|p| p.1).fold(1.0, f64::max);
    line_chart(&queue, "queued jobs", end, max_q, &queued, &RED)?;

    // Waits in 40 bins up to the largest.
    let max_wait = replay.summary.max_wait_s.max(1.0);
    let bins = 40u32;
    let width = max_wait / f64::from(bins);
    let mut counts = vec![0u32; bins as usize + 1];
    for o in &replay.outcomes {
        let b = ((o.wait() as f64 / width) as usize).min(bins as usize);
        counts[b] += 1;
    }
    let max_count = counts.iter().copied().max().unwrap_or(1).max(1);
    let mut chart = ChartBuilder::on(&bottom)
        .caption("wait time distribution (jobs per bin)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d((0u32..bins).into_segmented(), 0u32..max_count)
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc(format!("wait, bins of {width:.0} s"))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .style(GREEN.filled())
                .data(counts.iter().enumerate().map(|(i, c)| (i as u32, *c))),
        )
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// One value over time, in hours.
fn line_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    x_max: f64,
    y_max: f64,
    points: &[(f64, f64)],
    color: &RGBColor,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("hours")
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .draw_series(LineSeries::new(points.iter().copied(), color))
        .map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// Reads one figure of a policy's row.
type Figure = fn(&Row) -> f64;

/// `docket sim --compare --plot`: per policy, mean bounded slowdown, mean and maximum wait,
/// and utilization, as bars.
pub fn write_compare(rows: &[Row], path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (1000, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let areas = root.split_evenly((2, 2));
    let charts: [(&str, Figure, &RGBColor); 4] = [
        ("mean bounded slowdown", |r| r.mean_bsld, &RED),
        ("mean wait (hours)", |r| r.mean_wait_s / 3600.0, &BLUE),
        ("maximum wait (hours)", |r| r.max_wait_s / 3600.0, &MAGENTA),
        ("utilization", |r| r.utilization, &GREEN),
    ];
    for (area, (caption, value, color)) in areas.iter().zip(charts) {
        bar_chart(area, caption, rows, value, color)?;
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// One bar per policy, labelled with its name.
fn bar_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    rows: &[Row],
    value: Figure,
    color: &RGBColor,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let n = rows.len().max(1);
    let top = rows.iter().map(value).fold(0.0, f64::max).max(1e-9) * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0..n).into_segmented(), 0.0..top)
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => rows.get(*i).map_or(String::new(), |r| r.policy.clone()),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, r)| {
            Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), value(r)),
                ],
                color.mix(0.7).filled(),
            )
        }))
        .map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
