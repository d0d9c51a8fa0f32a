//! The backfill pass: jobs start out of order where that delays no job ahead of them.
//!
//! Jobs are taken in order of consideration. One that fits now (for its whole time limit,
//! around every reservation made so far) starts. One that does not gets a reservation: the
//! earliest instant, within `bf_window` and rounded up to `bf_resolution`, at which nodes
//! come free for its whole time limit; from then on those nodes are taken in the profile, so
//! no later job can be placed on them in a way that would push it back. EASY reserves for the
//! first such job of each partition only; conservative for every one (up to
//! `reservation_depth`). Jobs count against `bf_max_job_test` and the per-user and
//! per-partition caps whether they start or not, as in Slurm.
//!
//! Durations are [`crate::job::Job::expected_runtime`]'s: time limits, or (with a runtime
//! predictor) predictions. With limits, a job that ends early frees its nodes early, which
//! can only make reserved jobs start sooner. With predictions (EASY++), a job that outlives
//! its prediction can delay a reservation until its prediction is corrected; the limit
//! still bounds that delay.
//!
//! With `bf_order = shortest` (EASY only), the queue is walked in order up to each
//! partition's first job that cannot start (which gets the reservation), and the jobs
//! behind those are tried shortest expected run time first (Tsafrir, Etsion and
//! Feitelson's SJBF): more and shorter jobs fit in the holes, and none can delay the
//! reservations.

use crate::config::{BackfillMode, BackfillOrder};
use crate::ids::JobId;
use crate::job::{JobRef, JobState, Part};
use crate::plan::pass::{Outcome, Pass};
use crate::plan::{Budget, Continuation, Plan};
use crate::quantity::TimeMs;
use crate::state::State;

/// The most jobs a pass sizes its record of failed jobs for before walking: 64 KiB, below
/// the size at which the allocator maps fresh pages for each pass.
const MAX_PRESIZED_WALK: usize = 4096;

impl State {
    /// One backfill pass; pass the continuation of a pass the budget stopped to resume it
    /// (`bf_continue`). With backfill off, plans nothing.
    pub fn backfill_pass(
        &self,
        now: TimeMs,
        budget: &mut dyn Budget,
        resume: Option<Continuation>,
    ) -> Plan {
        let params = &self.config.sched;
        if params.backfill == BackfillMode::Off {
            return Plan::default();
        }
        let Some((mut cont, mut walk_index)) = resume
            .map(|cont| (cont, false))
            .or_else(|| self.fresh_continuation(now))
        else {
            // Nothing waits: no profile to build (a replay meets an empty queue at most of
            // its events).
            return Plan::default();
        };
        let mut pass = Pass::new(self, now, crate::plan::pool::Horizon::Profile);
        // Reservations from before a yield still bind, where their jobs still wait.
        cont.reservations.retain(|(target, placement)| {
            self.jobs
                .get(&target.job)
                .is_some_and(|j| j.state == JobState::Pending && j.part == Part::Idle)
                && pass.pool.hold(&self.jobs[&target.job], placement)
        });
        let horizon = now.plus(params.bf_window);
        // SJBF: jobs behind their partition's reservation are counted against the caps in
        // queue order (as Slurm counts them) and wait in `deferred` until the queue has been
        // walked, then go shortest first.
        let shortest_first =
            params.bf_order == BackfillOrder::Shortest && params.backfill == BackfillMode::Easy;
        // Maui's bypass count: a job that could not start is bypassed when a job behind it
        // in the queue's order starts in the same pass (whatever order they were tried in).
        let walk_len = if walk_index {
            self.queue_index.idle_len()
        } else {
            cont.rest.len()
        };
        let mut bypass = Bypass::for_walk(walk_len, params.bf_max_job_test);
        let mut settled = Settled::default();
        loop {
            let positions = std::mem::take(&mut cont.positions);
            let mut queue = self.to_walk(walk_index, std::mem::take(&mut cont.rest));
            walk_index = false;
            let mut next_k = 0;
            while let Some(id) = queue.next() {
                let k = next_k;
                next_k += 1;
                let position = positions.get(k).copied().unwrap_or(cont.walked + k);
                // Deferred jobs were counted when the walk met them.
                if !cont.sorted
                    && params.bf_max_job_test > 0
                    && cont.considered >= u64::from(params.bf_max_job_test)
                {
                    break;
                }
                if budget.exhausted() {
                    cont.stop_at(k, std::iter::once(id).chain(queue).collect(), &positions);
                    return yielded(pass, cont, &bypass);
                }
                if !cont.sorted && settled.nothing_left(self, &pass, &cont) {
                    break;
                }
                let Some(job) = self.waiting(id) else {
                    continue;
                };
                if !cont.sorted {
                    if !self.admit_to_backfill(job, &mut cont) {
                        continue;
                    }
                    if shortest_first && cont.blocked.contains(&job.resolved.partition) {
                        cont.deferred.push((position, id));
                        continue;
                    }
                }
                match self.backfill_one(job, &mut pass, &mut cont, horizon, &settled) {
                    Outcome::Started => {
                        bypass.started(position);
                        settled.room = None;
                    }
                    Outcome::NoResources => bypass.failed(position, id),
                    Outcome::Limited => {}
                }
            }
            // `walked` is not advanced here: past this point the pass either ends or goes on
            // to the deferred jobs, whose positions it carries.
            if cont.sorted || cont.deferred.is_empty() {
                break;
            }
            self.sort_deferred(&mut cont, now);
        }
        bypass.note(&mut pass);
        pass.plan.reservations = cont.reservations;
        pass.plan.bypassed.sort_unstable();
        pass.plan.bypassed.dedup();
        pass.plan
    }

