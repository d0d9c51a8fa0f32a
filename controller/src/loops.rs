//! The leader's scheduling loops.
//!
//! Only the leader schedules. When this replica becomes leader it first proposes the site
//! configuration if the replicated state has none yet, then runs:
//! - the **direct pass** right after a commit that may let a job start (a submission, an end,
//!   a release: [`docket_core::Command::may_let_jobs_start`]), woken by the state machine,
//! - the **main pass** every `sched_interval`, for at most `max_sched_time`,
//! - the **backfill pass** every `bf_interval`, for at most `bf_max_time` in all, giving the
//!   state back every `bf_yield_interval` for `bf_yield_sleep` (longer while RPCs press) and,
//!   unless `bf_continue` is set, starting over when the state changed meanwhile,
//! - a **tick** (time passes: begin times, purges) every `sched_interval`.
//!
//! A pass reads the state under its read lock and plans; the plan's decisions are proposed as
//! commands and re-validated when they apply (a stale decision is refused, not harmful).
//! Every pass polls a [`LoopBudget`], which ends it when its time is spent, when more RPCs
//! than `max_rpc_cnt` are in flight (the main and backfill passes, which resume), or at once
//! when leadership is lost; a pass that stopped early resumes from its continuation next
//! time. Loop parameters are read from the
//! replicated configuration at every iteration, so a config change takes effect without a
//! restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use docket_core::job::JobRef;
use docket_core::plan::{Budget, Plan};
use docket_core::quantity::TimeMs;
use docket_core::{Command, Envelope, State};
use docket_raft::replica::Replica;
use docket_raft::status::Role;
use tokio::sync::Notify;

use crate::machine::CoreMachine;
use crate::stats::{LoopStats, PassKind};

/// How long a pass plans, from its first look at a job, before RPC pressure may stop it: a
/// pass resumed under a storm that never ends still considers a few hundred jobs each time,
/// so jobs keep starting, while an RPC waits at most about this long for the cpu.
pub const RPC_YIELD_QUANTUM: Duration = Duration::from_millis(1);

/// What ends a pass early.
#[derive(Debug)]
pub struct LoopBudget {
    deadline: Instant,
    leading: Arc<AtomicBool>,
    inflight: Arc<AtomicUsize>,
    max_rpc_cnt: usize,
    /// RPC pressure counts from this instant on (set at the first poll).
    pressure_from: Option<Instant>,
    /// Why it ended, for diagnostics.
    pub stopped_by: Option<&'static str>,
}

impl LoopBudget {
    /// Whether more than `max_rpc_cnt` RPCs are in flight, once the pass has had its quantum.
    fn pressed(&mut self) -> bool {
        if self.max_rpc_cnt == 0 {
            return false;
        }
        let from = *self
            .pressure_from
            .get_or_insert_with(|| Instant::now() + RPC_YIELD_QUANTUM);
        self.inflight.load(Ordering::Relaxed) > self.max_rpc_cnt && Instant::now() >= from
    }
}

impl Budget for LoopBudget {
    fn exhausted(&mut self) -> bool {
        use crate::stats::{STOPPED_BY_LEADERSHIP, STOPPED_BY_RPC_PRESSURE, STOPPED_BY_TIME};
        let why = if !self.leading.load(Ordering::Relaxed) {
            Some(STOPPED_BY_LEADERSHIP)
        } else if self.pressed() {
            Some(STOPPED_BY_RPC_PRESSURE)
        } else if Instant::now() >= self.deadline {
            Some(STOPPED_BY_TIME)
        } else {
            None
        };
        self.stopped_by = why;
        why.is_some()
    }
}

