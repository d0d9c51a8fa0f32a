//! Queue policy: which part of the queue each pending job is in, and the reason it shows.
//!
//! Maui (HPC2N's Maui scheduling policy) divides the queue into active, idle and blocked parts. A pending job is
//! *blocked* by its own circumstances (hold, begin time, dependency, a partition that is down,
//! an array throttle, a request no limit will ever allow) or by the per-user caps on idle and
//! total jobs; otherwise it is *idle*: considered by the scheduler. An idle job may still be
//! unable to start right now because of limits on what its owner already runs (MAXPS, running
//! job and cpu limits); its reason says so, and it keeps its idle slot, as in HPC2N's `showq`.
//!
//! Placement is sticky: an idle job stays idle while the caps allow. A new job enters idle
//! when there is room; when a slot frees, a blocked job is promoted in the configured order
//! (HPC2N's page: the newest blocked job).
//!
//! Age (eligible time) accrues only while a job is idle with nothing stopping it, as in
//! Slurm, where held, limit-blocked and dependent jobs accrue no age.

use std::collections::BTreeSet;
use std::hash::Hash;

use crate::account::{Account, AccountTree};
use crate::config::Promotion;
use crate::ids::{AccountName, JobId, PartitionName, QosName, UserName};
use crate::job::{ArrayPart, Combine, DepKind, Hold, Job, JobRef, JobState, Part, Reason};
use crate::lookup::NameMap;
use crate::quantity::TimeMs;
use crate::state::State;

/// What is running, summed the ways limits need, computed once per command. Nested maps,
/// so every lookup borrows the names it is given. Hashed ([`NameMap`]): only looked up,
/// never iterated, and built and dropped for every pass, start and submission, where
/// dropping eight empty ordered maps (each walks its empty tree) was 1.5% of a replay.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct RunningSummary {
    per_user: NameMap<UserName, Usage>,
    /// Each account's own running jobs (MAXPS of an account).
    per_account: NameMap<AccountName, Usage>,
    /// Each account's running jobs including every account below it (group limits).
    per_account_tree: NameMap<AccountName, Usage>,
    per_user_qos: NameMap<UserName, NameMap<QosName, Usage>>,
    per_qos: NameMap<QosName, Usage>,
    per_user_partition: NameMap<UserName, NameMap<PartitionName, Usage>>,
    per_assoc: NameMap<AccountName, NameMap<UserName, Usage>>,
    array_running: NameMap<JobId, u32>,
    /// Which account-level rules exist at all: checks skip looking up a job's account
    /// (three or four searches per job) when none does, as at most sites.
    rules: AccountRules,
}

/// Which rules exist at all, so checks skip lookups and the summary skips sums that no
/// limit reads (at most sites, most of them).
///
/// Derived state ([`State::account_rules`]), recomputed whenever limits may have changed
/// (every configuration change re-places the queue through [`State::refresh_all_pending`])
/// rather than on every command: the scan reads every association.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AccountRules {
    /// A per-user cap on running plus idle jobs, or a site-wide MAXPS (Maui): the
    /// summary sums each user's running jobs.
    user: bool,
    /// A grant, or a MAXPS limit of its own, on some account.
    own: bool,
    /// A running-jobs or cpu-run-minutes limit on some account (applies to its subtree).
    tree: bool,
    /// A running-jobs limit on some user's association.
    assoc: bool,
    /// A per-user limit on some QOS.
    qos_user: bool,
    /// A group limit on some QOS.
    qos_group: bool,
    /// A per-user limit on some partition.
    partition_user: bool,
}

impl AccountRules {
    /// Whether no rule exists at all: nothing sums what users and accounts run.
    pub(crate) fn none(&self) -> bool {
        *self == AccountRules::default()
    }

    /// Does every rule of `actual` hold here too?
    pub(crate) fn covers(&self, actual: &AccountRules) -> bool {
        (self.user || !actual.user)
            && (self.own || !actual.own)
            && (self.tree || !actual.tree)
            && (self.assoc || !actual.assoc)
            && (self.qos_user || !actual.qos_user)
            && (self.qos_group || !actual.qos_group)
            && (self.partition_user || !actual.partition_user)
    }