    /// The jobs a walk takes, in order: the queue's kept order itself for a fresh pass that
    /// walks it (`walk_index`), else `rest`. The walk usually stops early (below), and
    /// copying the whole kept queue first was a tenth of the NASA replay; the rest is copied
    /// only if the pass yields.
    fn to_walk(&self, walk_index: bool, rest: Vec<JobId>) -> Walk<'_> {
        match (walk_index, self.queue_index.in_order()) {
            (true, Some(kept)) => Walk::Kept(kept),
            _ => Walk::Rest(rest.into_iter()),
        }
    }

    /// A pass from the head of the queue, and whether it walks the queue's kept order
    /// itself (its `rest` then empty); none when nothing waits.
    fn fresh_continuation(&self, now: TimeMs) -> Option<(Continuation, bool)> {
        if self.queue_index.in_order().is_some() {
            return (!self.queue_index.is_empty()).then(|| (Continuation::default(), true));
        }
        let rest = self.consideration_order(now);
        (!rest.is_empty()).then(|| {
            let cont = Continuation {
                rest,
                ..Continuation::default()
            };
            (cont, false)
        })
    }

    /// The deferred jobs become the rest of the pass, shortest expected run first
    /// (unlimited last); ties keep the queue's order.
    fn sort_deferred(&self, cont: &mut Continuation, now: TimeMs) {
        cont.sorted = true;
        let mut deferred = std::mem::take(&mut cont.deferred);
        deferred.sort_by_cached_key(|&(position, id)| {
            let runtime = self
                .jobs
                .get(&id)
                .and_then(|j| j.expected_runtime(now))
                .map_or(u64::MAX, |s| s.0);
            (runtime, position)
        });
        cont.positions = deferred.iter().map(|d| d.0).collect();
        cont.rest = deferred.into_iter().map(|d| d.1).collect();
    }

    /// Counts `job` against backfill's caps (`bf_max_job_part`, `bf_max_job_user`) and the
    /// jobs tested; `false` (and nothing counted) when a cap is reached.
    fn admit_to_backfill(&self, job: &crate::job::Job, cont: &mut Continuation) -> bool {
        let params = &self.config.sched;
        let partition = &job.resolved.partition;
        // Counted only where a cap reads the count: two name-keyed map updates per job were
        // a seventh of a replay's time with no cap set.
        if params.bf_max_job_part > 0 {
            let in_partition = cont.depth.get(partition).copied().unwrap_or(0);
            if in_partition >= params.bf_max_job_part {
                return false;
            }
            if params.bf_max_job_user > 0
                && cont.per_user.get(&job.spec.user).copied().unwrap_or(0) >= params.bf_max_job_user
            {
                return false;
            }
            cont.depth.insert(partition.clone(), in_partition + 1);
        }
        if params.bf_max_job_user > 0 {
            let of_user = cont.per_user.get(&job.spec.user).copied().unwrap_or(0);
            if of_user >= params.bf_max_job_user {
                return false;
            }
            cont.per_user.insert(job.spec.user.clone(), of_user + 1);
        }
        cont.considered += 1;
        true
    }

    /// Backfill's step for one admitted job: started if it fits around every reservation so
    /// far, else given a reservation where the mode says so. Once `settled` knows every
    /// partition has its reservation (EASY), none is looked up by name: most jobs a
    /// pass walks on a busy machine do not fit, and that lookup was 2% of a 100,000-job
    /// replay. A job's partition always exists (one with queued jobs cannot be removed).
    fn backfill_one(
        &self,
        job: &crate::job::Job,
        pass: &mut Pass<'_>,
        cont: &mut Continuation,
        horizon: TimeMs,
        settled: &Settled,
    ) -> Outcome {
        let params = &self.config.sched;
        let id = job.id;
        let partition = &job.resolved.partition;
        let outcome = pass.try_start(job);
        if outcome != Outcome::NoResources {
            return outcome;
        }
        pass.note_reason(job, crate::job::Reason::Resources);
        let may_reserve = match params.backfill {
            BackfillMode::Off => false,
            BackfillMode::Easy => {
                !settled.every_partition_blocked && !cont.blocked.contains(partition)
            }
            BackfillMode::Conservative => {
                params.reservation_depth == 0
                    || cont.reservations.len() < params.reservation_depth as usize
            }
        };
        if !may_reserve {
            return outcome;
        }
        cont.blocked.insert(partition.clone());
        let target = match &job.array {
            Some(crate::job::ArrayPart::Master { pending, .. }) => JobRef {
                job: id,
                task: pending.first(),
            },
            _ => JobRef {
                job: id,
                task: None,
            },
        };
        if let Some(placement) = pass.pool.reserve(
            job,
            job.expected_runtime(pass.now),
            params.bf_resolution,
            horizon,
        ) {
            cont.reservations.push((target, placement));
        }
        outcome
    }
}

