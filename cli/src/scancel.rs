//! `scancel`: cancel jobs by id (`123`, `123_7`) or by filters (`-u -p -t -n`).

use anyhow::{Result, anyhow};
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::Client;

/// Cancel jobs.
#[derive(Debug, Clone, Parser)]
#[command(name = "scancel", version)]
pub struct ScancelArgs {
    /// Jobs: `123` or `123_7` (an array task).
    pub jobs: Vec<String>,
    #[arg(short = 'u', long = "user")]
    pub user: Option<String>,
    #[arg(short = 'p', long = "partition")]
    pub partition: Option<String>,
    #[arg(short = 't', long = "state")]
    pub state: Option<String>,
    #[arg(short = 'n', long = "name")]
    pub name: Option<String>,
    /// Controllers, host:port,... (default: DOCKET_ADDR).
    #[arg(long)]
    pub addr: Option<String>,
}

/// `123` or `123_7`.
pub fn job_ref(text: &str) -> Result<pb::JobRef> {
    let bad = || anyhow!("{text:?} is not a job id (123) or array task (123_7)");
    let (job, task) = match text.split_once('_') {
        Some((j, t)) => (j, Some(t.parse::<u32>().map_err(|_| bad())?)),
        None => (text, None),
    };
    Ok(pb::JobRef {
        job_id: job.parse().map_err(|_| bad())?,
        task,
    })
}

pub fn run(a: ScancelArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let runtime = crate::client::runtime()?;
    let mut refs: Vec<pb::JobRef> = a.jobs.iter().map(|j| job_ref(j)).collect::<Result<_>>()?;
    let filtered =
        a.user.is_some() || a.partition.is_some() || a.state.is_some() || a.name.is_some();
    if filtered {
        let listed = runtime.block_on(client.jobs_call(|mut c| {
            let req = client.request(pb::ListJobsRequest {
                users: a.user.iter().cloned().collect(),
                partitions: a.partition.iter().cloned().collect(),
                states: a.state.iter().cloned().collect(),
                job_ids: refs.iter().map(|r| r.job_id).collect(),
                page_size: 10_000,
                ..Default::default()
            });
            async move { c.list_jobs(req).await }
        }))?;
        refs = listed
            .jobs
            .iter()
            .filter(|j| a.name.as_ref().is_none_or(|n| &j.name == n))
            .filter(|j| matches!(j.state_code.as_str(), "PD" | "R" | "S"))
            .map(|j| pb::JobRef {
                job_id: j.job_id,
                task: j.array_task.filter(|_| false),
            })
            .collect();
    }
    if refs.is_empty() {
        if filtered {
            return Ok(());
        }
        return Err(anyhow!(
            "no job id given; usage: scancel JOBID... or scancel -u USER"
        ));
    }
    let r = runtime.block_on(client.jobs_call(|mut c| {
        let req = client.request(pb::JobsRequest { jobs: refs.clone() });
        async move { c.cancel_jobs(req).await }
    }))?;
    let mut failed = 0;
    for res in r.results.iter().filter(|r| !r.error.is_empty()) {
        failed += 1;
        let id = res
            .job
            .as_ref()
            .map(|j| match j.task {
                Some(t) => format!("{}_{t}", j.job_id),
                None => j.job_id.to_string(),
            })
            .unwrap_or_default();
        eprintln!("scancel: error: job {id}: {}", res.error);
    }
    if failed > 0 {
        return Err(anyhow!(
            "{failed} of {} jobs not cancelled",
            r.results.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_and_task_ids_parse() {
        assert_eq!(
            job_ref("123").unwrap(),
            pb::JobRef {
                job_id: 123,
                task: None
            }
        );
        assert_eq!(
            job_ref("123_7").unwrap(),
            pb::JobRef {
                job_id: 123,
                task: Some(7)
            }
        );
        assert!(job_ref("abc").is_err());
        assert!(job_ref("12_x").is_err());
    }
}
