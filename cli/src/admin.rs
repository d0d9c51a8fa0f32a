//! `docket config` and `docket node`: the administrator's commands in Docket's own words.
//!
//! Accounts, users, QOS, partitions and nodes live in the replicated configuration, which is
//! changed by applying a `docket.toml` (the whole file, as `scontrol reconfigure` rereads
//! slurm.conf, or with `--objects-only` just the objects it defines, for adding a user or an
//! account). `--dry-run` applies it to a copy of the state on the controller and shows what
//! each change would do, which would be refused and why, and how the pending jobs' order of
//! consideration would change, before anything is committed.

use anyhow::{Context, Result, anyhow};
use clap::{Parser, Subcommand};
use docket_proto::v1 as pb;

use crate::client::{Client, rpc, runtime};

/// The replicated configuration.
#[derive(Debug, Clone, Parser)]
pub struct ConfigArgs {
    #[arg(long)]
    pub addr: Option<String>,
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ConfigCommand {
    /// The scheduler parameters (JSON) and the names of what is defined.
    Show,
    /// Apply a docket.toml: every object it defines is created or replaced and its
    /// scheduler parameters replace the current ones.
    Apply {
        file: std::path::PathBuf,
        /// Show what would change, refusals and the new queue order; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Apply only the objects (nodes, partitions, QOS, accounts, users), keeping the
        /// scheduler parameters in force.
        #[arg(long)]
        objects_only: bool,
    },
    /// Remove a node, partition, qos, account, user or reservation that nothing uses.
    Remove { kind: String, name: String },
}

/// Compute nodes.
#[derive(Debug, Clone, Parser)]
pub struct NodeArgs {
    #[arg(long)]
    pub addr: Option<String>,
    #[command(subcommand)]
    pub command: NodeCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum NodeCommand {
    /// Every node with its state, use and reason (as `sinfo -N -l`).
    List,
    /// Stop starting jobs on nodes (a hostlist); running jobs finish.
    Drain {
        nodes: String,
        #[arg(long)]
        reason: String,
    },
    /// Return drained or down nodes (a hostlist) to service.
    Resume { nodes: String },
}

/// What an apply answered, one line per change.
pub fn report(r: &pb::ApplyConfigResponse, dry_run: bool) -> String {
    let mut out = String::new();
    for (i, change) in r.changes.iter().enumerate() {
        match r.errors.get(i).filter(|e| !e.is_empty()) {
            Some(e) => out.push_str(&format!("  refused  {change}: {e}\n")),
            None if dry_run => out.push_str(&format!("  would    {change}\n")),
            None => out.push_str(&format!("  applied  {change}\n")),
        }
    }
    if dry_run {
        if r.order_changes.is_empty() {
            out.push_str(&format!(
                "queue order: unchanged ({} pending jobs)\n",
                r.pending_jobs
            ));
        } else {
            out.push_str(&format!(
                "queue order ({} pending jobs; place now -> place after):\n",
                r.pending_jobs
            ));
            for line in &r.order_changes {
                out.push_str(&format!("  {line}\n"));
            }
        }
        out.push_str("dry run: nothing was changed\n");
    }
    out
}

pub fn config(a: ConfigArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let rt = runtime()?;
    match a.command {
        ConfigCommand::Show => {
            let c = rt.block_on(rpc!(
                client,
                admin_read,
                get_config,
                pb::GetConfigRequest {}
            ))?;
            println!("{}", c.sched_config_json);
            println!("partitions: {}", c.partitions.join(", "));
            println!("qos:        {}", c.qos.join(", "));
            println!("accounts:   {}", c.accounts.join(", "));
            println!("users:      {}", c.users.join(", "));
            println!("nodes:      {}", c.nodes);
            Ok(())
        }
        ConfigCommand::Apply {
            file,
            dry_run,
            objects_only,
        } => {
            let toml = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let r = rt.block_on(rpc!(
                client,
                admin_call,
                apply_config,
                pb::ApplyConfigRequest {
                    toml: toml.clone(),
                    dry_run,
                    objects_only,
                }
            ))?;
            print!("{}", report(&r, dry_run));
            if !dry_run && !r.applied {
                return Err(anyhow!(
                    "some changes were refused (above); the others were applied"
                ));
            }
            if dry_run && r.errors.iter().any(|e| !e.is_empty()) {
                return Err(anyhow!("some changes would be refused (above)"));
            }
            Ok(())
        }
        ConfigCommand::Remove { kind, name } => {
            let r = rt.block_on(rpc!(
                client,
                admin_call,
                remove_object,
                crate::client::remove_request(&kind, &name)
            ))?;
            println!("removed {kind} {name}{}", suffix(&r.message));
            Ok(())
        }
    }
}

fn suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

pub fn node(a: NodeArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let rt = runtime()?;
    let hosts = |list: &str| -> Result<Vec<String>> {
        docket_core::hostlist::expand(list).map_err(|e| anyhow!("{list:?}: {e}"))
    };
    match a.command {
        NodeCommand::List => crate::sinfo::sinfo(crate::sinfo::SinfoArgs {
            help: None,
            nodes: true,
            long: true,
            partitions: Vec::new(),
            states: Vec::new(),
            reasons: false,
            noheader: false,
            json: false,
            addr: a.addr,
        }),
        NodeCommand::Drain { nodes, reason } => {
            crate::stdout::act_then_say(&hosts(&nodes)?, |node| {
                rt.block_on(rpc!(
                    client,
                    admin_call,
                    drain_node,
                    pb::DrainNodeRequest {
                        node: node.to_owned(),
                        reason: reason.clone(),
                    }
                ))?;
                Ok(Some(format!("{node}: draining ({reason})")))
            })
        }
        NodeCommand::Resume { nodes } => crate::stdout::act_then_say(&hosts(&nodes)?, |node| {
            rt.block_on(rpc!(
                client,
                admin_call,
                resume_node,
                pb::NodeRequest {
                    node: node.to_owned()
                }
            ))?;
            Ok(Some(format!("{node}: resumed")))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dry_run_reads_as_a_plan() {
        let r = pb::ApplyConfigResponse {
            changes: vec!["upsert partition batch".into(), "upsert user carol".into()],
            errors: vec![String::new(), "account nope does not exist".into()],
            applied: false,
            order_changes: vec!["job 12: 5 -> 1".into()],
            pending_jobs: 7,
        };
        assert_eq!(
            report(&r, true),
            "  would    upsert partition batch\n  refused  upsert user carol: account nope does not exist\nqueue order (7 pending jobs; place now -> place after):\n  job 12: 5 -> 1\ndry run: nothing was changed\n"
        );
    }
}
