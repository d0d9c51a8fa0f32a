//! The processes between the agent and a job's script, and where root stops.
//!
//! `docket-nodeagent exec-job` is the job's **monitor**, started by the agent as root in a
//! process group of its own, outside the job's cgroups, with a fixed minimal environment (never
//! the job's: the dynamic loader would honour a user's `LD_PRELOAD` in a root process). It
//! starts `exec-as-user` in a new process group (the job's), records that group, waits for it
//! with its own `waitpid`, and records how it ended — all in the run's private directory,
//! which belongs to root with mode 0700 and is written only through its handle
//! ([`crate::rootdir`]), so nothing the job does can plant, forge or redirect those records.
//! The monitor outlives an agent restart (like Slurm's slurmstepd), so a restarted agent
//! re-adopts the run and still learns its exit status.
//!
//! The job's first process is the monitor's fork, which does `exec-as-user`'s work below
//! without starting this binary again (a batch job's launch costs one program start fewer);
//! `docket-nodeagent exec-as-user` itself starts a step's tasks.
//!
//! `exec-as-user` is the only code that crosses from root to the user.
//! While still root it joins the job's cgroups (so nothing the job forks can escape them),
//! reads the job's environment from the run's private directory, and sets the address-space
//! limit. Then it becomes the user for good — supplementary groups, group, user, checked
//! (real, effective and saved ids; a way back to root must fail), and `PR_SET_NO_NEW_PRIVS` —
//! and only then touches anything of the user's: it enters the working directory, opens the
//! output files as the user with `O_NOFOLLOW` (a symlink planted at `slurm-%j.out`, or
//! `-o /etc/passwd`, opens nothing the user could not open anyway), and executes the batch
//! script with the job's environment. A failure before that exec is sent to the monitor on a
//! close-on-exec pipe and reported as a launch failure with its reason. Safe Rust but for the
//! monitor's `fork` and its child's exit (see `start_job`).

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid};

use crate::rootdir::RootDir;

