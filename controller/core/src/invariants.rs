//! The invariants of replicated state, written down and checked.
//!
//! `check_invariants` runs in tests after every applied command and after every snapshot
//! restore; a violation is a bug in apply, never a user error. Each check names what broke.
//!
//! 1. The account tree is well-formed (see `account`); every user's default account exists
//!    and has the user as a member.
//! 2. Every partition's nodes exist; at most one partition is the default; every
//!    reservation's window is non-empty and its nodes, users and accounts exist.
//! 3. Job ids are keys, below `next_job_id`; live jobs name a user, account, partition and
//!    QOS that exist, and want at least one cpu on each of their nodes (at least one node,
//!    at least as many tasks as nodes, at least one cpu per task): the planners' checks for
//!    room now (`Pool::room_now`, `State::may_start_anything`) rely on it.
//! 4. A job holds an allocation exactly when its state holds resources, and every node lists
//!    exactly the jobs whose allocations name it, with the same amounts; no node is
//!    overcommitted, and an exclusive job is alone on its nodes.
//! 5. A job is suspended exactly when its suspension clock runs. Terminal jobs have an end time; pending jobs have no start time; an array master has
//!    pending indexes in canonical form.
//! 6. Pending jobs accrue eligible time exactly when idle with no reason but the
//!    scheduler's own (Resources, Priority); per-user idle and
//!    running+idle counts respect the configured caps.
//! 7. Blob reference counts equal the number of jobs referencing each blob, none is zero, and
//!    every referenced blob exists.
//! 8. The derived indexes equal their recomputation; association ids name exactly the
//!    associations that exist, and every live job's id names its own association.
//! 9. Placement is current: re-placing the whole queue now would change no pending job's
//!    part or reason. After a change apply re-places only the users, or where nothing ties
//!    a user's jobs together only the jobs, it can affect (`State::note_changed`); this is
//!    what proves it missed nobody. Users whose placement
//!    depends on the clock (begin times, `after:+delay`, MAXPS and cpu-run-minute limits,
//!    which running jobs' remaining time changes) are re-placed by every `Tick` instead, so
//!    their placement may lag until the next one and is not compared.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::UserName;
use crate::job::{ArrayPart, BlobId, JobState, Part};
use crate::state::State;

/// A broken invariant: what and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invariant violated: {0}")]
pub struct InvariantViolation(pub String);

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(InvariantViolation(format!($($msg)+)));
        }
    };
}

