//! `sinfo`: partitions and nodes. The default folds nodes into one line per partition and
//! state (`PARTITION AVAIL TIMELIMIT NODES STATE NODELIST`, the default partition marked
//! `*`); `-N` gives one line per node and partition; `-l` the long forms. A `*` after a
//! state marks nodes whose agent does not respond, as in Slurm.

use std::collections::BTreeMap;

use anyhow::Result;
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::{Client, runtime};
use crate::slurmtime;

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
    /// Long form.
    #[arg(short = 'l', long)]
    pub long: bool,
    /// Only these partitions.
    #[arg(short = 'p', long = "partition", value_delimiter = ',')]
    pub partitions: Vec<String>,
    /// Only nodes in these states (idle, mix, alloc, drain, drng, down).
    #[arg(short = 't', long = "states", value_delimiter = ',')]
    pub states: Vec<String>,
    /// Only down, drained and draining nodes, with their reasons.
    #[arg(short = 'R', long = "list-reasons")]
    pub reasons: bool,
    /// No header.
    #[arg(short = 'h', long = "noheader")]
    pub noheader: bool,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub addr: Option<String>,
}

/// A node's state as sinfo prints it: short (`mix`) or long (`mixed`), `*` when its agent
/// does not respond.
pub fn state_word(n: &pb::NodeInfo, long: bool) -> String {
    use pb::NodeState as S;
    let word = match (n.state_typed(), long) {
        (S::Draining, false) => "drng",
        (S::Draining, true) => "draining",
        (S::Drain, true) => "drained",
        (S::Drain, false) => "drain",
        (S::Mix, true) => "mixed",
        (S::Mix, false) => "mix",
        (S::Alloc, true) => "allocated",
        (S::Alloc, false) => "alloc",
        (S::Idle, _) => "idle",
        (S::Down, _) => "down",
        (S::Unspecified, _) => n.state.as_str(),
    };
    let star = if n.responding == Some(false) { "*" } else { "" };
    format!("{word}{star}")
}

fn time_limit(p: Option<&pb::PartitionInfo>) -> String {
    match p.map(|p| p.max_time_seconds) {
        None => "n/a".into(),
        Some(0) => "infinite".into(),
        Some(s) => slurmtime::duration(s),
    }
}

/// Whether `a`'s filters keep node `n` as a member of partition `p` (`""` for no partition).
fn wanted(a: &SinfoArgs, n: &pb::NodeInfo, p: &str) -> bool {
    (a.partitions.is_empty() || a.partitions.iter().any(|x| x == p))
        && (a.states.is_empty()
            || a.states.iter().any(|s| {
                state_word(n, false).trim_end_matches('*') == s
                    || state_word(n, true).trim_end_matches('*') == s
            }))
        && (!a.reasons
            || matches!(
                n.state_typed(),
                pb::NodeState::Down | pb::NodeState::Drain | pb::NodeState::Draining
            ))
}

/// The partition named `name`, if it is configured.
fn find_partition<'a>(
    partitions: &'a [pb::PartitionInfo],
    name: &str,
) -> Option<&'a pb::PartitionInfo> {
    partitions.iter().find(|p| p.name == name)
}

/// A partition's name as printed: `*` after the default partition's.
fn partition_label(name: &str, info: Option<&pb::PartitionInfo>) -> String {
    match info {
        Some(x) if x.is_default => format!("{name}*"),
        _ => name.to_owned(),
    }
}

/// The listing for `nodes` and `partitions` as the options ask.
pub fn table(a: &SinfoArgs, nodes: &[pb::NodeInfo], partitions: &[pb::PartitionInfo]) -> String {
    if a.reasons {
        return reasons_table(a, nodes);
    }
    if a.nodes {
        return node_table(a, nodes, partitions);
    }
    partition_table(a, nodes, partitions)
}

/// `-R`: down, drained and draining nodes folded by reason and state.
fn reasons_table(a: &SinfoArgs, nodes: &[pb::NodeInfo]) -> String {
    let mut out = String::new();
    if !a.noheader {
        out.push_str(&format!("{:<20} {:<9} {}\n", "REASON", "STATE", "NODELIST"));
    }
    let mut groups: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for n in nodes.iter().filter(|n| wanted(a, n, "")) {
        groups
            .entry((n.reason.clone(), state_word(n, false)))
            .or_default()
            .push(n.name.clone());
    }
    for ((reason, state), names) in groups {
        out.push_str(&format!(
            "{:<20} {:<9} {}\n",
            reason,
            state,
            docket_core::hostlist::compress(&names)
        ));
    }
    out
}