/// Why a job could not be started or watched: what was being done and why it failed, or a
/// refusal. Shown whole (`what: why`), as the launch failure's reason.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// A condition that must hold did not; the message says which.
    #[error("{0}")]
    Refused(String),
    /// A step failed: what it was doing, and why.
    #[error("{doing}: {source}")]
    Failed {
        doing: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

type Result<T, E = ShimError> = std::result::Result<T, E>;

/// Names the step an error happened in ([`ShimError::Failed`]).
trait Context<T> {
    fn context(self, doing: &str) -> Result<T>;
    fn with_context(self, doing: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<Box<dyn std::error::Error + Send + Sync>>> Context<T>
    for std::result::Result<T, E>
{
    fn context(self, doing: &str) -> Result<T> {
        self.with_context(|| doing.to_owned())
    }

    fn with_context(self, doing: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| ShimError::Failed {
            doing: doing(),
            source: e.into(),
        })
    }
}

/// Returns a [`ShimError::Refused`] with the formatted message.
macro_rules! bail {
    ($($message:tt)+) => {
        return Err(ShimError::Refused(format!($($message)+)))
    };
}

/// The environment of every process the agent runs as root: this and nothing else.
pub const ROOT_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// exec-as-user's exit status when it could not start the job.
pub const LAUNCH_FAILED: i32 = 127;

/// The mode of a run's private directory.
pub const RUN_DIR_MODE: u32 = 0o700;

/// In a run's private directory: the monitor's own messages (never the job's output).
pub const MONITOR_LOG: &str = "monitor.log";

/// The most of the job's environment block the shim reads (ARG_MAX-sized, like a real one).
const MAX_ENVIRONMENT: u64 = 4 << 20;

/// What the shims do, from their command lines.
#[derive(Debug, Clone)]
pub struct ShimArgs {
    pub join: Vec<PathBuf>,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub rlimit_as: Option<u64>,
    /// The job's environment (NUL-separated `NAME=value`), in the run's private directory.
    pub env_file: Option<PathBuf>,
    /// Variables set over the file's (a step's tasks share one file and differ only in
    /// these: their ids, which are no secret, unlike what the file holds).
    pub set: Vec<(String, String)>,
    /// Entered as the user (`/tmp` when the user cannot enter it, as Slurm does).
    pub work_dir: PathBuf,
    /// Opened as the user, appended to, never through a symlink.
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    /// Keep the standard input, output and error the shim was started with (a step's task,
    /// whose output streams to its srun) instead of opening `stdout` and `stderr`.
    pub inherit_stdio: bool,
    pub command: Vec<String>,
}

impl ShimArgs {
    /// The arguments that hand these to `exec-job` / `exec-as-user`.
    pub fn to_args(&self) -> Vec<std::ffi::OsString> {
        let mut a: Vec<std::ffi::OsString> = Vec::new();
        // `--name=value`, one word each: a value starting with '-' (an output file named
        // `-x`, say) is never read as an option.
        let mut push = |k: &str, v: &std::ffi::OsStr| {
            let mut word = std::ffi::OsString::from(format!("{k}="));
            word.push(v);
            a.push(word);
        };
        push("--user", self.user.as_ref());
        push("--uid", self.uid.to_string().as_ref());
        push("--gid", self.gid.to_string().as_ref());
        for j in &self.join {
            push("--join", j.as_os_str());
        }
        if let Some(r) = self.rlimit_as {
            push("--rlimit-as", r.to_string().as_ref());
        }
        if let Some(e) = &self.env_file {
            push("--env-file", e.as_os_str());
        }
        for (k, v) in &self.set {
            push("--set", format!("{k}={v}").as_ref());
        }
        push("--work-dir", self.work_dir.as_os_str());
        push("--stdout", self.stdout.as_os_str());
        push("--stderr", self.stderr.as_os_str());
        if self.inherit_stdio {
            a.push("--inherit-stdio".into());
        }
        a.push("--".into());
        a.extend(self.command.iter().map(Into::into));
        a
    }
}

/// The lock a monitor holds for its whole life: an agent tells a live monitor from a dead one
/// by it, not by a pid the kernel may have given to another process since.
const MONITOR_LOCK: &str = "monitor.lock";
/// Written by an agent that found no monitor and gave the run up: a monitor that starts after
/// that (the agent crashed between starting it and recording it) must not start the job.
const ABANDONED: &str = "abandoned";
/// The job's process group, as the monitor started it, and when its leader started (see
/// [`leader_start`]).
const PGID: &str = "pgid";
/// How the job ended, as the monitor's `waitpid` saw it ([`RecordedEnd`]).
const EXIT: &str = "exit";

/// How a run ended, as its monitor recorded it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecordedEnd {
    /// Exit code (0 when killed by a signal).
    pub code: i32,
    /// The signal that killed it, 0 if none.
    pub signal: i32,
    /// Why the job could not be started, when it could not (nothing of it ran).
    #[serde(default)]
    pub launch_error: Option<String>,
}

/// The monitor: starts the job as its user and records its end in `run_dir`.
pub fn monitor(run_dir: &Path, args: &ShimArgs) -> Result<()> {
    let dir = RootDir::open(run_dir, RUN_DIR_MODE).context("the run's directory")?;
    let lock = dir
        .open_lock(MONITOR_LOCK)
        .context("opening the monitor lock")?;
    // Held until this process exits (the file is close-on-exec: the job does not inherit it).
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .context("taking the monitor lock")?;
    if dir.exists(ABANDONED) {
        bail!("the agent gave this run up before its monitor started; not starting the job");
    }
    // The child's stdout and stderr until it execs the job: whatever it writes there is
    // why it could not; at the exec the pipe closes with nothing written.
    // Close-on-exec: only the child's stdout and stderr are copies without the flag, and
    // the child replaces both with the job's outputs before the job's exec (a job holding
    // this pipe could write its own "launch failure" over its real end).
    let (status_read, status_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("a status pipe")?;
    let child = start_job(args, status_write)?;
    let started = leader_start(child.as_raw()).map_or_else(String::new, |t| format!(" {t}"));
    dir.write_atomically(PGID, format!("{child}{started}").as_bytes())
        .context("recording the job's process group")?;
    let mut why = Vec::new();
    let _ = std::fs::File::from(status_read)
        .take(64 << 10)
        .read_to_end(&mut why);
    let (code, signal) = wait_for(child)?;
    let why = String::from_utf8_lossy(&why).trim().to_owned();
    // The child exits 127 when it could not start the job; anything else is the job's.
    let failed_to_start = signal == 0 && code == LAUNCH_FAILED && !why.is_empty();
    let end = RecordedEnd {
        code,
        signal,
        launch_error: failed_to_start.then_some(why),
    };
    let text = serde_json::to_vec(&end).context("encoding the job's end")?;
    dir.write_atomically(EXIT, &text)
        .context("recording the job's exit")?;
    Ok(())
}

/// Forks the job's first process, which becomes the job as `exec-as-user` would
/// ([`exec_as_user`]) in a process group of its own, with `status` as its standard output
/// and error until the job's exec; returns its pid.
///
/// A fork, not an exec of this binary's `exec-as-user`: each start of a program pays the
/// dynamic loader, whose CPUID probing traps to the hypervisor in a virtual machine, and
/// that was a fifth of all the cpu a host running many short jobs spent. The monitor may
/// fork and go on running ordinary code in the child because it is single-threaded (checked
/// here): no other thread can hold a lock the child would wait on for ever.
fn start_job(args: &ShimArgs, status: std::os::fd::OwnedFd) -> Result<nix::unistd::Pid> {
    let threads = std::fs::read_dir("/proc/self/task")
        .context("counting the monitor's threads")?
        .count();
    if threads != 1 {
        bail!("the monitor runs {threads} threads; it forks the job only when it runs one");
    }
    let null = std::fs::File::open("/dev/null").context("opening /dev/null")?;
    // SAFETY: this process is single-threaded (checked above), so the child is a complete
    // copy of it and may run any code; it ends in an exec or in `_exit`, never returning
    // here (a panic is caught: unwinding would run the monitor's destructors in the child,
    // and its lock's would release the lock it shares with the monitor).
    match unsafe { nix::unistd::fork() }.context("starting the job")? {
        nix::unistd::ForkResult::Child => {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                become_child(args, &null, &status)
            }));
            // SAFETY: ends this process at once: no atexit handler, no flush into files the
            // job may have opened.
            unsafe { libc::_exit(LAUNCH_FAILED) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            // Also here, so the group exists before it is recorded whichever runs first
            // (EACCES: the child already set it and exec'd).
            match nix::unistd::setpgid(child, child) {
                Ok(()) | Err(nix::errno::Errno::EACCES) => Ok(child),
                Err(e) => {
                    // No job may run unmonitored.
                    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                    let _ = wait_for(child);
                    Err(e).context("the job's process group")
                }
            }
        }
    }
}

