//! The processes between the agent and a job's script.
//!
//! `docket-nodeagent exec-job` is the job's **monitor**, started by the agent as root in a
//! process group of its own and outside the job's cgroups: it starts `exec-as-user` in a new
//! process group (the job's), records that group in `<run dir>/pgid`, waits for it, and writes
//! how it ended to `<run dir>/exit` (`code signal`). The monitor outlives an agent restart
//! (like Slurm's slurmstepd), so a restarted agent re-adopts the run and still learns its exit
//! status.
//!
//! `docket-nodeagent exec-as-user` joins the job's cgroups while still root (so nothing the
//! job forks can escape them), sets the address-space limit when the job asked for one, takes
//! the user's identity (supplementary groups, group, user) and executes the batch script in
//! its place. Safe Rust only: no code runs between fork and exec in the agent itself.

use std::ffi::CString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use nix::unistd::{Gid, Uid};

/// What the shims do, from their command lines.
#[derive(Debug, Clone)]
pub struct ShimArgs {
    pub join: Vec<PathBuf>,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub rlimit_as: Option<u64>,
    pub command: Vec<String>,
}

/// Writes `contents` to `path` atomically (write a temporary file, rename).
pub fn write_atomically(path: &Path, contents: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// The lock a monitor holds for its whole life: an agent tells a live monitor from a dead one
/// by it, not by a pid the kernel may have given to another process since.
const MONITOR_LOCK: &str = "monitor.lock";
/// Written by an agent that found no monitor and gave the run up: a monitor that starts after
/// that (the agent crashed between starting it and recording it) must not start the job.
const ABANDONED: &str = "abandoned";

/// The monitor: runs `exec-as-user` as the job and records its end in `run_dir`.
pub fn monitor(run_dir: &Path, args: &ShimArgs) -> Result<()> {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(run_dir.join(MONITOR_LOCK))
        .context("opening the monitor lock")?;
    // Held until this process exits (the file is close-on-exec: the job does not inherit it).
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .context("taking the monitor lock")?;
    if run_dir.join(ABANDONED).exists() {
        bail!("the agent gave this run up before its monitor started; not starting the job");
    }
    let me = std::env::current_exe().context("locating this binary")?;
    let mut cmd = std::process::Command::new(me);
    cmd.arg("exec-as-user")
        .args(["--user", &args.user])
        .args(["--uid", &args.uid.to_string()])
        .args(["--gid", &args.gid.to_string()]);
    for j in &args.join {
        cmd.arg("--join").arg(j);
    }
    if let Some(r) = args.rlimit_as {
        cmd.args(["--rlimit-as", &r.to_string()]);
    }
    cmd.arg("--").args(&args.command).process_group(0);
    let mut child = cmd.spawn().context("starting the job")?;
    write_atomically(&run_dir.join("pgid"), &child.id().to_string())
        .context("recording the job's process group")?;
    let status = child.wait().context("waiting for the job")?;
    let (code, signal) = (status.code().unwrap_or(0), status.signal().unwrap_or(0));
    write_atomically(&run_dir.join("exit"), &format!("{code} {signal}\n"))
        .context("recording the job's exit")?;
    Ok(())
}

/// Reads what the monitor recorded: (exit code, signal).
pub fn read_exit(run_dir: &Path) -> Option<(i32, i32)> {
    let text = std::fs::read_to_string(run_dir.join("exit")).ok()?;
    let mut it = text.split_whitespace();
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// What an agent finds of a run's monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Monitor {
    /// It lives (it holds its lock).
    Running,
    /// It recorded the job's end: (exit code, signal).
    Ended(i32, i32),
    /// None lives and none recorded an end. The run is marked abandoned, so a monitor that
    /// was started but had not yet taken its lock never starts the job.
    Gone,
}

/// Looks for the monitor of the run in `run_dir`.
pub fn probe(run_dir: &Path) -> Monitor {
    if let Some((code, signal)) = read_exit(run_dir) {
        return Monitor::Ended(code, signal);
    }
    let Ok(lock) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(run_dir.join(MONITOR_LOCK))
    else {
        return Monitor::Gone;
    };
    match nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Err(_) => Monitor::Running,
        Ok(_held) => {
            // It may have finished between the first look and the lock.
            if let Some((code, signal)) = read_exit(run_dir) {
                return Monitor::Ended(code, signal);
            }
            // Under the lock, so a monitor not yet started sees it before it could start the job.
            let _ = std::fs::write(run_dir.join(ABANDONED), "");
            Monitor::Gone
        }
    }
}

/// Reads the job's process group, once the monitor has recorded it.
pub fn read_pgid(run_dir: &Path) -> Option<i32> {
    std::fs::read_to_string(run_dir.join("pgid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Becomes the job: joins cgroups, limits, identity, exec. Returns only on failure.
pub fn exec_as_user(args: &ShimArgs) -> Result<std::convert::Infallible> {
    let pid = std::process::id().to_string();
    for procs in &args.join {
        std::fs::write(procs, &pid).with_context(|| format!("joining {}", procs.display()))?;
    }
    if let Some(bytes) = args.rlimit_as {
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_AS, bytes, bytes)
            .context("setting RLIMIT_AS")?;
    }
    let (uid, gid) = (Uid::from_raw(args.uid), Gid::from_raw(args.gid));
    if nix::unistd::geteuid() != uid {
        let name = CString::new(args.user.as_bytes()).context("user name")?;
        nix::unistd::initgroups(&name, gid).context("initgroups")?;
        nix::unistd::setgid(gid).context("setgid")?;
        nix::unistd::setuid(uid).context("setuid")?;
        if nix::unistd::geteuid() != uid || nix::unistd::getegid() != gid {
            bail!("could not take uid {} gid {}", args.uid, args.gid);
        }
    }
    let Some((program, rest)) = args.command.split_first() else {
        bail!("exec-as-user: no command");
    };
    let err = std::process::Command::new(program).args(rest).exec();
    Err(err).with_context(|| format!("executing {program}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ShimArgs {
        ShimArgs {
            join: Vec::new(),
            user: "nobody".into(),
            uid: 65534,
            gid: 65534,
            rlimit_as: None,
            command: vec!["/bin/true".into()],
        }
    }

    #[test]
    fn a_run_without_a_live_monitor_is_given_up_and_its_late_monitor_starts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(probe(dir.path()), Monitor::Gone);
        let err = monitor(dir.path(), &args()).unwrap_err();
        assert!(format!("{err:#}").contains("gave this run up"), "{err:#}");
        assert!(read_pgid(dir.path()).is_none(), "a job was started");
    }

    #[test]
    fn a_held_lock_is_a_live_monitor_and_a_recorded_exit_is_an_end() {
        let dir = tempfile::tempdir().unwrap();
        let lock = std::fs::File::create(dir.path().join(MONITOR_LOCK)).unwrap();
        let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).unwrap();
        assert_eq!(probe(dir.path()), Monitor::Running);
        write_atomically(&dir.path().join("exit"), "0 9\n").unwrap();
        assert_eq!(probe(dir.path()), Monitor::Ended(0, 9));
        drop(held);
        assert!(!dir.path().join(ABANDONED).exists());
    }
}
