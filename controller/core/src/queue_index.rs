//! The idle queue kept in order of consideration, for orders that never change with time.
//!
//! Every pass walks the idle queue in order of consideration. Computed afresh, that order
//! costs a key for every idle job and a heap on every pass, although a main pass usually
//! stops after a few jobs: with thousands of jobs queued and a pass at every event, `perf`
//! put half of a trace replay's time there (NASA and Lublin's traces under FCFS at load 0.9).
//!
//! Under most formulas the order moves with the clock (age, fair-share decay, expansion
//! factors, `starvation_wait`), so it must be computed at each pass. Under the others —
//! FCFS (Slurm's priority/basic), shortest expected run time first and F1, with no
//! starvation bound and no shuffling — a job's key depends only on the job and the
//! configuration, so the order changes only when a job enters or leaves the idle queue or
//! the configuration changes. For those this index keeps the order as it changes and
//! passes walk it lazily, stopping where they stop.
//!
//! Whatever the order, the index also keeps the set of idle jobs, so a pass that must key
//! them afresh walks those alone and not every job the state holds (finished jobs stay until
//! `MinJobAge` ends: with 17,000 jobs held, `perf` put 14% of a leader's cpu during a storm of
//! held submissions in walking them on every direct pass).
//!
//! Derived state, never serialized: the commands that can move a job in or out of the idle
//! queue mark it ([`QueueIndex::touch`]), and the end of every applied command brings the
//! marked jobs up to date ([`State::sync_queue_index`]); commands that change the
//! configuration rebuild it. `check_invariants` compares it with a fresh computation.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use crate::config::QueueOrdering;
use crate::ids::JobId;
use crate::job::{Job, JobState, Part};
use crate::priority::{OrderKey, PriorityFormula, RuntimeOrder};
use crate::quantity::TimeMs;
use crate::state::State;

/// The idle pending jobs, and their place in the order of consideration where that order is
/// time-independent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueIndex {
    /// Every idle pending job.
    idle: BTreeSet<JobId>,
    /// Whether the order is time-independent; when not, `keys` and `order` are empty and
    /// unused.
    active: bool,
    keys: BTreeMap<JobId, OrderKey>,
    order: BTreeSet<Ordered>,
    /// Jobs a command changed that may have entered or left the idle queue or changed key,
    /// or, holding resources, changed what [`crate::returns`] reads (state, start, limit,
    /// suspension, shares): the change feed of both indexes.
    pub(crate) touched: Vec<JobId>,
    /// The changes one sync derives before it applies them, empty between syncs: kept, like
    /// `touched`, for its room (each was allocated again by every command).
    pending_changes: Vec<(JobId, bool, Option<OrderKey>, bool)>,
}

/// An [`OrderKey`] ordered so that the job to consider first is the smallest.
#[derive(Debug, Clone, Copy)]
struct Ordered(OrderKey);

impl PartialEq for Ordered {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ordered {}

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.consider_before(&other.0)
    }
}

/// The idle queue's ids in order of consideration ([`QueueIndex::in_order`]): a type a
/// pass can name, so its walk is not a boxed iterator called through a pointer for each job.
#[derive(Debug, Clone)]
pub(crate) struct InOrder<'a>(std::collections::btree_set::Iter<'a, Ordered>);

impl Iterator for InOrder<'_> {
    type Item = JobId;

    fn next(&mut self) -> Option<JobId> {
        self.0.next().map(|k| k.0.id)
    }
}

impl QueueIndex {
    /// Marks a job whose state, part or key a command may have changed, or, for a job
    /// holding resources, its start, limit, suspension or shares ([`crate::returns`]).
    pub(crate) fn touch(&mut self, id: JobId) {
        self.touched.push(id);
    }

