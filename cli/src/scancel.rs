//! `scancel`: cancel jobs by id (`123`, `123_7`) or by filters (`-u -p -t -n`); with
//! `--signal` send them a signal instead.

use anyhow::{Result, anyhow};
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::Client;
use crate::client::rpc;

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
    /// Send this signal to the jobs' processes instead of cancelling them (USR1, SIGTERM,
    /// 10, ...).
    #[arg(short = 's', long = "signal")]
    pub signal: Option<String>,
    /// Controllers, host:port,... (default: DOCKET_ADDR).
    #[arg(long)]
    pub addr: Option<String>,
}

/// A signal by name (`USR1`, `SIGUSR1`) or number.
pub fn signal_number(text: &str) -> Result<i32> {
    let bad = || anyhow!("--signal: {text:?} is not a signal (a name like USR1 or a number 1..64)");
    if let Ok(n) = text.parse::<i32>() {
        return if (1..=64).contains(&n) {
            Ok(n)
        } else {
            Err(bad())
        };
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<nix::sys::signal::Signal>()
        .map(|s| s as i32)
        .map_err(|_| bad())
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

/// `123.4`: step 4 of job 123 (`123.batch` is the job's own script: cancel the job).
pub fn step_ref(text: &str) -> Option<Result<pb::StepRef>> {
    let (job, step) = text.split_once('.')?;
    let bad = || anyhow!("{text:?} is not a job step (JOBID.STEP, e.g. 123.0)");
    Some((|| {
        Ok(pb::StepRef {
            job_id: job.parse().map_err(|_| bad())?,
            step_id: step.parse().map_err(|_| bad())?,
        })
    })())
}

/// `scancel JOBID.STEP ...`: the steps stop (their tasks are killed); their jobs go on.
fn cancel_steps(
    client: &Client,
    runtime: &tokio::runtime::Runtime,
    steps: Vec<pb::StepRef>,
) -> Result<()> {
    let r = runtime.block_on(rpc!(
        client,
        jobs_call,
        cancel_steps,
        pb::CancelStepsRequest {
            steps: steps.clone(),
        }
    ))?;
    let failed: Vec<String> = r
        .results
        .iter()
        .filter(|r| !r.error.is_empty())
        .map(|r| {
            let id = r
                .step
                .as_ref()
                .map(|s| format!("{}.{}", s.job_id, s.step_id))
                .unwrap_or_default();
            format!("step {id}: {}", r.error)
        })
        .collect();
    for f in &failed {
        eprintln!("scancel: error: {f}");
    }
    if !failed.is_empty() {
        return Err(anyhow!(
            "{} of {} steps not cancelled",
            failed.len(),
            r.results.len()
        ));
    }
    Ok(())
}

pub fn run(a: ScancelArgs) -> Result<()> {
    let signal = a.signal.as_deref().map(signal_number).transpose()?;
    let client = Client::new(a.addr.as_deref())?;
    let runtime = crate::client::runtime()?;
    let steps: Vec<pb::StepRef> = a
        .jobs
        .iter()
        .filter_map(|j| step_ref(j))
        .collect::<Result<_>>()?;
    if !steps.is_empty() {
        if signal.is_some() || a.jobs.iter().any(|j| !j.contains('.')) {
            return Err(anyhow!(
                "name either jobs or steps (JOBID.STEP), not both, and steps without --signal"
            ));
        }
        return cancel_steps(&client, &runtime, steps);
    }
    let mut refs: Vec<pb::JobRef> = a.jobs.iter().map(|j| job_ref(j)).collect::<Result<_>>()?;
    let filtered =
        a.user.is_some() || a.partition.is_some() || a.state.is_some() || a.name.is_some();
    if filtered {
        refs = matching_jobs(&client, &runtime, &a, &refs, signal)?;
    }
    if refs.is_empty() {
        if filtered {
            return Ok(());
        }
        return Err(anyhow!(
            "no job id given; usage: scancel JOBID... or scancel -u USER"
        ));
    }
    let r = cancel_or_signal(&client, &runtime, &refs, signal)?;
    report_job_failures(&r, signal)
}

/// The jobs `-u -p -t -n` select (among `refs`, if any are named) that can be cancelled,
/// or signalled when `signal` is given (running or suspended ones only), from every page of
/// the listing.
fn matching_jobs(
    client: &Client,
    runtime: &tokio::runtime::Runtime,
    a: &ScancelArgs,
    refs: &[pb::JobRef],
    signal: Option<i32>,
) -> Result<Vec<pb::JobRef>> {
    let live: &[&str] = match signal {
        Some(_) => &["R", "S"],
        None => &["PD", "R", "S"],
    };
    // Without `-t`, only the jobs that can be acted on are listed (not the finished ones
    // still kept in the queue).
    let states = match &a.state {
        Some(s) => vec![s.clone()],
        None => live.iter().map(|s| (*s).to_owned()).collect(),
    };
    let listed = runtime.block_on(crate::listing::all_jobs(
        client,
        pb::ListJobsRequest {
            users: a.user.iter().cloned().collect(),
            partitions: a.partition.iter().cloned().collect(),
            states,
            job_ids: refs.iter().map(|r| r.job_id).collect(),
            ..Default::default()
        },
    ))?;
    Ok(listed
        .iter()
        .filter(|j| a.name.as_ref().is_none_or(|n| &j.name == n))
        .filter(|j| live.contains(&j.state_code.as_str()))
        .map(|j| pb::JobRef {
            job_id: j.job_id,
            task: j.array_task.filter(|_| false),
        })
        .collect())
}

/// How many jobs one cancel (or signal) request names: well under the controllers' limit
/// per request, so `scancel -u USER` of any queue is a few requests, not a refused one.
const REFS_PER_REQUEST: usize = 10_000;

/// Cancels the jobs `refs`, or sends them `signal` when one is given, [`REFS_PER_REQUEST`]
/// at a time; the answers of every request, in order. A request that fails ends the run:
/// the answers before it are reported first, and the error says how far it got.
fn cancel_or_signal(
    client: &Client,
    runtime: &tokio::runtime::Runtime,
    refs: &[pb::JobRef],
    signal: Option<i32>,
) -> Result<pb::PerJobResponse> {
    let mut all = pb::PerJobResponse::default();
    let batches = refs.len().div_ceil(REFS_PER_REQUEST);
    for (k, batch) in refs.chunks(REFS_PER_REQUEST).enumerate() {
        match cancel_or_signal_batch(client, runtime, batch, signal) {
            Ok(r) => all.results.extend(r.results),
            Err(e) if k == 0 => return Err(e),
            Err(e) => {
                let _ = report_job_failures(&all, signal);
                return Err(e.context(format!(
                    "request {} of {batches} failed, after {} of {} jobs were answered",
                    k + 1,
                    all.results.len(),
                    refs.len()
                )));
            }
        }
    }
    Ok(all)
}

/// One cancel (or signal) request for `refs`.
fn cancel_or_signal_batch(
    client: &Client,
    runtime: &tokio::runtime::Runtime,
    refs: &[pb::JobRef],
    signal: Option<i32>,
) -> Result<pb::PerJobResponse> {
    runtime.block_on(client.jobs_call(|mut c| {
        let jobs = refs.to_vec();
        let cancel = client.request(pb::JobsRequest { jobs: jobs.clone() });
        let signal_req =
            signal.map(|signal| client.request(pb::SignalJobsRequest { jobs, signal }));
        async move {
            match signal_req {
                Some(req) => c.signal_jobs(req).await,
                None => c.cancel_jobs(cancel).await,
            }
        }
    }))
}

/// Prints each job the answer `r` says was not cancelled (or signalled); an error if any.
fn report_job_failures(r: &pb::PerJobResponse, signal: Option<i32>) -> Result<()> {
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
            "{failed} of {} jobs not {}",
            r.results.len(),
            if signal.is_some() {
                "signalled"
            } else {
                "cancelled"
            }
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_ids_parse() {
        let s = step_ref("12.3").and_then(Result::ok);
        assert_eq!(s.map(|s| (s.job_id, s.step_id)), Some((12, 3)));
        assert!(step_ref("12").is_none());
        assert!(step_ref("12.batch").is_some_and(|r| r.is_err()));
    }

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal_number("USR1").unwrap(), 10);
        assert_eq!(signal_number("sigterm").unwrap(), 15);
        assert_eq!(signal_number("9").unwrap(), 9);
        assert!(signal_number("0").is_err());
        assert!(
            signal_number("BOGUS")
                .unwrap_err()
                .to_string()
                .contains("--signal")
        );
    }

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
