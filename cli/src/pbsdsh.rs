//! `pbsdsh`: a command on the nodes of the PBS job it runs in (PBS Pro's pbsdsh(1B)).
//!
//! Inside a job (`PBS_JOBID`, or Slurm's `SLURM_JOB_ID`), pbsdsh starts one copy of the
//! program per task slot of the job (a `select` chunk each), spread over its nodes; `-n I`
//! only on the node at index I of the job's node list; `-c N` N copies spread over the
//! nodes; `-s` one copy at a time, each ending before the next starts. Each copy is a task of
//! a job step, so it runs confined in the job's cgroups as the user, sees `PBS_TASKNUM`,
//! `PBS_NODENUM` and `PBS_VNODENUM` (and Slurm's step variables), and its output comes back
//! to pbsdsh's. The exit status is the highest of the copies'. Copies share the job's cpus
//! (`--overlap`): several pbsdsh may run at once, as in PBS.

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;

use crate::client::Client;
use crate::srun::SrunArgs;

/// pbsdsh's options, as PBS spells them.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "pbsdsh",
    about = "Run a program on the nodes of the job",
    trailing_var_arg = true
)]
pub struct PbsdshArgs {
    /// Copies of the program, spread over the job's nodes.
    #[arg(short = 'c', conflicts_with = "node")]
    pub copies: Option<u32>,
    /// Only on the node at this index (from 0) of the job's node list.
    #[arg(short = 'n')]
    pub node: Option<u32>,
    /// One copy at a time.
    #[arg(short = 's')]
    pub serial: bool,
    /// Say what is started and what failed.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Accepted: pbsdsh always waits for its copies.
    #[arg(short = 'o')]
    pub no_wait: bool,
    #[arg(long)]
    pub addr: Option<String>,
    /// The program and its arguments.
    #[arg(required = true)]
    pub command: Vec<String>,
}

/// `pbsdsh`: the highest exit status of its copies (1 when they could not run).
pub fn main(args: PbsdshArgs) -> u8 {
    crate::client::status_of("pbsdsh", run(&args))
}

/// The job pbsdsh runs in: `PBS_JOBID` (`12` or `12.server`), else `SLURM_JOB_ID`.
fn job_id(env: &dyn Fn(&str) -> Option<String>) -> Result<u64> {
    let raw = env("PBS_JOBID")
        .or_else(|| env("SLURM_JOB_ID"))
        .ok_or_else(|| anyhow!("not inside a job: neither PBS_JOBID nor SLURM_JOB_ID is set"))?;
    let id = raw.split('.').next().unwrap_or(&raw);
    id.parse()
        .map_err(|_| anyhow!("PBS_JOBID {raw:?} is not a job id"))
}

/// The steps to run, each as srun's options: one step for every copy, or one per copy in
/// turn with `-s`.
fn plan(args: &PbsdshArgs, nodes: &[String], slots: u32) -> Result<Vec<Vec<String>>> {
    if nodes.is_empty() {
        bail!("the job's node list is empty");
    }
    let nnodes = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
    let on = |node: &str, n: u32| {
        vec![
            "-N".to_owned(),
            "1".to_owned(),
            "-n".to_owned(),
            n.to_string(),
            "-w".to_owned(),
            node.to_owned(),
        ]
    };
    if let Some(i) = args.node {
        let node = nodes.get(i as usize).ok_or_else(|| {
            anyhow!(
                "-n {i}: the job has {} nodes (indexes 0-{})",
                nodes.len(),
                nnodes - 1
            )
        })?;
        return Ok(vec![on(node, 1)]);
    }
    let copies = args.copies.unwrap_or(slots).max(1);
    const MAX_COPIES: u32 = 65_536;
    if copies > MAX_COPIES {
        bail!("-c {copies}: the limit is {MAX_COPIES} copies");
    }
    if args.serial {
        return Ok((0..copies)
            .map(|k| on(&nodes[(k % nnodes) as usize], 1))
            .collect());
    }
    Ok(vec![vec![
        "-N".to_owned(),
        copies.min(nnodes).to_string(),
        "-n".to_owned(),
        copies.to_string(),
    ]])
}

