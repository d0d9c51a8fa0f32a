//! PBS's dialect: `qsub`, `qstat`, `qdel`, `qhold`, `qrls`.
//!
//! `qsub` reads `#PBS` directives (up to the first command) under the command line, and
//! takes PBS Pro's resource syntax: `-l select=N:ncpus=C:mem=M[:ngpus=G]`,
//! `-l walltime=H:M:S`, `-l jobfs=SIZE` (NCI), `-l vmem=SIZE` (the job's memory and swap
//! together, as NCI enforces it), `-N -q -P -A -J -W depend= -h -j oe -o -e -v -V`.
//! It prints `ID.server` (the server name from `DOCKET_PBS_SERVER`, default `docket`).

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use docket_core::quantity::{SlurmDuration, parse_duration, parse_size};
use docket_proto::v1 as pb;

use crate::client::{Client, rpc, runtime};
use crate::slurmtime;

/// Submit a PBS job script.
#[derive(Debug, Clone, Default, Parser)]
#[command(
    name = "qsub",
    version,
    disable_help_flag = true,
    disable_version_flag = true
)]
pub struct QsubArgs {
    /// Print help (`-h` is hold, as in PBS).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Print the version (`-V` passes the environment, as in PBS).
    #[arg(long, action = clap::ArgAction::Version)]
    pub version: Option<bool>,
    /// Resources: select=N:ncpus=C:mem=M[:ngpus=G], walltime=H:M:S, jobfs=SIZE (repeatable,
    /// comma-separated).
    #[arg(short = 'l')]
    pub resources: Vec<String>,
    #[arg(short = 'N')]
    pub name: Option<String>,
    /// Queue (a partition).
    #[arg(short = 'q')]
    pub queue: Option<String>,
    /// Project (an account, as at NCI).
    #[arg(short = 'P')]
    pub project: Option<String>,
    #[arg(short = 'A')]
    pub account: Option<String>,
    // The text is `--help`'s, where brackets mean optional, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// Array: 1-10[:step][%max].
    #[arg(short = 'J')]
    pub array: Option<String>,
    // The text is `--help`'s, where brackets mean optional, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// Attributes: depend=afterok:ID[:ID].
    #[arg(short = 'W')]
    pub attributes: Vec<String>,
    /// Submit held.
    #[arg(short = 'h')]
    pub hold: bool,
    /// oe: stderr into stdout.
    #[arg(short = 'j')]
    pub join: Option<String>,
    #[arg(short = 'o')]
    pub output: Option<String>,
    #[arg(short = 'e')]
    pub error: Option<String>,
    /// Variables to pass, VAR=value,...
    #[arg(short = 'v')]
    pub variables: Option<String>,
    /// Pass the whole environment.
    #[arg(short = 'V')]
    pub all_env: bool,
    /// Interactive: wait for the job to start, then a shell (or the command after `--`) on
    /// its first node, on a terminal, until it exits.
    #[arg(short = 'I')]
    pub interactive: bool,
    /// X11 forwarding for `-I` (refused: Docket forwards no X11).
    #[arg(short = 'X')]
    pub x11: bool,
    #[arg(long)]
    pub addr: Option<String>,
    /// The script (default: stdin).
    pub script: Option<std::path::PathBuf>,
    /// `-I -- command args`: what runs instead of the shell.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// `4gb`, `100GB`, `512mb` → MiB.
fn pbs_size(key: &str, v: &str) -> Result<u64> {
    let t = v.trim().to_ascii_uppercase();
    let t = t.strip_suffix('B').unwrap_or(&t);
    Ok(parse_size(t).map_err(|e| anyhow!("-l {key}: {e}"))?.0)
}

/// Fills `spec` from one `-l` value (which may hold several comma-separated resources).
pub fn apply_resources(spec: &mut pb::JobSpec, l: &str) -> Result<()> {
    for item in l.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| anyhow!("-l {item:?} is not resource=value"))?;
        match k {
            "select" => {
                let mut parts = v.split(':');
                let first = parts.next().unwrap_or("1");
                let (chunks, rest): (u32, Option<&str>) = match first.parse() {
                    Ok(n) => (n, None),
                    Err(_) => (1, Some(first)),
                };
                spec.nodes = chunks;
                spec.ntasks = chunks;
                for kv in rest.into_iter().chain(parts) {
                    let (rk, rv) = kv
                        .split_once('=')
                        .ok_or_else(|| anyhow!("-l select: {kv:?} is not resource=value"))?;
                    match rk {
                        "ncpus" => {
                            spec.cpus_per_task = rv
                                .parse()
                                .map_err(|_| anyhow!("-l select ncpus: {rv:?} is not a number"))?
                        }
                        "mem" => {
                            spec.memory =
                                Some(pb::job_spec::Memory::MemPerNodeMib(pbs_size("mem", rv)?))
                        }
                        "ngpus" => {
                            spec.gpus_per_node = rv
                                .parse()
                                .map_err(|_| anyhow!("-l select ngpus: {rv:?} is not a number"))?
                        }
                        "vmem" => spec.vmem_mib = Some(pbs_size("vmem", rv)?),
                        "mpiprocs" => {}
                        other => {
                            bail!("-l select: {other} is not ncpus, mem, vmem, ngpus or mpiprocs")
                        }
                    }
                }
            }
            "ncpus" => {
                spec.cpus_per_task = v
                    .parse()
                    .map_err(|_| anyhow!("-l ncpus: {v:?} is not a number"))?
            }
            "mem" => spec.memory = Some(pb::job_spec::Memory::MemPerNodeMib(pbs_size("mem", v)?)),
            "ngpus" => {
                spec.gpus_per_node = v
                    .parse()
                    .map_err(|_| anyhow!("-l ngpus: {v:?} is not a number"))?
            }
            "jobfs" => spec.jobfs_mib = Some(pbs_size("jobfs", v)?),
            "vmem" => spec.vmem_mib = Some(pbs_size("vmem", v)?),
            "walltime" => {
                spec.time_limit_seconds = Some(
                    match parse_duration(v).map_err(|e| anyhow!("-l walltime: {e}"))? {
                        SlurmDuration::Unlimited => 0,
                        SlurmDuration::Limit(s) => s.0 as i64,
                    },
                )
            }
            other => bail!(
                "-l {other}: not a resource qsub knows (select, ncpus, mem, vmem, ngpus, jobfs, \
                 walltime)"
            ),
        }
    }
    Ok(())
}

