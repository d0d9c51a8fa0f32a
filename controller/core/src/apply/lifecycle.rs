//! Starting and ending jobs: the planner's decisions and the agents' reports.
//!
//! Apply re-validates every start decision against the state it meets (optimistic
//! concurrency): the planner planned on an older state, and a job may have been cancelled or
//! a node drained since. Decisions of one batch are checked in order, each seeing the ones
//! accepted before it, so a batch can never overcommit a node or a limit.
//!
//! End reports carry the dispatch epoch the agent holds; a report from an older dispatch
//! (the job was requeued and started elsewhere since) is ignored, so a job is never ended by
//! a ghost of its previous run.

use std::collections::BTreeSet;

use crate::apply::{Rejection, Response};
use crate::command::{Actor, EndCause, EndReport, StartDecision};
use crate::ids::{JobId, NodeName};
use crate::job::{Allocation, ArrayPart, JobRef, JobState, NodeShare, Part, Reason};
use crate::node::NodeUse;
use crate::policy::Affected;
use crate::policy::{DepStatus, stop_eligible_clock};
use crate::quantity::{Seconds, TimeMs};
use crate::state::State;

impl State {
    pub(crate) fn start_jobs(&mut self, decisions: &[StartDecision], now: TimeMs) -> Response {
        let mut running = self.running_summary(now);
        let mut results = Vec::with_capacity(decisions.len());
        let mut affected = Affected::default();
        for d in decisions {
            let r = self.start_one(d, &running, now);
            if let Ok(id) = &r
                && let Some(job) = self.jobs.get(id)
            {
                running.add_job(job, &self.accounts, now);
                self.note_changed(*id, &mut affected);
            }
            results.push(r);
        }
        self.refresh_affected(affected, now);
        Response::Started(results)
    }

    pub(crate) fn start_one(
        &mut self,
        d: &StartDecision,
        running: &crate::policy::RunningSummary,
        now: TimeMs,
    ) -> Result<JobId, Rejection> {
        let job = self
            .jobs
            .get(&d.job.job)
            .ok_or_else(|| Rejection::unknown("job", d.job))?;
        self.check_startable(job, d.job.task, running, now)?;
        let weights = self
            .partitions
            .get(&job.resolved.partition)
            .map(|p| p.billing)
            .unwrap_or_default();
        let shares = self.place_on_nodes(job.id, &d.nodes)?;
        // Accepted: nothing below can fail.
        let id = match d.job.task {
            Some(i) => self.split_task(d.job.job, i),
            None => d.job.job,
        };
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        let exclusive = self.jobs.get(&id).is_some_and(|j| j.spec.exclusive);
        for s in &shares {
            if let Some(node) = self.nodes.get_mut(&s.node) {
                node.jobs.insert(
                    id,
                    NodeUse {
                        cpus: s.cpus,
                        memory: s.memory,
                        jobfs: s.jobfs,
                        gpus: s.gpus,
                        exclusive,
                        suspended: false,
                    },
                );
            }
        }
        if let Some(job) = self.jobs.get_mut(&id) {
            stop_eligible_clock(job, now);
            job.state = JobState::Running;
            job.reason = Reason::None;
            job.start_time = Some(now);
            job.usage_until = Some(now);
            let mut alloc = Allocation {
                shares,
                exclusive,
                epoch,
                billing_milli: None,
            };
            // Version 4 records billing at start; an older entry applies as it did.
            if self.applying_version >= 4 {
                alloc.billing_milli = Some(weights.billing_milli(&alloc.tres()));
            }
            job.alloc = Some(alloc);
        }
        self.holding.insert(id);
        self.queue_index.touch(id);
        Ok(id)
    }

