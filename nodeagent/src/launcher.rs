//! The launcher: one small single-threaded root process per agent that forks each run's
//! monitor, so that starting a job costs no program start of the agent's binary.
//!
//! Why: on a node running many short jobs, every launch used to start this binary again as
//! the job's monitor (`exec-job`), and each program start pays the dynamic loader — its
//! relocations, its page faults, and glibc's CPUID probing, which traps to the hypervisor in
//! a virtual machine. `perf` of a lifecycle benchmark put about a third of the agents' side
//! of a trivial job there. The agent itself cannot fork a monitor: it is multi-threaded, and
//! a fork's child may then run only async-signal-safe code until it execs. The launcher is
//! started once (`docket-nodeagent launcher`, with root's fixed environment, in `/`, in a
//! process group of its own) and never runs a second thread, so its forks are complete
//! copies that may run any code: each child becomes the monitor exactly as `exec-job` would
//! (the same [`crate::shim::monitor`], after the same set-up: its own process group,
//! `/dev/null` in, the run's `monitor.log` out, every other descriptor closed, an empty
//! signal mask).
//!
//! Protocol, over a socket pair the agent made (the launcher's end is its standard input,
//! so nothing else on the host can reach it):
//! - request: a 4-byte little-endian length, then that many bytes: the run directory and the
//!   monitor's `exec-job` arguments, NUL-separated;
//! - replies, 12 bytes each (tag, pid, value, little-endian `u32`/`i32`/`i32`): `SPAWNED`
//!   (the monitor's pid), `FAILED` (no fork; the errno), and, whenever a monitor ends,
//!   `EXITED` (its pid and raw wait status), in the order they happen.
//!
//! The agent's [`Launcher`] sends requests from any thread, reads replies on one thread of
//! its own, and hands each monitor's end to whoever waits for it. When the agent goes the
//! launcher reads end-of-file and exits; the monitors it forked live on (like `exec-job`
//! monitors, they outlive agents), and a restarted agent re-adopts their runs by their locks.
//! A launcher that dies leaves the runs it was asked for to the same re-adoption.

use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::rootdir::RootDir;
use crate::shim::{MONITOR_LOG, ROOT_PATH, RUN_DIR_MODE};

const SPAWNED: u32 = 1;
const FAILED: u32 = 2;
const EXITED: u32 = 3;

/// The most bytes of one request (the monitor's arguments: paths, a user name, a command).
pub const MAX_REQUEST: usize = 1 << 20;

/// How long a request waits for the launcher's answer (a fork takes a millisecond).
const SPAWN_ANSWER: Duration = Duration::from_secs(10);

// ---- The launcher process ----

/// Loads the name service modules of `passwd` and `group` here, once: every monitor looks
/// its job's user and groups up (`initgroups`), and a fork inherits the modules its parent
/// loaded, where each monitor loading them afresh cost a `dlopen` per job (13% of a
/// monitor's cpu under `perf`). The modules are those `/etc/nsswitch.conf` names, which the
/// monitors would load anyway; a failed lookup only leaves the work to them.
fn load_name_services() {
    let _ = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(0));
    let _ = nix::unistd::getgrouplist(c"root", nix::unistd::Gid::from_raw(0));
}

/// Serves requests on `socket` until the agent closes it: forks a monitor per request, which
/// runs `monitor` with the request's arguments (its exit status is the monitor's), and
/// reports every monitor's end. Must be called in a single-threaded process.
pub fn serve(socket: OwnedFd, monitor: fn(&[OsString]) -> i32) -> io::Result<()> {
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    if threads != 1 {
        return Err(io::Error::other(format!(
            "the launcher runs {threads} threads; it forks monitors only when it runs one"
        )));
    }
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    chld.thread_block().map_err(io::Error::from)?;
    let ended = SignalFd::with_flags(&chld, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(io::Error::from)?;
    let mut socket = UnixStream::from(socket);
    load_name_services();
    loop {
        let (request, exited) = {
            let mut fds = [
                nix::poll::PollFd::new(socket.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(ended.as_fd(), nix::poll::PollFlags::POLLIN),
            ];
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let ready = |f: &nix::poll::PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), ready(&fds[1]))
        };
        if exited {
            while let Ok(Some(_)) = ended.read_signal() {}
            reap(&mut socket)?;
        }
        if request {
            let Some(fields) = read_request(&mut socket)? else {
                return Ok(()); // The agent is gone.
            };
            let reply = match fork_monitor(&fields, monitor) {
                Ok(pid) => (SPAWNED, pid, 0),
                Err(errno) => (FAILED, 0, errno),
            };
            write_reply(&mut socket, reply)?;
        }
    }
}