/// The `#PBS` directive arguments of `script`.
pub fn directives(script: &str) -> Result<Vec<String>> {
    let mut args = Vec::new();
    for (n, line) in script.lines().enumerate() {
        let t = line.trim();
        if (n == 0 && t.starts_with("#!")) || t.is_empty() {
            continue;
        }
        if !t.starts_with('#') {
            break;
        }
        if let Some(rest) = t.strip_prefix("#PBS") {
            args.extend(
                shlex::split(rest).ok_or_else(|| anyhow!("line {}: unbalanced quotes", n + 1))?,
            );
        }
    }
    Ok(args)
}

/// PBS's file for a job's stdout (`o`) or stderr (`e`) in directory `dir`: `<name>.o<id>`,
/// as an output pattern (a `%` of the name kept literal).
fn in_directory(dir: &str, name: &str, suffix: &str) -> String {
    let dir = dir.trim_end_matches('/');
    let name = name.replace('%', "%%");
    format!("{dir}/{name}.{suffix}%j")
}

/// The job spec from the command line over the directives.
pub fn job_spec(cli: &QsubArgs, script: &str, cwd: &str) -> Result<pb::JobSpec> {
    let dir = parse_directives(script)?;
    let mut spec = pb::JobSpec {
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        work_dir: cwd.to_owned(),
        script: script.as_bytes().to_vec(),
        ..Default::default()
    };
    // Directives first, then the command line over them.
    for src in [&dir, cli] {
        apply_options(&mut spec, src)?;
    }
    if spec.name.is_empty() {
        spec.name = cli
            .script
            .as_ref()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "STDIN".into());
    }
    resolve_output_directories(&mut spec, cwd);
    let env = environment(cli, &dir);
    if !env.is_empty() {
        spec.environment = Some(env);
    }
    // PBS scripts need not start with #!; run them with /bin/sh like PBS does.
    if !script.starts_with("#!") {
        spec.script = format!("#!/bin/sh\n{script}").into_bytes();
    }
    Ok(spec)
}

