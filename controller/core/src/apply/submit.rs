//! Submission: validate each job, resolve its defaults, give it an id, and place it in the
//! queue with the reason that applies.
//!
//! One command carries a whole batch (group commit puts many clients' submissions in one log
//! entry). Each job is accepted or rejected on its own, and a rejected job leaves no trace:
//! its id is not consumed and blobs only it referenced are not kept.

use std::collections::{BTreeMap, BTreeSet};

use crate::apply::{Rejection, Response};
use crate::command::Actor;
use crate::ids::{JobId, PartitionName, UserName};
use crate::job::{
    ArrayPart, BlobId, Job, JobSpec, JobState, MemoryRequest, Part, Reason, Resolved, TimeRequest,
};
use crate::lookup::NameMap;
use crate::partition::Partition;
use crate::quantity::{MiB, Seconds, TimeMs};
use crate::state::{Blob, State};

/// Longest job name, output path or working directory accepted.
pub const MAX_NAME_BYTES: usize = 256;
pub const MAX_PATH_BYTES: usize = 4096;
/// The nice range Slurm accepts.
pub const MAX_NICE: i32 = 2_147_483_645;

/// What the usable nodes of a partition offer one job: how many, and the largest of each
/// resource. Kept per partition in [`State::partition_caps`] for jobs that name no features
/// and exclude no nodes (computing it walks the partition's nodes, which every one-job
/// submission on every replica did), computed per job for the others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NodeCaps {
    count: u64,
    cpus: u32,
    memory: MiB,
    jobfs: MiB,
    gpus: u32,
}

/// A batch's accepted jobs grouped by owner, without an allocation per owner: each user's
/// jobs are chained through `next`, then laid out group after group in one vector.
struct NewJobsByUser<'a> {
    /// Per user: (first, last) position in `ids`. Names are borrowed from the command.
    ends: NameMap<&'a UserName, (usize, usize)>,
    ids: Vec<JobId>,
    next: Vec<usize>,
}

impl<'a> NewJobsByUser<'a> {
    fn with_capacity(jobs: usize) -> Self {
        NewJobsByUser {
            ends: NameMap::with_capacity_and_hasher(jobs, Default::default()),
            ids: Vec::with_capacity(jobs),
            next: Vec::with_capacity(jobs),
        }
    }

