//! Checking a job's specification and filling in its defaults (`State::resolve`).
//!
//! A submission is refused whole, with the field and the limit named, at the first check it
//! fails; the checks run in a fixed order, so the same spec is refused for the same reason on
//! every replica. The steps, in that order: the spec's own shape, the user's membership of
//! the account, the partition, the QOS, the time limit, whether it fits the partition's
//! nodes, the reservation it names, and the submit limits of its QOS and partition.

use crate::apply::Rejection;
use crate::apply::submit::{
    MAX_NAME_BYTES, MAX_NICE, MAX_PATH_BYTES, NodeCaps, check_comment, check_text,
};
use crate::assoc::AssocId;
use crate::ids::{AccountName, QosName};
use crate::job::{JobSpec, MemoryRequest, Resolved, TimeRequest};
use crate::partition::Partition;
use crate::qos::Qos;
use crate::quantity::{MiB, Seconds};
use crate::state::State;

impl State {
    /// Checks a spec and fills in its defaults from partition, association and config.
    pub(crate) fn resolve(&self, spec: &JobSpec, admin: bool) -> Result<Resolved, Rejection> {
        Self::check_texts(spec)?;
        Self::check_counts(spec, admin)?;
        self.check_array(spec)?;
        let (assoc, account) = self.membership(spec)?;
        let partition = self.partition_for(spec, &account)?;
        let (qos, q) = self.qos_for(spec, partition)?;
        let time_limit = self.time_limit_for(spec, partition, q)?;
        let caps = self.check_node_count(spec, partition)?;
        let (memory, jobfs) = self.check_per_node(spec, partition, caps)?;
        self.check_reservation(spec, &account, partition, time_limit)?;
        self.check_submit_limits(spec, partition, &qos, q)?;
        Ok(Resolved {
            assoc,
            account,
            partition: partition.name.clone(),
            qos,
            time_limit,
            memory,
            jobfs,
        })
    }

    /// The texts and paths: within their limits, no NUL, an absolute working directory.
    fn check_texts(spec: &JobSpec) -> Result<(), Rejection> {
        check_text("name", &spec.name, MAX_NAME_BYTES)?;
        if let Some(comment) = &spec.comment {
            check_comment(comment)?;
        }
        for (field, path) in [
            ("work_dir", Some(&spec.work_dir)),
            ("stdout", spec.stdout.as_ref()),
            ("stderr", spec.stderr.as_ref()),
        ] {
            if let Some(path) = path {
                if path.len() > MAX_PATH_BYTES {
                    return Err(Rejection::too_large(
                        format!("{field} length"),
                        path.len() as u64,
                        MAX_PATH_BYTES as u64,
                    ));
                }
                if path.contains('\0') {
                    return Err(Rejection::invalid(field, "contains a NUL byte"));
                }
            }
        }
        if !spec.work_dir.starts_with('/') {
            return Err(Rejection::invalid(
                "work_dir",
                format!("{:?} is not an absolute path", spec.work_dir),
            ));
        }
        Ok(())
    }

    /// Counts that make sense together, nice and factor within range (a negative nice is
    /// an administrator's).
    fn check_counts(spec: &JobSpec, admin: bool) -> Result<(), Rejection> {
        if spec.nodes == 0 {
            return Err(Rejection::invalid("nodes", "must be at least 1"));
        }
        if spec.ntasks == 0 {
            return Err(Rejection::invalid("ntasks", "must be at least 1"));
        }
        if spec.cpus_per_task == 0 {
            return Err(Rejection::invalid("cpus_per_task", "must be at least 1"));
        }
        if spec.ntasks < spec.nodes {
            return Err(Rejection::invalid(
                "ntasks",
                format!("{} tasks cannot fill {} nodes", spec.ntasks, spec.nodes),
            ));
        }
        if let Some(per_node) = spec.ntasks_per_node {
            let room = u64::from(per_node) * u64::from(spec.nodes);
            if per_node == 0 || room < u64::from(spec.ntasks) {
                return Err(Rejection::invalid(
                    "ntasks_per_node",
                    format!(
                        "{per_node} per node on {} nodes cannot hold {} tasks",
                        spec.nodes, spec.ntasks
                    ),
                ));
            }
        }
        if spec.nice.unsigned_abs() > MAX_NICE.unsigned_abs() {
            return Err(Rejection::too_large(
                "nice",
                u64::from(spec.nice.unsigned_abs()),
                MAX_NICE as u64,
            ));
        }
        if spec.nice < 0 && !admin {
            return Err(Rejection::NotPermitted(
                "only an administrator may set a negative nice".into(),
            ));
        }
        if spec.user_factor_pct > 100 {
            return Err(Rejection::too_large(
                "user_factor_pct",
                u64::from(spec.user_factor_pct),
                100,
            ));
        }
        Ok(())
    }