/// Shared between the loops, the services and the leadership watcher.
#[derive(Debug, Clone)]
pub struct LoopContext {
    pub replica: Replica<CoreMachine>,
    /// Woken when a command that may let a job start commits ([`crate::machine::Wakes`]).
    pub schedule: Arc<Notify>,
    /// RPCs being served right now (counted by [`crate::inflight`]).
    pub inflight: Arc<AtomicUsize>,
    /// ... of them, those of the users' services (submissions, listings, commands).
    pub users_inflight: Arc<AtomicUsize>,
    /// Commands that build the site, proposed once if the state has no configuration.
    pub site: Vec<Command>,
    /// When the next direct pass may run (see `direct`).
    pub direct_pacer: Arc<std::sync::Mutex<Instant>>,
    /// What the passes did (diagnostics).
    pub stats: Arc<std::sync::Mutex<LoopStats>>,
}

/// Runs forever: waits for leadership, schedules while leading.
pub async fn run(ctx: LoopContext) {
    let leading = Arc::new(AtomicBool::new(false));
    // The server metrics: the leader, the role and the vote, published when they change.
    let mut metrics = ctx.replica.raft().server_metrics();
    let mut last_leader = None;
    loop {
        let is_leader = {
            let m = metrics.borrow_and_update();
            if m.current_leader != last_leader {
                last_leader = m.current_leader;
                if let Some(leader) = last_leader {
                    metrics::counter!("docket_raft_leader_changes_total").increment(1);
                    ctx.stats
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .leader_seen(crate::stats::LeaderSeen {
                            at_ms: docket_proto::unix_ms(),
                            leader: leader.0,
                            term: m.vote.leader_id().term,
                        });
                }
            }
            m.state == openraft::ServerState::Leader
        };
        leading.store(is_leader, Ordering::SeqCst);
        if is_leader {
            // Lead until the metrics say otherwise; the watcher flips `leading` at once.
            let watcher = {
                let leading = leading.clone();
                let mut metrics = metrics.clone();
                tokio::spawn(async move {
                    while metrics.changed().await.is_ok() {
                        if metrics.borrow().state != openraft::ServerState::Leader {
                            leading.store(false, Ordering::SeqCst);
                            return;
                        }
                    }
                    leading.store(false, Ordering::SeqCst);
                })
            };
            // A write of this leadership may wait on after the leadership is gone (its entry
            // may yet commit, or be truncated only when a later leader reaches this replica):
            // the loops must not wait with it, or this replica's next leadership never starts
            // loops of its own. In a chaos run a replica restarted on its old leader's vote
            // led for a moment, its loops' first write hung, and when it was elected again a
            // few seconds later it led for 40 s without starting a job.
            tokio::select! {
                () = lead(&ctx, &leading) => {}
                () = wait_not_leading(&leading) => tracing::info!(
                    replica = %ctx.replica.id(),
                    "no longer leading: scheduling loops stop, leaving a write to finish alone"
                ),
            }
            watcher.abort();
        }
        if metrics.changed().await.is_err() {
            return; // Raft has shut down.
        }
    }
}

/// The loops of one term of leadership.
async fn lead(ctx: &LoopContext, leading: &Arc<AtomicBool>) {
    tracing::info!(replica = %ctx.replica.id(), "leading: scheduling loops start");
    ctx.stats
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .leaderships += 1;
    raise_command_version(ctx).await;
    if !configure_site(ctx).await {
        return;
    }
    let mut main_resume = None;
    let mut next_main = Instant::now();
    let mut next_backfill = Instant::now();
    while leading.load(Ordering::SeqCst) {
        let (loops, bf_continue) = ctx.replica.read_stale(|a| {
            let sched = &a.machine.state.config.sched;
            (sched.loops.clone(), sched.bf_continue)
        });
        let now = Instant::now();
        if now >= next_main {
            propose(ctx, Command::Tick).await;
            raise_command_version(ctx).await;
            let plan = pass(
                ctx,
                leading,
                PassKind::Main,
                Duration::from_secs(loops.max_sched_time.0),
                |s, now, b| s.main_pass(now, b, main_resume.take()),
            );
            main_resume = plan.continuation.clone();
            propose_plan(ctx, plan).await;
            next_main = Instant::now() + Duration::from_secs(loops.sched_interval.0.max(1));
        }
        if Instant::now() >= next_backfill {
            backfill(ctx, leading, &loops, bf_continue).await;
            next_backfill = Instant::now() + Duration::from_secs(loops.bf_interval.0.max(1));
        }
        let wake = next_main.min(next_backfill);
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = ctx.schedule.notified() => direct(ctx, leading, &loops).await,
            _ = wait_not_leading(leading) => {}
        }
    }
    tracing::info!(replica = %ctx.replica.id(), "no longer leading: scheduling loops stop");
}

