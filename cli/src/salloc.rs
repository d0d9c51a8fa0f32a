//! `salloc`: an interactive allocation, and a command run on this host inside it.
//!
//! As Slurm's salloc(1): the job waits in the queue like any other ("Pending job allocation
//! J", "Granted job allocation J"); the command (default: the user's shell) runs here with
//! the allocation's `SLURM_*` variables, so that `srun` inside it starts tasks on the
//! allocated nodes; when it exits the allocation is completed with its exit status
//! ("Relinquishing job allocation J") and salloc exits with that status. If the allocation
//! ends first (time limit, `scancel`), the command is sent SIGHUP, as Slurm does.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;

use crate::allocation;
use crate::client::Client;
use crate::sbatch::SbatchArgs;

/// salloc's options: sbatch's resource options, then the command.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "salloc",
    about = "Obtain a job allocation and run a command in it",
    trailing_var_arg = true
)]
pub struct SallocArgs {
    #[arg(short = 'J', long = "job-name")]
    pub job_name: Option<String>,
    #[arg(short = 'p', long)]
    pub partition: Option<String>,
    #[arg(short = 'A', long)]
    pub account: Option<String>,
    #[arg(short = 'q', long)]
    pub qos: Option<String>,
    #[arg(short = 'N', long)]
    pub nodes: Option<u32>,
    #[arg(short = 'n', long)]
    pub ntasks: Option<u32>,
    #[arg(short = 'c', long = "cpus-per-task")]
    pub cpus_per_task: Option<u32>,
    #[arg(long = "ntasks-per-node")]
    pub ntasks_per_node: Option<u32>,
    #[arg(long)]
    pub mem: Option<String>,
    #[arg(long = "mem-per-cpu")]
    pub mem_per_cpu: Option<String>,
    #[arg(short = 't', long)]
    pub time: Option<String>,
    #[arg(short = 'w', long)]
    pub nodelist: Option<String>,
    #[arg(short = 'x', long)]
    pub exclude: Option<String>,
    #[arg(short = 'C', long)]
    pub constraint: Option<String>,
    #[arg(long)]
    pub exclusive: bool,
    #[arg(long)]
    pub gres: Option<String>,
    #[arg(long = "gpus-per-node")]
    pub gpus_per_node: Option<u32>,
    /// Give up unless the allocation starts within this many seconds (default: at once).
    #[arg(short = 'I', long, num_args = 0..=1, default_missing_value = "1", require_equals = true)]
    pub immediate: Option<u64>,
    /// Controllers, host:port,... (default: DOCKET_ADDR).
    #[arg(long)]
    pub addr: Option<String>,
    /// The command and its arguments (default: $SHELL, else /bin/sh).
    pub command: Vec<String>,
}

impl SallocArgs {
    /// The job's options, as sbatch would take them.
    pub fn job_options(&self) -> SbatchArgs {
        SbatchArgs {
            job_name: self.job_name.clone(),
            partition: self.partition.clone(),
            account: self.account.clone(),
            qos: self.qos.clone(),
            nodes: self.nodes,
            ntasks: self.ntasks,
            cpus_per_task: self.cpus_per_task,
            ntasks_per_node: self.ntasks_per_node,
            mem: self.mem.clone(),
            mem_per_cpu: self.mem_per_cpu.clone(),
            time: self.time.clone(),
            nodelist: self.nodelist.clone(),
            exclude: self.exclude.clone(),
            constraint: self.constraint.clone(),
            exclusive: self.exclusive,
            gres: self.gres.clone(),
            gpus_per_node: self.gpus_per_node,
            addr: self.addr.clone(),
            ..Default::default()
        }
    }
}

/// `salloc`: the command's exit status (1 when no allocation was granted).
pub fn main(args: SallocArgs) -> u8 {
    crate::client::status_of("salloc", run(args))
}

fn run(args: SallocArgs) -> Result<u8> {
    let client = Client::new(args.addr.as_deref())?;
    let runtime = crate::client::runtime()?;
    let alloc = allocation::allocate(
        &client,
        &runtime,
        &args.job_options(),
        "salloc",
        args.immediate,
    )?;
    let command = if args.command.is_empty() {
        vec![std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into())]
    } else {
        args.command.clone()
    };
    let mut child = std::process::Command::new(&command[0]);
    child
        .args(&command[1..])
        .envs(allocation::environment(&alloc));
    let status = runtime.block_on(async {
        // salloc itself ignores Ctrl-C while its command runs: the command (a shell, srun)
        // decides what an interrupt means.
        let mut interrupt =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        let mut child = tokio::process::Command::from(child)
            .spawn()
            .with_context(|| format!("running {}", command[0]))?;
        let mut check = tokio::time::interval(Duration::from_secs(5));
        check.tick().await;
        let mut revoked = false;
        loop {
            tokio::select! {
                status = child.wait() => break status.context("waiting for the command"),
                _ = interrupt.recv() => {}
                _ = check.tick(), if !revoked => {
                    if !allocation::still_running(&client, alloc.job).await {
                        eprintln!("salloc: Job allocation {} has been revoked.", alloc.job);
                        revoked = true;
                        if let Some(pid) = child.id() {
                            let _ = nix::sys::signal::kill(
                                nix::unistd::Pid::from_raw(pid as i32),
                                nix::sys::signal::Signal::SIGHUP,
                            );
                        }
                    }
                }
            }
        }
    });
    let code = match &status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => c.clamp(0, 255) as u8,
            (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
            _ => 1,
        },
        Err(_) => 1,
    };
    eprintln!("salloc: Relinquishing job allocation {}", alloc.job);
    runtime.block_on(allocation::complete(&client, alloc.job, code))?;
    status?;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_before_the_command_are_salloc_s_and_the_rest_is_the_command() {
        let a = SallocArgs::try_parse_from([
            "salloc", "-N", "2", "-n", "4", "-t", "10", "srun", "-n", "2", "hostname",
        ])
        .unwrap();
        assert_eq!(a.nodes, Some(2));
        assert_eq!(a.command, ["srun", "-n", "2", "hostname"]);
        let o = a.job_options();
        assert_eq!(
            (o.nodes, o.ntasks, o.time.as_deref()),
            (Some(2), Some(4), Some("10"))
        );
        let bare = SallocArgs::try_parse_from(["salloc", "-I"]).unwrap();
        assert_eq!(bare.immediate, Some(1));
        assert!(bare.command.is_empty());
    }
}
