//! `scontrol`: Slurm's control command. Shows jobs, nodes, partitions, reservations and the
//! configuration as `Key=Value` lines (`-o`: one line each, `--json`: objects); holds,
//! releases, requeues, suspends, resumes and updates jobs; drains and resumes nodes;
//! creates, updates and deletes reservations; and answers `ping` in Slurm's words.

use anyhow::{Result, anyhow};
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::{Client, Failure, exit, rpc, runtime};
use crate::scancel::job_ref;
use crate::slurmtime;
use docket_proto::unix_ms;

/// Slurm's scontrol.
#[derive(Debug, Clone, Parser)]
#[command(name = "scontrol", version)]
pub struct ScontrolArgs {
    /// `show`: one line per record.
    #[arg(short = 'o', long)]
    pub oneliner: bool,
    /// `show`: JSON (an array of objects under the record kind).
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub addr: Option<String>,
    // The text is `--help`'s, where brackets mean optional, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// ping | show job|node|partition|reservation [NAME] | show config | hold|release|
    /// requeue|suspend|resume ID... | update JobId=ID TimeLimit=.. Name=.. Nice=.. |
    /// update NodeName=N State=DRAIN|RESUME Reason=.. | create|update reservation
    /// ReservationName=R Nodes=.. StartTime=.. EndTime=..|Duration=.. Users=.. Accounts=.. |
    /// delete ReservationName=R
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub words: Vec<String>,
}