/// The options `script`'s `#PBS` directives give.
fn parse_directives(script: &str) -> Result<QsubArgs> {
    QsubArgs::try_parse_from(std::iter::once("qsub".to_owned()).chain(directives(script)?)).map_err(
        |e| {
            anyhow!(
                "#PBS directives: {}",
                e.to_string().lines().next().unwrap_or_default()
            )
        },
    )
}

/// Sets in `spec` what the options `src` give, over what it holds.
fn apply_options(spec: &mut pb::JobSpec, src: &QsubArgs) -> Result<()> {
    for l in &src.resources {
        apply_resources(spec, l)?;
    }
    if let Some(n) = &src.name {
        spec.name = n.clone();
    }
    if let Some(q) = &src.queue {
        spec.partition = q.clone();
    }
    if let Some(a) = src.project.as_ref().or(src.account.as_ref()) {
        spec.account = a.clone();
    }
    if let Some(j) = &src.array {
        spec.array = j.clone();
    }
    for w in &src.attributes {
        match w.split_once('=') {
            Some(("depend", d)) => spec.dependency = d.to_owned(),
            _ => bail!("-W {w:?}: only depend=... is supported"),
        }
    }
    spec.hold |= src.hold;
    if let Some(o) = &src.output {
        spec.stdout = o.clone();
    }
    if let Some(e) = &src.error {
        spec.stderr = e.clone();
    }
    match src.join.as_deref() {
        Some("oe") => spec.stderr = String::new(),
        Some("n") | None => {}
        Some(other) => bail!("-j {other}: only oe or n"),
    }
    Ok(())
}

/// Output and error paths that are directories become PBS's files in them.
fn resolve_output_directories(spec: &mut pb::JobSpec, cwd: &str) {
    // `-o DIR/` and `-e DIR/` (dask-jobqueue writes them): PBS names the files in that
    // directory `<job name>.o<job id>` and `.e<job id>`.
    let is_dir = |p: &str| p.ends_with('/') || std::path::Path::new(cwd).join(p).is_dir();
    for (path, suffix) in [(&mut spec.stdout, "o"), (&mut spec.stderr, "e")] {
        if !path.is_empty() && is_dir(path) {
            *path = in_directory(path, &spec.name, suffix);
        }
    }
}

/// The job's environment (`VAR=value\0...`): all of this one with `-V`, then the `-v`
/// variables of the directives and of the command line.
fn environment(cli: &QsubArgs, dir: &QsubArgs) -> Vec<u8> {
    let mut env: Vec<u8> = Vec::new();
    let mut push = |k: &str, v: &str| {
        env.extend_from_slice(format!("{k}={v}").as_bytes());
        env.push(0);
    };
    if cli.all_env || dir.all_env {
        for (k, v) in std::env::vars() {
            push(&k, &v);
        }
    }
    for list in [&dir.variables, &cli.variables].into_iter().flatten() {
        for kv in list.split(',') {
            match kv.split_once('=') {
                Some((k, v)) => push(k, v),
                None => {
                    if let Ok(v) = std::env::var(kv) {
                        push(kv, &v)
                    }
                }
            }
        }
    }
    env
}

/// The server name PBS appends to job ids (`12.docket`).
pub fn server() -> String {
    std::env::var("DOCKET_PBS_SERVER").unwrap_or_else(|_| "docket".into())
}