/// `-N`: one line per node and partition.
fn node_table(a: &SinfoArgs, nodes: &[pb::NodeInfo], partitions: &[pb::PartitionInfo]) -> String {
    let mut out = String::new();
    if !a.noheader {
        out.push_str(&node_header(a.long));
    }
    for n in nodes {
        for p in n.partitions.iter().filter(|p| wanted(a, n, p)) {
            let pname = partition_label(p, find_partition(partitions, p));
            if a.long {
                out.push_str(&long_node_row(n, &pname));
            } else {
                out.push_str(&format!(
                    "{:<10} {:>5} {:<9} {:>5}\n",
                    n.name,
                    1,
                    pname,
                    state_word(n, false)
                ));
            }
        }
    }
    out
}

/// The header line of `-N`, short or long (`-l`).
fn node_header(long: bool) -> String {
    if long {
        format!(
            "{:<10} {:>5} {:<9} {:>10} {:>4} {:>7} {:>8} {:<10} {:<10} {}\n",
            "NODELIST",
            "NODES",
            "PARTITION",
            "STATE",
            "CPUS",
            "MEMORY",
            "ALLOCMEM",
            "GRES",
            "AVAIL_FE",
            "REASON"
        )
    } else {
        format!(
            "{:<10} {:>5} {:<9} {:>5}\n",
            "NODELIST", "NODES", "PARTITION", "STATE"
        )
    }
}

/// One `-N -l` line: node `n` in the partition printed as `pname`.
fn long_node_row(n: &pb::NodeInfo, pname: &str) -> String {
    format!(
        "{:<10} {:>5} {:<9} {:>10} {:>4} {:>7} {:>8} {:<10} {:<10} {}\n",
        n.name,
        1,
        pname,
        state_word(n, true),
        n.cpus,
        n.memory_mib,
        n.memory_used_mib,
        if n.gpus > 0 {
            format!("gpu:{}", n.gpus)
        } else {
            "(null)".into()
        },
        if n.features.is_empty() {
            "(null)".into()
        } else {
            n.features.join(",")
        },
        if n.reason.is_empty() {
            "none"
        } else {
            &n.reason
        }
    )
}

/// The default listing: one line per partition and state.
fn partition_table(
    a: &SinfoArgs,
    nodes: &[pb::NodeInfo],
    partitions: &[pb::PartitionInfo],
) -> String {
    // One line per (partition, state), nodes folded into a hostlist; partitions in their
    // configured order, an empty partition as one line with no nodes.
    let mut groups: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for n in nodes {
        for p in n.partitions.iter().filter(|p| wanted(a, n, p)) {
            groups
                .entry((p.clone(), state_word(n, a.long)))
                .or_default()
                .push(n.name.clone());
        }
    }
    let mut out = String::new();
    if !a.noheader {
        out.push_str(&partition_header(a.long));
    }
    for ((p, state), names) in groups {
        out.push_str(&partition_row(
            a.long,
            &p,
            find_partition(partitions, &p),
            &state,
            &names,
        ));
    }
    out
}

/// The header line of the default listing, short or long (`-l`).
fn partition_header(long: bool) -> String {
    if long {
        format!(
            "{:<9} {:>5} {:>10} {:>8} {:>6} {:>10} NODELIST\n",
            "PARTITION", "AVAIL", "TIMELIMIT", "JOB_SIZE", "NODES", "STATE"
        )
    } else {
        format!(
            "{:<9} {:>5} {:>10} {:>6} {:>6} NODELIST\n",
            "PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE"
        )
    }
}

