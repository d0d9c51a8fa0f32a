//! The byte streams between srun and a step's tasks on this node: each task's output pipes
//! (and task 0's terminal) read in chunks and sent to srun as they come, and srun's input
//! written to task 0 by a task of its own, behind a short queue, so that a task that reads
//! nothing stalls only srun's stream, never the loop that watches the step's exits, limits
//! and cancels.

use docket_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic::Status;

use super::tasks;

/// The most a task's output is read at once (one message).
const CHUNK: usize = 64 << 10;

/// How many of srun's input messages wait for task 0 at most.
pub const INPUT_QUEUE: usize = 16;

/// Where srun's input goes: a task's pipe, or task 0's terminal.
pub enum Sink {
    Pipe(tokio::process::ChildStdin),
    Terminal(pty_process::OwnedWritePty),
}

/// What srun sends the tasks that read its input.
pub enum ToTask0 {
    Data(Vec<u8>),
    Eof,
    Resize(pb::TerminalSize),
}

/// Writes srun's input to the tasks that read it until its end (on a terminal, the end of
/// input is the terminal's end-of-file character, ^D, as `script` sends it). A task that
/// stops reading is dropped from the copies; the others go on.
pub async fn feed(mut rx: mpsc::Receiver<ToTask0>, mut sinks: Vec<Sink>) {
    while let Some(message) = rx.recv().await {
        let mut kept = Vec::with_capacity(sinks.len());
        for mut sink in sinks {
            let written = match (&mut sink, &message) {
                (Sink::Pipe(pipe), ToTask0::Data(data)) => pipe.write_all(data).await,
                (Sink::Pipe(_), ToTask0::Eof) => continue,
                (Sink::Terminal(t), ToTask0::Data(data)) => t.write_all(data).await,
                (Sink::Terminal(t), ToTask0::Eof) => t.write_all(&[4]).await,
                (Sink::Terminal(t), ToTask0::Resize(size)) => t
                    .resize(tasks::terminal_size(size))
                    .map_err(std::io::Error::other),
                (Sink::Pipe(_), ToTask0::Resize(_)) => Ok(()),
            };
            if written.is_ok() {
                kept.push(sink);
            }
        }
        sinks = kept;
        if sinks.is_empty() {
            return;
        }
    }
}

/// Carries one pipe of one task to srun, in chunks.
pub async fn forward(
    mut pipe: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    task: u32,
    fd: u32,
    tx: mpsc::Sender<Result<pb::StepOutput, Status>>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let message = pb::StepOutput {
                    kind: Some(pb::step_output::Kind::Output(pb::Output {
                        task,
                        fd,
                        data: buf[..n].to_vec(),
                    })),
                };
                if tx.send(Ok(message)).await.is_err() {
                    return;
                }
            }
        }
    }
}
