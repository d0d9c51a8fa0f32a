//! The event loop of a replay: arrivals, ends and expiring predictions in time order, each
//! instant's commands applied to the real state machine, and the passes run as the leader
//! runs them.
//!
//! The trace's jobs are the agents' side: a started job "runs" for its trace runtime
//! ([`Running`]), and its end is reported with `EndJobs` as an agent would. Everything else
//! (submission, placement, starts, preemption, charging) is the controller's own code.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use super::machine::{self, Machine};
use super::{Driver, JobOutcome, Policy, Sample, SimError, SimOptions, swf};
use crate::command::{Command, EndCause, EndReport, StartDecision};
use crate::config::BackfillMode;
use crate::ids::JobId;
use crate::job::{ExitStatus, JobRef};
use crate::partition::PreemptMode;
use crate::plan::Unlimited;
use crate::quantity::TimeMs;
use crate::{PreemptOutcome, Response, State};

/// The jobs holding processors, and when each will end: the agents' side of a replay. A
/// job is known by its place in the trace, so its end is found in a list, not a hash map
/// (probed several times at every event: 2% of a 100,000-job replay).
struct Running {
    /// Ends in time order, with the job and its place in the trace; an entry whose job no
    /// longer ends then (it was suspended or killed) is skipped.
    ends: BinaryHeap<Reverse<(u64, JobId, usize)>>,
    /// By place in the trace: when the job ends, [`NOT_RUNNING`] when it holds nothing.
    end_of: Vec<u64>,
    /// How many jobs have an end in `end_of`.
    count: usize,
    /// Suspended jobs (by place in the trace) and the run time they have left.
    suspended: FxHashMap<usize, u64>,
    busy: u64,
}

/// `Running::end_of` of a job that holds nothing.
const NOT_RUNNING: u64 = u64::MAX;

impl Running {
    /// For a trace of `jobs` jobs.
    fn new(jobs: usize) -> Running {
        Running {
            ends: BinaryHeap::new(),
            end_of: vec![NOT_RUNNING; jobs],
            count: 0,
            suspended: FxHashMap::default(),
            busy: 0,
        }
    }

    fn start(&mut self, id: JobId, k: usize, end: u64, procs: u64) {
        self.ends.push(Reverse((end, id, k)));
        if std::mem::replace(&mut self.end_of[k], end) == NOT_RUNNING {
            self.count += 1;
        }
        self.busy += procs;
    }

    /// Stops trace job `k`'s clock; `keep` remembers what it has left (suspension).
    fn stop(&mut self, k: usize, now: u64, procs: u64, keep: bool) {
        let end = std::mem::replace(&mut self.end_of[k], NOT_RUNNING);
        if end != NOT_RUNNING {
            self.count -= 1;
            self.busy -= procs;
            if keep {
                self.suspended.insert(k, end.saturating_sub(now));
            }
        }
    }

    fn resume(&mut self, id: JobId, k: usize, now: u64, procs: u64) {
        if let Some(left) = self.suspended.remove(&k) {
            self.start(id, k, now + left, procs);
        }
    }

    fn next_end(&mut self) -> Option<u64> {
        while let Some(Reverse((t, _, k))) = self.ends.peek().copied() {
            if self.end_of[k] == t {
                return Some(t);
            }
            self.ends.pop();
        }
        None
    }

    /// The jobs that end at `t`, with their places in the trace.
    fn ending(&mut self, t: u64) -> Vec<(JobId, usize)> {
        let mut out = Vec::new();
        while self.next_end() == Some(t) {
            if let Some(Reverse((_, id, k))) = self.ends.pop() {
                self.end_of[k] = NOT_RUNNING;
                self.count -= 1;
                out.push((id, k));
            }
        }
        out
    }

    /// How many jobs run (suspended ones not counted).
    fn len(&self) -> usize {
        self.count
    }
}

