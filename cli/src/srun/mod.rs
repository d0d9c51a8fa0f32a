//! `srun`: runs a job step's tasks on the nodes of the job's allocation (Slurm's srun(1)).
//!
//! Outside a job, srun first asks for an allocation of the step's shape
//! ([`crate::allocation`]), runs the step in it and completes it with the step's status.
//!
//! Inside an allocation (`SLURM_JOB_ID` is set, as in a batch script) srun asks the leader to
//! create a step (`Jobs.CreateStep`): the replicated state places its tasks on the
//! allocation's nodes and holds their cpus, or answers that it must wait for cpus other steps
//! hold (srun waits, as Slurm's "step creation temporarily disabled, retrying", or gives up
//! with `--immediate`). srun then starts the tasks through each node's agent and carries
//! their I/O ([`attach`]): output back, labelled with `-l`; standard input to task 0;
//! Ctrl-C and SIGTERM to every task; with `--pty`, task 0 on a terminal of its own
//! ([`terminal`]). Its exit status is the highest of its tasks'.
//!
//! srun returns only once the leader has recorded the step's end, or after
//! [`RECORDED_END_WAIT`]: its tasks' exits reach it straight from their agents, each agent
//! reports the step's end to the leader on its own, and a batch script whose last srun had
//! returned before the other nodes' reports could end the job first, leaving the step
//! recorded as cancelled by the job's end instead of how it ended (`sacct` after a
//! workflow's last step would show it so).
//!
//! The step's secret — 32 random bytes only this process holds — is what lets it attach: the
//! leader keeps only its SHA-256, and the agents accept the tasks' launch only from whoever
//! presents the secret, over TLS to the node's own certificate.

mod attach;
mod terminal;

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use docket_core::quantity::{SlurmDuration, parse_duration};
use docket_proto::v1 as pb;
use sha2::{Digest, Sha256};

use crate::client::{Client, rpc};

/// srun's options, as Slurm spells them.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "srun",
    about = "Run a parallel job step",
    trailing_var_arg = true
)]
pub struct SrunArgs {
    /// Number of tasks.
    #[arg(short = 'n', long = "ntasks")]
    pub ntasks: Option<u32>,
    /// Number of nodes (a count; Slurm's min-max form takes its minimum).
    #[arg(short = 'N', long = "nodes")]
    pub nodes: Option<String>,
    #[arg(long = "ntasks-per-node")]
    pub ntasks_per_node: Option<u32>,
    /// Cpus per task.
    #[arg(short = 'c', long = "cpus-per-task")]
    pub cpus_per_task: Option<u32>,
    /// Nodes of the allocation to run on (a host list).
    #[arg(short = 'w', long = "nodelist")]
    pub nodelist: Option<String>,
    /// The step's cpus are its own (the default since Slurm 21.08).
    #[arg(long)]
    pub exclusive: bool,
    /// Share cpus with other steps.
    #[arg(long)]
    pub overlap: bool,
    /// Accepted for compatibility; tasks run on the job's cpus without per-task binding.
    #[arg(long = "cpu-bind", alias = "cpu_bind")]
    pub cpu_bind: Option<String>,
    /// Prefix each output line with its task id.
    #[arg(short = 'l', long)]
    pub label: bool,
    /// Output file pattern (%t %n %N %j %s %J %u).
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// Error file pattern.
    #[arg(short = 'e', long)]
    pub error: Option<String>,
    /// Kill the step when a task exits non-zero (`-K` alone means 1).
    #[arg(
        short = 'K',
        long = "kill-on-bad-exit",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "1"
    )]
    pub kill_on_bad_exit: Option<u8>,
    /// Environment for the tasks: ALL (default), NONE, or NAME[=value] list (with ALL,...).
    #[arg(long, default_value = "ALL")]
    pub export: String,
    /// MPI plugin: `none` (launchers start their own daemons with srun).
    #[arg(long)]
    pub mpi: Option<String>,
    /// Task 0 runs on a terminal of its own (`srun --pty bash`): srun's terminal is raw
    /// until it ends and its keys, size and output go to and come from that terminal; the
    /// other tasks' output is discarded.
    #[arg(long)]
    pub pty: bool,
    /// Accepted for compatibility: output is never buffered by srun.
    #[arg(short = 'u', long)]
    pub unbuffered: bool,
    /// Step name.
    #[arg(short = 'J', long = "job-name")]
    pub job_name: Option<String>,
    /// Step time limit.
    #[arg(short = 't', long)]
    pub time: Option<String>,
    /// Fail at once instead of waiting for cpus other steps hold (the value is accepted).
    #[arg(
        short = 'I',
        long,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "0"
    )]
    pub immediate: Option<u64>,
    /// Working directory of the tasks.
    #[arg(short = 'D', long)]
    pub chdir: Option<String>,
    /// Where standard input goes: `all` or `0` (task 0; Slurm's `all` would copy it to every
    /// task) or `none` (MPICH's Hydra starts its proxies with `--input none`).
    #[arg(short = 'i', long = "input")]
    pub input: Option<String>,
    /// Accepted for launchers that pass them (Open MPI's prterun: `--mem-per-cpu=0`): a
    /// step's memory is its job's.
    #[arg(long = "mem-per-cpu", hide = true)]
    pub mem_per_cpu: Option<String>,
    #[arg(long = "mem", hide = true)]
    pub mem: Option<String>,
    /// Outside a job: the partition, account and QOS of the allocation srun asks for.
    #[arg(short = 'p', long)]
    pub partition: Option<String>,
    #[arg(short = 'A', long)]
    pub account: Option<String>,
    #[arg(short = 'q', long)]
    pub qos: Option<String>,
    /// The job to run in (default: SLURM_JOB_ID).
    #[arg(long)]
    pub jobid: Option<u64>,
    /// Quieter (accepted).
    #[arg(short = 'Q', long)]
    pub quiet: bool,
    /// More verbose (accepted).
    #[arg(short = 'v', long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Controller address(es).
    #[arg(long, env = "DOCKET_ADDR")]
    pub addr: Option<String>,
    /// The command and its arguments.
    #[arg(required = true)]
    pub command: Vec<String>,
}