async fn wait_not_leading(leading: &AtomicBool) {
    while leading.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One backfill cycle: passes of at most `bf_yield_interval`, `bf_yield_sleep` apart, until
/// the order is done or `bf_max_time` is spent.
///
/// Between two passes the cycle yields as Slurm's backfill does (`_yield_locks`): it sleeps
/// `bf_yield_sleep`, and again while more than `max_rpc_cnt` RPCs are in flight, serving
/// direct passes meanwhile. Then, unless `bf_continue` is set, a cycle during whose yield the
/// state changed (any command applied) ends there, and the next cycle starts over from the
/// top of the order at the next `bf_interval`; with `bf_continue` it resumes with the next
/// job of its order, skipping the jobs that started, ended or were held meanwhile.
async fn backfill(
    ctx: &LoopContext,
    leading: &Arc<AtomicBool>,
    loops: &docket_core::config::LoopParams,
    bf_continue: bool,
) {
    let started = Instant::now();
    let total = Duration::from_secs(loops.bf_max_time.0.max(1));
    let slice = Duration::from_micros(loops.bf_yield_interval_us.max(1_000));
    let mut resume = None;
    loop {
        let left = total.saturating_sub(started.elapsed());
        let plan = pass(
            ctx,
            leading,
            PassKind::Backfill,
            slice.min(left),
            |s, now, b| s.backfill_pass(now, b, resume.take()),
        );
        resume = plan.continuation.clone();
        propose_plan(ctx, plan).await;
        if resume.is_none() || started.elapsed() >= total || !leading.load(Ordering::SeqCst) {
            return;
        }
        let before = applied_index(ctx);
        yield_between_passes(ctx, leading, loops, started + total).await;
        match after_yield(bf_continue, before, applied_index(ctx)) {
            AfterYield::Resume => {}
            AfterYield::StartOver => {
                ctx.stats
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .backfill_state_changed();
                return;
            }
        }
    }
}

/// What a backfill cycle does after a yield.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterYield {
    /// Go on with the next job of the cycle's order.
    Resume,
    /// End the cycle; the next starts over from the top of the order (Slurm without
    /// `bf_continue`: "system state changed, breaking out").
    StartOver,
}

/// `bf_continue` resumes whatever happened during the yield; without it, a cycle resumes
/// only if nothing was applied meanwhile (`before` and `after` are the applied log indexes).
fn after_yield(bf_continue: bool, before: u64, after: u64) -> AfterYield {
    if bf_continue || before == after {
        AfterYield::Resume
    } else {
        AfterYield::StartOver
    }
}

fn applied_index(ctx: &LoopContext) -> u64 {
    ctx.replica.read_stale(|a| a.machine.state.applied.index)
}

/// Backfill's yield: `bf_yield_sleep`, then further sleeps of that length while more than
/// `max_rpc_cnt` RPCs are in flight ("continuing to yield locks, N RPCs pending"), never
/// past `until` nor past the loss of leadership. Submissions get their direct pass meanwhile.
async fn yield_between_passes(
    ctx: &LoopContext,
    leading: &Arc<AtomicBool>,
    loops: &docket_core::config::LoopParams,
    until: Instant,
) {
    let sleep = Duration::from_micros(loops.bf_yield_sleep_us);
    loop {
        let wake = (Instant::now() + sleep).min(until);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => break,
                _ = ctx.schedule.notified() => direct(ctx, leading, loops).await,
            }
            if Instant::now() >= wake {
                break;
            }
        }
        let pressed = loops.max_rpc_cnt > 0
            && ctx.inflight.load(Ordering::Relaxed) > loops.max_rpc_cnt as usize;
        if !pressed || Instant::now() >= until || !leading.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// The direct pass after a commit that may let a job start (a submission, an end): starts