    /// A start decision for `job` (its `task`, for an array) still holds: the job is idle
    /// and pending, the task exists and may run, and no limit stops it.
    fn check_startable(
        &self,
        job: &crate::job::Job,
        task: Option<u32>,
        running: &crate::policy::RunningSummary,
        now: TimeMs,
    ) -> Result<(), Rejection> {
        let target = JobRef { job: job.id, task };
        let stale = |why: String| Rejection::Stale {
            job: target.to_string(),
            why,
        };
        if job.state != JobState::Pending {
            return Err(stale(format!("it is {}", job.state.name())));
        }
        if job.part != Part::Idle {
            return Err(stale(format!("it is blocked ({})", job.reason)));
        }
        match (&job.array, task) {
            (Some(ArrayPart::Master { pending, throttle }), Some(i)) => {
                if !pending.contains(i) {
                    return Err(stale(format!("task {i} is not pending")));
                }
                if let Some(t) = throttle
                    && running.array_running(job.id) >= *t
                {
                    return Err(stale(format!("{} (%{t})", Reason::JobArrayTaskLimit)));
                }
                if self.dependency_status(job, Some(i), now) != DepStatus::Satisfied {
                    return Err(stale(format!("task {i}'s dependency is not satisfied")));
                }
            }
            (Some(ArrayPart::Master { .. }), None) => {
                return Err(Rejection::invalid(
                    "job",
                    format!("{} is an array; a start decision names one task", job.id),
                ));
            }
            (_, Some(i)) if !matches!(job.array, Some(ArrayPart::Task { index, .. }) if index == i) =>
            {
                return Err(Rejection::unknown("array task", target));
            }
            _ => {}
        }
        // Limits, with every start accepted so far in this batch counted. The planner may
        // lift the soft MAXPS limit (when nothing else is eligible); nothing else.
        match self.start_blocker(job, running) {
            None => Ok(()),
            // HPC2N: "If there are NO other jobs eligible for scheduling then and only then are
            // jobs with resource requests between SOFT and HARD limit considered".
            Some(Reason::MaxPsSoftLimit) => {
                match self.jobs.values().find(|j| {
                    j.id != job.id
                        && j.state == JobState::Pending
                        && j.part == Part::Idle
                        && j.reason.is_eligible()
                }) {
                    Some(other) => Err(stale(format!(
                        "{}: the soft limit is lifted only when nothing else is eligible, \
                         and job {} is",
                        Reason::MaxPsSoftLimit,
                        other.id
                    ))),
                    None => Ok(()),
                }
            }
            Some(reason) => Err(stale(format!("limit {reason}"))),
        }
    }

