//! What the leader tells each node agent: a pure function of the replicated state and of
//! what the leader knows of the agent's session (what it said it holds, what this stream was
//! already told), tested without a cluster.
//!
//! The dispatcher ([`crate::agents`]) calls [`instruct`] for every connected agent whenever a
//! command commits (the state machine wakes it, [`crate::machine::Wakes`]) and when an agent
//! registers or opens its stream, and sends what it returns. Each call returns only what
//! this stream has not been told yet, so calling it again without a change sends nothing:
//! a launch once per run and stream, a resume only after a suspend, a kill once, a time limit
//! only when it changed. A new stream starts from an empty [`Link`] and gets everything
//! again; the agent ignores what it already has and refuses what is older than the epoch it
//! holds, so nothing sent twice runs twice.

use std::collections::BTreeMap;

use docket_core::job::{ArrayPart, Job, JobState};
use docket_core::{JobId, NodeName, State};
use docket_proto::v1 as pb;

/// What the leader wants an agent to do with one job run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Run,
    Suspend,
    Kill,
}

/// One run an agent said it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub epoch: u64,
    /// False once the run has ended (its end not yet acknowledged).
    pub running: bool,
    /// Frozen by a suspension.
    pub suspended: bool,
}

impl Held {
    pub fn of(job: &pb::HeldJob) -> (JobId, Held) {
        (
            JobId(job.job_id),
            Held {
                epoch: job.epoch,
                running: job.running,
                suspended: job.running && job.suspended,
            },
        )
    }
}

/// What the leader knows of one agent's session: what it holds and what its current stream
/// was told.
#[derive(Debug, Default)]
pub struct Link {
    /// What the agent last said it holds.
    pub held: BTreeMap<JobId, Held>,
    /// What was last sent per job on this stream: (epoch, want).
    pub sent: BTreeMap<JobId, (u64, Want)>,
    /// The time limit each run was last told (seconds, 0 unlimited), per job: (epoch, limit).
    pub limits: BTreeMap<JobId, (u64, u64)>,
    /// The steps granted and cancelled on this stream.
    pub steps: crate::step_grants::Sent,
}

impl Link {
    /// A new stream: it was told nothing yet (what the agent holds is kept).
    pub fn new_stream(&mut self) {
        self.sent.clear();
        self.limits.clear();
        self.steps = Default::default();
    }
}

/// Where every live run should be and in which state, from the replicated state alone.
#[derive(Debug, Default)]
pub struct Wanted {
    /// node -> job -> (epoch, want). A job of several nodes is on each: its batch script on
    /// the first, the holder of its allocation on the others (Slurm's extern step).
    pub runs: BTreeMap<NodeName, BTreeMap<JobId, (u64, Want)>>,
    /// Each live run's time limit, seconds (0 unlimited).
    pub limits: BTreeMap<JobId, u64>,
}

impl Wanted {
    pub fn of(state: &State) -> Wanted {
        let mut wanted = Wanted::default();
        for job in state.holding_jobs() {
            let Some(alloc) = &job.alloc else { continue };
            let w = match job.state {
                JobState::Running => Want::Run,
                JobState::Suspended => Want::Suspend,
                JobState::Completing => Want::Kill,
                _ => continue,
            };
            for share in &alloc.shares {
                wanted
                    .runs
                    .entry(share.node.clone())
                    .or_default()
                    .insert(job.id, (alloc.epoch, w));
            }
            wanted
                .limits
                .insert(job.id, job.resolved.time_limit.map_or(0, |t| t.0));
        }
        wanted
    }
}

fn control(
    kind: fn(pb::JobControl) -> pb::instruction::Kind,
    job: JobId,
    epoch: u64,
    reason: &str,
) -> pb::Instruction {
    pb::Instruction {
        kind: Some(kind(pb::JobControl {
            job_id: job.0,
            epoch,
            reason: reason.into(),
        })),
    }
}