/// The jobs submitted and not yet started, with their processor counts.
///
/// A job needs at least as many idle processors as its count (one cpu per task, never
/// fewer), so while the idle processors cover no waiting job's count, a pass can start
/// nothing and is not run. Under strict FCFS (no backfilling, the arrival order, no site) a
/// pass starts jobs from the head of the queue and stops at the first that does not fit, so
/// it can start nothing while the head does not fit. Preemption is the exception (it frees
/// processors), so a replay that can preempt runs every pass; a job requeued by preemption
/// is not counted again, which only such a replay does.
#[derive(Default)]
struct Waiting {
    /// By id: ids are given in arrival order, so the first is the oldest, FCFS's head.
    by_id: std::collections::BTreeMap<JobId, u64>,
    /// How many waiting jobs have each count.
    counts: std::collections::BTreeMap<u64, usize>,
}

impl Waiting {
    fn add(&mut self, id: JobId, procs: u64) {
        if self.by_id.insert(id, procs).is_none() {
            *self.counts.entry(procs).or_default() += 1;
        }
    }

    fn remove(&mut self, id: JobId) {
        let Some(procs) = self.by_id.remove(&id) else {
            return;
        };
        if let Some(n) = self.counts.get_mut(&procs) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&procs);
            }
        }
    }

    /// Whether some waiting job's count is at most `idle`.
    fn any_fits(&self, idle: u64) -> bool {
        self.counts
            .keys()
            .next()
            .is_some_and(|&least| least <= idle)
    }

    /// Whether the oldest waiting job's count is at most `idle`.
    fn head_fits(&self, idle: u64) -> bool {
        self.by_id
            .first_key_value()
            .is_some_and(|(_, &procs)| procs <= idle)
    }
}

/// The trace job behind each submitted job (its place in the trace), by id.
///
/// The state gives ids in submission order, so a list from the first id holds them densely,
/// and a start or an end looks near the last one: a hash map of every job submitted (a
/// hundred thousand entries that only grow) missed the cache at every submission, start
/// and end.
#[derive(Default)]
struct Which {
    first: u64,
    /// By id from `first`; `usize::MAX` where an id is not a trace job's.
    of: Vec<usize>,
    count: usize,
}

impl Which {
    fn insert(&mut self, id: JobId, k: usize) {
        if self.of.is_empty() {
            self.first = id.0;
        }
        let Some(at) =
            id.0.checked_sub(self.first)
                .and_then(|at| usize::try_from(at).ok())
        else {
            return; // never: ids only grow
        };
        if at >= self.of.len() {
            self.of.resize(at + 1, usize::MAX);
        }
        if self.of[at] == usize::MAX {
            self.count += 1;
        }
        self.of[at] = k;
    }

    fn get(&self, id: JobId) -> Option<usize> {
        let at = usize::try_from(id.0.checked_sub(self.first)?).ok()?;
        self.of.get(at).copied().filter(|&k| k != usize::MAX)
    }

    /// How many submitted jobs came from the trace.
    fn len(&self) -> usize {
        self.count
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = (JobId, usize)> + '_ {
        self.of
            .iter()
            .enumerate()
            .filter(|(_, k)| **k != usize::MAX)
            .map(|(at, &k)| (JobId(self.first + at as u64), k))
    }
}

/// What a replay could not run: refusals by the site's policies and jobs never started.
pub(super) struct Tally {
    pub refused: usize,
    pub first_refusal: Option<String>,
    pub unstarted: usize,
}

/// A replay in progress.
pub(super) struct Replayer<'t> {
    /// The trace's jobs in submission order; a job is known by its place here.
    jobs: Vec<&'t swf::SwfJob>,
    pub machine: Machine,
    policy: Policy,
    /// The configuration can preempt: the main pass (which plans preemptions and resumes)
    /// runs before backfill.
    preempting: bool,
    /// Replaying on a site's configuration rather than the textbook machine.
    on_site: bool,
    d: Driver,
    /// What each trace job became (its last run), and whether that run ended.
    outcomes: Vec<Option<JobOutcome>>,
    completed: Vec<bool>,
    /// The trace job behind each submitted job.
    which: Which,
    running: Running,
    samples: Vec<Sample>,
    refused: usize,
    first_refusal: Option<String>,
    /// The next trace job to arrive.
    next: usize,
    /// Jobs ended so far.
    done: usize,
    last_tick: u64,
    /// Instants at which a running job outlives its runtime prediction: the plans are made
    /// again then, on the corrected prediction (EASY++); stale entries are skipped.
    expiries: BinaryHeap<Reverse<(u64, JobId)>>,
    /// The jobs waiting to start, by processor count: passes that can start none are skipped.
    waiting: Waiting,
}