/// The forked child: its own process group, `/dev/null` in, the status pipe out, nothing
/// else of the monitor's open, then the job. Returns only when it could not start the job,
/// having said why on the pipe.
fn become_child(args: &ShimArgs, null: &std::fs::File, status: &std::os::fd::OwnedFd) {
    let pid = nix::unistd::Pid::from_raw(0);
    let ready = nix::unistd::setpgid(pid, pid)
        .context("a process group")
        .and_then(|()| nix::unistd::dup2_stdin(null).context("stdin"))
        .and_then(|()| nix::unistd::dup2_stdout(status).context("stdout"))
        .and_then(|()| nix::unistd::dup2_stderr(status).context("stderr"))
        .and_then(|()| std::env::set_current_dir("/").context("entering /"));
    if let Err(e) = ready {
        let _ = std::io::stderr().write_all(format!("{e:#}").as_bytes());
        return;
    }
    // The monitor's lock, its run directory and the pipe's read end are close-on-exec, but
    // the child runs as the user before its exec, for as long as a slow output path holds
    // it: close them now, so a monitor that dies meanwhile is not taken for a live one.
    // SAFETY: closes descriptors nothing here uses again: `null` and `status` were copied
    // onto 0, 1 and 2, and their owners are never dropped in this child (it ends in `_exit`).
    unsafe { libc::close_range(3, libc::c_uint::MAX, 0) };
    let _ = exec_as_user(args);
}

