//! Exporting records before retention deletes them (slurmdbd's `ArchiveJobs`).
//!
//! Every replica applies the same expiry at the same log position over the same records, so
//! every replica writes the same file: `<data dir>/archive-export/jobs-<position>.<csv|swf>`,
//! named by the position of the tick that expired them. Writing is atomic (a temporary file,
//! fsync, rename, fsync of the directory), and a replayed tick rewrites the same bytes, so a
//! crash at any point neither loses nor doubles an export.
//!
//! - CSV: a header and one line per job with `sacct`'s field names (times in RFC 3339 UTC,
//!   durations in seconds, memory in MiB).
//! - SWF: the Standard Workload Format of Feitelson's Parallel Workloads Archive
//!   (<https://www.cs.huji.ac.il/labs/parallel/workload/swf.html>), 18 fields per job, times
//!   relative to the header's `UnixStartTime`; users and accounts are numbered in order of
//!   first appearance, and the header's comments name them.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use docket_core::config::ArchiveFormat;
use docket_core::job::{Job, JobState};

use super::ArchivedJob;

/// The file the records expired at `position` go to.
pub fn file_name(dir: &Path, position: u64, format: ArchiveFormat) -> PathBuf {
    let ext = match format {
        ArchiveFormat::Csv => "csv",
        ArchiveFormat::Swf => "swf",
    };
    dir.join(format!("jobs-{position:020}.{ext}"))
}

/// Writes `records` to [`file_name`] atomically and durably.
pub fn write(
    dir: &Path,
    position: u64,
    format: ArchiveFormat,
    records: &[ArchivedJob],
) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = file_name(dir, position, format);
    let temp = path.with_extension("partial");
    {
        let mut out = io::BufWriter::new(std::fs::File::create(&temp)?);
        match format {
            ArchiveFormat::Csv => csv(records, &mut out)?,
            ArchiveFormat::Swf => swf(records, &mut out)?,
        }
        out.flush()?;
        out.get_ref().sync_all()?;
    }
    std::fs::rename(&temp, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(path)
}

fn rfc3339(ms: Option<docket_core::quantity::TimeMs>) -> String {
    ms.and_then(|t| jiff::Timestamp::from_millisecond(t.0 as i64).ok())
        .map_or_else(
            || "Unknown".into(),
            |t| {
                t.round(jiff::Unit::Second)
                    .map_or_else(|_| t.to_string(), |t| t.to_string())
            },
        )
}

fn elapsed_s(job: &Job) -> Option<u64> {
    Some(job.end_time?.since(job.start_time?).0)
}

fn node_list(job: &Job) -> String {
    let names: Vec<&str> = job
        .allocation_record()
        .map(|a| a.shares.iter().map(|s| s.node.as_str()).collect())
        .unwrap_or_default();
    if names.is_empty() {
        "None assigned".into()
    } else {
        docket_core::hostlist::compress(&names)
    }
}

/// CSV with `sacct`'s field names.
pub fn csv(records: &[ArchivedJob], out: &mut dyn Write) -> io::Result<()> {
    let mut w = ::csv::Writer::from_writer(out);
    w.write_record([
        "JobID",
        "JobName",
        "User",
        "Account",
        "Partition",
        "QOS",
        "State",
        "ExitCode",
        "Submit",
        "Start",
        "End",
        "ElapsedRaw",
        "TimelimitRaw",
        "AllocCPUS",
        "NNodes",
        "ReqMem",
        "NodeList",
        "TotalCPURaw",
        "MaxRSS",
        "ChargedSU",
    ])?;
    for r in records {
        let j = &r.job;
        let exit = j.exit.unwrap_or_default();
        let alloc = j.allocation_record();
        w.write_record([
            j.id.0.to_string(),
            j.spec.name.to_string(),
            j.spec.user.to_string(),
            j.resolved.account.to_string(),
            j.resolved.partition.to_string(),
            j.resolved.qos.to_string(),
            j.state.name().to_owned(),
            format!("{}:{}", exit.code, exit.signal),
            rfc3339(Some(j.submit_time)),
            rfc3339(j.start_time),
            rfc3339(j.end_time),
            elapsed_s(j).unwrap_or(0).to_string(),
            j.resolved
                .time_limit
                .map_or_else(|| "UNLIMITED".into(), |t| (t.0 / 60).to_string()),
            alloc.map_or(0, |a| a.cpus()).to_string(),
            alloc.map_or(0, |a| a.shares.len()).to_string(),
            format!("{}M", alloc.map_or(0, |a| a.memory().0)),
            node_list(j),
            (exit.cpu_time_ms / 1000).to_string(),
            format!("{}M", exit.max_rss_mib),
            format!(
                "{}.{:03}",
                r.charged_milli_su / 1000,
                r.charged_milli_su % 1000
            ),
        ])?;
    }
    w.flush()
}

