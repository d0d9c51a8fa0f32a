//! squeue's output formats: `-o` (`%[.][width]letter` fields among literal text, as in
//! `%.18i %.9P %.8j`) and `-O` (`Name[:[.]width]`, comma-separated). A width truncates and
//! pads; `.` right-justifies. The default and `-l` outputs are `-o` formats, as in Slurm.

use anyhow::{Result, bail};
use docket_proto::v1 as pb;

use crate::slurmtime;

/// squeue's default output.
pub const DEFAULT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";
/// `squeue -l`.
pub const LONG: &str = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R";
/// `squeue -s`: one line per running step.
pub const STEPS: &str = "%.15i %.8j %.9P %.8u %.9M %N";

/// A column: what it shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    JobId,
    ArrayJobId,
    ArrayTaskId,
    Account,
    Cpus,
    Nodes,
    Name,
    TimeLimit,
    TimeLeft,
    TimeUsed,
    NodeList,
    Partition,
    Qos,
    Reason,
    ReasonList,
    StartTime,
    SubmitTime,
    EndTime,
    StateCompact,
    State,
    User,
    WorkDir,
    Dependency,
    Comment,
}

/// `-o` letters and `-O` names, with the header each prints.
const FIELDS: &[(char, &str, &str, Field)] = &[
    ('i', "JobID", "JOBID", Field::JobId),
    ('A', "JobArrayID", "JOBID", Field::ArrayJobId),
    ('F', "ArrayJobID", "ARRAY_JOB_ID", Field::ArrayJobId),
    ('K', "ArrayTaskID", "ARRAY_TASK_ID", Field::ArrayTaskId),
    ('a', "Account", "ACCOUNT", Field::Account),
    ('C', "NumCPUs", "CPUS", Field::Cpus),
    ('D', "NumNodes", "NODES", Field::Nodes),
    ('j', "Name", "NAME", Field::Name),
    ('l', "TimeLimit", "TIME_LIMIT", Field::TimeLimit),
    ('L', "TimeLeft", "TIME_LEFT", Field::TimeLeft),
    ('M', "TimeUsed", "TIME", Field::TimeUsed),
    ('N', "NodeList", "NODELIST", Field::NodeList),
    ('P', "Partition", "PARTITION", Field::Partition),
    ('q', "QOS", "QOS", Field::Qos),
    ('r', "Reason", "REASON", Field::Reason),
    ('R', "ReasonList", "NODELIST(REASON)", Field::ReasonList),
    ('S', "StartTime", "START_TIME", Field::StartTime),
    ('V', "SubmitTime", "SUBMIT_TIME", Field::SubmitTime),
    ('e', "EndTime", "END_TIME", Field::EndTime),
    ('t', "StateCompact", "ST", Field::StateCompact),
    ('T', "State", "STATE", Field::State),
    ('u', "UserName", "USER", Field::User),
    ('Z', "WorkDir", "WORK_DIR", Field::WorkDir),
    ('E', "Dependency", "DEPENDENCY", Field::Dependency),
    ('k', "Comment", "COMMENT", Field::Comment),
];

/// A piece of an output line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Column {
        field: Field,
        header: &'static str,
        width: Option<usize>,
        right: bool,
    },
}

fn letters() -> String {
    FIELDS.iter().map(|f| f.0).collect()
}

/// Parses a `-o` format.
pub fn parse_o(format: &str) -> Result<Vec<Piece>> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            text.push('%');
            continue;
        }
        let right = chars.peek() == Some(&'.');
        if right {
            chars.next();
        }
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        let Some(letter) = chars.next() else {
            bail!("-o {format:?}: a field ends the format without its letter");
        };
        let Some(&(_, _, header, field)) = FIELDS.iter().find(|f| f.0 == letter) else {
            bail!(
                "-o {format:?}: %{letter} is not a field squeue prints here (one of {})",
                letters()
            );
        };
        if !text.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut text)));
        }
        out.push(Piece::Column {
            field,
            header,
            width: width(&digits, format)?,
            right,
        });
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

fn width(digits: &str, format: &str) -> Result<Option<usize>> {
    if digits.is_empty() {
        return Ok(None);
    }
    match digits.parse::<usize>() {
        Ok(w) if w <= 1024 => Ok(Some(w)),
        _ => bail!("{format:?}: width {digits} is over the limit of 1024"),
    }
}