    /// An array within `MaxArraySize` (its count and its largest index).
    fn check_array(&self, spec: &JobSpec) -> Result<(), Rejection> {
        if let Some(a) = &spec.array {
            if a.indexes.is_empty() {
                return Err(Rejection::invalid("array", "has no indexes"));
            }
            let max = u64::from(self.config.max_array_size);
            if a.indexes.len() > max {
                return Err(Rejection::too_large("array size", a.indexes.len(), max));
            }
            if let Some(last) = a.indexes.last()
                && u64::from(last) >= max
            {
                return Err(Rejection::too_large(
                    "array index (MaxArraySize - 1)",
                    u64::from(last),
                    max - 1,
                ));
            }
        }
        Ok(())
    }

    /// The association of the spec's user with its account (the user's default account when
    /// none is named), and that account.
    fn membership(&self, spec: &JobSpec) -> Result<(AssocId, AccountName), Rejection> {
        let user = self
            .users
            .get(&spec.user)
            .ok_or_else(|| Rejection::unknown("user", &spec.user))?;
        let account = spec
            .account
            .clone()
            .unwrap_or_else(|| user.user.default_account.clone());
        // Membership is the association, which has an id exactly when it exists (and
        // then so does its account).
        let Some(assoc) = user.assoc(&account) else {
            if self.accounts.get(&account).is_none() {
                return Err(Rejection::unknown("account", &account));
            }
            return Err(Rejection::NotPermitted(format!(
                "user {} is not a member of account {account}",
                spec.user
            )));
        };
        Ok((assoc, account))
    }

    /// The partition named, else the default one; the account must be allowed there.
    fn partition_for(
        &self,
        spec: &JobSpec,
        account: &AccountName,
    ) -> Result<&Partition, Rejection> {
        let partition = match &spec.partition {
            Some(p) => self
                .partitions
                .get(p)
                .ok_or_else(|| Rejection::unknown("partition", p))?,
            None => self.default_partition().ok_or_else(|| {
                Rejection::invalid("partition", "none given and no default partition is set")
            })?,
        };
        if !partition.allows_account(account) {
            return Err(Rejection::NotPermitted(format!(
                "account {account} may not use partition {}",
                partition.name
            )));
        }
        Ok(partition)
    }