/// The job srun runs in.
fn job_id(args: &SrunArgs) -> Result<u64> {
    if let Some(j) = args.jobid {
        return Ok(j);
    }
    match std::env::var("SLURM_JOB_ID").or_else(|_| std::env::var("SLURM_JOBID")) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| anyhow!("SLURM_JOB_ID={v:?} is not a job id")),
        Err(_) => bail!("no job: SLURM_JOB_ID is not set and no --jobid was given"),
    }
}

/// The tasks' environment from `--export`.
pub fn exported(spec: &str, env: &[(String, String)]) -> Result<Vec<String>> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (i, item) in spec.split(',').map(str::trim).enumerate() {
        match item {
            "ALL" if i == 0 => out.extend(env.iter().cloned()),
            "NONE" if i == 0 => {}
            "" => {}
            "ALL" | "NONE" => bail!("--export: {item} must come first"),
            _ => match item.split_once('=') {
                Some((k, v)) => {
                    out.retain(|(name, _)| name != k);
                    out.push((k.to_owned(), v.to_owned()));
                }
                None => {
                    if let Some((k, v)) = env.iter().find(|(k, _)| k == item) {
                        out.retain(|(name, _)| name != k);
                        out.push((k.clone(), v.clone()));
                    }
                }
            },
        }
    }
    Ok(out.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
}

