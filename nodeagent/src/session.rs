//! The agent's side of the agents API: find the leader, register with what this node holds,
//! take instructions, heartbeat, report, and fence.
//!
//! Following the leader: the agent tries the controllers it knows in turn; a follower answers
//! with the leader's address (`x-docket-leader`), which it tries next. When the stream or a
//! heartbeat fails it starts over. If it reaches no leader for longer than the fence timeout
//! the leader gave it, it stops every job itself, so that when the controller declares the node
//! down (after that timeout plus a margin) nothing of it still runs.
//!
//! Noticing a lost leader quickly: no job starts on a node until its agent has found the new
//! leader. A leader that dies closes its connections, but one that is stopped (SIGSTOP, a hung
//! host) or cut off holds them, and a call to it waits out its whole deadline. So the channel
//! to a controller pings whenever nothing has arrived for [`PING`], and a ping unanswered for as
//! long fails the session; a leader cut off from the other replicas ends its agents' sessions
//! itself. The controller a session was lost with is then passed over for [`AVOID_SILENT`]
//! while another controller answers: until the others have elected a new leader they still
//! name the lost one, and asking it would wait out a registration's deadline.

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
    /// How long the channel to a controller may be silent before it pings ([`PING`] by
    /// default); None: no pings, and a stopped controller is noticed only when a call's
    /// deadline passes.
    pub ping: Option<Duration>,
}

/// How long the channel to a controller may carry nothing before it pings, and how long the
/// ping may go unanswered before the controller is taken for gone. About a second to notice a
/// stopped leader, against the 2 s the first job start after a failover may take; the cost is
/// a ping (a few dozen bytes each way) per agent per half second while nothing else arrives.
pub const PING: Duration = Duration::from_millis(500);

/// How long one registration attempt may take before the next controller is asked: long
/// enough for a leader that a thousand agents register with at once (the TLS handshake is
/// part of it), short against the fence timeout.
const REGISTER_ATTEMPT: Duration = Duration::from_secs(3);

/// How long the controller a session was lost with is passed over while another answers.
/// The others elect a new leader within about a second of losing the old one (the lease and
/// a heartbeat or two); past this the lost one is asked like any other, since a leader that
/// was only slow leads still.
pub const AVOID_SILENT: Duration = Duration::from_secs(2);

fn client(
    addr: &str,
    tls: &docket_auth::tls::TlsContext,
    ping: Option<Duration>,
) -> Option<AgentsClient<Channel>> {
    use docket_auth::tls::connect;
    let (connect, deadline) = (Duration::from_millis(500), Some(Duration::from_secs(10)));
    let channel = match ping {
        Some(ping) => connect::pinged_channel(addr, tls, connect, deadline, ping),
        None => connect::channel(addr, tls, connect, deadline),
    }
    .map_err(|e| tracing::warn!(controller = %addr, error = %e, "not a controller address"))
    .ok()?;
    Some(AgentsClient::new(channel))
}

struct Live {
    /// The controller this session is with.
    addr: String,
    client: AgentsClient<Channel>,
    session: String,
    heartbeat: Duration,
    fence: Duration,
}

/// Registers with whichever controller leads, asking them in `endpoints`' order; None when
/// none could be reached. `avoid` (the controller a session was just lost with) is asked only
/// if no other answered, and a refusal naming it as the leader is not followed.
async fn register(
    config: &SessionConfig,
    runner: &Runner,
    endpoints: &mut docket_proto::endpoints::Endpoints,
    avoid: Option<&str>,
) -> Option<Live> {
    endpoints.next_round();
    let mut tried = 0;
    let mut another_answered = false;
    while let Some(addr) = endpoints.next_to_ask() {
        tried += 1;
        if tried > 16 {
            break;
        }
        let avoided = avoid == Some(addr.as_str());
        if avoided && another_answered {
            continue;
        }
        let Some(mut c) = client(&addr, &config.tls, config.ping) else {
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
        let status = match tokio::time::timeout(REGISTER_ATTEMPT, c.register(request)).await {
            Ok(Ok(r)) => {
                let r = r.into_inner();
                tracing::info!(controller = %addr, session = %r.session, "registered with the leader");
                return Some(Live {
                    addr,
                    client: c,
                    session: r.session,
                    heartbeat: Duration::from_millis(r.heartbeat_ms.max(50)),
                    fence: Duration::from_millis(r.fence_timeout_ms),
                });
            }
            Ok(Err(status)) => status,
            Err(_) => {
                tracing::warn!(controller = %addr, "no answer to the registration within {REGISTER_ATTEMPT:?}");
                endpoints.ask_last(&addr);
                continue;
            }
        };
        another_answered |= !avoided && answered(&status);
        if avoid.is_some() && docket_proto::endpoints::leader_hint(&status) == avoid {
            // The others have not elected a new leader yet: ask again next round.
            continue;
        }
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
    None
}

/// Whether `status` came from a controller rather than from the transport: tonic makes the
/// status of a failed connection from the transport's error, which it keeps as the source,
/// while a controller's own refusal has none.
fn answered(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_none()
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
    let mut endpoints = docket_proto::endpoints::Endpoints::new(config.controllers.clone());
    // The controller the last session was lost with, and when.
    let mut lost: Option<(String, Instant)> = None;
    loop {
        // Past this, with no leader, the agent stops its jobs: it must not wait for a slow
        // registration round or a long pause to do so.
        let fence_at = (!fence.is_zero() && !fenced).then(|| last_contact + fence);
        let avoid = lost
            .as_ref()
            .filter(|(_, at)| at.elapsed() < AVOID_SILENT)
            .map(|(addr, _)| addr.clone());
        let attempt = register(&config, &runner, &mut endpoints, avoid.as_deref());
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
        let addr = live.addr.clone();
        serve(&config, &runner, live, &mut events, &mut last_contact).await;
        endpoints.ask_last(&addr);
        lost = Some((addr, Instant::now()));
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
