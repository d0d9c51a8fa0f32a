//! The agent's side of the agents API: find the leader, register with what this node holds,
//! take instructions, heartbeat, report, and fence.
//!
//! Following the leader: the agent tries the controllers it knows in turn; a follower answers
//! with the leader's address (`x-docket-leader`), which it tries next. When the stream or a
//! heartbeat fails it starts over. If it reaches no leader for longer than the fence timeout
//! the leader gave it, it stops every job itself, so that when the controller declares the node
//! down (after that timeout plus a margin) nothing of it still runs.

use std::time::{Duration, Instant};

use docket_proto::v1 as pb;
use docket_proto::v1::agents_client::AgentsClient;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::runner::Runner;

/// What the agent declares and where it finds controllers.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub node: String,
    pub controllers: Vec<String>,
    pub cpus: u32,
    pub memory_mib: u64,
    pub gpus: u32,
}

fn client(addr: &str) -> Option<AgentsClient<Channel>> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).ok()?;
    Some(AgentsClient::new(
        endpoint
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(10))
            .connect_lazy(),
    ))
}

struct Live {
    client: AgentsClient<Channel>,
    session: String,
    heartbeat: Duration,
    fence: Duration,
}

/// Registers with whichever controller leads; None when none could be reached.
async fn register(config: &SessionConfig, runner: &Runner) -> Option<Live> {
    let mut queue: Vec<String> = config.controllers.clone();
    let mut tried = 0;
    while let Some(addr) = queue.first().cloned() {
        queue.remove(0);
        tried += 1;
        if tried > 16 {
            break;
        }
        let Some(mut c) = client(&addr) else { continue };
        let request = pb::RegisterRequest {
            node: config.node.clone(),
            cpus: config.cpus,
            memory_mib: config.memory_mib,
            gpus: config.gpus,
            version: env!("CARGO_PKG_VERSION").into(),
            jobs: runner.held(),
        };
        match c.register(request).await {
            Ok(r) => {
                let r = r.into_inner();
                tracing::info!(controller = %addr, session = %r.session, "registered with the leader");
                return Some(Live {
                    client: c,
                    session: r.session,
                    heartbeat: Duration::from_millis(r.heartbeat_ms.max(50)),
                    fence: Duration::from_millis(r.fence_timeout_ms),
                });
            }
            Err(status) => {
                if let Some(leader) = status
                    .metadata()
                    .get("x-docket-leader")
                    .and_then(|v| v.to_str().ok())
                {
                    queue.insert(0, leader.to_owned());
                } else if status.code() == tonic::Code::NotFound {
                    tracing::error!(node = %config.node, "{}", status.message());
                }
            }
        }
    }
    None
}

/// Runs forever: keeps a session with the leader and carries out its instructions.
pub async fn run(
    config: SessionConfig,
    runner: Runner,
    mut events: mpsc::UnboundedReceiver<pb::JobEvent>,
) {
    let mut last_contact = Instant::now();
    let mut fence = Duration::ZERO;
    let mut fenced = false;
    loop {
        let Some(live) = register(&config, &runner).await else {
            if !fence.is_zero() && !fenced && last_contact.elapsed() > fence {
                tracing::error!(
                    after_ms = last_contact.elapsed().as_millis() as u64,
                    "no leader within the fence timeout: stopping every job"
                );
                runner.stop_all("node_failure");
                fenced = true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        last_contact = Instant::now();
        fence = live.fence;
        fenced = false;
        serve(&config, &runner, live, &mut events, &mut last_contact).await;
    }
}

/// One session: until the stream or a call fails.
async fn serve(
    config: &SessionConfig,
    runner: &Runner,
    mut live: Live,
    events: &mut mpsc::UnboundedReceiver<pb::JobEvent>,
    last_contact: &mut Instant,
) {
    let stream = live
        .client
        .instructions(pb::InstructionsRequest {
            node: config.node.clone(),
            session: live.session.clone(),
        })
        .await;
    let mut stream = match stream {
        Ok(s) => s.into_inner(),
        Err(e) => {
            tracing::warn!(error = %e, "opening the instruction stream");
            return;
        }
    };
    // Ends the old leader never acknowledged go to this one first.
    let pending = runner.unreported();
    if !pending.is_empty() && !report(config, runner, &mut live, pending).await {
        return;
    }
    let mut beat = tokio::time::interval(live.heartbeat);
    loop {
        tokio::select! {
            next = stream.next() => match next {
                Some(Ok(instruction)) => {
                    *last_contact = Instant::now();
                    runner.apply(instruction);
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "instruction stream failed");
                    return;
                }
                None => {
                    tracing::info!("instruction stream ended (leadership changed?)");
                    return;
                }
            },
            _ = beat.tick() => {
                let request = pb::HeartbeatRequest {
                    node: config.node.clone(),
                    session: live.session.clone(),
                    jobs: runner.held(),
                };
                if let Err(e) = live.client.heartbeat(request).await {
                    tracing::warn!(error = %e, "heartbeat failed");
                    return;
                }
                *last_contact = Instant::now();
            }
            event = events.recv() => {
                let Some(event) = event else { return };
                let mut batch = vec![event];
                while let Ok(more) = events.try_recv() {
                    batch.push(more);
                }
                if !report(config, runner, &mut live, batch).await {
                    return;
                }
                *last_contact = Instant::now();
            }
        }
    }
}

/// Reports `events`; acknowledged ends are forgotten. False when the call failed (the ends
/// stay held and are reported to the next leader).
async fn report(
    config: &SessionConfig,
    runner: &Runner,
    live: &mut Live,
    events: Vec<pb::JobEvent>,
) -> bool {
    let ends: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| matches!(e.event, Some(pb::job_event::Event::Ended(_))))
        .map(|e| (e.job_id, e.epoch))
        .collect();
    let request = pb::ReportEventsRequest {
        node: config.node.clone(),
        session: live.session.clone(),
        events,
    };
    match live.client.report_events(request).await {
        Ok(r) => {
            for (i, e) in r.into_inner().errors.iter().enumerate() {
                if !e.is_empty() {
                    tracing::warn!(error = %e, event = i, "the leader refused a report");
                }
            }
            for (job, epoch) in ends {
                runner.acknowledged(job, epoch);
            }
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "reporting job events failed");
            false
        }
    }
}