/// One line of the default listing: the nodes `names` of partition `p` in `state`.
fn partition_row(
    long: bool,
    p: &str,
    info: Option<&pb::PartitionInfo>,
    state: &str,
    names: &[String],
) -> String {
    let name = partition_label(p, info);
    let avail = if info.is_none_or(|x| x.up) {
        "up"
    } else {
        "down"
    };
    let hosts = docket_core::hostlist::compress(names);
    if long {
        let size = match info.map(|x| x.max_nodes) {
            Some(m) if m > 0 => format!("1-{m}"),
            _ => "1-infinite".into(),
        };
        format!(
            "{:<9} {:>5} {:>10} {:>8} {:>6} {:>10} {}\n",
            name,
            avail,
            time_limit(info),
            size,
            names.len(),
            state,
            hosts
        )
    } else {
        format!(
            "{:<9} {:>5} {:>10} {:>6} {:>6} {}\n",
            name,
            avail,
            time_limit(info),
            names.len(),
            state,
            hosts
        )
    }
}

pub fn sinfo(a: SinfoArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let rt = runtime()?;
    let nodes = rt.block_on(client.nodes())?;
    let partitions = rt.block_on(client.partitions())?;
    if a.json {
        let rows: Vec<_> = nodes
            .iter()
            .map(|n| {
                serde_json::json!({"name": n.name, "state": n.state, "responding": n.responding,
                "cpus": n.cpus, "cpus_used": n.cpus_used, "memory_mib": n.memory_mib,
                "memory_used_mib": n.memory_used_mib, "gpus": n.gpus, "gpus_used": n.gpus_used,
                "partitions": n.partitions, "features": n.features, "reason": n.reason})
            })
            .collect();
        let parts: Vec<_> = partitions
            .iter()
            .map(|p| {
                serde_json::json!({"name": p.name, "nodes": p.nodes, "up": p.up,
                "default": p.is_default, "max_time_seconds": p.max_time_seconds,
                "total_cpus": p.total_cpus, "total_nodes": p.total_nodes})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "nodes": rows, "partitions": parts })
        );
        return Ok(());
    }
    print!("{}", table(&a, &nodes, &partitions));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> SinfoArgs {
        SinfoArgs::parse_from(std::iter::once("sinfo").chain(extra.iter().copied()))
    }

    fn cluster() -> (Vec<pb::NodeInfo>, Vec<pb::PartitionInfo>) {
        let node =
            |name: &str, state: &str, responding: Option<bool>, parts: &[&str]| pb::NodeInfo {
                name: name.into(),
                state: state.into(),
                cpus: 4,
                memory_mib: 8000,
                partitions: parts.iter().map(|p| p.to_string()).collect(),
                responding,
                reason: if state == "drain" {
                    "disk".into()
                } else {
                    String::new()
                },
                ..Default::default()
            };
        (
            vec![
                node("n01", "idle", Some(true), &["batch"]),
                node("n02", "idle", Some(true), &["batch"]),
                node("n03", "mix", Some(false), &["batch"]),
                node("g01", "drain", None, &["gpu"]),
            ],
            vec![
                pb::PartitionInfo {
                    name: "batch".into(),
                    is_default: true,
                    up: true,
                    max_time_seconds: 86_400,
                    ..Default::default()
                },
                pb::PartitionInfo {
                    name: "gpu".into(),
                    up: true,
                    ..Default::default()
                },
            ],
        )
    }

    #[test]
    fn the_default_folds_nodes_by_partition_and_state() {
        let (n, p) = cluster();
        let text = table(&args(&[]), &n, &p);
        assert_eq!(
            text,
            "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n\
             batch*       up 1-00:00:00      2   idle n[01-02]\n\
             batch*       up 1-00:00:00      1   mix* n03\n\
             gpu          up   infinite      1  drain g01\n"
        );
    }

    #[test]
    fn node_lines_long_lines_and_reasons() {
        let (n, p) = cluster();
        let text = table(&args(&["-N"]), &n, &p);
        assert_eq!(
            text.lines().nth(3),
            Some("n03            1 batch*     mix*")
        );
        let long = table(&args(&["-N", "-l"]), &n, &p);
        assert!(long.contains("drained"), "{long}");
        assert!(
            long.lines()
                .any(|l| l.starts_with("g01") && l.ends_with("disk"))
        );
        let reasons = table(&args(&["-R"]), &n, &p);
        assert_eq!(
            reasons.lines().nth(1),
            Some("disk                 drain     g01")
        );
        let idle = table(&args(&["-t", "idle", "-h"]), &n, &p);
        assert_eq!(idle.lines().count(), 1);
    }
}