    pub(crate) fn of(state: &State) -> AccountRules {
        let mut r = AccountRules::default();
        let q = &state.config.queue_policy;
        r.user = q.max_jobs_per_user.is_some() || q.maxps_soft.is_some() || q.maxps_hard.is_some();
        for a in state.accounts.accounts.values() {
            let l = &a.limits;
            r.own |= a.grant.is_some() || l.maxps_soft.is_some() || l.maxps_hard.is_some();
            r.tree |= l.max_jobs.is_some() || l.grp_cpu_run_mins.is_some();
            r.assoc |= a.users.values().any(|u| u.limits.max_jobs.is_some());
        }
        for q in state.qos.values() {
            let l = &q.limits;
            r.qos_user |= l.max_jobs_per_user.is_some() || l.max_cpus_per_user.is_some();
            r.qos_group |=
                l.grp_jobs.is_some() || l.grp_cpus.is_some() || l.grp_cpu_run_mins.is_some();
        }
        for p in state.partitions.values() {
            let l = &p.limits;
            r.partition_user |= l.max_jobs_per_user.is_some() || l.max_cpus_per_user.is_some();
        }
        r
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Usage {
    jobs: u64,
    cpus: u64,
    /// Processor-seconds still to run (Maui's PS of running jobs).
    remaining_ps: u64,
}

impl Usage {
    fn add(&mut self, job: &Job, now: TimeMs) {
        self.jobs += 1;
        self.cpus += job.cpus();
        self.remaining_ps = self
            .remaining_ps
            .saturating_add(job.remaining_ps(now).unwrap_or(u64::MAX));
    }

    fn cpu_run_mins(&self) -> u64 {
        self.remaining_ps / 60
    }
}

fn nested<A: Eq + Hash, B: Eq + Hash>(map: &NameMap<A, NameMap<B, Usage>>, a: &A, b: &B) -> Usage {
    map.get(a)
        .and_then(|inner| inner.get(b))
        .copied()
        .unwrap_or_default()
}

/// Whose pending jobs must be re-placed after a change (see [`State::note_changed`]).
///
/// Re-placing is by user where something ties a user's jobs together (the idle and total
/// caps, a per-user limit) and job by job where nothing does: then a start or an end
/// re-places the few jobs it can release, not the owner's whole queue, and the cost of an
/// event no longer grows with the length of its owner's queue.
#[derive(Debug, Default)]
pub(crate) struct Affected {
    /// Users whose every pending job is re-placed.
    users: BTreeSet<UserName>,
    /// Pending jobs re-placed on their own (their owners' placement is job by job).
    jobs: BTreeSet<JobId>,
    everyone: bool,
}

/// Whether a dependency is met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DepStatus {
    Satisfied,
    Waiting,
    Never,
}

impl Affected {
    /// Adds what `other` names.
    pub(crate) fn merge(&mut self, other: Affected) {
        self.users.extend(other.users);
        self.jobs.extend(other.jobs);
        self.everyone |= other.everyone;
    }
}

impl State {
    /// What runs, summed the ways the limits that exist need.
    ///
    /// Where no such limit exists ([`AccountRules::none`], as at most sites), the one sum
    /// left is each array's running tasks (its throttle), counted from the arrays' task
    /// index rather than by walking every running job: every start command and every pass
    /// computes this, and the walk (a lookup and a job read per running job) was what a
    /// start cost with thousands running. `check_invariants` compares both ways.
    pub(crate) fn running_summary(&self, now: TimeMs) -> RunningSummary {
        if self.account_rules.none() {
            let mut s = RunningSummary {
                rules: self.account_rules,
                ..RunningSummary::default()
            };
            for (array, tasks) in self.relations.arrays() {
                let running = tasks.iter().filter(|t| self.holding.contains(*t)).count();
                if running > 0 {
                    s.array_running.insert(array, running as u32);
                }
            }
            return s;
        }
        self.running_summary_walked(now)
    }

    /// [`State::running_summary`] by walking every running job.
    pub(crate) fn running_summary_walked(&self, now: TimeMs) -> RunningSummary {
        let mut s = RunningSummary {
            rules: self.account_rules,
            ..RunningSummary::default()
        };
        for job in self.holding.iter().filter_map(|id| self.jobs.get(id)) {
            s.add_job(job, &self.accounts, now);
        }
        s
    }

    /// What placing newly submitted jobs needs of what is running. Where jobs are placed
    /// one by one ([`State::placed_job_by_job`]) and no QOS has group limits, that is
    /// nothing: no cap or limit reads the sums, and the one count left, an array's running
    /// tasks (its throttle), is zero for an array just submitted. So a submission costs
    /// nothing per running job (a walk over thousands of them, for every one-job
    /// submission, showed in `perf` of the controller benchmark).
    pub(crate) fn summary_for_new_jobs(&self, now: TimeMs) -> RunningSummary {
        if self.placed_job_by_job() && !self.account_rules.qos_group {
            RunningSummary {
                rules: self.account_rules,
                ..RunningSummary::default()
            }
        } else {
            self.running_summary(now)
        }
    }

    /// Re-places every pending job (after configuration changes and on every tick).
    pub(crate) fn refresh_all_pending(&mut self, now: TimeMs) {
        self.account_rules = AccountRules::of(self);
        let running = self.running_summary(now);
        for user in self.users_with_live_jobs() {
            self.place_user(&user, &running, now);
        }
    }

    /// Re-places what the passing of time alone can move, on the hourly tick.
    ///
    /// Where jobs are placed one by one ([`State::placed_job_by_job`], and no QOS group
    /// limit or bonus QOS counts what runs over time), every command re-places the jobs it
    /// affects, so a placement can only go stale with the clock: a begin time or an
    /// advance reservation's window passing, a dependency's delay running out or its
    /// target purged by this tick. Only such jobs are re-placed; re-placing thousands of
    /// queued jobs every simulated hour was most of a deep-queue replay's time (`perf`).
    /// Elsewhere, caps and limits that count remaining time tie jobs together: the whole
    /// queue is re-placed.
    ///
    /// The jobs to re-place come from the `clocked` index, not a walk of every job: with a
    /// queue thousands deep that walk, at every simulated hour, was a tenth of a replay.
    pub(crate) fn refresh_on_tick(&mut self, now: TimeMs) {
        // The rules cache is current (every configuration change recomputes it, and
        // `check_invariants` checks that it covers the configuration).
        if !self.placed_job_by_job()
            || self.account_rules.qos_group
            || self.config.bonus_qos.is_some()
        {
            return self.refresh_all_pending(now);
        }
        let clocked: Vec<JobId> = self.clocked.iter().copied().collect();
        if clocked.is_empty() {
            return;
        }
        let running = self.running_summary(now);
        for id in clocked {
            let placed = self
                .jobs
                .get(&id)
                .map(|job| self.placement_alone(job, &running, now));
            if let Some((part, reason)) = placed {
                self.set_pending(id, part, reason, now);
            }
        }
    }