fn run(args: &PbsdshArgs) -> Result<u8> {
    let env = |k: &str| std::env::var(k).ok();
    let job = job_id(&env)?;
    let nodelist = env("SLURM_JOB_NODELIST")
        .ok_or_else(|| anyhow!("SLURM_JOB_NODELIST is not set: is this inside a job?"))?;
    let nodes = docket_core::hostlist::expand(&nodelist)
        .map_err(|e| anyhow!("SLURM_JOB_NODELIST {nodelist:?}: {e}"))?;
    let slots = env("SLURM_NTASKS")
        .and_then(|n| n.parse().ok())
        .unwrap_or(u32::try_from(nodes.len()).unwrap_or(1));
    let steps = plan(args, &nodes, slots)?;
    let client = Client::new(args.addr.as_deref())?;
    let runtime = crate::client::runtime()?;
    let mut highest = 0;
    for shape in steps {
        if args.verbose {
            eprintln!(
                "pbsdsh: spawning {} ({})",
                args.command.join(" "),
                shape.join(" ")
            );
        }
        let step = SrunArgs::try_parse_from(
            ["srun", "--overlap", "-c", "1", "--input", "none"]
                .into_iter()
                .map(str::to_owned)
                .chain(shape)
                .chain(std::iter::once("--".to_owned()))
                .chain(args.command.iter().cloned()),
        )
        .context("the copies' step")?;
        let status = crate::srun::run_step(
            &step,
            &client,
            &runtime,
            job,
            crate::srun::Input::None,
            &env,
            &[],
        );
        match status {
            Ok(code) => highest = highest.max(code),
            Err(e) => {
                runtime.shutdown_background();
                return Err(e);
            }
        }
    }
    if args.verbose && highest != 0 {
        eprintln!("pbsdsh: a copy exited with status {highest}");
    }
    runtime.shutdown_background();
    Ok(highest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> PbsdshArgs {
        PbsdshArgs::try_parse_from(["pbsdsh"].iter().chain(extra).chain(&["--", "hostname"]))
            .unwrap()
    }

    #[test]
    fn copies_spread_over_the_nodes_as_pbs_places_them() {
        let nodes = vec!["n01".to_owned(), "n02".to_owned()];
        // One per slot by default, over every node.
        assert_eq!(
            plan(&args(&[]), &nodes, 4).unwrap(),
            [["-N", "2", "-n", "4"]]
        );
        // -c: that many, over as many nodes as they cover.
        assert_eq!(
            plan(&args(&["-c", "1"]), &nodes, 4).unwrap(),
            [["-N", "1", "-n", "1"]]
        );
        // -n: the node at that index only.
        assert_eq!(
            plan(&args(&["-n", "1"]), &nodes, 4).unwrap(),
            [["-N", "1", "-n", "1", "-w", "n02"]]
        );
        let e = plan(&args(&["-n", "2"]), &nodes, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the job has 2 nodes"), "{e}");
        // -s: one step per copy, round the nodes.
        let serial = plan(&args(&["-s", "-c", "3"]), &nodes, 4).unwrap();
        let on: Vec<&str> = serial.iter().map(|s| s[5].as_str()).collect();
        assert_eq!(on, ["n01", "n02", "n01"]);
        assert!(plan(&args(&["-c", "100000"]), &nodes, 4).is_err());
        assert!(PbsdshArgs::try_parse_from(["pbsdsh", "-c", "2", "-n", "1", "x"]).is_err());
        assert!(plan(&args(&["-s"]), &[], 4).is_err());
    }

    #[test]
    fn the_job_comes_from_pbs_or_slurm() {
        let pbs = |k: &str| (k == "PBS_JOBID").then(|| "12.docket".to_owned());
        assert_eq!(job_id(&pbs).unwrap(), 12);
        let slurm = |k: &str| (k == "SLURM_JOB_ID").then(|| "7".to_owned());
        assert_eq!(job_id(&slurm).unwrap(), 7);
        assert!(job_id(&|_: &str| None).is_err());
    }
}
