//! srun's side of a step's tasks: one `StepIo.Attach` stream per node, over TLS to that
//! node's certificate; output written as it comes (labelled per line with `-l`), standard
//! input to task 0, SIGINT and SIGTERM passed to every task, and the highest exit kept.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use docket_proto::v1 as pb;
use docket_proto::v1::step_io_client::StepIoClient;
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::client::Client;

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub label: bool,
    pub kill_on_bad_exit: bool,
    /// Task 0 is on a terminal: srun's own is raw meanwhile and its size follows.
    pub pty: bool,
}

/// What the nodes' streams bring back, merged.
enum Event {
    Output(pb::Output),
    Exit(pb::TaskExit),
    /// A node's stream ended (with the error that ended it, if one did).
    Done(String, Option<tonic::Status>),
}

/// Writes output, a line at a time per task and stream when labelling.
struct Writer {
    label: bool,
    width: usize,
    partial: BTreeMap<(u32, u32), Vec<u8>>,
}

impl Writer {
    fn write(&mut self, o: &pb::Output) {
        if !self.label {
            emit(o.fd, &o.data);
            return;
        }
        let buf = self.partial.entry((o.task, o.fd)).or_default();
        buf.extend_from_slice(&o.data);
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let mut out = format!("{:>w$}: ", o.task, w = self.width).into_bytes();
            out.extend_from_slice(&line);
            emit(o.fd, &out);
        }
    }

    /// What is left without a final newline.
    fn flush(&mut self) {
        for ((task, fd), rest) in std::mem::take(&mut self.partial) {
            if !rest.is_empty() {
                let mut out = format!("{:>w$}: ", task, w = self.width).into_bytes();
                out.extend_from_slice(&rest);
                out.push(b'\n');
                emit(fd, &out);
            }
        }
    }
}

fn emit(fd: u32, data: &[u8]) {
    if fd == 2 {
        let mut e = std::io::stderr().lock();
        let _ = e.write_all(data);
        let _ = e.flush();
    } else {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(data);
        let _ = o.flush();
    }
}

/// Each node's input stream, by node name.
type Inputs = BTreeMap<String, mpsc::Sender<pb::StepInput>>;

/// Starts the step's tasks on every node of `created` and carries their I/O to the end.
/// Returns the highest exit status of the tasks (128 + the signal for one killed).
pub async fn run(
    client: &Client,
    created: &pb::CreateStepResponse,
    launch: pb::LaunchTasks,
    options: Options,
) -> Result<u8> {
    let (events_tx, mut events) = mpsc::channel::<Event>(256);
    let (inputs, stdin_nodes) = attach_nodes(client, created, &launch, &events_tx).await?;
    drop(events_tx);
    let stdin_to: Vec<_> = stdin_nodes
        .iter()
        .filter_map(|n| inputs.get(n).cloned())
        .collect();
    // Under --pty, task 0's terminal follows srun's size.
    let terminal_node = stdin_to.first().cloned().filter(|_| options.pty);
    if !stdin_to.is_empty() {
        tokio::spawn(forward_stdin(stdin_to));
    }
    let ntasks: u32 = created.layout.iter().map(|s| s.tasks).sum();
    let mut session = Session {
        layout: &created.layout,
        inputs,
        writer: Writer {
            label: options.label,
            width: ntasks.saturating_sub(1).to_string().len(),
            partial: BTreeMap::new(),
        },
        kill_on_bad_exit: options.kill_on_bad_exit,
        open: created.layout.len(),
        highest: 0,
        failures: Vec::new(),
        killed: false,
    };
    let interrupt = signal(SignalKind::interrupt())?;
    let resized = signal(SignalKind::window_change())?;
    let raw = options.pty.then(super::terminal::RawMode::enter);
    let terminate = signal(SignalKind::terminate())?;
    let mut signals = Signals {
        interrupt,
        resized,
        terminate,
    };
    session
        .pump(&mut events, &mut signals, terminal_node.as_ref())
        .await;
    drop(raw);
    session.finish()
}