impl State {
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.accounts
            .check()
            .map_err(|e| InvariantViolation(e.to_string()))?;
        self.check_users_and_accounts()?;
        self.check_partitions_and_reservations()?;
        self.check_jobs()?;
        self.check_placement_current()?;
        self.check_nodes()?;
        self.check_queue_caps()?;
        self.check_blobs()?;
        self.check_user_indexes()?;
        self.check_derived_indexes()
    }

    /// Users are keyed by name and members of their default account; accounts list known
    /// users only.
    fn check_users_and_accounts(&self) -> Result<(), InvariantViolation> {
        for (name, entry) in &self.users {
            let user = &entry.user;
            ensure!(
                &user.name == name,
                "user key {name} holds user {}",
                user.name
            );
            let member = self
                .accounts
                .get(&user.default_account)
                .is_some_and(|a| a.users.contains_key(name));
            ensure!(
                member,
                "user {name}'s default account {} lacks them",
                user.default_account
            );
        }
        for a in self.accounts.accounts.values() {
            for u in a.users.keys() {
                ensure!(
                    self.users.contains_key(u),
                    "account {} has unknown user {u}",
                    a.name
                );
            }
        }
        Ok(())
    }

    /// Partitions and reservations name known nodes, users and accounts; reservations end
    /// after they start; one default partition at most. Nodes and partitions are keyed by
    /// their own names (a pass finds them by binary search in key order).
    fn check_partitions_and_reservations(&self) -> Result<(), InvariantViolation> {
        for (key, n) in &self.nodes {
            ensure!(
                key == &n.spec.name,
                "node key {key} holds node {}",
                n.spec.name
            );
        }
        for (key, p) in &self.partitions {
            ensure!(
                key == &p.name,
                "partition key {key} holds partition {}",
                p.name
            );
        }
        for p in self.partitions.values() {
            for n in &p.nodes {
                ensure!(
                    self.nodes.contains_key(n),
                    "partition {} lists unknown node {n}",
                    p.name
                );
            }
        }
        for r in self.reservations.values() {
            ensure!(
                r.start < r.end,
                "reservation {} ends before it starts",
                r.name
            );
            for n in &r.nodes {
                ensure!(
                    self.nodes.contains_key(n),
                    "reservation {} holds unknown node {n}",
                    r.name
                );
            }
            for u in &r.users {
                ensure!(
                    self.users.contains_key(u),
                    "reservation {} admits unknown user {u}",
                    r.name
                );
            }
            for a in &r.accounts {
                ensure!(
                    self.accounts.get(a).is_some(),
                    "reservation {} admits unknown account {a}",
                    r.name
                );
            }
        }
        let defaults = self.partitions.values().filter(|p| p.is_default).count();
        ensure!(defaults <= 1, "{defaults} default partitions");
        Ok(())
    }

    /// Each user's stored-blobs, live-jobs and association indexes match a fresh count.
    fn check_user_indexes(&self) -> Result<(), InvariantViolation> {
        let (live, assocs) = self.compute_user_index();
        let stored = self.compute_stored();
        for (name, entry) in &self.users {
            let (held, bytes) = stored.get(name).cloned().unwrap_or_default();
            ensure!(
                held == entry.stored && bytes == entry.stored_bytes,
                "user {name}'s stored-blobs index differs from the jobs"
            );
            ensure!(
                live.get(name).unwrap_or(&BTreeSet::new()) == &entry.live,
                "user {name}'s live-jobs index differs from the jobs"
            );
            ensure!(
                assocs.get(name).map_or(&[][..], Vec::as_slice) == entry.assocs.as_slice(),
                "user {name}'s association index differs from the association table"
            );
        }
        Ok(())
    }

    /// Every index derived from the jobs and the configuration equals a fresh computation.
    fn check_derived_indexes(&self) -> Result<(), InvariantViolation> {
        ensure!(
            self.holding == self.compute_holding(),
            "holding index differs from the jobs"
        );
        ensure!(
            self.suspended_shares == self.compute_suspended_shares(),
            "the index of suspended shares differs from the nodes"
        );
        ensure!(
            self.queue_index == self.compute_queue_index(),
            "queue order index differs from the idle jobs"
        );
        ensure!(
            self.relations == crate::relations::Relations::compute(self.jobs.values()),
            "dependents/array-tasks index differs from the jobs"
        );
        ensure!(
            self.returns == self.compute_returns(),
            "the index of running jobs' returns differs from the nodes and jobs"
        );
        ensure!(
            self.ended == self.compute_ended(),
            "ended-jobs index differs from the terminal jobs"
        );
        ensure!(
            self.clocked == self.compute_clocked(),
            "the tick's index of clocked jobs differs from the pending jobs"
        );
        ensure!(
            self.running_summary(self.applied.now) == self.running_summary_walked(self.applied.now),
            "the running summary from the arrays' task index differs from the running jobs"
        );
        ensure!(
            self.partition_caps == self.compute_partition_caps(),
            "the partitions' node capacities differ from the nodes and partitions"
        );
        ensure!(
            self.partition_members == self.compute_partition_members(),
            "the partitions' member places differ from the nodes and partitions"
        );
        // A rule the cache lacks would skip a limit; one it keeps after the limit went
        // away only costs a lookup.
        ensure!(
            self.account_rules
                .covers(&crate::policy::AccountRules::of(self)),
            "the account-rules cache misses a limit the configuration has"
        );
        Ok(())
    }

    fn check_jobs(&self) -> Result<(), InvariantViolation> {
        ensure!(
            self.jobs.check(),
            "the job table's ordered ids are not its jobs' ids"
        );
        for (id, job) in self.jobs.iter() {
            ensure!(&job.id == id, "job key {id} holds job {}", job.id);
            ensure!(
                id.0 < self.next_job_id,
                "job {id} is not below next_job_id {}",
                self.next_job_id
            );
            ensure!(
                job.state.holds_resources() == job.alloc.is_some(),
                "job {id} is {} with allocation {:?}",
                job.state,
                job.alloc.is_some()
            );
            ensure!(
                job.suspended_since.is_some() == (job.state == JobState::Suspended),
                "job {id} is {} with suspended_since {:?}",
                job.state,
                job.suspended_since
            );
            if job.state.is_terminal() {
                ensure!(job.end_time.is_some(), "terminal job {id} has no end time");
            } else {
                self.check_live_job_names(job)?;
                let spec = &job.spec;
                ensure!(
                    spec.nodes >= 1 && spec.ntasks >= spec.nodes && spec.cpus_per_task >= 1,
                    "job {id} wants no cpu on some node: {} nodes, {} tasks, {} cpus per task",
                    spec.nodes,
                    spec.ntasks,
                    spec.cpus_per_task
                );
            }
            check_pending_clock(job)?;
            check_array_part(job)?;
            check_steps(job)?;
        }
        Ok(())
    }

    /// A live job's user, account, partition, QOS and association exist and agree.
    fn check_live_job_names(&self, job: &crate::job::Job) -> Result<(), InvariantViolation> {
        let (id, r) = (job.id, &job.resolved);
        ensure!(
            self.users.contains_key(&job.spec.user),
            "job {id}: unknown user"
        );
        ensure!(
            self.accounts.get(&r.account).is_some(),
            "job {id}: unknown account"
        );
        ensure!(
            self.partitions.contains_key(&r.partition),
            "job {id}: unknown partition"
        );
        ensure!(self.qos.contains_key(&r.qos), "job {id}: unknown qos");
        ensure!(
            self.assocs.key(r.assoc) == Some(&(r.account.clone(), job.spec.user.clone())),
            "job {id}: association id {:?} does not name {}/{}",
            r.assoc,
            r.account,
            job.spec.user
        );
        Ok(())
    }

    fn check_nodes(&self) -> Result<(), InvariantViolation> {
        type Held = (u32, u64, u64, u32);
        let mut expected: BTreeMap<(&crate::ids::NodeName, crate::ids::JobId), Held> =
            BTreeMap::new();
        for job in self.jobs.values() {
            if let Some(alloc) = &job.alloc {
                ensure!(
                    !alloc.shares.is_empty(),
                    "job {} holds an empty allocation",
                    job.id
                );
                for s in &alloc.shares {
                    let dup =
                        expected.insert((&s.node, job.id), (s.cpus, s.memory.0, s.jobfs.0, s.gpus));
                    ensure!(dup.is_none(), "job {} names node {} twice", job.id, s.node);
                }
            }
        }
        let mut listed = 0usize;
        for (name, node) in &self.nodes {
            ensure!(
                &node.spec.name == name,
                "node key {name} holds node {}",
                node.spec.name
            );
            for (job, u) in &node.jobs {
                listed += 1;
                let want = expected.get(&(name, *job));
                ensure!(
                    want == Some(&(u.cpus, u.memory.0, u.jobfs.0, u.gpus)),
                    "node {name} lists job {job} with {u:?}, its allocation says {want:?}"
                );
                if u.exclusive {
                    ensure!(
                        node.jobs.len() == 1,
                        "exclusive job {job} shares node {name}"
                    );
                }
                let state = self.jobs.get(job).map(|j| j.state);
                if let Some(j) = self.jobs.get(job)
                    && j.preempted.is_some()
                {
                    ensure!(
                        matches!(j.state, JobState::Suspended | JobState::Completing),
                        "job {job} is marked preempted but is {:?}",
                        j.state
                    );
                }
                ensure!(
                    (state == Some(JobState::Suspended)) <= u.suspended
                        && (!u.suspended
                            || matches!(state, Some(JobState::Suspended | JobState::Completing))),
                    "node {name} marks job {job} suspended={} but it is {state:?}",
                    u.suspended
                );
            }
            ensure!(
                node.used_cpus() <= node.spec.cpus,
                "node {name} cpus overcommitted"
            );
            ensure!(
                node.used_memory() <= node.spec.memory,
                "node {name} memory overcommitted"
            );
            ensure!(
                node.used_jobfs() <= node.spec.jobfs,
                "node {name} jobfs overcommitted"
            );
            ensure!(
                node.used_gpus() <= node.spec.gpus,
                "node {name} gpus overcommitted"
            );
        }
        ensure!(
            listed == expected.len(),
            "allocations name {} node shares, nodes list {listed}",
            expected.len()
        );
        Ok(())
    }

    fn check_placement_current(&self) -> Result<(), InvariantViolation> {
        let mut fresh = self.clone();
        fresh.refresh_all_pending(self.applied.now);
        let clocked = crate::policy::placement_moves_with_time;
        let skip: BTreeSet<&UserName> = self
            .jobs
            .values()
            .chain(fresh.jobs.values())
            .filter(|j| j.state == JobState::Pending && clocked(j))
            .map(|j| &j.spec.user)
            .collect();
        for (id, job) in self.jobs.iter() {
            if job.state != JobState::Pending || skip.contains(&job.spec.user) {
                continue;
            }
            let Some(f) = fresh.jobs.get(id) else {
                continue;
            };
            ensure!(
                (job.part, job.reason, &job.resolved.qos) == (f.part, f.reason, &f.resolved.qos),
                "job {id} of {} is {:?}/{:?} but re-placing the queue makes it {:?}/{:?}",
                job.spec.user,
                job.part,
                job.reason,
                f.part,
                f.reason
            );
        }
        Ok(())
    }

    fn check_queue_caps(&self) -> Result<(), InvariantViolation> {
        let policy = &self.config.queue_policy;
        let mut idle: BTreeMap<&UserName, u64> = BTreeMap::new();
        let mut running: BTreeMap<&UserName, u64> = BTreeMap::new();
        for job in self.jobs.values() {
            if job.state == JobState::Pending && job.part == Part::Idle {
                *idle.entry(&job.spec.user).or_default() += 1;
            }
            if job.state.holds_resources() {
                *running.entry(&job.spec.user).or_default() += 1;
            }
        }
        for (user, n) in &idle {
            if let Some(cap) = policy.max_idle_jobs_per_user {
                ensure!(
                    *n <= u64::from(cap),
                    "user {user} has {n} idle jobs, cap {cap}"
                );
            }
            if let Some(cap) = policy.max_jobs_per_user {
                let r = running.get(user).copied().unwrap_or(0);
                // Running jobs may exceed the cap after it was lowered; idle ones may not add.
                ensure!(
                    *n == 0 || r + n <= u64::from(cap),
                    "user {user} has {r} running + {n} idle jobs, cap {cap}"
                );
            }
        }
        Ok(())
    }

    fn check_blobs(&self) -> Result<(), InvariantViolation> {
        let mut refs: BTreeMap<BlobId, u64> = BTreeMap::new();
        for job in self.jobs.values() {
            for b in std::iter::once(job.spec.script).chain(job.spec.env) {
                *refs.entry(b).or_default() += 1;
            }
        }
        let stored: BTreeSet<&BlobId> = self.blobs.keys().collect();
        let referenced: BTreeSet<&BlobId> = refs.keys().collect();
        ensure!(
            stored == referenced,
            "stored blobs differ from the referenced ones"
        );
        for (id, blob) in &self.blobs {
            ensure!(
                blob.refs == refs[id],
                "blob {id} counts {} refs, {} jobs use it",
                blob.refs,
                refs[id]
            );
            ensure!(
                BlobId::of(&blob.data) == *id,
                "blob {id} content does not hash to its id"
            );
        }
        Ok(())
    }
}

