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
use crate::job::{ArrayPart, BlobId, Job, JobSpec, JobState, Part, Reason};
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
    /// How many nodes.
    pub(crate) count: u64,
    /// The largest of each resource on one of them.
    pub(crate) cpus: u32,
    pub(crate) memory: MiB,
    pub(crate) jobfs: MiB,
    pub(crate) gpus: u32,
}

/// A batch's accepted jobs grouped by owner, without an allocation per owner: each user's
/// jobs are chained through `next`, then laid out group after group in one vector.
struct NewJobsByUser {
    /// Per user: (first, last) position in `ids`.
    ends: NameMap<UserName, (usize, usize)>,
    ids: Vec<JobId>,
    next: Vec<usize>,
}

impl NewJobsByUser {
    fn with_capacity(jobs: usize) -> Self {
        NewJobsByUser {
            ends: NameMap::with_capacity_and_hasher(jobs, Default::default()),
            ids: Vec::with_capacity(jobs),
            next: Vec::with_capacity(jobs),
        }
    }

    fn push(&mut self, user: &UserName, id: JobId) {
        let at = self.ids.len();
        self.ids.push(id);
        self.next.push(usize::MAX);
        match self.ends.get_mut(user) {
            Some((_, last)) => {
                self.next[*last] = at;
                *last = at;
            }
            None => {
                self.ends.insert(user.clone(), (at, at));
            }
        }
    }

    /// Each user with the range of `ids` holding their jobs in submission order; users in
    /// the order of their first job (never hash order).
    fn into_groups(self) -> (Vec<(UserName, std::ops::Range<usize>)>, Vec<JobId>) {
        let mut firsts: Vec<(usize, UserName)> = self
            .ends
            .into_iter()
            .map(|(u, (first, _))| (first, u))
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
        blobs: Vec<Vec<u8>>,
        jobs: Vec<JobSpec>,
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
        for (i, data) in blobs.into_iter().enumerate() {
            if data.len() as u64 > self.config.max_blob_bytes {
                return Err(Rejection::too_large(
                    format!("blob {i} size in bytes"),
                    data.len() as u64,
                    self.config.max_blob_bytes,
                ));
            }
            let id = BlobId::of(&data);
            if let std::collections::btree_map::Entry::Vacant(slot) = self.blobs.entry(id) {
                slot.insert(Blob { data, refs: 0 });
                offered.insert(id);
            }
        }
        let admin = self.is_admin(actor);
        let mut results = Vec::with_capacity(jobs.len());
        let mut accepted = Vec::with_capacity(jobs.len());
        for spec in jobs {
            let result = self.submit_one(actor, admin, spec, now);
            if let Ok(id) = result {
                accepted.push(id);
            }
            results.push(result);
        }
        // Blobs that came with this command but that no accepted job uses are not kept.
        for id in offered {
            if self.blobs.get(&id).is_some_and(|b| b.refs == 0) {
                self.blobs.remove(&id);
            }
        }
        if accepted.is_empty() {
            return Ok(Response::Submitted(results));
        }
        let running = self.summary_for_new_jobs(now);
        let user_of = |id: &JobId| self.jobs.get(id).map(|j| &j.spec.user);
        let first_user = user_of(&accepted[0]).cloned();
        match first_user {
            // One user's jobs, as nearly every submission is (one job, from `sbatch`):
            // placed as they are, without grouping them first (six allocations a submission).
            Some(user) if accepted.iter().all(|id| user_of(id) == Some(&user)) => {
                self.place_new(&user, &accepted, &running, now);
            }
            _ => {
                let mut grouped = NewJobsByUser::with_capacity(accepted.len());
                for id in &accepted {
                    if let Some(user) = user_of(id) {
                        grouped.push(user, *id);
                    }
                }
                let (users, ids) = grouped.into_groups();
                for (user, range) in users {
                    self.place_new(&user, &ids[range], &running, now);
                }
            }
        }
        Ok(Response::Submitted(results))
    }

    fn submit_one(
        &mut self,
        actor: &Actor,
        admin: bool,
        spec: JobSpec,
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
        let resolved = self.resolve(&spec, admin)?;
        self.check_dependency_targets(&spec)?;
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
            self.check_user_caps(&spec)?;
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
        let hold = spec.hold.then_some(crate::job::Hold::User);
        let job = Job {
            id,
            spec: Box::new(spec),
            resolved,
            state: JobState::Pending,
            reason: Reason::None,
            hold,
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

    /// What the nodes of `partition` usable by `spec` (features, exclusions) offer; with no
    /// spec, what all of them offer.
    pub(crate) fn node_caps(&self, partition: &Partition, spec: Option<&JobSpec>) -> NodeCaps {
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