    /// The QOS named, else the partition's default, else the site's; allowed in the partition.
    fn qos_for<'s>(
        &'s self,
        spec: &JobSpec,
        partition: &Partition,
    ) -> Result<(QosName, &'s Qos), Rejection> {
        let qos = spec
            .qos
            .clone()
            .or_else(|| partition.default_qos.clone())
            .unwrap_or_else(|| self.config.default_qos.clone());
        let q = self
            .qos
            .get(&qos)
            .ok_or_else(|| Rejection::unknown("qos", &qos))?;
        if !partition.allows_qos(&qos) {
            return Err(Rejection::NotPermitted(format!(
                "qos {qos} is not allowed in partition {}",
                partition.name
            )));
        }
        Ok((qos, q))
    }

    /// The request, else the partition default, else its max; capped by the partition, the
    /// QOS and the site.
    fn time_limit_for(
        &self,
        spec: &JobSpec,
        partition: &Partition,
        q: &Qos,
    ) -> Result<Option<Seconds>, Rejection> {
        // Time limit: the request, else the partition default, else its max; capped by the
        // partition, the QOS and the site.
        let time_limit = match spec.time {
            TimeRequest::Limit(t) if t.0 == 0 => {
                return Err(Rejection::invalid("time", "a limit of 0 s; use Unlimited"));
            }
            TimeRequest::Limit(t) => Some(t),
            TimeRequest::Default => partition.default_time.or(partition.max_time),
            TimeRequest::Unlimited => partition.max_time,
        };
        let caps = [
            ("time (partition MaxTime)", partition.max_time),
            ("time (QOS MaxWall)", q.limits.max_wall),
            ("time (site maximum walltime)", self.config.max_walltime),
        ];
        let time_limit = match time_limit {
            Some(t) => {
                for (field, cap) in caps {
                    if let Some(cap) = cap
                        && t > cap
                    {
                        return Err(Rejection::too_large(field, t.0, cap.0));
                    }
                }
                Some(t)
            }
            // Unlimited only where nothing caps it; otherwise the tightest cap.
            None => caps.iter().filter_map(|(_, cap)| *cap).min(),
        };
        Ok(time_limit)
    }

    /// Enough usable nodes in the partition (its `MaxNodes`, the features and exclusions
    /// asked for), and a node list within it.
    fn check_node_count(
        &self,
        spec: &JobSpec,
        partition: &Partition,
    ) -> Result<NodeCaps, Rejection> {
        // Nodes: enough in the partition, and each node big enough for one node's share.
        let caps = match self.partition_caps.get(&partition.name) {
            Some(c) if spec.features.is_empty() && spec.exclude.is_empty() => *c,
            _ => self.node_caps(partition, Some(spec)),
        };
        if let Some(max) = partition.max_nodes
            && spec.nodes > max
        {
            return Err(Rejection::too_large(
                "nodes (partition MaxNodes)",
                u64::from(spec.nodes),
                u64::from(max),
            ));
        }
        if caps.count < u64::from(spec.nodes) {
            return Err(Rejection::too_large(
                format!(
                    "nodes (usable nodes in partition {} with the requested features)",
                    partition.name
                ),
                u64::from(spec.nodes),
                caps.count,
            ));
        }
        for n in &spec.nodelist {
            if !partition.nodes.contains(n) {
                return Err(Rejection::invalid(
                    "nodelist",
                    format!("node {n} is not in partition {}", partition.name),
                ));
            }
            if spec.exclude.contains(n) {
                return Err(Rejection::invalid(
                    "nodelist",
                    format!("node {n} is both requested and excluded"),
                ));
            }
        }
        Ok(caps)
    }

    /// Each node big enough for one node's share of cpus, gpus, memory and jobfs; the memory
    /// and jobfs requests with their defaults.
    fn check_per_node(
        &self,
        spec: &JobSpec,
        partition: &Partition,
        caps: NodeCaps,
    ) -> Result<(MemoryRequest, MiB), Rejection> {
        let tasks_per_node = u64::from(spec.ntasks).div_ceil(u64::from(spec.nodes));
        let cpus_per_node = tasks_per_node * u64::from(spec.cpus_per_task);
        let biggest_cpus = caps.cpus;
        if cpus_per_node > u64::from(biggest_cpus) {
            return Err(Rejection::too_large(
                format!("cpus per node (largest node in {})", partition.name),
                cpus_per_node,
                u64::from(biggest_cpus),
            ));
        }
        if spec.gpus_per_node > caps.gpus {
            return Err(Rejection::too_large(
                format!("gpus per node (largest node in {})", partition.name),
                u64::from(spec.gpus_per_node),
                u64::from(caps.gpus),
            ));
        }
        let memory = match spec.memory {
            Some(m) => m,
            None => match partition.def_mem_per_cpu {
                Some(per_cpu) => MemoryRequest::PerCpu(per_cpu),
                None => MemoryRequest::WholeNode,
            },
        };
        let mem_per_node = match memory {
            MemoryRequest::PerNode(m) => Some(m),
            // An overflowing product is larger than any node: refused just below.
            MemoryRequest::PerCpu(m) => Some(m.checked_mul(cpus_per_node).unwrap_or(MiB(u64::MAX))),
            MemoryRequest::WholeNode => None,
        };
        let biggest_mem = caps.memory;
        if let Some(m) = mem_per_node
            && m > biggest_mem
        {
            return Err(Rejection::too_large(
                format!(
                    "memory per node in MiB (largest node in {})",
                    partition.name
                ),
                m.0,
                biggest_mem.0,
            ));
        }
        if let Some(v) = spec.vmem
            && let Some(m) = mem_per_node
            && v < m
        {
            return Err(Rejection::invalid(
                "vmem",
                format!("{v} is below the memory request {m}"),
            ));
        }
        let jobfs = spec.jobfs.unwrap_or(self.config.default_jobfs);
        let biggest_jobfs = caps.jobfs;
        if jobfs > biggest_jobfs {
            return Err(Rejection::too_large(
                format!("jobfs per node in MiB (largest in {})", partition.name),
                jobfs.0,
                biggest_jobfs.0,
            ));
        }
        Ok((memory, jobfs))
    }

    /// The reservation named admits the user or account, holds enough of the partition's
    /// nodes, and its window holds the time limit.
    fn check_reservation(
        &self,
        spec: &JobSpec,
        account: &AccountName,
        partition: &Partition,
        time_limit: Option<Seconds>,
    ) -> Result<(), Rejection> {
        if let Some(name) = &spec.reservation {
            let r = self
                .reservations
                .get(name)
                .ok_or_else(|| Rejection::unknown("reservation", name))?;
            if !r.admits(&spec.user, account) {
                return Err(Rejection::NotPermitted(format!(
                    "reservation {name} admits neither user {} nor account {account}",
                    spec.user
                )));
            }
            let usable = r
                .nodes
                .iter()
                .filter(|n| partition.nodes.contains(*n))
                .count() as u64;
            if usable < u64::from(spec.nodes) {
                return Err(Rejection::too_large(
                    format!(
                        "nodes (reservation {name}'s nodes in partition {})",
                        partition.name
                    ),
                    u64::from(spec.nodes),
                    usable,
                ));
            }
            let window = r.end.since(r.start);
            match time_limit {
                Some(t) if t <= window => {}
                _ => {
                    return Err(Rejection::too_large(
                        format!("time (reservation {name}'s window, s)"),
                        time_limit.map_or(u64::MAX, |t| t.0),
                        window.0,
                    ));
                }
            }
        }
        Ok(())
    }

    /// The QOS's and the partition's `MaxSubmitJobsPerUser` (Slurm refuses the submission
    /// rather than queueing it).
    fn check_submit_limits(
        &self,
        spec: &JobSpec,
        partition: &Partition,
        qos: &QosName,
        q: &Qos,
    ) -> Result<(), Rejection> {
        // QOS submit limit (Slurm refuses the submission rather than queueing it).
        if let Some(max) = q.limits.max_submit_jobs_per_user {
            let queued = self
                .live_jobs_of(&spec.user)
                .filter(|j| j.resolved.qos == *qos)
                .count() as u64;
            if queued >= u64::from(max) {
                return Err(Rejection::too_large(
                    format!(
                        "jobs of user {} in qos {qos} (MaxSubmitJobsPerUser)",
                        spec.user
                    ),
                    queued + 1,
                    u64::from(max),
                ));
            }
        }
        if let Some(max) = partition.limits.max_submit_jobs_per_user {
            let queued = self
                .live_jobs_of(&spec.user)
                .filter(|j| j.resolved.partition == partition.name)
                .count() as u64;
            if queued >= u64::from(max) {
                return Err(Rejection::too_large(
                    format!(
                        "jobs of user {} in partition {} (MaxSubmitJobsPerUser)",
                        spec.user, partition.name
                    ),
                    queued + 1,
                    u64::from(max),
                ));
            }
        }
        Ok(())
    }
}