/// Parses a `-O` format: `Name[:[.]width]`, comma-separated; width 20 unless given, as in
/// Slurm; columns separated by one space.
pub fn parse_big_o(format: &str) -> Result<Vec<Piece>> {
    let mut out = Vec::new();
    for (k, item) in format.split(',').enumerate() {
        let (name, spec) = item.split_once(':').unwrap_or((item, ""));
        let Some(&(_, _, header, field)) = FIELDS
            .iter()
            .find(|f| f.1.eq_ignore_ascii_case(name.trim()))
        else {
            let names: Vec<&str> = FIELDS.iter().map(|f| f.1).collect();
            bail!(
                "-O: {name:?} is not a field squeue prints here (one of {})",
                names.join(", ")
            );
        };
        let right = spec.starts_with('.');
        let w = width(spec.trim_start_matches('.'), format)?.or(Some(20));
        if k > 0 {
            out.push(Piece::Text(" ".into()));
        }
        out.push(Piece::Column {
            field,
            header,
            width: w,
            right,
        });
    }
    Ok(out)
}

/// The text of one field of one job at `now_ms`.
pub fn value(j: &pb::JobInfo, field: Field, now_ms: u64) -> String {
    let used = match (j.start_time_ms, j.end_time_ms) {
        (Some(s), Some(e)) => e.saturating_sub(s) / 1000,
        (Some(s), None) => now_ms.saturating_sub(s) / 1000,
        _ => 0,
    };
    match field {
        Field::JobId => match j.array_task {
            Some(t) => format!("{}_{t}", j.job_id),
            None if !j.array.is_empty() => format!("{}_[{}]", j.job_id, j.array),
            None => j.job_id.to_string(),
        },
        Field::ArrayJobId => j.job_id.to_string(),
        Field::ArrayTaskId => match j.array_task {
            Some(t) => t.to_string(),
            None if !j.array.is_empty() => j.array.clone(),
            None => "N/A".into(),
        },
        Field::Account => j.account.clone(),
        // Slurm prints a job without a comment as "(null)".
        Field::Comment if j.comment.is_empty() => "(null)".into(),
        Field::Comment => j.comment.clone(),
        Field::Cpus => j.cpus.to_string(),
        Field::Nodes => j.nodes.to_string(),
        Field::Name => j.name.clone(),
        Field::TimeLimit => slurmtime::limit(j.time_limit_seconds),
        Field::TimeLeft => match j.time_limit_seconds {
            0 => "UNLIMITED".into(),
            l => slurmtime::duration(l.saturating_sub(used)),
        },
        Field::TimeUsed => slurmtime::duration(used),
        Field::NodeList => j.node_list.clone(),
        Field::Partition => j.partition.clone(),
        Field::Qos => j.qos.clone(),
        Field::Reason => j.reason.clone(),
        Field::ReasonList => {
            if j.state_code == "PD" {
                format!("({})", j.reason)
            } else {
                j.node_list.clone()
            }
        }
        Field::StartTime => match j.start_time_ms {
            Some(_) => slurmtime::timestamp(j.start_time_ms),
            None => "N/A".into(),
        },
        Field::SubmitTime => slurmtime::timestamp(Some(j.submit_time_ms)),
        Field::EndTime => match j.end_time_ms {
            Some(_) => slurmtime::timestamp(j.end_time_ms),
            None => "N/A".into(),
        },
        Field::StateCompact => j.state_code.clone(),
        Field::State => j.state.clone(),
        Field::User => j.user.clone(),
        Field::WorkDir => j.work_dir.clone(),
        Field::Dependency => {
            if j.dependency.is_empty() {
                "(null)".into()
            } else {
                j.dependency.clone()
            }
        }
    }
}

/// The text of one field of one step of job `j` at `now_ms`: the step's own id, name,
/// time, nodes, tasks' cpus and state; the job's account, partition, user and the rest.
pub fn step_value(j: &pb::JobInfo, s: &pb::StepInfo, field: Field, now_ms: u64) -> String {
    let used = s
        .end_time_ms
        .unwrap_or(now_ms)
        .saturating_sub(s.start_time_ms)
        / 1000;
    match field {
        Field::JobId => match j.array_task {
            Some(t) => format!("{}_{t}.{}", j.job_id, s.step_id),
            None => format!("{}.{}", j.job_id, s.step_id),
        },
        Field::Name => s.name.clone(),
        Field::TimeUsed => slurmtime::duration(used),
        Field::TimeLeft | Field::TimeLimit => "UNLIMITED".into(),
        Field::NodeList | Field::ReasonList => s.node_list.clone(),
        Field::Nodes => s.nodes.to_string(),
        Field::Cpus => s.cpus.to_string(),
        Field::State => s.state.clone(),
        Field::StateCompact => docket_core::job::JobState::parse(s.state_typed().slurm_name())
            .map_or_else(|| s.state.chars().take(2).collect(), |st| st.code().into()),
        Field::StartTime => slurmtime::timestamp(Some(s.start_time_ms)),
        Field::EndTime => match s.end_time_ms {
            Some(_) => slurmtime::timestamp(s.end_time_ms),
            None => "N/A".into(),
        },
        other => value(j, other, now_ms),
    }
}