/// Reports every ended child.
fn reap(socket: &mut UnixStream) -> io::Result<()> {
    loop {
        let mut raw = 0;
        // SAFETY: waits for any child of this process without blocking, writing its status
        // into a local.
        let pid = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) };
        if pid <= 0 {
            return Ok(());
        }
        write_reply(socket, (EXITED, pid, raw))?;
    }
}

/// One request: `None` at the end of the stream.
fn read_request(socket: &mut UnixStream) -> io::Result<Option<Vec<OsString>>> {
    let mut len = [0u8; 4];
    match socket.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_REQUEST {
        return Err(io::Error::other(format!(
            "a request of {len} bytes, over the limit of {MAX_REQUEST}"
        )));
    }
    let mut body = vec![0u8; len];
    socket.read_exact(&mut body)?;
    Ok(Some(
        body.split(|b| *b == 0)
            .map(|f| OsString::from_vec(f.to_vec()))
            .collect(),
    ))
}

fn write_reply(socket: &mut UnixStream, (tag, pid, value): (u32, i32, i32)) -> io::Result<()> {
    let mut out = [0u8; 12];
    out[..4].copy_from_slice(&tag.to_le_bytes());
    out[4..8].copy_from_slice(&pid.to_le_bytes());
    out[8..].copy_from_slice(&value.to_le_bytes());
    socket.write_all(&out)
}

/// Forks the monitor of the run whose directory is `fields[0]`; `fields[1..]` are its
/// arguments. Returns its pid, or the errno of a failed fork.
fn fork_monitor(fields: &[OsString], monitor: fn(&[OsString]) -> i32) -> Result<i32, i32> {
    let Some((run_dir, args)) = fields.split_first() else {
        return Err(libc::EINVAL);
    };
    // SAFETY: this process is single-threaded (checked in `serve`), so the child is a
    // complete copy of it and may run any code; it ends in `_exit`, never returning here (a
    // panic is caught: unwinding would run the launcher's destructors in the child).
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(e as i32),
        Ok(nix::unistd::ForkResult::Child) => {
            let code =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    match become_monitor(Path::new(run_dir)) {
                        Ok(()) => monitor(args),
                        Err(e) => {
                            let _ = writeln!(io::stderr(), "docket-nodeagent launcher: {e}");
                            crate::shim::LAUNCH_FAILED
                        }
                    }
                }))
                .unwrap_or(crate::shim::LAUNCH_FAILED);
            // SAFETY: ends this process at once: no atexit handler, no destructor of the
            // launcher's.
            unsafe { libc::_exit(code) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            // Also here, so the group exists whichever runs first (EACCES: the child already
            // set it and went on).
            let _ = nix::unistd::setpgid(child, child);
            Ok(child.as_raw())
        }
    }
}

/// The forked child's set-up, as `exec-job` was started: a process group of its own, no
/// signal blocked, `/dev/null` in, the run's monitor log (root's, created by the agent) out,
/// in `/`, nothing else of the launcher's open.
fn become_monitor(run_dir: &Path) -> io::Result<()> {
    SigSet::empty().thread_set_mask().map_err(io::Error::from)?;
    // Its command line is the launcher's; `ps -e` shows this name.
    let _ = nix::sys::prctl::set_name(c"docket-monitor");
    let me = nix::unistd::Pid::from_raw(0);
    nix::unistd::setpgid(me, me).map_err(io::Error::from)?;
    let null = std::fs::File::open("/dev/null")?;
    let log = RootDir::open(run_dir, RUN_DIR_MODE)?.open_append(MONITOR_LOG)?;
    nix::unistd::dup2_stdin(&null).map_err(io::Error::from)?;
    nix::unistd::dup2_stdout(&log).map_err(io::Error::from)?;
    nix::unistd::dup2_stderr(&log).map_err(io::Error::from)?;
    std::env::set_current_dir("/")?;
    drop((null, log));
    // SAFETY: closes descriptors nothing here uses again (the launcher's socket and signal
    // descriptor, the copies above); the child ends in `_exit`, so their owners in the
    // launcher's frames are never dropped here.
    unsafe { libc::close_range(3, libc::c_uint::MAX, 0) };
    Ok(())
}

// ---- The agent's side ----

/// A monitor the launcher forked: its pid, and its raw wait status once it ends (the
/// sender is dropped, and the receiver errs, if the launcher dies first).
#[derive(Debug)]
pub struct Launched {
    pub pid: i32,
    pub ended: tokio::sync::oneshot::Receiver<i32>,
}