/// One record: `Key=Value` pairs in lines (the first line unindented).
pub type Record = Vec<Vec<(&'static str, String)>>;

/// Records as scontrol prints them: multi-line with three-space indents, a blank line
/// between records; `oneliner`: one line each.
pub fn render(records: &[Record], oneliner: bool) -> String {
    let mut out = String::new();
    for r in records {
        let lines: Vec<String> = r
            .iter()
            .filter(|l| !l.is_empty())
            .map(|l| {
                l.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        if oneliner {
            out.push_str(&lines.join(" "));
            out.push('\n');
        } else {
            for (i, l) in lines.iter().enumerate() {
                if i > 0 {
                    out.push_str("   ");
                }
                out.push_str(l);
                out.push('\n');
            }
            out.push('\n');
        }
    }
    out
}

fn json(kind: &str, records: &[Record]) -> String {
    let rows: Vec<serde_json::Value> = records
        .iter()
        .map(|r| {
            serde_json::Value::Object(
                r.iter()
                    .flatten()
                    .map(|(k, v)| ((*k).to_owned(), serde_json::Value::String(v.clone())))
                    .collect(),
            )
        })
        .collect();
    serde_json::json!({ kind: rows }).to_string()
}

fn or_null(s: &str) -> String {
    if s.is_empty() {
        "(null)".into()
    } else {
        s.to_owned()
    }
}

fn list_or(items: &[String], none: &str) -> String {
    if items.is_empty() {
        none.into()
    } else {
        items.join(",")
    }
}

/// `show job`.
pub fn job_record(j: &pb::JobInfo, now_ms: u64) -> Record {
    let run_seconds = j
        .start_time_ms
        .map(|s| j.end_time_ms.unwrap_or(now_ms).saturating_sub(s) / 1000)
        .unwrap_or(0);
    let mut first = vec![("JobId", j.job_id.to_string())];
    if let Some(t) = j.array_task {
        first.push(("ArrayJobId", j.job_id.to_string()));
        first.push(("ArrayTaskId", t.to_string()));
    } else if !j.array.is_empty() {
        first.push(("ArrayJobId", j.job_id.to_string()));
        first.push(("ArrayTaskId", j.array.clone()));
    }
    first.push(("JobName", j.name.clone()));
    vec![
        first,
        vec![
            ("UserId", j.user.clone()),
            ("Account", j.account.clone()),
            ("QOS", j.qos.clone()),
        ],
        vec![
            ("JobState", j.state.clone()),
            ("Reason", or_null(&j.reason)),
            ("Dependency", or_null(&j.dependency)),
        ],
        vec![
            ("Requeue", "1".into()),
            ("Restarts", j.requeue_count.to_string()),
            ("ExitCode", exit_code(j)),
        ],
        vec![
            ("RunTime", slurmtime::duration(run_seconds)),
            ("TimeLimit", slurmtime::limit(j.time_limit_seconds)),
        ],
        vec![
            ("SubmitTime", slurmtime::timestamp(Some(j.submit_time_ms))),
            ("StartTime", slurmtime::timestamp(j.start_time_ms)),
            ("EndTime", slurmtime::timestamp(j.end_time_ms)),
        ],
        vec![("Partition", j.partition.clone())],
        vec![("NodeList", or_null(&j.node_list))],
        vec![
            ("NumNodes", j.nodes.to_string()),
            ("NumCPUs", j.cpus.to_string()),
        ],
        vec![("WorkDir", j.work_dir.clone())],
        // Slurm prints the comment only when there is one.
        if j.comment.is_empty() {
            Vec::new()
        } else {
            vec![("Comment", j.comment.clone())]
        },
    ]
}

/// `code:signal`, as sacct and scontrol print exit codes.
pub fn exit_code(j: &pb::JobInfo) -> String {
    format!(
        "{}:{}",
        j.exit_code.unwrap_or(0),
        j.exit_signal.unwrap_or(0)
    )
}

/// Slurm's upper-case node state, with `*` when the agent does not respond.
pub fn node_state(n: &pb::NodeInfo) -> String {
    use pb::NodeState as S;
    let s = match n.state_typed() {
        S::Idle => "IDLE",
        S::Mix => "MIXED",
        S::Alloc => "ALLOCATED",
        S::Draining => "MIXED+DRAIN",
        S::Drain => "IDLE+DRAIN",
        S::Down => "DOWN",
        S::Unspecified => n.state.as_str(),
    };
    let star = if n.responding == Some(false) { "*" } else { "" };
    format!("{s}{star}")
}

/// `show node`.
pub fn node_record(n: &pb::NodeInfo) -> Record {
    let mut r = vec![
        vec![("NodeName", n.name.clone())],
        vec![
            ("CPUAlloc", n.cpus_used.to_string()),
            ("CPUTot", n.cpus.to_string()),
        ],
        vec![("AvailableFeatures", list_or(&n.features, "(null)"))],
        vec![(
            "Gres",
            if n.gpus > 0 {
                format!("gpu:{}", n.gpus)
            } else {
                "(null)".into()
            },
        )],
        vec![
            ("RealMemory", n.memory_mib.to_string()),
            ("AllocMem", n.memory_used_mib.to_string()),
        ],
        vec![("State", node_state(n))],
        vec![("Partitions", list_or(&n.partitions, "(null)"))],
    ];
    if n.gpus > 0 {
        r[3].push(("GresUsed", format!("gpu:{}", n.gpus_used)));
    }
    if !n.reason.is_empty() {
        r.push(vec![("Reason", n.reason.clone())]);
    }
    r
}

fn limit_or(seconds: u64, none: &str) -> String {
    if seconds == 0 {
        none.into()
    } else {
        slurmtime::duration(seconds)
    }
}

/// `show partition`.
pub fn partition_record(p: &pb::PartitionInfo) -> Record {
    let yes_no = |b: bool| if b { "YES" } else { "NO" }.to_owned();
    vec![
        vec![("PartitionName", p.name.clone())],
        vec![
            ("AllowAccounts", list_or(&p.allow_accounts, "ALL")),
            ("AllowQos", list_or(&p.allow_qos, "ALL")),
        ],
        vec![
            ("Default", yes_no(p.is_default)),
            ("QoS", or_na(&p.default_qos)),
        ],
        vec![
            ("DefaultTime", limit_or(p.default_time_seconds, "NONE")),
            (
                "MaxNodes",
                if p.max_nodes == 0 {
                    "UNLIMITED".into()
                } else {
                    p.max_nodes.to_string()
                },
            ),
            ("MaxTime", limit_or(p.max_time_seconds, "UNLIMITED")),
        ],
        vec![("Nodes", or_null(&p.nodes))],
        vec![
            ("PriorityJobFactor", p.priority_job_factor.to_string()),
            ("PriorityTier", p.priority_tier.to_string()),
            ("PreemptMode", p.preempt_mode.to_uppercase()),
        ],
        vec![("State", if p.up { "UP" } else { "DOWN" }.into())],
        vec![
            ("TotalCPUs", p.total_cpus.to_string()),
            ("TotalNodes", p.total_nodes.to_string()),
        ],
        vec![
            (
                "DefMemPerCPU",
                if p.def_mem_per_cpu_mib == 0 {
                    "UNLIMITED".into()
                } else {
                    p.def_mem_per_cpu_mib.to_string()
                },
            ),
            ("ChargeRate", format!("{}", p.charge_rate)),
        ],
    ]
}

fn or_na(s: &str) -> String {
    if s.is_empty() {
        "N/A".into()
    } else {
        s.to_owned()
    }
}

/// `show reservation`.
pub fn reservation_record(r: &pb::Reservation, now_ms: u64) -> Record {
    let start = u64::try_from(r.start_unix_ms).unwrap_or(0);
    let end = u64::try_from(r.end_unix_ms).unwrap_or(0);
    let active = (start..end).contains(&now_ms);
    let nodes = docket_core::hostlist::expand(&r.nodes)
        .map(|n| n.len())
        .unwrap_or(0);
    vec![
        vec![
            ("ReservationName", r.name.clone()),
            ("StartTime", slurmtime::timestamp(Some(start))),
            ("EndTime", slurmtime::timestamp(Some(end))),
            (
                "Duration",
                slurmtime::duration(end.saturating_sub(start) / 1000),
            ),
        ],
        vec![("Nodes", r.nodes.clone()), ("NodeCnt", nodes.to_string())],
        vec![
            ("Users", list_or(&r.users, "(null)")),
            ("Accounts", list_or(&r.accounts, "(null)")),
        ],
        vec![("State", if active { "ACTIVE" } else { "INACTIVE" }.into())],
    ]
}

/// `show config`: the replicated scheduler configuration, flattened to `Key = Value`.
pub fn config_lines(c: &pb::GetConfigResponse, now_ms: u64) -> Result<String> {
    let value: serde_json::Value = serde_json::from_str(&c.sched_config_json)
        .map_err(|e| anyhow!("the controller's configuration is not JSON: {e}"))?;
    let mut pairs = Vec::new();
    flatten("", &value, &mut pairs);
    let mut out = format!(
        "Configuration data as of {}\n",
        slurmtime::timestamp(Some(now_ms))
    );
    let width = pairs
        .iter()
        .map(|(k, _)| k.len())
        .max()
        .unwrap_or(0)
        .max(20);
    for (k, v) in pairs {
        out.push_str(&format!("{k:<width$} = {v}\n"));
    }
    out.push_str(&format!(
        "{:<width$} = {}\n{:<width$} = {}\n{:<width$} = {}\n{:<width$} = {}\n{:<width$} = {}\n",
        "Nodes",
        c.nodes,
        "Partitions",
        c.partitions.join(","),
        "QOS",
        c.qos.join(","),
        "Accounts",
        c.accounts.join(","),
        "Users",
        c.users.len(),
    ));
    Ok(out)
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        serde_json::Value::Null => out.push((prefix.to_owned(), "(null)".into())),
        serde_json::Value::String(s) => out.push((prefix.to_owned(), s.clone())),
        other => out.push((prefix.to_owned(), other.to_string())),
    }
}

fn usage(what: impl Into<String>) -> anyhow::Error {
    Failure::error(exit::USAGE, what)
}

/// `Key=Value` words into (lower-case key, value) pairs.
fn pairs<'a>(words: &[&'a str]) -> Result<Vec<(String, &'a str)>> {
    words
        .iter()
        .map(|w| {
            w.split_once('=')
                .map(|(k, v)| (k.to_ascii_lowercase(), v))
                .ok_or_else(|| usage(format!("{w:?} is not Key=Value")))
        })
        .collect()
}

