//! PBS's interactive jobs: `qsub -I [options] [-- command args]`.
//!
//! As in PBS Pro, qsub waits for the job to start ("qsub: waiting for job 12.docket to
//! start", "qsub: job 12.docket ready"), then runs a login shell — or the command after `--` —
//! on the job's first node on a terminal of its own, and the job ends when it exits ("qsub:
//! job 12.docket completed") with its exit status. Docket builds it from the pieces `salloc`
//! and `srun --pty` use: an interactive allocation ([`crate::allocation`]) with the resources
//! of the `-l` options, and in it a one-task step on a terminal. The shell starts in the
//! user's home directory, with PBS's variables (`PBS_JOBID`, `PBS_O_WORKDIR`,
//! `PBS_ENVIRONMENT=PBS_INTERACTIVE`, ...) beside Slurm's.

use anyhow::{Context, Result, bail};
use clap::Parser;

use crate::client::Client;
use crate::pbs::{QsubArgs, job_spec, server};
use crate::srun::SrunArgs;

/// What runs when no command follows `--`: the user's login shell.
const LOGIN_SHELL: [&str; 3] = ["/bin/sh", "-c", "exec \"${SHELL:-/bin/sh}\" -l"];

/// `qsub -I`: its exit status is the shell's (1 when it could not run).
pub fn main(cli: QsubArgs) -> u8 {
    crate::client::status_of("qsub", run(&cli))
}

fn run(cli: &QsubArgs) -> Result<u8> {
    if cli.x11 {
        bail!("-X: Docket forwards no X11 display");
    }
    if cli.script.is_some() {
        bail!("-I takes no script: a shell (or the command after --) runs on the job's node");
    }
    if !cli.array.as_deref().unwrap_or_default().is_empty() {
        bail!("-I: an interactive job cannot be an array (-J)");
    }
    let cwd = std::env::current_dir()
        .context("the current directory")?
        .display()
        .to_string();
    let mut spec = job_spec(cli, "#!/bin/sh\n", &cwd)?;
    if cli.name.is_none() {
        spec.name = "STDIN".into();
    }
    let client = Client::new(cli.addr.as_deref())?;
    let runtime = crate::client::runtime()?;
    let alloc = crate::allocation::allocate_spec(&client, &runtime, spec, (1, None), "qsub", None)?;
    let job = alloc.job;
    let command: Vec<String> = if cli.command.is_empty() {
        LOGIN_SHELL.iter().map(|s| (*s).to_owned()).collect()
    } else {
        cli.command.clone()
    };
    let home = std::env::var("HOME").unwrap_or_else(|_| cwd.clone());
    let step = SrunArgs::try_parse_from(
        ["srun", "--pty", "-n", "1", "-N", "1", "-D", &home, "--"]
            .into_iter()
            .map(str::to_owned)
            .chain(command),
    )
    .context("the interactive step")?;
    let pbs = [
        ("PBS_JOBID", job.to_string()),
        ("PBS_JOBNAME", alloc.info.name.clone()),
        ("PBS_QUEUE", alloc.info.partition.clone()),
        ("PBS_O_WORKDIR", cwd),
        ("PBS_ENVIRONMENT", "PBS_INTERACTIVE".to_owned()),
    ]
    .map(|(k, v)| (k.to_owned(), v));
    let outcome = crate::srun::run_completing(
        &step,
        &client,
        &runtime,
        &alloc,
        crate::srun::Input::Task0,
        &pbs,
    );
    runtime.shutdown_background();
    let code = outcome?;
    eprintln!("qsub: job {job}.{} completed", server());
    Ok(code)
}
