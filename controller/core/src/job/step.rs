//! Job steps: sets of tasks run inside a running job's allocation.
//!
//! A job is an allocation; a step is what runs in it. The batch script is the step Slurm calls
//! `batch` (it is the job's own run and is not recorded here); every `srun` inside the job
//! creates step 0, 1, ... whose tasks the agents of the allocation's nodes start. Steps are
//! replicated like jobs, so a failover of the controllers loses none, and a step's record
//! stays with its job into accounting (`sacct` lists `JOBID.0`).
//!
//! Cpus, as in Slurm since 21.08: a step holds the cpus its tasks use (`tasks x
//! cpus_per_task` on each node) for itself unless it asks to `--overlap`; a step that does
//! not fit beside the running ones waits (or, with `--immediate`, fails) and is never placed
//! on cpus another step holds. The batch step holds none. Memory, jobfs and GPUs are the
//! job's and shared by all its steps (the job's cgroup bounds them).
//!
//! Placement is Slurm's default block distribution ([`place`]): nodes in the allocation's
//! order (the ones `--nodelist` names first), each chosen node given one task, then the rest
//! filled node by node up to the cpus free on each, or exactly `--ntasks-per-node` each.
//! A request that could never fit in the allocation is refused at once; one that could fit
//! once running steps end is [`Placement::Busy`].

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::command::EndCause;
use crate::ids::{JobId, NodeName};
use crate::job::{Allocation, ExitStatus, JobState};
use crate::quantity::{Seconds, TimeMs};

/// Slurm's `MaxStepCount` default: steps one job may create over its life.
pub const MAX_STEPS_PER_JOB: u32 = 40_000;
/// Steps of one job running at the same time (each costs the agents a cgroup and processes).
pub const MAX_RUNNING_STEPS: usize = 256;
/// Bytes of the hash of a step's I/O secret (SHA-256).
pub const IO_KEY_BYTES: usize = 32;
/// The longest step name (`srun -J`).
pub const MAX_STEP_NAME_BYTES: usize = 256;
/// The longest time limit a step may ask (`-t`): a year, as a job's own limits go.
pub const MAX_STEP_TIME_LIMIT: crate::quantity::Seconds = crate::quantity::Seconds(365 * 24 * 3600);

/// A step's number within its job: 0, 1, ... in creation order, never reused.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct StepId(pub u32);

impl fmt::Display for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A step named the way users name it: `JOBID.STEP`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StepRef {
    pub job: JobId,
    pub step: StepId,
}

impl fmt::Display for StepRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.job, self.step)
    }
}

/// Why a `JOBID.STEP` did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("step {0:?} is not JOBID.STEP (two numbers joined by a dot, e.g. 1234.0)")]
pub struct StepRefError(pub String);

impl FromStr for StepRef {
    type Err = StepRefError;

    fn from_str(s: &str) -> Result<StepRef, StepRefError> {
        let bad = || StepRefError(s.to_owned());
        let (job, step) = s.split_once('.').ok_or_else(bad)?;
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(job) || !digits(step) {
            return Err(bad());
        }
        Ok(StepRef {
            job: JobId(job.parse().map_err(|_| bad())?),
            step: StepId(step.parse().map_err(|_| bad())?),
        })
    }
}

/// What `srun` asks for, as it reaches the core (the CLI has applied its defaults and the
/// environment of the allocation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepSpec {
    /// `-J`; the command's name when not given.
    pub name: String,
    /// `-n`; when absent, one per node (or `ntasks_per_node` per node).
    pub ntasks: Option<u32>,
    /// `-N`; when absent, the nodes `--nodelist` names, or as few as the tasks need.
    pub nodes: Option<u32>,
    /// `--ntasks-per-node`.
    pub ntasks_per_node: Option<u32>,
    /// `-c`, at least 1.
    pub cpus_per_task: u32,
    /// `-w`: nodes of the allocation the step must use.
    pub nodelist: Vec<NodeName>,
    /// `--overlap`: share cpus with other steps instead of holding them.
    pub overlap: bool,
    /// `-t`; `None` runs until the job ends.
    pub time_limit: Option<Seconds>,
    /// SHA-256 of the secret `srun` holds: the agents let only its holder attach to the
    /// step's I/O. The secret itself never reaches the log.
    pub io_key: Vec<u8>,
}

