//! `sacct`: accounting of jobs in the queue and archived. Default columns
//! `JobID JobName Partition Account AllocCPUS State ExitCode` (exit codes as `code:signal`);
//! `-o` picks fields (`Name%width`), `-S`/`-E` bound the window (default: since midnight,
//! unless jobs are named), `-s` filters states, `-p`/`-P` print `|`-separated.
//!
//! Each job is a line for its allocation followed, as in Slurm, by one for its batch script
//! (`JOBID.batch`) and one per step `srun` ran in it (`JOBID.0`, ...) with the step's own
//! state, exit code, elapsed and cpu time and peak memory; `-X` keeps only allocations.

use anyhow::{Result, bail};
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::{Client, runtime};
use crate::slurmtime;
use docket_proto::unix_ms;

/// Accounting: jobs in the queue and archived.
#[derive(Debug, Clone, Parser)]
#[command(name = "sacct", version)]
pub struct SacctArgs {
    /// Only these jobs.
    #[arg(short = 'j', long = "jobs", value_delimiter = ',')]
    pub jobs: Vec<u64>,
    /// Only these users (default: you; `-a` for everyone).
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    pub users: Vec<String>,
    #[arg(short = 'a', long = "allusers")]
    pub all: bool,
    /// Fields, comma-separated, each `Name[%width]` (see --helpformat).
    #[arg(short = 'o', long = "format")]
    pub format: Option<String>,
    /// List the fields -o accepts.
    #[arg(short = 'e', long = "helpformat")]
    pub helpformat: bool,
    /// Jobs that ran, were queued or ended at or after this time (default: midnight today,
    /// unless -j names jobs).
    #[arg(short = 'S', long = "starttime")]
    pub start: Option<String>,
    /// ... and at or before this time (default: now).
    #[arg(short = 'E', long = "endtime")]
    pub end: Option<String>,
    /// Only these states (CD, COMPLETED, F, TO, ...).
    #[arg(short = 's', long = "state", value_delimiter = ',')]
    pub states: Vec<String>,
    /// Allocations only: no `JOBID.batch` or `JOBID.STEP` lines.
    #[arg(short = 'X', long = "allocations")]
    pub allocations: bool,
    /// `|`-separated, no padding, with a trailing `|` (`--parsable2`: without).
    #[arg(short = 'p', long = "parsable")]
    pub parsable: bool,
    #[arg(short = 'P', long = "parsable2")]
    pub parsable2: bool,
    #[arg(short = 'n', long = "noheader")]
    pub noheader: bool,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub addr: Option<String>,
}

/// Fields sacct prints: name and default width.
const FIELDS: &[(&str, usize)] = &[
    ("JobID", 12),
    ("JobIDRaw", 12),
    ("JobName", 10),
    ("User", 9),
    ("Partition", 10),
    ("Account", 10),
    ("QOS", 10),
    ("AllocCPUS", 10),
    ("NNodes", 8),
    ("NodeList", 15),
    ("State", 10),
    ("ExitCode", 8),
    ("Reason", 15),
    ("Submit", 19),
    ("Start", 19),
    ("End", 19),
    ("Elapsed", 10),
    ("ElapsedRaw", 10),
    ("Timelimit", 10),
    ("CPUTime", 10),
    ("CPUTimeRAW", 10),
    ("TotalCPU", 10),
    ("MaxRSS", 10),
    ("Charged", 10),
    ("Restarts", 8),
    ("WorkDir", 20),
    ("ReqMem", 10),
    ("AllocTRES", 10),
    ("Comment", 15),
];

const DEFAULT: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";

/// A chosen column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub width: usize,
}

