//! `sinfo`, `sacct`, `scontrol` (ping, show job, hold, release, requeue, update), and
//! `docket install-aliases`.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::{Client, now_ms, runtime};
use crate::scancel::job_ref;
use crate::slurmtime;

/// The names `docket` answers to so far (sshare and pbsnodes come with the rest of the CLI).
pub const ALIASES: [&str; 12] = [
    "sbatch", "squeue", "scancel", "sinfo", "scontrol", "sacct", "sprio", "qsub", "qstat", "qdel",
    "qhold", "qrls",
];

/// `docket install-aliases DIR`: symlinks DIR/sbatch, ... to this binary.
pub fn install_aliases(dir: &PathBuf) -> Result<()> {
    let me = std::env::current_exe().context("locating this binary")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for name in ALIASES {
        let link = dir.join(name);
        match std::fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(&link)?,
            Ok(_) => bail!(
                "{} exists and is not a symlink; not replacing it",
                link.display()
            ),
            Err(_) => {}
        }
        std::os::unix::fs::symlink(&me, &link)
            .with_context(|| format!("linking {}", link.display()))?;
        println!("{} -> {}", link.display(), me.display());
    }
    Ok(())
}

/// Show nodes and partitions.
#[derive(Debug, Clone, Parser)]
#[command(name = "sinfo", version, disable_help_flag = true)]
pub struct SinfoArgs {
    /// Print help (`-h` is --noheader, as in Slurm).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// One line per node.
    #[arg(short = 'N', long = "Node")]
    pub nodes: bool,
    /// No header.
    #[arg(short = 'h', long = "noheader")]
    pub noheader: bool,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub addr: Option<String>,
}

/// Slurm's short node state words.
fn state_word(s: &str) -> &str {
    match s {
        "draining" => "drng",
        other => other,
    }
}

pub fn sinfo(a: SinfoArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let nodes = runtime()?
        .block_on(client.admin_call(|mut c| {
            let req = client.request(pb::ListNodesRequest {});
            async move { c.list_nodes(req).await }
        }))?
        .nodes;
    if a.json {
        let rows: Vec<_> = nodes
            .iter()
            .map(|n| {
                serde_json::json!({"name": n.name, "state": n.state, "cpus": n.cpus,
                "cpus_used": n.cpus_used, "memory_mib": n.memory_mib, "partitions": n.partitions,
                "reason": n.reason})
            })
            .collect();
        println!("{}", serde_json::json!({ "nodes": rows }));
        return Ok(());
    }
    if a.nodes {
        if !a.noheader {
            println!(
                "{:<10} {:>5} {:<9} {:>5}",
                "NODELIST", "NODES", "PARTITION", "STATE"
            );
        }
        for n in &nodes {
            for p in &n.partitions {
                println!(
                    "{:<10} {:>5} {:<9} {:>5}",
                    n.name,
                    1,
                    p,
                    state_word(&n.state)
                );
            }
        }
        return Ok(());
    }
    // One line per (partition, state), nodes folded into a hostlist.
    let mut groups: std::collections::BTreeMap<(String, String), Vec<String>> = Default::default();
    for n in &nodes {
        for p in &n.partitions {
            groups
                .entry((p.clone(), state_word(&n.state).to_owned()))
                .or_default()
                .push(n.name.clone());
        }
    }
    if !a.noheader {
        println!(
            "{:<9} {:>5} {:>10} {:>6} {:>6} NODELIST",
            "PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE"
        );
    }
    for ((p, state), names) in groups {
        println!(
            "{:<9} {:>5} {:>10} {:>6} {:>6} {}",
            p,
            "up",
            "n/a",
            names.len(),
            state,
            docket_core::hostlist::compress(&names)
        );
    }
    Ok(())
}

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

