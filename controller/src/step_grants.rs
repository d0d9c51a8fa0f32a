//! Telling agents about steps: each node of a live step learns its share (a `StepGrant`) on
//! its instruction stream, and a step cancelled while its tasks may still run there is killed
//! (`StepControl`). Like launches, what was sent is remembered per stream and everything is
//! sent again on a new stream; the agent ignores a grant it already has.

use std::collections::{BTreeMap, BTreeSet};

use docket_core::job::StepId;
use docket_core::job::step::Step;
use docket_core::{JobId, NodeName, State};
use docket_proto::v1 as pb;

/// What one agent's stream was told of steps: job -> granted and cancelled step ids.
#[derive(Debug, Default)]
pub struct Sent {
    granted: BTreeMap<JobId, BTreeSet<StepId>>,
    cancelled: BTreeMap<JobId, BTreeSet<StepId>>,
}

/// Slurm's `SLURM_TASKS_PER_NODE`: counts in node order, runs of equal counts as `N(xK)`.
pub fn tasks_per_node(counts: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < counts.len() {
        let mut j = i;
        while j + 1 < counts.len() && counts[j + 1] == counts[i] {
            j += 1;
        }
        let run = j - i + 1;
        parts.push(if run == 1 {
            counts[i].to_string()
        } else {
            format!("{}(x{run})", counts[i])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// The grant of `step`'s share on `node` (None when it has no tasks there).
pub fn grant(job: JobId, epoch: u64, step: &Step, node: &NodeName) -> Option<pb::StepGrant> {
    let index = step.layout.iter().position(|s| &s.node == node)?;
    let share = &step.layout[index];
    let nodes: Vec<&str> = step.layout.iter().map(|s| s.node.as_str()).collect();
    let counts: Vec<u32> = step.layout.iter().map(|s| s.tasks).collect();
    Some(pb::StepGrant {
        job_id: job.0,
        epoch,
        step_id: step.id.0,
        first_task: share.first_task,
        tasks: share.tasks,
        cpus_per_task: step.cpus_per_task,
        io_key: step.io_key.clone(),
        time_limit_seconds: step.time_limit.map_or(0, |t| t.0),
        ntasks: step.ntasks(),
        nnodes: step.layout.len() as u32,
        node_index: index as u32,
        node_list: docket_core::hostlist::compress(&nodes),
        tasks_per_node: tasks_per_node(&counts),
        name: step.name.clone(),
    })
}

/// Adds to `out` the grants and cancels `node`'s agent has not been sent yet, for the runs
/// the state wants there (`wanted`: job -> epoch and whether it runs).
pub(crate) fn plan(
    state: &State,
    node: &NodeName,
    wanted: Option<&BTreeMap<JobId, (u64, crate::dispatch::Want)>>,
    sent: &mut Sent,
    out: &mut Vec<pb::Instruction>,
) {
    // Forget jobs no longer here: the run's end kills its steps.
    let here = |j: &JobId| wanted.is_some_and(|w| w.contains_key(j));
    sent.granted.retain(|j, _| here(j));
    sent.cancelled.retain(|j, _| here(j));
    for (job_id, (epoch, want)) in wanted.into_iter().flatten() {
        if *want == crate::dispatch::Want::Kill {
            continue;
        }
        let Some(job) = state.jobs.get(job_id) else {
            continue;
        };
        for step in job.steps.live() {
            if step.ends.contains_key(node) {
                continue;
            }
            if step.state == docket_core::job::JobState::Running {
                if sent.granted.entry(*job_id).or_default().insert(step.id)
                    && let Some(g) = grant(*job_id, *epoch, step, node)
                {
                    out.push(pb::Instruction {
                        kind: Some(pb::instruction::Kind::StepGrant(g)),
                    });
                }
            } else if step.on_node(node).is_some()
                && sent.cancelled.entry(*job_id).or_default().insert(step.id)
            {
                out.push(pb::Instruction {
                    kind: Some(pb::instruction::Kind::StepCancel(pb::StepControl {
                        job_id: job_id.0,
                        epoch: *epoch,
                        step_id: step.id.0,
                    })),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_per_node_is_written_as_slurm_writes_it() {
        assert_eq!(tasks_per_node(&[2, 2, 2, 1]), "2(x3),1");
        assert_eq!(tasks_per_node(&[4]), "4");
        assert_eq!(tasks_per_node(&[1, 2, 1]), "1,2,1");
        assert_eq!(tasks_per_node(&[]), "");
    }
}