pub fn scontrol(a: ScontrolArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let rt = runtime()?;
    let s = Session {
        client: &client,
        rt: &rt,
        json: a.json,
        oneliner: a.oneliner,
    };
    let words: Vec<&str> = a.words.iter().map(String::as_str).collect();
    let lower: Vec<String> = words.iter().map(|w| w.to_ascii_lowercase()).collect();
    let lower: Vec<&str> = lower.iter().map(String::as_str).collect();
    match lower.as_slice() {
        ["ping"] => ping(&s),
        ["show", "job" | "jobs", rest @ ..] => show_jobs(&s, rest),
        ["show", "node" | "nodes", rest @ ..] => show_nodes(&s, rest),
        ["show", "partition" | "partitions", rest @ ..] => show_partitions(&s, rest),
        ["show", "reservation" | "reservations" | "res", rest @ ..] => show_reservations(&s, rest),
        ["show", "config"] => show_config(&s),
        [
            verb @ ("hold" | "release" | "uhold" | "requeue" | "suspend" | "resume"),
            _,
            ..,
        ] => act_on_jobs(&s, verb, &words[1..]),
        ["update", ..] => update(&s, &words[1..]),
        ["create", "reservation" | "res", ..] => {
            let kv = pairs(&words[2..])?;
            upsert_reservation(&client, &rt, &kv, true)
        }
        ["delete", ..] => delete_reservation(&s, &words[1..]),
        _ => Err(usage(format!(
            "{:?} is not a command this scontrol knows (ping, show job|node|partition|reservation|config, hold, release, requeue, suspend, resume, update, create reservation, delete)",
            words.join(" ")
        ))),
    }
}