/// A pending job has no start, was placed, and accrues age exactly while it is idle and
/// eligible; no other job accrues age.
fn check_pending_clock(job: &crate::job::Job) -> Result<(), InvariantViolation> {
    let id = job.id;
    if job.state == JobState::Pending {
        ensure!(
            job.start_time.is_none(),
            "pending job {id} has a start time"
        );
        let accruing = job.part == Part::Idle && job.reason.is_eligible();
        ensure!(
            job.eligible_since.is_some() == accruing,
            "pending job {id} ({:?}, {}) eligible clock running = {}",
            job.part,
            job.reason,
            job.eligible_since.is_some()
        );
        ensure!(job.part != Part::New, "pending job {id} was never placed");
    } else {
        ensure!(
            job.eligible_since.is_none(),
            "job {id} is {} but accrues age",
            job.state
        );
    }
    Ok(())
}

/// An array master is pending or over, with a canonical pending set that is empty only
/// once it is over; a task names an array job no later than itself.
fn check_array_part(job: &crate::job::Job) -> Result<(), InvariantViolation> {
    let id = &job.id;
    if let Some(ArrayPart::Master { pending, .. }) = &job.array {
        ensure!(
            job.state == JobState::Pending || job.state.is_terminal(),
            "array master {id} is {}",
            job.state
        );
        ensure!(
            pending.is_canonical(),
            "array {id} pending set is not canonical"
        );
        ensure!(
            !pending.is_empty() || job.state.is_terminal(),
            "live array master {id} has no pending tasks"
        );
    }
    if let Some(ArrayPart::Task { array_job, .. }) = &job.array {
        ensure!(
            array_job <= id,
            "task {id} names a later array job {array_job}"
        );
    }
    Ok(())
}