    /// Notes whose pending jobs a change to job `id` (started, ended, cancelled, held,
    /// released, suspended, resumed) can re-place.
    pub(crate) fn note_changed(&self, id: JobId, affected: &mut Affected) {
        if affected.everyone {
            return;
        }
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let alone = self.placed_job_by_job();
        // Under caps or per-user limits, the owner's whole queue: what they run and how
        // many of their jobs are idle changed.
        if !alone {
            affected.users.insert(job.spec.user.clone());
        }
        let mut note = |job: &Job| match job.state {
            JobState::Pending if alone => {
                affected.jobs.insert(job.id);
            }
            JobState::Pending => {
                affected.users.insert(job.spec.user.clone());
            }
            _ => {}
        };
        // The job itself (held, released, requeued).
        note(job);
        // The array it is a task of (the throttle counts running tasks).
        let array = match job.array {
            Some(ArrayPart::Task { array_job, .. }) if array_job != id => Some(array_job),
            _ => None,
        };
        if let Some(master) = array.and_then(|a| self.jobs.get(&a)) {
            note(master);
        }
        // Jobs whose dependency names this job, or the array it is a task of.
        for target in std::iter::once(id).chain(array) {
            for dependent in self.relations.dependents_of(target) {
                if let Some(d) = self.jobs.get(&dependent) {
                    note(d);
                }
            }
        }
        // The owner's singletons of this name.
        for other in self
            .relations
            .singletons_named(&job.spec.user, &job.spec.name)
        {
            if let Some(o) = self.jobs.get(&other) {
                note(o);
            }
        }
        // Limits that tie users together: a QOS's group limits, an account-level MAXPS or
        // limit anywhere up the tree, a project grant. Rare enough to re-place everyone.
        // Looked for only where the configuration has such a limit somewhere (the rules
        // cache covers every rule there is): a QOS lookup and a walk up the account tree by
        // name for every start and end were a third of this function in a replay.
        let rules = &self.account_rules;
        let qos_grouped = rules.qos_group
            && self.qos.get(&job.resolved.qos).is_some_and(|q| {
                let l = &q.limits;
                l.grp_jobs.is_some() || l.grp_cpus.is_some() || l.grp_cpu_run_mins.is_some()
            });
        let account_tied = (rules.own || rules.tree)
            && self.accounts.ancestors(&job.resolved.account).any(|a| {
                let l = &a.limits;
                l.max_jobs.is_some()
                    || l.grp_cpu_run_mins.is_some()
                    || l.maxps_soft.is_some()
                    || l.maxps_hard.is_some()
                    || a.grant.is_some()
            });
        if qos_grouped || account_tied {
            affected.everyone = true;
        }
    }

    /// Re-places the pending jobs of the users `affected` names (everyone's, if it says so).
    pub(crate) fn refresh_affected(&mut self, affected: Affected, now: TimeMs) {
        if affected.everyone {
            return self.refresh_all_pending(now);
        }
        if affected.users.is_empty() && affected.jobs.is_empty() {
            return;
        }
        let running = self.running_summary(now);
        for user in &affected.users {
            self.place_user(user, &running, now);
        }
        for id in affected.jobs {
            let placed = self.jobs.get(&id).and_then(|job| {
                (job.state == JobState::Pending && !affected.users.contains(&job.spec.user))
                    .then(|| self.placement_alone(job, &running, now))
            });
            if let Some((part, reason)) = placed {
                self.set_pending(id, part, reason, now);
            }
        }
    }

    /// Whether each pending job is placed on its own: no idle or total cap and no per-user
    /// or account-level limit ties a user's jobs together. Then a job's part and reason
    /// depend only on the job, the jobs it names (dependencies, its array, its singleton
    /// name) and site-wide state, which is what lets [`State::note_changed`] re-place
    /// single jobs.
    pub(crate) fn placed_job_by_job(&self) -> bool {
        let q = &self.config.queue_policy;
        let r = &self.account_rules;
        q.max_idle_jobs_per_user.is_none()
            && q.max_jobs_per_user.is_none()
            && !(r.user || r.own || r.tree || r.assoc || r.qos_user || r.partition_user)
    }

    /// Where one pending job stands when jobs are placed one by one
    /// ([`State::placed_job_by_job`]): what [`State::place_user`] would decide for it.
    fn placement_alone(&self, job: &Job, running: &RunningSummary, now: TimeMs) -> (Part, Reason) {
        match self.intrinsic_reason(job, running, now) {
            Some(reason) => (Part::Blocked, reason),
            None => (
                Part::Idle,
                self.start_blocker(job, running)
                    .unwrap_or_else(|| self.scheduler_reason(job.id)),
            ),
        }
    }

    /// Re-places one user's pending jobs.
    pub(crate) fn refresh_user(&mut self, user: &UserName, now: TimeMs) {
        let running = self.running_summary(now);
        self.place_user(user, &running, now);
    }

