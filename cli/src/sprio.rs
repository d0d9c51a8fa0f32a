//! `sprio`: why pending jobs have their priority, one column per factor of the formula in
//! force, each its weighted contribution.

use anyhow::Result;
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::{Client, rpc, runtime};

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
    let r = runtime()?.block_on(rpc!(
        client,
        jobs_read,
        explain_priority,
        pb::ExplainPriorityRequest {
            job_ids: a.jobs.clone(),
            users: a.users.clone(),
        }
    ))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_column_per_factor() {
        let factor = |name: &str, contribution| pb::PriorityFactor {
            name: name.into(),
            value: 0.0,
            weight: 0.0,
            contribution,
        };
        let r = pb::ExplainPriorityResponse {
            formula: "multifactor".into(),
            jobs: vec![pb::JobPriority {
                job_id: 77,
                user: "alice".into(),
                partition: "batch".into(),
                priority: 1523.0,
                factors: vec![factor("age", 23.0), factor("fairshare", 1500.0)],
            }],
        };
        assert_eq!(
            sprio_table(&r, true),
            "          JOBID PARTITION   PRIORITY        AGE  FAIRSHARE\n             77 batch           1523         23       1500\n"
        );
    }
}