/// The jobs a backfill walk takes ([`State::to_walk`]): an enum rather than a boxed iterator,
/// whose call through a pointer for each job walked was 3% of a 100,000-job EASY replay.
enum Walk<'a> {
    Kept(crate::queue_index::InOrder<'a>),
    Rest(std::vec::IntoIter<JobId>),
}

impl Iterator for Walk<'_> {
    type Item = JobId;

    fn next(&mut self) -> Option<JobId> {
        match self {
            Walk::Kept(kept) => kept.next(),
            Walk::Rest(rest) => rest.next(),
        }
    }
}

/// When the rest of a walk in queue order can decide nothing, so the walk stops there:
/// nothing can be placed now (no node has room, [`crate::plan::Pool::room_now`], and the
/// configuration cannot preempt) and no job left may get a reservation (EASY: every
/// partition has its own; conservative: `reservation_depth` is reached).
///
/// On a full machine with a deep queue that is most of the walks: `perf` of the NASA iPSC
/// replay under EASY at load 0.9 put 89% of its time in backfill passes, and 79% of the jobs
/// they walked were walked while no processor was free. In a pass that runs to its end,
/// nothing changes in what starts, what is reserved or who is bypassed (a job walked later
/// than every start is bypassed by none). The jobs not walked keep their pending reasons, as
/// those past `bf_max_job_test` do. Jobs deferred by `bf_order = shortest` are still tried:
/// a deferred job can have been overtaken by a start behind it. A pass that would have
/// yielded in that tail (its budget, RPC pressure) now ends instead: its cycle is over there
/// rather than resuming in the tail after the yield, and cpus freed meanwhile are taken by
/// the direct pass their job's end wakes, and by the next cycle.
#[derive(Default)]
struct Settled {
    /// Whether some node has room now; unknown (`None`) again after every start.
    room: Option<bool>,
    /// Whether every partition has its reservation, as of `blocked_seen` partitions blocked
    /// (EASY; blocked partitions only grow within a pass, so once true it stays true).
    every_partition_blocked: bool,
    blocked_seen: usize,
}