    pub(crate) fn place_user(&mut self, user: &UserName, running: &RunningSummary, now: TimeMs) {
        let pending: Vec<JobId> = self
            .live_jobs_of(user)
            .filter(|j| j.state == JobState::Pending)
            .map(|j| j.id)
            .collect();
        if pending.is_empty() {
            return;
        }
        // A project past its grant runs only as bonus (NCI): its jobs move to the bonus QOS.
        if let Some(bonus) = self
            .config
            .bonus_qos
            .clone()
            .filter(|q| self.qos.contains_key(q))
        {
            for id in &pending {
                let moves = self
                    .jobs
                    .get(id)
                    .is_some_and(|j| j.resolved.qos != bonus && self.grant_exhausted(j));
                if moves && let Some(job) = self.jobs.get_mut(id) {
                    job.resolved.qos = bonus.clone();
                }
            }
        }
        let (allowed_idle, cap_reason) = self.idle_room(user, running);

        // Phase 1: each job's own circumstances.
        let mut kept_idle = Vec::new();
        let mut new = Vec::new();
        let mut was_blocked = Vec::new();
        let mut decided: Vec<(JobId, Part, Reason)> = Vec::new();
        for id in pending {
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            match self.intrinsic_reason(job, running, now) {
                Some(reason) => decided.push((id, Part::Blocked, reason)),
                None => match job.part {
                    Part::Idle => kept_idle.push(id),
                    Part::New => new.push(id),
                    Part::Blocked => was_blocked.push(id),
                },
            }
        }
        // Phase 2: the caps. Idle jobs keep their slots (the oldest, if caps shrank), new
        // jobs enter in submission order, then blocked jobs are promoted.
        if self.config.queue_policy.promotion == Promotion::Newest {
            was_blocked.reverse();
        }
        let mut idle_count: u64 = 0;
        let mut idle = Vec::new();
        for id in kept_idle.into_iter().chain(new).chain(was_blocked) {
            if idle_count < allowed_idle {
                idle_count += 1;
                idle.push(id);
            } else {
                decided.push((id, Part::Blocked, cap_reason));
            }
        }
        // Phase 3: idle jobs that cannot start now because of what their owner runs.
        for id in idle {
            let reason = self
                .jobs
                .get(&id)
                .and_then(|job| self.start_blocker(job, running))
                .unwrap_or_else(|| self.scheduler_reason(id));
            decided.push((id, Part::Idle, reason));
        }
        for (id, part, reason) in decided {
            self.set_pending(id, part, reason, now);
        }
    }

    /// The reason an idle job with nothing blocking it keeps: the one the last scheduling
    /// pass gave it (Resources, Priority), else none.
    fn scheduler_reason(&self, id: JobId) -> Reason {
        self.jobs
            .get(&id)
            .map(|j| j.reason)
            .filter(|r| r.is_eligible())
            .unwrap_or(Reason::None)
    }

    /// Maui's caps for one user: how many of their pending jobs may be idle given what
    /// they run, and the reason the rest are blocked (the total cap if that is what binds).
    fn idle_room(&self, user: &UserName, running: &RunningSummary) -> (u64, Reason) {
        let policy = &self.config.queue_policy;
        let running_jobs = running.per_user.get(user).map_or(0, |u| u.jobs);
        let cap_idle = policy.max_idle_jobs_per_user.map_or(u64::MAX, u64::from);
        let cap_total = policy.max_jobs_per_user.map_or(u64::MAX, u64::from);
        let allowed_idle = cap_idle.min(cap_total.saturating_sub(running_jobs));
        let reason = if running_jobs.saturating_add(allowed_idle) >= cap_total {
            Reason::MaxJobsPerUser
        } else {
            Reason::MaxIdleJobsPerUser
        };
        (allowed_idle, reason)
    }

    /// Places a user's newly submitted jobs, leaving the rest alone. Submission cannot
    /// change where the user's other jobs stand: idle slots are sticky, nothing starts or
    /// ends, and no dependency can name a job that did not exist. So only the new jobs are
    /// evaluated, against the idle slots left.
    pub(crate) fn place_new(
        &mut self,
        user: &UserName,
        new: &[JobId],
        running: &RunningSummary,
        now: TimeMs,
    ) {
        let (allowed_idle, cap_reason) = self.idle_room(user, running);
        // Counting the user's idle jobs only matters when a cap applies.
        let mut idle_count = if allowed_idle == u64::MAX {
            0
        } else {
            self.live_jobs_of(user)
                .filter(|j| j.state == JobState::Pending && j.part == Part::Idle)
                .count() as u64
        };
        let bonus = self
            .config
            .bonus_qos
            .clone()
            .filter(|q| self.qos.contains_key(q));
        let mut decided = Vec::with_capacity(new.len());
        for id in new {
            let Some(job) = self.jobs.get(id) else {
                continue;
            };
            let to_bonus = bonus.is_some() && self.grant_exhausted(job);
            if to_bonus {
                // Rare: re-place this user fully, which also moves the job to bonus.
                self.place_user(user, running, now);
                return;
            }
            let placed = match self.intrinsic_reason(job, running, now) {
                Some(reason) => (Part::Blocked, reason),
                None if idle_count < allowed_idle => {
                    idle_count += 1;
                    (
                        Part::Idle,
                        self.start_blocker(job, running).unwrap_or(Reason::None),
                    )
                }
                None => (Part::Blocked, cap_reason),
            };
            decided.push((*id, placed));
        }
        for (id, (part, reason)) in decided {
            self.set_pending(id, part, reason, now);
        }
    }