impl<'t> Replayer<'t> {
    /// A state machine configured as `machine` says, before the first arrival.
    pub fn set_up(
        jobs: Vec<&'t swf::SwfJob>,
        mut machine: Machine,
        policy: Policy,
        options: &SimOptions,
    ) -> Result<Self, SimError> {
        // Preemption and resumes are planned by the main pass: run it before backfill when
        // the configuration can preempt.
        let preempting = machine.config.preempt.parallel_run.is_some()
            || options.site.as_ref().is_some_and(|s| {
                s.site
                    .partitions
                    .iter()
                    .any(|p| p.preempt_mode != PreemptMode::Off)
                    || s.site.qos.iter().any(|q| !q.preempt.is_empty())
            });
        let mut d = Driver {
            state: State::new(machine.config.clone()),
            index: 0,
        };
        let t0 = jobs.first().map_or(0, |j| j.submit);
        for cmd in std::mem::take(&mut machine.commands) {
            d.apply(cmd, t0)
                .map_err(|e| SimError::Setup(e.to_string()))?;
        }
        let total = jobs.len();
        Ok(Replayer {
            jobs,
            machine,
            policy,
            preempting,
            on_site: options.site.is_some(),
            d,
            outcomes: vec![None; total],
            completed: vec![false; total],
            which: Which::default(),
            running: Running::new(total),
            samples: Vec::new(),
            refused: 0,
            first_refusal: None,
            next: 0,
            done: 0,
            last_tick: t0,
            expiries: BinaryHeap::new(),
            waiting: Waiting::default(),
        })
    }

    /// Runs every event to the end of the trace.
    pub fn run(&mut self, progress: &mut dyn FnMut(usize, usize)) -> Result<(), SimError> {
        while let Some(t) = self.next_instant() {
            self.renew_expired_predictions(t);
            if t >= self.last_tick + 3600 {
                self.d.apply(Command::Tick, t)?;
                self.last_tick = t;
            }
            if self.end_jobs_due(t)? {
                progress(self.done, self.jobs.len());
            }
            self.submit_arrivals(t)?;
            self.schedule(t)?;
            self.sample(t);
            if self.running.next_end().is_none()
                && self.next >= self.jobs.len()
                && self.done < self.which.len()
            {
                if self.on_site {
                    // The site's limits keep these from ever starting (a MAXPS hard limit,
                    // a down partition, ...): reported, not an error.
                    break;
                }
                return Err(SimError::Stuck {
                    time: t,
                    queued: self.which.len() - self.done,
                });
            }
        }
        Ok(())
    }

    /// The outcomes of the jobs that ran to their end, the samples, and what did not run.
    pub fn finish(self) -> (Vec<JobOutcome>, Vec<Sample>, Tally) {
        let unstarted = self.which.len() - self.done;
        let outcomes = self
            .outcomes
            .into_iter()
            .zip(self.completed)
            .filter_map(|(o, done)| o.filter(|_| done))
            .collect();
        let tally = Tally {
            refused: self.refused,
            first_refusal: self.first_refusal,
            unstarted,
        };
        (outcomes, self.samples, tally)
    }

    /// The next instant something happens: an arrival, an end or an expiring prediction;
    /// none once nothing arrives or runs (expiries belong to running jobs).
    fn next_instant(&mut self) -> Option<u64> {
        let arrival = self.jobs.get(self.next).map(|j| j.submit);
        let end = self.running.next_end();
        let t = [arrival, end].into_iter().flatten().min()?;
        Some(self.expiries.peek().map_or(t, |Reverse((x, _))| t.min(*x)))
    }

    /// Predictions that run out at `t`: the passes plan on the corrected ones.
    fn renew_expired_predictions(&mut self, t: u64) {
        while let Some(&Reverse((x, id))) = self.expiries.peek()
            && x <= t
        {
            self.expiries.pop();
            let later = self
                .d
                .state
                .jobs
                .get(&id)
                .and_then(|j| j.prediction_expires(TimeMs(t * 1000)));
            schedule_expiry(&mut self.expiries, later, id);
        }
    }