/// `squeue -s`: a header (the job id column headed `STEPID`) and one line per step.
pub fn render_steps(
    steps: &[(&pb::JobInfo, &pb::StepInfo)],
    pieces: &[Piece],
    header: bool,
    now_ms: u64,
) -> String {
    let mut out = String::new();
    if header {
        out.push_str(&line(pieces, |f, h| {
            if f == Field::JobId { "STEPID" } else { h }.to_owned()
        }));
        out.push('\n');
    }
    for (j, s) in steps {
        out.push_str(&line(pieces, |f, _| step_value(j, s, f, now_ms)));
        out.push('\n');
    }
    out
}

fn cell(text: &str, width: Option<usize>, right: bool) -> String {
    match width {
        None => text.to_owned(),
        Some(w) => {
            let t: String = text.chars().take(w).collect();
            if right {
                format!("{t:>w$}")
            } else {
                format!("{t:<w$}")
            }
        }
    }
}

fn line(pieces: &[Piece], mut text_of: impl FnMut(Field, &'static str) -> String) -> String {
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Column {
                field,
                header,
                width,
                right,
            } => out.push_str(&cell(&text_of(*field, header), *width, *right)),
        }
    }
    out.trim_end().to_owned()
}

/// The listing: a header line (unless `header` is false) and one line per job.
pub fn render(jobs: &[pb::JobInfo], pieces: &[Piece], header: bool, now_ms: u64) -> String {
    let mut out = String::new();
    if header {
        out.push_str(&line(pieces, |_, h| h.to_owned()));
        out.push('\n');
    }
    for j in jobs {
        out.push_str(&line(pieces, |f, _| value(j, f, now_ms)));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> pb::JobInfo {
        pb::JobInfo {
            job_id: 7,
            name: "analysis".into(),
            user: "alice".into(),
            account: "physics".into(),
            partition: "batch".into(),
            state: "RUNNING".into(),
            state_code: "R".into(),
            start_time_ms: Some(10_000),
            time_limit_seconds: 600,
            nodes: 1,
            cpus: 4,
            node_list: "n01".into(),
            ..Default::default()
        }
    }

    #[test]
    fn dash_o_fields_pad_truncate_and_justify() {
        let p = parse_o("%.5i|%4j|%3u|%%|%C cpus %L").unwrap();
        let text = render(&[job()], &p, true, 70_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "JOBID|NAME|USE|%|CPUS cpus TIME_LEFT");
        assert_eq!(lines[1], "    7|anal|ali|%|4 cpus 9:00");
    }

    #[test]
    fn dash_capital_o_takes_names_and_widths() {
        let p = parse_big_o("JobID:6,name:.10,StateCompact:3,TimeUsed").unwrap();
        let text = render(&[job()], &p, true, 70_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "JOBID        NAME ST  TIME");
        assert_eq!(lines[1], "7        analysis R   1:00");
    }

    #[test]
    fn bad_formats_name_what_is_wrong() {
        let e = parse_o("%.8z").unwrap_err().to_string();
        assert!(e.contains("%z is not a field"), "{e}");
        assert!(parse_o("%.8").is_err());
        let e = parse_big_o("JobID,Colour").unwrap_err().to_string();
        assert!(e.contains("\"Colour\" is not a field"), "{e}");
        assert!(parse_o("%99999i").unwrap_err().to_string().contains("1024"));
    }

    #[test]
    fn steps_list_under_stepid() {
        let mut j = job();
        j.steps = vec![pb::StepInfo {
            step_id: 0,
            name: "hostname".into(),
            state: "RUNNING".into(),
            start_time_ms: 40_000,
            node_list: "n[01-02]".into(),
            ntasks: 4,
            cpus: 4,
            nodes: 2,
            ..Default::default()
        }];
        let steps: Vec<_> = j.steps.iter().map(|s| (&j, s)).collect();
        let text = render_steps(&steps, &parse_o(STEPS).unwrap(), true, 70_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "         STEPID     NAME PARTITION     USER      TIME NODELIST"
        );
        assert_eq!(
            lines[1],
            "            7.0 hostname     batch    alice      0:30 n[01-02]"
        );
    }
}
