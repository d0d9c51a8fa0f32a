//! The planner's side of preemption: when a job finds no room, look for running jobs it may
//! preempt (see `crate::preempt`) whose cpus would make room, best victims first; and, at
//! the start of a main pass, resume preempted jobs whose cpus are free again.

use std::collections::{BTreeMap, BTreeSet};

use crate::command::{PreemptDecision, StartDecision};
use crate::ids::{JobId, NodeName};
use crate::job::{Job, JobRef, JobState};
use crate::partition::PreemptMode;
use crate::plan::pass::Pass;
use crate::state::State;

impl State {
    /// Suspended-by-preemption jobs that can resume now, oldest suspension first, without
    /// two of them counting on the same free cpus.
    ///
    /// The suspended jobs are found in the index of suspended shares (a suspended job's are
    /// marked on every node it holds, an invariant checked after every command), not by
    /// looking up every job that holds nodes: every main pass asks, and with 12,800 jobs
    /// running those lookups were 2.5% of a leader's cpu under a storm of submissions.
    pub(crate) fn resumable(&self) -> Vec<JobId> {
        let mut waiting: Vec<&Job> = self
            .suspended_shares
            .iter()
            .filter(|id| self.holding.contains(id))
            .filter_map(|id| self.jobs.get(id))
            .filter(|j| j.state == JobState::Suspended)
            .filter(|j| j.preempted.is_some_and(|p| p.mode == PreemptMode::Suspend))
            .collect();
        waiting.sort_by_key(|j| (j.suspended_since, j.id));
        let mut promised: BTreeMap<&NodeName, u64> = BTreeMap::new();
        let mut out = Vec::new();
        for j in waiting {
            let Some(alloc) = &j.alloc else {
                continue;
            };
            let fits = alloc.shares.iter().all(|s| {
                self.nodes.get(&s.node).is_some_and(|n| {
                    u64::from(n.used_cpus())
                        + promised.get(&s.node).copied().unwrap_or(0)
                        + u64::from(s.cpus)
                        <= u64::from(n.spec.cpus)
                })
            });
            if fits {
                for s in &alloc.shares {
                    *promised.entry(&s.node).or_default() += u64::from(s.cpus);
                }
                out.push(j.id);
            }
        }
        out
    }
}

impl Pass<'_> {
    /// Tries to make room for `job` (not an array) by preempting running jobs. On success the
    /// decision is recorded and the nodes are closed for the rest of the pass.
    pub(crate) fn try_preempt(&mut self, job: &Job, taken: &mut BTreeSet<JobId>) -> bool {
        let state = self.state;
        let now = self.now;
        let Some(partition) = state.partitions.get(&job.resolved.partition) else {
            return false;
        };
        // Most jobs may preempt nobody: say so without looking at any node.
        if !may_preempt_anyone(state, job, partition) {
            return false;
        }
        // Per node, in name order: what could be freed, best victims first. Nodes are
        // taken by their places in the pool: finding each by name was most of a replay on
        // a site of 1,492 nodes that preempts.
        let Some(members) = self.pool.members(&partition.name) else {
            return false;
        };
        let mut options: Vec<(usize, i64, Vec<JobId>, &NodeName)> = Vec::new();
        for &i in members {
            let position = options.len().min(job.spec.nodes as usize - 1);
            if let Some((count, spare, chosen)) = self.victims_on(i, job, position, taken) {
                options.push((count, spare, chosen, &self.pool.node(i).spec.name));
            }
        }
        let wanted = job.spec.nodes as usize;
        if options.len() < wanted {
            return false;
        }
        // The fewest victims, then the tightest fit.
        options.sort_by(|a, b| (a.0, a.1, a.3).cmp(&(b.0, b.1, b.3)));
        options.truncate(wanted);
        let nodes: Vec<NodeName> = options.iter().map(|o| o.3.clone()).collect();
        let victims: Vec<JobId> = options.iter().flat_map(|o| o.2.iter().copied()).collect();
        if victims.is_empty() {
            return false;
        }
        for n in &nodes {
            self.pool.close(n);
        }
        taken.extend(victims.iter().copied());
        self.running.add_job(job, &state.accounts, now);
        self.plan.preemptions.push(PreemptDecision {
            start: StartDecision {
                job: JobRef {
                    job: job.id,
                    task: None,
                },
                nodes,
            },
            victims,
        });
        true
    }
}

impl Pass<'_> {
    /// What preempting on the node at place `i` could free for `job` (as its `position`th
    /// node): how many victims, the cpus to spare once it fits, and the victims, best first;
    /// none when the node cannot take it even so.
    fn victims_on(
        &self,
        i: usize,
        job: &Job,
        position: usize,
        taken: &BTreeSet<JobId>,
    ) -> Option<(usize, i64, Vec<JobId>)> {
        let (state, now) = (self.state, self.now);
        let node = self.pool.node(i);
        if !self.pool.admits(job, i, now) {
            return None;
        }
        let mut free = self.pool.free_now(i)?;
        let want = crate::request::node_use(job, position, &node.spec)?;
        let mut victims: Vec<(f64, &Job, PreemptMode)> = node
            .jobs
            .iter()
            .filter(|(_, u)| !u.suspended && !u.exclusive)
            .filter(|(id, _)| !taken.contains(*id))
            .filter_map(|(id, _)| state.jobs.get(id))
            .filter_map(|v| {
                state
                    .preempt_mode(job, v, now)
                    .map(|m| (state.suspension_score(job, v, now), v, m))
            })
            .collect();
        if victims.is_empty() {
            return None;
        }
        victims.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
        let mut chosen = Vec::new();
        for (_, v, mode) in victims {
            if free.covers(&want) {
                break;
            }
            let Some(u) = node.jobs.get(&v.id).copied() else {
                continue;
            };
            // A suspended victim keeps its memory, jobfs and GPUs; a killed one gives them
            // back.
            free.give_back(&u, mode != PreemptMode::Suspend);
            chosen.push(v.id);
        }
        free.covers(&want)
            .then(|| (chosen.len(), free.cpus - i64::from(want.cpus), chosen))
    }
}

impl State {
    /// Whether the configuration lets any job preempt another: a QOS that preempts, a
    /// partition with a preemption mode, or parallel runs that suspend. A superset of what
    /// [`may_preempt_anyone`] asks of one job.
    pub(crate) fn preemption_configured(&self) -> bool {
        self.qos.values().any(|q| !q.preempt.is_empty())
            || self
                .partitions
                .values()
                .any(|p| p.preempt_mode != PreemptMode::Off)
            || self.config.preempt.parallel_run.is_some()
    }
}

/// Whether `job` may preempt anyone at all: its QOS preempts others, a lower partition
/// tier preempts, or parallel runs suspend in its partition.
fn may_preempt_anyone(
    state: &crate::state::State,
    job: &Job,
    partition: &crate::partition::Partition,
) -> bool {
    let by_qos = state
        .qos
        .get(&job.resolved.qos)
        .is_some_and(|q| !q.preempt.is_empty());
    let by_tier = state
        .partitions
        .values()
        .any(|p| p.priority_tier < partition.priority_tier && p.preempt_mode != PreemptMode::Off);
    let parallel = state.config.preempt.parallel_run.is_some()
        && partition.preempt_mode == PreemptMode::Suspend;
    by_qos || by_tier || parallel
}
