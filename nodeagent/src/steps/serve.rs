//! The step I/O service (`docket.v1.StepIo`): srun's way to a step's tasks on this node.
//!
//! One `Attach` stream per srun and node. The first message must be the launch; it is bounded
//! in size, and is refused unless its secret hashes to the step's I/O key the leader granted
//! (PERMISSION_DENIED), or if another srun attached already. Then the tasks start, and the
//! stream carries srun's standard input (to task 0) and signals one way, the tasks' output
//! and exits the other. It ends when every task here has exited; whatever the tasks left
//! behind in the step's cgroup is killed then. srun's going away, the leader's cancel and the
//! step's time limit stop the tasks: SIGTERM, then SIGKILL after the agent's kill grace.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use docket_proto::v1 as pb;
use docket_proto::v1::step_io_server::{StepIo, StepIoServer};
use nix::sys::signal::Signal;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::signals::{Signaller, Target};
use super::streams::{INPUT_QUEUE, Sink, ToTask0, feed, forward};
use super::{AttachError, Grants, StepBase, tasks};
use crate::cgroup::JobCgroup;
use crate::rootdir::RootDir;

/// How long srun has to send its launch after connecting.
const FIRST_MESSAGE: Duration = Duration::from_secs(10);
/// How long an attach waits for the leader's grant to reach this agent.
const GRANT_WAIT: Duration = Duration::from_secs(10);
/// The most connections that may be between connecting and starting their tasks at once:
/// each waits up to `FIRST_MESSAGE` + `GRANT_WAIT`, so anyone who can reach the port
/// could otherwise pile them up. Attached steps are not counted (only the leader creates
/// steps, under each user's limits).
pub const MAX_PENDING_ATTACHES: usize = 256;
/// Bounds on a launch.
pub const MAX_ARGS: usize = 4096;
pub const MAX_ARG_BYTES: usize = 1 << 20;
pub const MAX_ENVIRONMENT_BYTES: usize = 4 << 20;
pub const MAX_PATH_BYTES: usize = 4096;
/// How long output still in the pipes is awaited after every task exited.
const DRAIN: Duration = Duration::from_secs(2);

/// What a step's tasks need from their job's run on this node.
#[derive(Debug, Clone)]
pub struct StepContext {
    pub base: Arc<StepBase>,
    /// The job's cgroups (None: the agent confines nothing).
    pub cgroup: Option<JobCgroup>,
}

/// Where a step's tasks come from: the runs of this node.
pub trait Jobs: Send + Sync + 'static {
    /// The context of job `job`'s run under `epoch`, if it runs here now.
    fn step_context(&self, job: u64, epoch: u64) -> Result<StepContext, String>;
}

/// The service. Cheap to clone.
#[derive(Clone)]
pub struct StepIoService {
    jobs: Arc<dyn Jobs>,
    grants: Arc<Grants>,
    node: String,
    shim: PathBuf,
    kill_grace: Duration,
    pending: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for StepIoService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepIoService")
            .field("node", &self.node)
            .finish()
    }
}

impl StepIoService {
    pub fn new(
        jobs: Arc<dyn Jobs>,
        grants: Arc<Grants>,
        node: String,
        shim: PathBuf,
        kill_grace: Duration,
    ) -> StepIoServer<Self> {
        StepIoServer::new(StepIoService {
            jobs,
            grants,
            node,
            shim,
            kill_grace,
            pending: Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_ATTACHES)),
        })
    }
}

/// Refuses a launch over any bound, naming the field and the limit.
pub fn check_launch(l: &pb::LaunchTasks) -> Result<(), Status> {
    let too = |field: &str, what: String| Err(Status::invalid_argument(format!("{field}: {what}")));
    if l.argv.is_empty() || l.argv[0].is_empty() {
        return too("argv", "name the command to run".into());
    }
    if l.argv.len() > MAX_ARGS {
        return too(
            "argv",
            format!("{} arguments; the limit is {MAX_ARGS}", l.argv.len()),
        );
    }
    let arg_bytes: usize = l.argv.iter().map(|a| a.len() + 1).sum();
    if arg_bytes > MAX_ARG_BYTES {
        return too(
            "argv",
            format!("{arg_bytes} bytes; the limit is {MAX_ARG_BYTES}"),
        );
    }
    let env_bytes: usize = l.environment.iter().map(|a| a.len() + 1).sum();
    if env_bytes > MAX_ENVIRONMENT_BYTES {
        return too(
            "environment",
            format!("{env_bytes} bytes; the limit is {MAX_ENVIRONMENT_BYTES}"),
        );
    }
    for (field, value) in [
        ("work_dir", &l.work_dir),
        ("stdout", &l.stdout),
        ("stderr", &l.stderr),
    ] {
        if value.len() > MAX_PATH_BYTES {
            return too(
                field,
                format!("{} bytes; the limit is {MAX_PATH_BYTES}", value.len()),
            );
        }
    }
    if l.argv
        .iter()
        .chain(&l.environment)
        .any(|a| a.contains('\0'))
        || [&l.work_dir, &l.stdout, &l.stderr]
            .iter()
            .any(|p| p.contains('\0'))
    {
        return too(
            "argv",
            "no argument, variable or path may hold a NUL byte".into(),
        );
    }
    Ok(())
}

