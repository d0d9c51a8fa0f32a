//! `sbatch` (and `docket submit`): a batch script with `#SBATCH` directives.
//!
//! As Slurm does: the script comes from a file or stdin; `#SBATCH` lines are read up to the
//! first line that is neither a comment nor blank; options given on the command line win over
//! `SBATCH_*` environment variables, which win over the directives. Prints
//! `Submitted batch job N`, or just `N` with `--parsable`.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use docket_core::quantity::{SlurmDuration, parse_duration, parse_size};
use docket_proto::v1 as pb;

use crate::client::Client;
use crate::client::rpc;

/// Submit a batch script.
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "sbatch", version)]
pub struct SbatchArgs {
    /// Job name.
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
    /// Memory per node (`--mem=0`: all of each node's memory); M unless a unit is given.
    #[arg(long)]
    pub mem: Option<String>,
    #[arg(long = "mem-per-cpu")]
    pub mem_per_cpu: Option<String>,
    /// Time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; 0 for none.
    #[arg(short = 't', long)]
    pub time: Option<String>,
    /// stdout file pattern (%j %J %s %A %a %x %u %N %n %t %%).
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    #[arg(short = 'e', long)]
    pub error: Option<String>,
    /// Working directory (default: the current one).
    #[arg(short = 'D', long)]
    pub chdir: Option<String>,
    /// Array indexes: 0-31, 1,3,5, 1-7:2, with %N throttle.
    #[arg(short = 'a', long)]
    pub array: Option<String>,
    // The text is `--help`'s, where brackets mean optional, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// Dependencies: afterok:ID[:ID], afterany, afternotok, aftercorr, singleton; ? for OR.
    #[arg(short = 'd', long)]
    pub dependency: Option<String>,
    /// ALL (default), NONE, or ALL/NONE followed by ,VAR=value assignments.
    #[arg(long)]
    pub export: Option<String>,
    #[arg(short = 'w', long)]
    pub nodelist: Option<String>,
    #[arg(short = 'x', long)]
    pub exclude: Option<String>,
    #[arg(short = 'C', long)]
    pub constraint: Option<String>,
    #[arg(long)]
    pub exclusive: bool,
    /// Run in this advance reservation (on its nodes, inside its window).
    #[arg(long)]
    pub reservation: Option<String>,
    /// Free text kept with the job (`squeue -o %k`, `scontrol show job`, `sacct -o Comment`).
    #[arg(long)]
    pub comment: Option<String>,
    /// Submit held.
    #[arg(short = 'H', long)]
    pub hold: bool,
    /// Not before: now+N[s|m|h|d] or seconds since the epoch.
    #[arg(long)]
    pub begin: Option<String>,
    /// `[B:]SIG[@seconds]` before the time limit.
    #[arg(long)]
    pub signal: Option<String>,
    #[arg(long)]
    pub requeue: bool,
    #[arg(long = "no-requeue")]
    pub no_requeue: bool,
    /// `gpu:N`.
    #[arg(long)]
    pub gres: Option<String>,
    #[arg(long = "gpus-per-node")]
    pub gpus_per_node: Option<u32>,
    /// Print only the job id.
    #[arg(long)]
    pub parsable: bool,
    /// Wait for the job to end, then exit with its exit code.
    #[arg(short = 'W', long)]
    pub wait: bool,
    /// Accepted and ignored (old scripts carry them).
    #[arg(long = "mail-type")]
    pub mail_type: Option<String>,
    #[arg(long = "mail-user")]
    pub mail_user: Option<String>,
    /// Accepted and ignored: a workload characterisation key is for accounting Docket keeps
    /// by account (submitit passes `--wckey=submitit`).
    #[arg(long)]
    pub wckey: Option<String>,
    /// `append` (what Docket always does with output files, as Slurm's JobFileAppend=1) or
    /// `truncate` (refused: Docket never truncates an output file).
    #[arg(long = "open-mode", value_parser = ["append", "truncate"])]
    pub open_mode: Option<String>,
    /// Controllers, host:port,... (default: DOCKET_ADDR).
    #[arg(long)]
    pub addr: Option<String>,
    /// The command to run, wrapped in a `sh` script (instead of a script file or stdin).
    #[arg(long, conflicts_with = "script")]
    pub wrap: Option<String>,
    /// The script (default: read stdin).
    pub script: Option<PathBuf>,
}