    /// Reports the jobs whose runtime ends at `t`; whether any did.
    fn end_jobs_due(&mut self, t: u64) -> Result<bool, SimError> {
        let mut reports = Vec::new();
        for (id, k) in self.running.ending(t) {
            reports.push(ended(&self.d.state, id, EndCause::Exited, 0));
            self.running.busy -= self.jobs[k].procs;
            self.completed[k] = true;
            // Later than planned when it was suspended on the way.
            if let Some(o) = self.outcomes[k].as_mut() {
                o.end = t;
            }
            self.done += 1;
        }
        if reports.is_empty() {
            return Ok(false);
        }
        self.d.apply(Command::EndJobs(reports), t)?;
        Ok(true)
    }

    /// Submits the jobs that arrive at `t`, in one command.
    fn submit_arrivals(&mut self, t: u64) -> Result<(), SimError> {
        let first = self.next;
        while self.next < self.jobs.len() && self.jobs[self.next].submit == t {
            self.next += 1;
        }
        if self.next == first {
            return Ok(());
        }
        // Sized up front: collected through `Result`, the list grew from four.
        let mut specs = Vec::with_capacity(self.next - first);
        for j in &self.jobs[first..self.next] {
            specs.push(self.machine.jobs.spec(j)?);
        }
        // Sent only when the state does not hold it (it is dropped when no job uses it any
        // more), as a client that knows may: hashing it again for every batch, to find it
        // already stored, was 4% of a 100,000-job replay.
        let stored = self.d.state.blobs.contains_key(&self.machine.jobs.script);
        let blobs = if stored {
            Vec::new()
        } else {
            vec![machine::SCRIPT.to_vec()]
        };
        let r = self
            .d
            .apply(Command::SubmitJobs { blobs, jobs: specs }, t)?;
        let Response::Submitted(results) = r else {
            return Err(SimError::Refused(format!("submission answered {r:?}")));
        };
        for (k, r) in results.into_iter().enumerate() {
            match r {
                Ok(id) => {
                    self.which.insert(id, first + k);
                    self.waiting.add(id, self.jobs[first + k].procs);
                }
                // The site's policies refuse it (a walltime cap, a QOS the partition does
                // not allow, ...): counted, as a controller would have told the user. The
                // textbook machine refuses nothing.
                Err(e) if self.on_site => {
                    self.refused += 1;
                    self.first_refusal
                        .get_or_insert_with(|| format!("{}: {e}", self.jobs[first + k]));
                }
                Err(e) => {
                    return Err(SimError::Refused(format!("{}: {e}", self.jobs[first + k])));
                }
            }
        }
        Ok(())
    }

    /// The passes, as the leader runs them. On a site, they run again while they start
    /// something: a start can unblock others (Maui promotes a blocked job when an idle one
    /// starts), which the leader's next loop would see seconds later. The textbook
    /// algorithms start everything they can in one pass.
    fn schedule(&mut self, t: u64) -> Result<(), SimError> {
        let now = TimeMs(t * 1000);
        let rounds = if self.on_site { 16 } else { 1 };
        for _ in 0..rounds {
            let idle = self.machine.procs.saturating_sub(self.running.busy);
            let may_start = if self.strict_fcfs() {
                self.waiting.head_fits(idle)
            } else {
                self.waiting.any_fits(idle)
            };
            if !self.preempting && !may_start {
                break;
            }
            let mut starts = Vec::new();
            if self.policy.backfill == BackfillMode::Off || self.preempting {
                starts.extend(self.main_pass(t)?);
            }
            if self.policy.backfill != BackfillMode::Off {
                let plan = self.d.state.backfill_pass(now, &mut Unlimited, None);
                starts.extend(apply_starts(&mut self.d, plan.starts, t)?);
                apply_notes(&mut self.d, plan.bypassed, plan.reasons, t)?;
            }
            if starts.is_empty() {
                break;
            }
            self.record_starts(starts, t);
        }
        Ok(())
    }

    /// Whether passes start jobs strictly in arrival order: no backfilling, the queue in
    /// the priority order a replay without a site has (first come, first served), no
    /// starvation promotion.
    fn strict_fcfs(&self) -> bool {
        self.policy.backfill == BackfillMode::Off
            && self.policy.order.is_none()
            && self.policy.starvation_wait.is_none()
            && !self.on_site
    }