/// Opens every node's stream and launches its tasks there; returns the nodes' input
/// streams and the nodes srun's standard input goes to (task 0's alone with --pty).
async fn attach_nodes(
    client: &Client,
    created: &pb::CreateStepResponse,
    launch: &pb::LaunchTasks,
    events_tx: &mpsc::Sender<Event>,
) -> Result<(Inputs, Vec<String>)> {
    let mut inputs = Inputs::new();
    let mut stdin_nodes = Vec::new();
    for share in &created.layout {
        let (tx, reads_stdin) = attach_node(client, share, launch, events_tx).await?;
        if reads_stdin {
            stdin_nodes.push(share.node.clone());
        }
        inputs.insert(share.node.clone(), tx);
    }
    Ok((inputs, stdin_nodes))
}

/// Opens `share`'s node's stream over TLS and sends it its launch, its output relayed to
/// `events_tx`; returns its input stream and whether srun's standard input goes to it.
async fn attach_node(
    client: &Client,
    share: &pb::StepTasks,
    launch: &pb::LaunchTasks,
    events_tx: &mpsc::Sender<Event>,
) -> Result<(mpsc::Sender<pb::StepInput>, bool)> {
    if share.agent_address.is_empty() {
        bail!(
            "the leader knows no step address for node {}'s agent (is its --step-listen \
             bound?)",
            share.node
        );
    }
    let channel = docket_auth::tls::connect::node_channel(
        &share.agent_address,
        &share.node,
        client.tls(),
        Duration::from_secs(5),
    )
    .map_err(|e| anyhow!("node {}: {e}", share.node))?;
    let (tx, rx) = mpsc::channel::<pb::StepInput>(64);
    let mut node_launch = launch.clone();
    node_launch.stdin = launch.stdin && share.first_task == 0;
    let reads_stdin = node_launch.stdin || launch.stdin_all;
    tx.send(pb::StepInput {
        kind: Some(pb::step_input::Kind::Launch(node_launch)),
    })
    .await
    .map_err(|_| anyhow!("node {}: the input stream closed", share.node))?;
    let agent = StepIoClient::new(channel);
    tokio::spawn(relay_node(agent, rx, share.node.clone(), events_tx.clone()));
    Ok((tx, reads_stdin))
}

/// One node's `Attach` stream: `rx` to its agent, what comes back to `events_tx`, and a
/// last `Done` when it ends.
async fn relay_node(
    mut agent: StepIoClient<Channel>,
    rx: mpsc::Receiver<pb::StepInput>,
    node: String,
    events_tx: mpsc::Sender<Event>,
) {
    let mut stream = match agent.attach(ReceiverStream::new(rx)).await {
        Ok(s) => s.into_inner(),
        Err(status) => {
            let _ = events_tx.send(Event::Done(node, Some(status))).await;
            return;
        }
    };
    let mut failure = None;
    while let Some(message) = stream.next().await {
        let event = match message {
            Ok(pb::StepOutput {
                kind: Some(pb::step_output::Kind::Output(o)),
            }) => Event::Output(o),
            Ok(pb::StepOutput {
                kind: Some(pb::step_output::Kind::Exit(x)),
            }) => Event::Exit(x),
            Ok(_) => continue,
            Err(status) => {
                failure = Some(status);
                break;
            }
        };
        if events_tx.send(event).await.is_err() {
            return;
        }
    }
    let _ = events_tx.send(Event::Done(node, failure)).await;
}

/// The node running `task`, `?` if none is.
fn node_of(layout: &[pb::StepTasks], task: u32) -> &str {
    layout
        .iter()
        .find(|s| task >= s.first_task && task - s.first_task < s.tasks)
        .map_or("?", |s| s.node.as_str())
}

/// The signals srun passes on to the tasks, and its terminal's resizes.
struct Signals {
    interrupt: Signal,
    resized: Signal,
    terminate: Signal,
}