/// Parses `-o`: `Name[%width]`, comma-separated, names case-insensitive.
pub fn columns(format: &str) -> Result<Vec<Column>> {
    format
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|item| {
            let (name, width) = match item.split_once('%') {
                Some((n, w)) => (n, Some(w)),
                None => (item, None),
            };
            let Some(&(name, default)) = FIELDS
                .iter()
                .find(|f| f.0.eq_ignore_ascii_case(name.trim()))
            else {
                bail!("-o: {name:?} is not a field sacct prints here (sacct -e lists them)");
            };
            let width = match width {
                None => default,
                Some(w) => match w.parse::<usize>() {
                    Ok(w) if w <= 1024 => w,
                    _ => bail!("-o {item:?}: width {w:?} is not a number up to 1024"),
                },
            };
            Ok(Column { name, width })
        })
        .collect()
}

/// What one line of sacct describes: a job's allocation, its batch script, or a step.
#[derive(Debug, Clone, Copy)]
pub enum Part<'a> {
    Allocation,
    Batch(&'a pb::BatchStep),
    Step(&'a pb::StepInfo),
}

/// One line of sacct.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub record: &'a pb::AccountingRecord,
    pub job: &'a pb::JobInfo,
    pub part: Part<'a>,
}

/// The lines for `records`, as Slurm orders them: each job's allocation, then (unless
/// `allocations_only`, `-X`) its `batch` step and its numbered steps.
pub fn rows(records: &[pb::AccountingRecord], allocations_only: bool) -> Vec<Row<'_>> {
    let mut out = Vec::new();
    for record in records {
        let Some(job) = record.job.as_ref() else {
            continue;
        };
        out.push(Row {
            record,
            job,
            part: Part::Allocation,
        });
        if allocations_only {
            continue;
        }
        if let Some(batch) = &record.batch {
            out.push(Row {
                record,
                job,
                part: Part::Batch(batch),
            });
        }
        for step in &job.steps {
            out.push(Row {
                record,
                job,
                part: Part::Step(step),
            });
        }
    }
    out
}

/// Slurm's state of a batch step: the job's, except that a script stopped by its time limit
/// or by preemption was cancelled (the job's row carries why).
fn batch_state(job_state: &str) -> String {
    match job_state {
        "TIMEOUT" | "PREEMPTED" | "DEADLINE" => "CANCELLED".into(),
        "COMPLETING" => "RUNNING".into(),
        s => s.to_owned(),
    }
}

fn code_signal(code: Option<i32>, signal: Option<i32>) -> String {
    format!("{}:{}", code.unwrap_or(0), signal.unwrap_or(0))
}

/// Seconds between two instants in ms (`end` absent: still running at `now`).
fn seconds_between(start: u64, end: Option<u64>, now: u64) -> u64 {
    end.unwrap_or(now).saturating_sub(start) / 1000
}

impl<'a> Row<'a> {
    /// What the line's JobID adds to the job's: `.batch`, `.STEP`, or nothing.
    fn id_suffix(&self) -> String {
        match self.part {
            Part::Allocation => String::new(),
            Part::Batch(_) => ".batch".into(),
            Part::Step(s) => format!(".{}", s.step_id),
        }
    }

    /// The step the line describes, if it is a numbered step's.
    fn step(&self) -> Option<&'a pb::StepInfo> {
        match self.part {
            Part::Step(s) => Some(s),
            _ => None,
        }
    }

    /// `v` on the allocation's line; blank on the others.
    fn only_allocation(&self, v: String) -> String {
        if matches!(self.part, Part::Allocation) {
            v
        } else {
            String::new()
        }
    }

    /// The line's cpus and its elapsed seconds at `now`.
    fn cpus_and_elapsed(&self, now: u64) -> (u64, u64) {
        let r = self.record;
        match self.part {
            Part::Allocation => (r.alloc_cpus, r.elapsed_seconds),
            Part::Batch(b) => (b.cpus, r.elapsed_seconds),
            Part::Step(s) => (
                u64::from(s.cpus),
                seconds_between(s.start_time_ms, s.end_time_ms, now),
            ),
        }
    }
}