    /// The main pass: its starts applied, its preemptions and resumes carried out; the jobs
    /// it started.
    fn main_pass(&mut self, t: u64) -> Result<Vec<JobId>, SimError> {
        let plan = self
            .d
            .state
            .main_pass(TimeMs(t * 1000), &mut Unlimited, None);
        let mut starts = apply_starts(&mut self.d, plan.starts, t)?;
        if !plan.preemptions.is_empty() {
            starts.extend(self.preempt(plan.preemptions, t)?);
        }
        if !plan.resumes.is_empty() {
            self.resume(&plan.resumes, t)?;
        }
        apply_notes(&mut self.d, plan.bypassed, plan.reasons, t)?;
        Ok(starts)
    }

    /// Applies the planned preemptions: suspended victims keep their time left, killed
    /// ones are reported ended; the preemptors that started.
    fn preempt(
        &mut self,
        preemptions: Vec<crate::command::PreemptDecision>,
        t: u64,
    ) -> Result<Vec<JobId>, SimError> {
        let victims: Vec<Vec<JobId>> = preemptions.iter().map(|p| p.victims.clone()).collect();
        let Response::Preempted(results) = self.d.apply(Command::Preempt(preemptions), t)? else {
            return Err(SimError::Refused("preempt answered otherwise".into()));
        };
        let mut starts = Vec::new();
        let mut killed = Vec::new();
        for (r, victims) in results.into_iter().zip(victims) {
            let suspend = match r {
                Ok(PreemptOutcome::Started(id)) => {
                    starts.push(id);
                    true
                }
                Ok(PreemptOutcome::Freeing) => false,
                Err(e) => return Err(SimError::Refused(format!("a preemption: {e}"))),
            };
            for v in victims {
                if let Some(k) = self.which.get(v) {
                    self.running.stop(k, t, self.jobs[k].procs, suspend);
                }
                if !suspend {
                    killed.push(ended(&self.d.state, v, EndCause::Preempted, 15));
                }
            }
        }
        if !killed.is_empty() {
            self.d.apply(Command::EndJobs(killed), t)?;
        }
        Ok(starts)
    }

    /// Resumes the suspended jobs the main pass chose; their clocks run again.
    fn resume(&mut self, resumes: &[JobId], t: u64) -> Result<(), SimError> {
        let refs: Vec<JobRef> = resumes
            .iter()
            .map(|id| JobRef {
                job: *id,
                task: None,
            })
            .collect();
        let Response::PerJob(results) = self.d.apply(Command::ResumeJobs { jobs: refs }, t)? else {
            return Err(SimError::Refused("resume answered otherwise".into()));
        };
        for (id, r) in resumes.iter().zip(results) {
            if r.is_ok()
                && let Some(k) = self.which.get(*id)
            {
                self.running.resume(*id, k, t, self.jobs[k].procs);
            }
        }
        Ok(())
    }

    /// Starts the started jobs' clocks and records their outcome (a requeued job's is its
    /// last run).
    fn record_starts(&mut self, starts: Vec<JobId>, t: u64) {
        let now = TimeMs(t * 1000);
        for id in starts {
            debug_assert!(self.which.get(id).is_some(), "job {id} is not the trace's");
            let Some(k) = self.which.get(id) else {
                continue;
            };
            let j = self.jobs[k];
            self.waiting.remove(id);
            self.running.start(id, k, t + j.runtime, j.procs);
            let expires = self
                .d
                .state
                .jobs
                .get(&id)
                .and_then(|j| j.prediction_expires(now));
            schedule_expiry(&mut self.expiries, expires, id);
            self.outcomes[k] = Some(JobOutcome {
                swf_id: j.id,
                user: j.user,
                procs: j.procs,
                submit: j.submit,
                start: t,
                end: t + j.runtime,
                estimate: j.estimate,
                run: j.runtime,
            });
        }
    }

    /// The machine's use at `t`.
    fn sample(&mut self, t: u64) {
        let in_system = self.which.len() - self.done;
        self.samples.push(Sample {
            time: t,
            busy_procs: self.running.busy,
            queued_jobs: (in_system - self.running.len() - self.running.suspended.len()) as u64,
        });
    }
}