    /// Checks that `nodes` can take the job now and computes what each gives it.
    fn place_on_nodes(&self, id: JobId, nodes: &[NodeName]) -> Result<Vec<NodeShare>, Rejection> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| Rejection::unknown("job", id))?;
        let stale = |why: String| Rejection::Stale {
            job: id.to_string(),
            why,
        };
        let spec = &job.spec;
        if nodes.len() as u64 != u64::from(spec.nodes) {
            return Err(Rejection::invalid(
                "nodes",
                format!(
                    "decision names {} nodes; the job asks for {}",
                    nodes.len(),
                    spec.nodes
                ),
            ));
        }
        let distinct: BTreeSet<&NodeName> = nodes.iter().collect();
        if distinct.len() != nodes.len() {
            return Err(Rejection::invalid("nodes", "a node is named twice"));
        }
        if let Some(missing) = spec.nodelist.iter().find(|n| !distinct.contains(n)) {
            return Err(stale(format!(
                "required node {missing} is not in the decision"
            )));
        }
        let partition = self
            .partitions
            .get(&job.resolved.partition)
            .ok_or_else(|| Rejection::unknown("partition", &job.resolved.partition))?;
        if !partition.up {
            return Err(stale(format!("partition {} is down", partition.name)));
        }
        self.check_reservations(job, nodes)?;
        let mut shares = Vec::with_capacity(nodes.len());
        for (k, name) in nodes.iter().enumerate() {
            let node = self
                .nodes
                .get(name)
                .ok_or_else(|| Rejection::unknown("node", name))?;
            if !node.accepts_jobs() {
                return Err(stale(format!("node {name} is {}", node.state())));
            }
            if !partition.nodes.contains(name) {
                return Err(stale(format!(
                    "node {name} is not in partition {}",
                    partition.name
                )));
            }
            if spec.exclude.contains(name) {
                return Err(stale(format!("node {name} is excluded by the job")));
            }
            if !spec.features.is_subset(&node.spec.features) {
                return Err(stale(format!("node {name} lacks a requested feature")));
            }
            let want = crate::request::node_use(job, k, &node.spec)
                .ok_or_else(|| stale("cpu or memory count overflows".into()))?;
            let (cpus, memory, gpus) = (want.cpus, want.memory, want.gpus);
            if !node.fits(&want) {
                return Err(stale(format!(
                    "node {name} has no room for {cpus} cpus, {memory} memory, {} jobfs, \
                     {gpus} gpus",
                    job.resolved.jobfs
                )));
            }
            shares.push(NodeShare {
                node: name.clone(),
                cpus,
                memory,
                jobfs: job.resolved.jobfs,
                gpus,
            });
        }
        Ok(shares)
    }

    /// Agents' end reports. A report whose epoch is not the job's current run is stale and
    /// ignored (an old run's end, or one already recorded). From a node's agent, a report on a
    /// current run dispatched to another node is refused: an agent speaks for its node only.
    pub(crate) fn end_jobs(
        &mut self,
        actor: &Actor,
        reports: &[EndReport],
        now: TimeMs,
    ) -> Response {
        let (mut applied, mut stale, mut refused) = (0, 0, 0);
        let mut affected = Affected::default();
        for r in reports {
            let run = self.jobs.get(&r.job).and_then(|j| {
                j.alloc
                    .as_ref()
                    .filter(|a| j.state.holds_resources() && a.epoch == r.epoch)
            });
            let current = run.is_some();
            let foreign = match (actor, run) {
                (Actor::Node(node), Some(alloc)) => {
                    alloc.shares.first().map(|s| &s.node) != Some(node)
                }
                _ => false,
            };
            if foreign {
                refused += 1;
            } else if current {
                self.finish(r.job, r.cause, Some(r.exit), now);
                self.note_changed(r.job, &mut affected);
                applied += 1;
            } else {
                stale += 1;
            }
        }
        self.refresh_affected(affected, now);
        Response::Ended {
            applied,
            stale,
            refused,
        }
    }

    pub(crate) fn down_node(
        &mut self,
        name: &NodeName,
        reason: &str,
        now: TimeMs,
    ) -> Result<Response, Rejection> {
        crate::apply::admin::check_reason(reason)?;
        let node = self
            .nodes
            .get_mut(name)
            .ok_or_else(|| Rejection::unknown("node", name))?;
        node.down = Some(reason.to_owned());
        let victims: Vec<JobId> = node.jobs.keys().copied().collect();
        for id in victims {
            self.finish(id, EndCause::NodeFail, None, now);
        }
        self.refresh_all_pending(now);
        Ok(Response::Done)
    }

    /// Ends a job that holds resources: frees them and sets its final state, or requeues it.
    fn finish(
        &mut self,
        id: JobId,
        mut cause: EndCause,
        mut exit: Option<crate::job::ExitStatus>,
        now: TimeMs,
    ) {
        self.accrue_usage(id, now);
        self.charge(id, now);
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        // Completed by its owner: the status they gave, with what the agent measured.
        if let Some(given) = job.completed_with.take()
            && cause != EndCause::NodeFail
        {
            let measured = exit.unwrap_or_default();
            cause = EndCause::Exited;
            exit = Some(crate::job::ExitStatus {
                code: given.code,
                signal: given.signal,
                ..measured
            });
        }
        let alloc = job.alloc.take();
        if alloc.is_some() {
            job.ran_on.clone_from(&alloc);
        }
        let cancelled = job.end_cause == Some(EndCause::Cancelled);
        let preempted = job.end_cause == Some(EndCause::Preempted);
        let requeue = goes_back_to_queue(job, cause);
        job.preempted = None;
        if let Some(since) = job.suspended_since.take() {
            job.suspended_total += now.since(since);
        }
        if requeue {
            back_to_queue(job);
        } else {
            set_final_state(job, cause, exit, now);
        }
        // A run that ended on its own says how long this user's jobs take (what runtime
        // predictions read); one cut short by someone else does not.
        let ran_its_course = !requeue
            && !cancelled
            && !preempted
            && matches!(
                cause,
                EndCause::Exited
                    | EndCause::Timeout
                    | EndCause::OutOfMemory
                    | EndCause::JobfsExceeded
            );
        let run_time = job.run_time(now);
        let user = job.spec.user.clone();
        if ran_its_course && let Some(entry) = self.users.get_mut(&user) {
            entry.recent_runtimes.record(run_time);
        }
        let terminal = job.state.is_terminal();
        self.end_live_steps(id, cause == EndCause::NodeFail, now);
        if let Some(alloc) = alloc {
            for share in alloc.shares {
                if let Some(node) = self.nodes.get_mut(&share.node) {
                    node.jobs.remove(&id);
                }
            }
        }
        self.suspended_shares.remove(&id);
        self.holding.remove(&id);
        self.queue_index.touch(id);
        if terminal {
            self.index_ended(&user, id);
        }
    }
}