    /// Reasons a job is blocked regardless of the caps, in Slurm's order of precedence.
    fn intrinsic_reason(&self, job: &Job, running: &RunningSummary, now: TimeMs) -> Option<Reason> {
        match job.hold {
            Some(Hold::Admin) => return Some(Reason::JobHeldAdmin),
            Some(Hold::User) => return Some(Reason::JobHeldUser),
            None => {}
        }
        if job.spec.begin.is_some_and(|b| b > now) {
            return Some(Reason::BeginTime);
        }
        if let Some(name) = &job.spec.reservation {
            match self.reservations.get(name) {
                None => return Some(Reason::ReservationDeleted),
                Some(r) if now >= r.end => return Some(Reason::ReservationDeleted),
                Some(r) if now < r.start => return Some(Reason::Reservation),
                Some(_) => {}
            }
        }
        match self.dependency_status(job, None, now) {
            DepStatus::Satisfied => {}
            DepStatus::Waiting => return Some(Reason::Dependency),
            DepStatus::Never => return Some(Reason::DependencyNeverSatisfied),
        }
        let account = if running.rules.own {
            self.accounts.get(&job.resolved.account)
        } else {
            None // no grants or MAXPS of an account's own anywhere
        };
        if account.is_some_and(Account::grant_exhausted)
            && self.config.bonus_qos.as_ref() != Some(&job.resolved.qos)
        {
            return Some(Reason::AccountGrantExhausted);
        }
        let partition = self.partitions.get(&job.resolved.partition)?;
        if !partition.up {
            return Some(Reason::PartitionDown);
        }
        if let (Some(max), Some(t)) = (partition.max_time, job.resolved.time_limit)
            && t > max
        {
            return Some(Reason::PartitionTimeLimit);
        }
        if let Some(q) = self.qos.get(&job.resolved.qos)
            && let (Some(max), Some(t)) = (q.limits.max_wall, job.resolved.time_limit)
            && t > max
        {
            return Some(Reason::QosMaxWallDurationPerJobLimit);
        }
        if let Some((_, hard)) = self.maxps_limits(account)
            && job.requested_ps().is_none_or(|ps| ps > hard)
        {
            return Some(Reason::MaxPsHardLimitNever);
        }
        if let Some(ArrayPart::Master {
            throttle: Some(t), ..
        }) = &job.array
            && running.array_running.get(&job.id).copied().unwrap_or(0) >= *t
        {
            return Some(Reason::JobArrayTaskLimit);
        }
        if job
            .spec
            .nodelist
            .iter()
            .any(|n| self.nodes.get(n).is_none_or(|node| !node.accepts_jobs()))
        {
            return Some(Reason::ReqNodeNotAvail);
        }
        None
    }

    /// Has the job's project spent its grant?
    fn grant_exhausted(&self, job: &Job) -> bool {
        self.accounts
            .get(&job.resolved.account)
            .is_some_and(Account::grant_exhausted)
    }

    /// The MAXPS (soft, hard) limits that apply to a job of `account`: the account's own,
    /// else the configured default.
    fn maxps_limits(&self, account: Option<&Account>) -> Option<(u64, u64)> {
        let policy = &self.config.queue_policy;
        let soft = account
            .and_then(|a| a.limits.maxps_soft)
            .or(policy.maxps_soft);
        let hard = account
            .and_then(|a| a.limits.maxps_hard)
            .or(policy.maxps_hard);
        match (soft, hard) {
            (None, None) => None,
            (s, h) => Some((s.unwrap_or(u64::MAX), h.unwrap_or(u64::MAX))),
        }
    }

    /// Why an idle job cannot start now, given what is running.
    #[inline]
    pub(crate) fn start_blocker(&self, job: &Job, running: &RunningSummary) -> Option<Reason> {
        // No limit anywhere (no MAXPS, no QOS, partition, account or association limit):
        // nothing holds a job back. Every job a pass tries asks, and the four checks that
        // each find no limit were 3% of a 100,000-job replay; asked inline, before the call,
        // since the call alone (the prologue of a large function) was 2% more.
        if running.rules.none() {
            return None;
        }
        self.limit_blocker(job, running)
    }

    /// [`State::start_blocker`] where some limit exists.
    fn limit_blocker(&self, job: &Job, running: &RunningSummary) -> Option<Reason> {
        // Looked up once, and only if some account-level rule exists anywhere.
        let rules = running.rules;
        let account = if rules.own || rules.tree || rules.assoc {
            Some(self.accounts.get(&job.resolved.account)?)
        } else {
            None
        };
        self.maxps_blocker(job, account, running)
            .or_else(|| self.qos_blocker(job, running))
            .or_else(|| self.partition_blocker(job, running))
            .or_else(|| self.association_blocker(job, account?, running))
    }

