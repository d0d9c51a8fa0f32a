//! What the status page shows, computed from one replica's state, its Raft status and the
//! loops' figures: plain structs the templates print, built without I/O so they are tested
//! without a cluster.
//!
//! The page is served without authentication, so it shows what anyone may see. Where the
//! site keeps jobs private (`PrivateData = ["jobs"]`): no job, no job page, no counts of
//! jobs by state or partition and no plots of the queue — what the CLI shows a user of
//! other users' work (sinfo's node states, cpus busy and reasons stay). Where usage is
//! private (`"usage"`), a job's page leaves out its fair-share factor, which sshare would
//! not show.

use docket_core::State;
use docket_core::job::{Job, JobState};
use docket_core::node::NodeState;
use docket_core::quantity::TimeMs;
use docket_raft::status::{ReplicaStatus, Role};

use crate::stats::LoopStats;

/// The most queue rows one page lists (the rest are counted).
pub const MAX_ROWS: usize = 500;

/// Which jobs the queue lists (`?user=&partition=&state=`); empty fields match all.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Filter {
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub partition: String,
    #[serde(default)]
    pub state: String,
}

impl Filter {
    fn admits(&self, job: &Job) -> bool {
        (self.user.is_empty() || job.spec.user.as_str() == self.user)
            && (self.partition.is_empty() || job.resolved.partition.as_str() == self.partition)
            && (self.state.is_empty() || job.state.name().eq_ignore_ascii_case(&self.state))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct MemberView {
    pub id: u64,
    pub addr: String,
    pub voter: bool,
    pub lag: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub name: String,
    /// sinfo's state name, also the CSS class that colours it.
    pub state: &'static str,
    pub cpus_used: u64,
    pub cpus: u32,
    pub reason: String,
    /// The jobs on it (empty where jobs are private).
    pub jobs: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PartitionView {
    pub name: String,
    pub up: bool,
    pub default: bool,
    pub nodes: usize,
    /// Empty where jobs are private.
    pub pending: String,
    pub running: String,
    pub max_time: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub id: u64,
    pub name: String,
    pub user: String,
    pub partition: String,
    pub state: &'static str,
    pub reason: &'static str,
    pub nodes: String,
    pub submitted: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PassView {
    pub kind: &'static str,
    pub runs: u64,
    pub mean_ms: String,
    pub max_ms: String,
    pub last_depth: u64,
    pub started: u64,
    pub yields: String,
}

/// Everything the overview prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Overview {
    pub replica: u64,
    pub role: String,
    pub leading: bool,
    pub term: u64,
    pub leader: String,
    /// The leader's status page, when this replica follows and the leader named one.
    pub leader_page: Option<String>,
    pub applied: u64,
    pub members: Vec<MemberView>,
    pub nodes: Vec<NodeView>,
    pub partitions: Vec<PartitionView>,
    /// (state, jobs in it), every state with jobs; empty where jobs are private.
    pub counts: Vec<(&'static str, u64)>,
    /// Whether jobs are private (the page says so and shows no counts of them).
    pub private: bool,
    /// The listed jobs; `None` where jobs are private.
    pub jobs: Option<Vec<JobRow>>,
    /// Jobs the filter admits beyond [`MAX_ROWS`].
    pub more: usize,
    pub filter: Filter,
    pub passes: Vec<PassView>,
    /// Leaders this replica saw come to power, newest first: (when, leader, term).
    pub leaders: Vec<(String, u64, u64)>,
    /// Filled by the server from this replica's history.
    pub plots: Vec<super::history::Plot>,
}

/// A time as the page prints it: UTC, to the second.
pub fn when(t: Option<TimeMs>) -> String {
    t.and_then(|t| jiff::Timestamp::from_millisecond(t.0 as i64).ok())
        .map(|ts| ts.strftime("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default()
}

fn limit(seconds: Option<u64>) -> String {
    match seconds {
        None => "UNLIMITED".into(),
        Some(s) => {
            let (d, h, m) = (s / 86_400, s / 3600 % 24, s / 60 % 60);
            if d > 0 {
                format!("{d}-{h:02}:{m:02}:{:02}", s % 60)
            } else {
                format!("{h:02}:{m:02}:{:02}", s % 60)
            }
        }
    }
}

fn node_state(s: NodeState) -> &'static str {
    match s {
        NodeState::Idle => "idle",
        NodeState::Mix => "mix",
        NodeState::Alloc => "alloc",
        NodeState::Draining => "draining",
        NodeState::Drain => "drain",
        NodeState::Down => "down",
    }
}

fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1000.0)
}

/// The overview of `state` as this replica sees it.
pub fn overview(
    state: &State,
    raft: &ReplicaStatus,
    loops: &LoopStats,
    filter: Filter,
) -> Overview {
    let private = state.config.private_data.jobs;
    let leader = match (raft.leader, &raft.leader_addr) {
        (Some(id), Some(addr)) => format!("replica {} at {addr}", id.0),
        (Some(id), None) => format!("replica {}", id.0),
        _ => "none".into(),
    };
    let members = raft
        .members
        .iter()
        .map(|m| MemberView {
            id: m.id.0,
            addr: m.addr.clone(),
            voter: m.voter,
            lag: m.lag.map_or_else(String::new, |l| l.to_string()),
        })
        .collect();
    let (counts, per_partition) = job_counts(state);
    let (jobs, more) = if private {
        (None, 0)
    } else {
        let (rows, more) = job_rows(state, &filter);
        (Some(rows), more)
    };
    Overview {
        replica: raft.id.0,
        role: raft.role.to_string(),
        leading: raft.role == Role::Leader,
        term: raft.term,
        leader,
        applied: raft.applied_index.unwrap_or(0),
        members,
        nodes: node_views(state, private),
        partitions: partition_views(state, &per_partition, private),
        counts: if private {
            Vec::new()
        } else {
            counts.into_iter().collect()
        },
        private,
        jobs,
        more,
        filter,
        passes: pass_views(loops),
        leaders: loops
            .leaders_seen
            .iter()
            .rev()
            .map(|l| (when(Some(TimeMs(l.at_ms))), l.leader, l.term))
            .collect(),
        plots: Vec::new(),
        leader_page: None,
    }
}

/// Each partition's jobs: (pending, holding resources).
type PartitionCounts<'a> = std::collections::BTreeMap<&'a str, (u64, u64)>;

/// How many jobs are in each state, and each partition's pending and running jobs.
fn job_counts(
    state: &State,
) -> (
    std::collections::BTreeMap<&'static str, u64>,
    PartitionCounts<'_>,
) {
    let mut per_partition: PartitionCounts<'_> = Default::default();
    let mut counts: std::collections::BTreeMap<&'static str, u64> = Default::default();
    for j in state.jobs.values() {
        *counts.entry(j.state.name()).or_default() += 1;
        let e = per_partition
            .entry(j.resolved.partition.as_str())
            .or_default();
        match j.state {
            JobState::Pending => e.0 += 1,
            s if s.holds_resources() => e.1 += 1,
            _ => {}
        }
    }
    (counts, per_partition)
}

/// Each node's state, use and reason; its jobs unless jobs are private.
fn node_views(state: &State, private: bool) -> Vec<NodeView> {
    state
        .nodes
        .values()
        .map(|n| NodeView {
            name: n.spec.name.to_string(),
            state: node_state(n.state()),
            cpus_used: u64::from(n.used_cpus()),
            cpus: n.spec.cpus,
            reason: n
                .down
                .clone()
                .or_else(|| n.drain.clone())
                .unwrap_or_default(),
            jobs: if private {
                String::new()
            } else {
                n.jobs
                    .keys()
                    .map(|j| j.0.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        })
        .collect()
}

/// Each partition; its job counts unless jobs are private.
fn partition_views(
    state: &State,
    per_partition: &PartitionCounts<'_>,
    private: bool,
) -> Vec<PartitionView> {
    let hidden = |n: u64| {
        if private {
            String::new()
        } else {
            n.to_string()
        }
    };
    state
        .partitions
        .values()
        .map(|p| {
            let (pending, running) = per_partition
                .get(p.name.as_str())
                .copied()
                .unwrap_or_default();
            PartitionView {
                name: p.name.to_string(),
                up: p.up,
                default: p.is_default,
                nodes: p.nodes.len(),
                pending: hidden(pending),
                running: hidden(running),
                max_time: limit(p.max_time.map(|t| t.0)),
            }
        })
        .collect()
}

/// The first [`MAX_ROWS`] jobs `filter` admits, and how many more it admits.
fn job_rows(state: &State, filter: &Filter) -> (Vec<JobRow>, usize) {
    let mut admitted = state.jobs.values().filter(|j| filter.admits(j));
    let rows: Vec<JobRow> = admitted
        .by_ref()
        .take(MAX_ROWS)
        .map(|j| JobRow {
            id: j.id.0,
            name: j.spec.name.to_string(),
            user: j.spec.user.to_string(),
            partition: j.resolved.partition.to_string(),
            state: j.state.name(),
            reason: j.reason.name(),
            nodes: j
                .allocation_record()
                .map(|a| {
                    a.shares
                        .iter()
                        .map(|s| s.node.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default(),
            submitted: when(Some(j.submit_time)),
        })
        .collect();
    (rows, admitted.count())
}

/// The leader's passes: runs, times, depth, starts and why they stopped early.
fn pass_views(loops: &LoopStats) -> Vec<PassView> {
    loops
        .passes
        .iter()
        .map(|(kind, s)| PassView {
            kind: kind.name(),
            runs: s.runs,
            mean_ms: ms(s.mean_us()),
            max_ms: ms(s.max_us),
            last_depth: s.last_depth,
            started: s.jobs_started,
            yields: s
                .stopped_early
                .iter()
                .map(|(why, n)| format!("{why}: {n}"))
                .collect::<Vec<_>>()
                .join(", "),
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
pub struct FactorView {
    pub name: &'static str,
    pub value: String,
    pub weight: String,
    pub contribution: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StepView {
    pub id: String,
    pub name: String,
    pub state: &'static str,
    pub tasks: u32,
}

/// One job's page.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPage {
    pub id: u64,
    pub name: String,
    pub user: String,
    pub account: String,
    pub partition: String,
    pub qos: String,
    pub state: &'static str,
    pub reason: &'static str,
    pub submitted: String,
    pub started: String,
    pub ended: String,
    pub time_limit: String,
    pub nodes: String,
    pub work_dir: String,
    pub stdout: String,
    pub stderr: String,
    pub priority: String,
    pub factors: Vec<FactorView>,
    pub steps: Vec<StepView>,
}

/// A job's output path as scontrol shows it: the pattern with the job's id in it, under its
/// working directory when relative.
fn output_path(job: &Job, pattern: Option<&str>) -> String {
    let pattern = pattern.unwrap_or("slurm-%j.out");
    let path = pattern.replace("%j", &job.id.0.to_string());
    if path.starts_with('/') {
        path
    } else {
        format!("{}/{path}", job.spec.work_dir.trim_end_matches('/'))
    }
}

/// The page of job `id`, or `None` when there is none or jobs are private.
pub fn job_page(state: &State, id: u64, now: TimeMs) -> Option<JobPage> {
    if state.config.private_data.jobs {
        return None;
    }
    let job = state.jobs.get(&docket_core::JobId(id))?;
    let mut explained = (job.state == JobState::Pending)
        .then(|| docket_core::priority::explain(&state.priority_inputs(now), job));
    if state.config.private_data.usage
        && let Some(e) = explained.as_mut()
    {
        e.factors.retain(|f| f.name != "fairshare");
    }
    let stdout = output_path(job, job.spec.stdout.as_deref());
    let stderr = match job.spec.stderr.as_deref() {
        Some(e) => output_path(job, Some(e)),
        None => stdout.clone(),
    };
    Some(JobPage {
        id,
        name: job.spec.name.to_string(),
        user: job.spec.user.to_string(),
        account: job.resolved.account.to_string(),
        partition: job.resolved.partition.to_string(),
        qos: job.resolved.qos.to_string(),
        state: job.state.name(),
        reason: job.reason.name(),
        submitted: when(Some(job.submit_time)),
        started: when(job.start_time),
        ended: when(job.end_time),
        time_limit: limit(job.resolved.time_limit.map(|t| t.0)),
        nodes: job
            .allocation_record()
            .map(|a| {
                a.shares
                    .iter()
                    .map(|s| format!("{} ({} cpus)", s.node, s.cpus))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default(),
        work_dir: job.spec.work_dir.to_string(),
        stdout,
        stderr,
        priority: explained
            .as_ref()
            .map_or_else(String::new, |e| format!("{:.0}", e.priority)),
        factors: explained
            .map(|e| {
                e.factors
                    .into_iter()
                    .map(|f| FactorView {
                        name: f.name,
                        value: format!("{:.4}", f.value),
                        weight: format!("{:.0}", f.weight),
                        contribution: format!("{:.0}", f.contribution),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        steps: job
            .steps
            .list
            .values()
            .map(|s| StepView {
                id: format!("{id}.{}", s.id.0),
                name: s.name.clone(),
                state: s.state.name(),
                tasks: s.layout.iter().map(|l| l.tasks).sum(),
            })
            .collect(),
    })
}