/// Whether a run that ends with `cause` puts the job back in the queue: a requeue asked
/// for, a preemption that requeues, or a node failure or failed launch of a job submitted
/// with `--requeue` that nobody cancelled or preempted.
fn goes_back_to_queue(job: &crate::job::Job, cause: EndCause) -> bool {
    let cancelled = job.end_cause == Some(EndCause::Cancelled);
    let preempted = job.end_cause == Some(EndCause::Preempted);
    let requeue_asked = job.end_cause == Some(EndCause::Requeued);
    let preempt_requeue = preempted
        && job
            .preempted
            .is_some_and(|p| p.mode == crate::partition::PreemptMode::Requeue);
    preempt_requeue
        || requeue_asked
        || job.spec.requeue
            && !cancelled
            && !preempted
            && matches!(cause, EndCause::NodeFail | EndCause::LaunchFailed)
}

/// The job waits again as if just submitted (a new placement, no run recorded).
fn back_to_queue(job: &mut crate::job::Job) {
    job.state = JobState::Pending;
    job.part = Part::New;
    job.reason = Reason::None;
    job.requeue_count += 1;
    job.ran_on = None;
    job.start_time = None;
    job.usage_until = None;
    job.suspended_total = Seconds::ZERO;
    job.end_cause = None;
    job.exit = None;
}

/// The job's final state from how its run ended; a cancellation or preemption recorded
/// before the end wins over the cause.
fn set_final_state(
    job: &mut crate::job::Job,
    cause: EndCause,
    exit: Option<crate::job::ExitStatus>,
    now: TimeMs,
) {
    let cancelled = job.end_cause == Some(EndCause::Cancelled);
    let preempted = job.end_cause == Some(EndCause::Preempted);
    let exited_ok = exit.is_some_and(|e| e.code == 0 && e.signal == 0);
    job.state = match cause {
        _ if cancelled => JobState::Cancelled,
        _ if preempted => JobState::Preempted,
        EndCause::Exited if exited_ok => JobState::Completed,
        EndCause::Exited | EndCause::JobfsExceeded | EndCause::LaunchFailed => JobState::Failed,
        EndCause::Timeout => JobState::Timeout,
        EndCause::OutOfMemory => JobState::OutOfMemory,
        EndCause::NodeFail => JobState::NodeFail,
        EndCause::Cancelled | EndCause::Requeued => JobState::Cancelled,
        EndCause::Preempted => JobState::Preempted,
    };
    job.end_time = Some(now);
    job.exit = exit;
    if !cancelled && !preempted {
        job.end_cause = Some(cause);
    }
}

impl State {
    /// A job in a reservation starts only on its nodes and inside its window; any other job
    /// only where no reservation's window would overlap its run.
    fn check_reservations(
        &self,
        job: &crate::job::Job,
        nodes: &[NodeName],
    ) -> Result<(), Rejection> {
        let now = self.applied.now;
        let end = job.resolved.time_limit.map(|t| now.plus(t));
        let stale = |why: String| Rejection::Stale {
            job: job.id.to_string(),
            why,
        };
        match &job.spec.reservation {
            Some(name) => {
                let r = self
                    .reservations
                    .get(name)
                    .ok_or_else(|| stale(format!("reservation {name} is gone")))?;
                if !r.contains(now, end) {
                    return Err(stale(format!(
                        "its run would not lie inside reservation {name}'s window"
                    )));
                }
                if let Some(n) = nodes.iter().find(|n| !r.nodes.contains(*n)) {
                    return Err(stale(format!("node {n} is not in reservation {name}")));
                }
            }
            None => {
                for r in self.reservations.values().filter(|r| r.overlaps(now, end)) {
                    if let Some(n) = nodes.iter().find(|n| r.nodes.contains(*n)) {
                        return Err(stale(format!(
                            "node {n} is reserved ({}) during its run",
                            r.name
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}
