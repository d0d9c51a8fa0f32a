//! When each node's running jobs give their shares back, kept in order (derived).
//!
//! Every backfill pass builds an availability profile ([`crate::plan::Pool`]): for each
//! node, what it has free now and the instants ahead at which its jobs return their shares.
//! Built from the nodes alone, that took a lookup of every job a node holds (to find its
//! state, start and limit) and a sort of their ends, at every pass: an eighth of a
//! 100,000-job EASY replay, and on a large machine thousands of lookups a pass. This index
//! keeps, per node, the shares whose return instant follows from the job alone (a running
//! job's start, time limit and time suspended; a completing job's "as soon as possible"),
//! in order of the instant the job reaches its limit.
//!
//! A job's expected end, as the planners read it ([`crate::job::Job::expected_runtime`]),
//! counts whole seconds run, so it lies within a second after that instant, and in that
//! order a node's returns are already the order of their ends ([`Ends::at`]): a pass copies
//! them as they are, with no sort. A running job with a
//! runtime prediction (EASY++) has an end that moves with the clock; a node holding one is
//! counted here and its profile is built the old way, by looking every job up.
//!
//! Kept only where backfill is on (only backfill builds a profile). Derived state, never
//! serialized: the commands that change a job's state, start, limit or shares mark it in
//! the queue index ([`crate::queue_index::QueueIndex::touch`]), the end of every applied
//! command brings the marked jobs up to date ([`State::sync_returns`]), and commands that
//! change the nodes rebuild it. `check_invariants` compares it with a fresh computation.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::ids::{JobId, NodeName};
use crate::job::{Job, JobState};
use crate::node::NodeUse;
use crate::quantity::{Seconds, TimeMs};
use crate::state::State;

/// Every node's returns that follow from their jobs alone.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Returns {
    /// Kept at all: only backfill builds a profile, so with backfill off the index would
    /// cost every start and end for nothing (a few percent of an FCFS replay); it is then
    /// empty and every node is looked up.
    active: bool,
    /// Every node, with or without jobs: a node's entry is not made and dropped again as
    /// its jobs come and go.
    by_node: BTreeMap<NodeName, NodeReturns>,
    /// Each indexed job: the key of its returns (`None`: its end moves with the clock) and
    /// the nodes it holds, in name order, to take it out again.
    of_job: FxHashMap<JobId, (Option<TimeMs>, Vec<NodeName>)>,
}

/// One node's returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct NodeReturns {
    /// By the instant the job reaches its limit (a completing job: 0), then id.
    pub(crate) fixed: BTreeMap<(TimeMs, JobId), Return>,
    /// What the shares in `fixed` hold between them. When they are every share the node
    /// holds, a pass takes what is free now from this instead of walking the node's jobs
    /// (a quarter of building a pass's pool).
    pub(crate) held: Held,
    /// Jobs held here whose end moves with the clock: while there are any, the node's
    /// profile is built by looking every job up.
    pub(crate) moving: u32,
}

/// Resources held by shares, summed as a pass's pool subtracts them: each amount as an
/// `i64` (clamped, as the pool clamps it), with wrapping arithmetic, so the sum is the
/// pool's own whatever order the shares came and went in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) cpus: i64,
    pub(crate) memory: i64,
    pub(crate) jobfs: i64,
    pub(crate) gpus: i64,
    /// How many shares.
    pub(crate) shares: i32,
    /// How many of them are exclusive.
    pub(crate) exclusive: i32,
}

impl Held {
    /// Counts `share` in (`sign` 1) or out (-1).
    fn count(&mut self, share: &NodeUse, sign: i64) {
        let one = Held::of(share);
        let sign32 = sign as i32;
        self.cpus = self.cpus.wrapping_add(sign.wrapping_mul(one.cpus));
        self.memory = self.memory.wrapping_add(sign.wrapping_mul(one.memory));
        self.jobfs = self.jobfs.wrapping_add(sign.wrapping_mul(one.jobfs));
        self.gpus = self.gpus.wrapping_add(sign.wrapping_mul(one.gpus));
        self.shares = self.shares.wrapping_add(sign32.wrapping_mul(one.shares));
        self.exclusive = self
            .exclusive
            .wrapping_add(sign32.wrapping_mul(one.exclusive));
    }

    /// What one share holds, as a pass's pool counts it: each amount an `i64`, clamped.
    /// The one conversion of a share into the pool's arithmetic: the pool's changes
    /// ([`crate::plan::pool`]) and these sums must agree, or a pass would take the sums
    /// for something other than the walk they stand for.
    #[inline]
    pub(crate) fn of(share: &NodeUse) -> Held {
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Held {
            cpus: i64::from(share.cpus),
            memory: clamp(share.memory.0),
            jobfs: clamp(share.jobfs.0),
            gpus: i64::from(share.gpus),
            shares: 1,
            exclusive: i32::from(share.exclusive),
        }
    }
}

/// One share given back: when, and what.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Return {
    pub(crate) ends: Ends,
    pub(crate) share: NodeUse,
}

/// When a job whose end follows from itself ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ends {
    /// Completing: its agent is ending it now.
    Now,
    /// Running, with no prediction: at its limit, counted in whole seconds run.
    Limit {
        start: TimeMs,
        limit: Seconds,
        suspended: Seconds,
    },
}

