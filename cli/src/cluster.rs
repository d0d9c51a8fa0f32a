//! `docket cluster`: the controller replicas, like Nomad's `operator raft list-peers`.

use anyhow::Result;
use clap::{Parser, Subcommand};
use docket_proto::v1 as pb;

use crate::client::{Client, rpc, runtime};

/// The controller replicas.
#[derive(Debug, Clone, Parser)]
pub struct ClusterArgs {
    #[arg(long)]
    pub addr: Option<String>,
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ClusterCommand {
    /// Every replica: address, role, term, applied index, lag.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Add a replica (started empty with `docket-controller run --id ID`) as a voter.
    AddReplica {
        id: u64,
        /// host:port
        addr: String,
        /// As a learner only.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a replica from the cluster.
    RemoveReplica { id: u64 },
}

/// The status table.
pub fn table(s: &pb::ClusterStatusResponse) -> String {
    let mut out = format!(
        "{:<4} {:<22} {:<11} {:<6} {:>8} {:>8} {:>6}  {}\n",
        "ID", "ADDRESS", "ROLE", "VOTER", "TERM", "APPLIED", "LAG", "NOTE"
    );
    for r in &s.replicas {
        let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
        out.push_str(&format!(
            "{:<4} {:<22} {:<11} {:<6} {:>8} {:>8} {:>6}  {}\n",
            r.id,
            r.addr,
            r.role,
            if r.voter { "true" } else { "false" },
            if r.reachable {
                r.term.to_string()
            } else {
                "-".into()
            },
            opt(r.applied_index),
            opt(r.lag),
            r.error
        ));
    }
    out
}

pub fn run(a: ClusterArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let rt = runtime()?;
    match a.command {
        ClusterCommand::Status { json } => {
            let s = rt.block_on(rpc!(
                client,
                admin_read,
                cluster_status,
                pb::ClusterStatusRequest::default()
            ))?;
            if json {
                let rows: Vec<_> = s
                    .replicas
                    .iter()
                    .map(|r| {
                        serde_json::json!({"id": r.id, "addr": r.addr, "role": r.role,
                        "voter": r.voter, "term": r.term, "applied_index": r.applied_index,
                        "last_log_index": r.last_log_index, "lag": r.lag,
                        "reachable": r.reachable, "error": r.error})
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({"leader_id": s.leader_id, "term": s.term, "replicas": rows})
                );
            } else {
                print!("{}", table(&s));
            }
            Ok(())
        }
        ClusterCommand::AddReplica { id, addr, learner } => {
            let r = rt.block_on(rpc!(
                client,
                admin_call,
                add_replica,
                pb::AddReplicaRequest {
                    id,
                    addr: addr.clone(),
                    learner,
                }
            ))?;
            println!("{}", r.message);
            Ok(())
        }
        ClusterCommand::RemoveReplica { id } => {
            let r = rt.block_on(rpc!(
                client,
                admin_call,
                remove_replica,
                pb::RemoveReplicaRequest { id }
            ))?;
            println!("{}", r.message);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_table_reads_like_list_peers() {
        let s = pb::ClusterStatusResponse {
            leader_id: Some(1),
            leader_addr: "10.0.0.1:6817".into(),
            term: 3,
            answered_by: 2,
            replicas: vec![
                pb::ReplicaInfo {
                    id: 1,
                    addr: "10.0.0.1:6817".into(),
                    role: "leader".into(),
                    voter: true,
                    term: 3,
                    applied_index: Some(120),
                    lag: Some(0),
                    reachable: true,
                    ..Default::default()
                },
                pb::ReplicaInfo {
                    id: 2,
                    addr: "10.0.0.2:6817".into(),
                    role: "unreachable".into(),
                    voter: true,
                    term: 0,
                    error: "connection refused".into(),
                    ..Default::default()
                },
            ],
        };
        let text = table(&s);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "ID   ADDRESS                ROLE        VOTER      TERM  APPLIED    LAG  NOTE"
        );
        assert!(
            lines[1].starts_with("1    10.0.0.1:6817          leader      "),
            "{text}"
        );
        assert!(lines[1].contains("     120      0"), "{text}");
        assert!(
            lines[2].contains("unreachable") && lines[2].ends_with("connection refused"),
            "{text}"
        );
    }
}
