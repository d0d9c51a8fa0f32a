//! What a job needs from each of its nodes.
//!
//! One definition, used by apply (to check and record a start) and by the planners (to find
//! nodes): if they disagreed, every plan would be refused. Tasks spread evenly over the job's
//! nodes, the first `ntasks % nodes` nodes taking one more (Slurm's block distribution);
//! an exclusive job takes whole nodes (all their cpus and GPUs); memory is per node, per
//! cpu, or the whole node; GPUs are per node.

use crate::job::{Job, MemoryRequest};
use crate::node::{NodeSpec, NodeUse};

/// The end (exclusive) of the run of positions, from `position` on, whose shares
/// [`node_use`] asks the same of every node: the first `ntasks % nodes` positions take one
/// task more than the rest, and nothing else in a share depends on the position.
pub fn same_share_until(job: &Job, position: usize) -> usize {
    let n = job.spec.nodes.max(1);
    let extra = (job.spec.ntasks % n) as usize;
    if position < extra { extra } else { n as usize }
}

/// What the job's `position`-th node (0-based) of `node` must give it; `None` when a count
/// overflows (no node could give it).
pub fn node_use(job: &Job, position: usize, node: &NodeSpec) -> Option<NodeUse> {
    let spec = &job.spec;
    let n = u64::from(spec.nodes.max(1));
    let (base, extra) = (u64::from(spec.ntasks) / n, u64::from(spec.ntasks) % n);
    let tasks = base + u64::from((position as u64) < extra);
    let cpus = if spec.exclusive {
        u64::from(node.cpus)
    } else {
        tasks.checked_mul(u64::from(spec.cpus_per_task))?
    };
    let cpus = u32::try_from(cpus).ok()?;
    let memory = match job.resolved.memory {
        MemoryRequest::PerNode(m) => m,
        MemoryRequest::PerCpu(m) => m.checked_mul(u64::from(cpus))?,
        MemoryRequest::WholeNode => node.memory,
    };
    Some(NodeUse {
        cpus,
        memory,
        jobfs: job.resolved.jobfs,
        gpus: if spec.exclusive {
            node.gpus
        } else {
            spec.gpus_per_node
        },
        exclusive: spec.exclusive,
        suspended: false,
    })
}
