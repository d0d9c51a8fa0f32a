//! `squeue`: the queue in Slurm's default columns
//! (`JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)`), `-l` for the long form,
//! `-s` for running steps (`STEPID NAME PARTITION USER TIME NODELIST`), `--json` for scripts.

use anyhow::Result;
use clap::Parser;
use docket_proto::v1 as pb;

use crate::client::Client;
use crate::squeue_format;

/// Show the queue.
#[derive(Debug, Clone, Parser)]
#[command(name = "squeue", version, disable_help_flag = true)]
pub struct SqueueArgs {
    /// Print help (`-h` is --noheader, as in Slurm).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Only these users' jobs (comma-separated).
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    pub users: Vec<String>,
    /// Only my jobs.
    #[arg(long)]
    pub me: bool,
    /// Only these jobs.
    #[arg(short = 'j', long = "jobs", value_delimiter = ',')]
    pub jobs: Vec<u64>,
    /// Only these partitions.
    #[arg(short = 'p', long = "partition", value_delimiter = ',')]
    pub partitions: Vec<String>,
    /// Only these states (PD, R, PENDING, ...; `all` for every state).
    #[arg(short = 't', long = "states", value_delimiter = ',')]
    pub states: Vec<String>,
    /// No header.
    #[arg(short = 'h', long = "noheader")]
    pub noheader: bool,
    /// Long form: STATE and TIME_LIMIT columns.
    #[arg(short = 'l', long)]
    pub long: bool,
    /// Output format: `%[.][width]letter` fields among text, e.g. "%.18i %.9P %.8j %T".
    #[arg(short = 'o', long = "format")]
    pub format: Option<String>,
    /// Output format by field names: "JobID:10,Partition,Name:.20,State".
    #[arg(short = 'O', long = "Format")]
    pub big_format: Option<String>,
    /// Steps instead of jobs: every running step, or only these (`JOBID.STEP`, comma-
    /// separated).
    #[arg(short = 's', long = "steps", num_args = 0..=1, default_missing_value = "",
          value_name = "STEPS")]
    pub steps: Option<String>,
    /// JSON (one object with a `jobs` array).
    #[arg(long)]
    pub json: bool,
    /// Controllers, host:port,... (default: DOCKET_ADDR).
    #[arg(long)]
    pub addr: Option<String>,
}

/// The output pieces the options ask for: `-O`, else `-o`, else the steps' default with
/// `-s`, else `SQUEUE_FORMAT2` / `SQUEUE_FORMAT`, else `-l` or the default.
pub fn pieces(a: &SqueueArgs) -> Result<Vec<squeue_format::Piece>> {
    if let Some(f) = &a.big_format {
        return squeue_format::parse_big_o(f);
    }
    if let Some(f) = &a.format {
        return squeue_format::parse_o(f);
    }
    if a.steps.is_some() {
        return squeue_format::parse_o(squeue_format::STEPS);
    }
    if let Ok(f) = std::env::var("SQUEUE_FORMAT2") {
        return squeue_format::parse_big_o(&f);
    }
    if let Ok(f) = std::env::var("SQUEUE_FORMAT") {
        return squeue_format::parse_o(&f);
    }
    squeue_format::parse_o(if a.long {
        squeue_format::LONG
    } else {
        squeue_format::DEFAULT
    })
}

pub fn run(a: SqueueArgs) -> Result<()> {
    let pieces = pieces(&a)?;
    let client = Client::new(a.addr.as_deref())?;
    let mut users = a.users.clone();
    if a.me {
        users.push(client.user()?.to_owned());
    }
    // `-t all`: every state, finished ones included (Slurm's word).
    let all_states = a.states.iter().any(|s| s.eq_ignore_ascii_case("all"));
    let states: Vec<String> = if all_states {
        Vec::new()
    } else {
        a.states.clone()
    };
    let runtime = crate::client::runtime()?;
    let mut jobs = runtime.block_on(crate::listing::all_jobs(
        &client,
        pb::ListJobsRequest {
            users,
            partitions: a.partitions.clone(),
            states,
            job_ids: a.jobs.clone(),
            ..Default::default()
        },
    ))?;
    // squeue shows the queue: finished jobs only when asked for by state.
    if a.states.is_empty() {
        // (Not with `-t all`, which names every state.)
        jobs.retain(|j| matches!(j.state_code.as_str(), "PD" | "R" | "S" | "CG"));
    }
    if let Some(wanted) = &a.steps {
        return print_steps(&jobs, wanted, &pieces, !a.noheader);
    }
    if a.json {
        let rows = jobs.iter().map(crate::slurm_json::squeue_job).collect();
        println!("{}", crate::slurm_json::document("squeue", rows));
        return Ok(());
    }
    let now_ms = docket_proto::unix_ms();
    print!(
        "{}",
        squeue_format::render(&jobs, &pieces, !a.noheader, now_ms)
    );
    Ok(())
}

