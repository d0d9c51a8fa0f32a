//! A step's tasks on this node: their environment, their output files, their start.
//!
//! A task starts like a batch script: `exec-as-user` run by root with root's fixed
//! environment joins the step's cgroups, reads the task's environment from the run's private
//! directory, drops to the job's user for good and only then enters the working directory,
//! opens `-o`/`-e` files (as the user, never through a symlink) and executes the command. Its
//! standard streams are pipes to the agent, which carries them to srun.
//!
//! With `--pty`, task 0's standard streams are instead the slave side of a pseudo-terminal
//! the agent opened (`/dev/ptmx`, the slave through the master's descriptor: nothing a user
//! names). The slave is handed to the user through its descriptor (`fchown`, mode 0620
//! as login(1) leaves a terminal), and the task starts in a session of its own with the
//! terminal as its controlling terminal, so that a shell on it has job control and Ctrl-C
//! typed at srun reaches its foreground job through the terminal's line discipline.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use docket_proto::v1 as pb;

use super::StepBase;

/// The environment the step's tasks on this node share: srun's environment, this node's
/// own variables, then the step's `SLURM_*` (Slurm's names; see srun(1), "OUTPUT ENVIRONMENT
/// VARIABLES"). Each task's place in the step is [`task_variables`], set over it.
pub fn step_environment(
    srun_env: &[String],
    base: &StepBase,
    grant: &pb::StepGrant,
    node: &str,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = srun_env
        .iter()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (!k.is_empty()).then(|| (k.to_owned(), v.to_owned()))
        })
        .collect();
    env.extend(base.node_env.iter().cloned());
    let mut set = |k: &str, v: String| {
        env.insert(k.to_owned(), v);
    };
    let step = grant.step_id.to_string();
    set("SLURM_JOB_ID", grant.job_id.to_string());
    set("SLURM_JOBID", grant.job_id.to_string());
    set("SLURM_STEP_ID", step.clone());
    set("SLURM_STEPID", step);
    set("SLURM_NODEID", grant.node_index.to_string());
    set("SLURM_NTASKS", grant.ntasks.to_string());
    set("SLURM_NPROCS", grant.ntasks.to_string());
    set("SLURM_NNODES", grant.nnodes.to_string());
    set("SLURM_STEP_NUM_TASKS", grant.ntasks.to_string());
    set("SLURM_STEP_NUM_NODES", grant.nnodes.to_string());
    set("SLURM_STEP_NODELIST", grant.node_list.clone());
    set("SLURM_STEP_TASKS_PER_NODE", grant.tasks_per_node.clone());
    set("SLURM_TASKS_PER_NODE", grant.tasks_per_node.clone());
    set(
        "SLURM_CPUS_PER_TASK",
        grant.cpus_per_task.max(1).to_string(),
    );
    set("SLURMD_NODENAME", node.to_owned());
    // PBS's name for the node's place (pbsdsh's copies read it).
    set("PBS_NODENUM", grant.node_index.to_string());
    env
}

/// The variables of the task with global id `task`, the `local`-th on this node (PBS's
/// names too).
pub fn task_variables(task: u32, local: u32) -> Vec<(String, String)> {
    [
        ("SLURM_PROCID", task),
        ("SLURM_LOCALID", local),
        ("PBS_TASKNUM", task),
        ("PBS_VNODENUM", task),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_string()))
    .collect()
}

/// An output file name from srun's `-o`/`-e` pattern (srun(1), "IO Redirection"): `%t` the
/// task id, `%n` the node's index in the step, `%N` the node's name, `%j` the job id, `%s` the
/// step id, `%J` `job.step`, `%u` the user, `%%` a percent sign. Empty: none (the output
/// streams to srun).
pub fn output_path(
    pattern: &str,
    grant: &pb::StepGrant,
    node: &str,
    user: &str,
    task: u32,
) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push_str(&task.to_string()),
            Some('n') => out.push_str(&grant.node_index.to_string()),
            Some('N') => out.push_str(node),
            Some('j') => out.push_str(&grant.job_id.to_string()),
            Some('s') => out.push_str(&grant.step_id.to_string()),
            Some('J') => out.push_str(&format!("{}.{}", grant.job_id, grant.step_id)),
            Some('u') => out.push_str(user),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// How one task is started.