/// Waits for the job's first process: its exit code (0 when a signal killed it) and the
/// signal that killed it (0 if none), any signal (nix's `waitpid` refuses to decode the
/// real-time ones, which a job could use to make its end look like a lost node).
fn wait_for(child: nix::unistd::Pid) -> Result<(i32, i32)> {
    loop {
        let mut raw = 0;
        // SAFETY: waits for our own child, writing its status into a local.
        if unsafe { libc::waitpid(child.as_raw(), &mut raw, 0) } == child.as_raw() {
            let status = std::process::ExitStatus::from_raw(raw);
            return Ok((status.code().unwrap_or(0), status.signal().unwrap_or(0)));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("waiting for the job");
        }
    }
}

/// Reads what the monitor recorded.
pub fn read_exit(dir: &RootDir) -> Option<RecordedEnd> {
    serde_json::from_str(&dir.read_text(EXIT)?).ok()
}

/// What an agent finds of a run's monitor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Monitor {
    /// It lives (it holds its lock).
    Running,
    /// It recorded the job's end.
    Ended(RecordedEnd),
    /// None lives and none recorded an end. The run is marked abandoned, so a monitor that
    /// was started but had not yet taken its lock never starts the job.
    Gone,
}

/// Looks for the monitor of the run in `dir`.
pub fn probe(dir: &RootDir) -> Monitor {
    if let Some(end) = read_exit(dir) {
        return Monitor::Ended(end);
    }
    let Ok(lock) = dir.open_lock(MONITOR_LOCK) else {
        return Monitor::Gone;
    };
    match nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Err(_) => Monitor::Running,
        Ok(_held) => {
            // It may have finished between the first look and the lock.
            if let Some(end) = read_exit(dir) {
                return Monitor::Ended(end);
            }
            // Under the lock, so a monitor not yet started sees it before it could start the job.
            let _ = dir.write_atomically(ABANDONED, b"");
            Monitor::Gone
        }
    }
}

/// Reads the job's process group, once the monitor has recorded it.
pub fn read_pgid(dir: &RootDir) -> Option<i32> {
    read_group(dir).map(|(pgid, _)| pgid)
}

/// The job's process group and, when the monitor recorded it, when its leader started.
pub fn read_group(dir: &RootDir) -> Option<(i32, Option<u64>)> {
    let text = dir.read_text(PGID)?;
    let mut words = text.split_whitespace();
    let pgid = words.next()?.parse().ok()?;
    Some((pgid, words.next().and_then(|w| w.parse().ok())))
}

/// When process `pid` started, in clock ticks since boot (`/proc/PID/stat`'s 22nd field):
/// with its pid, it names one process for good — a later process given the same number
/// started later. (Its command line does not: the job's first process is a fork of its
/// monitor, which is a fork of the launcher, until it execs the script.)
pub fn leader_start(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command, which may hold spaces, start after its last ')':
    // the state is the 3rd field, the start time the 22nd.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Becomes the job: joins cgroups, limits, identity, outputs, exec. Returns only on failure,
/// after telling the monitor why (and the job's stderr, when it is open).
pub fn exec_as_user(args: &ShimArgs) -> ShimError {
    // The monitor's pipe, kept (close-on-exec) apart from stdout, which becomes the job's.
    // A step's task has no monitor: its failure goes to its stderr, which is its srun's.
    let status = (!args.inherit_stdio)
        .then(|| std::io::stdout().as_fd().try_clone_to_owned().ok())
        .flatten();
    let mut outputs_open = args.inherit_stdio;
    let Err(e) = become_job(args, &mut outputs_open);
    let message = format!("{e:#}");
    if let Some(status) = status {
        let _ = std::fs::File::from(status).write_all(message.as_bytes());
    }
    if outputs_open {
        // Never a panic (eprintln!'s) when the user's stderr refuses the write.
        let _ = writeln!(
            std::io::stderr(),
            "docket: {} could not start: {message}",
            if args.inherit_stdio {
                "the task"
            } else {
                "the job"
            }
        );
    }
    e
}

fn become_job(args: &ShimArgs, outputs_open: &mut bool) -> Result<std::convert::Infallible> {
    // Whatever descriptor reached this process beyond the standard three (a parent's that
    // was not close-on-exec) does not reach the job.
    close_on_exec_beyond_stdio();
    // As root: things of root's only.
    let pid = std::process::id().to_string();
    for procs in &args.join {
        std::fs::write(procs, &pid).with_context(|| format!("joining {}", procs.display()))?;
    }
    let mut environment = match &args.env_file {
        Some(path) => read_environment(path)?,
        None => Vec::new(),
    };
    for (k, v) in &args.set {
        environment.retain(|(name, _)| name != k);
        environment.push((k.clone(), v.clone()));
    }
    if let Some(bytes) = args.rlimit_as {
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_AS, bytes, bytes)
            .context("setting RLIMIT_AS")?;
    }
    drop_privileges(&args.user, args.uid, args.gid)?;
    // The files the job creates get the submitter's umask (Slurm's SLURM_UMASK), never the
    // agent's; 0022 when none came.
    let mask = environment
        .iter()
        .find(|(k, _)| k == "SLURM_UMASK")
        .and_then(|(_, v)| u32::from_str_radix(v.trim(), 8).ok())
        .filter(|m| *m <= 0o777)
        .unwrap_or(0o022);
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(mask));

    // As the user: things of the user's.
    let mut warning = None;
    if let Err(e) = std::env::set_current_dir(&args.work_dir) {
        warning = Some(format!(
            "could not enter {}: {e}; running in /tmp",
            args.work_dir.display()
        ));
        std::env::set_current_dir("/tmp").context("entering /tmp")?;
    }
    if !args.inherit_stdio {
        let stdout = open_output(&args.stdout)?;
        let stderr = if args.stderr == args.stdout {
            stdout.try_clone().context("stderr")?
        } else {
            open_output(&args.stderr)?
        };
        nix::unistd::dup2_stdout(&stdout).context("stdout")?;
        nix::unistd::dup2_stderr(&stderr).context("stderr")?;
        *outputs_open = true;
        drop((stdout, stderr));
    }
    if let Some(w) = warning {
        let _ = writeln!(std::io::stderr(), "docket: {w}");
    }
    let Some((program, rest)) = args.command.split_first() else {
        bail!("no command");
    };
    let err = std::process::Command::new(program)
        .args(rest)
        .env_clear()
        .envs(environment)
        .exec();
    Err(err).with_context(|| format!("executing {program}"))
}