/// What every subcommand needs: the controllers, the runtime, and how to print records.
struct Session<'a> {
    client: &'a Client,
    rt: &'a tokio::runtime::Runtime,
    json: bool,
    oneliner: bool,
}

impl Session<'_> {
    /// Prints `records` of `kind` as JSON or as `scontrol show` does.
    fn show(&self, kind: &str, records: Vec<Record>) {
        if self.json {
            println!("{}", json(kind, &records));
        } else {
            print!("{}", render(&records, self.oneliner));
        }
    }
}

/// `scontrol ping`: every replica, the leader as Slurm's primary.
fn ping(s: &Session) -> Result<()> {
    let status = s.rt.block_on(rpc!(
        s.client,
        admin_read,
        cluster_status,
        pb::ClusterStatusRequest::default()
    ))?;
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

/// `scontrol show job [ID,...]`.
fn show_jobs(s: &Session, rest: &[&str]) -> Result<()> {
    let ids: Vec<u64> = rest
        .iter()
        .flat_map(|s| s.split(','))
        .map(|s| {
            s.parse()
                .map_err(|_| usage(format!("{s:?} is not a job id")))
        })
        .collect::<Result<_>>()?;
    let jobs = s.rt.block_on(crate::listing::all_jobs(
        s.client,
        pb::ListJobsRequest {
            job_ids: ids.clone(),
            ..Default::default()
        },
    ))?;
    if jobs.is_empty() && !ids.is_empty() {
        return Err(anyhow!(
            "Invalid job id specified: no job {}",
            rest.join(",")
        ));
    }
    let now = unix_ms();
    s.show("jobs", jobs.iter().map(|j| job_record(j, now)).collect());
    Ok(())
}

/// `scontrol show node [NAMES]`.
fn show_nodes(s: &Session, rest: &[&str]) -> Result<()> {
    let nodes = s.rt.block_on(s.client.nodes())?;
    let wanted = names(rest)?;
    let records: Vec<Record> = nodes
        .iter()
        .filter(|n| wanted.is_empty() || wanted.contains(&n.name))
        .map(node_record)
        .collect();
    if records.is_empty() && !wanted.is_empty() {
        return Err(anyhow!("Node {} not found", rest.join(",")));
    }
    s.show("nodes", records);
    Ok(())
}

/// `scontrol show partition [NAME...]`.
fn show_partitions(s: &Session, rest: &[&str]) -> Result<()> {
    let parts = s.rt.block_on(s.client.partitions())?;
    let records: Vec<Record> = parts
        .iter()
        .filter(|p| rest.is_empty() || rest.contains(&p.name.as_str()))
        .map(partition_record)
        .collect();
    if records.is_empty() && !rest.is_empty() {
        return Err(anyhow!("Partition {} not found", rest.join(",")));
    }
    s.show("partitions", records);
    Ok(())
}

/// `scontrol show reservation [NAME...]`.
fn show_reservations(s: &Session, rest: &[&str]) -> Result<()> {
    let res =
        s.rt.block_on(rpc!(
            s.client,
            admin_read,
            list_reservations,
            pb::ListReservationsRequest {}
        ))?
        .reservations;
    let now = unix_ms();
    let records: Vec<Record> = res
        .iter()
        .filter(|r| rest.is_empty() || rest.contains(&r.name.as_str()))
        .map(|r| reservation_record(r, now))
        .collect();
    if records.is_empty() {
        if rest.is_empty() {
            println!("No reservations in the system");
            return Ok(());
        }
        return Err(anyhow!("Reservation {} not found", rest.join(",")));
    }
    s.show("reservations", records);
    Ok(())
}

/// `scontrol show config`.
fn show_config(s: &Session) -> Result<()> {
    let c = s.rt.block_on(rpc!(
        s.client,
        admin_read,
        get_config,
        pb::GetConfigRequest {}
    ))?;
    if s.json {
        println!("{}", c.sched_config_json);
    } else {
        print!("{}", config_lines(&c, unix_ms())?);
    }
    Ok(())
}

/// `scontrol hold|uhold|release|requeue|suspend|resume JOB...`.
fn act_on_jobs(s: &Session, verb: &str, jobs: &[&str]) -> Result<()> {
    let refs: Vec<pb::JobRef> = jobs
        .iter()
        .flat_map(|s| s.split(','))
        .map(job_ref)
        .collect::<Result<_>>()?;
    let r = s.rt.block_on(s.client.jobs_call(|mut c| {
        let req = s.client.request(pb::JobsRequest { jobs: refs.clone() });
        async move {
            match verb {
                "hold" | "uhold" => c.hold_jobs(req).await,
                "release" => c.release_jobs(req).await,
                "requeue" => c.requeue_jobs(req).await,
                "suspend" => c.suspend_jobs(req).await,
                _ => c.resume_jobs(req).await,
            }
        }
    }))?;
    per_job_errors(&r)
}

/// `scontrol update JobId=|NodeName=|ReservationName= ...`.
fn update(s: &Session, words: &[&str]) -> Result<()> {
    let kv = pairs(words)?;
    match kv.first().map(|(k, _)| k.as_str()) {
        Some("job" | "jobid") => update_job(s.client, s.rt, &kv),
        Some("nodename" | "node") => update_node(s.client, s.rt, &kv),
        Some("reservationname" | "reservation") => upsert_reservation(s.client, s.rt, &kv, false),
        _ => Err(usage(
            "update: start with JobId=ID, NodeName=NAME or ReservationName=NAME",
        )),
    }
}

/// `scontrol delete ReservationName=NAME`.
fn delete_reservation(s: &Session, words: &[&str]) -> Result<()> {
    let kv = pairs(words)?;
    let name = match kv.as_slice() {
        [(k, v)] if k == "reservationname" || k == "reservation" => v.to_string(),
        _ => return Err(usage("delete: ReservationName=NAME")),
    };
    let reply = s.rt.block_on(rpc!(
        s.client,
        admin_call,
        remove_object,
        crate::client::remove_request("reservation", &name)
    ))?;
    if !reply.message.is_empty() {
        println!("{}", reply.message);
    }
    Ok(())
}

/// Node names from words that may be hostlists (`n[01-04],gpu1`).
fn names(words: &[&str]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for w in words {
        out.extend(docket_core::hostlist::expand(w).map_err(|e| usage(format!("{w:?}: {e}")))?);
    }
    Ok(out)
}

fn update_job(client: &Client, rt: &tokio::runtime::Runtime, kv: &[(String, &str)]) -> Result<()> {
    let mut job = None;
    let mut update = pb::UpdateJobsRequest::default();
    for (k, v) in kv {
        match k.as_str() {
            "job" | "jobid" => job = Some(job_ref(v)?),
            "timelimit" => {
                update.time_limit_seconds = Some(
                    match docket_core::quantity::parse_duration(v)
                        .map_err(|e| usage(format!("TimeLimit: {e}")))?
                    {
                        docket_core::quantity::SlurmDuration::Unlimited => 0,
                        docket_core::quantity::SlurmDuration::Limit(s) => s.0 as i64,
                    },
                );
            }
            "name" | "jobname" => update.name = Some(v.to_string()),
            "comment" => update.comment = Some(v.to_string()),
            "nice" => {
                update.nice = Some(
                    v.parse()
                        .map_err(|_| usage(format!("Nice: {v:?} is not a number")))?,
                )
            }
            other => {
                return Err(usage(format!(
                    "update: {other} is not a job field this scontrol changes (TimeLimit, Name, Nice, Comment)"
                )));
            }
        }
    }
    update.jobs = vec![job.ok_or_else(|| usage("update: name the job, JobId=ID"))?];
    let r = rt.block_on(rpc!(client, jobs_call, update_jobs, update.clone()))?;
    per_job_errors(&r)
}

fn update_node(client: &Client, rt: &tokio::runtime::Runtime, kv: &[(String, &str)]) -> Result<()> {
    let mut nodes = Vec::new();
    let mut state = None;
    let mut reason = String::new();
    for (k, v) in kv {
        match k.as_str() {
            "nodename" | "node" => nodes = names(&[v])?,
            "state" => state = Some(v.to_ascii_lowercase()),
            "reason" => reason = v.to_string(),
            other => {
                return Err(usage(format!(
                    "update: {other} is not a node field this scontrol changes (State, Reason)"
                )));
            }
        }
    }
    let drain = match state.as_deref() {
        Some("drain") => true,
        Some("resume" | "undrain" | "idle") => false,
        Some(other) => {
            return Err(usage(format!(
                "State={other}: nodes are set to DRAIN (with Reason=) or RESUME; a node goes DOWN by itself when its agent is lost"
            )));
        }
        None => return Err(usage("update NodeName=..: say State=DRAIN or State=RESUME")),
    };
    if drain && reason.is_empty() {
        return Err(usage(
            "State=DRAIN needs Reason=\"why\" (Slurm asks for one too)",
        ));
    }
    for node in nodes {
        rt.block_on(client.admin_call(|mut c| {
            let node = node.clone();
            let reason = reason.clone();
            let req_drain = client.request(pb::DrainNodeRequest {
                node: node.clone(),
                reason,
            });
            let req_resume = client.request(pb::NodeRequest { node });
            async move {
                if drain {
                    c.drain_node(req_drain).await
                } else {
                    c.resume_node(req_resume).await
                }
            }
        }))?;
    }
    Ok(())
}

/// `create reservation` (`create`) or `update ReservationName=..`: stores the reservation
/// `kv` describes.
fn upsert_reservation(
    client: &Client,
    rt: &tokio::runtime::Runtime,
    kv: &[(String, &str)],
    create: bool,
) -> Result<()> {
    let now = unix_ms();
    let mut r = if create {
        pb::Reservation::default()
    } else {
        existing_reservation(client, rt, kv)?
    };
    let duration_ms = set_reservation_fields(&mut r, kv, now)?;
    if r.name.is_empty() {
        return Err(usage("name the reservation: ReservationName=NAME"));
    }
    if create && r.start_unix_ms == 0 {
        r.start_unix_ms = now as i64;
    }
    if let Some(d) = duration_ms {
        r.end_unix_ms = r.start_unix_ms + d;
    }
    if r.nodes.is_empty() {
        return Err(usage("Nodes=: a reservation needs nodes (a hostlist)"));
    }
    if r.end_unix_ms == 0 {
        return Err(usage("give EndTime= or Duration="));
    }
    rt.block_on(rpc!(client, admin_call, upsert_reservation, r.clone()))?;
    if create {
        println!("Reservation created: {}", r.name);
    }
    Ok(())
}

/// The reservation `kv`'s ReservationName= names, as the controller has it.
fn existing_reservation(
    client: &Client,
    rt: &tokio::runtime::Runtime,
    kv: &[(String, &str)],
) -> Result<pb::Reservation> {
    let name = kv
        .iter()
        .find(|(k, _)| k == "reservationname" || k == "reservation")
        .map(|(_, v)| v.to_string())
        .unwrap_or_default();
    let all = rt
        .block_on(rpc!(
            client,
            admin_read,
            list_reservations,
            pb::ListReservationsRequest {}
        ))?
        .reservations;
    all.into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| anyhow!("Reservation {name} not found"))
}