/// `squeue -s`: the live steps of the listed jobs, or only the steps `wanted` names.
fn print_steps(
    jobs: &[pb::JobInfo],
    wanted: &str,
    pieces: &[squeue_format::Piece],
    header: bool,
) -> Result<()> {
    let wanted: Vec<(u64, u32)> = wanted
        .split(',')
        .filter(|w| !w.trim().is_empty())
        .map(|w| {
            let r: docket_core::job::step::StepRef =
                w.trim().parse().map_err(|e| anyhow::anyhow!("-s: {e}"))?;
            Ok((r.job.0, r.step.0))
        })
        .collect::<Result<_>>()?;
    let steps: Vec<_> = jobs
        .iter()
        .flat_map(|j| j.steps.iter().map(move |s| (j, s)))
        .filter(|(_, s)| s.end_time_ms.is_none())
        .filter(|(j, s)| wanted.is_empty() || wanted.contains(&(j.job_id, s.step_id)))
        .collect();
    let now_ms = docket_proto::unix_ms();
    print!(
        "{}",
        squeue_format::render_steps(&steps, pieces, header, now_ms)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_are_consistent() {
        use clap::CommandFactory;
        SqueueArgs::command().debug_assert();
        crate::sbatch::SbatchArgs::command().debug_assert();
        crate::scancel::ScancelArgs::command().debug_assert();
        crate::sinfo::SinfoArgs::command().debug_assert();
        crate::sacct::SacctArgs::command().debug_assert();
        crate::scontrol::ScontrolArgs::command().debug_assert();
        crate::pbs::QsubArgs::command().debug_assert();
        crate::sprio::SprioArgs::command();
        crate::sshare::SshareArgs::command().debug_assert();
        crate::pbsnodes::PbsnodesArgs::command().debug_assert();
        crate::pbs::QstatArgs::command().debug_assert();
    }

    fn format(jobs: &[pb::JobInfo], long: bool, header: bool, now_ms: u64) -> String {
        let format = if long {
            squeue_format::LONG
        } else {
            squeue_format::DEFAULT
        };
        squeue_format::render(
            jobs,
            &squeue_format::parse_o(format).unwrap(),
            header,
            now_ms,
        )
    }

    #[test]
    fn the_default_columns_match_slurms() {
        let jobs = vec![
            pb::JobInfo {
                job_id: 12,
                name: "a-very-long-name".into(),
                user: "alice".into(),
                partition: "batch".into(),
                state: "RUNNING".into(),
                state_code: "R".into(),
                start_time_ms: Some(1_000_000),
                nodes: 2,
                node_list: "n[01-02]".into(),
                time_limit_seconds: 3600,
                ..Default::default()
            },
            pb::JobInfo {
                job_id: 13,
                name: "w".into(),
                user: "bob".into(),
                partition: "big".into(),
                state: "PENDING".into(),
                state_code: "PD".into(),
                reason: "Priority".into(),
                nodes: 1,
                array: "0-7%2".into(),
                ..Default::default()
            },
        ];
        let text = format(&jobs, false, true, 1_000_000 + 323_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)"
        );
        assert_eq!(
            lines[1],
            "                12     batch a-very-l    alice  R       5:23      2 n[01-02]"
        );
        assert_eq!(
            lines[2],
            "        13_[0-7%2]       big        w      bob PD       0:00      1 (Priority)"
        );
        let long = format(&jobs, true, true, 1_000_000);
        assert!(long.lines().next().unwrap().contains("TIME_LIMI"));
        assert!(long.contains("1:00:00"));
        assert!(!format(&jobs, false, false, 0).contains("JOBID"));
    }
}