    /// MAXPS: the PS of the running jobs (of the account if it has its own limit, else of
    /// the user) plus this job's WCLIMIT x procs, against the soft and hard limits.
    fn maxps_blocker(
        &self,
        job: &Job,
        account: Option<&Account>,
        running: &RunningSummary,
    ) -> Option<Reason> {
        let (soft, hard) = self.maxps_limits(account)?;
        let account_limited =
            account.is_some_and(|a| a.limits.maxps_soft.is_some() || a.limits.maxps_hard.is_some());
        let running_ps = if account_limited {
            running.per_account.get(&job.resolved.account)
        } else {
            running.per_user.get(&job.spec.user)
        }
        .map_or(0, |u| u.remaining_ps);
        let total = running_ps.saturating_add(job.requested_ps().unwrap_or(u64::MAX));
        if total > hard {
            return Some(Reason::MaxPsHardLimit);
        }
        (total > soft).then_some(Reason::MaxPsSoftLimit)
    }

    /// The job's QOS limits: per user (jobs, cpus) and for the whole QOS (jobs, cpus,
    /// cpu-minutes of running jobs). The QOS is looked up only where some QOS has a limit
    /// at all (a search by name per job tried, in every pass, showed in `perf`).
    fn qos_blocker(&self, job: &Job, running: &RunningSummary) -> Option<Reason> {
        let rules = running.rules;
        let r = &job.resolved;
        let q = (rules.qos_user || rules.qos_group)
            .then(|| self.qos.get(&r.qos))
            .flatten()?;
        let l = &q.limits;
        let cpus = job.cpus();
        if l.max_jobs_per_user.is_some() || l.max_cpus_per_user.is_some() {
            let mine = nested(&running.per_user_qos, &job.spec.user, &r.qos);
            if l.max_jobs_per_user
                .is_some_and(|m| mine.jobs >= u64::from(m))
            {
                return Some(Reason::QosMaxJobsPerUserLimit);
            }
            if l.max_cpus_per_user.is_some_and(|m| mine.cpus + cpus > m) {
                return Some(Reason::QosMaxCpuPerUserLimit);
            }
        }
        if l.grp_jobs.is_some() || l.grp_cpus.is_some() || l.grp_cpu_run_mins.is_some() {
            let group = running.per_qos.get(&r.qos).copied().unwrap_or_default();
            if l.grp_jobs.is_some_and(|m| group.jobs >= u64::from(m)) {
                return Some(Reason::QosGrpJobsLimit);
            }
            if l.grp_cpus.is_some_and(|m| group.cpus + cpus > m) {
                return Some(Reason::QosGrpCpuLimit);
            }
            if let Some(m) = l.grp_cpu_run_mins {
                let this = job.requested_ps().unwrap_or(u64::MAX) / 60;
                if group.cpu_run_mins().saturating_add(this) > m {
                    return Some(Reason::QosGrpCpuRunMinutesLimit);
                }
            }
        }
        None
    }

    /// The partition's per-user limits (jobs, cpus), looked up only where some partition
    /// has one.
    fn partition_blocker(&self, job: &Job, running: &RunningSummary) -> Option<Reason> {
        let r = &job.resolved;
        let p = running
            .rules
            .partition_user
            .then(|| self.partitions.get(&r.partition))
            .flatten()?;
        let l = &p.limits;
        if l.max_jobs_per_user.is_some() || l.max_cpus_per_user.is_some() {
            let mine = nested(&running.per_user_partition, &job.spec.user, &r.partition);
            if l.max_jobs_per_user
                .is_some_and(|m| mine.jobs >= u64::from(m))
            {
                return Some(Reason::PartitionMaxJobsPerUserLimit);
            }
            if l.max_cpus_per_user
                .is_some_and(|m| mine.cpus + job.cpus() > m)
            {
                return Some(Reason::PartitionMaxCpuPerUserLimit);
            }
        }
        None
    }

    /// Association limits: the user's own association, then each account up the tree
    /// (walked without allocating; the tree has no cycles, and the walk is bounded anyway).
    fn association_blocker(
        &self,
        job: &Job,
        account: &Account,
        running: &RunningSummary,
    ) -> Option<Reason> {
        let rules = running.rules;
        let user = &job.spec.user;
        if rules.assoc
            && let Some(max) = account.users.get(user).and_then(|ua| ua.limits.max_jobs)
            && nested(&running.per_assoc, &job.resolved.account, user).jobs >= u64::from(max)
        {
            return Some(Reason::AssocMaxJobsLimit);
        }
        let mut cur = rules.tree.then_some(account);
        for _ in 0..=self.accounts.accounts.len() {
            let Some(a) = cur else {
                break;
            };
            if a.limits.max_jobs.is_some() || a.limits.grp_cpu_run_mins.is_some() {
                let acc = running
                    .per_account_tree
                    .get(&a.name)
                    .copied()
                    .unwrap_or_default();
                if a.limits.max_jobs.is_some_and(|m| acc.jobs >= u64::from(m)) {
                    return Some(Reason::AssocMaxJobsLimit);
                }
                if let Some(m) = a.limits.grp_cpu_run_mins {
                    let this = job.requested_ps().unwrap_or(u64::MAX) / 60;
                    if acc.cpu_run_mins().saturating_add(this) > m {
                        return Some(Reason::AssocGrpCpuRunMinutesLimit);
                    }
                }
            }
            cur = a.parent.as_ref().and_then(|p| self.accounts.get(p));
        }
        None
    }