/// Whether a job on a node returns its share, and whether its end follows from the job
/// alone ([`crate::plan::pool`]'s `expected_end`, case by case).
#[derive(Clone, Copy)]
enum Kind {
    /// Never, as far as a plan knows: suspended, or without a time limit.
    Never,
    /// At an instant that moves with the clock (a runtime prediction), or in a state the
    /// cases below do not describe.
    Moving,
    Fixed(Ends),
}

impl Ends {
    /// The instant the share comes back, as a pass at `now` expects it: what
    /// `now + (expected run time − time run)` gives for the job (never before `now`).
    ///
    /// Ordered as the keys are ([`Ends::key`]) for any `now` from the state's last applied
    /// instant on, where the planners plan (every start and every second suspended was
    /// recorded at or before it, so a job has been suspended no longer than it has run):
    /// every such instant is `now` plus whole seconds (the time run is counted in whole
    /// seconds), so two of them differ by whole seconds; a job not yet at its limit ends
    /// within a second after its key, which lies after `now`; one at or past it ends at
    /// `now`, and its key is not after `now`. So of two keys, the earlier never ends later
    /// (equal keys end together). Before that instant a job may not have started yet, and
    /// the order does not hold.
    pub(crate) fn at(&self, now: TimeMs) -> TimeMs {
        match *self {
            Ends::Now => now,
            Ends::Limit {
                start,
                limit,
                suspended,
            } => {
                let run = now.since(start).saturating_sub(suspended);
                now.plus(limit.saturating_sub(run))
            }
        }
    }

    /// The instant the job reaches its limit: the index's order.
    fn key(&self) -> TimeMs {
        match *self {
            Ends::Now => TimeMs(0),
            Ends::Limit {
                start,
                limit,
                suspended,
            } => start.plus(limit).plus(suspended),
        }
    }
}

fn kind(job: Option<&Job>) -> Kind {
    let Some(job) = job else {
        return Kind::Never;
    };
    match job.state {
        JobState::Suspended => Kind::Never,
        JobState::Completing => Kind::Fixed(Ends::Now),
        JobState::Running
            if job.predicted.is_none()
                && job.end_time.is_none()
                && job.suspended_since.is_none() =>
        {
            match (job.start_time, job.resolved.time_limit) {
                (_, None) => Kind::Never,
                (Some(start), Some(limit)) => Kind::Fixed(Ends::Limit {
                    start,
                    limit,
                    suspended: job.suspended_total,
                }),
                (None, Some(_)) => Kind::Moving,
            }
        }
        _ => Kind::Moving,
    }
}

impl Returns {
    /// Node `name`'s returns, if it holds any job.
    pub(crate) fn of_node(&self, name: &NodeName) -> Option<&NodeReturns> {
        self.by_node.get(name)
    }

    fn add(&mut self, id: JobId, kind: Kind, node: &NodeName, share: NodeUse) {
        let key = match kind {
            Kind::Never => return,
            Kind::Moving => None,
            Kind::Fixed(ends) => Some(ends.key()),
        };
        let at = match self.by_node.get_mut(node) {
            Some(at) => at,
            None => self.by_node.entry(node.clone()).or_default(),
        };
        match kind {
            Kind::Fixed(ends) => {
                if let Some(old) = at.fixed.insert((ends.key(), id), Return { ends, share }) {
                    at.held.count(&old.share, -1);
                }
                at.held.count(&share, 1);
            }
            _ => at.moving += 1,
        }
        let entry = self.of_job.entry(id).or_insert_with(|| (key, Vec::new()));
        entry.1.push(node.clone());
    }

    fn remove(&mut self, id: JobId) {
        let Some((key, nodes)) = self.of_job.remove(&id) else {
            return;
        };
        for node in nodes {
            let Some(at) = self.by_node.get_mut(&node) else {
                continue;
            };
            match key {
                Some(key) => {
                    if let Some(gone) = at.fixed.remove(&(key, id)) {
                        at.held.count(&gone.share, -1);
                    }
                }
                None => {
                    debug_assert!(at.moving > 0, "job {id} moving on {node} uncounted");
                    at.moving = at.moving.saturating_sub(1);
                }
            }
        }
    }
}

impl State {
    /// The index from scratch: every node's shares, each job looked up.
    pub(crate) fn compute_returns(&self) -> Returns {
        let mut returns = Returns::default();
        if self.config.sched.backfill == crate::config::BackfillMode::Off {
            return returns;
        }
        returns.active = true;
        for (name, node) in &self.nodes {
            returns.by_node.insert(name.clone(), NodeReturns::default());
            for (id, share) in &node.jobs {
                let kind = kind(self.jobs.get(id));
                returns.add(*id, kind, name, *share);
            }
        }
        returns
    }

    /// Brings the jobs marked in the queue index since the last command up to date; called
    /// before [`State::sync_queue_index`] takes the marks.
    pub(crate) fn sync_returns(&mut self) {
        if !self.returns.active {
            return;
        }
        // A job marked twice is taken out and put back twice, to the same end.
        for k in 0..self.queue_index.touched.len() {
            let id = self.queue_index.touched[k];
            self.returns.remove(id);
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            let Some(alloc) = &job.alloc else {
                continue;
            };
            let kind = kind(Some(job));
            for s in &alloc.shares {
                let Some(share) = self.nodes.get(&s.node).and_then(|n| n.jobs.get(&id)) else {
                    continue;
                };
                self.returns.add(id, kind, &s.node, *share);
            }
            // In name order, as a fresh computation lists them.
            if let Some((_, nodes)) = self.returns.of_job.get_mut(&id)
                && nodes.len() > 1
            {
                nodes.sort_unstable();
            }
        }
    }
}
