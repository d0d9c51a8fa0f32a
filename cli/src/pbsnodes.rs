//! `pbsnodes`: nodes as PBS Pro prints them: one block per node, `attribute = value` lines
//! (`state` free, job-busy, offline, down; `state-unknown` added when the agent does not
//! respond). `-l` lists only down and offline nodes with their comment; `-F json` or
//! `--json` for scripts.

use anyhow::{Result, bail};
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::{Client, runtime};

/// Nodes, PBS style.
#[derive(Debug, Clone, Parser)]
#[command(name = "pbsnodes", version)]
pub struct PbsnodesArgs {
    /// Every node (the default when none is named).
    #[arg(short = 'a')]
    pub all: bool,
    /// Only down and offline nodes, one line each with their comment.
    #[arg(short = 'l')]
    pub list: bool,
    /// Output format: `json` (or `--json`).
    #[arg(short = 'F')]
    pub output_format: Option<String>,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub addr: Option<String>,
    /// Node names.
    pub nodes: Vec<String>,
}

/// PBS's state words for a node.
pub fn pbs_state(n: &pb::NodeInfo) -> String {
    use pb::NodeState as S;
    let base = match n.state_typed() {
        S::Idle | S::Mix => "free",
        S::Alloc => "job-busy",
        S::Drain | S::Draining => "offline",
        S::Down => "down",
        S::Unspecified => n.state.as_str(),
    };
    if n.responding == Some(false) && base != "down" {
        format!("{base},state-unknown")
    } else {
        base.to_owned()
    }
}

/// One node's block.
pub fn block(n: &pb::NodeInfo) -> String {
    let mut out = format!("{}\n", n.name);
    let mut attr = |k: &str, v: String| out.push_str(&format!("     {k} = {v}\n"));
    attr("Mom", n.name.clone());
    attr("state", pbs_state(n));
    attr("pcpus", n.cpus.to_string());
    attr("resources_available.ncpus", n.cpus.to_string());
    attr("resources_available.mem", format!("{}mb", n.memory_mib));
    if n.gpus > 0 {
        attr("resources_available.ngpus", n.gpus.to_string());
    }
    attr("resources_assigned.ncpus", n.cpus_used.to_string());
    attr("resources_assigned.mem", format!("{}mb", n.memory_used_mib));
    if n.gpus > 0 {
        attr("resources_assigned.ngpus", n.gpus_used.to_string());
    }
    if !n.partitions.is_empty() {
        attr("queue", n.partitions.join(","));
    }
    if !n.reason.is_empty() {
        attr("comment", n.reason.clone());
    }
    out.push('\n');
    out
}

pub fn pbsnodes(a: PbsnodesArgs) -> Result<()> {
    let json = match a.output_format.as_deref() {
        None => a.json,
        Some(f) if f.eq_ignore_ascii_case("json") => true,
        Some(f) => bail!("-F {f}: the output formats are json (or the default text)"),
    };
    let client = Client::new(a.addr.as_deref())?;
    let nodes = runtime()?.block_on(client.nodes())?;
    let chosen: Vec<&pb::NodeInfo> = nodes
        .iter()
        .filter(|n| a.nodes.is_empty() || a.nodes.contains(&n.name))
        .filter(|n| {
            !a.list
                || matches!(
                    n.state_typed(),
                    pb::NodeState::Down | pb::NodeState::Drain | pb::NodeState::Draining
                )
        })
        .collect();
    let missing: Vec<&String> = a
        .nodes
        .iter()
        .filter(|w| !nodes.iter().any(|n| &n.name == *w))
        .collect();
    if json {
        let map: serde_json::Map<String, serde_json::Value> = chosen
            .iter()
            .map(|n| {
                (
                    n.name.clone(),
                    serde_json::json!({"Mom": n.name, "state": pbs_state(n), "pcpus": n.cpus,
                    "resources_available": {"ncpus": n.cpus, "mem": format!("{}mb", n.memory_mib),
                        "ngpus": n.gpus},
                    "resources_assigned": {"ncpus": n.cpus_used,
                        "mem": format!("{}mb", n.memory_used_mib), "ngpus": n.gpus_used},
                    "queue": n.partitions.join(","), "comment": n.reason}),
                )
            })
            .collect();
        println!("{}", serde_json::json!({ "nodes": map }));
    } else if a.list {
        for n in &chosen {
            println!("{:<20} {:<15} {}", n.name, pbs_state(n), n.reason);
        }
    } else {
        for n in &chosen {
            print!("{}", block(n));
        }
    }
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        bail!("Server has no node list for {}", names.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_prints_as_pbs_prints_it() {
        let n = pb::NodeInfo {
            name: "n01".into(),
            state: "drain".into(),
            cpus: 48,
            cpus_used: 0,
            memory_mib: 190_000,
            partitions: vec!["normal".into()],
            reason: "bad dimm".into(),
            responding: Some(false),
            ..Default::default()
        };
        assert_eq!(
            block(&n),
            "n01\n     Mom = n01\n     state = offline,state-unknown\n     pcpus = 48\n     resources_available.ncpus = 48\n     resources_available.mem = 190000mb\n     resources_assigned.ncpus = 0\n     resources_assigned.mem = 0mb\n     queue = normal\n     comment = bad dimm\n\n"
        );
    }
}