impl SbatchArgs {
    /// Each option from `self`, else from `other`.
    fn or(self, other: SbatchArgs) -> SbatchArgs {
        macro_rules! pick {
            ($($f:ident),*) => { SbatchArgs { $($f: self.$f.or(other.$f),)*
                exclusive: self.exclusive || other.exclusive,
                hold: self.hold || other.hold,
                requeue: self.requeue || other.requeue,
                no_requeue: self.no_requeue || other.no_requeue,
                parsable: self.parsable || other.parsable,
                wait: self.wait || other.wait,
            } };
        }
        pick!(
            job_name,
            partition,
            account,
            qos,
            nodes,
            ntasks,
            cpus_per_task,
            ntasks_per_node,
            mem,
            mem_per_cpu,
            time,
            output,
            error,
            chdir,
            array,
            dependency,
            export,
            nodelist,
            exclude,
            constraint,
            reservation,
            comment,
            begin,
            signal,
            gres,
            gpus_per_node,
            mail_type,
            mail_user,
            wckey,
            open_mode,
            addr,
            wrap,
            script
        )
    }
}

/// The `#SBATCH` directive arguments of `script`, in order.
pub fn directives(script: &str) -> Result<Vec<String>> {
    let mut args = Vec::new();
    for (n, line) in script.lines().enumerate() {
        let t = line.trim();
        if n == 0 && t.starts_with("#!") {
            continue;
        }
        if t.is_empty() {
            continue;
        }
        if !t.starts_with('#') {
            break;
        }
        if let Some(rest) = t.strip_prefix("#SBATCH") {
            let words = shlex::split(rest)
                .ok_or_else(|| anyhow!("line {}: unbalanced quotes in {t:?}", n + 1))?;
            args.extend(words);
        }
    }
    Ok(args)
}

/// The options the `SBATCH_*` variables give.
fn from_env() -> SbatchArgs {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    SbatchArgs {
        partition: var("SBATCH_PARTITION"),
        account: var("SBATCH_ACCOUNT"),
        qos: var("SBATCH_QOS"),
        time: var("SBATCH_TIMELIMIT"),
        job_name: var("SBATCH_JOB_NAME"),
        array: var("SBATCH_ARRAY_INX"),
        export: var("SBATCH_EXPORT"),
        exclusive: var("SBATCH_EXCLUSIVE").is_some(),
        reservation: var("SBATCH_RESERVATION"),
        requeue: var("SBATCH_REQUEUE").is_some(),
        ..Default::default()
    }
}