pub fn qsub(cli: QsubArgs) -> Result<()> {
    let script = match &cli.script {
        // PBS Pro's `qsub [options] -- executable [args]`: the executable is the job.
        _ if !cli.command.is_empty() => {
            if cli.script.is_some() {
                bail!("give a script or an executable after --, not both");
            }
            let words: Vec<&str> = cli.command.iter().map(String::as_str).collect();
            let line =
                shlex::try_join(words).map_err(|e| anyhow!("the executable after --: {e}"))?;
            format!("#!/bin/sh\nexec {line}\n")
        }
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)?;
            s
        }
    };
    let cwd = std::env::current_dir()?.display().to_string();
    let spec = job_spec(&cli, &script, &cwd)?;
    let client = Client::new(cli.addr.as_deref())?;
    let r = runtime()?.block_on(rpc!(
        client,
        jobs_call,
        submit_jobs,
        pb::SubmitJobsRequest {
            jobs: vec![spec.clone()],
        }
    ))?;
    match r.results.first().and_then(|r| r.result.clone()) {
        Some(pb::submit_result::Result::JobId(id)) => {
            println!("{id}.{}", server());
            Ok(())
        }
        Some(pb::submit_result::Result::Error(e)) => Err(anyhow!("{e}")),
        None => Err(anyhow!("no answer for the job")),
    }
}

/// Show jobs, PBS style.
#[derive(Debug, Clone, Parser)]
#[command(name = "qstat", version)]
pub struct QstatArgs {
    /// Full output, one block per job.
    #[arg(short = 'f')]
    pub full: bool,
    /// Include finished jobs.
    #[arg(short = 'x')]
    pub finished: bool,
    #[arg(short = 'u')]
    pub user: Option<String>,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub addr: Option<String>,
    /// Job ids (`123` or `123.server`).
    pub jobs: Vec<String>,
}

/// A job id as PBS prints it, without the server: `123`, `123.server`.
fn pbs_id(text: &str) -> Result<u64> {
    text.split('.')
        .next()
        .and_then(|n| n.trim_end_matches("[]").parse().ok())
        .ok_or_else(|| anyhow!("{text:?} is not a job id"))
}

/// PBS's state letter for a Slurm-style state code.
pub fn pbs_state(j: &pb::JobInfo) -> &'static str {
    match j.state_code.as_str() {
        "PD" if j.held => "H",
        "PD" => "Q",
        "R" => "R",
        "S" => "S",
        "CG" => "E",
        _ => "F",
    }
}

pub fn qstat(a: QstatArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let ids: Vec<u64> = a.jobs.iter().map(|j| pbs_id(j)).collect::<Result<_>>()?;
    let jobs = runtime()?.block_on(crate::listing::all_jobs(
        &client,
        pb::ListJobsRequest {
            users: a.user.iter().cloned().collect(),
            job_ids: ids.clone(),
            ..Default::default()
        },
    ))?;
    let jobs: Vec<_> = jobs
        .into_iter()
        .filter(|j| a.finished || pbs_state(j) != "F")
        .collect();
    let server = server();
    if a.json {
        let rows: Vec<_> = jobs
            .iter()
            .map(|j| {
                serde_json::json!({"id": format!("{}.{server}", j.job_id), "name": j.name,
                "owner": j.user, "state": pbs_state(j), "queue": j.partition})
            })
            .collect();
        println!("{}", serde_json::json!({ "jobs": rows }));
        return Ok(());
    }
    if a.full {
        print!("{}", qstat_full(&jobs, &server));
    } else {
        print!("{}", qstat_table(&jobs, &server));
    }
    Ok(())
}

/// `qstat -f`: one block of `attribute = value` lines per job.
pub fn qstat_full(jobs: &[pb::JobInfo], server: &str) -> String {
    let mut out = String::new();
    for j in jobs {
        out.push_str(&format!("Job Id: {}.{server}\n", j.job_id));
        let mut attr = |k: &str, v: String| out.push_str(&format!("    {k} = {v}\n"));
        attr("Job_Name", j.name.clone());
        attr("Job_Owner", j.user.clone());
        attr("job_state", pbs_state(j).into());
        attr("queue", j.partition.clone());
        attr("project", j.account.clone());
        attr(
            "Resource_List.walltime",
            slurmtime::limit(j.time_limit_seconds),
        );
        attr("Resource_List.ncpus", j.cpus.to_string());
        attr("Resource_List.nodect", j.nodes.to_string());
        attr("exec_host", j.node_list.clone());
        attr(
            "Exit_status",
            j.exit_code.map_or("-".into(), |c| c.to_string()),
        );
        attr("PBS_O_WORKDIR", j.work_dir.clone());
        out.push('\n');
    }
    out
}