/// what can start now, without waiting for the next main pass.
///
/// Paced: a direct pass orders the whole pending queue, so under a submission storm with a
/// long queue running one per submission would spend the leader's CPU on planning rather
/// than on taking submissions. After a pass that took `d`, the next waits until `k·d` has
/// passed (what commits meanwhile is covered by it), `k` from 1 with no user's RPC in flight
/// to 8 under a storm of them ([`pacing_factor`]; the agents' and Raft's do not count): a storm's submissions get at least eight ninths of the
/// leader's time, while a queue drained by job ends alone (thousands of short jobs on many
/// nodes, where each pass starts what the last ends freed) is refilled twice as often as
/// a fixed `8d` would (`docket-local scale`: 1,810-1,907 jobs/s with `8d` always, 2,024-2,154
/// with `d`).
async fn direct(
    ctx: &LoopContext,
    leading: &Arc<AtomicBool>,
    loops: &docket_core::config::LoopParams,
) {
    let wait = {
        let pacer = ctx.direct_pacer.lock().unwrap_or_else(|p| p.into_inner());
        pacer.saturating_duration_since(Instant::now())
    };
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    let began = Instant::now();
    let plan = pass(
        ctx,
        leading,
        PassKind::Direct,
        Duration::from_secs(loops.max_sched_time.0),
        |s, now, b| s.direct_pass(now, b),
    );
    let cost = began.elapsed();
    let factor = pacing_factor(ctx.users_inflight.load(Ordering::Relaxed));
    *ctx.direct_pacer.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now() + cost * factor;
    propose_plan(ctx, plan).await;
}

/// How many pass-lengths a direct pass waits after the last: 1 with no user's RPC in flight,
/// one more for every two in flight, 8 from fourteen on.
fn pacing_factor(inflight: usize) -> u32 {
    1 + (inflight.min(14) / 2) as u32
}

/// Plans one pass on the current state within `time`. Planning is CPU work of up to the
/// pass's budget: it runs with the runtime told this worker is busy, so Raft's heartbeats
/// and the RPCs keep being served on the others.
fn pass(
    ctx: &LoopContext,
    leading: &Arc<AtomicBool>,
    kind: PassKind,
    time: Duration,
    plan: impl FnOnce(&State, TimeMs, &mut dyn Budget) -> Plan,
) -> Plan {
    tokio::task::block_in_place(|| plan_now(ctx, leading, kind, time, plan))
}

fn plan_now(
    ctx: &LoopContext,
    leading: &Arc<AtomicBool>,
    kind: PassKind,
    time: Duration,
    plan: impl FnOnce(&State, TimeMs, &mut dyn Budget) -> Plan,
) -> Plan {
    let began = Instant::now();
    ctx.replica.read_stale(|a| {
        let state = &a.machine.state;
        let mut budget = LoopBudget {
            deadline: Instant::now() + time,
            leading: leading.clone(),
            inflight: ctx.inflight.clone(),
            // The direct pass is already bounded (`default_queue_depth`, paced to a ninth of
            // the leader's time under a storm) and has no continuation: stopped by RPC pressure, it would
            // throw away the order it had just computed. The passes that resume yield.
            max_rpc_cnt: if kind == PassKind::Direct {
                0
            } else {
                state.config.sched.loops.max_rpc_cnt as usize
            },
            pressure_from: None,
            stopped_by: None,
        };
        let now = TimeMs(docket_raft::cluster_clock::now_ms().max(state.applied.now.0));
        let plan = plan(state, now, &mut budget);
        if let Some(why) = budget.stopped_by {
            tracing::debug!(why, considered = plan.considered, "pass stopped early");
        }
        ctx.stats.lock().unwrap_or_else(|p| p.into_inner()).record(
            kind,
            began.elapsed(),
            plan.considered,
            (plan.starts.len() + plan.preemptions.len()) as u64,
            budget.stopped_by,
        );
        plan
    })
}