/// What one node runs of a step: tasks `first_task .. first_task + tasks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepShare {
    pub node: NodeName,
    pub tasks: u32,
    pub first_task: u32,
    /// Cpus the step's tasks use here (`tasks x cpus_per_task`), held unless it overlaps.
    pub cpus: u32,
}

/// How a step's tasks ended on one node, as that node's agent reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEnd {
    pub cause: EndCause,
    /// The highest exit code of the node's tasks, the first signal, summed cpu time and the
    /// peak memory.
    pub exit: ExitStatus,
}

/// One step in the replicated state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub id: StepId,
    pub name: String,
    pub layout: Vec<StepShare>,
    pub cpus_per_task: u32,
    pub overlap: bool,
    pub time_limit: Option<Seconds>,
    pub io_key: Vec<u8>,
    /// `Running`, `Completing` once cancelled, then a terminal state.
    pub state: JobState,
    pub start_time: TimeMs,
    pub end_time: Option<TimeMs>,
    /// `scancel JOBID.STEP` (or srun's own interrupt) asked it to stop.
    pub cancelled: bool,
    /// Nodes that have reported their tasks' end.
    pub ends: BTreeMap<NodeName, NodeEnd>,
    pub exit: Option<ExitStatus>,
}

impl Step {
    pub fn ntasks(&self) -> u32 {
        self.layout.iter().map(|s| s.tasks).sum()
    }

    pub fn is_live(&self) -> bool {
        !self.state.is_terminal()
    }

    pub fn on_node(&self, node: &NodeName) -> Option<&StepShare> {
        self.layout.iter().find(|s| &s.node == node)
    }

    /// The cpus the step holds on `node` (none when it overlaps or has ended).
    pub fn held_cpus(&self, node: &NodeName) -> u32 {
        if self.overlap || !self.is_live() {
            return 0;
        }
        self.on_node(node).map_or(0, |s| s.cpus)
    }

    /// The step's final state and status from every node's report: cancelled wins, then
    /// the worst cause, then the highest exit code (Slurm reports a step's highest).
    pub fn conclusion(&self) -> (JobState, ExitStatus) {
        let mut exit = ExitStatus::default();
        for end in self.ends.values() {
            exit.code = exit.code.max(end.exit.code);
            if exit.signal == 0 {
                exit.signal = end.exit.signal;
            }
            exit.cpu_time_ms = exit.cpu_time_ms.saturating_add(end.exit.cpu_time_ms);
            exit.max_rss_mib = exit.max_rss_mib.max(end.exit.max_rss_mib);
        }
        let has = |c: EndCause| self.ends.values().any(|e| e.cause == c);
        let state = if self.cancelled || has(EndCause::Cancelled) {
            JobState::Cancelled
        } else if has(EndCause::NodeFail) {
            JobState::NodeFail
        } else if has(EndCause::OutOfMemory) {
            JobState::OutOfMemory
        } else if has(EndCause::Timeout) {
            JobState::Timeout
        } else if exit.code != 0
            || exit.signal != 0
            || has(EndCause::LaunchFailed)
            || has(EndCause::JobfsExceeded)
        {
            JobState::Failed
        } else {
            JobState::Completed
        };
        (state, exit)
    }
}

/// A job's steps: every one it created, live and ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Steps {
    /// The id the next step gets.
    pub next: u32,
    pub list: BTreeMap<StepId, Step>,
}

impl Steps {
    pub fn live(&self) -> impl Iterator<Item = &Step> {
        self.list.values().filter(|s| s.is_live())
    }

    /// Cpus held by live steps on `node`.
    pub fn held_cpus(&self, node: &NodeName) -> u32 {
        self.live()
            .map(|s| s.held_cpus(node))
            .fold(0, u32::saturating_add)
    }
}

