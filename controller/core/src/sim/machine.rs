//! The machine and the people a replay runs with, and how each SWF job becomes a
//! submission.
//!
//! Without a site configuration: the textbook model, one node holding the trace's
//! processors in one partition, FCFS priority, unlimited depths and 1 s resolution.
//!
//! With one (the controller's `docket.toml`): its nodes, partitions, QOS, accounts, users
//! and every policy, built by the same commands the controller applies. A site without
//! nodes gets one node of the trace's processors, in every partition it defines. SWF users
//! become `u<id>` and groups accounts `g<id>` (created under `root` unless the site defines
//! them; a user the site defines keeps its own accounts); the `[sim]` table maps SWF queue
//! and partition numbers to partitions and QOS:
//!
//! ```toml
//! [sim]
//! DefaultPartition = "normal"              # jobs no mapping places
//! queues = { 1 = { partition = "normal" }, 2 = { partition = "express", qos = "high" } }
//! partitions = { 1 = "normal" }           # SWF field 16, used when the queue is unmapped
//! ```

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;
use serde::Deserialize;
use smol_str::{SmolStr, format_smolstr};

use super::swf::SwfJob;
use super::{Policy, SimError};
use crate::account::{AssocLimits, User, UserAssoc};
use crate::command::Command;
use crate::config::{SchedConfig, SchedParams};
use crate::ids::{AccountName, NodeName, PartitionName, QosName, UserName};
use crate::job::{BlobId, JobSpec, MemoryRequest, TimeRequest};
use crate::node::NodeSpec;
use crate::partition::Partition;
use crate::priority::PriorityFormula;
use crate::qos::Qos;
use crate::quantity::{MiB, Seconds};
use crate::site::{SiteConfig, SiteError, SiteFile};

const NODE: &str = "sim";
const PARTITION: &str = "batch";
pub(super) const SCRIPT: &[u8] = b"#!/bin/sh\n# replayed from a workload trace\n";

/// A site to replay on, with its SWF mapping.
#[derive(Debug, Clone)]
pub struct SimSite {
    pub site: SiteConfig,
    pub map: SimMap,
}

impl SimSite {
    /// The site of a parsed configuration file, with its `[sim]` table.
    pub fn from_file(file: &SiteFile) -> Result<SimSite, SiteError> {
        Ok(SimSite {
            site: file.site.clone(),
            map: SimMap::parse(file.sim.as_ref())?,
        })
    }
}