/// Why a monitor was not launched.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Nothing was sent: the run's monitor may be started another way.
    #[error("the launcher cannot be used: {0}")]
    Unavailable(String),
    /// The request went out and no answer came back: a monitor may or may not have been
    /// forked, and only its lock in the run's directory can tell.
    #[error("the launcher did not answer: {0}")]
    Unanswered(String),
    /// The launcher could not fork.
    #[error("the launcher could not fork a monitor: {0}")]
    Fork(io::Error),
}

/// The agent's handle on its launcher, started at the first launch and again after one dies
/// or the agent's binary is replaced on disk (an upgrade's fixes reach the next job's
/// monitor, as they did when each monitor was a program start).
#[derive(Debug)]
pub struct Launcher {
    exe: PathBuf,
    state_dir: PathBuf,
    live: Mutex<Option<Arc<Live>>>,
}

#[derive(Debug)]
struct Live {
    writer: Mutex<UnixStream>,
    shared: Arc<Mutex<Shared>>,
    /// The binary it runs, as it was on disk when it started.
    binary: Option<Binary>,
}

/// Which file a path named, and its last change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Binary {
    dev: u64,
    ino: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl Binary {
    fn of(path: &Path) -> Option<Binary> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Binary {
            dev: m.dev(),
            ino: m.ino(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        })
    }
}

/// A request sent and not yet answered: where to say the answer, and where the monitor's end
/// goes once it is forked.
type Waiting = (
    std::sync::mpsc::SyncSender<Result<i32, LaunchError>>,
    tokio::sync::oneshot::Sender<i32>,
);

#[derive(Debug, Default)]
struct Shared {
    /// Requests sent and not yet answered, in order.
    waiting: VecDeque<Waiting>,
    /// Monitors that run, by pid.
    running: HashMap<i32, tokio::sync::oneshot::Sender<i32>>,
    dead: bool,
}

impl Launcher {
    /// A launcher of `exe` (this agent's binary), named after `state_dir` in its command
    /// line (so a sweep of what names the state directory finds it and its monitors).
    pub fn new(exe: PathBuf, state_dir: PathBuf) -> Self {
        Launcher {
            exe,
            state_dir,
            live: Mutex::new(None),
        }
    }

    /// Forks the monitor of the run in `run_dir` with its `exec-job` arguments.
    pub fn launch(&self, run_dir: &Path, args: &[OsString]) -> Result<Launched, LaunchError> {
        let mut request = run_dir.as_os_str().as_bytes().to_vec();
        for a in args {
            if a.as_bytes().contains(&0) {
                return Err(LaunchError::Unavailable(format!(
                    "an argument holds a NUL byte: {}",
                    a.to_string_lossy()
                )));
            }
            request.push(0);
            request.extend_from_slice(a.as_bytes());
        }
        if request.len() > MAX_REQUEST {
            return Err(LaunchError::Unavailable(format!(
                "the request is {} bytes, over the limit of {MAX_REQUEST}",
                request.len()
            )));
        }
        let live = self
            .live()
            .map_err(|e| LaunchError::Unavailable(e.to_string()))?;
        let (answer_tx, answer) = std::sync::mpsc::sync_channel(1);
        let (ended_tx, ended) = tokio::sync::oneshot::channel();
        {
            let mut writer = live.writer.lock().unwrap_or_else(|p| p.into_inner());
            {
                let mut shared = live.shared.lock().unwrap_or_else(|p| p.into_inner());
                if shared.dead {
                    return Err(LaunchError::Unavailable("it has exited".into()));
                }
                shared.waiting.push_back((answer_tx, ended_tx));
            }
            let mut framed = (request.len() as u32).to_le_bytes().to_vec();
            framed.extend_from_slice(&request);
            if let Err(e) = writer.write_all(&framed) {
                // Nothing, or only part of the request, arrived: a partial request is never
                // acted on (the launcher waits for the rest, then sees the end).
                let _ = writer.shutdown(std::net::Shutdown::Both);
                return Err(LaunchError::Unavailable(format!(
                    "sending the request: {e}"
                )));
            }
        }
        match answer.recv_timeout(SPAWN_ANSWER) {
            Ok(Ok(pid)) => Ok(Launched { pid, ended }),
            Ok(Err(e)) => Err(e),
            // A slow answer is this run's alone: the launcher is kept (the answer, should it
            // come, is matched to this request still, and a monitor forked late finds the
            // run given up and starts nothing), and the runs it already forked go on.
            Err(e) => Err(LaunchError::Unanswered(format!(
                "no answer within {} s ({e})",
                SPAWN_ANSWER.as_secs()
            ))),
        }
    }

