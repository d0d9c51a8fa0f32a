//! `docket-nodeagent exec-job`: the first process of every job, started by the agent as root.
//!
//! It joins the job's cgroups while still root (so nothing the job forks can escape them),
//! sets the address-space limit when the job asked for one, takes the user's identity
//! (supplementary groups, group, user) and then executes the batch script in its place, with
//! the environment, directory, output files and process group the agent gave it. Safe Rust
//! only: no code runs between fork and exec in the agent itself.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use nix::unistd::{Gid, Uid};

/// What the shim does, from its command line.
#[derive(Debug, Clone)]
pub struct ShimArgs {
    pub join: Vec<PathBuf>,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub rlimit_as: Option<u64>,
    pub command: Vec<String>,
}

/// Does it; returns only on failure.
pub fn exec_job(args: &ShimArgs) -> Result<std::convert::Infallible> {
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
        bail!("exec-job: no command");
    };
    let err = std::process::Command::new(program).args(rest).exec();
    Err(err).with_context(|| format!("executing {program}"))
}
