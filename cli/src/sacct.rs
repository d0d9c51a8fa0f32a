//! `sacct`: accounting of jobs in the queue and archived. Default columns
//! `JobID JobName Partition Account AllocCPUS State ExitCode` (exit codes as `code:signal`);
//! `-o` picks fields (`Name%width`), `-S`/`-E` bound the window (default: since midnight,
//! unless jobs are named), `-s` filters states, `-p`/`-P` print `|`-separated.

use anyhow::{Result, bail};
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::{Client, now_ms, runtime};
use crate::slurmtime;

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
    /// Allocations only (Docket has no job steps; accepted for scripts that pass it).
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

/// One field of one record.
pub fn value(r: &pb::AccountingRecord, j: &pb::JobInfo, field: &str) -> String {
    let cpu_seconds = r.elapsed_seconds * r.alloc_cpus;
    match field {
        "JobID" => match j.array_task {
            Some(t) => format!("{}_{t}", j.job_id),
            None => j.job_id.to_string(),
        },
        "JobIDRaw" => j.job_id.to_string(),
        "JobName" => j.name.clone(),
        "User" => j.user.clone(),
        "Partition" => j.partition.clone(),
        "Account" => j.account.clone(),
        "QOS" => j.qos.clone(),
        "AllocCPUS" => r.alloc_cpus.to_string(),
        "NNodes" => j.nodes.to_string(),
        "NodeList" => {
            if j.node_list.is_empty() {
                "None assigned".into()
            } else {
                j.node_list.clone()
            }
        }
        "State" => j.state.clone(),
        "ExitCode" => crate::scontrol::exit_code(j),
        "Reason" => j.reason.clone(),
        "Submit" => slurmtime::timestamp(Some(j.submit_time_ms)),
        "Start" => slurmtime::timestamp(j.start_time_ms),
        "End" => slurmtime::timestamp(j.end_time_ms),
        "Elapsed" => slurmtime::duration(r.elapsed_seconds),
        "ElapsedRaw" => r.elapsed_seconds.to_string(),
        "Timelimit" => slurmtime::limit(j.time_limit_seconds),
        "CPUTime" => slurmtime::duration(cpu_seconds),
        "CPUTimeRAW" => cpu_seconds.to_string(),
        "TotalCPU" => slurmtime::cpu_time(r.total_cpu_ms),
        "MaxRSS" => format!("{}K", r.max_rss_mib * 1024),
        "Charged" => format!("{:.3}", r.charged_milli_su as f64 / 1000.0),
        "Restarts" => j.requeue_count.to_string(),
        "WorkDir" => j.work_dir.clone(),
        _ => String::new(),
    }
}

/// The table as sacct prints it: padded columns under a dashed rule, or `|`-separated.
pub fn table(
    records: &[pb::AccountingRecord],
    columns: &[Column],
    header: bool,
    parsable: Option<&str>,
) -> String {
    let rows: Vec<Vec<String>> = records
        .iter()
        .filter_map(|r| r.job.as_ref().map(|j| (r, j)))
        .map(|(r, j)| columns.iter().map(|c| value(r, j, c.name)).collect())
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
    let now = now_ms();
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
        vec![client.user().to_owned()]
    } else {
        a.users.clone()
    };
    let rt = runtime()?;
    let mut records = Vec::new();
    let mut token = String::new();
    loop {
        let page = rt.block_on(client.jobs_read(|mut c| {
            let req = client.request(pb::AccountingRequest {
                users: users.clone(),
                states: a.states.clone(),
                job_ids: a.jobs.clone(),
                start_unix_ms: start.map(|s| s as i64),
                end_unix_ms: end.map(|e| e as i64),
                page_size: 10_000,
                page_token: token.clone(),
            });
            async move { c.accounting(req).await }
        }))?;
        records.extend(page.records);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    if a.json {
        let rows: Vec<_> = records
            .iter()
            .filter_map(|r| r.job.as_ref().map(|j| (j, r)))
            .map(|(j, r)| {
                serde_json::json!({"job_id": j.job_id, "array_task": j.array_task,
                "name": j.name, "user": j.user, "partition": j.partition, "account": j.account,
                "alloc_cpus": r.alloc_cpus, "state": j.state, "exit_code": j.exit_code,
                "exit_signal": j.exit_signal, "elapsed_seconds": r.elapsed_seconds,
                "charged_su": r.charged_milli_su as f64 / 1000.0, "archived": r.archived,
                "submit_time_ms": j.submit_time_ms, "start_time_ms": j.start_time_ms,
                "end_time_ms": j.end_time_ms})
            })
            .collect();
        println!("{}", serde_json::json!({ "jobs": rows }));
        return Ok(());
    }
    let parsable = if a.parsable {
        Some("|")
    } else if a.parsable2 {
        Some("")
    } else {
        None
    };
    print!("{}", table(&records, &columns, !a.noheader, parsable));
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
        }
    }

    #[test]
    fn the_default_columns_match_slurms() {
        let text = table(&[record()], &columns(DEFAULT).unwrap(), true, None);
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
        let text = table(&[record()], &cols, true, Some(""));
        assert_eq!(
            text,
            "JobID|Elapsed|CPUTime|State|Charged\n9|1:30|6:00|OUT_OF_MEMORY|0.100\n"
        );
        let cols = columns("JobID,TotalCPU,MaxRSS").unwrap();
        assert_eq!(
            table(&[record()], &cols, false, Some("|")),
            "9|01:01.500|65536K|\n"
        );
        let e = columns("JobID,Colour").unwrap_err().to_string();
        assert!(e.contains("\"Colour\" is not a field"), "{e}");
        assert!(columns("JobID%x").is_err());
    }
}