    /// Whether `job`'s dependency is met. For an array master, `task` asks about one of its
    /// pending indexes (needed by `aftercorr`); `None` asks whether any task could go.
    pub(crate) fn dependency_status(&self, job: &Job, task: Option<u32>, now: TimeMs) -> DepStatus {
        let Some(dep) = &job.spec.dependency else {
            return DepStatus::Satisfied;
        };
        let statuses = dep.clauses.iter().map(|clause| match clause.kind {
            DepKind::Singleton => self.singleton_status(job),
            kind => match clause.target {
                Some(target) => self.clause_status(kind, target, job, task, now),
                None => DepStatus::Never,
            },
        });
        combine(dep.combine, statuses)
    }

    fn singleton_status(&self, job: &Job) -> DepStatus {
        let blocked = self.live_jobs_of(&job.spec.user).any(|other| {
            other.id != job.id
                && other.spec.name == job.spec.name
                && (other.state.holds_resources() || other.id < job.id)
        });
        if blocked {
            DepStatus::Waiting
        } else {
            DepStatus::Satisfied
        }
    }

    fn clause_status(
        &self,
        kind: DepKind,
        target: JobRef,
        dependent: &Job,
        task: Option<u32>,
        now: TimeMs,
    ) -> DepStatus {
        if kind == DepKind::AfterCorr {
            // Task i waits on the target array's task i; a whole master on any of its tasks.
            let indexes: Vec<u32> = match (task, &dependent.array) {
                (Some(i), _) => vec![i],
                (None, Some(ArrayPart::Task { index, .. })) => vec![*index],
                (None, Some(ArrayPart::Master { pending, .. })) => pending.iter().collect(),
                (None, None) => {
                    return self.records_status(DepKind::AfterOk, target, now);
                }
            };
            let each = indexes.into_iter().map(|i| {
                self.records_status(
                    DepKind::AfterOk,
                    JobRef {
                        job: target.job,
                        task: Some(i),
                    },
                    now,
                )
            });
            return combine(Combine::Any, each);
        }
        self.records_status(kind, target, now)
    }

    /// Status of one clause against every record the target names (all tasks of an array).
    fn records_status(&self, kind: DepKind, target: JobRef, now: TimeMs) -> DepStatus {
        let Some(head) = self.jobs.get(&target.job) else {
            return DepStatus::Never;
        };
        let mut records: Vec<&Job> = Vec::new();
        let mut still_pending = false;
        match (target.task, &head.array) {
            (None, Some(ArrayPart::Master { pending, .. })) => {
                still_pending = !pending.is_empty();
                records.extend(self.tasks_of(target.job));
            }
            (Some(i), Some(ArrayPart::Master { pending, .. })) => {
                if pending.contains(i) {
                    still_pending = true;
                } else {
                    records.extend(self.tasks_of(target.job).filter(
                        |t| matches!(t.array, Some(ArrayPart::Task { index, .. }) if index == i),
                    ));
                }
            }
            (Some(i), Some(ArrayPart::Task { index, .. })) if *index == i => records.push(head),
            (Some(i), Some(ArrayPart::Task { .. })) => {
                records.extend(self.tasks_of(target.job).filter(
                    |t| matches!(t.array, Some(ArrayPart::Task { index, .. }) if index == i),
                ));
            }
            (Some(_), None) => return DepStatus::Never,
            (None, _) => records.push(head),
        }
        if records.is_empty() && !still_pending {
            return DepStatus::Never;
        }
        let each = records.into_iter().map(|r| record_status(kind, r, now));
        let combined = combine(Combine::All, each);
        if still_pending && combined != DepStatus::Never {
            DepStatus::Waiting
        } else {
            combined
        }
    }

    /// The records of an array's tasks that have split off (including the master itself once
    /// it became the last task).
    fn tasks_of(&self, array_job: JobId) -> impl Iterator<Item = &Job> {
        self.relations
            .tasks_of(array_job)
            .filter_map(|id| self.jobs.get(&id))
    }
}

impl RunningSummary {
    /// Counts a job that just started.
    pub(crate) fn add_job(&mut self, job: &Job, accounts: &AccountTree, now: TimeMs) {
        let user = &job.spec.user;
        let r = &job.resolved;
        let rules = self.rules;
        if rules.user {
            self.per_user.entry(user.clone()).or_default().add(job, now);
        }
        if rules.own {
            self.per_account
                .entry(r.account.clone())
                .or_default()
                .add(job, now);
        }
        if rules.tree {
            for a in accounts.ancestry(&r.account) {
                self.per_account_tree
                    .entry(a.name.clone())
                    .or_default()
                    .add(job, now);
            }
        }
        if rules.qos_user {
            self.per_user_qos
                .entry(user.clone())
                .or_default()
                .entry(r.qos.clone())
                .or_default()
                .add(job, now);
        }
        if rules.qos_group {
            self.per_qos.entry(r.qos.clone()).or_default().add(job, now);
        }
        if rules.partition_user {
            self.per_user_partition
                .entry(user.clone())
                .or_default()
                .entry(r.partition.clone())
                .or_default()
                .add(job, now);
        }
        if rules.assoc {
            self.per_assoc
                .entry(r.account.clone())
                .or_default()
                .entry(user.clone())
                .or_default()
                .add(job, now);
        }
        if let Some(ArrayPart::Task { array_job, .. }) = &job.array {
            *self.array_running.entry(*array_job).or_default() += 1;
        }
    }

    /// Counts one more running task of `array_job` (a planned start of a pending task).
    pub(crate) fn note_task_start(&mut self, array_job: JobId) {
        *self.array_running.entry(array_job).or_default() += 1;
    }