/// Sets the reservation fields `kv` gives in `r` (times relative to `now`); returns the
/// Duration= asked for, in ms, for the end to be set from the start.
fn set_reservation_fields(
    r: &mut pb::Reservation,
    kv: &[(String, &str)],
    now: u64,
) -> Result<Option<i64>> {
    let mut duration_ms = None;
    let list = |v: &str| -> Vec<String> {
        v.split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    for (k, v) in kv {
        match k.as_str() {
            "reservationname" | "reservation" => r.name = v.to_string(),
            "nodes" => r.nodes = v.to_string(),
            "starttime" => {
                r.start_unix_ms = slurmtime::parse_instant(v, now)
                    .map_err(|e| usage(format!("StartTime: {e}")))?
                    as i64
            }
            "endtime" => {
                r.end_unix_ms = slurmtime::parse_instant(v, now)
                    .map_err(|e| usage(format!("EndTime: {e}")))?
                    as i64
            }
            "duration" => {
                duration_ms = Some(
                    match docket_core::quantity::parse_duration(v)
                        .map_err(|e| usage(format!("Duration: {e}")))?
                    {
                        docket_core::quantity::SlurmDuration::Limit(s) => s.0 as i64 * 1000,
                        docket_core::quantity::SlurmDuration::Unlimited => {
                            return Err(usage("Duration: a reservation must end; give a time"));
                        }
                    },
                )
            }
            "users" => r.users = list(v),
            "accounts" => r.accounts = list(v),
            other => {
                return Err(usage(format!(
                    "{other} is not a reservation field (ReservationName, Nodes, StartTime, EndTime, Duration, Users, Accounts)"
                )));
            }
        }
    }
    Ok(duration_ms)
}

pub fn per_job_errors(r: &pb::PerJobResponse) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_print_as_key_value_lines() {
        let n = pb::NodeInfo {
            name: "n01".into(),
            state: "mix".into(),
            cpus: 8,
            cpus_used: 2,
            memory_mib: 16_000,
            memory_used_mib: 4000,
            partitions: vec!["batch".into(), "debug".into()],
            responding: Some(false),
            ..Default::default()
        };
        let text = render(&[node_record(&n)], false);
        assert_eq!(
            text,
            "NodeName=n01\n   CPUAlloc=2 CPUTot=8\n   AvailableFeatures=(null)\n   Gres=(null)\n   RealMemory=16000 AllocMem=4000\n   State=MIXED*\n   Partitions=batch,debug\n\n"
        );
        let one = render(&[node_record(&n)], true);
        assert_eq!(one.lines().count(), 1);
        assert!(one.starts_with("NodeName=n01 CPUAlloc=2 CPUTot=8 "));
        let j = json("nodes", &[node_record(&n)]);
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["nodes"][0]["State"], "MIXED*");
    }

    #[test]
    fn a_job_shows_slurms_keys() {
        let j = pb::JobInfo {
            job_id: 42,
            name: "sim".into(),
            user: "alice".into(),
            state: "PENDING".into(),
            state_code: "PD".into(),
            reason: "Priority".into(),
            time_limit_seconds: 3600,
            exit_code: Some(0),
            ..Default::default()
        };
        let text = render(&[job_record(&j, 0)], false);
        assert!(
            text.starts_with("JobId=42 JobName=sim\n   UserId=alice "),
            "{text}"
        );
        assert!(text.contains("   JobState=PENDING Reason=Priority Dependency=(null)\n"));
        assert!(text.contains("TimeLimit=1:00:00"));
        assert!(text.contains("StartTime=Unknown"));
        assert!(text.contains("NodeList=(null)"));
    }

    #[test]
    fn a_partition_shows_limits_in_slurms_words() {
        let p = pb::PartitionInfo {
            name: "batch".into(),
            nodes: "n[01-04]".into(),
            total_nodes: 4,
            total_cpus: 32,
            is_default: true,
            up: true,
            max_time_seconds: 2 * 86_400,
            preempt_mode: "suspend".into(),
            ..Default::default()
        };
        let text = render(&[partition_record(&p)], true);
        assert!(text.contains("PartitionName=batch AllowAccounts=ALL AllowQos=ALL Default=YES QoS=N/A DefaultTime=NONE MaxNodes=UNLIMITED MaxTime=2-00:00:00 Nodes=n[01-04]"), "{text}");
        assert!(text.contains("PreemptMode=SUSPEND State=UP TotalCPUs=32 TotalNodes=4"));
    }

    #[test]
    fn config_flattens_to_key_value() {
        let c = pb::GetConfigResponse {
            sched_config_json: r#"{"sched_interval": 60, "priority": {"formula": "Multifactor", "weights": {"age": 1000}}, "x": null}"#.into(),
            partitions: vec!["batch".into()],
            nodes: 4,
            ..Default::default()
        };
        let text = config_lines(&c, 0).unwrap();
        assert!(text.contains("priority.weights.age"));
        assert!(
            text.lines()
                .any(|l| l.starts_with("priority.formula") && l.ends_with("= Multifactor"))
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("x ") && l.ends_with("= (null)"))
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("Nodes ") && l.ends_with("= 4"))
        );
    }
}