/// The step request from the options; `env` reads srun's environment (inside a batch
/// script, a step with no shape of its own takes the job's: `SLURM_NTASKS` tasks on
/// `SLURM_NNODES` nodes, each with `SLURM_CPUS_PER_TASK` cpus, as Slurm's srun does).
pub fn request(
    args: &SrunArgs,
    job: u64,
    io_key: Vec<u8>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<pb::CreateStepRequest> {
    let from_env = |name: &str| env(name).and_then(|v| v.trim().parse::<u32>().ok());
    let shapeless = args.ntasks.is_none()
        && args.nodes.is_none()
        && args.nodelist.is_none()
        && args.ntasks_per_node.is_none();
    let (ntasks, job_nodes) = if shapeless {
        (from_env("SLURM_NTASKS"), from_env("SLURM_NNODES"))
    } else {
        (args.ntasks, None)
    };
    let cpus_per_task = args
        .cpus_per_task
        .or_else(|| from_env("SLURM_CPUS_PER_TASK"))
        .unwrap_or(0);
    let nodes = args.min_nodes()?;
    let time_limit_seconds = match &args.time {
        None => 0,
        Some(t) => match parse_duration(t).map_err(|e| anyhow!("--time: {e}"))? {
            SlurmDuration::Unlimited => 0,
            SlurmDuration::Limit(s) => s.0,
        },
    };
    let nodelist = match &args.nodelist {
        None => Vec::new(),
        Some(list) => {
            docket_core::hostlist::expand(list).map_err(|e| anyhow!("--nodelist {list:?}: {e}"))?
        }
    };
    let name = args.job_name.clone().unwrap_or_else(|| {
        let program = args.command.first().map(String::as_str).unwrap_or("step");
        program.rsplit('/').next().unwrap_or(program).to_owned()
    });
    Ok(pb::CreateStepRequest {
        job_id: job,
        name,
        ntasks,
        nodes: nodes.or(job_nodes),
        ntasks_per_node: args.ntasks_per_node,
        cpus_per_task,
        nodelist,
        overlap: args.overlap,
        time_limit_seconds,
        io_key,
    })
}

/// Creates the step, waiting while the allocation's cpus are held by other steps.
async fn create(
    client: &Client,
    req: pb::CreateStepRequest,
    immediate: bool,
) -> Result<pb::CreateStepResponse> {
    let mut said = false;
    loop {
        let answer = client
            .jobs_call_or_busy(|mut c| {
                let r = client.request(req.clone());
                async move { c.create_step(r).await }
            })
            .await?;
        match answer {
            Ok(created) => return Ok(created),
            Err(busy) if immediate => {
                bail!(
                    "unable to create step for job {}: {}",
                    req.job_id,
                    busy.message()
                )
            }
            Err(busy) => {
                if !said {
                    eprintln!(
                        "srun: Job {} step creation temporarily disabled, retrying ({})",
                        req.job_id,
                        busy.message()
                    );
                    said = true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }
}

/// Which tasks read srun's standard input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Input {
    /// None: they read /dev/null.
    None,
    /// Task 0 only.
    Task0,
    /// A copy to every task (Slurm's default).
    All,
}

/// Which tasks get srun's standard input, from `--input` (srun(1): by default, all).
fn stdin_wanted(input: Option<&str>) -> Result<Input> {
    match input {
        None | Some("all") => Ok(Input::All),
        Some("0") => Ok(Input::Task0),
        Some("none") => Ok(Input::None),
        Some(other) => bail!("--input {other:?}: Docket's srun takes all, 0 or none"),
    }
}

/// `srun`: its exit status is the highest of its tasks' (or 1 when it could not run them).
pub fn main(args: SrunArgs) -> u8 {
    crate::client::status_of("srun", run(args))
}

fn run(args: SrunArgs) -> Result<u8> {
    if let Some(m) = &args.mpi
        && m != "none"
    {
        eprintln!("srun: warning: --mpi={m}: only 'none' is supported; tasks get no PMI");
    }
    let stdin = stdin_wanted(args.input.as_deref())?;
    let client = Client::new(args.addr.as_deref())?;
    let runtime = crate::client::runtime()?;
    let outcome = if inside_allocation(&args) {
        job_id(&args).and_then(|job| {
            run_step(
                &args,
                &client,
                &runtime,
                job,
                stdin,
                &|k| std::env::var(k).ok(),
                &[],
            )
        })
    } else {
        run_allocated(&args, &client, &runtime, stdin)
    };
    // A read of srun's standard input may still wait for a key that never comes (a terminal
    // after the remote shell exited): srun is done, so it does not wait for it.
    runtime.shutdown_background();
    outcome
}

/// Whether srun runs in an existing job (`--jobid`, or `SLURM_JOB_ID` as in a batch script
/// or under salloc).
fn inside_allocation(args: &SrunArgs) -> bool {
    args.jobid.is_some()
        || std::env::var_os("SLURM_JOB_ID").is_some()
        || std::env::var_os("SLURM_JOBID").is_some()
}

/// srun outside a job: an allocation of the step's shape, the step in it, and the
/// allocation completed with the step's exit status.
fn run_allocated(
    args: &SrunArgs,
    client: &Client,
    runtime: &tokio::runtime::Runtime,
    stdin: Input,
) -> Result<u8> {
    let alloc = crate::allocation::allocate(
        client,
        runtime,
        &args.job_options()?,
        "srun",
        args.immediate,
    )?;
    run_completing(args, client, runtime, &alloc, stdin, &[])
}

/// Runs the step `args` describe in the interactive allocation `alloc` (with its `SLURM_*`
/// variables, and `extra` for the tasks) and completes the allocation with the step's
/// status (1 when it could not run).
pub(crate) fn run_completing(
    args: &SrunArgs,
    client: &Client,
    runtime: &tokio::runtime::Runtime,
    alloc: &crate::allocation::Allocation,
    stdin: Input,
    extra: &[(String, String)],
) -> Result<u8> {
    let env = crate::allocation::environment(alloc);
    let lookup = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let outcome = run_step(args, client, runtime, alloc.job, stdin, &lookup, extra);
    let status = match &outcome {
        Ok(code) => *code,
        Err(_) => 1,
    };
    runtime.block_on(crate::allocation::complete(client, alloc.job, status))?;
    outcome
}

impl SrunArgs {
    /// `-N`'s minimum (`-N 2` or `-N 2-4`).
    fn min_nodes(&self) -> Result<Option<u32>> {
        self.nodes
            .as_deref()
            .map(|n| {
                let min = n.split('-').next().unwrap_or(n);
                min.parse::<u32>()
                    .map_err(|_| anyhow!("--nodes {n:?}: not a node count"))
            })
            .transpose()
    }

    /// The allocation srun asks for outside a job: its own shape and limits.
    fn job_options(&self) -> Result<crate::sbatch::SbatchArgs> {
        let nodes = self.min_nodes()?;
        Ok(crate::sbatch::SbatchArgs {
            job_name: self.job_name.clone().or_else(|| {
                let program = self.command.first().map(String::as_str).unwrap_or("srun");
                Some(program.rsplit('/').next().unwrap_or(program).to_owned())
            }),
            partition: self.partition.clone(),
            account: self.account.clone(),
            qos: self.qos.clone(),
            nodes,
            ntasks: self.ntasks,
            cpus_per_task: self.cpus_per_task,
            ntasks_per_node: self.ntasks_per_node,
            mem: self.mem.clone(),
            mem_per_cpu: self.mem_per_cpu.clone(),
            time: self.time.clone(),
            nodelist: self.nodelist.clone(),
            exclusive: self.exclusive,
            addr: self.addr.clone(),
            ..Default::default()
        })
    }
}

/// Creates the step in `job` and runs it to its end; `env` reads the allocation's
/// variables (srun's own environment inside a job), `extra` adds to the tasks' environment.
pub(crate) fn run_step(
    args: &SrunArgs,
    client: &Client,
    runtime: &tokio::runtime::Runtime,
    job: u64,
    stdin: Input,
    env: &dyn Fn(&str) -> Option<String>,
    extra: &[(String, String)],
) -> Result<u8> {
    let mut secret = [0u8; 32];
    rand::fill(&mut secret);
    let req = request(args, job, Sha256::digest(secret).to_vec(), env)?;
    let vars: Vec<(String, String)> = std::env::vars().collect();
    let mut environment = exported(&args.export, &vars)?;
    environment.extend(extra.iter().map(|(k, v)| format!("{k}={v}")));
    let work_dir = match &args.chdir {
        Some(d) => d.clone(),
        None => std::env::current_dir()
            .context("the current directory")?
            .display()
            .to_string(),
    };
    runtime.block_on(async {
        let created = create(client, req, args.immediate.is_some()).await?;
        let launch = pb::LaunchTasks {
            job_id: job,
            step_id: created.step_id,
            secret: secret.to_vec(),
            argv: args.command.clone(),
            environment,
            work_dir,
            stdout: args.output.clone().unwrap_or_default(),
            stderr: args.error.clone().unwrap_or_default(),
            // --pty: task 0's terminal takes it all.
            stdin: stdin == Input::Task0 || args.pty,
            stdin_all: stdin == Input::All && !args.pty,
            pty: args.pty.then(terminal::size),
        };
        let options = attach::Options {
            label: args.label && !args.pty,
            pty: args.pty,
            kill_on_bad_exit: args.kill_on_bad_exit.unwrap_or(0) != 0,
        };
        let outcome = attach::run(client, &created, launch, options).await;
        if outcome.is_ok() {
            await_recorded_end(client, job, created.step_id).await;
        }
        if outcome.is_err() {
            // Tasks that did start are stopped with the step.
            let cancel = pb::CancelStepsRequest {
                steps: vec![pb::StepRef {
                    job_id: job,
                    step_id: created.step_id,
                }],
            };
            let _ = rpc!(client, jobs_call, cancel_steps, cancel.clone()).await;
        }
        outcome
    })
}

/// The longest srun waits, after its tasks ended, for the leader to record the step's end
/// (agents report within milliseconds; one that cannot reach the leader must not hold srun).
pub(crate) const RECORDED_END_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether a step's recorded state is final, as the replicated state decides it
/// (`JobState::is_terminal`); an unknown state is not.
fn step_ended(state: i32) -> bool {
    pb::JobState::try_from(state)
        .ok()
        .and_then(|s| s.as_str_name().strip_prefix("JOB_STATE_"))
        .and_then(docket_core::job::JobState::parse)
        .is_some_and(docket_core::job::JobState::is_terminal)
}

/// Waits until the leader has recorded step `step` of `job` as ended (or the job and its
/// steps are gone), for at most [`RECORDED_END_WAIT`]; reads are linearizable, so an end
/// seen is an end committed.
async fn await_recorded_end(client: &Client, job: u64, step: u32) {
    let deadline = tokio::time::Instant::now() + RECORDED_END_WAIT;
    let mut pause = std::time::Duration::from_millis(2);
    loop {
        match tokio::time::timeout_at(deadline, crate::allocation::get(client, job)).await {
            Ok(Ok(j)) => {
                let live = j
                    .steps
                    .iter()
                    .any(|s| s.step_id == step && !step_ended(s.step_state));
                if !live {
                    return;
                }
            }
            // Unreadable (the job purged, no leader): nothing to wait for here.
            Ok(Err(_)) | Err(_) => return,
        }
        if tokio::time::Instant::now() + pause >= deadline {
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_has_ended_only_in_a_final_state() {
        for live in [
            pb::JobState::Unspecified,
            pb::JobState::Pending,
            pb::JobState::Running,
            pb::JobState::Suspended,
            pb::JobState::Completing,
        ] {
            assert!(!step_ended(live as i32), "{live:?}");
        }
        for ended in [
            pb::JobState::Completed,
            pb::JobState::Failed,
            pb::JobState::Cancelled,
            pb::JobState::Timeout,
            pb::JobState::OutOfMemory,
            pb::JobState::NodeFail,
            pb::JobState::Preempted,
        ] {
            assert!(step_ended(ended as i32), "{ended:?}");
        }
    }

    #[test]
    fn mpi_launchers_command_lines_parse() {
        // MPICH's Hydra (slurm launcher) and Open MPI's prterun start their daemons so.
        let hydra = parse(&[
            "-N",
            "2",
            "-n",
            "2",
            "--nodelist",
            "n01,n02",
            "--input",
            "none",
            "/usr/bin/hydra_pmi_proxy",
            "--control-port",
            "n01:3333",
        ]);
        assert_eq!(stdin_wanted(hydra.input.as_deref()).unwrap(), Input::None);
        assert_eq!(hydra.command[0], "/usr/bin/hydra_pmi_proxy");
        let prte = parse(&[
            "--ntasks-per-node=1",
            "--kill-on-bad-exit",
            "--cpu-bind=none",
            "--mem-per-cpu=0",
            "--nodes=2",
            "--nodelist=n01,n02",
            "--ntasks=2",
            "prted",
            "--debug",
        ]);
        assert_eq!(prte.kill_on_bad_exit, Some(1));
        assert_eq!(prte.command, ["prted", "--debug"]);
        assert_eq!(stdin_wanted(None).unwrap(), Input::All);
        assert_eq!(stdin_wanted(Some("0")).unwrap(), Input::Task0);
        assert!(
            stdin_wanted(Some("3"))
                .unwrap_err()
                .to_string()
                .contains("--input")
        );
    }

    fn parse(args: &[&str]) -> SrunArgs {
        SrunArgs::try_parse_from(std::iter::once("srun").chain(args.iter().copied()))
            .expect("parses")
    }

    #[test]
    fn options_launchers_pass_are_understood() {
        let a = parse(&[
            "-n",
            "4",
            "-N",
            "2",
            "--ntasks-per-node=2",
            "-c",
            "1",
            "-w",
            "n[01-02]",
            "--overlap",
            "--cpu-bind=none",
            "-l",
            "--mpi=none",
            "-u",
            "-J",
            "x",
            "-t",
            "5",
            "--export=ALL",
            "-K",
            "hostname",
            "-f",
        ]);
        let r = request(&a, 7, vec![0; 32], &no_env).expect("request");
        assert_eq!(r.ntasks, Some(4));
        assert_eq!(r.nodes, Some(2));
        assert_eq!(r.ntasks_per_node, Some(2));
        assert_eq!(r.nodelist, vec!["n01", "n02"]);
        assert!(r.overlap);
        assert_eq!(r.time_limit_seconds, 300);
        assert_eq!(r.name, "x");
        assert_eq!(a.kill_on_bad_exit, Some(1));
        assert!(a.label);
        // The command's own options stay the command's.
        assert_eq!(a.command, vec!["hostname", "-f"]);
        let b = parse(&["/usr/bin/env", "-0"]);
        assert_eq!(
            request(&b, 7, vec![], &no_env).expect("request").name,
            "env"
        );
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_step_without_a_shape_takes_the_jobs() {
        let job = |k: &str| match k {
            "SLURM_NTASKS" => Some("4".to_owned()),
            "SLURM_NNODES" => Some("2".to_owned()),
            "SLURM_CPUS_PER_TASK" => Some("2".to_owned()),
            _ => None,
        };
        let r = request(&parse(&["true"]), 7, vec![], &job).expect("request");
        assert_eq!((r.ntasks, r.nodes, r.cpus_per_task), (Some(4), Some(2), 2));
        // Any shape of its own replaces the job's.
        let r = request(&parse(&["-n", "1", "true"]), 7, vec![], &job).expect("request");
        assert_eq!((r.ntasks, r.nodes, r.cpus_per_task), (Some(1), None, 2));
        let r = request(&parse(&["-c", "1", "-w", "n01", "true"]), 7, vec![], &job).expect("r");
        assert_eq!((r.ntasks, r.nodes, r.cpus_per_task), (None, None, 1));
    }

    #[test]
    fn export_follows_slurm() {
        let env = vec![
            ("A".to_owned(), "1".to_owned()),
            ("B".to_owned(), "2".to_owned()),
        ];
        assert_eq!(
            exported("ALL", &env).ok(),
            Some(vec!["A=1".into(), "B=2".into()])
        );
        assert_eq!(exported("NONE", &env).ok(), Some(vec![]));
        assert_eq!(
            exported("B,C=3", &env).ok(),
            Some(vec!["B=2".into(), "C=3".into()])
        );
        assert_eq!(
            exported("ALL,A=9", &env).ok(),
            Some(vec!["B=2".into(), "A=9".into()])
        );
        assert!(exported("A,ALL", &env).is_err());
    }

    #[test]
    fn a_bad_option_names_itself() {
        let a = parse(&["-N", "two", "true"]);
        let e = request(&a, 1, vec![], &no_env).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("--nodes")));
        let a = parse(&["-t", "forever", "true"]);
        let e = request(&a, 1, vec![], &no_env).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("--time")));
    }
}