/// Where a step's tasks go, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Placed(Vec<StepShare>),
    /// It fits in the allocation, but not beside the steps running now: wait and retry.
    Busy(String),
    /// It can never fit in this allocation; the message names the field and the limit.
    Never {
        field: &'static str,
        why: String,
    },
}

fn never(field: &'static str, why: String) -> Placement {
    Placement::Never { field, why }
}

/// Places a step in `alloc` beside the cpus `held` by running steps (per node).
pub fn place(alloc: &Allocation, held: &dyn Fn(&NodeName) -> u32, spec: &StepSpec) -> Placement {
    let cpt = spec.cpus_per_task.max(1);
    for n in &spec.nodelist {
        if !alloc.shares.iter().any(|s| &s.node == n) {
            return never(
                "nodelist",
                format!(
                    "node {n} is not in the job's allocation ({})",
                    node_names(alloc)
                ),
            );
        }
    }
    // Candidates: the named nodes first, then the rest, each in the allocation's order.
    let named = |s: &&crate::job::NodeShare| spec.nodelist.contains(&s.node);
    let candidates: Vec<&crate::job::NodeShare> = alloc
        .shares
        .iter()
        .filter(named)
        .chain(alloc.shares.iter().filter(|s| !named(s)))
        .collect();
    let required = spec.nodelist.len();
    let ntasks_hint = spec.ntasks;
    let mut nodes = match (spec.nodes, spec.ntasks_per_node, ntasks_hint) {
        (Some(n), _, _) => Some(n),
        (None, _, _) if required > 0 => Some(required as u32),
        (None, Some(per), Some(t)) if per > 0 => Some(t.div_ceil(per)),
        (None, _, Some(_)) => None,
        (None, _, None) => Some(candidates.len() as u32),
    };
    if let Some(n) = nodes {
        if n == 0 {
            return never("nodes", "a step needs at least 1 node".into());
        }
        if n as usize > candidates.len() {
            return never(
                "nodes",
                format!(
                    "{n} exceeds the {} nodes of the job's allocation",
                    candidates.len()
                ),
            );
        }
        if (n as usize) < required {
            return never(
                "nodes",
                format!("{n} is fewer than the {required} nodes --nodelist names"),
            );
        }
    }
    let ntasks = match (spec.ntasks, spec.ntasks_per_node, nodes) {
        (Some(t), _, _) => t,
        (None, Some(per), Some(n)) => per.saturating_mul(n),
        (None, _, Some(n)) => n,
        (None, _, None) => 1,
    };
    if ntasks == 0 {
        return never("ntasks", "a step needs at least 1 task".into());
    }
    // Slurm: "can't run N processes on M nodes, setting nnodes to N".
    if let Some(n) = nodes
        && n > ntasks
    {
        if (ntasks as usize) < required {
            return never(
                "ntasks",
                format!("{ntasks} is fewer than the {required} nodes --nodelist names"),
            );
        }
        nodes = Some(ntasks);
    }
    let total = |s: &crate::job::NodeShare| s.cpus / cpt;
    let free = |s: &crate::job::NodeShare| {
        let taken = if spec.overlap { 0 } else { held(&s.node) };
        s.cpus.saturating_sub(taken) / cpt
    };
    match spec.ntasks_per_node {
        Some(per) if per > 0 => {
            place_per_node(&candidates, required, ntasks, per, cpt, total, free)
        }
        Some(_) => never("ntasks_per_node", "must be at least 1".into()),
        None => place_block(&candidates, required, ntasks, nodes, cpt, total, free),
    }
}