    /// Every idle pending job, in id order.
    pub(crate) fn idle(&self) -> impl Iterator<Item = JobId> + '_ {
        self.idle.iter().copied()
    }

    /// The idle queue in order of consideration, when the order is time-independent.
    pub(crate) fn in_order(&self) -> Option<InOrder<'_>> {
        self.active.then(|| InOrder(self.order.iter()))
    }

    /// How many jobs wait in the idle queue.
    pub(crate) fn idle_len(&self) -> usize {
        self.idle.len()
    }

    /// Whether no job waits in the idle queue (meaningful only where the index is kept).
    pub(crate) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    fn remove(&mut self, id: JobId) {
        if let Some(key) = self.keys.remove(&id) {
            self.order.remove(&Ordered(key));
        }
    }

    fn insert(&mut self, key: OrderKey) {
        if self.keys.get(&key.id) == Some(&key) {
            return;
        }
        self.remove(key.id);
        self.keys.insert(key.id, key);
        self.order.insert(Ordered(key));
    }
}

/// Whether a job belongs in the idle queue.
fn is_idle(job: &Job) -> bool {
    job.state == JobState::Pending && job.part == Part::Idle
}

impl State {
    /// Whether the order of consideration is a function of the jobs and the configuration
    /// alone (see the module docs).
    pub(crate) fn order_is_timeless(&self) -> bool {
        let formula_timeless = matches!(
            self.config.priority.formula,
            PriorityFormula::Fcfs
                | PriorityFormula::Runtime(RuntimeOrder::ShortestFirst | RuntimeOrder::F1)
        );
        formula_timeless
            && self.config.sched.starvation_wait.is_none()
            && self.config.queue_ordering == QueueOrdering::Priority
    }

    /// A job's key in the index (with the one field that moves with time, which only
    /// starving jobs read, cleared).
    fn timeless_key(inputs: &crate::priority::PriorityInputs<'_>, job: &Job) -> OrderKey {
        let mut key = OrderKey::new(inputs, job, job.spec.reservation.is_some());
        key.eligible_s = 0;
        key
    }

    /// The index as it should be now, computed from every job.
    pub(crate) fn compute_queue_index(&self) -> QueueIndex {
        let mut index = QueueIndex {
            active: self.order_is_timeless(),
            ..QueueIndex::default()
        };
        let inputs = index.active.then(|| self.priority_inputs(self.applied.now));
        for job in self.jobs.values().filter(|j| is_idle(j)) {
            index.idle.insert(job.id);
            if let Some(inputs) = &inputs {
                index.insert(State::timeless_key(inputs, job));
            }
        }
        index
    }

    /// Brings the jobs marked since the last call up to date.
    pub(crate) fn sync_queue_index(&mut self, now: TimeMs) {
        if self.queue_index.touched.is_empty() {
            return;
        }
        let mut touched = std::mem::take(&mut self.queue_index.touched);
        let mut changes = std::mem::take(&mut self.queue_index.pending_changes);
        touched.sort_unstable();
        touched.dedup();
        // Derived only when a marked job is idle and needs a key: the jobs a start or an end
        // marks have left the idle queue.
        let active = self.queue_index.active;
        let inputs = std::cell::OnceCell::new();
        for &id in &touched {
            let job = self.jobs.get(&id);
            // A command that changed a job's begin time, reservation or dependency marks it
            // too: the tick's index of clocked jobs learns it here.
            let clocked = job.is_some_and(crate::policy::placed_by_clock);
            let idle = job.filter(|j| is_idle(j));
            let key = idle
                .filter(|_| active)
                .map(|j| State::timeless_key(inputs.get_or_init(|| self.priority_inputs(now)), j));
            changes.push((id, idle.is_some(), key, clocked));
        }
        let index = &mut self.queue_index;
        for (id, idle, key, clocked) in changes.drain(..) {
            if clocked {
                self.clocked.insert(id);
            } else {
                self.clocked.remove(&id);
            }
            if idle {
                index.idle.insert(id);
            } else {
                index.idle.remove(&id);
            }
            match key {
                Some(key) => index.insert(key),
                None => index.remove(id),
            }
        }
        touched.clear();
        index.touched = touched;
        index.pending_changes = changes;
    }
}