fn attach_status(e: AttachError) -> Status {
    match e {
        // The same answer for both: which steps run here is no stranger's business.
        AttachError::WrongSecret(job, step) | AttachError::NotGranted(job, step) => {
            Status::permission_denied(format!(
                "step {job}.{step}: not granted on this node, or the secret is not the step's"
            ))
        }
        AttachError::Taken(..) => Status::already_exists(e.to_string()),
        AttachError::Ended(..) => Status::failed_precondition(e.to_string()),
    }
}

fn launch_failed(reason: String) -> pb::Ended {
    pb::Ended {
        cause: pb::EndCause::LaunchFailed as i32,
        reason,
        exit_code: 1,
        ..Default::default()
    }
}

type Output = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::StepOutput, Status>> + Send>>;

#[tonic::async_trait]
impl StepIo for StepIoService {
    type AttachStream = Output;

    async fn attach(
        &self,
        request: Request<Streaming<pb::StepInput>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let pending = self.pending.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "{MAX_PENDING_ATTACHES} connections already wait to launch; try again"
            ))
        })?;
        let mut input = request.into_inner();
        let first = tokio::time::timeout(FIRST_MESSAGE, input.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no launch within 10 s of connecting"))??
            .ok_or_else(|| Status::invalid_argument("the stream ended before the launch"))?;
        let Some(pb::step_input::Kind::Launch(launch)) = first.kind else {
            return Err(Status::invalid_argument(
                "the first message must be the launch",
            ));
        };
        check_launch(&launch)?;
        let attached = self
            .grants
            .attach(launch.job_id, launch.step_id, &launch.secret, GRANT_WAIT)
            .await
            .map_err(attach_status)?;
        drop(pending);
        let grant = attached.grant.clone();
        let key = (grant.job_id, grant.step_id);
        // From here on, a failure ends the step on this node.
        // Cgroups, files, a terminal and a fork per task (and, on a failure, a kill that
        // may wait for the cgroup to empty): on the blocking pool, not a runtime worker.
        let (this, g, l) = (self.clone(), grant.clone(), launch.clone());
        let started = tokio::task::spawn_blocking(move || {
            this.jobs
                .step_context(g.job_id, g.epoch)
                .and_then(|ctx| this.start(&ctx, &g, &l))
        })
        .await
        .unwrap_or_else(|e| Err(format!("starting the tasks: {e}")));
        let started = match started {
            Ok(s) => s,
            Err(why) => {
                self.grants
                    .end(key, grant.epoch, launch_failed(why.clone()));
                return Err(Status::failed_precondition(why));
            }
        };
        let (tx, rx) = mpsc::channel(64);
        let _ = tx
            .send(Ok(pb::StepOutput {
                kind: Some(pb::step_output::Kind::Launched(pb::Launched {
                    tasks: started.tasks.iter().map(|t| t.task).collect(),
                    pids: started.tasks.iter().map(|t| t.pid).collect(),
                })),
            }))
            .await;
        let this = self.clone();
        tokio::spawn(async move {
            let ended = this.drive(&grant, started, input, attached.stop, tx).await;
            this.grants.end(key, grant.epoch, ended);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// One started task.
#[derive(Debug)]
struct Task {
    task: u32,
    pid: i32,
    /// Until the driver takes it to wait on.
    child: Option<tokio::process::Child>,
}

/// The started tasks of this node, and the step's cgroups.
struct Started {
    tasks: Vec<Task>,
    cgroup: Option<JobCgroup>,
    run_dir: RootDir,
    /// The tasks' shared environment in the run's directory, once written: one file per step
    /// and node, whatever the number of tasks.
    env_file: Option<String>,
    /// `--pty`: the master side of task 0's terminal.
    pty: Option<pty_process::Pty>,
}

impl StepIoService {
    /// Makes the step's cgroups and starts each task; on a failure, what started is killed.
    fn start(
        &self,
        ctx: &StepContext,
        grant: &pb::StepGrant,
        launch: &pb::LaunchTasks,
    ) -> Result<Started, String> {
        let base = &ctx.base;
        let cgroup = match &ctx.cgroup {
            Some(job) => Some(
                job.step(grant.step_id)
                    .map_err(|e| format!("the step's cgroups: {e}"))?,
            ),
            None => None,
        };
        let run_dir = RootDir::open(&base.run_dir, crate::shim::RUN_DIR_MODE)
            .map_err(|e| format!("the run's directory: {e}"))?;
        let join = cgroup.as_ref().map(|c| c.procs_files()).unwrap_or_default();
        let work_dir = if launch.work_dir.is_empty() {
            base.work_dir.clone()
        } else {
            PathBuf::from(&launch.work_dir)
        };
        let mut started = Started {
            tasks: Vec::new(),
            cgroup,
            run_dir,
            env_file: None,
            pty: None,
        };
        match self.start_tasks(&mut started, base, grant, launch, &join, &work_dir) {
            Ok(()) => Ok(started),
            Err(why) => {
                Target::new(started.cgroup.clone(), started.tasks.iter().map(|t| t.pid))
                    .send(Signal::SIGKILL);
                clean_up(&started);
                Err(why)
            }
        }
    }

    /// Writes the step's environment, opens task 0's terminal with `--pty`, and starts this
    /// node's tasks into `started` (the caller undoes it all on an error).
    fn start_tasks(
        &self,
        started: &mut Started,
        base: &StepBase,
        grant: &pb::StepGrant,
        launch: &pb::LaunchTasks,
        join: &[PathBuf],
        work_dir: &std::path::Path,
    ) -> Result<(), String> {
        let env = tasks::step_environment(&launch.environment, base, grant, &self.node);
        let env_file = format!("step{}.environ", grant.step_id);
        started
            .run_dir
            .write_new(&env_file, &crate::shim::encode_environment(&env), 0o600)
            .map_err(|e| format!("writing the step's environment: {e}"))?;
        started.env_file = Some(env_file.clone());
        // The terminal's slave side stays open here only until task 0 has started.
        let mut pts = None;
        if let Some(size) = &launch.pty
            && grant.first_task == 0
        {
            let (pty, slave) = tasks::open_terminal(size, base.uid)
                .map_err(|e| format!("opening task 0's terminal: {e}"))?;
            started.pty = Some(pty);
            pts = Some(slave);
        }
        for local in 0..grant.tasks {
            let task = grant.first_task.saturating_add(local);
            let on_terminal = task == 0 && pts.is_some();
            let file_for = |pattern: &str| {
                (!pattern.is_empty() && launch.pty.is_none())
                    .then(|| tasks::output_path(pattern, grant, &self.node, &base.user, task))
            };
            let child = tasks::spawn(&tasks::TaskLaunch {
                shim: &self.shim,
                base,
                join: join.to_vec(),
                env_file: started.run_dir.path().join(&env_file),
                set: tasks::task_variables(task, local),
                argv: &launch.argv,
                work_dir: work_dir.to_path_buf(),
                stdout: file_for(&launch.stdout),
                stderr: file_for(&launch.stderr),
                stdin: !on_terminal && (launch.stdin_all || (launch.stdin && task == 0)),
                pty: pts.as_ref().filter(|_| on_terminal),
                quiet: launch.pty.is_some() && task != 0,
            })
            .map_err(|e| format!("starting task {task}: {e}"))?;
            started.tasks.push(Task {
                task,
                pid: child.id().map_or(0, |p| p as i32),
                child: Some(child),
            });
        }
        Ok(())
    }

    /// Carries the tasks' I/O until every one exited; returns how they ended here.
    async fn drive(
        &self,
        grant: &pb::StepGrant,
        mut started: Started,
        mut input: Streaming<pb::StepInput>,
        mut stop: watch::Receiver<Option<pb::EndCause>>,
        tx: mpsc::Sender<Result<pb::StepOutput, Status>>,
    ) -> pb::Ended {
        let target = Target::new(started.cgroup.clone(), started.tasks.iter().map(|t| t.pid));
        let signals = Signaller::start(target.clone());
        let (mut readers, mut exits, to_task0) = wire_tasks(&mut started, &tx);
        let mut progress = Progress::new();
        let limit = time_limit(grant);
        let far = tokio::time::Instant::now() + Duration::from_secs(100 * 365 * 86400);
        while !exits.is_empty() {
            tokio::select! {
                message = input.message(), if progress.input_open && to_task0.as_ref().is_none_or(|q| q.capacity() > 0) => {
                    progress.on_input(message, to_task0.as_ref(), &signals);
                }
                _ = tx.closed(), if progress.srun_here => progress.srun_here = false,
                changed = stop.changed(), if progress.cause.is_none() => {
                    if changed.is_ok() && let Some(c) = *stop.borrow() {
                        progress.cause = Some(c);
                    }
                }
                _ = tokio::time::sleep_until(limit.unwrap_or(far)), if limit.is_some() && progress.cause.is_none() => {
                    progress.cause = Some(pb::EndCause::Timeout);
                }
                _ = tokio::time::sleep_until(progress.kill_at.unwrap_or(far)), if progress.kill_at.is_some() => {
                    signals.signal(Signal::SIGKILL);
                    progress.kill_at = Some(tokio::time::Instant::now() + Duration::from_secs(1));
                }
                Some(joined) = exits.join_next() => {
                    if let Ok((task, pid, status)) = joined {
                        target.reaped(pid);
                        let exit = progress.on_exit(task, status);
                        // Sent from a task of its own: an srun that reads nothing must not
                        // stop this loop from handling cancels, limits and kills.
                        let tx = tx.clone();
                        readers.spawn(async move {
                            let _ = tx.send(Ok(exit)).await;
                        });
                    }
                }
            }
            progress.stop_if_asked(&signals, self.kill_grace);
        }
        // Every task exited: nothing more is written to them (their feeder ends), and a
        // task's children do not outlive its step.
        drop(to_task0);
        drop(signals);
        target.send_now(Signal::SIGKILL).await;
        drain(&mut readers).await;
        let (cpu_time_ms, max_rss_mib) = release(started).await;
        progress.ended(cpu_time_ms, max_rss_mib)
    }
}

/// How a task ended, as its waiter reports it: its number, its pid, its wait status.
type TaskEnd = (u32, i32, std::io::Result<std::process::ExitStatus>);

/// Takes each task's pipes (and task 0's terminal) from `started`: forwarders of their
/// output and the feeder of their input in the first set, their waits in the second, and
/// the queue to the feeder when some task reads srun's input.
fn wire_tasks(
    started: &mut Started,
    tx: &mpsc::Sender<Result<pb::StepOutput, Status>>,
) -> (JoinSet<()>, JoinSet<TaskEnd>, Option<mpsc::Sender<ToTask0>>) {
    let mut readers = JoinSet::new();
    let mut exits = JoinSet::new();
    let mut sinks = Vec::new();
    if let Some(pty) = started.pty.take() {
        let (read, write) = pty.into_split();
        readers.spawn(forward(Box::new(read), 0, 1, tx.clone()));
        sinks.push(Sink::Terminal(write));
    }
    for t in &mut started.tasks {
        let Some(mut child) = t.child.take() else {
            continue;
        };
        if let Some(s) = child.stdin.take() {
            sinks.push(Sink::Pipe(s));
        }
        if let Some(pipe) = child.stdout.take() {
            readers.spawn(forward(Box::new(pipe), t.task, 1, tx.clone()));
        }
        if let Some(pipe) = child.stderr.take() {
            readers.spawn(forward(Box::new(pipe), t.task, 2, tx.clone()));
        }
        let (task, pid) = (t.task, t.pid);
        exits.spawn(async move { (task, pid, child.wait().await) });
    }
    // Task 0's input is written by a task of its own, so that a task that does not read
    // stalls only srun's stream (the bounded channel stops being read), never this loop.
    let to_task0 = (!sinks.is_empty()).then(|| {
        let (to_task0, rx) = mpsc::channel(INPUT_QUEUE);
        readers.spawn(feed(rx, sinks));
        to_task0
    });
    (readers, exits, to_task0)
}

/// When the step's time limit ends, if it has one.
fn time_limit(grant: &pb::StepGrant) -> Option<tokio::time::Instant> {
    // An absurd limit (the leader bounds it; this agent does not trust that) is none.
    if grant.time_limit_seconds > 0 {
        tokio::time::Instant::now().checked_add(Duration::from_secs(grant.time_limit_seconds))
    } else {
        None
    }
}

/// Awaits the output still in the pipes for up to `DRAIN`, then stops what is left.
async fn drain(readers: &mut JoinSet<()>) {
    let _ = tokio::time::timeout(DRAIN, async {
        while readers.join_next().await.is_some() {}
    })
    .await;
    readers.abort_all();
}

/// Reads what the step used (cpu time in ms, peak memory in MiB), then removes its cgroups
/// and environment file, on the blocking pool.
async fn release(started: Started) -> (u64, u64) {
    tokio::task::spawn_blocking(move || {
        let used = started
            .cgroup
            .as_ref()
            .map_or((0, 0), |c| (c.cpu_time_ms(), c.peak_memory_mib()));
        clean_up(&started);
        used
    })
    .await
    .unwrap_or((0, 0))
}

/// What the driver knows of a step's run so far.
struct Progress {
    /// The highest exit code of a task.
    highest: i32,
    /// The signal that ended the first task a signal ended (0: none yet).
    first_signal: i32,
    /// Why the tasks are being stopped, once they are.
    cause: Option<pb::EndCause>,
    /// When the next SIGKILL is due, once the tasks were told to stop.
    kill_at: Option<tokio::time::Instant>,
    /// Whether srun may still send input.
    input_open: bool,
    /// Whether srun is still connected.
    srun_here: bool,
}

impl Progress {
    /// A step whose tasks all run, with srun connected.
    fn new() -> Self {
        Progress {
            highest: 0,
            first_signal: 0,
            cause: None,
            kill_at: None,
            input_open: true,
            srun_here: true,
        }
    }

    /// Handles one message of srun's: input and terminal sizes to task 0, signals to the
    /// tasks; the stream's end closes the input, a broken stream means srun is gone.
    fn on_input(
        &mut self,
        message: Result<Option<pb::StepInput>, Status>,
        to_task0: Option<&mpsc::Sender<ToTask0>>,
        signals: &Signaller,
    ) {
        match message {
            Ok(Some(pb::StepInput {
                kind: Some(pb::step_input::Kind::Stdin(chunk)),
            })) => {
                if let Some(q) = to_task0 {
                    if !chunk.data.is_empty() {
                        let _ = q.try_send(ToTask0::Data(chunk.data));
                    }
                    if chunk.eof {
                        let _ = q.try_send(ToTask0::Eof);
                    }
                }
            }
            Ok(Some(pb::StepInput {
                kind: Some(pb::step_input::Kind::Resize(size)),
            })) => {
                if let Some(q) = to_task0 {
                    let _ = q.try_send(ToTask0::Resize(size));
                }
            }
            Ok(Some(pb::StepInput {
                kind: Some(pb::step_input::Kind::Signal(number)),
            })) => {
                if let Ok(sig) = Signal::try_from(number) {
                    signals.signal(sig);
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => self.input_open = false,
            Err(_) => {
                // srun's connection broke: the step cannot go on without it.
                self.input_open = false;
                self.srun_here = false;
            }
        }
    }

    /// Counts task `task`'s end; the message that tells srun of it.
    fn on_exit(
        &mut self,
        task: u32,
        status: std::io::Result<std::process::ExitStatus>,
    ) -> pb::StepOutput {
        let (code, sig) = match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                (s.code().unwrap_or(0), s.signal().unwrap_or(0))
            }
            Err(_) => (1, 0),
        };
        self.highest = self.highest.max(code);
        if self.first_signal == 0 {
            self.first_signal = sig;
        }
        pb::StepOutput {
            kind: Some(pb::step_output::Kind::Exit(pb::TaskExit {
                task,
                exit_code: code,
                signal: sig,
                error: String::new(),
            })),
        }
    }

    /// Once srun is gone (a cancel) or a stop is asked for, sends the tasks SIGTERM (once)
    /// and sets the SIGKILL `kill_grace` later.
    fn stop_if_asked(&mut self, signals: &Signaller, kill_grace: Duration) {
        if !self.srun_here && self.cause.is_none() {
            self.cause = Some(pb::EndCause::Cancelled);
        }
        if self.cause.is_some() && self.kill_at.is_none() {
            signals.signal(Signal::SIGTERM);
            self.kill_at = Some(tokio::time::Instant::now() + kill_grace);
        }
    }

    /// How the step ended here, with what it used.
    fn ended(self, cpu_time_ms: u64, max_rss_mib: u64) -> pb::Ended {
        let cause = self
            .cause
            .unwrap_or(if self.highest != 0 || self.first_signal != 0 {
                pb::EndCause::Failed
            } else {
                pb::EndCause::Completed
            });
        pb::Ended {
            cause: cause as i32,
            reason: String::new(),
            exit_code: self.highest,
            signal: self.first_signal,
            cpu_time_ms,
            max_rss_mib,
        }
    }
}

/// Removes the step's cgroups and the tasks' environment file.
fn clean_up(started: &Started) {
    if let Some(cg) = &started.cgroup {
        cg.remove();
    }
    if let Some(file) = &started.env_file {
        let _ = started.run_dir.remove_file(file);
    }
}