/// The end report an agent would send for `id`'s current run.
fn ended(state: &State, id: JobId, cause: EndCause, signal: i32) -> EndReport {
    let epoch = state.jobs[&id].alloc.as_ref().map_or(0, |a| a.epoch);
    EndReport {
        job: id,
        epoch,
        cause,
        exit: ExitStatus {
            code: 0,
            signal,
            ..Default::default()
        },
    }
}

/// Re-plans at the (whole) second job `id`'s runtime prediction runs out, if it will.
fn schedule_expiry(
    expiries: &mut BinaryHeap<Reverse<(u64, JobId)>>,
    at: Option<TimeMs>,
    id: JobId,
) {
    if let Some(at) = at {
        expiries.push(Reverse((at.0.div_ceil(1000), id)));
    }
}

/// Applies what a pass noted about the jobs it did not start, as the leader proposes it:
/// who was bypassed (NCI's priority counts it) and why each waits. Without the reasons
/// recorded, every pass found every waiting job's reason news again and listed it anew.
fn apply_notes(
    d: &mut Driver,
    bypassed: Vec<JobId>,
    reasons: Vec<(JobId, crate::job::Reason)>,
    t: u64,
) -> Result<(), SimError> {
    if !bypassed.is_empty() {
        d.apply(Command::NoteBypassed(bypassed), t)?;
    }
    if !reasons.is_empty() {
        d.apply(Command::SetSchedulerReasons(reasons), t)?;
    }
    Ok(())
}

/// Applies planned starts; the ids of those apply accepted (a replay's plans are never
/// stale, so a refusal is a bug and stops the replay).
fn apply_starts(
    d: &mut Driver,
    starts: Vec<StartDecision>,
    t: u64,
) -> Result<Vec<JobId>, SimError> {
    if starts.is_empty() {
        return Ok(Vec::new());
    }
    let Response::Started(results) = d.apply(Command::StartJobs(starts), t)? else {
        return Err(SimError::Refused("start answered otherwise".into()));
    };
    results
        .into_iter()
        .map(|r| r.map_err(|e| SimError::Refused(format!("a planned start: {e}"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Reason;

    fn job(id: u64, submit: u64, procs: u64, runtime: u64) -> swf::SwfJob {
        swf::SwfJob {
            id,
            submit,
            runtime,
            procs,
            estimate: runtime,
            user: 1,
            group: 1,
            queue: -1,
            partition: -1,
        }
    }

    /// The leader commits what its passes note about the jobs they did not start (who was
    /// bypassed, which NCI's and Maui's priorities count, and why each waits); a replay
    /// applies the same commands, or its priorities would differ from the controller's.
    #[test]
    fn a_replay_records_who_was_bypassed_and_why_a_job_waits() {
        // Four cpus: job 1 holds two until 100, job 2 wants all four (reserved at 100), job
        // 3 fits in the other two and ends by then, so it is backfilled past job 2.
        let trace = [job(1, 0, 2, 100), job(2, 1, 4, 100), job(3, 2, 2, 50)];
        let jobs: Vec<&swf::SwfJob> = trace.iter().collect();
        let options = SimOptions {
            policy: Some(Policy::EASY),
            procs: Some(4),
            max_jobs: None,
            site: None,
        };
        let machine = machine::build(None, Policy::EASY, Some(4), true, &jobs).unwrap();
        let mut r = Replayer::set_up(jobs, machine, Policy::EASY, &options).unwrap();
        while let Some(t) = r.next_instant().filter(|&t| t <= 2) {
            r.end_jobs_due(t).unwrap();
            r.submit_arrivals(t).unwrap();
            r.schedule(t).unwrap();
        }
        let id_of = |k: usize| r.which.iter().find(|(_, v)| *v == k).unwrap().0;
        let state = &r.d.state;
        let (head, backfilled) = (&state.jobs[&id_of(1)], &state.jobs[&id_of(2)]);
        assert!(backfilled.alloc.is_some(), "job 3 was backfilled");
        assert_eq!(head.bypass_count, 1, "job 3 started past job 2");
        assert_eq!(head.reason, Reason::Resources);
    }
}