/// A job's steps: numbered below its counter; live only while the job holds its allocation,
/// on nodes of it, and never holding more cpus on a node than the job has there.
fn check_steps(job: &crate::job::Job) -> Result<(), InvariantViolation> {
    let id = job.id;
    for (key, step) in &job.steps.list {
        ensure!(
            key == &step.id,
            "job {id}: step key {key} holds step {}",
            step.id
        );
        ensure!(
            step.id.0 < job.steps.next,
            "job {id}: step {} is not below the step counter {}",
            step.id,
            job.steps.next
        );
        ensure!(
            step.is_live() == (step.end_time.is_none()),
            "step {id}.{} is {} with end time {:?}",
            step.id,
            step.state,
            step.end_time
        );
        if !step.is_live() {
            continue;
        }
        let Some(alloc) = job.alloc.as_ref().filter(|_| job.state.holds_resources()) else {
            return Err(InvariantViolation(format!(
                "step {id}.{} is {} but job {id} is {}",
                step.id, step.state, job.state
            )));
        };
        for share in &step.layout {
            let Some(node) = alloc.shares.iter().find(|s| s.node == share.node) else {
                return Err(InvariantViolation(format!(
                    "step {id}.{} runs on {}, outside job {id}'s allocation",
                    step.id, share.node
                )));
            };
            ensure!(
                share.cpus <= node.cpus,
                "step {id}.{} uses {} cpus on {}, where the job has {}",
                step.id,
                share.cpus,
                share.node,
                node.cpus
            );
        }
    }
    for share in job.alloc.iter().flat_map(|a| &a.shares) {
        let held = job.steps.held_cpus(&share.node);
        ensure!(
            held <= share.cpus,
            "job {id}'s steps hold {held} cpus on {}, where the job has {}",
            share.node,
            share.cpus
        );
    }
    Ok(())
}