    pub(crate) fn array_running(&self, array_job: JobId) -> u32 {
        self.array_running.get(&array_job).copied().unwrap_or(0)
    }
}

fn record_status(kind: DepKind, target: &Job, now: TimeMs) -> DepStatus {
    let terminal = target.state.is_terminal();
    let ok = target.state == JobState::Completed;
    match kind {
        DepKind::After { delay } => match target.start_time {
            Some(start) if now >= start.plus(delay) => DepStatus::Satisfied,
            None if terminal => DepStatus::Satisfied,
            _ => DepStatus::Waiting,
        },
        DepKind::AfterAny => {
            if terminal {
                DepStatus::Satisfied
            } else {
                DepStatus::Waiting
            }
        }
        DepKind::AfterOk | DepKind::AfterCorr => match (terminal, ok) {
            (true, true) => DepStatus::Satisfied,
            (true, false) => DepStatus::Never,
            _ => DepStatus::Waiting,
        },
        DepKind::AfterNotOk => match (terminal, ok) {
            (true, false) => DepStatus::Satisfied,
            (true, true) => DepStatus::Never,
            _ => DepStatus::Waiting,
        },
        DepKind::Singleton => DepStatus::Satisfied,
    }
}

fn combine(how: Combine, statuses: impl Iterator<Item = DepStatus>) -> DepStatus {
    let (mut any_sat, mut any_wait, mut any_never, mut n) = (false, false, false, 0);
    for s in statuses {
        n += 1;
        match s {
            DepStatus::Satisfied => any_sat = true,
            DepStatus::Waiting => any_wait = true,
            DepStatus::Never => any_never = true,
        }
    }
    if n == 0 {
        return DepStatus::Satisfied;
    }
    match how {
        Combine::All if any_never => DepStatus::Never,
        Combine::All if any_wait => DepStatus::Waiting,
        Combine::All => DepStatus::Satisfied,
        Combine::Any if any_sat => DepStatus::Satisfied,
        Combine::Any if any_wait => DepStatus::Waiting,
        Combine::Any => DepStatus::Never,
    }
}

impl State {
    /// Records where a pending job stands ([`set_pending`]); one that changed part may have
    /// entered or left the idle queue, which the queue index learns.
    fn set_pending(&mut self, id: JobId, part: Part, reason: Reason, now: TimeMs) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let moved = job.part != part;
        // A job already where it stands is only read: while a snapshot's copy of the state
        // shares it, changing it would copy it ([`crate::job_table`]), and every tick
        // re-places every pending job on sites with per-user limits.
        if !stands(job, part, reason)
            && let Some(job) = self.jobs.get_mut(&id)
        {
            set_pending(job, part, reason, now);
        }
        if self.jobs.get(&id).is_some_and(placed_by_clock) {
            self.clocked.insert(id);
        } else {
            self.clocked.remove(&id);
        }
        if moved {
            self.queue_index.touch(id);
        }
    }

    /// The `clocked` index as it should be: the jobs the tick re-places.
    pub(crate) fn compute_clocked(&self) -> BTreeSet<JobId> {
        self.jobs
            .values()
            .filter(|j| placed_by_clock(j))
            .map(|j| j.id)
            .collect()
    }
}

/// Whether the tick re-places a job: a pending one whose placement the clock can move, or
/// that waits for a reservation or on a dependency (whose target the tick may purge).
pub(crate) fn placed_by_clock(job: &Job) -> bool {
    job.state == JobState::Pending
        && (placement_moves_with_time(job)
            || job.spec.reservation.is_some()
            || job.spec.dependency.is_some())
}

/// Whether where a pending job stands can change with the clock alone: a begin time, a
/// reason that counts time (a reservation's window, remaining processor-seconds or
/// cpu-minutes), or a dependency with a delay (`after:ID+MINUTES`).
pub(crate) fn placement_moves_with_time(job: &Job) -> bool {
    job.spec.begin.is_some()
        || job.reason.depends_on_time()
        || job.spec.dependency.as_ref().is_some_and(|d| {
            d.clauses
                .iter()
                .any(|c| matches!(c.kind, DepKind::After { delay } if delay.0 > 0))
        })
}

/// Records a pending job's part and reason, and keeps its eligible-time clock: it runs only
/// while the job is idle with nothing stopping it.
pub(crate) fn set_pending(job: &mut Job, part: Part, reason: Reason, now: TimeMs) {
    match (job.eligible_since, accrues(part, reason)) {
        (None, true) => job.eligible_since = Some(now),
        (Some(since), false) => {
            job.eligible_accrued += now.since(since);
            job.eligible_since = None;
        }
        _ => {}
    }
    job.part = part;
    job.reason = reason;
}

/// Whether a pending job in `part` for `reason` accrues eligible time.
fn accrues(part: Part, reason: Reason) -> bool {
    part == Part::Idle && reason.is_eligible()
}

/// Whether [`set_pending`] with `part` and `reason` would leave `job` as it is.
fn stands(job: &Job, part: Part, reason: Reason) -> bool {
    job.part == part
        && job.reason == reason
        && job.eligible_since.is_some() == accrues(part, reason)
}

/// Stops a job's eligible-time clock (it starts, is cancelled, or leaves the queue).
pub(crate) fn stop_eligible_clock(job: &mut Job, now: TimeMs) {
    if let Some(since) = job.eligible_since.take() {
        job.eligible_accrued += now.since(since);
    }
}