    fn push(&mut self, user: &'a UserName, id: JobId) {
        let at = self.ids.len();
        self.ids.push(id);
        self.next.push(usize::MAX);
        match self.ends.get_mut(user) {
            Some((_, last)) => {
                self.next[*last] = at;
                *last = at;
            }
            None => {
                self.ends.insert(user, (at, at));
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Each user with the range of `ids` holding their jobs in submission order; users in
    /// the order of their first job (never hash order).
    fn into_groups(self) -> (Vec<(&'a UserName, std::ops::Range<usize>)>, Vec<JobId>) {
        let mut firsts: Vec<(usize, &'a UserName)> = self
            .ends
            .iter()
            .map(|(u, (first, _))| (*first, *u))
            .collect();
        firsts.sort_unstable_by_key(|(first, _)| *first);
        let mut ids = Vec::with_capacity(self.ids.len());
        let mut groups = Vec::with_capacity(firsts.len());
        for (first, user) in firsts {
            let start = ids.len();
            let mut at = first;
            while at != usize::MAX {
                ids.push(self.ids[at]);
                at = self.next[at];
            }
            groups.push((user, start..ids.len()));
        }
        (groups, ids)
    }
}

impl State {
    pub(crate) fn submit_jobs(
        &mut self,
        actor: &Actor,
        blobs: &[Vec<u8>],
        jobs: &[JobSpec],
        now: TimeMs,
    ) -> Result<Response, Rejection> {
        if jobs.len() as u64 > u64::from(self.config.max_batch) {
            return Err(Rejection::too_large(
                "jobs per submission",
                jobs.len() as u64,
                u64::from(self.config.max_batch),
            ));
        }
        let mut offered = BTreeSet::new();
        for (i, data) in blobs.iter().enumerate() {
            if data.len() as u64 > self.config.max_blob_bytes {
                return Err(Rejection::too_large(
                    format!("blob {i} size in bytes"),
                    data.len() as u64,
                    self.config.max_blob_bytes,
                ));
            }
            let id = BlobId::of(data);
            if let std::collections::btree_map::Entry::Vacant(slot) = self.blobs.entry(id) {
                slot.insert(Blob {
                    data: data.clone(),
                    refs: 0,
                });
                offered.insert(id);
            }
        }
        let admin = self.is_admin(actor);
        let mut results = Vec::with_capacity(jobs.len());
        let mut grouped = NewJobsByUser::with_capacity(jobs.len());
        for spec in jobs {
            let result = self.submit_one(actor, admin, spec, now);
            if let Ok(id) = result {
                grouped.push(&spec.user, id);
            }
            results.push(result);
        }
        // Blobs that came with this command but that no accepted job uses are not kept.
        for id in offered {
            if self.blobs.get(&id).is_some_and(|b| b.refs == 0) {
                self.blobs.remove(&id);
            }
        }
        if !grouped.is_empty() {
            let running = self.summary_for_new_jobs(now);
            let (users, ids) = grouped.into_groups();
            for (user, range) in users {
                self.place_new(user, &ids[range], &running, now);
            }
        }
        Ok(Response::Submitted(results))
    }

    fn submit_one(
        &mut self,
        actor: &Actor,
        admin: bool,
        spec: &JobSpec,
        now: TimeMs,
    ) -> Result<JobId, Rejection> {
        if let Actor::User(u) = actor
            && u != &spec.user
            && !admin
        {
            return Err(Rejection::NotPermitted(format!(
                "user {u} cannot submit jobs as {}",
                spec.user
            )));
        }
        let live = self.jobs.len() as u64;
        if live >= self.config.max_job_count {
            return Err(Rejection::too_large(
                "jobs in the queue (MaxJobCount)",
                live + 1,
                self.config.max_job_count,
            ));
        }
        let resolved = self.resolve(spec, admin)?;
        self.check_dependency_targets(spec)?;
        let blob_refs =
            std::iter::once(("script", spec.script)).chain(spec.env.map(|env| ("env", env)));
        for (field, b) in blob_refs.clone() {
            if !self.blobs.contains_key(&b) {
                return Err(Rejection::invalid(
                    field,
                    format!("blob {b} was neither sent with the job nor stored"),
                ));
            }
        }
        if !admin {
            self.check_user_caps(spec)?;
        }
        // Accepted: nothing below can fail.
        for (_, b) in blob_refs {
            self.retain_blob(&spec.user, b);
        }
        let id = JobId(self.next_job_id);
        self.next_job_id += 1;
        let array = spec.array.as_ref().map(|a| ArrayPart::Master {
            pending: a.indexes.clone(),
            throttle: a.throttle,
        });
        let predicted = crate::predict::predict(
            self.config.sched.runtime_predictor,
            self.users.get(&spec.user).map(|u| &u.recent_runtimes),
            resolved.time_limit,
        );
        let job = Job {
            id,
            spec: spec.clone(),
            resolved,
            state: JobState::Pending,
            reason: Reason::None,
            hold: spec.hold.then_some(crate::job::Hold::User),
            part: Part::New,
            array,
            submit_time: now,
            eligible_since: None,
            eligible_accrued: Seconds::ZERO,
            start_time: None,
            end_time: None,
            suspended_total: Seconds::ZERO,
            suspended_since: None,
            usage_until: None,
            alloc: None,
            requeue_count: 0,
            exit: None,
            end_cause: None,
            site_priority: 0,
            bypass_count: 0,
            preempted: None,
            steps: Default::default(),
            completed_with: None,
            ran_on: None,
            predicted,
        };
        self.index_live(&job);
        self.relations.add(&job);
        self.jobs.insert(id, Box::new(job));
        Ok(id)
    }

    /// The site's per-user caps on queued work (admins are exempt): job records, and bytes of
    /// distinct scripts and environments.
    fn check_user_caps(&self, spec: &JobSpec) -> Result<(), Rejection> {
        let caps = self.config.user_caps;
        let entry = self.users.get(&spec.user);
        if let Some(max) = caps.max_jobs {
            let live = entry.map_or(0, |e| e.live.len() as u64);
            if live >= u64::from(max) {
                return Err(Rejection::too_large(
                    format!(
                        "jobs queued or running for user {} (MaxSubmitJobsPerUser)",
                        spec.user
                    ),
                    live + 1,
                    u64::from(max),
                ));
            }
        }
        if let Some(max) = caps.max_script_bytes {
            let held = |id: &BlobId| entry.is_some_and(|e| e.stored.contains_key(id));
            let mut new = 0u64;
            for id in std::iter::once(spec.script).chain(spec.env) {
                if !held(&id) {
                    new += self.blobs.get(&id).map_or(0, |b| b.data.len() as u64);
                }
            }
            let stored = entry.map_or(0, |e| e.stored_bytes);
            if new > 0 && stored + new > max {
                return Err(Rejection::too_large(
                    format!(
                        "bytes of scripts and environments stored for user {} \
                         (MaxScriptBytesPerUser)",
                        spec.user
                    ),
                    stored + new,
                    max,
                ));
            }
        }
        Ok(())
    }

    /// Checks a spec and fills in its defaults from partition, association and config.
    fn resolve(&self, spec: &JobSpec, admin: bool) -> Result<Resolved, Rejection> {
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
        let partition = match &spec.partition {
            Some(p) => self
                .partitions
                .get(p)
                .ok_or_else(|| Rejection::unknown("partition", p))?,
            None => self.default_partition().ok_or_else(|| {
                Rejection::invalid("partition", "none given and no default partition is set")
            })?,
        };
        if !partition.allows_account(&account) {
            return Err(Rejection::NotPermitted(format!(
                "account {account} may not use partition {}",
                partition.name
            )));
        }
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
        if let Some(name) = &spec.reservation {
            let r = self
                .reservations
                .get(name)
                .ok_or_else(|| Rejection::unknown("reservation", name))?;
            if !r.admits(&spec.user, &account) {
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
        // QOS submit limit (Slurm refuses the submission rather than queueing it).
        if let Some(max) = q.limits.max_submit_jobs_per_user {
            let queued = self
                .live_jobs_of(&spec.user)
                .filter(|j| j.resolved.qos == qos)
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

    /// What the nodes of `partition` usable by `spec` (features, exclusions) offer; with no
    /// spec, what all of them offer.
    fn node_caps(&self, partition: &Partition, spec: Option<&JobSpec>) -> NodeCaps {
        let mut caps = NodeCaps::default();
        for node in partition
            .nodes
            .iter()
            .filter(|n| spec.is_none_or(|s| !s.exclude.contains(*n)))
            .filter_map(|n| self.nodes.get(n))
            .filter(|n| spec.is_none_or(|s| s.features.is_subset(&n.spec.features)))
        {
            caps.count += 1;
            caps.cpus = caps.cpus.max(node.spec.cpus);
            caps.memory = caps.memory.max(node.spec.memory);
            caps.jobfs = caps.jobfs.max(node.spec.jobfs);
            caps.gpus = caps.gpus.max(node.spec.gpus);
        }
        caps
    }

    /// What each partition's nodes offer a job that names no features and excludes no
    /// nodes (derived: [`State::partition_caps`]).
    pub(crate) fn compute_partition_caps(&self) -> BTreeMap<PartitionName, NodeCaps> {
        self.partitions
            .values()
            .map(|p| (p.name.clone(), self.node_caps(p, None)))
            .collect()
    }

    /// Dependencies must name jobs that exist (or existed: ids below the next id).
    fn check_dependency_targets(&self, spec: &JobSpec) -> Result<(), Rejection> {
        let Some(dep) = &spec.dependency else {
            return Ok(());
        };
        for target in dep.targets() {
            if target.job.0 >= self.next_job_id || target.job.0 == 0 {
                return Err(Rejection::invalid(
                    "dependency",
                    format!("job {target} does not exist"),
                ));
            }
        }
        Ok(())
    }
}

/// A line of text a person will read in listings: at most `max` bytes, no control characters
/// (a terminal escape in a job's name or comment would act on whoever lists the queue).
pub(crate) fn check_text(field: &str, text: &str, max: usize) -> Result<(), Rejection> {
    if text.len() > max {
        return Err(Rejection::too_large(
            format!("{field} length"),
            text.len() as u64,
            max as u64,
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(Rejection::invalid(field, "contains control characters"));
    }
    Ok(())
}

/// A job's comment: [`check_text`], and none of the invisible characters that reorder or hide
/// what a terminal shows (bidirectional overrides and isolates, zero-width characters, line
/// and paragraph separators), which would let a comment disguise the lines around it.
pub(crate) fn check_comment(text: &str) -> Result<(), Rejection> {
    check_text("comment", text, crate::job::spec::MAX_COMMENT)?;
    let hidden = |c: char| {
        matches!(
            c,
            '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2069}'
                | '\u{FEFF}'
        )
    };
    if let Some(c) = text.chars().find(|c| hidden(*c)) {
        return Err(Rejection::invalid(
            "comment",
            format!("contains the invisible character U+{:04X}", u32::from(c)),
        ));
    }
    Ok(())
}