/// What `node`'s agent must be told now that its stream (`link`) was not told yet; `link`
/// records it as told.
pub fn instruct(
    state: &State,
    wanted: &Wanted,
    node: &NodeName,
    link: &mut Link,
) -> Vec<pb::Instruction> {
    use pb::instruction::Kind;
    let mut out = Vec::new();
    let runs = wanted.runs.get(node);
    for (job_id, (epoch, w)) in runs.into_iter().flatten() {
        let (job_id, epoch, w) = (*job_id, *epoch, *w);
        let held = link.held.get(&job_id).copied();
        let sent = link.sent.get(&job_id).copied();
        let (launch_first, instruction) = tell(state, node, job_id, (epoch, w), sent, held);
        let launching = launch_first.is_some()
            || matches!(
                &instruction,
                Some(pb::Instruction {
                    kind: Some(Kind::Launch(_))
                })
            );
        let limit = wanted.limits.get(&job_id).copied().unwrap_or(0);
        out.extend(launch_first);
        if let Some(i) = instruction {
            link.sent.insert(job_id, (epoch, w));
            out.push(i);
        }
        if launching {
            link.limits.insert(job_id, (epoch, limit));
        } else if w != Want::Kill {
            // A run the agent has: tell it a changed time limit.
            match link.limits.get(&job_id) {
                Some((e, l)) if *e == epoch && *l == limit => {}
                Some((e, _)) if *e == epoch => {
                    link.limits.insert(job_id, (epoch, limit));
                    out.push(pb::Instruction {
                        kind: Some(Kind::TimeLimit(pb::TimeLimit {
                            job_id: job_id.0,
                            epoch,
                            time_limit_seconds: limit,
                        })),
                    });
                }
                // Not launched by this leader: take the current limit as the agent's (an
                // update made while no leader was there reaches it only with the next
                // change).
                _ => {
                    link.limits.insert(job_id, (epoch, limit));
                }
            }
        }
    }
    crate::step_grants::plan(state, node, runs, &mut link.steps, &mut out);
    // Anything the agent runs that is not a current run here: kill it.
    for (job_id, held) in &link.held {
        let epoch = held.epoch;
        let current = runs
            .and_then(|w| w.get(job_id))
            .is_some_and(|(e, _)| *e == epoch);
        let already = link.sent.get(job_id) == Some(&(epoch, Want::Kill));
        if held.running && !current && !already {
            link.sent.insert(*job_id, (epoch, Want::Kill));
            out.push(control(
                Kind::Kill,
                *job_id,
                epoch,
                "stale: not this job's current run",
            ));
        }
    }
    out
}

/// What one run (`job_id` at `epoch`, wanted `w`) needs told on a stream that was told
/// `sent` of it, to an agent that said it holds `held`: a launch that must come first, and
/// the instruction itself.
fn tell(
    state: &State,
    node: &NodeName,
    job_id: JobId,
    (epoch, w): (u64, Want),
    sent: Option<(u64, Want)>,
    held: Option<Held>,
) -> (Option<pb::Instruction>, Option<pb::Instruction>) {
    use pb::instruction::Kind;
    let launch_of = || {
        state.jobs.get(&job_id).map(|job| pb::Instruction {
            kind: Some(Kind::Launch(launch(state, job, node))),
        })
    };
    // A run suspended before any stream carried its launch (its agent was away when it
    // started): launched now, then frozen, or the agent would be told to suspend and later
    // resume a run it never had, and the job would stay RUNNING without a process.
    let unlaunched = sent.is_none_or(|(e, _)| e != epoch) && held.is_none_or(|h| h.epoch != epoch);
    let launch_first = (w == Want::Suspend && unlaunched).then(launch_of).flatten();
    let instruction = match w {
        Want::Run => match (sent, held) {
            (Some((e, Want::Run)), _) if e == epoch => None,
            (Some((e, Want::Suspend)), _) if e == epoch => {
                Some(control(Kind::Resume, job_id, epoch, "resumed"))
            }
            // Suspended by an earlier leader or stream, resumed while no stream reached the
            // agent: without this the run stays frozen while the state says RUNNING.
            (_, Some(h)) if h.epoch == epoch && h.running && h.suspended => {
                Some(control(Kind::Resume, job_id, epoch, "resumed"))
            }
            (_, Some(h)) if h.epoch == epoch && h.running => None,
            _ => launch_of(),
        },
        Want::Suspend => match sent {
            Some((e, Want::Suspend)) if e == epoch => None,
            _ => Some(control(Kind::Suspend, job_id, epoch, "suspended")),
        },
        Want::Kill => match sent {
            Some((e, Want::Kill)) if e == epoch => None,
            _ => Some(control(Kind::Kill, job_id, epoch, "cancelled")),
        },
    };
    (launch_first, instruction)
}