/// Exactly `per` tasks on each chosen node (the last may take fewer).
fn place_per_node(
    candidates: &[&crate::job::NodeShare],
    required: usize,
    ntasks: u32,
    per: u32,
    cpt: u32,
    total: impl Fn(&crate::job::NodeShare) -> u32,
    free: impl Fn(&crate::job::NodeShare) -> u32,
) -> Placement {
    let want_nodes = ntasks.div_ceil(per) as usize;
    if want_nodes > candidates.len() {
        return never(
            "ntasks",
            format!(
                "{ntasks} tasks at {per} per node need {want_nodes} nodes; the allocation has {}",
                candidates.len()
            ),
        );
    }
    let fitting = candidates.iter().filter(|s| total(s) >= per).count();
    if fitting < want_nodes || candidates[..required].iter().any(|s| total(s) < per) {
        return never(
            "ntasks_per_node",
            format!("{per} tasks of {cpt} cpus do not fit on enough nodes of the allocation"),
        );
    }
    let mut chosen = Vec::new();
    for (k, s) in candidates.iter().enumerate() {
        if chosen.len() == want_nodes {
            break;
        }
        if free(s) >= per {
            chosen.push(*s);
        } else if k < required {
            return Placement::Busy(format!("node {} has its cpus held by other steps", s.node));
        }
    }
    if chosen.len() < want_nodes {
        return Placement::Busy("requested nodes are busy".into());
    }
    let mut left = ntasks;
    let counts: Vec<u32> = chosen
        .iter()
        .map(|_| {
            let t = per.min(left);
            left -= t;
            t
        })
        .collect();
    Placement::Placed(layout(&chosen, &counts, cpt))
}

/// Slurm's block distribution: one task on each chosen node, the rest filling nodes in order.
fn place_block(
    candidates: &[&crate::job::NodeShare],
    required: usize,
    ntasks: u32,
    nodes: Option<u32>,
    cpt: u32,
    total: impl Fn(&crate::job::NodeShare) -> u32,
    free: impl Fn(&crate::job::NodeShare) -> u32,
) -> Placement {
    // Could it ever fit? On the best nodes allowed (all of them when the count is open).
    let mut capacities: Vec<u32> = candidates[required..].iter().map(|s| total(s)).collect();
    capacities.sort_unstable_by(|a, b| b.cmp(a));
    let others = nodes.map_or(capacities.len(), |n| n as usize - required);
    let most: u64 = candidates[..required]
        .iter()
        .map(|s| u64::from(total(s)))
        .chain(capacities.iter().take(others).map(|&c| u64::from(c)))
        .sum();
    if u64::from(ntasks) > most || candidates[..required].iter().any(|s| total(s) == 0) {
        return never(
            "ntasks",
            format!(
                "{ntasks} tasks of {cpt} cpus need more cpus than the allocation's nodes give \
                 the step (room for {most})"
            ),
        );
    }
    let mut chosen = Vec::new();
    let mut room = 0u64;
    for (k, s) in candidates.iter().enumerate() {
        let enough = match nodes {
            Some(n) => chosen.len() == n as usize,
            None => chosen.len() >= required && room >= u64::from(ntasks),
        };
        if enough {
            break;
        }
        let f = free(s);
        if f >= 1 {
            chosen.push(*s);
            room += u64::from(f);
        } else if k < required {
            return Placement::Busy(format!("node {} has its cpus held by other steps", s.node));
        }
    }
    let enough_nodes = nodes.is_none_or(|n| chosen.len() == n as usize);
    if !enough_nodes || room < u64::from(ntasks) || chosen.len() as u64 > u64::from(ntasks) {
        return Placement::Busy("requested nodes are busy".into());
    }
    let mut counts = vec![1u32; chosen.len()];
    let mut left = ntasks - chosen.len() as u32;
    for (k, s) in chosen.iter().enumerate() {
        let more = (free(s) - 1).min(left);
        counts[k] += more;
        left -= more;
    }
    Placement::Placed(layout(&chosen, &counts, cpt))
}

fn layout(chosen: &[&crate::job::NodeShare], counts: &[u32], cpt: u32) -> Vec<StepShare> {
    let mut first = 0u32;
    chosen
        .iter()
        .zip(counts)
        .map(|(s, &tasks)| {
            let share = StepShare {
                node: s.node.clone(),
                tasks,
                first_task: first,
                cpus: tasks * cpt,
            };
            first += tasks;
            share
        })
        .collect()
}

fn node_names(alloc: &Allocation) -> String {
    alloc
        .shares
        .iter()
        .map(|s| s.node.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests;