/// Proposes what a plan decided, in the order apply expects: resumes, preemptions, starts,
/// then the bookkeeping (bypass counts, reasons).
async fn propose_plan(ctx: &LoopContext, plan: Plan) {
    if !plan.resumes.is_empty() {
        let jobs = plan
            .resumes
            .iter()
            .map(|id| JobRef {
                job: *id,
                task: None,
            })
            .collect();
        propose(ctx, Command::ResumeJobs { jobs }).await;
    }
    if !plan.preemptions.is_empty() {
        propose(ctx, Command::Preempt(plan.preemptions)).await;
    }
    if !plan.starts.is_empty() {
        tracing::debug!(starts = plan.starts.len(), "starting jobs");
        propose(ctx, Command::StartJobs(plan.starts)).await;
    }
    if !plan.bypassed.is_empty() {
        propose(ctx, Command::NoteBypassed(plan.bypassed)).await;
    }
    if !plan.reasons.is_empty() {
        propose(ctx, Command::SetSchedulerReasons(plan.reasons)).await;
    }
}

async fn propose(ctx: &LoopContext, command: Command) -> bool {
    let envelope = match crate::write::stamp(&ctx.replica, Envelope::controller(command)) {
        Ok(envelope) => envelope,
        Err(status) => {
            tracing::warn!(
                why = status.message(),
                "a controller command cannot be written yet"
            );
            return false;
        }
    };
    match ctx.replica.write_one(envelope).await {
        Ok(Ok(_)) => true,
        Ok(Err(rejection)) => {
            tracing::warn!(%rejection, "a scheduling command was refused");
            false
        }
        Err(e) => {
            tracing::debug!(error = %e, "proposing a scheduling command failed");
            false
        }
    }
}

/// Raises the cluster's command version to this build's once every replica reports that its
/// build applies it (a rolling upgrade is then complete): until then commands are written in
/// the version all of them read. Asks each member's status, 1 s each, only while the cluster
/// is behind this build.
async fn raise_command_version(ctx: &LoopContext) {
    use docket_core::command::COMMAND_VERSION;
    let behind = ctx
        .replica
        .read_stale(|a| a.machine.state.command_version.0 < COMMAND_VERSION);
    if !behind {
        return;
    }
    let me = ctx.replica.status();
    for member in me.members.iter().filter(|m| m.id != me.id) {
        let version = ctx
            .replica
            .channels()
            // That replica's own answer: another's, at its address, would speak for a build
            // that may not be the one it runs.
            .status_of(Some(member.id), &member.addr, Duration::from_secs(1))
            .await
            .ok()
            .and_then(|s| s.app_version);
        if version.is_none_or(|v| v < COMMAND_VERSION) {
            tracing::debug!(replica = %member.id, ?version, "a replica does not apply the newest command version yet");
            return;
        }
    }
    let mut envelope = Envelope::controller(Command::RaiseCommandVersion(COMMAND_VERSION));
    envelope.version = COMMAND_VERSION;
    match ctx.replica.write_one(envelope).await {
        Ok(Ok(_)) => tracing::info!(
            version = COMMAND_VERSION,
            "every replica applies the newest command version: the cluster now writes it"
        ),
        Ok(Err(rejection)) => tracing::warn!(%rejection, "raising the command version was refused"),
        Err(e) => tracing::debug!(error = %e, "raising the command version failed"),
    }
}

