//! Interactive allocations: what `salloc` and `srun` outside a job share.
//!
//! As in Slurm, an allocation is a job like any other (queued, prioritised, placed, accounted
//! and limited by its time limit) whose first node runs nothing of the user's: a holder that
//! keeps the job's cgroups on every node until its owner completes it. The command that
//! asked for it waits, printing Slurm's messages, until the job runs; then `salloc` runs its
//! command on this host with the allocation's `SLURM_*` variables, and `srun` runs its step
//! in it. When that ends, the command completes the job with its exit status
//! (`Jobs.CompleteJob`, Slurm's `slurm_complete_job`): the agents stop the holder and the job
//! ends COMPLETED or FAILED with that status. Interrupted while waiting, the command cancels
//! the job.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use docket_proto::v1 as pb;

use crate::client::Client;
use crate::client::rpc;
use crate::sbatch::{SbatchArgs, is_final, job_spec};

/// The script an allocation's first node runs: nothing but waiting to be stopped.
pub const HOLDER_SCRIPT: &str = "#!/bin/sh\n# An interactive allocation (salloc, srun): held until its owner completes it.\nexec sleep infinity\n";

/// A running allocation.
#[derive(Debug, Clone)]
pub struct Allocation {
    pub job: u64,
    pub info: pb::JobInfo,
    /// `-n` as asked (the job's tasks).
    pub ntasks: u32,
    pub cpus_per_task: Option<u32>,
}

/// Submits an allocation for `options` and waits until it runs; `who` names the command in
/// its messages. Ctrl-C or SIGTERM while it waits cancels the job. With `immediate`, gives up
/// (and cancels) when it has not started within that many seconds.
pub fn allocate(
    client: &Client,
    runtime: &tokio::runtime::Runtime,
    options: &SbatchArgs,
    who: &str,
    immediate: Option<u64>,
) -> Result<Allocation> {
    let mut options = options.clone();
    if options.job_name.is_none() {
        options.job_name = Some(
            if who == "salloc" {
                "interactive"
            } else {
                "srun"
            }
            .into(),
        );
    }
    let cwd = std::env::current_dir()
        .context("the current directory")?
        .display()
        .to_string();
    let spec = job_spec(&options, HOLDER_SCRIPT, &cwd, docket_proto::unix_ms())?;
    let ntasks = options.ntasks.unwrap_or_else(|| {
        options
            .nodes
            .unwrap_or(1)
            .saturating_mul(options.ntasks_per_node.unwrap_or(1))
    });
    allocate_spec(
        client,
        runtime,
        spec,
        (ntasks, options.cpus_per_task),
        who,
        immediate,
    )
}

/// Submits `spec` (its script replaced by the holder) as an interactive allocation of
/// `shape` (tasks, cpus per task as asked) and waits until it runs, as [`allocate`].
pub fn allocate_spec(
    client: &Client,
    runtime: &tokio::runtime::Runtime,
    mut spec: pb::JobSpec,
    shape: (u32, Option<u32>),
    who: &str,
    immediate: Option<u64>,
) -> Result<Allocation> {
    spec.script = HOLDER_SCRIPT.as_bytes().to_vec();
    spec.interactive = true;
    // Nothing of the holder's is worth keeping.
    spec.stdout = "/dev/null".into();
    spec.stderr = "/dev/null".into();
    let results = runtime.block_on(rpc!(
        client,
        jobs_call,
        submit_jobs,
        pb::SubmitJobsRequest {
            jobs: vec![spec.clone()],
        }
    ))?;
    let job = match results.results.first().and_then(|r| r.result.clone()) {
        Some(pb::submit_result::Result::JobId(id)) => id,
        Some(pb::submit_result::Result::Error(e)) => {
            bail!("job submit/allocate failed: {e}")
        }
        None => bail!("job submit/allocate failed: no answer for the job"),
    };
    say(who, Event::Pending, job);
    let waited = runtime.block_on(wait_running(client, job, who, immediate));
    match waited {
        Ok(info) => {
            say(who, Event::Granted, job);
            Ok(Allocation {
                job,
                info,
                ntasks: shape.0,
                cpus_per_task: shape.1,
            })
        }
        Err(e) => {
            let _ = runtime.block_on(cancel(client, job));
            eprintln!("{who}: Job allocation {job} has been revoked.");
            Err(e)
        }
    }
}

/// What the waiting command tells its user.
#[derive(Debug, Clone, Copy)]
enum Event {
    Pending,
    Granted,
}