/// Where SWF queue and partition numbers go.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimMap {
    pub default_partition: Option<PartitionName>,
    pub queues: BTreeMap<i64, QueueMap>,
    pub partitions: BTreeMap<i64, PartitionName>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueMap {
    pub partition: Option<PartitionName>,
    pub qos: Option<QosName>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSimMap {
    #[serde(rename = "DefaultPartition")]
    default_partition: Option<String>,
    #[serde(default)]
    queues: BTreeMap<String, RawQueueMap>,
    #[serde(default)]
    partitions: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueueMap {
    partition: Option<String>,
    qos: Option<String>,
}

impl SimMap {
    pub fn parse(table: Option<&toml::Table>) -> Result<SimMap, SiteError> {
        let Some(table) = table else {
            return Ok(SimMap::default());
        };
        let raw: RawSimMap = table
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| SiteError::invalid("sim", e.message().to_string()))?;
        let name = |key: String, text: &str| -> Result<PartitionName, SiteError> {
            text.parse()
                .map_err(|e: crate::ids::IdError| SiteError::invalid(key, e.to_string()))
        };
        let number = |key: String, text: &str| -> Result<i64, SiteError> {
            text.parse().map_err(|_| {
                SiteError::invalid(
                    key,
                    format!("{text:?} is not an SWF queue or partition number"),
                )
            })
        };
        let mut map = SimMap::default();
        if let Some(p) = &raw.default_partition {
            map.default_partition = Some(name("sim.DefaultPartition".into(), p)?);
        }
        for (k, q) in &raw.queues {
            let key = format!("sim.queues.{k}");
            let entry = QueueMap {
                partition: match &q.partition {
                    Some(p) => Some(name(format!("{key}.partition"), p)?),
                    None => None,
                },
                qos: match &q.qos {
                    Some(p) => Some(p.parse().map_err(|e: crate::ids::IdError| {
                        SiteError::invalid(format!("{key}.qos"), e.to_string())
                    })?),
                    None => None,
                },
            };
            map.queues.insert(number(key, k)?, entry);
        }
        for (k, p) in &raw.partitions {
            let key = format!("sim.partitions.{k}");
            map.partitions
                .insert(number(key.clone(), k)?, name(key, p)?);
        }
        Ok(map)
    }
}

fn name<T: std::str::FromStr>(s: &str) -> Result<T, SimError>
where
    T::Err: std::fmt::Display,
{
    s.parse()
        .map_err(|e: T::Err| SimError::Setup(e.to_string()))
}

/// A trace user's name. Names are made for every job of a trace: `format_smolstr!` keeps a
/// short one inline, where `format!` allocated (three per job: 55,000 of the 797,000
/// allocations of the NASA replay under FCFS, counted with `callgrind`).
fn user_name(id: i64) -> SmolStr {
    if id >= 0 {
        format_smolstr!("u{id}")
    } else {
        SmolStr::new_static("unknown")
    }
}

/// A trace group's account name, made as [`user_name`] is.
fn account_name(id: i64) -> SmolStr {
    if id >= 0 {
        format_smolstr!("g{id}")
    } else {
        SmolStr::new_static("nogroup")
    }
}

/// The commands that set up a replay, the machine's processors, and how jobs map.
pub(super) struct Machine {
    pub commands: Vec<Command>,
    pub procs: u64,
    pub config: SchedConfig,
    pub jobs: JobMapper,
}

/// Builds the machine for `jobs` (already filtered and sorted).
pub(super) fn build(
    site: Option<&SimSite>,
    policy: Policy,
    trace_procs: Option<u64>,
    explicit_procs: bool,
    jobs: &[&SwfJob],
) -> Result<Machine, SimError> {
    let config = replay_config(site, policy, jobs.len());
    let mut commands = Vec::new();
    let (procs, partitions) = hardware(site, trace_procs, explicit_procs, &mut commands)?;
    set_config_after_qos(&mut commands, site, &config);
    trace_accounts(site, jobs, &mut commands)?;
    let site_users = trace_users(site, jobs, &mut commands)?;
    let mut mapper = job_mapper(site, &partitions, procs, site_users)?;
    mapper.name_trace_ids(jobs)?;
    Ok(Machine {
        commands,
        procs,
        config,
        jobs: mapper,
    })
}

/// The site's scheduler configuration (or the textbook one: FCFS priority, no limits) with
/// the replayed policy, and room for every job in one submission.
fn replay_config(site: Option<&SimSite>, policy: Policy, jobs: usize) -> SchedConfig {
    let mut config = match site {
        Some(s) => s.site.sched.clone(),
        None => {
            let mut c = SchedConfig::default();
            c.priority.formula = PriorityFormula::Fcfs;
            c.sched = SchedParams::unlimited(policy.backfill);
            c
        }
    };
    policy.configure(&mut config);
    // A replay submits whole instants at once and keeps every job.
    config.max_batch = config
        .max_batch
        .max(u32::try_from(jobs).unwrap_or(u32::MAX));
    config.max_job_count = config.max_job_count.max(jobs as u64 + 1);
    config
}

/// The nodes and partitions: the site's when it defines nodes, else one node as wide as
/// the trace's machine in the site's partitions (or one default partition). Pushes their
/// commands; the machine's processors and its partitions.
fn hardware(
    site: Option<&SimSite>,
    trace_procs: Option<u64>,
    explicit_procs: bool,
    commands: &mut Vec<Command>,
) -> Result<(u64, Vec<Partition>), SimError> {
    if let Some(s) = site.filter(|s| !s.site.nodes.is_empty()) {
        if explicit_procs {
            return Err(SimError::Setup(
                "--procs cannot be combined with a configuration that defines nodes: the \
                 nodes are the machine"
                    .into(),
            ));
        }
        commands.extend(s.site.commands());
        let procs = s.site.nodes.iter().map(|n| u64::from(n.cpus)).sum();
        return Ok((procs, s.site.partitions.clone()));
    }
    let procs = trace_procs.ok_or(SimError::NoMachineSize)?;
    let cpus = u32::try_from(procs).map_err(|_| SimError::MachineTooLarge(procs))?;
    let mut partitions = Vec::new();
    if let Some(s) = site {
        commands.extend(s.site.commands());
        partitions = s.site.partitions.clone();
    }
    let node: NodeName = name(NODE)?;
    commands.push(Command::UpsertNode(NodeSpec {
        name: node.clone(),
        cpus,
        memory: MiB(u64::MAX / 4),
        jobfs: MiB(u64::MAX / 4),
        gpus: 0,
        features: BTreeSet::new(),
    }));
    if partitions.is_empty() {
        let mut p = Partition::new(name(PARTITION)?, BTreeSet::new());
        p.is_default = true;
        partitions.push(p);
    }
    for p in &mut partitions {
        p.nodes.insert(node.clone());
        commands.push(Command::UpsertPartition(Box::new(p.clone())));
    }
    Ok((procs, partitions))
}

/// Replaces the site's SetConfig (or adds one) with the replay's, after the QOS it names.
fn set_config_after_qos(commands: &mut Vec<Command>, site: Option<&SimSite>, config: &SchedConfig) {
    commands.retain(|c| !matches!(c, Command::SetConfig(_)));
    let defines_qos = |q: &QosName| site.is_some_and(|s| s.site.qos(q).is_some());
    if !defines_qos(&config.default_qos) {
        commands.insert(
            0,
            Command::UpsertQos(Box::new(Qos::new(config.default_qos.clone()))),
        );
    }
    let qos_end = commands
        .iter()
        .rposition(|c| matches!(c, Command::UpsertQos(_)))
        .map_or(0, |i| i + 1);
    commands.insert(qos_end, Command::SetConfig(Box::new(config.clone())));
}

/// SWF groups become accounts, unless the site defines them.
fn trace_accounts(
    site: Option<&SimSite>,
    jobs: &[&SwfJob],
    commands: &mut Vec<Command>,
) -> Result<(), SimError> {
    let defined: BTreeSet<AccountName> = site
        .map(|s| s.site.accounts.iter().map(|a| a.name.clone()).collect())
        .unwrap_or_default();
    let groups: BTreeSet<i64> = jobs.iter().map(|j| j.group).collect();
    for g in &groups {
        let account: AccountName = name(&account_name(*g))?;
        if defined.contains(&account) {
            continue;
        }
        commands.push(Command::UpsertAccount {
            name: account,
            parent: name(crate::account::ROOT)?,
            shares: 1,
            limits: AssocLimits::default(),
            grant: None,
        });
    }
    Ok(())
}

/// SWF users become users of every group they submitted under (the first their default),
/// unless the site defines them; the site's users among them, with their accounts.
fn trace_users(
    site: Option<&SimSite>,
    jobs: &[&SwfJob],
    commands: &mut Vec<Command>,
) -> Result<BTreeMap<i64, BTreeSet<AccountName>>, SimError> {
    let defined: BTreeMap<UserName, &User> = site
        .map(|s| {
            s.site
                .users
                .iter()
                .map(|u| (u.user.name.clone(), &u.user))
                .collect()
        })
        .unwrap_or_default();
    let mut users: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for j in jobs {
        let gs = users.entry(j.user).or_default();
        if !gs.contains(&j.group) {
            gs.push(j.group);
        }
    }
    let mut site_users: BTreeMap<i64, BTreeSet<AccountName>> = BTreeMap::new();
    for (u, gs) in &users {
        let user: UserName = name(&user_name(*u))?;
        if defined.contains_key(&user) {
            let assocs = site
                .and_then(|s| s.site.users.iter().find(|d| d.user.name == user))
                .map(|d| d.assocs.iter().map(|(a, _)| a.clone()).collect())
                .unwrap_or_default();
            site_users.insert(*u, assocs);
            continue;
        }
        let assocs = gs
            .iter()
            .map(|g| {
                Ok((
                    name::<AccountName>(&account_name(*g))?,
                    UserAssoc {
                        shares: 1,
                        priority: 0,
                        limits: AssocLimits::default(),
                    },
                ))
            })
            .collect::<Result<Vec<_>, SimError>>()?;
        commands.push(Command::UpsertUser {
            user: User {
                name: user,
                default_account: name(&account_name(gs[0]))?,
                admin: false,
            },
            assocs,
        });
    }
    Ok(site_users)
}

/// How trace jobs map onto the machine: the site's queue map, each partition's widest node
/// (to turn processors into nodes) and the default partition.
fn job_mapper(
    site: Option<&SimSite>,
    partitions: &[Partition],
    procs: u64,
    site_users: BTreeMap<i64, BTreeSet<AccountName>>,
) -> Result<JobMapper, SimError> {
    let node_cpus: BTreeMap<NodeName, u32> = match site {
        Some(s) if !s.site.nodes.is_empty() => s
            .site
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.cpus))
            .collect(),
        _ => BTreeMap::from([(name(NODE)?, u32::try_from(procs).unwrap_or(u32::MAX))]),
    };
    let widest: BTreeMap<PartitionName, u32> = partitions
        .iter()
        .map(|p| {
            let w = p
                .nodes
                .iter()
                .filter_map(|n| node_cpus.get(n))
                .copied()
                .max()
                .unwrap_or(1);
            (p.name.clone(), w)
        })
        .collect();
    let default_partition = site
        .and_then(|s| s.map.default_partition.clone())
        .or_else(|| {
            partitions
                .iter()
                .find(|p| p.is_default)
                .map(|p| p.name.clone())
        });
    Ok(JobMapper {
        map: site.map(|s| s.map.clone()).unwrap_or_default(),
        site_users,
        widest,
        default_partition,
        script: BlobId::of(SCRIPT),
        user_names: FxHashMap::default(),
        account_names: FxHashMap::default(),
    })
}

