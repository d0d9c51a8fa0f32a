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

/// The monitor: runs `exec-as-user` as the job and records its end in `run_dir`.
pub fn monitor(run_dir: &Path, args: &ShimArgs) -> Result<()> {
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