pub fn sacct(a: SacctArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let users = if a.all {
        Vec::new()
    } else if a.users.is_empty() && a.jobs.is_empty() {
        vec![client.user().to_owned()]
    } else {
        a.users.clone()
    };
    let records = runtime()?
        .block_on(client.jobs_call(|mut c| {
            let req = client.request(pb::AccountingRequest {
                users: users.clone(),
                job_ids: a.jobs.clone(),
                page_size: 10_000,
                ..Default::default()
            });
            async move { c.accounting(req).await }
        }))?
        .records;
    if a.json {
        let rows: Vec<_> = records
            .iter()
            .filter_map(|r| r.job.as_ref().map(|j| (j, r)))
            .map(|(j, r)| serde_json::json!({"job_id": j.job_id, "name": j.name,
                "partition": j.partition, "account": j.account, "alloc_cpus": r.alloc_cpus,
                "state": j.state, "exit_code": j.exit_code, "exit_signal": j.exit_signal,
                "elapsed_seconds": r.elapsed_seconds, "charged_su": r.charged_milli_su as f64 / 1000.0,
                "archived": r.archived}))
            .collect();
        println!("{}", serde_json::json!({ "jobs": rows }));
        return Ok(());
    }
    let header = [
        "JobID",
        "JobName",
        "Partition",
        "Account",
        "AllocCPUS",
        "State",
        "ExitCode",
    ];
    let rows: Vec<[String; 7]> = records
        .iter()
        .filter_map(|r| r.job.as_ref().map(|j| (j, r)))
        .map(|(j, r)| {
            let id = match j.array_task {
                Some(t) => format!("{}_{t}", j.job_id),
                None => j.job_id.to_string(),
            };
            [
                id,
                j.name.clone(),
                j.partition.clone(),
                j.account.clone(),
                r.alloc_cpus.to_string(),
                j.state.clone(),
                format!(
                    "{}:{}",
                    j.exit_code.unwrap_or(0),
                    j.exit_signal.unwrap_or(0)
                ),
            ]
        })
        .collect();
    if a.parsable || a.parsable2 {
        let end = if a.parsable { "|" } else { "" };
        if !a.noheader {
            println!("{}{end}", header.join("|"));
        }
        for r in rows {
            println!("{}{end}", r.join("|"));
        }
        return Ok(());
    }
    let widths = [12, 10, 10, 10, 10, 10, 8];
    let line = |cells: &[String]| -> String {
        cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{:>w$}", c.chars().take(w).collect::<String>()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if !a.noheader {
        println!("{}", line(&header.map(String::from)));
        println!("{}", widths.map(|w| "-".repeat(w)).join(" "));
    }
    for r in rows {
        println!("{}", line(&r));
    }
    Ok(())
}

/// Slurm's scontrol, for what exists so far.
#[derive(Debug, Clone, Parser)]
#[command(name = "scontrol", version)]
pub struct ScontrolArgs {
    #[arg(long)]
    pub addr: Option<String>,
    /// ping | show job ID | hold ID... | release ID... | requeue ID... | update job=ID
    /// TimeLimit=... Name=... Nice=...
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub words: Vec<String>,
}

pub fn scontrol(a: ScontrolArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let rt = runtime()?;
    let words: Vec<&str> = a.words.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["ping"] => {
            let status = rt.block_on(client.admin_call(|mut c| {
                let req = client.request(pb::ClusterStatusRequest {});
                async move { c.cluster_status(req).await }
            }))?;
            for r in &status.replicas {
                let role = if Some(r.id) == status.leader_id {
                    "primary"
                } else {
                    "backup"
                };
                let up = if r.reachable { "UP" } else { "DOWN" };
                println!("Slurmctld({role}) at {} is {up}", r.addr);
            }
            Ok(())
        }
        ["show", "job", id] | ["show", "jobs", id] => {
            let id: u64 = id.parse().map_err(|_| anyhow!("{id:?} is not a job id"))?;
            let j = rt.block_on(client.jobs_call(|mut c| {
                let req = client.request(pb::GetJobRequest {
                    job_id: id,
                    consistency: 0,
                });
                async move { c.get_job(req).await }
            }))?;
            println!(
                "JobId={} JobName={}\n   UserId={} Account={} QOS={}\n   JobState={} Reason={} ExitCode={}:{}\n   RunTime={} TimeLimit={} Partition={}\n   NodeList={} NumNodes={} NumCPUs={}\n   WorkDir={}",
                j.job_id,
                j.name,
                j.user,
                j.account,
                j.qos,
                j.state,
                j.reason,
                j.exit_code.unwrap_or(0),
                j.exit_signal.unwrap_or(0),
                slurmtime::duration(
                    j.start_time_ms
                        .map(|s| j.end_time_ms.unwrap_or_else(now_ms).saturating_sub(s) / 1000)
                        .unwrap_or(0)
                ),
                slurmtime::limit(j.time_limit_seconds),
                j.partition,
                if j.node_list.is_empty() {
                    "(null)"
                } else {
                    &j.node_list
                },
                j.nodes,
                j.cpus,
                j.work_dir
            );
            Ok(())
        }
        [
            verb @ ("hold" | "release" | "requeue" | "suspend" | "resume"),
            ids @ ..,
        ] if !ids.is_empty() => {
            let refs: Vec<pb::JobRef> = ids
                .iter()
                .flat_map(|s| s.split(','))
                .map(job_ref)
                .collect::<Result<_>>()?;
            let verb = *verb;
            let r = rt.block_on(client.jobs_call(|mut c| {
                let req = client.request(pb::JobsRequest { jobs: refs.clone() });
                async move {
                    match verb {
                        "hold" => c.hold_jobs(req).await,
                        "release" => c.release_jobs(req).await,
                        "requeue" => c.requeue_jobs(req).await,
                        "suspend" => c.suspend_jobs(req).await,
                        _ => c.resume_jobs(req).await,
                    }
                }
            }))?;
            per_job_errors(&r)
        }
        ["update", rest @ ..] => {
            let mut job = None;
            let mut update = pb::UpdateJobsRequest::default();
            for kv in rest {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| anyhow!("{kv:?} is not Key=Value"))?;
                match k.to_ascii_lowercase().as_str() {
                    "job" | "jobid" => job = Some(job_ref(v)?),
                    "timelimit" => {
                        update.time_limit_seconds = Some(
                            match docket_core::quantity::parse_duration(v)
                                .map_err(|e| anyhow!("TimeLimit: {e}"))?
                            {
                                docket_core::quantity::SlurmDuration::Unlimited => 0,
                                docket_core::quantity::SlurmDuration::Limit(s) => s.0 as i64,
                            },
                        );
                    }
                    "name" | "jobname" => update.name = Some(v.to_string()),
                    "nice" => {
                        update.nice = Some(
                            v.parse()
                                .map_err(|_| anyhow!("Nice: {v:?} is not a number"))?,
                        )
                    }
                    other => bail!(
                        "update: {other} is not a field this scontrol changes (TimeLimit, Name, Nice)"
                    ),
                }
            }
            update.jobs = vec![job.ok_or_else(|| anyhow!("update: name the job, job=ID"))?];
            let r = rt.block_on(client.jobs_call(|mut c| {
                let req = client.request(update.clone());
                async move { c.update_jobs(req).await }
            }))?;
            per_job_errors(&r)
        }
        other => bail!(
            "scontrol: {:?} is not a command this scontrol knows (ping, show job, hold, release, requeue, suspend, resume, update)",
            other.join(" ")
        ),
    }
}