pub struct TaskLaunch<'a> {
    pub shim: &'a Path,
    pub base: &'a StepBase,
    /// The step's `cgroup.procs` files (none unconfined).
    pub join: Vec<PathBuf>,
    /// The step's environment, already written to this file of root's.
    pub env_file: PathBuf,
    /// The task's own variables, set over the file's.
    pub set: Vec<(String, String)>,
    pub argv: &'a [String],
    pub work_dir: PathBuf,
    /// `-o` / `-e` files for this task; None: a pipe to the agent.
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    /// Whether it reads srun's standard input (else /dev/null).
    pub stdin: bool,
    /// `--pty`: the terminal it runs on (all three standard streams).
    pub pty: Option<&'a pty_process::Pts>,
    /// Its output goes nowhere (the tasks beside a `--pty` task 0).
    pub quiet: bool,
}

impl std::fmt::Debug for TaskLaunch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskLaunch")
            .field("argv", &self.argv)
            .field("work_dir", &self.work_dir)
            .field("stdout", &self.stdout)
            .field("stderr", &self.stderr)
            .field("stdin", &self.stdin)
            .field("pty", &self.pty.is_some())
            .field("quiet", &self.quiet)
            .finish_non_exhaustive()
    }
}

/// A new pseudo-terminal of `size` for a task of `uid`: the agent keeps the master side.
///
/// Both sides are opened close-on-exec from the start (`/dev/ptmx` with `O_CLOEXEC`, the
/// slave through `TIOCGPTPEER` on the master, never by its `/dev/pts/N` path): the agent
/// starts other users' tasks from other threads meanwhile, and none of them may inherit
/// this terminal even for an instant.
pub fn open_terminal(
    size: &pb::TerminalSize,
    uid: u32,
) -> std::io::Result<(pty_process::Pty, pty_process::Pts)> {
    use rustix::pty::{OpenptFlags, grantpt, ioctl_tiocgptpeer, openpt, unlockpt};
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = openpt(flags)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let slave = ioctl_tiocgptpeer(&master, flags)?;
    nix::unistd::fchown(&slave, Some(nix::unistd::Uid::from_raw(uid)), None)?;
    nix::sys::stat::fchmod(&slave, nix::sys::stat::Mode::from_bits_truncate(0o620))?;
    // The agent reads and writes the master from its runtime: never blocking (the slave,
    // a separate open file, stays blocking for the task).
    nix::fcntl::fcntl(
        &master,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )?;
    // SAFETY: `master` is the open master side of the pseudo-terminal opened above, in
    // non-blocking mode, as `from_fd` requires.
    let pty = unsafe { pty_process::Pty::from_fd(master) }.map_err(std::io::Error::other)?;
    // SAFETY: `slave` is that terminal's open slave side.
    let pts = unsafe { pty_process::Pts::from_fd(slave) };
    pty.resize(terminal_size(size))
        .map_err(std::io::Error::other)?;
    Ok((pty, pts))
}

/// A terminal size from srun's, bounded to what a terminal holds.
pub fn terminal_size(size: &pb::TerminalSize) -> pty_process::Size {
    let clamp = |v: u32, default: u16| match u16::try_from(v) {
        Ok(0) => default,
        Ok(v) => v,
        Err(_) => u16::MAX,
    };
    pty_process::Size::new(clamp(size.rows, 24), clamp(size.cols, 80))
}

