//! The resources free right now, node by node, and best-fit placement on them.
//!
//! Built once per pass from the state; every start the pass decides takes its share out, so
//! later jobs in the same pass see what is left. Placement mirrors what apply checks
//! ([`crate::request::node_use`], partition membership, admin state, features, exclusions,
//! required nodes), so a plan made on an unchanged state is always accepted.
//!
//! Best fit: each of the job's node shares, largest first, goes to the usable node that
//! would have the fewest cpus left (then the least memory, then name order). Whole nodes
//! stay whole for the jobs that need them.

use std::collections::BTreeMap;

use crate::ids::{NodeName, PartitionName};
use crate::job::Job;
use crate::node::{Node, NodeUse};
use crate::quantity::MiB;
use crate::state::State;

/// One node's free resources.
#[derive(Debug, Clone, Copy)]
struct Free {
    cpus: u32,
    memory: MiB,
    jobfs: MiB,
    /// Nothing runs here: an exclusive job may take it.
    empty: bool,
    /// An exclusive job holds it, or it is drained or down: nothing may start here.
    closed: bool,
}

/// Free resources of every node, with each partition's members.
#[derive(Debug)]
pub struct Pool<'a> {
    nodes: Vec<&'a Node>,
    free: Vec<Free>,
    index: BTreeMap<&'a NodeName, usize>,
    members: BTreeMap<&'a PartitionName, Vec<usize>>,
}

impl<'a> Pool<'a> {
    pub fn new(state: &'a State) -> Pool<'a> {
        let nodes: Vec<&Node> = state.nodes.values().collect();
        let free = nodes
            .iter()
            .map(|n| Free {
                cpus: n.spec.cpus.saturating_sub(n.used_cpus()),
                memory: n.spec.memory.saturating_sub(n.used_memory()),
                jobfs: n.spec.jobfs.saturating_sub(n.used_jobfs()),
                empty: n.jobs.is_empty(),
                closed: !n.accepts_jobs() || n.is_exclusively_held(),
            })
            .collect();
        let index: BTreeMap<&NodeName, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (&n.spec.name, i))
            .collect();
        let members = state
            .partitions
            .values()
            .map(|p| {
                let m: Vec<usize> = p
                    .nodes
                    .iter()
                    .filter_map(|n| index.get(n).copied())
                    .collect();
                (&p.name, m)
            })
            .collect();
        Pool {
            nodes,
            free,
            index,
            members,
        }
    }

    /// Free cpus on the partition's usable nodes (for reports and quick checks).
    pub fn free_cpus(&self, partition: &PartitionName) -> u64 {
        self.members.get(partition).map_or(0, |m| {
            m.iter()
                .filter(|&&i| !self.free[i].closed)
                .map(|&i| u64::from(self.free[i].cpus))
                .sum()
        })
    }

    /// Finds nodes for `job` now and takes its shares out of the pool. `None` (and the pool
    /// unchanged) when it does not fit.
    pub fn place(&mut self, job: &Job) -> Option<Vec<NodeName>> {
        let chosen = self.fit(job)?;
        for (position, &i) in chosen.iter().enumerate() {
            if let Some(want) = crate::request::node_use(job, position, &self.nodes[i].spec) {
                let f = &mut self.free[i];
                f.cpus = f.cpus.saturating_sub(want.cpus);
                f.memory = f.memory.saturating_sub(want.memory);
                f.jobfs = f.jobfs.saturating_sub(want.jobfs);
                f.empty = false;
                f.closed |= want.exclusive;
            }
        }
        Some(
            chosen
                .into_iter()
                .map(|i| self.nodes[i].spec.name.clone())
                .collect(),
        )
    }

    /// The nodes `job` would get now, in share order, without taking anything.
    fn fit(&self, job: &Job) -> Option<Vec<usize>> {
        let spec = &job.spec;
        let members = self.members.get(&job.resolved.partition)?;
        let wanted = spec.nodes as usize;
        if wanted == 0 || wanted > members.len() {
            return None;
        }
        let usable = |i: usize| {
            let n = self.nodes[i];
            !self.free[i].closed
                && !spec.exclude.contains(&n.spec.name)
                && spec.features.is_subset(&n.spec.features)
        };
        let fits = |i: usize, want: &NodeUse| {
            let f = &self.free[i];
            (!want.exclusive || f.empty)
                && want.cpus <= f.cpus
                && want.memory <= f.memory
                && want.jobfs <= f.jobfs
        };
        let mut chosen: Vec<usize> = Vec::with_capacity(wanted);
        // Required nodes (`-w`) take the first shares, in name order.
        for name in &spec.nodelist {
            let i = *self.index.get(name)?;
            if !members.contains(&i) || !usable(i) {
                return None;
            }
            let want = crate::request::node_use(job, chosen.len(), &self.nodes[i].spec)?;
            if !fits(i, &want) {
                return None;
            }
            chosen.push(i);
        }
        // The rest by best fit. Shares only shrink with position, so filling positions in
        // order gives the largest shares the first pick.
        while chosen.len() < wanted {
            let position = chosen.len();
            let mut best: Option<(u32, MiB, usize)> = None;
            for &i in members {
                if chosen.contains(&i) || !usable(i) {
                    continue;
                }
                let Some(want) = crate::request::node_use(job, position, &self.nodes[i].spec)
                else {
                    continue;
                };
                if !fits(i, &want) {
                    continue;
                }
                let f = &self.free[i];
                let left = (f.cpus - want.cpus, f.memory.saturating_sub(want.memory), i);
                if best.is_none_or(|b| left < b) {
                    best = Some(left);
                }
            }
            chosen.push(best?.2);
        }
        Some(chosen)
    }
}