/// Turns SWF jobs into submissions.
pub(super) struct JobMapper {
    map: SimMap,
    /// Users the site defines, with the accounts they may charge.
    site_users: BTreeMap<i64, BTreeSet<AccountName>>,
    widest: BTreeMap<PartitionName, u32>,
    default_partition: Option<PartitionName>,
    /// The id of [`SCRIPT`], which every replayed job runs.
    pub script: BlobId,
    /// The trace's users and groups by id, named and checked once rather than for each job
    /// (1.1% of a 100,000-job replay).
    user_names: FxHashMap<i64, UserName>,
    account_names: FxHashMap<i64, AccountName>,
}

impl JobMapper {
    /// Names the users and groups of `jobs`.
    fn name_trace_ids(&mut self, jobs: &[&SwfJob]) -> Result<(), SimError> {
        for j in jobs {
            if let std::collections::hash_map::Entry::Vacant(slot) = self.user_names.entry(j.user) {
                slot.insert(name(&user_name(j.user))?);
            }
            if let std::collections::hash_map::Entry::Vacant(slot) =
                self.account_names.entry(j.group)
            {
                slot.insert(name(&account_name(j.group))?);
            }
        }
        Ok(())
    }

    pub fn spec(&self, j: &SwfJob) -> Result<JobSpec, SimError> {
        let user = match self.user_names.get(&j.user) {
            Some(user) => user.clone(),
            None => name(&user_name(j.user))?,
        };
        let mut s = JobSpec::simple(user, self.script);
        let account: AccountName = match self.account_names.get(&j.group) {
            Some(account) => account.clone(),
            None => name(&account_name(j.group))?,
        };
        s.account = match self.site_users.get(&j.user) {
            // A user the site defines charges its default account unless the SWF group is
            // one of its accounts.
            Some(accounts) => accounts.contains(&account).then_some(account),
            None => Some(account),
        };
        let queue = self.map.queues.get(&j.queue);
        s.partition = queue
            .and_then(|q| q.partition.clone())
            .or_else(|| self.map.partitions.get(&j.partition).cloned())
            .or_else(|| self.default_partition.clone());
        s.qos = queue.and_then(|q| q.qos.clone());
        s.ntasks = u32::try_from(j.procs).map_err(|_| SimError::MachineTooLarge(j.procs))?;
        let widest = s
            .partition
            .as_ref()
            .and_then(|p| self.widest.get(p))
            .copied()
            .unwrap_or(1)
            .max(1);
        s.nodes = s.ntasks.div_ceil(widest).max(1);
        s.memory = Some(MemoryRequest::PerNode(MiB(0)));
        s.jobfs = Some(MiB(0));
        s.time = TimeRequest::Limit(Seconds(j.estimate.max(1)));
        // Slurm's JobRequeue=1: a job killed by preemption goes back to the queue.
        s.requeue = true;
        s.name = format_smolstr!("swf{}", j.id);
        Ok(s)
    }
}