/// SWF's status field: 1 completed, 0 failed, 5 cancelled.
fn swf_status(state: JobState) -> i64 {
    match state {
        JobState::Completed => 1,
        JobState::Cancelled => 5,
        _ => 0,
    }
}

/// The Standard Workload Format.
pub fn swf(records: &[ArchivedJob], out: &mut dyn Write) -> io::Result<()> {
    let start_ms = records
        .iter()
        .map(|r| r.job.submit_time.0)
        .min()
        .unwrap_or(0);
    let mut users: BTreeMap<&str, usize> = BTreeMap::new();
    let mut accounts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut partitions: BTreeMap<&str, usize> = BTreeMap::new();
    let mut rows = Vec::with_capacity(records.len());
    for r in records {
        let j = &r.job;
        let user = j.spec.user.as_str();
        let n = users.len() + 1;
        let u = *users.entry(user).or_insert(n);
        let account = j.resolved.account.as_str();
        let n = accounts.len() + 1;
        let g = *accounts.entry(account).or_insert(n);
        let partition = j.resolved.partition.as_str();
        let n = partitions.len() + 1;
        let q = *partitions.entry(partition).or_insert(n);
        rows.push((r, u, g, q));
    }
    writeln!(out, "; Version: 2.2")?;
    writeln!(out, "; Computer: a Docket cluster")?;
    writeln!(out, "; UnixStartTime: {}", start_ms / 1000)?;
    writeln!(
        out,
        "; Note: exported by Docket before its retention (PurgeJobAfter) removed these jobs"
    )?;
    for (kind, map) in [
        ("User", &users),
        ("Group", &accounts),
        ("Queue", &partitions),
    ] {
        let mut by_number: Vec<(&usize, &&str)> = map.iter().map(|(k, v)| (v, k)).collect();
        by_number.sort();
        for (n, name) in by_number {
            writeln!(out, "; {kind} {n}: {name}")?;
        }
    }
    for (r, u, g, q) in rows {
        let j = &r.job;
        let exit = j.exit.unwrap_or_default();
        let procs = j.allocation_record().map_or(0, |a| a.cpus());
        let submit = (j.submit_time.0.saturating_sub(start_ms)) / 1000;
        let wait = j.start_time.map_or(-1, |s| s.since(j.submit_time).0 as i64);
        let run = elapsed_s(j).map_or(-1, |e| e as i64);
        let per_proc = |total: u64| total.checked_div(procs).map_or(-1, |v| v as i64);
        let avg_cpu = per_proc(exit.cpu_time_ms / 1000);
        let mem_kb = per_proc(exit.max_rss_mib.saturating_mul(1024));
        let req_time = j.resolved.time_limit.map_or(-1, |t| t.0 as i64);
        let procs = if procs == 0 { -1 } else { procs as i64 };
        writeln!(
            out,
            "{} {submit} {wait} {run} {procs} {avg_cpu} {mem_kb} {} {req_time} -1 {} {u} {g} -1 {q} -1 -1 -1",
            j.id.0,
            j.cpus(),
            swf_status(j.state),
        )?;
    }
    Ok(())
}