/// A running step as srun sees it: the nodes' input streams and what their events told.
struct Session<'a> {
    layout: &'a [pb::StepTasks],
    inputs: Inputs,
    writer: Writer,
    kill_on_bad_exit: bool,
    /// Nodes whose stream has not ended.
    open: usize,
    highest: u8,
    failures: Vec<String>,
    killed: bool,
}

impl Session<'_> {
    /// Handles events and srun's signals until every node's stream has ended.
    async fn pump(
        &mut self,
        events: &mut mpsc::Receiver<Event>,
        signals: &mut Signals,
        terminal_node: Option<&mpsc::Sender<pb::StepInput>>,
    ) {
        while self.open > 0 {
            tokio::select! {
                event = events.recv() => match event {
                    None => break,
                    Some(Event::Output(o)) => self.writer.write(&o),
                    Some(Event::Exit(x)) => self.task_exited(&x),
                    Some(Event::Done(node, failure)) => self.node_done(&node, failure),
                },
                _ = signals.interrupt.recv() => {
                    eprintln!("srun: interrupt (one more within 1 sec to abort)");
                    self.broadcast(nix::sys::signal::Signal::SIGINT as i32);
                }
                _ = signals.terminate.recv() => {
                    self.broadcast(nix::sys::signal::Signal::SIGTERM as i32);
                }
                _ = signals.resized.recv(), if terminal_node.is_some() => {
                    if let Some(tx) = terminal_node {
                        let _ = tx.try_send(pb::StepInput {
                            kind: Some(pb::step_input::Kind::Resize(super::terminal::size())),
                        });
                    }
                }
            }
        }
    }

    /// Keeps a task's exit status, reports a bad one, and kills the step for it under
    /// `--kill-on-bad-exit`.
    fn task_exited(&mut self, x: &pb::TaskExit) {
        let status = if x.signal != 0 {
            128 + x.signal
        } else {
            x.exit_code
        };
        self.highest = self.highest.max(status.clamp(0, 255) as u8);
        let node = node_of(self.layout, x.task);
        if x.signal != 0 {
            eprintln!(
                "srun: error: {node}: task {}: Killed by signal {}",
                x.task, x.signal
            );
        } else if x.exit_code != 0 {
            eprintln!(
                "srun: error: {node}: task {}: Exited with exit code {}",
                x.task, x.exit_code
            );
        }
        if self.kill_on_bad_exit && status != 0 && !self.killed {
            self.killed = true;
            self.broadcast(nix::sys::signal::Signal::SIGKILL as i32);
        }
    }

    /// A node's stream ended; one that failed takes the rest of the step down with it.
    fn node_done(&mut self, node: &str, failure: Option<tonic::Status>) {
        self.open -= 1;
        if let Some(s) = failure {
            self.failures.push(format!("node {node}: {}", s.message()));
            // The rest of the step cannot go on without these tasks.
            self.broadcast(nix::sys::signal::Signal::SIGKILL as i32);
        }
    }

    /// Sends `signal` to the tasks on every node.
    fn broadcast(&self, signal: i32) {
        for tx in self.inputs.values() {
            let _ = tx.try_send(pb::StepInput {
                kind: Some(pb::step_input::Kind::Signal(signal)),
            });
        }
    }

    /// Writes what output is left; the highest exit status, or the nodes' failures.
    fn finish(mut self) -> Result<u8> {
        self.writer.flush();
        if !self.failures.is_empty() {
            bail!("{}", self.failures.join("; "));
        }
        Ok(self.highest)
    }
}

/// srun's standard input, to the nodes of the tasks that read it, until its end.
async fn forward_stdin(to: Vec<mpsc::Sender<pb::StepInput>>) {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let (data, eof) = match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => (Vec::new(), true),
            Ok(n) => (buf[..n].to_vec(), false),
        };
        let chunk = pb::StepInput {
            kind: Some(pb::step_input::Kind::Stdin(pb::StdinChunk { data, eof })),
        };
        let mut delivered = false;
        for tx in &to {
            delivered |= tx.send(chunk.clone()).await.is_ok();
        }
        if !delivered || eof {
            return;
        }
    }
}
