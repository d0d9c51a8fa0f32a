//! The main and direct passes: jobs in order of consideration, started where they fit now.
//!
//! A partition stops at the first job (in order) that cannot start for lack of resources:
//! later jobs there may not overtake it, which is what keeps the main pass from starving a
//! large job (backfill may still start them where that delays nobody). Jobs held back by a
//! limit on what their owner runs do not stop their partition, as in Slurm. The limits count
//! the starts this pass has already decided, so a plan never exceeds them.

use crate::job::{JobState, Part, Reason};
use std::collections::BinaryHeap;

use crate::ids::JobId;
use crate::plan::pass::{Outcome, Pass};
use crate::plan::{Budget, Continuation, Plan};
use crate::priority::FirstFirst;
use crate::quantity::TimeMs;
use crate::state::State;

impl State {
    /// The main pass (`partition_job_depth`, stops a partition at its first blocked job).
    /// Pass the continuation of a pass the budget stopped to resume it.
    pub fn main_pass(
        &self,
        now: TimeMs,
        budget: &mut dyn Budget,
        resume: Option<Continuation>,
    ) -> Plan {
        self.run_main(now, budget, resume, None)
    }

    /// The direct pass run on submission: the main pass over at most
    /// `default_queue_depth` jobs (0 = all). Nothing at all when nothing could start or
    /// resume (see [`State::may_start_anything`]).
    pub fn direct_pass(&self, now: TimeMs, budget: &mut dyn Budget) -> Plan {
        if !self.may_start_anything() {
            return Plan::default();
        }
        let depth = self.config.sched.default_queue_depth;
        self.run_main(now, budget, None, (depth > 0).then_some(u64::from(depth)))
    }

    fn run_main(
        &self,
        now: TimeMs,
        budget: &mut dyn Budget,
        resume: Option<Continuation>,
        total: Option<u64>,
    ) -> Plan {
        // A fresh pass takes jobs from a heap: it usually stops long before the end (every
        // partition blocked), so most of the queue is never sorted.
        let mut order = match resume {
            Some(mut c) => {
                let rest = std::mem::take(&mut c.rest);
                (Order::Listed(rest.into_iter()), c)
            }
            None => {
                let fresh = match self.queue_index.in_order() {
                    Some(_) if self.queue_index.is_empty() => Order::Listed(Vec::new().into_iter()),
                    Some(kept) => Order::Kept(Box::new(kept)),
                    None => Order::Heap(
                        self.consideration_keys(now)
                            .into_iter()
                            .map(FirstFirst)
                            .collect(),
                    ),
                };
                (fresh, Continuation::default())
            }
        };
        let resumes = self.resumable();
        if resumes.is_empty() && order.0.is_empty() {
            // Nothing to start or resume: no profile to build.
            return Plan::default();
        }
        let cont = &mut order.1;
        let order = &mut order.0;
        // Only starts now: the pool needs no profile of later returns.
        let mut pass = Pass::new(self, now, crate::plan::pool::Horizon::Now);
        pass.plan.resumes = resumes;
        let per_partition = self.config.sched.partition_job_depth;
        let finished = |c: &Continuation| {
            self.partitions.keys().all(|p| {
                c.blocked.contains(p)
                    || per_partition > 0 && c.depth.get(p).is_some_and(|d| *d >= per_partition)
            })
        };
        while let Some(id) = order.next() {
            if total.is_some_and(|t| cont.considered >= t) || finished(cont) {
                break;
            }
            if budget.exhausted() {
                let mut rest = vec![id];
                rest.extend(order.drain());
                cont.rest = rest;
                pass.plan.continuation = Some(std::mem::take(cont));
                return pass.plan;
            }
            let Some(job) = self.waiting(id) else {
                continue;
            };
            let partition = &job.resolved.partition;
            if cont.blocked.contains(partition) {
                pass.note_reason(job, Reason::Priority);
                continue;
            }
            let depth = cont.depth.entry(partition.clone()).or_default();
            if per_partition > 0 && *depth >= per_partition {
                continue;
            }
            *depth += 1;
            cont.considered += 1;
            if pass.try_start(job) == Outcome::NoResources {
                pass.note_reason(job, Reason::Resources);
                cont.blocked.insert(partition.clone());
            }
        }
        pass.plan
    }

    /// Whether any job could start or resume now. Not when every node that accepts jobs has
    /// all its cpus held (every job wants at least one cpu on each of its nodes) or is held
    /// exclusively, no job is suspended on any node (none could resume), and the
    /// configuration preempts nothing (no job could make room).
    ///
    /// A storm of submissions on a full machine runs a direct pass every few submissions;
    /// under multifactor priority each one keyed the whole idle queue to start nothing
    /// (`perf`: 11% of the leader's cpu with 60,000 jobs queued on 12,800 busy cpus). This
    /// asks the nodes instead, without a job lookup: a node holding at least as many shares
    /// as it has cpus is full without adding them up. The timed main pass still runs in
    /// full: it keeps the queue's pending reasons up to date.
    pub fn may_start_anything(&self) -> bool {
        if self.preemption_configured() || !self.suspended_shares.is_empty() {
            return true;
        }
        self.nodes.values().any(|node| {
            let cpus = u64::from(node.spec.cpus);
            // Every share holds at least one cpu.
            if !node.accepts_jobs() || (!node.jobs.is_empty() && node.jobs.len() as u64 >= cpus) {
                return false;
            }
            let (held, exclusive) = node.jobs.values().fold((0u64, false), |(held, ex), u| {
                (held + u64::from(u.cpus), ex || u.exclusive)
            });
            !exclusive && (node.jobs.is_empty() || held < cpus)
        })
    }

    /// HPC2N's rule for the soft MAXPS limit: lifted only when no job is eligible otherwise.
    pub(crate) fn nothing_else_eligible(&self) -> bool {
        !self
            .queue_index
            .idle()
            .filter_map(|id| self.jobs.get(&id))
            .any(|j| j.state == JobState::Pending && j.part == Part::Idle && j.reason.is_eligible())
    }
}

/// The jobs a pass still has to consider, first first.
enum Order<'a> {
    /// A resumed pass: the rest of the order computed when it began.
    Listed(std::vec::IntoIter<JobId>),
    /// A fresh pass where the order does not change with time: walked from the index the
    /// state keeps (see `queue_index`).
    Kept(Box<dyn Iterator<Item = JobId> + 'a>),
    /// A fresh pass: keys in a heap.
    Heap(BinaryHeap<FirstFirst>),
}

impl Order<'_> {
    /// Whether nothing is left, where that is known without walking (a kept order is
    /// never empty: an empty one is listed).
    fn is_empty(&self) -> bool {
        match self {
            Order::Listed(it) => it.len() == 0,
            Order::Kept(_) => false,
            Order::Heap(h) => h.is_empty(),
        }
    }

    fn next(&mut self) -> Option<JobId> {
        match self {
            Order::Listed(it) => it.next(),
            Order::Kept(it) => it.next(),
            Order::Heap(h) => h.pop().map(|k| k.0.id),
        }
    }

    /// The rest, in order.
    fn drain(&mut self) -> Vec<JobId> {
        match self {
            Order::Listed(it) => it.collect(),
            Order::Kept(it) => it.collect(),
            Order::Heap(h) => {
                let mut rest: Vec<JobId> = std::mem::take(h)
                    .into_sorted_vec()
                    .into_iter()
                    .map(|k| k.0.id)
                    .collect();
                rest.reverse();
                rest
            }
        }
    }
}