    /// The running launcher, started if there is none, the last one died, or the binary was
    /// replaced since it started.
    fn live(&self) -> io::Result<Arc<Live>> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let binary = Binary::of(&self.exe);
        if let Some(l) = live.as_ref()
            && !l.shared.lock().unwrap_or_else(|p| p.into_inner()).dead
            && l.binary == binary
        {
            return Ok(l.clone());
        }
        // An old launcher whose binary was replaced reads the end of its socket once the
        // last request through it is answered, and exits; its monitors live on, and their
        // runs are watched by their locks.
        let l = Arc::new(self.start(binary)?);
        *live = Some(l.clone());
        Ok(l)
    }

    fn start(&self, binary: Option<Binary>) -> io::Result<Live> {
        let (ours, theirs) = UnixStream::pair()?;
        // A launcher that stops reading holds a request for at most this long.
        ours.set_write_timeout(Some(SPAWN_ANSWER))?;
        let child = std::process::Command::new(&self.exe)
            .arg("launcher")
            .arg(format!("--state-dir={}", self.state_dir.display()))
            // Root runs with root's environment, never anyone else's.
            .env_clear()
            .env("PATH", ROOT_PATH)
            .current_dir("/")
            .stdin(std::process::Stdio::from(OwnedFd::from(theirs)))
            .stdout(std::process::Stdio::null())
            .process_group(0)
            .spawn()?;
        // Whatever fails from here on, the launcher is told (the end of its socket), and
        // reaped.
        let give_up = |mut child: std::process::Child, e: io::Error| {
            let _ = ours.shutdown(std::net::Shutdown::Both);
            let _ = child.kill();
            let _ = child.wait();
            e
        };
        let shared = Arc::new(Mutex::new(Shared::default()));
        let reader = match ours.try_clone() {
            Ok(r) => r,
            Err(e) => return Err(give_up(child, e)),
        };
        let for_reader = shared.clone();
        let slot = Arc::new(Mutex::new(Some(child)));
        let for_thread = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("docket-launcher-replies".into())
            .spawn(move || {
                read_replies(reader, &for_reader);
                // Reap the launcher (it exits once its socket closes).
                if let Some(mut child) = for_thread.lock().unwrap_or_else(|p| p.into_inner()).take()
                {
                    let _ = child.wait();
                }
            });
        if let Err(e) = spawned {
            let child = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            return Err(match child {
                Some(child) => give_up(child, e),
                None => e,
            });
        }
        tracing::info!(exe = %self.exe.display(), "the monitors' launcher started");
        Ok(Live {
            writer: Mutex::new(ours),
            shared,
            binary,
        })
    }
}

/// The agent's reading thread: answers requests and hands on monitors' ends until the
/// launcher goes; then fails whatever still waits on it.
fn read_replies(mut socket: UnixStream, shared: &Mutex<Shared>) {
    let mut reply = [0u8; 12];
    while socket.read_exact(&mut reply).is_ok() {
        let field = |i: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&reply[i..i + 4]);
            b
        };
        let (tag, pid, value) = (
            u32::from_le_bytes(field(0)),
            i32::from_le_bytes(field(4)),
            i32::from_le_bytes(field(8)),
        );
        let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
        match tag {
            SPAWNED => {
                if let Some((answer, ended)) = s.waiting.pop_front() {
                    s.running.insert(pid, ended);
                    let _ = answer.send(Ok(pid));
                }
            }
            FAILED => {
                if let Some((answer, _)) = s.waiting.pop_front() {
                    let _ =
                        answer.send(Err(LaunchError::Fork(io::Error::from_raw_os_error(value))));
                }
            }
            EXITED => {
                if let Some(ended) = s.running.remove(&pid) {
                    let _ = ended.send(value);
                }
            }
            other => {
                tracing::error!(
                    tag = other,
                    "the launcher sent something else; giving it up"
                );
                break;
            }
        }
    }
    let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
    s.dead = true;
    for (answer, _) in s.waiting.drain(..) {
        let _ = answer.send(Err(LaunchError::Unanswered("the launcher exited".into())));
    }
    s.running.clear();
    tracing::warn!("the monitors' launcher exited; the next launch starts another");
}

/// The arguments of a request, back into what `exec-job` parses (for the launcher's side).
pub fn exec_job_argv(args: &[OsString]) -> Vec<&OsStr> {
    std::iter::once(OsStr::new("docket-nodeagent"))
        .chain(std::iter::once(OsStr::new("exec-job")))
        .chain(args.iter().map(OsString::as_os_str))
        .collect()
}