/// `qstat`: PBS's default table.
pub fn qstat_table(jobs: &[pb::JobInfo], server: &str) -> String {
    let mut out = format!(
        "{:<17} {:<16} {:<16} {:>8} S {:<8}\n{} {} {} {} - {}\n",
        "Job id",
        "Name",
        "User",
        "Time Use",
        "Queue",
        "-".repeat(17),
        "-".repeat(16),
        "-".repeat(16),
        "-".repeat(8),
        "-".repeat(8)
    );
    for j in jobs {
        let used = match (j.start_time_ms, j.end_time_ms) {
            (Some(s), Some(e)) => slurmtime::duration(e.saturating_sub(s) / 1000),
            (Some(_), None) => "--".into(),
            _ => "0".into(),
        };
        out.push_str(&format!(
            "{:<17} {:<16} {:<16} {:>8} {} {:<8}\n",
            format!("{}.{server}", j.job_id)
                .chars()
                .take(17)
                .collect::<String>(),
            j.name.chars().take(16).collect::<String>(),
            j.user.chars().take(16).collect::<String>(),
            used,
            pbs_state(j),
            j.partition
        ));
    }
    out
}

/// qdel / qhold / qrls: job ids (`123` or `123.server`).
#[derive(Debug, Clone, Parser)]
pub struct QctlArgs {
    #[arg(long)]
    pub addr: Option<String>,
    #[arg(required = true)]
    pub jobs: Vec<String>,
}

