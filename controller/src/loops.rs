//! The leader's scheduling loops.
//!
//! Only the leader schedules. When this replica becomes leader it first proposes the site
//! configuration if the replicated state has none yet, then runs:
//! - the **direct pass** right after a commit that may let a job start (a submission, an end,
//!   a release: [`docket_core::Command::may_let_jobs_start`]), woken by the state machine,
//! - the **main pass** every `sched_interval`, for at most `max_sched_time`,
//! - the **backfill pass** every `bf_interval`, for at most `bf_max_time` in all, giving the
//!   state back every `bf_yield_interval` for `bf_yield_sleep`,
//! - a **tick** (time passes: begin times, purges) every `sched_interval`.
//!
//! A pass reads the state under its read lock and plans; the plan's decisions are proposed as
//! commands and re-validated when they apply (a stale decision is refused, not harmful).
//! Every pass polls a [`LoopBudget`], which ends it when its time is spent, when more RPCs
//! than `max_rpc_cnt` are in flight, or at once when leadership is lost; a pass that stopped
//! early resumes from its continuation next time. Loop parameters are read from the
//! replicated configuration at every iteration, so a config change takes effect without a
//! restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use docket_core::job::JobRef;
use docket_core::plan::{Budget, Plan};
use docket_core::quantity::TimeMs;
use docket_core::{Command, Envelope, State};
use docket_raft::replica::Replica;
use docket_raft::status::Role;
use tokio::sync::Notify;

use crate::machine::CoreMachine;
use crate::stats::{LoopStats, PassKind};

/// What ends a pass early.
#[derive(Debug)]
pub struct LoopBudget {
    deadline: Instant,
    leading: Arc<AtomicBool>,
    inflight: Arc<AtomicUsize>,
    max_rpc_cnt: usize,
    /// Why it ended, for diagnostics.
    pub stopped_by: Option<&'static str>,
}

impl Budget for LoopBudget {
    fn exhausted(&mut self) -> bool {
        let why = if !self.leading.load(Ordering::Relaxed) {
            Some("leadership lost")
        } else if self.max_rpc_cnt > 0 && self.inflight.load(Ordering::Relaxed) > self.max_rpc_cnt {
            Some("rpc pressure")
        } else if Instant::now() >= self.deadline {
            Some("time")
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
    /// Commands that build the site, proposed once if the state has no configuration.
    pub site: Vec<Command>,
    /// When the next direct pass may run (see [`direct`]).
    pub direct_pacer: Arc<std::sync::Mutex<Instant>>,
    /// What the passes did (diagnostics).
    pub stats: Arc<std::sync::Mutex<LoopStats>>,
}

pub fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs forever: waits for leadership, schedules while leading.
pub async fn run(ctx: LoopContext) {
    let leading = Arc::new(AtomicBool::new(false));
    let mut metrics = ctx.replica.raft().metrics();
    let mut last_leader = None;
    loop {
        let is_leader = {
            let m = metrics.borrow_and_update();
            if m.current_leader != last_leader {
                last_leader = m.current_leader;
                if last_leader.is_some() {
                    metrics::counter!("docket_raft_leader_changes_total").increment(1);
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
            lead(&ctx, &leading).await;
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
    if !configure_site(ctx).await {
        return;
    }
    let mut main_resume = None;
    let mut next_main = Instant::now();
    let mut next_backfill = Instant::now();
    while leading.load(Ordering::SeqCst) {
        let loops = ctx
            .replica
            .read_stale(|a| a.machine.state.config.sched.loops.clone());
        let now = Instant::now();
        if now >= next_main {
            propose(ctx, Command::Tick).await;
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
            backfill(ctx, leading, &loops).await;
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
async fn backfill(
    ctx: &LoopContext,
    leading: &Arc<AtomicBool>,
    loops: &docket_core::config::LoopParams,
) {
    let started = Instant::now();
    let total = Duration::from_secs(loops.bf_max_time.0.max(1));
    let slice = Duration::from_micros(loops.bf_yield_interval_us.max(1_000));
    let sleep = Duration::from_micros(loops.bf_yield_sleep_us);
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
        // Yielded: new submissions still get their direct pass meanwhile.
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = ctx.schedule.notified() => direct(ctx, leading, loops).await,
        }
    }
}

/// The direct pass after a commit that may let a job start (a submission, an end): starts
/// what can start now, without waiting for the next main pass.
///
/// Paced: a direct pass orders the whole pending queue, so under a submission storm with a
/// long queue running one per submission would spend the leader's CPU on planning rather
/// than on taking submissions. After a pass that took `d`, the next waits until `8d` has
/// passed (submissions arriving meanwhile are covered by it): at most a ninth of the time goes
/// to direct passes, and a job still starts within a few pass-lengths of its submission.
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
    *ctx.direct_pacer.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now() + cost * 8;
    propose_plan(ctx, plan).await;
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
            max_rpc_cnt: state.config.sched.loops.max_rpc_cnt as usize,
            stopped_by: None,
        };
        let now = TimeMs(wall_clock_ms().max(state.applied.now.0));
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
    match ctx.replica.write_one(Envelope::controller(command)).await {
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

/// Proposes the site's commands if the replicated state was never configured. Returns false
/// if leadership was lost meanwhile.
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
    for command in &ctx.site {
        if ctx.replica.status().role != Role::Leader {
            return false;
        }
        propose(ctx, command.clone()).await;
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
            stopped_by: None,
        }
    }

    #[test]
    fn a_pass_stops_on_rpc_pressure_lost_leadership_or_time_and_says_why() {
        let mut b = budget(3, 5, true, Duration::from_secs(60));
        assert!(!b.exhausted());
        b.inflight.store(6, Ordering::Relaxed);
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
}