/// Starts the task; its pid is the command's (the shim executes it in place).
pub fn spawn(t: &TaskLaunch<'_>) -> std::io::Result<tokio::process::Child> {
    use std::process::Stdio;
    let to_files = t.stdout.is_some() || t.stderr.is_some();
    let args = crate::shim::ShimArgs {
        join: t.join.clone(),
        user: t.base.user.clone(),
        uid: t.base.uid,
        gid: t.base.gid,
        rlimit_as: t.base.rlimit_as,
        env_file: Some(t.env_file.clone()),
        set: t.set.clone(),
        work_dir: t.work_dir.clone(),
        stdout: PathBuf::from(t.stdout.clone().unwrap_or_else(|| "/dev/null".into())),
        stderr: PathBuf::from(
            t.stderr
                .clone()
                .or_else(|| t.stdout.clone())
                .unwrap_or_else(|| "/dev/null".into()),
        ),
        inherit_stdio: !to_files,
        command: t.argv.to_vec(),
    };
    if let Some(pts) = t.pty {
        // Its own session (setsid) on its terminal (TIOCSCTTY), made so between fork and
        // exec: the shim then joins the cgroups and drops privileges as for any task.
        return pty_process::Command::new(t.shim)
            .arg("exec-as-user")
            .args(args.to_args())
            .env_clear()
            .env("PATH", crate::shim::ROOT_PATH)
            .current_dir("/")
            .kill_on_drop(false)
            .spawn_borrowed(pts)
            .map_err(std::io::Error::other);
    }
    let mut cmd = tokio::process::Command::new(t.shim);
    cmd.arg("exec-as-user")
        .args(args.to_args())
        // Root runs with root's environment, never the task's.
        .env_clear()
        .env("PATH", crate::shim::ROOT_PATH)
        .current_dir("/")
        .stdin(if t.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(if to_files || t.quiet {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stderr(if to_files || t.quiet {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .process_group(0)
        .kill_on_drop(false);
    cmd.spawn()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> pb::StepGrant {
        pb::StepGrant {
            job_id: 42,
            epoch: 1,
            step_id: 3,
            first_task: 2,
            tasks: 2,
            cpus_per_task: 1,
            ntasks: 5,
            nnodes: 2,
            node_index: 1,
            node_list: "n[01-02]".into(),
            tasks_per_node: "2,3".into(),
            ..Default::default()
        }
    }

    #[test]
    fn output_patterns_expand_as_srun_documents() {
        let g = grant();
        assert_eq!(
            output_path("out-%j.%s-%t-%n-%N-%u-%J-100%%-%x", &g, "n02", "ann", 4),
            "out-42.3-4-1-n02-ann-42.3-100%-%x"
        );
        assert_eq!(output_path("trailing%", &g, "n02", "ann", 4), "trailing%");
    }

    #[test]
    fn a_task_sees_its_place_in_the_step_and_its_own_node() {
        let base = StepBase {
            user: "ann".into(),
            uid: 1000,
            gid: 1000,
            rlimit_as: None,
            work_dir: "/home/ann".into(),
            node_env: vec![("TMPDIR".into(), "/jobfs/42.1".into())],
            run_dir: "/var/lib/docket/runs/42.1".into(),
        };
        let srun = vec![
            "PATH=/usr/bin".to_owned(),
            "TMPDIR=/jobfs/other-node".to_owned(),
            "SLURM_PROCID=99".to_owned(),
            "=bad".to_owned(),
            "bad".to_owned(),
        ];
        let mut env = step_environment(&srun, &base, &grant(), "n02");
        assert_eq!(env.get("SLURM_PROCID").map(String::as_str), Some("99"));
        env.extend(task_variables(3, 1));
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("PATH"), Some("/usr/bin"));
        assert_eq!(get("TMPDIR"), Some("/jobfs/42.1"));
        assert_eq!(get("SLURM_PROCID"), Some("3"));
        assert_eq!(get("SLURM_LOCALID"), Some("1"));
        assert_eq!(get("SLURM_NODEID"), Some("1"));
        assert_eq!(get("SLURM_NTASKS"), Some("5"));
        assert_eq!(get("SLURM_NNODES"), Some("2"));
        assert_eq!(get("SLURM_STEP_ID"), Some("3"));
        assert_eq!(get("SLURM_STEP_NODELIST"), Some("n[01-02]"));
        assert_eq!(get("SLURM_STEP_NUM_TASKS"), Some("5"));
        assert_eq!(get("SLURM_TASKS_PER_NODE"), Some("2,3"));
        assert_eq!(get("SLURMD_NODENAME"), Some("n02"));
        assert_eq!(get("PBS_TASKNUM"), Some("3"));
        assert_eq!(get("PBS_NODENUM"), Some("1"));
        assert!(!env.contains_key(""));
    }
}