/// One field of one line at `now` (ms since the epoch). Steps leave blank what Slurm leaves
/// blank for them (user, partition, QOS, reason, time limit, charge, restarts).
pub fn value(row: &Row<'_>, field: &str, now: u64) -> String {
    identity_value(row, field)
        .or_else(|| usage_value(row, field, now))
        .unwrap_or_default()
}

/// The fields that say what a line is: ids, names, owner, state and exit, limits.
fn identity_value(row: &Row<'_>, field: &str) -> Option<String> {
    let j = row.job;
    let suffix = row.id_suffix();
    Some(match field {
        "JobID" => match j.array_task {
            Some(t) => format!("{}_{t}{suffix}", j.job_id),
            None => format!("{}{suffix}", j.job_id),
        },
        "JobIDRaw" => format!("{}{suffix}", j.job_id),
        "JobName" => match row.part {
            Part::Allocation => j.name.clone(),
            Part::Batch(_) => "batch".into(),
            Part::Step(s) => s.name.clone(),
        },
        "User" => row.only_allocation(j.user.clone()),
        "Partition" => row.only_allocation(j.partition.clone()),
        "Account" => j.account.clone(),
        "QOS" => row.only_allocation(j.qos.clone()),
        "State" => match row.part {
            Part::Allocation => j.state.clone(),
            Part::Batch(_) => batch_state(&j.state),
            Part::Step(s) => s.state.clone(),
        },
        "ExitCode" => match row.step() {
            Some(s) => code_signal(s.exit_code, s.exit_signal),
            None => code_signal(j.exit_code, j.exit_signal),
        },
        "Reason" => row.only_allocation(j.reason.clone()),
        "Timelimit" => row.only_allocation(slurmtime::limit(j.time_limit_seconds)),
        "Restarts" => row.only_allocation(j.requeue_count.to_string()),
        "WorkDir" => row.only_allocation(j.work_dir.clone()),
        "Comment" => row.only_allocation(j.comment.clone()),
        _ => return None,
    })
}

/// The fields that say what a line used: nodes and cpus, times, memory, charge.
fn usage_value(row: &Row<'_>, field: &str, now: u64) -> Option<String> {
    let (r, j) = (row.record, row.job);
    let step = row.step();
    let (cpus, elapsed) = row.cpus_and_elapsed(now);
    let cpu_seconds = elapsed.saturating_mul(cpus);
    Some(match field {
        "AllocCPUS" => cpus.to_string(),
        "NNodes" => match row.part {
            Part::Allocation => j.nodes.to_string(),
            Part::Batch(_) => "1".into(),
            Part::Step(s) => s.nodes.to_string(),
        },
        "NodeList" => match row.part {
            Part::Allocation if j.node_list.is_empty() => "None assigned".into(),
            Part::Allocation => j.node_list.clone(),
            Part::Batch(b) => b.node.clone(),
            Part::Step(s) => s.node_list.clone(),
        },
        "Submit" => slurmtime::timestamp(Some(step.map_or(j.submit_time_ms, |s| s.start_time_ms))),
        "Start" => slurmtime::timestamp(step.map_or(j.start_time_ms, |s| Some(s.start_time_ms))),
        "End" => slurmtime::timestamp(step.map_or(j.end_time_ms, |s| s.end_time_ms)),
        "Elapsed" => slurmtime::duration(elapsed),
        "ElapsedRaw" => elapsed.to_string(),
        "CPUTime" => slurmtime::duration(cpu_seconds),
        "CPUTimeRAW" => cpu_seconds.to_string(),
        "TotalCPU" => slurmtime::cpu_time(match row.part {
            Part::Allocation => r.total_cpu_ms,
            Part::Batch(b) => b.total_cpu_ms,
            Part::Step(s) => s.cpu_time_ms,
        }),
        "MaxRSS" => {
            let mib = match row.part {
                Part::Allocation => r.max_rss_mib,
                Part::Batch(b) => b.max_rss_mib,
                Part::Step(s) => s.max_rss_mib,
            };
            format!("{}K", mib.saturating_mul(1024))
        }
        "Charged" => row.only_allocation(format!("{:.3}", r.charged_milli_su as f64 / 1000.0)),
        "ReqMem" => row.only_allocation(memory(r.req_mem_mib)),
        // The allocation's row names what it holds; a step's, its own cpus.
        "AllocTRES" => match row.part {
            Part::Allocation => alloc_tres(r),
            _ if cpus == 0 => String::new(),
            _ => format!("cpu={cpus}"),
        },
        _ => return None,
    })
}