fn per_job_errors(r: &pb::PerJobResponse) -> Result<()> {
    let bad: Vec<String> = r
        .results
        .iter()
        .filter(|x| !x.error.is_empty())
        .map(|x| {
            let id = x.job.as_ref().map(|j| j.job_id).unwrap_or(0);
            format!("job {id}: {}", x.error)
        })
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(bad.join("; ")))
    }
}

/// Why pending jobs have their priority.
#[derive(Debug, Clone, Parser)]
#[command(name = "sprio", version, disable_help_flag = true)]
pub struct SprioArgs {
    /// Print help (`-h` is --noheader, as in Slurm).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    #[arg(short = 'j', long = "jobs", value_delimiter = ',')]
    pub jobs: Vec<u64>,
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    pub users: Vec<String>,
    #[arg(short = 'h', long = "noheader")]
    pub noheader: bool,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub addr: Option<String>,
}

/// The table: JOBID PARTITION PRIORITY, then each factor's weighted contribution, as sprio
/// shows them (the formula in force decides which factors there are).
pub fn sprio_table(r: &pb::ExplainPriorityResponse, header: bool) -> String {
    let names: Vec<String> = r
        .jobs
        .first()
        .map(|j| j.factors.iter().map(|f| f.name.to_uppercase()).collect())
        .unwrap_or_default();
    let mut out = String::new();
    if header {
        out.push_str(&format!(
            "{:>15} {:<9} {:>10}",
            "JOBID", "PARTITION", "PRIORITY"
        ));
        for n in &names {
            out.push_str(&format!(" {:>10}", n.chars().take(10).collect::<String>()));
        }
        out.push('\n');
    }
    for j in &r.jobs {
        out.push_str(&format!(
            "{:>15} {:<9} {:>10.0}",
            j.job_id, j.partition, j.priority
        ));
        for f in &j.factors {
            out.push_str(&format!(" {:>10.0}", f.contribution));
        }
        out.push('\n');
    }
    out
}

pub fn sprio(a: SprioArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let r = runtime()?.block_on(client.jobs_call(|mut c| {
        let req = client.request(pb::ExplainPriorityRequest {
            job_ids: a.jobs.clone(),
            users: a.users.clone(),
        });
        async move { c.explain_priority(req).await }
    }))?;
    if a.json {
        let rows: Vec<_> = r
            .jobs
            .iter()
            .map(|j| serde_json::json!({"job_id": j.job_id, "user": j.user, "partition": j.partition,
                "priority": j.priority, "factors": j.factors.iter().map(|f| serde_json::json!({
                    "name": f.name, "value": f.value, "weight": f.weight, "contribution": f.contribution}))
                    .collect::<Vec<_>>()}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"formula": r.formula, "jobs": rows})
        );
        return Ok(());
    }
    print!("{}", sprio_table(&r, !a.noheader));
    Ok(())
}