/// Marks every open descriptor above 2 close-on-exec.
fn close_on_exec_beyond_stdio() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: only used for this one fcntl; a descriptor listed above that has closed
        // since (the listing's own) fails with EBADF, and nothing opens one in between.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let _ = nix::fcntl::fcntl(
            borrowed,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
    }
}

/// Takes `user`'s identity for good: supplementary groups, group, user, each checked, then
/// `PR_SET_NO_NEW_PRIVS` (no setuid binary gives root back). A job of root's stays root.
pub fn drop_privileges(user: &str, uid: u32, gid: u32) -> Result<()> {
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    if nix::unistd::geteuid() != uid {
        let name = CString::new(user.as_bytes()).context("user name")?;
        nix::unistd::initgroups(&name, gid).context("initgroups")?;
        nix::unistd::setgid(gid).context("setgid")?;
        nix::unistd::setuid(uid).context("setuid")?;
    }
    let r = nix::unistd::getresuid().context("getresuid")?;
    let g = nix::unistd::getresgid().context("getresgid")?;
    if [r.real, r.effective, r.saved] != [uid; 3] || [g.real, g.effective, g.saved] != [gid; 3] {
        bail!("could not take uid {uid} gid {gid} for good (have {r:?} {g:?})");
    }
    if !uid.is_root() && nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
        bail!("uid {uid} could become root again");
    }
    nix::sys::prctl::set_no_new_privs().context("PR_SET_NO_NEW_PRIVS")?;
    Ok(())
}

/// Opens an output file as whoever runs this (the job's user), appending, created 0644 less
/// the job's umask, and never through a symlink.
fn open_output(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .with_context(|| format!("opening the output file {}", path.display()))
}

