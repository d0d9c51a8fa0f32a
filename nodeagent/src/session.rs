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

/// What the agent declares, where it finds controllers, and its TLS (the node's
/// certificate, which is what the leader believes it is).
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub node: String,
    pub controllers: Vec<String>,
    pub cpus: u32,
    pub memory_mib: u64,
    pub gpus: u32,
    pub tls: docket_auth::tls::TlsContext,
    /// Where srun reaches this agent's step I/O service; empty: nowhere.
    pub step_address: String,
}

fn client(addr: &str, tls: &docket_auth::tls::TlsContext) -> Option<AgentsClient<Channel>> {
    let channel = docket_auth::tls::connect::channel(
        addr,
        tls,
        Duration::from_millis(500),
        Some(Duration::from_secs(10)),
    )
    .map_err(|e| tracing::warn!(controller = %addr, error = %e, "not a controller address"))
    .ok()?;
    Some(AgentsClient::new(channel))
}

struct Live {
    client: AgentsClient<Channel>,
    session: String,
    heartbeat: Duration,
    fence: Duration,
}

/// Registers with whichever controller leads; None when none could be reached.
async fn register(config: &SessionConfig, runner: &Runner) -> Option<Live> {
    let mut endpoints = docket_proto::endpoints::Endpoints::new(config.controllers.clone());
    let mut tried = 0;
    while let Some(addr) = endpoints.next_to_ask() {
        tried += 1;
        if tried > 16 {
            break;
        }
        let Some(mut c) = client(&addr, &config.tls) else {
            continue;
        };
        let request = pb::RegisterRequest {
            node: config.node.clone(),
            cpus: config.cpus,
            memory_mib: config.memory_mib,
            gpus: config.gpus,
            version: env!("CARGO_PKG_VERSION").into(),
            jobs: runner.held(),
            step_address: config.step_address.clone(),
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
                if !endpoints.follow(&status, &addr)
                    && matches!(
                        status.code(),
                        tonic::Code::NotFound
                            | tonic::Code::PermissionDenied
                            | tonic::Code::Unauthenticated
                    )
                {
                    tracing::error!(node = %config.node, "{}", status.message());
                }
            }
        }
    }
    None
}

/// The first pause between rounds of registration attempts, and the longest.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MOST: Duration = Duration::from_secs(5);

/// The pause after a failed round: doubled each time up to [`RETRY_MOST`], and drawn at
/// random from its upper half, so that a thousand agents that lost their leader together do
/// not come back together and keep the controllers too busy to elect one.
fn next_retry(retry: Duration) -> (Duration, Duration) {
    use rand::Rng;
    let pause = rand::rng().random_range(retry / 2..=retry);
    (pause, (retry * 2).min(RETRY_MOST))
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
    let mut retry = RETRY_FIRST;
    loop {
        // Past this, with no leader, the agent stops its jobs: it must not wait for a slow
        // registration round or a long pause to do so.
        let fence_at = (!fence.is_zero() && !fenced).then(|| last_contact + fence);
        let attempt = register(&config, &runner);
        let registered = match fence_at {
            Some(at) => tokio::time::timeout_at(tokio::time::Instant::from_std(at), attempt)
                .await
                .unwrap_or(None),
            None => attempt.await,
        };
        let Some(live) = registered else {
            if fence_at.is_some_and(|at| Instant::now() >= at) {
                tracing::error!(
                    after_ms = last_contact.elapsed().as_millis() as u64,
                    "no leader within the fence timeout: stopping every job"
                );
                runner.fence();
                fenced = true;
            }
            let (pause, next) = next_retry(retry);
            retry = next;
            let pause = match fence_at.filter(|_| !fenced) {
                Some(at) => pause.min(at.saturating_duration_since(Instant::now())),
                None => pause,
            };
            tokio::time::sleep(pause).await;
            continue;
        };
        retry = RETRY_FIRST;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_with_jitter_to_a_ceiling() {
        let mut retry = RETRY_FIRST;
        let mut pauses = Vec::new();
        for _ in 0..12 {
            let (pause, next) = next_retry(retry);
            assert!(
                pause >= retry / 2 && pause <= retry,
                "{pause:?} outside {retry:?}"
            );
            pauses.push(pause);
            retry = next;
        }
        assert_eq!(retry, RETRY_MOST);
        assert!(pauses[11] >= RETRY_MOST / 2);
        // Jitter: a thousand agents do not all pick one pause.
        let distinct: std::collections::BTreeSet<Duration> =
            (0..50).map(|_| next_retry(RETRY_MOST).0).collect();
        assert!(distinct.len() > 10, "{distinct:?}");
    }
}