fn list(text: &Option<String>) -> Vec<String> {
    text.as_deref()
        .map(|t| {
            t.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn signal_number(name: &str) -> Result<i32> {
    if let Ok(n) = name.parse::<i32>() {
        return Ok(n);
    }
    let full = if name.starts_with("SIG") {
        name.to_owned()
    } else {
        format!("SIG{name}")
    };
    full.parse::<nix::sys::signal::Signal>()
        .map(|s| s as i32)
        .map_err(|_| anyhow!("--signal: {name:?} is not a signal name or number"))
}

/// Builds the job spec from the merged options and the script text.
pub fn job_spec(o: &SbatchArgs, script: &str, cwd: &str, now_ms: u64) -> Result<pb::JobSpec> {
    if !script.starts_with("#!") {
        bail!("the script must start with a #! line (e.g. #!/bin/bash), as sbatch requires");
    }
    if o.open_mode.as_deref() == Some("truncate") {
        bail!("--open-mode=truncate: Docket appends to output files and never truncates them");
    }
    let mut spec = base_spec(o, script, cwd);
    spec.memory = memory_request(o)?;
    if let Some(t) = &o.time {
        spec.time_limit_seconds = Some(time_limit_seconds(t)?);
    }
    if let Some(g) = &o.gres {
        spec.gpus_per_node = gres_gpus(g)?;
    }
    if let Some(b) = &o.begin {
        spec.begin_unix_ms = Some(begin_ms(b, now_ms)? as i64);
    }
    if let Some(sig) = &o.signal {
        spec.signal = Some(warn_signal(sig)?);
    }
    spec.environment = environment(o.export.as_deref());
    Ok(spec)
}

/// The spec's fields that are the options as given, or their defaults.
fn base_spec(o: &SbatchArgs, script: &str, cwd: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: o.job_name.clone().unwrap_or_else(|| {
            o.script
                .as_ref()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| if o.wrap.is_some() { "wrap" } else { "sbatch" }.into())
        }),
        partition: o.partition.clone().unwrap_or_default(),
        account: o.account.clone().unwrap_or_default(),
        qos: o.qos.clone().unwrap_or_default(),
        nodes: o.nodes.unwrap_or(1),
        // Slurm's default: one task per node, or --ntasks-per-node on each.
        ntasks: o.ntasks.unwrap_or_else(|| {
            o.nodes
                .unwrap_or(1)
                .saturating_mul(o.ntasks_per_node.unwrap_or(1))
        }),
        cpus_per_task: o.cpus_per_task.unwrap_or(1),
        ntasks_per_node: o.ntasks_per_node,
        array: o.array.clone().unwrap_or_default(),
        dependency: o.dependency.clone().unwrap_or_default(),
        hold: o.hold,
        requeue: o.requeue && !o.no_requeue,
        exclusive: o.exclusive,
        features: list(&o.constraint),
        nodelist: list(&o.nodelist),
        exclude: list(&o.exclude),
        work_dir: o.chdir.clone().unwrap_or_else(|| cwd.to_owned()),
        stdout: o.output.clone().unwrap_or_default(),
        stderr: o.error.clone().unwrap_or_default(),
        script: script.as_bytes().to_vec(),
        gpus_per_node: o.gpus_per_node.unwrap_or(0),
        reservation: o.reservation.clone().unwrap_or_default(),
        comment: o.comment.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// The memory `--mem` (per node, 0 for all of it) or `--mem-per-cpu` asks for, if either.
fn memory_request(o: &SbatchArgs) -> Result<Option<pb::job_spec::Memory>> {
    Ok(match (&o.mem, &o.mem_per_cpu) {
        (Some(_), Some(_)) => bail!("--mem and --mem-per-cpu are mutually exclusive"),
        (Some(m), None) => {
            let mib = parse_size(m).map_err(|e| anyhow!("--mem: {e}"))?.0;
            Some(if mib == 0 {
                pb::job_spec::Memory::MemWholeNode(true)
            } else {
                pb::job_spec::Memory::MemPerNodeMib(mib)
            })
        }
        (None, Some(m)) => {
            let mib = parse_size(m).map_err(|e| anyhow!("--mem-per-cpu: {e}"))?.0;
            Some(pb::job_spec::Memory::MemPerCpuMib(mib))
        }
        (None, None) => None,
    })
}

/// `--time` in seconds, 0 for no limit.
fn time_limit_seconds(t: &str) -> Result<i64> {
    Ok(
        match parse_duration(t).map_err(|e| anyhow!("--time: {e}"))? {
            SlurmDuration::Unlimited => 0,
            SlurmDuration::Limit(s) => s.0 as i64,
        },
    )
}

/// The GPUs per node of `--gres=gpu:N` (or `gpu:TYPE:N`).
fn gres_gpus(g: &str) -> Result<u32> {
    g.strip_prefix("gpu:")
        .and_then(|n| n.rsplit(':').next())
        .and_then(|n| n.parse::<u32>().ok())
        .ok_or_else(|| anyhow!("--gres: {g:?} is not gpu:N"))
}

/// `--begin` as ms since the epoch: `now+N[s|m|h|d]` from `now_ms`, or seconds since 1970.
fn begin_ms(b: &str, now_ms: u64) -> Result<u64> {
    if let Some(rest) = b.strip_prefix("now+") {
        let (num, unit) = rest.split_at(
            rest.find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len()),
        );
        let n: u64 = num
            .parse()
            .map_err(|_| anyhow!("--begin: {b:?} is not now+N[s|m|h|d]"))?;
        let mult = match unit {
            "" | "s" | "seconds" => 1,
            "m" | "minutes" => 60,
            "h" | "hours" => 3600,
            "d" | "days" => 86_400,
            _ => bail!("--begin: unit {unit:?} is not s, m, h or d"),
        };
        Ok(now_ms + n * mult * 1000)
    } else {
        b.parse::<u64>()
            .map(|s| s * 1000)
            .map_err(|_| anyhow!("--begin: {b:?} is not now+N[s|m|h|d] or seconds since 1970"))
    }
}

/// `--signal=[B:]SIG[@seconds]`: the signal, sent 60 seconds before the limit unless told.
fn warn_signal(sig: &str) -> Result<pb::WarnSignal> {
    let (batch_only, rest) = match sig.strip_prefix("B:") {
        Some(r) => (true, r),
        None => (false, sig),
    };
    let (name, secs) = match rest.split_once('@') {
        Some((n, s)) => (
            n,
            s.parse::<u64>()
                .map_err(|_| anyhow!("--signal: {s:?} is not seconds"))?,
        ),
        None => (rest, 60),
    };
    Ok(pb::WarnSignal {
        signal: signal_number(name)?,
        seconds_before: secs,
        batch_only,
    })
}

/// The job's environment as `--export` asks (`VAR=value\0...`), or none to send.
fn environment(export: Option<&str>) -> Option<Vec<u8>> {
    // --export: ALL (default) sends this environment; NONE sends none; extra VAR=value.
    let export = export.unwrap_or("ALL");
    let mut parts = export.split(',');
    let base = parts.next().unwrap_or("ALL");
    let mut vars: Vec<(String, String)> = match base {
        "NONE" => Vec::new(),
        "ALL" => std::env::vars().collect(),
        other => {
            // Slurm: a bare list of names exports those (plus SLURM_*).
            std::iter::once(other)
                .chain(export.split(',').skip(1))
                .filter(|n| !n.contains('='))
                .filter_map(|n| std::env::var(n).ok().map(|v| (n.to_owned(), v)))
                .collect()
        }
    };
    for p in parts.filter(|p| p.contains('=')) {
        if let Some((k, v)) = p.split_once('=') {
            vars.push((k.to_owned(), v.to_owned()));
        }
    }
    // Slurm's: the job creates its files with the submitter's umask.
    if base != "NONE" && !vars.iter().any(|(k, _)| k == "SLURM_UMASK") {
        vars.push(("SLURM_UMASK".into(), format!("{:04o}", current_umask())));
    }
    if base == "NONE" && vars.is_empty() {
        return None;
    }
    let mut env = Vec::new();
    for (k, v) in vars {
        env.extend_from_slice(k.as_bytes());
        env.push(b'=');
        env.extend_from_slice(v.as_bytes());
        env.push(0);
    }
    Some(env)
}

/// This process's umask (read by setting it, then set back).
fn current_umask() -> u32 {
    use nix::sys::stat::{Mode, umask};
    let mask = umask(Mode::from_bits_truncate(0o022));
    umask(mask);
    mask.bits()
}

/// The options of a script's `#SBATCH` directives. A script without any (`--wrap`) has none
/// set, as parsing an empty command line gives, without building the parser.
fn script_options(directives: Vec<String>) -> Result<SbatchArgs> {
    if directives.is_empty() {
        return Ok(SbatchArgs::default());
    }
    SbatchArgs::try_parse_from(std::iter::once("sbatch".to_owned()).chain(directives)).map_err(
        |e| {
            anyhow!(
                "#SBATCH directives: {}",
                e.to_string().lines().next().unwrap_or_default()
            )
        },
    )
}

/// Runs sbatch with the command-line options `cli`.
pub fn run(cli: SbatchArgs) -> Result<()> {
    let script = match (&cli.wrap, &cli.script) {
        // As Slurm's sbatch writes it.
        (Some(command), _) => {
            format!("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n")
        }
        (None, Some(p)) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        (None, None) => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .context("reading the script from stdin")?;
            s
        }
    };
    let from_script = script_options(directives(&script)?)?;
    let options = cli.or(from_env()).or(from_script);
    let cwd = std::env::current_dir()
        .context("the current directory")?
        .display()
        .to_string();
    let now_ms = docket_proto::unix_ms();
    let spec = job_spec(&options, &script, &cwd, now_ms)?;
    let client = Client::new(options.addr.as_deref())?;
    let runtime = crate::client::runtime()?;
    let results = runtime.block_on(rpc!(
        client,
        jobs_call,
        submit_jobs,
        pb::SubmitJobsRequest {
            jobs: vec![spec.clone()],
        }
    ))?;
    match results.results.first().and_then(|r| r.result.clone()) {
        Some(pb::submit_result::Result::JobId(id)) => {
            if options.parsable {
                println!("{id}");
            } else {
                println!("Submitted batch job {id}");
            }
            if options.wait {
                return wait_for(&client, &runtime, id);
            }
            Ok(())
        }
        Some(pb::submit_result::Result::Error(e)) => {
            Err(anyhow!("Batch job submission failed: {e}"))
        }
        None => Err(anyhow!(
            "Batch job submission failed: no answer for the job"
        )),
    }
}

/// Whether a job in state `code` (PD, R, CD, ...) has ended for good.
pub fn is_final(code: &str) -> bool {
    !matches!(code, "PD" | "R" | "S" | "CG" | "RQ" | "")
}

/// `sbatch -W`: polls the job until it ends; Ok for exit code 0, else a failure carrying
/// the job's exit code (1 when it ended without one: cancelled, node failure, ...).
fn wait_for(client: &Client, runtime: &tokio::runtime::Runtime, id: u64) -> Result<()> {
    let mut pause = std::time::Duration::from_millis(200);
    loop {
        let j = runtime.block_on(rpc!(
            client,
            jobs_read,
            get_job,
            pb::GetJobRequest {
                job_id: id,
                consistency: 0,
            }
        ))?;
        if is_final(&j.state_code) {
            let code = j.exit_code.unwrap_or(0);
            return match (j.state_code.as_str(), code) {
                ("CD", 0) => Ok(()),
                (_, c) => Err(crate::client::Failure::error(
                    u8::try_from(c).ok().filter(|c| *c > 0).unwrap_or(1),
                    format!(
                        "job {id} ended {} with exit code {}:{}",
                        j.state,
                        code,
                        j.exit_signal.unwrap_or(0)
                    ),
                )),
            };
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "#!/bin/bash\n#SBATCH -J sim -p big\n#SBATCH --time=1-02:00:00 --mem=4G\n# a comment\n\n#SBATCH -N 2\nsrun hostname\n#SBATCH -J ignored\n";

    #[test]
    fn a_script_without_directives_sets_what_an_empty_command_line_sets() {
        let parsed = SbatchArgs::try_parse_from(["sbatch"]).unwrap();
        let none = script_options(Vec::new()).unwrap();
        assert_eq!(format!("{parsed:?}"), format!("{none:?}"));
        let some = script_options(vec!["-J".into(), "x".into()]).unwrap();
        assert_eq!(some.job_name.as_deref(), Some("x"));
        let e = script_options(vec!["--nodes=many".into()]).unwrap_err();
        assert!(e.to_string().starts_with("#SBATCH directives: "), "{e}");
    }

    #[test]
    fn tasks_default_to_one_per_node_and_submitits_options_are_taken() {
        let script = "#!/bin/sh\n#SBATCH --open-mode=append\n#SBATCH --wckey=submitit\ntrue\n";
        let o = SbatchArgs::try_parse_from(
            std::iter::once("sbatch".to_owned()).chain(directives(script).unwrap()),
        )
        .unwrap();
        assert_eq!(job_spec(&o, script, "/", 0).unwrap().ntasks, 1);
        let o =
            SbatchArgs::try_parse_from(["sbatch", "-N", "2", "--ntasks-per-node", "3"]).unwrap();
        assert_eq!(job_spec(&o, script, "/", 0).unwrap().ntasks, 6);
        let o = SbatchArgs::try_parse_from(["sbatch", "-N", "2"]).unwrap();
        assert_eq!(job_spec(&o, script, "/", 0).unwrap().ntasks, 2);
        let o = SbatchArgs::try_parse_from(["sbatch", "--open-mode=truncate"]).unwrap();
        let e = job_spec(&o, script, "/", 0).unwrap_err().to_string();
        assert!(e.contains("--open-mode"), "{e}");
    }

    #[test]
    fn wrap_is_a_command_in_a_sh_script_named_wrap() {
        let o = SbatchArgs::try_parse_from(["sbatch", "--wrap", "srun hostname"]).unwrap();
        assert_eq!(o.wrap.as_deref(), Some("srun hostname"));
        let spec = job_spec(&o, "#!/bin/sh\nsrun hostname\n", "/home/u", 0).unwrap();
        assert_eq!(spec.name, "wrap");
        assert!(SbatchArgs::try_parse_from(["sbatch", "--wrap", "true", "job.sh"]).is_err());
    }

    #[test]
    fn a_comment_comes_from_the_option_or_a_directive() {
        let o = SbatchArgs::try_parse_from(["sbatch", "--comment", "run 3 of 12"]).unwrap();
        assert_eq!(
            job_spec(&o, "#!/bin/sh\n", "/", 0).unwrap().comment,
            "run 3 of 12"
        );
        let script = "#!/bin/sh\n#SBATCH --comment=\"from the script\"\ntrue\n";
        let mut args = vec!["sbatch".to_string()];
        args.extend(directives(script).unwrap());
        let o = SbatchArgs::try_parse_from(args).unwrap();
        assert_eq!(
            job_spec(&o, script, "/", 0).unwrap().comment,
            "from the script"
        );
    }

    #[test]
    fn a_reservation_is_asked_for_by_name() {
        let o = SbatchArgs::try_parse_from(["sbatch", "--reservation", "maint"]).unwrap();
        let spec = job_spec(&o, "#!/bin/sh\ntrue\n", "/home/u", 0).unwrap();
        assert_eq!(spec.reservation, "maint");
        let o = SbatchArgs::try_parse_from(["sbatch"]).unwrap();
        assert_eq!(job_spec(&o, "#!/bin/sh\n", "/", 0).unwrap().reservation, "");
    }

    #[test]
    fn directives_stop_at_the_first_command() {
        assert_eq!(
            directives(SCRIPT).unwrap(),
            vec![
                "-J",
                "sim",
                "-p",
                "big",
                "--time=1-02:00:00",
                "--mem=4G",
                "-N",
                "2"
            ]
        );
    }

    #[test]
    fn the_command_line_beats_the_environment_beats_directives() {
        let from_script = SbatchArgs::try_parse_from(
            std::iter::once("sbatch".to_owned()).chain(directives(SCRIPT).unwrap()),
        )
        .unwrap();
        let cli = SbatchArgs::try_parse_from(["sbatch", "-p", "batch", "--parsable"]).unwrap();
        let env = SbatchArgs {
            partition: Some("envpart".into()),
            qos: Some("high".into()),
            ..Default::default()
        };
        let o = cli.or(env).or(from_script);
        let spec = job_spec(&o, SCRIPT, "/home/u", 0).unwrap();
        assert_eq!(spec.partition, "batch");
        assert_eq!(spec.qos, "high");
        assert_eq!(spec.name, "sim");
        assert_eq!(spec.nodes, 2);
        assert_eq!(spec.time_limit_seconds, Some(26 * 3600));
        assert_eq!(spec.memory, Some(pb::job_spec::Memory::MemPerNodeMib(4096)));
        assert_eq!(spec.work_dir, "/home/u");
        assert!(o.parsable);
    }

    #[test]
    fn options_map_to_the_spec_and_bad_ones_name_themselves() {
        let o = SbatchArgs::try_parse_from([
            "sbatch",
            "-t",
            "0",
            "--mem=0",
            "--begin=now+2m",
            "--signal=B:USR1@90",
            "--gres=gpu:2",
            "-w",
            "n1,n2",
            "--export=NONE,FOO=bar",
            "-H",
        ])
        .unwrap();
        let spec = job_spec(&o, "#!/bin/sh\n", "/", 1_000).unwrap();
        assert_eq!(spec.time_limit_seconds, Some(0));
        assert_eq!(spec.memory, Some(pb::job_spec::Memory::MemWholeNode(true)));
        assert_eq!(spec.begin_unix_ms, Some(121_000));
        let sig = spec.signal.unwrap();
        assert!(sig.batch_only);
        assert_eq!((sig.signal, sig.seconds_before), (10, 90));
        assert_eq!(spec.gpus_per_node, 2);
        assert_eq!(spec.nodelist, vec!["n1", "n2"]);
        assert_eq!(spec.environment.as_deref(), Some(&b"FOO=bar\0"[..]));
        assert!(spec.hold);
        for (args, field) in [
            (vec!["sbatch", "-t", "5 days"], "--time"),
            (vec!["sbatch", "--mem=lots"], "--mem"),
            (vec!["sbatch", "--mem=1G", "--mem-per-cpu=1G"], "--mem"),
            (vec!["sbatch", "--begin=tomorrow"], "--begin"),
            (vec!["sbatch", "--signal=NOPE"], "--signal"),
        ] {
            let o = SbatchArgs::try_parse_from(args).unwrap();
            let e = job_spec(&o, "#!/bin/sh\n", "/", 0).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        let e = job_spec(&SbatchArgs::default(), "echo no shebang\n", "/", 0).unwrap_err();
        assert!(e.to_string().contains("#!"), "{e}");
    }
}