/// A MiB amount as Slurm prints memory: whole units of the largest size that divides it.
fn memory(mib: u64) -> String {
    match mib {
        0 => "0".into(),
        m if m % (1024 * 1024) == 0 => format!("{}T", m / (1024 * 1024)),
        m if m % 1024 == 0 => format!("{}G", m / 1024),
        m => format!("{m}M"),
    }
}

/// The allocation's TRES as sacct's AllocTRES lists them, in Slurm's order (billing as its
/// partition's TRESBillingWeights weighed it); empty until it has nodes.
fn alloc_tres(r: &pb::AccountingRecord) -> String {
    if r.alloc_nodes == 0 {
        return String::new();
    }
    let mut parts = vec![
        format!("billing={}", r.alloc_billing),
        format!("cpu={}", r.alloc_cpus),
    ];
    if r.alloc_gpus > 0 {
        parts.push(format!("gres/gpu={}", r.alloc_gpus));
    }
    parts.push(format!("mem={}", memory(r.alloc_mem_mib)));
    parts.push(format!("node={}", r.alloc_nodes));
    parts.join(",")
}

/// The table as sacct prints it: padded columns under a dashed rule, or `|`-separated.
pub fn table(
    rows: &[Row<'_>],
    columns: &[Column],
    header: bool,
    parsable: Option<&str>,
    now: u64,
) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| columns.iter().map(|c| value(row, c.name, now)).collect())
        .collect();
    let mut out = String::new();
    if let Some(end) = parsable {
        if header {
            let names: Vec<&str> = columns.iter().map(|c| c.name).collect();
            out.push_str(&format!("{}{end}\n", names.join("|")));
        }
        for r in rows {
            out.push_str(&format!("{}{end}\n", r.join("|")));
        }
        return out;
    }
    let line = |cells: &[String]| -> String {
        cells
            .iter()
            .zip(columns)
            .map(|(c, col)| {
                let w = col.width;
                // Slurm marks a cut value with a trailing `+`.
                let cut = if c.chars().count() > w && w > 0 {
                    format!("{}+", c.chars().take(w - 1).collect::<String>())
                } else {
                    c.clone()
                };
                format!("{cut:>w$}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    if header {
        let names: Vec<String> = columns.iter().map(|c| c.name.to_owned()).collect();
        out.push_str(&line(&names));
        out.push('\n');
        let rule: Vec<String> = columns.iter().map(|c| "-".repeat(c.width)).collect();
        out.push_str(&rule.join(" "));
        out.push('\n');
    }
    for r in rows {
        out.push_str(&line(&r));
        out.push('\n');
    }
    out
}

pub fn sacct(a: SacctArgs) -> Result<()> {
    if a.helpformat {
        let names: Vec<&str> = FIELDS.iter().map(|f| f.0).collect();
        for chunk in names.chunks(6) {
            println!("{}", chunk.join(" "));
        }
        return Ok(());
    }
    let columns = columns(a.format.as_deref().unwrap_or(DEFAULT))?;
    let now = unix_ms();
    let start = match (&a.start, a.jobs.is_empty()) {
        (Some(s), _) => {
            Some(slurmtime::parse_instant(s, now).map_err(|e| anyhow::anyhow!("-S: {e}"))?)
        }
        (None, true) => Some(slurmtime::parse_instant("midnight", now)?),
        (None, false) => None,
    };
    let end = match &a.end {
        Some(s) => Some(slurmtime::parse_instant(s, now).map_err(|e| anyhow::anyhow!("-E: {e}"))?),
        None => None,
    };
    let client = Client::new(a.addr.as_deref())?;
    let users = if a.all {
        Vec::new()
    } else if a.users.is_empty() && a.jobs.is_empty() {
        vec![client.user()?.to_owned()]
    } else {
        a.users.clone()
    };
    let rt = runtime()?;
    let records = rt.block_on(crate::listing::all_records(
        &client,
        pb::AccountingRequest {
            users,
            states: a.states.clone(),
            job_ids: a.jobs.clone(),
            start_unix_ms: start.map(|s| s as i64),
            end_unix_ms: end.map(|e| e as i64),
            ..Default::default()
        },
    ))?;
    if a.json {
        let rows = records
            .iter()
            .filter_map(|r| r.job.as_ref().map(|j| crate::slurm_json::sacct_job(r, j)))
            .collect();
        println!("{}", crate::slurm_json::document("sacct", rows));
        return Ok(());
    }
    let parsable = if a.parsable {
        Some("|")
    } else if a.parsable2 {
        Some("")
    } else {
        None
    };
    let rows = rows(&records, a.allocations);
    print!("{}", table(&rows, &columns, !a.noheader, parsable, now));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> pb::AccountingRecord {
        pb::AccountingRecord {
            job: Some(pb::JobInfo {
                job_id: 9,
                name: "oom-test".into(),
                partition: "batch".into(),
                account: "physics".into(),
                state: "OUT_OF_MEMORY".into(),
                exit_code: Some(0),
                exit_signal: Some(9),
                ..Default::default()
            }),
            alloc_cpus: 4,
            elapsed_seconds: 90,
            charged_milli_su: 100,
            archived: true,
            total_cpu_ms: 61_500,
            max_rss_mib: 64,
            batch: None,
            req_mem_mib: 4096,
            alloc_mem_mib: 4096,
            alloc_gpus: 0,
            alloc_nodes: 1,
            alloc_billing: 4,
        }
    }

    #[test]
    fn requested_memory_and_allocated_tres_read_as_slurms() {
        let mut r = record();
        let cols = columns("JobID,ReqMem,AllocTRES").unwrap();
        let line = |r: &pb::AccountingRecord| {
            table(
                &rows(std::slice::from_ref(r), false),
                &cols,
                false,
                Some(""),
                0,
            )
        };
        assert_eq!(line(&r), "9|4G|billing=4,cpu=4,mem=4G,node=1\n");
        r.req_mem_mib = 1000;
        r.alloc_mem_mib = 2000;
        r.alloc_gpus = 2;
        r.alloc_nodes = 2;
        // Billing is what the controller weighed (here GRES/gpu=2.0 on top of the cpus).
        r.alloc_billing = 8;
        assert_eq!(
            line(&r),
            "9|1000M|billing=8,cpu=4,gres/gpu=2,mem=2000M,node=2\n"
        );
        // Not started: nothing allocated yet.
        r.alloc_nodes = 0;
        assert_eq!(line(&r), "9|1000M|\n");
    }

    #[test]
    fn the_default_columns_match_slurms() {
        let records = [record()];
        let text = table(
            &rows(&records, true),
            &columns(DEFAULT).unwrap(),
            true,
            None,
            0,
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "       JobID    JobName  Partition    Account  AllocCPUS      State ExitCode"
        );
        assert_eq!(
            lines[1],
            "------------ ---------- ---------- ---------- ---------- ---------- --------"
        );
        assert_eq!(
            lines[2],
            "           9   oom-test      batch    physics          4 OUT_OF_ME+      0:9"
        );
    }

    #[test]
    fn chosen_fields_and_parsable_output() {
        let cols = columns("jobid,Elapsed,CPUTime,state%3,Charged").unwrap();
        assert_eq!(cols[3].width, 3);
        let records = [record()];
        let text = table(&rows(&records, false), &cols, true, Some(""), 0);
        assert_eq!(
            text,
            "JobID|Elapsed|CPUTime|State|Charged\n9|1:30|6:00|OUT_OF_MEMORY|0.100\n"
        );
        let cols = columns("JobID,TotalCPU,MaxRSS").unwrap();
        assert_eq!(
            table(&rows(&records, false), &cols, false, Some("|"), 0),
            "9|01:01.500|65536K|\n"
        );
        let e = columns("JobID,Colour").unwrap_err().to_string();
        assert!(e.contains("\"Colour\" is not a field"), "{e}");
        assert!(columns("JobID%x").is_err());
    }

    /// A two-node job whose script failed after two steps: Slurm's lines and their order.
    fn job_with_steps() -> pb::AccountingRecord {
        let step =
            |id: u32, name: &str, state: &str, code: i32, cpus: u32, nodes: u32| pb::StepInfo {
                step_id: id,
                name: name.into(),
                state: state.into(),
                start_time_ms: 10_000,
                end_time_ms: Some(40_000),
                ntasks: cpus,
                node_list: if nodes == 2 { "n[01-02]" } else { "n01" }.into(),
                exit_code: Some(code),
                exit_signal: Some(0),
                cpu_time_ms: 2_500,
                max_rss_mib: 3,
                cpus,
                nodes,
                ..Default::default()
            };
        pb::AccountingRecord {
            job: Some(pb::JobInfo {
                job_id: 12,
                name: "job.sh".into(),
                user: "alice".into(),
                partition: "batch".into(),
                account: "physics".into(),
                state: "FAILED".into(),
                exit_code: Some(3),
                exit_signal: Some(0),
                nodes: 2,
                node_list: "n[01-02]".into(),
                start_time_ms: Some(0),
                end_time_ms: Some(60_000),
                steps: vec![
                    step(0, "hostname", "COMPLETED", 0, 4, 2),
                    step(1, "false", "FAILED", 1, 1, 1),
                ],
                ..Default::default()
            }),
            alloc_cpus: 4,
            elapsed_seconds: 60,
            total_cpu_ms: 9_000,
            max_rss_mib: 10,
            batch: Some(pb::BatchStep {
                cpus: 2,
                total_cpu_ms: 4_000,
                max_rss_mib: 10,
                node: "n01".into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn steps_follow_their_job_as_in_slurm() {
        let records = [job_with_steps()];
        let cols = columns(&format!("{DEFAULT},NodeList,Elapsed,TotalCPU,User")).unwrap();
        assert_eq!(
            table(&rows(&records, false), &cols, true, Some(""), 0),
            "JobID|JobName|Partition|Account|AllocCPUS|State|ExitCode|NodeList|Elapsed|TotalCPU|User\n\
             12|job.sh|batch|physics|4|FAILED|3:0|n[01-02]|1:00|00:09.000|alice\n\
             12.batch|batch||physics|2|FAILED|3:0|n01|1:00|00:04.000|\n\
             12.0|hostname||physics|4|COMPLETED|0:0|n[01-02]|0:30|00:02.500|\n\
             12.1|false||physics|1|FAILED|1:0|n01|0:30|00:02.500|\n"
        );
        // -X: the allocation only.
        assert_eq!(rows(&records, true).len(), 1);
        // A step still running counts its time up to now; a script stopped by its limit
        // was cancelled.
        let mut running = job_with_steps();
        let job = running.job.as_mut().unwrap();
        job.state = "TIMEOUT".into();
        job.steps[0].end_time_ms = None;
        job.steps[0].state = "RUNNING".into();
        let records = [running];
        let rows = rows(&records, false);
        assert_eq!(value(&rows[1], "State", 0), "CANCELLED");
        assert_eq!(value(&rows[2], "Elapsed", 100_000), "1:30");
        assert_eq!(value(&rows[2], "CPUTimeRAW", 100_000), "360");
    }
}