/// Reads the job's environment block (root's, in the run's private directory).
fn read_environment(path: &Path) -> Result<Vec<(String, String)>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .with_context(|| format!("the job's environment {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_ENVIRONMENT + 1)
        .read_to_end(&mut bytes)
        .context("the job's environment")?;
    if bytes.len() as u64 > MAX_ENVIRONMENT {
        bail!("the job's environment is over {MAX_ENVIRONMENT} bytes");
    }
    Ok(decode_environment(&bytes))
}

/// NUL-separated `NAME=value` → pairs (items without a name are skipped).
pub fn decode_environment(bytes: &[u8]) -> Vec<(String, String)> {
    bytes
        .split(|b| *b == 0)
        .filter_map(|item| {
            let text = String::from_utf8_lossy(item);
            let (k, v) = text.split_once('=')?;
            (!k.is_empty()).then(|| (k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// Pairs → NUL-separated `NAME=value`.
pub fn encode_environment<'a>(vars: impl IntoIterator<Item = (&'a String, &'a String)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in vars {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_by_any_signal_is_recorded_with_it() {
        // A job can end itself with a real-time signal; that must not read as a lost node.
        for (script, expected) in [
            ("kill -34 $$", (0, 34)),
            ("kill -9 $$", (0, 9)),
            ("exit 7", (7, 0)),
        ] {
            // Reaped by `wait_for`, the function under test, not by `Child::wait`.
            #[allow(clippy::zombie_processes)]
            let child = std::process::Command::new("/bin/sh")
                .args(["-c", script])
                .spawn()
                .unwrap();
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            assert_eq!(wait_for(pid).unwrap(), expected, "{script}");
        }
    }

    fn args() -> ShimArgs {
        ShimArgs {
            join: Vec::new(),
            user: "nobody".into(),
            uid: 65534,
            gid: 65534,
            rlimit_as: None,
            env_file: None,
            set: Vec::new(),
            work_dir: "/".into(),
            stdout: "/dev/null".into(),
            stderr: "/dev/null".into(),
            command: vec!["/bin/true".into()],
            inherit_stdio: false,
        }
    }

    #[test]
    fn a_run_without_a_live_monitor_is_given_up_and_its_late_monitor_starts_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RootDir::open_or_create(&tmp.path().join("run"), RUN_DIR_MODE).unwrap();
        assert_eq!(probe(&dir), Monitor::Gone);
        let err = monitor(dir.path(), &args()).unwrap_err();
        assert!(format!("{err:#}").contains("gave this run up"), "{err:#}");
        assert!(read_pgid(&dir).is_none(), "a job was started");
    }

    #[test]
    fn a_job_leader_is_known_by_its_pid_and_start_time_not_its_command_line() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RootDir::open_or_create(&tmp.path().join("run"), RUN_DIR_MODE).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let started = leader_start(pid).unwrap();
        assert_eq!(
            leader_start(pid),
            Some(started),
            "a start time does not change"
        );
        assert_ne!(
            leader_start(std::process::id() as i32),
            None,
            "this process has one too"
        );
        dir.write_atomically(PGID, format!("{pid} {started}").as_bytes())
            .unwrap();
        assert_eq!(read_group(&dir), Some((pid, Some(started))));
        assert_eq!(read_pgid(&dir), Some(pid));
        // What an older monitor wrote: the group alone.
        dir.write_atomically(PGID, pid.to_string().as_bytes())
            .unwrap();
        assert_eq!(read_group(&dir), Some((pid, None)));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(leader_start(pid), None, "gone");
    }

    #[test]
    fn a_held_lock_is_a_live_monitor_and_a_recorded_exit_is_an_end() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RootDir::open_or_create(&tmp.path().join("run"), RUN_DIR_MODE).unwrap();
        let lock = dir.open_lock(MONITOR_LOCK).unwrap();
        let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).unwrap();
        assert_eq!(probe(&dir), Monitor::Running);
        let end = RecordedEnd {
            code: 0,
            signal: 9,
            launch_error: None,
        };
        dir.write_atomically(EXIT, &serde_json::to_vec(&end).unwrap())
            .unwrap();
        assert_eq!(probe(&dir), Monitor::Ended(end));
        drop(held);
        assert!(!dir.exists(ABANDONED));
    }

    #[test]
    fn environments_round_trip_and_nameless_items_are_skipped() {
        let vars: std::collections::BTreeMap<String, String> = [
            ("A".to_owned(), "1=2".to_owned()),
            ("B".to_owned(), String::new()),
        ]
        .into();
        let bytes = encode_environment(&vars);
        assert_eq!(
            decode_environment(&bytes),
            vec![("A".into(), "1=2".into()), ("B".into(), String::new())]
        );
        assert!(decode_environment(b"=x\0noequals\0").is_empty());
    }
}