impl Settled {
    fn nothing_left(&mut self, state: &State, pass: &Pass<'_>, cont: &Continuation) -> bool {
        let params = &state.config.sched;
        let reserved = match params.backfill {
            BackfillMode::Off => true,
            BackfillMode::Easy => {
                if cont.blocked.len() != self.blocked_seen {
                    self.blocked_seen = cont.blocked.len();
                    self.every_partition_blocked =
                        state.partitions.keys().all(|p| cont.blocked.contains(p));
                }
                self.every_partition_blocked
            }
            BackfillMode::Conservative => {
                params.reservation_depth > 0
                    && cont.reservations.len() >= params.reservation_depth as usize
            }
        };
        reserved && !pass.preempts && !*self.room.get_or_insert_with(|| pass.pool.room_now())
    }
}

impl Continuation {
    /// Where a walk stopped by its budget resumes: before its `k`th job, with `rest` (that
    /// job and those after it) still to walk; in the sorted phase their queue positions
    /// follow from `positions`.
    fn stop_at(&mut self, k: usize, rest: Vec<JobId>, positions: &[usize]) {
        self.rest = rest;
        if self.sorted {
            self.positions = positions[k.min(positions.len())..].to_vec();
        } else {
            self.walked += k;
        }
    }
}

/// The plan of a pass the budget stopped: what it decided so far, its reservations, and
/// where to resume (`cont`, already advanced past what was walked).
fn yielded(mut pass: Pass<'_>, cont: Continuation, bypass: &Bypass) -> Plan {
    bypass.note(&mut pass);
    pass.plan.reservations = cont.reservations.clone();
    pass.plan.continuation = Some(cont);
    pass.plan
}

/// The jobs that could not start and the latest queue position that did, in one pass.
struct Bypass {
    failed: Vec<(usize, crate::ids::JobId)>,
    latest_start: Option<usize>,
}

impl Bypass {
    /// Sized for a walk of `walk_len` jobs up front: grown a push at a time, the record was
    /// reallocated about ten times a pass on a queue thousands deep (5% of a 100,000-job
    /// EASY replay). A walk takes at most `bf_max_job_test` jobs where that is set.
    fn for_walk(walk_len: usize, bf_max_job_test: u32) -> Bypass {
        let test_cap = match bf_max_job_test {
            0 => usize::MAX,
            n => n as usize,
        };
        Bypass {
            failed: Vec::with_capacity(walk_len.min(test_cap).min(MAX_PRESIZED_WALK)),
            latest_start: None,
        }
    }

    fn failed(&mut self, position: usize, id: crate::ids::JobId) {
        self.failed.push((position, id));
    }

    fn started(&mut self, position: usize) {
        self.latest_start = self.latest_start.max(Some(position));
    }

    /// Every job that could not start with a started job behind it (Maui's bypass count;
    /// NCI: bypassed jobs gain score so none starves).
    fn note(&self, pass: &mut Pass<'_>) {
        let Some(latest) = self.latest_start else {
            return;
        };
        // Counted first: extended from a filter, the list grew two or three times a pass.
        let bypassed = || {
            self.failed
                .iter()
                .filter(move |(position, _)| *position < latest)
                .map(|(_, id)| *id)
        };
        pass.plan.bypassed.reserve_exact(bypassed().count());
        pass.plan.bypassed.extend(bypassed());
    }
}