/// What a node that is not the batch node runs for the job: nothing but a process that holds
/// the allocation's cgroups until the job ends (Slurm's `extern` step).
const EXTERN_SCRIPT: &[u8] = b"#!/bin/sh\nexec sleep infinity\n";

/// The launch instruction for `job`'s current run on `node`: the batch script on the first
/// node of the allocation, the holder of the allocation on the others.
pub fn launch(state: &State, job: &Job, node: &NodeName) -> pb::Launch {
    let alloc = job.alloc.as_ref();
    let first = alloc
        .and_then(|a| a.shares.first())
        .is_none_or(|s| &s.node == node);
    let share = alloc.and_then(|a| a.shares.iter().find(|s| &s.node == node));
    let nodes: Vec<&str> = alloc
        .map(|a| a.shares.iter().map(|s| s.node.as_str()).collect())
        .unwrap_or_default();
    let (array_job_id, array_task_id) = match &job.array {
        Some(ArrayPart::Task { array_job, index }) => (Some(array_job.0), Some(*index)),
        _ => (None, None),
    };
    let tasks_per_node = alloc
        .map(|a| job_tasks_per_node(job, a))
        .unwrap_or_default();
    let mut launch = pb::Launch {
        job_id: job.id.0,
        epoch: alloc.map_or(0, |a| a.epoch),
        name: job.spec.name.to_string(),
        user: job.spec.user.to_string(),
        account: job.resolved.account.to_string(),
        partition: job.resolved.partition.to_string(),
        work_dir: job.spec.work_dir.to_string(),
        stdout: job.spec.stdout.as_deref().unwrap_or_default().to_owned(),
        stderr: job.spec.stderr.as_deref().unwrap_or_default().to_owned(),
        script: state
            .blobs
            .get(&job.spec.script)
            .map(|b| b.data.clone())
            .unwrap_or_default(),
        environment: job
            .spec
            .env
            .and_then(|id| state.blobs.get(&id))
            .map(|b| b.data.clone()),
        cpus: share.map_or(0, |s| s.cpus),
        memory_mib: share.map_or(0, |s| s.memory.0),
        vmem_mib: job.spec.vmem.map(|v| v.0),
        address_space_limit: job.spec.address_space_limit,
        jobfs_mib: share.map_or(0, |s| s.jobfs.0),
        gpus: share.map_or(0, |s| s.gpus),
        time_limit_seconds: job.resolved.time_limit.map_or(0, |t| t.0),
        node_count: nodes.len() as u32,
        node_list: docket_core::hostlist::compress(&nodes),
        ntasks: job.spec.ntasks,
        cpus_per_task: job.spec.cpus_per_task,
        array_job_id,
        array_task_id,
        submit_host_dir: job.spec.work_dir.to_string(),
        extern_only: false,
        tasks_per_node,
    };
    if !first {
        launch.extern_only = true;
        launch.script = EXTERN_SCRIPT.to_vec();
        launch.environment = None;
        launch.stdout = "/dev/null".into();
        launch.stderr = "/dev/null".into();
    }
    launch
}

/// The job's tasks on each node of `alloc`, as Slurm writes `SLURM_TASKS_PER_NODE` ("2(x3),1"):
/// the job's `-n` placed on its whole allocation as a step with no other step beside it
/// would be, which is where `srun` inside it puts them and where MPI launchers that read the
/// variable (MPICH's Hydra) start their ranks.
fn job_tasks_per_node(job: &docket_core::job::Job, alloc: &docket_core::job::Allocation) -> String {
    let spec = docket_core::job::StepSpec {
        name: String::new(),
        ntasks: Some(job.spec.ntasks.max(1)),
        nodes: Some(alloc.shares.len() as u32),
        ntasks_per_node: job.spec.ntasks_per_node,
        cpus_per_task: job.spec.cpus_per_task.max(1),
        nodelist: Vec::new(),
        overlap: true,
        time_limit: None,
        io_key: Vec::new(),
    };
    match docket_core::job::step::place(alloc, &|_| 0, &spec) {
        docket_core::job::step::Placement::Placed(shares) => {
            let counts: Vec<u32> = alloc
                .shares
                .iter()
                .map(|a| {
                    shares
                        .iter()
                        .find(|s| s.node == a.node)
                        .map_or(0, |s| s.tasks)
                })
                .collect();
            crate::step_grants::tasks_per_node(&counts)
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests;