/// salloc's and PBS's `qsub -I`'s words (srun says nothing until it must wait).
fn say(who: &str, event: Event, job: u64) {
    match (who, event) {
        ("salloc", Event::Pending) => eprintln!("salloc: Pending job allocation {job}"),
        ("salloc", Event::Granted) => eprintln!("salloc: Granted job allocation {job}"),
        ("qsub", Event::Pending) => eprintln!(
            "qsub: waiting for job {job}.{} to start",
            crate::pbs::server()
        ),
        ("qsub", Event::Granted) => {
            eprintln!("qsub: job {job}.{} ready", crate::pbs::server())
        }
        _ => {}
    }
}

async fn wait_running(
    client: &Client,
    job: u64,
    who: &str,
    immediate: Option<u64>,
) -> Result<pb::JobInfo> {
    let started = tokio::time::Instant::now();
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut said = false;
    let mut pause = Duration::from_millis(100);
    loop {
        let info = get(client, job).await?;
        match info.state_code.as_str() {
            "R" => return Ok(info),
            code if is_final(code) => bail!("job {job} ended {} before it started", info.state),
            _ => {}
        }
        if !said && started.elapsed() > Duration::from_millis(500) {
            eprintln!("{who}: job {job} queued and waiting for resources");
            said = true;
        }
        if let Some(limit) = immediate
            && started.elapsed() >= Duration::from_secs(limit)
        {
            bail!(
                "unable to allocate resources: the job did not start within {limit} s (--immediate)"
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = interrupt.recv() => bail!("interrupted while waiting for resources"),
            _ = terminate.recv() => bail!("terminated while waiting for resources"),
        }
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// The job `job`, read linearizably.
pub(crate) async fn get(client: &Client, job: u64) -> Result<pb::JobInfo> {
    rpc!(
        client,
        jobs_read,
        get_job,
        pb::GetJobRequest {
            job_id: job,
            consistency: 0,
        }
    )
    .await
}

async fn cancel(client: &Client, job: u64) -> Result<()> {
    rpc!(
        client,
        jobs_call,
        cancel_jobs,
        pb::JobsRequest {
            jobs: vec![pb::JobRef {
                job_id: job,
                task: None,
            }],
        }
    )
    .await
    .map(|_| ())
}

/// Whether the allocation still runs (it may have hit its time limit or been cancelled).
pub async fn still_running(client: &Client, job: u64) -> bool {
    get(client, job)
        .await
        .is_ok_and(|i| matches!(i.state_code.as_str(), "R" | "S"))
}

/// Ends the allocation with `status` (an exit code, or 128 + a signal).
pub async fn complete(client: &Client, job: u64, status: u8) -> Result<()> {
    let (exit_code, signal) = if status > 128 {
        (0, i32::from(status - 128))
    } else {
        (i32::from(status), 0)
    };
    let r = rpc!(
        client,
        jobs_call,
        complete_job,
        pb::CompleteJobRequest {
            job_id: job,
            exit_code,
            signal,
        }
    )
    .await;
    match r {
        Ok(_) => Ok(()),
        // It ended on its own (time limit, scancel): nothing to complete.
        Err(e) if !still_running(client, job).await => {
            let _ = e;
            Ok(())
        }
        Err(e) => Err(anyhow!("completing job {job}: {e:#}")),
    }
}

/// The variables a command inside the allocation sees, as Slurm's salloc sets them.
pub fn environment(a: &Allocation) -> Vec<(String, String)> {
    let id = a.job.to_string();
    let mut env = vec![
        ("SLURM_JOB_ID", id.clone()),
        ("SLURM_JOBID", id),
        ("SLURM_JOB_NAME", a.info.name.clone()),
        ("SLURM_JOB_NODELIST", a.info.node_list.clone()),
        ("SLURM_NODELIST", a.info.node_list.clone()),
        ("SLURM_JOB_NUM_NODES", a.info.nodes.to_string()),
        ("SLURM_NNODES", a.info.nodes.to_string()),
        ("SLURM_NTASKS", a.ntasks.to_string()),
        ("SLURM_NPROCS", a.ntasks.to_string()),
        ("SLURM_JOB_PARTITION", a.info.partition.clone()),
        ("SLURM_JOB_ACCOUNT", a.info.account.clone()),
        ("SLURM_SUBMIT_DIR", a.info.work_dir.clone()),
    ];
    if let Some(c) = a.cpus_per_task {
        env.push(("SLURM_CPUS_PER_TASK", c.to_string()));
    }
    env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}