/// Proposes the site's commands if the replicated state was never configured. Returns false
/// if leadership was lost meanwhile.
///
/// The commands go in one write, so in one log entry: one commit instead of one per node
/// (a thousand-node site waited for a thousand commits, 11 minutes on a starved host before
/// its agents could register), and a leader lost halfway cannot leave a cluster configured
/// with half its nodes, which the next leader would take for configured. Only a site too
/// large for one entry goes in chunks, without that guarantee.
async fn configure_site(ctx: &LoopContext) -> bool {
    if ctx.site.is_empty() {
        return true;
    }
    let configured = ctx.replica.read_stale(|a| {
        let s = &a.machine.state;
        !s.partitions.is_empty() || !s.nodes.is_empty()
    });
    if configured {
        return true;
    }
    tracing::info!(
        commands = ctx.site.len(),
        "configuring the new cluster from the site file"
    );
    let mut envelopes = Vec::with_capacity(ctx.site.len());
    for command in &ctx.site {
        match crate::write::stamp(&ctx.replica, Envelope::controller(command.clone())) {
            Ok(envelope) => envelopes.push(envelope),
            Err(status) => {
                tracing::warn!(why = status.message(), "the site cannot be written yet");
                return false;
            }
        }
    }
    let mut chunk = envelopes.len();
    let mut rest = envelopes.as_slice();
    while !rest.is_empty() {
        if ctx.replica.status().role != Role::Leader {
            return false;
        }
        let (now, later) = rest.split_at(chunk.min(rest.len()));
        match ctx.replica.write(now.to_vec()).await {
            Ok(responses) => {
                for rejection in responses.into_iter().filter_map(Result::err) {
                    tracing::warn!(%rejection, "a command of the site file was refused");
                }
                rest = later;
            }
            Err(docket_raft::proposer::WriteError::TooLarge { .. }) if chunk > 1 => {
                chunk = chunk.div_ceil(2)
            }
            Err(e) => {
                tracing::warn!(error = %e, "configuring the cluster failed; the next pass retries");
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(inflight: usize, max_rpc_cnt: usize, leading: bool, time: Duration) -> LoopBudget {
        LoopBudget {
            deadline: Instant::now() + time,
            leading: Arc::new(AtomicBool::new(leading)),
            inflight: Arc::new(AtomicUsize::new(inflight)),
            max_rpc_cnt,
            pressure_from: None,
            stopped_by: None,
        }
    }

    #[test]
    fn a_pass_stops_on_rpc_pressure_lost_leadership_or_time_and_says_why() {
        let mut b = budget(3, 5, true, Duration::from_secs(60));
        assert!(!b.exhausted());
        b.inflight.store(6, Ordering::Relaxed);
        // Not before the pass has had its quantum.
        assert!(!b.exhausted());
        std::thread::sleep(RPC_YIELD_QUANTUM);
        assert!(b.exhausted());
        assert_eq!(b.stopped_by, Some("rpc pressure"));
        // max_rpc_cnt 0: never yields for RPCs.
        let mut b = budget(1_000, 0, true, Duration::from_secs(60));
        assert!(!b.exhausted());
        let mut b = budget(0, 0, false, Duration::from_secs(60));
        assert!(b.exhausted());
        assert_eq!(b.stopped_by, Some("leadership lost"));
        let mut b = budget(0, 0, true, Duration::ZERO);
        assert!(b.exhausted());
        assert_eq!(b.stopped_by, Some("time"));
    }

    #[test]
    fn direct_passes_are_paced_harder_the_more_rpcs_wait() {
        assert_eq!(pacing_factor(0), 1);
        assert_eq!(pacing_factor(1), 1);
        assert_eq!(pacing_factor(2), 2);
        assert_eq!(pacing_factor(8), 5);
        assert_eq!(pacing_factor(14), 8);
        assert_eq!(pacing_factor(64), 8);
    }

    #[test]
    fn without_bf_continue_a_cycle_whose_state_changed_during_its_yield_starts_over() {
        assert_eq!(after_yield(false, 10, 10), AfterYield::Resume);
        assert_eq!(after_yield(false, 10, 11), AfterYield::StartOver);
        assert_eq!(after_yield(true, 10, 11), AfterYield::Resume);
        assert_eq!(after_yield(true, 10, 10), AfterYield::Resume);
    }
}