pub fn qctl(verb: &str, a: QctlArgs) -> Result<()> {
    let client = Client::new(a.addr.as_deref())?;
    let refs: Vec<pb::JobRef> = a
        .jobs
        .iter()
        .map(|j| pbs_id(j).map(|job_id| pb::JobRef { job_id, task: None }))
        .collect::<Result<_>>()?;
    let verb = verb.to_owned();
    let r = runtime()?.block_on(client.jobs_call(|mut c| {
        let req = client.request(pb::JobsRequest { jobs: refs.clone() });
        let verb = verb.clone();
        async move {
            match verb.as_str() {
                "qhold" => c.hold_jobs(req).await,
                "qrls" => c.release_jobs(req).await,
                _ => c.cancel_jobs(req).await,
            }
        }
    }))?;
    let bad: Vec<String> = r
        .results
        .iter()
        .filter(|x| !x.error.is_empty())
        .map(|x| format!("{}: {}", x.job.as_ref().map_or(0, |j| j.job_id), x.error))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(bad.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_directories_get_pbs_file_names() {
        let script = "#!/bin/bash\n#PBS -N dask-worker\n#PBS -e /logs/\n#PBS -o out\n";
        let cli = QsubArgs::try_parse_from(["qsub"]).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("out")).unwrap();
        let spec = job_spec(&cli, script, tmp.path().to_str().unwrap()).unwrap();
        assert_eq!(spec.stderr, "/logs/dask-worker.e%j");
        assert_eq!(spec.stdout, "out/dask-worker.o%j");
        // A file stays a file; a name with % stays literal in the pattern.
        let script = "#PBS -N 100%\n#PBS -o run.log\n#PBS -e /logs/\n";
        let spec = job_spec(&cli, script, tmp.path().to_str().unwrap()).unwrap();
        assert_eq!(
            (spec.stdout.as_str(), spec.stderr.as_str()),
            ("run.log", "/logs/100%%.e%j")
        );
    }

    #[test]
    fn qstat_prints_as_pbs_prints_it() {
        let jobs = vec![
            pb::JobInfo {
                job_id: 12,
                name: "relax".into(),
                user: "alice".into(),
                partition: "normal".into(),
                state_code: "PD".into(),
                held: true,
                ..Default::default()
            },
            pb::JobInfo {
                job_id: 13,
                name: "md".into(),
                user: "bob".into(),
                partition: "express".into(),
                state_code: "CD".into(),
                start_time_ms: Some(0),
                end_time_ms: Some(3_723_000),
                exit_code: Some(0),
                ..Default::default()
            },
        ];
        assert_eq!(
            qstat_table(&jobs, "gadi"),
            "Job id            Name             User             Time Use S Queue   \n\
             ----------------- ---------------- ---------------- -------- - --------\n\
             12.gadi           relax            alice                   0 H normal  \n\
             13.gadi           md               bob               1:02:03 F express \n"
        );
        let full = qstat_full(&jobs[1..], "gadi");
        assert!(
            full.starts_with("Job Id: 13.gadi\n    Job_Name = md\n"),
            "{full}"
        );
        assert!(
            full.contains("    job_state = F\n    queue = express\n"),
            "{full}"
        );
        assert!(full.contains("    Exit_status = 0\n"), "{full}");
    }

    #[test]
    fn pbs_resources_and_directives_map_to_the_spec() {
        let script = "#!/bin/bash\n#PBS -N mc -q express -P ab12\n#PBS -l select=2:ncpus=8:mem=16gb,walltime=02:00:00\n#PBS -l jobfs=100GB\n#PBS -W depend=afterok:12\n#PBS -j oe\ncd $PBS_O_WORKDIR\n#PBS -N ignored\n";
        let cli = QsubArgs::try_parse_from(["qsub", "-q", "normal", "-h"]).unwrap();
        let spec = job_spec(&cli, script, "/scratch").unwrap();
        assert_eq!(spec.name, "mc");
        assert_eq!(spec.partition, "normal");
        assert_eq!(spec.account, "ab12");
        assert_eq!((spec.nodes, spec.cpus_per_task), (2, 8));
        assert_eq!(
            spec.memory,
            Some(pb::job_spec::Memory::MemPerNodeMib(16 * 1024))
        );
        assert_eq!(spec.time_limit_seconds, Some(7200));
        assert_eq!(spec.jobfs_mib, Some(100 * 1024));
        assert_eq!(spec.vmem_mib, None);
        assert_eq!(spec.dependency, "afterok:12");
        assert!(spec.hold);
        assert_eq!(spec.work_dir, "/scratch");
    }

    #[test]
    fn vmem_is_a_resource_of_the_job_and_of_a_chunk() {
        let mut spec = pb::JobSpec::default();
        apply_resources(&mut spec, "vmem=2gb").unwrap();
        assert_eq!(
            (spec.vmem_mib, spec.address_space_limit),
            (Some(2048), false)
        );
        let mut spec = pb::JobSpec::default();
        apply_resources(&mut spec, "select=1:ncpus=2:vmem=4gb").unwrap();
        assert_eq!(spec.vmem_mib, Some(4096));
        let e = apply_resources(&mut spec, "vmem=huge")
            .unwrap_err()
            .to_string();
        assert!(e.contains("vmem"), "{e}");
    }

    #[test]
    fn bad_resources_name_themselves_and_ids_parse() {
        let mut spec = pb::JobSpec::default();
        for (l, key) in [
            ("select=2:cores=4", "select"),
            ("walltime=soon", "walltime"),
            ("mem=lots", "mem"),
            ("disk=1gb", "disk"),
        ] {
            let e = apply_resources(&mut spec, l).unwrap_err().to_string();
            assert!(e.contains(key), "{l}: {e}");
        }
        assert_eq!(pbs_id("123.gadi-pbs").unwrap(), 123);
        assert_eq!(pbs_id("77").unwrap(), 77);
        assert!(pbs_id("x.y").is_err());
        let j = pb::JobInfo {
            state_code: "PD".into(),
            held: true,
            ..Default::default()
        };
        assert_eq!(pbs_state(&j), "H");
    }
}
