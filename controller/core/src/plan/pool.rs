//! What each node has free now and, as running jobs end and planned jobs start, later:
//! the availability profile the planners place jobs on.
//!
//! Built once per pass from the state. Each node keeps what it has free now and a short
//! list of changes ahead of it: resources coming back when a running job reaches its time
//! limit, and taken and given back by each start or reservation the pass plans. A job fits
//! on a node over `[start, end)` when what is free at `start`, and after every change inside
//! the interval, covers its share. Placement mirrors what apply checks
//! ([`crate::request::node_use`], partition membership, admin state, features, exclusions,
//! required nodes), so a plan made on an unchanged state is always accepted.
//!
//! Best fit: each of the job's node shares, largest first, goes to the usable node that
//! would have the fewest cpus left at the start (then the least memory, then name order).
//! Whole nodes stay whole for the jobs that need them.
//!
//! Conservative assumptions: a suspended job holds its node until further notice, a job
//! without a time limit holds it for ever, and a job past its limit gives it back no sooner
//! than a moment from now (never *now*, which would plan on resources still held).
//!
//! Durations are what [`Job::expected_runtime`] says: the time limit, or a runtime
//! prediction where the site predicts (EASY++). Advance reservation windows are always
//! checked against the limit, as apply checks them.

use crate::ids::{NodeName, PartitionName, ReservationName};
use crate::job::{Job, JobState, MemoryRequest};
use crate::node::{Node, NodeUse};
use crate::quantity::{Seconds, TimeMs};
use crate::state::State;

use smallvec::SmallVec;

/// A node's free resources at one instant, or (in a [`Change`]) what one instant adds to
/// them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Free {
    cpus: i64,
    memory: i64,
    jobfs: i64,
    gpus: i64,
    /// Jobs holding resources here.
    holders: i32,
    /// Exclusive jobs holding the node.
    exclusive: i32,
}

impl Free {
    /// A node with nothing taken.
    fn of(spec: &crate::node::NodeSpec) -> Free {
        Free {
            cpus: i64::from(spec.cpus),
            memory: i64::try_from(spec.memory.0).unwrap_or(i64::MAX),
            jobfs: i64::try_from(spec.jobfs.0).unwrap_or(i64::MAX),
            gpus: i64::from(spec.gpus),
            holders: 0,
            exclusive: 0,
        }
    }

    /// Takes out what `held` sums, as applying each of its shares' takes would.
    fn take_held(&mut self, held: &crate::returns::Held) {
        self.cpus = self.cpus.wrapping_sub(held.cpus);
        self.memory = self.memory.wrapping_sub(held.memory);
        self.jobfs = self.jobfs.wrapping_sub(held.jobfs);
        self.gpus = self.gpus.wrapping_sub(held.gpus);
        self.holders = self.holders.wrapping_add(held.shares);
        self.exclusive = self.exclusive.wrapping_add(held.exclusive);
    }

    fn apply(&mut self, c: &Change) {
        let d = &c.delta;
        self.cpus += d.cpus;
        self.memory += d.memory;
        self.jobfs += d.jobfs;
        self.gpus += d.gpus;
        self.holders += d.holders;
        self.exclusive += d.exclusive;
    }

    fn fits(&self, want: &NodeUse) -> bool {
        self.exclusive == 0
            && (!want.exclusive || self.holders == 0)
            && i64::from(want.cpus) <= self.cpus
            && i64::try_from(want.memory.0).is_ok_and(|m| m <= self.memory)
            && i64::try_from(want.jobfs.0).is_ok_and(|j| j <= self.jobfs)
            && i64::from(want.gpus) <= self.gpus
    }
}

/// Resources returned (positive) or taken (negative) at `at`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Change {
    at: TimeMs,
    delta: Free,
}

impl Change {
    fn of(at: TimeMs, u: &NodeUse, sign: i64) -> Change {
        let one = crate::returns::Held::of(u);
        let sign32 = sign as i32;
        Change {
            at,
            delta: Free {
                cpus: sign * one.cpus,
                memory: sign * one.memory,
                jobfs: sign * one.jobfs,
                gpus: sign * one.gpus,
                holders: -sign32 * one.shares,
                exclusive: -sign32 * one.exclusive,
            },
        }
    }

    fn takes(&self) -> bool {
        self.delta.holders > 0
    }
}

/// What a node has free now, as the pool reports it to preemption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeNow {
    pub cpus: i64,
    pub memory: i64,
    pub jobfs: i64,
    pub gpus: i64,
}

impl FreeNow {
    /// Does `want` fit in what is free?
    pub fn covers(&self, want: &NodeUse) -> bool {
        i64::from(want.cpus) <= self.cpus
            && i64::try_from(want.memory.0).is_ok_and(|m| m <= self.memory)
            && i64::try_from(want.jobfs.0).is_ok_and(|j| j <= self.jobfs)
            && i64::from(want.gpus) <= self.gpus
    }

    /// Gives back what `u` holds: its cpus always, the rest only when `all` (a suspended
    /// job keeps its memory, jobfs and GPUs).
    pub fn give_back(&mut self, u: &NodeUse, all: bool) {
        self.cpus += i64::from(u.cpus);
        if all {
            self.memory += i64::try_from(u.memory.0).unwrap_or(0);
            self.jobfs += i64::try_from(u.jobfs.0).unwrap_or(0);
            self.gpus += i64::from(u.gpus);
        }
    }
}

/// One planned use of nodes: a start now or a reservation later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub nodes: Vec<NodeName>,
    pub start: TimeMs,
    pub end: TimeMs,
}

/// How far ahead a pool looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Horizon {
    /// What each node has free now, and nothing later. Enough for passes that only place
    /// jobs now (main and direct): with nothing but returns ahead of now, a job that fits now
    /// fits for its whole run, since only a take can stop it. It spares every pass the
    /// lookup of each running job's end and the sorting of them (a tenth of a deep FCFS
    /// replay).
    Now,
    /// Now and later: running jobs' returns, and the reservations the pass makes (backfill).
    Profile,
}

/// The availability profile of every node, with each partition's members.
#[derive(Debug)]
pub struct Pool<'a> {
    now: TimeMs,
    horizon: Horizon,
    nodes: Vec<&'a Node>,
    /// Free now (everything planned to start now already taken out).
    free: Vec<Free>,
    /// Drained or down: nothing starts here.
    closed: Vec<bool>,
    /// Changes after now, per node, in time order (returns before takes at one instant).
    changes: Vec<NodeChanges>,
    /// Each partition's members and what they have free, found with one lookup per job.
    parts: PartitionViews<'a>,
    /// Per node, the windows of the advance reservations holding it; empty when there are
    /// no reservations ([`Pool::windows_of`]).
    windows: Vec<Vec<(TimeMs, TimeMs, &'a ReservationName)>>,
    /// The cpus free now on every node that could take a share now (open, not held
    /// exclusively): a job asking for more cannot start now, found without its partition
    /// or its shares. Most jobs a backfill pass walks on a busy machine are such jobs.
    cpus_free_now: i64,
}

/// The partitions as a pool sees them, in name order, found by binary search: a pass looks
/// one up for every job it tries, and an ordered map of a handful of entries was built (two
/// allocations) and dropped for every pass.
#[derive(Debug, Default)]
struct PartitionViews<'a>(Vec<(&'a PartitionName, PartitionView<'a>)>);

impl<'a> PartitionViews<'a> {
    fn place(&self, name: &PartitionName) -> Option<usize> {
        self.0.binary_search_by(|(p, _)| (*p).cmp(name)).ok()
    }

    fn get(&self, name: &PartitionName) -> Option<&PartitionView<'a>> {
        self.place(name).map(|k| &self.0[k].1)
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = (&'a PartitionName, &PartitionView<'a>)> {
        self.0.iter().map(|(p, v)| (*p, v))
    }

    fn values(&self) -> impl Iterator<Item = &PartitionView<'a>> {
        self.0.iter().map(|(_, v)| v)
    }
}

/// A partition as the pool sees it.
#[derive(Debug)]
struct PartitionView<'a> {
    /// Places in the pool, ascending.
    members: &'a [usize],
    /// The most cpus and the most memory any usable member has free now: most jobs that
    /// cannot start now are turned away without looking at every node.
    most_free: (i64, i64),
    /// How many usable members have exactly those free: a start moves the bound only when
    /// it takes from the last of them.
    holders: (usize, usize),
}

impl<'a> Pool<'a> {
    pub fn new(state: &'a State, now: TimeMs, horizon: Horizon) -> Pool<'a> {
        // In name order, as the state keeps them: a node's place is found by binary search
        // ([`Pool::position`]). A map from names to places built for each pass, and a lookup
        // in it for each partition member, were 60% of a replay on a site of 976 nodes.
        let nodes: Vec<&Node> = state.nodes.values().collect();
        debug_assert!(nodes.windows(2).all(|w| w[0].spec.name < w[1].spec.name));
        let mut free: Vec<Free> = nodes.iter().map(|n| Free::of(&n.spec)).collect();
        let profile = horizon == Horizon::Profile;
        // Room for the pass's own few changes too (a start adds its return, a reservation its
        // take and return): grown by its first insert, a node's list of hundreds of returns
        // was copied whole once a pass.
        let mut changes: Vec<NodeChanges> = nodes
            .iter()
            .map(|n| NodeChanges::with_capacity(if profile { n.jobs.len() + 4 } else { 0 }))
            .collect();
        // Where a node's returns are looked up ([`profile_returns`]), they are sorted by
        // instant as pairs of an instant and a reference before they become changes: sorting
        // the changes themselves, three times the size, was nearly a third of building a pool
        // for a node of a thousand cpus.
        let mut returns: Vec<(TimeMs, &NodeUse)> = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let indexed = state.returns.of_node(&node.spec.name);
            match indexed.filter(|r| r.fixed.len() == node.jobs.len()) {
                // Every share the node holds is an indexed return: their sum is kept.
                Some(r) => free[i].take_held(&r.held),
                None => {
                    for u in node.jobs.values() {
                        free[i].apply(&Change::of(now, u, -1));
                    }
                }
            }
            debug_assert_eq!(
                free[i],
                node.jobs.values().fold(Free::of(&node.spec), |mut f, u| {
                    f.apply(&Change::of(now, u, -1));
                    f
                }),
                "what node {} has free now",
                node.spec.name
            );
            if profile {
                profile_returns(state, node, indexed, now, &mut returns, &mut changes[i]);
            }
        }
        let closed: Vec<bool> = nodes.iter().map(|n| !n.accepts_jobs()).collect();
        // Only where there are reservations ([`Pool::windows_of`]).
        let mut windows: Vec<Vec<(TimeMs, TimeMs, &ReservationName)>> =
            if state.reservations.is_empty() {
                Vec::new()
            } else {
                vec![Vec::new(); nodes.len()]
            };
        for r in state.reservations.values() {
            for i in places(&nodes, &r.nodes) {
                windows[i].push((r.start, r.end, &r.name));
            }
        }
        // In name order, as the state keeps them ([`PartitionViews`]).
        let parts = state
            .partitions
            .values()
            .map(|p| {
                let members = state.partition_members.get(&p.name).map_or(&[][..], |m| m);
                let (most_free, holders) = most_free_of(&free, &closed, members);
                let view = PartitionView {
                    members,
                    most_free,
                    holders,
                };
                (&p.name, view)
            })
            .collect();
        let parts = PartitionViews(parts);
        debug_assert!(parts.0.windows(2).all(|w| w[0].0 < w[1].0));
        let cpus_free_now = (0..nodes.len())
            .map(|i| cpus_standing(&free, &closed, i))
            .sum();
        Pool {
            now,
            horizon,
            nodes,
            free,
            closed,
            changes,
            parts,
            windows,
            cpus_free_now,
        }
    }

    /// Node `name`'s place in the pool.
    fn position(&self, name: &NodeName) -> Option<usize> {
        self.nodes.binary_search_by(|n| n.spec.name.cmp(name)).ok()
    }

    /// What node `i` has free now (cpus, memory) if it can take a share now: it accepts
    /// jobs and no job holds it exclusively.
    fn standing(&self, i: usize) -> Option<(i64, i64)> {
        standing(&self.free, &self.closed, i)
    }

    /// The most cpus and the most memory any usable one of `members` has free now (at
    /// least 0), and how many usable members have exactly that.
    fn most_free_of(&self, members: &[usize]) -> ((i64, i64), (usize, usize)) {
        most_free_of(&self.free, &self.closed, members)
    }

    /// What the node at place `i` has free now, if it accepts jobs and is not held
    /// exclusively; a suspended job's cpus count as taken (they are its to resume).
    pub(crate) fn free_now(&self, i: usize) -> Option<FreeNow> {
        let f = &self.free[i];
        (!self.closed[i] && f.exclusive == 0).then_some(FreeNow {
            cpus: f.cpus,
            memory: f.memory,
            jobfs: f.jobfs,
            gpus: f.gpus,
        })
    }

    /// Whether some node could take a share now: one that accepts jobs, is not held
    /// exclusively, and has a cpu free (every share wants at least one) or nothing on it.
    /// When not, nothing can be placed now until the pass takes nothing and closes nothing
    /// more (both only shrink what is free).
    pub fn room_now(&self) -> bool {
        self.free
            .iter()
            .zip(&self.closed)
            .any(|(f, closed)| !closed && f.exclusive == 0 && (f.cpus > 0 || f.holders == 0))
    }

    /// Plans nothing more on node `name` in this pass (a preemption is under way there).
    pub fn close(&mut self, name: &NodeName) {
        if let Some(i) = self.position(name) {
            let before = [self.standing(i)];
            self.closed[i] = true;
            self.note_shrunk(&[i], &before);
        }
    }

    /// Can `job` use the node at place `i` from `start` to its time limit as far as admin
    /// state, exclusions, features and reservation windows go?
    pub(crate) fn admits(&self, job: &Job, i: usize, start: TimeMs) -> bool {
        self.usable_for(job, i) && self.window_ok(job, i, start)
    }

    /// The places of partition `name`'s nodes, ascending (in name order).
    pub(crate) fn members(&self, name: &PartitionName) -> Option<&'a [usize]> {
        self.parts.get(name).map(|v| v.members)
    }

    /// The node at place `i`.
    pub(crate) fn node(&self, i: usize) -> &'a Node {
        self.nodes[i]
    }

    /// Finds nodes for `job` from now for `duration` (`None` = for ever) and takes them.
    /// `None`, and the pool unchanged, when it does not fit now.
    pub fn place(&mut self, job: &Job, duration: Option<Seconds>) -> Option<Vec<NodeName>> {
        if self.too_big_now(job) {
            return None;
        }
        let end = duration.map(|d| self.now.plus(d));
        let chosen = self.fit(job, self.now, end)?;
        self.take(job, &chosen, self.now, end);
        Some(self.names(&chosen))
    }

    /// Whether `job` asks for more cpus than the pool has free now, so [`Pool::place`] finds
    /// it no nodes. A job's shares ask for its cpus between them (an exclusive job's for
    /// whole nodes, whatever it asks, so it is left to `fit`). Most jobs a backfill pass
    /// walks on a busy machine are turned away here.
    #[inline]
    pub fn too_big_now(&self, job: &Job) -> bool {
        !job.spec.exclusive && i64::try_from(job.cpus()).map_or(true, |c| c > self.cpus_free_now)
    }

    /// The earliest start at or after now, among the instants nodes come free (rounded up to
    /// `resolution`, no later than `horizon`), at which `job` fits for `duration`; takes
    /// those nodes from then on. `None` when it fits nowhere before the horizon.
    pub fn reserve(
        &mut self,
        job: &Job,
        duration: Option<Seconds>,
        resolution: Seconds,
        horizon: TimeMs,
    ) -> Option<Placement> {
        // Without required nodes, the job fits at any start where enough nodes are feasible
        // for its largest share, and only such starts are tried: which they are depends only
        // on the union of each node's intervals, so touching ones may merge.
        let merge = job.spec.nodelist.is_empty();
        self.reserve_with(job, duration, resolution, horizon, merge)
    }

    fn reserve_with(
        &mut self,
        job: &Job,
        duration: Option<Seconds>,
        resolution: Seconds,
        horizon: TimeMs,
        merge: bool,
    ) -> Option<Placement> {
        if !self.profiled() {
            return None;
        }
        let members = self.parts.get(&job.resolved.partition)?.members;
        let wanted = (job.spec.nodes as usize).max(1);
        let step = resolution.0.max(1) * 1000;
        let round_up = |t: TimeMs| {
            let after = t.0.saturating_sub(self.now.0);
            TimeMs(
                self.now
                    .0
                    .saturating_add(after.div_ceil(step).saturating_mul(step)),
            )
        };
        // Each usable node's feasible starts for the job's largest share (a node that can
        // take it can take any smaller one): a few intervals per node.
        let mut opens: Instants = SmallVec::with_capacity(members.len() * 4);
        let mut closes: Instants = SmallVec::with_capacity(members.len() * 4);
        for &i in members {
            if !self.usable_for(job, i) {
                continue;
            }
            let Some(want) = crate::request::node_use(job, 0, &self.nodes[i].spec) else {
                continue;
            };
            let allowed = self.allowed_starts(job, i);
            for (a, b) in self.feasible_starts(i, &want, duration, merge) {
                for (x, y) in &allowed {
                    let (lo, hi) = (a.max(*x), b.min(*y));
                    if lo <= hi {
                        opens.push(lo);
                        closes.push(hi);
                    }
                }
            }
        }
        opens.sort_unstable();
        closes.sort_unstable();
        // The earliest (rounded) start inside at least `wanted` intervals at once.
        let mut candidates: Instants = opens.iter().map(|a| round_up(*a)).collect();
        candidates.sort_unstable();
        candidates.dedup();
        for start in candidates {
            if start > horizon {
                break;
            }
            let open = opens.partition_point(|a| *a <= start);
            let closed = closes.partition_point(|b| *b < start);
            if open.saturating_sub(closed) < wanted {
                continue;
            }
            let end = duration.map(|d| start.plus(d));
            if let Some(chosen) = self.fit(job, start, end) {
                self.take(job, &chosen, start, end);
                return Some(Placement {
                    nodes: self.names(&chosen),
                    start,
                    end: end.unwrap_or(TimeMs(u64::MAX)),
                });
            }
        }
        None
    }

    /// The closed intervals of start times at which `want` fits on node `i` for
    /// `duration`. Between two of the node's change points what is free at the start is
    /// fixed, so each stretch contributes at most one interval: from its first instant until
    /// the job would run into the first later change it does not fit beside.
    ///
    /// With `merge`, intervals that touch are given as one, the same starts in fewer
    /// intervals. Past the node's last take only returns follow and what is free only grows,
    /// so once the job fits there it fits at every later start: one interval to the end,
    /// found without walking the rest (the head's reservation on a machine of few wide
    /// nodes otherwise walked every later change once per stretch).
    fn feasible_starts(
        &self,
        i: usize,
        want: &NodeUse,
        duration: Option<Seconds>,
        merge: bool,
    ) -> Intervals {
        let changes = &self.changes[i];
        let mut out = Intervals::new();
        let push = |out: &mut Intervals, a: TimeMs, b: TimeMs| match out.last_mut() {
            Some(last) if merge && last.1.0.checked_add(1) == Some(a.0) => last.1 = b,
            _ => out.push((a, b)),
        };
        // The changes from here on are all returns.
        let only_returns_from = changes.only_returns_from();
        let mut free = self.free[i];
        let mut k = 0;
        let mut at = self.now;
        loop {
            // The stretch [at, next): what is free is `free`.
            let next = changes.get(k).map(|c| c.at);
            if free.fits(want) {
                if merge && k >= only_returns_from {
                    push(&mut out, at, TimeMs(u64::MAX));
                    break;
                }
                // The first later change after which the job would no longer fit.
                let mut f = free;
                let mut blocked = None;
                for c in &changes[k..] {
                    // Past the last take nothing can block it.
                    if changes.past_last_take(c.at) {
                        break;
                    }
                    f.apply(c);
                    if c.takes() && !f.fits(want) {
                        blocked = Some(c.at);
                        break;
                    }
                }
                // None: no start in this stretch ends before the take (one that runs for
                // ever never does). Not a start at 0, which is a start when now is 0.
                let last_start = match (blocked, duration) {
                    (None, _) => Some(TimeMs(u64::MAX)),
                    (Some(_), None) => None,
                    (Some(t), Some(d)) => t.0.checked_sub(d.0.saturating_mul(1000)).map(TimeMs),
                };
                let stretch_end = next.map_or(TimeMs(u64::MAX), |n| TimeMs(n.0 - 1));
                if let Some(b) = last_start.map(|last| last.min(stretch_end))
                    && b >= at
                {
                    push(&mut out, at, b);
                }
            }
            let Some(n) = next else {
                break;
            };
            while k < changes.len() && changes[k].at == n {
                free.apply(&changes[k]);
                k += 1;
            }
            at = n;
        }
        out
    }

    /// Whether this pool holds the profile of later returns, which reservations need (a
    /// main pass's pool never reserves; asked in debug builds).
    fn profiled(&self) -> bool {
        debug_assert_eq!(
            self.horizon,
            Horizon::Profile,
            "a reservation needs the profile"
        );
        self.horizon == Horizon::Profile
    }

    /// Takes a placement made earlier (a reservation from before a yield) again, if its
    /// nodes still exist and still fit it; `false` (and nothing taken) otherwise.
    pub fn hold(&mut self, job: &Job, placement: &Placement) -> bool {
        if !self.profiled() {
            return false;
        }
        let Some(chosen) = placement
            .nodes
            .iter()
            .map(|n| self.position(n))
            .collect::<Option<Vec<usize>>>()
        else {
            return false;
        };
        let end = (placement.end != TimeMs(u64::MAX)).then_some(placement.end);
        let start = placement.start.max(self.now);
        let fits = chosen.iter().enumerate().all(|(position, &i)| {
            crate::request::node_use(job, position, &self.nodes[i].spec)
                .is_some_and(|want| self.fits_over(i, &want, start, end).is_some())
        });
        if fits {
            self.take(job, &chosen, start, end);
        }
        fits
    }

    fn names(&self, chosen: &[usize]) -> Vec<NodeName> {
        chosen
            .iter()
            .map(|&i| self.nodes[i].spec.name.clone())
            .collect()
    }

    /// Brings the partitions' bounds up to date after what `nodes` have free now shrank
    /// (a take or a close) from `before` (their [`Pool::standing`] then). A bound moves only
    /// when the last members holding it shrank, and only then is it re-derived.
    fn note_shrunk(&mut self, nodes: &[usize], before: &[Option<(i64, i64)>]) {
        let (free, closed) = (&self.free, &self.closed);
        for (k, &i) in nodes.iter().enumerate() {
            let was = before[k].map_or(0, |(cpus, _)| cpus.max(0));
            self.cpus_free_now += cpus_standing(free, closed, i) - was;
        }
        for (_, v) in &mut self.parts.0 {
            let mut emptied = false;
            for (k, &i) in nodes.iter().enumerate() {
                let Some((cpus, memory)) = before[k] else {
                    continue;
                };
                if v.members.binary_search(&i).is_err() {
                    continue;
                }
                let (cpus_after, memory_after) =
                    standing(free, closed, i).unwrap_or((i64::MIN, i64::MIN));
                if cpus == v.most_free.0 && cpus_after < cpus {
                    v.holders.0 -= 1;
                    emptied |= v.holders.0 == 0;
                }
                if memory == v.most_free.1 && memory_after < memory {
                    v.holders.1 -= 1;
                    emptied |= v.holders.1 == 0;
                }
            }
            if emptied {
                (v.most_free, v.holders) = most_free_of(free, closed, v.members);
            }
        }
        debug_assert_eq!(
            self.cpus_free_now,
            (0..self.nodes.len())
                .map(|i| cpus_standing(&self.free, &self.closed, i))
                .sum::<i64>(),
            "the cpus free now are miscounted"
        );
        // Checked where it can have moved: the partitions holding these nodes.
        debug_assert!(
            self.parts
                .values()
                .filter(|v| nodes.iter().any(|i| v.members.binary_search(i).is_ok()))
                .all(|v| (v.most_free, v.holders) == self.most_free_of(v.members)),
            "a partition's bound of what is free now is stale"
        );
    }

    /// Takes `job`'s shares on `chosen` over `[start, end)`.
    fn take(&mut self, job: &Job, chosen: &[usize], start: TimeMs, end: Option<TimeMs>) {
        if start <= self.now {
            // What is free now only shrinks. (Every start, and every node a preemption
            // closed, re-derived every bound it touched, a walk of all members: a fifth of a
            // replay on a site of 1,492 nodes.)
            let before: SmallVec<[Option<(i64, i64)>; INLINE_CHOSEN]> =
                chosen.iter().map(|&i| self.standing(i)).collect();
            self.take_shares(job, chosen, start, end);
            self.note_shrunk(chosen, &before);
        } else {
            self.take_shares(job, chosen, start, end);
        }
    }

    fn take_shares(&mut self, job: &Job, chosen: &[usize], start: TimeMs, end: Option<TimeMs>) {
        for (position, &i) in chosen.iter().enumerate() {
            let Some(want) = crate::request::node_use(job, position, &self.nodes[i].spec) else {
                continue;
            };
            if start <= self.now {
                self.free[i].apply(&Change::of(start, &want, -1));
            } else {
                self.changes[i].insert(Change::of(start, &want, -1));
            }
            if let Some(end) = end
                && self.horizon == Horizon::Profile
            {
                // Never back by now: what is taken now is held at least until just after it
                // (a zero-length run, or a held reservation already over). Every change
                // stays after now, where `free` and `most_free` already count it.
                let end = end.max(TimeMs(self.now.0.saturating_add(1)));
                self.changes[i].insert(Change::of(end, &want, 1));
            }
        }
    }

    /// Does `want` fit on node `i` over `[start, end)`? If so, what is free there at `start`.
    fn fits_over(
        &self,
        i: usize,
        want: &NodeUse,
        start: TimeMs,
        end: Option<TimeMs>,
    ) -> Option<Free> {
        let mut f = self.free[i];
        let changes = &self.changes[i];
        let mut k = 0;
        while k < changes.len() && changes[k].at <= start {
            f.apply(&changes[k]);
            k += 1;
        }
        if !f.fits(want) {
            return None;
        }
        let at_start = f;
        while k < changes.len() && end.is_none_or(|e| changes[k].at < e) {
            // Past the node's last take only returns follow: nothing later can block it. (A
            // candidate for backfill otherwise walked every return before its end, a node's
            // whole profile for a long job, on every node it was tried on.)
            if changes.past_last_take(changes[k].at) {
                break;
            }
            f.apply(&changes[k]);
            if changes[k].takes() && !f.fits(want) {
                return None;
            }
            k += 1;
        }
        Some(at_start)
    }

    /// The windows of the advance reservations holding node `i` (none where there are no
    /// reservations: then the pool keeps no list per node).
    fn windows_of(&self, i: usize) -> &[(TimeMs, TimeMs, &'a ReservationName)] {
        self.windows.get(i).map_or(&[], Vec::as_slice)
    }

    /// Do advance reservations let `job` run on node `i` from `start` to its time limit? A
    /// job in a reservation only inside its window on its nodes; any other job never
    /// overlapping a window on a reserved node. Always the limit, never a prediction: the
    /// job may run that long, and apply checks the same.
    fn window_ok(&self, job: &Job, i: usize, start: TimeMs) -> bool {
        let windows = self.windows_of(i);
        let end = job.resolved.time_limit.map(|d| start.plus(d));
        match &job.spec.reservation {
            Some(name) => windows
                .iter()
                .any(|(s, e, r)| *r == name && start >= *s && end.is_some_and(|x| x <= *e)),
            None => windows
                .iter()
                .all(|(s, e, _)| start >= *e || end.is_some_and(|x| x <= *s)),
        }
    }

    /// The closed intervals of start times at which advance reservations let `job` run on
    /// node `i` up to its time limit.
    fn allowed_starts(&self, job: &Job, i: usize) -> Intervals {
        let windows = self.windows_of(i);
        let duration = job.resolved.time_limit;
        let back =
            |t: TimeMs| duration.map(|d| TimeMs(t.0.saturating_sub(d.0.saturating_mul(1000))));
        match &job.spec.reservation {
            Some(name) => windows
                .iter()
                .filter(|(_, _, r)| *r == name)
                .filter_map(|(s, e, _)| back(*e).filter(|last| last >= s).map(|last| (*s, last)))
                .collect(),
            None => {
                // Starts before each window that end by its start, and starts after it.
                let mut sorted: Intervals = windows.iter().map(|(s, e, _)| (*s, *e)).collect();
                sorted.sort_unstable();
                let mut out = Intervals::new();
                let mut from = self.now;
                for (s, e) in sorted {
                    if let Some(last) = back(s)
                        && last >= from
                    {
                        out.push((from, last));
                    }
                    from = from.max(e);
                }
                out.push((from, TimeMs(u64::MAX)));
                out
            }
        }
    }

    /// May `job` use node `i` at all (admin state, exclusions, features)?
    fn usable_for(&self, job: &Job, i: usize) -> bool {
        let n = self.nodes[i];
        !self.closed[i]
            && !job.spec.exclude.contains(&n.spec.name)
            && job.spec.features.is_subset(&n.spec.features)
    }

    /// The nodes `job` would get over `[start, end)`, in share order, without taking them.
    fn fit(&self, job: &Job, start: TimeMs, end: Option<TimeMs>) -> Option<Chosen> {
        let spec = &job.spec;
        let part = self.parts.get(&job.resolved.partition)?;
        let members = part.members;
        let wanted = spec.nodes as usize;
        if wanted == 0 || wanted > members.len() {
            return None;
        }
        // Starting now, no share can be larger than the most any member has free now. Only
        // for shares that do not depend on the node (not exclusive, not whole-node memory).
        let node_independent = !spec.exclusive && job.resolved.memory != MemoryRequest::WholeNode;
        if start <= self.now
            && node_independent
            && let ((cpus, memory), Some(&first)) = (part.most_free, members.first())
            && let Some(smallest) =
                crate::request::node_use(job, wanted - 1, &self.nodes[first].spec)
            && (i64::from(smallest.cpus) > cpus
                || i64::try_from(smallest.memory.0).is_ok_and(|m| m > memory))
        {
            return None;
        }
        let usable = |i: usize| self.usable_for(job, i);
        // Inline up to a few nodes: most jobs that get this far still find no node (a
        // backfill pass's candidates on a busy machine), and most that do need few.
        let mut chosen = Chosen::new();
        // Required nodes (`-w`) take the first shares, in name order.
        for name in &spec.nodelist {
            let i = self.position(name)?;
            if members.binary_search(&i).is_err() || !usable(i) || !self.window_ok(job, i, start) {
                return None;
            }
            let want = crate::request::node_use(job, chosen.len(), &self.nodes[i].spec)?;
            self.fits_over(i, &want, start, end)?;
            chosen.reserve_exact(wanted.saturating_sub(chosen.len()));
            chosen.push(i);
        }
        // The rest by best fit. Shares only shrink with position, so filling positions in
        // order gives the largest shares the first pick. Within a run of positions whose
        // shares ask the same of each node, picking the best node for each position in turn
        // picks the nodes in order of what they would have left: each run ranks the members
        // once. (Ranking them again for every position cost a job of a hundred nodes a
        // hundred walks of a thousand-node partition, three quarters of a replay there.)
        while chosen.len() < wanted {
            let position = chosen.len();
            let until = crate::request::same_share_until(job, position).clamp(position + 1, wanted);
            // The nodes chosen so far (required ones, an earlier run), marked by place when
            // there are more than a few; at most two runs, so marked at most twice.
            let taken: Option<Vec<bool>> = (chosen.len() > FEW_CHOSEN).then(|| {
                let mut marks = vec![false; self.nodes.len()];
                for &i in &chosen {
                    marks[i] = true;
                }
                marks
            });
            let is_taken = |i: usize| match &taken {
                Some(marks) => marks[i],
                None => chosen.contains(&i),
            };
            let candidates = members
                .iter()
                .filter(|&&i| !is_taken(i) && usable(i) && self.window_ok(job, i, start))
                .filter_map(|&i| self.left_after(job, position, i, start, end));
            let need = until - position;
            if need == 1 {
                let (_, _, i) = candidates.min()?;
                chosen.reserve_exact(wanted.saturating_sub(chosen.len()));
                chosen.push(i);
            } else {
                let mut ranked: Vec<(i64, i64, usize)> = candidates.collect();
                if ranked.len() < need {
                    return None;
                }
                if ranked.len() > need {
                    ranked.select_nth_unstable(need - 1);
                    ranked.truncate(need);
                }
                ranked.sort_unstable();
                chosen.reserve_exact(wanted.saturating_sub(chosen.len()));
                chosen.extend(ranked.iter().map(|r| r.2));
            }
        }
        Some(chosen)
    }

    /// What node `i` would have left at `start` (cpus, then memory, then its place: the
    /// best-fit order) if it took the job's `position`-th share over `[start, end)`; `None`
    /// when the share does not fit there.
    fn left_after(
        &self,
        job: &Job,
        position: usize,
        i: usize,
        start: TimeMs,
        end: Option<TimeMs>,
    ) -> Option<(i64, i64, usize)> {
        let want = crate::request::node_use(job, position, &self.nodes[i].spec)?;
        let f = self.fits_over(i, &want, start, end)?;
        Some((
            f.cpus - i64::from(want.cpus),
            f.memory
                .saturating_sub(i64::try_from(want.memory.0).unwrap_or(i64::MAX)),
            i,
        ))
    }
}

/// The places, in the state's nodes in name order, of the nodes `names` names that exist,
/// ascending: one walk of both, as both are sorted.
pub(crate) fn places<'n>(
    nodes: &'n [&Node],
    names: &'n std::collections::BTreeSet<NodeName>,
) -> impl Iterator<Item = usize> + 'n {
    let mut next = 0;
    names.iter().filter_map(move |name| {
        while next < nodes.len() && nodes[next].spec.name < *name {
            next += 1;
        }
        let found = nodes.get(next).is_some_and(|n| n.spec.name == *name);
        found.then_some(next)
    })
}

/// [`Pool::standing`], from the pool's fields.
fn standing(free: &[Free], closed: &[bool], i: usize) -> Option<(i64, i64)> {
    let f = &free[i];
    (!closed[i] && f.exclusive == 0).then_some((f.cpus, f.memory))
}

/// The most cpus and the most memory any usable one of `members` has free now (at least
/// 0), and how many usable members have exactly that.
fn most_free_of(free: &[Free], closed: &[bool], members: &[usize]) -> ((i64, i64), (usize, usize)) {
    let standing = || members.iter().filter_map(|&i| standing(free, closed, i));
    let most = standing().fold((0, 0), |(c, m), (fc, fm)| (c.max(fc), m.max(fm)));
    let holders = standing().fold((0, 0), |(c, m), (fc, fm)| {
        (c + usize::from(fc == most.0), m + usize::from(fm == most.1))
    });
    (most, holders)
}

/// The cpus node `i` adds to [`Pool::cpus_free_now`].
fn cpus_standing(free: &[Free], closed: &[bool], i: usize) -> i64 {
    standing(free, closed, i).map_or(0, |(cpus, _)| cpus.max(0))
}

/// Up to this many chosen nodes, best fit checks a node against the list itself; beyond,
/// against marks by place.
const FEW_CHOSEN: usize = 16;

/// Up to this many nodes a job is given are kept inline ([`Chosen`]).
const INLINE_CHOSEN: usize = 4;

/// The places of the nodes a job is given, in share order. Every start and every
/// reservation of a pass chooses nodes, and a list allocated for each was a tenth of a
/// pass's allocations; most jobs ask for a few nodes.
type Chosen = SmallVec<[usize; INLINE_CHOSEN]>;

/// Instants a reservation looks at: each usable node's feasible starts and ends, a few per
/// node, inline for the few nodes of a small partition.
type Instants = SmallVec<[TimeMs; 8]>;

/// Closed intervals of start times on one node: a few, in time order.
type Intervals = SmallVec<[(TimeMs, TimeMs); 4]>;

/// One node's changes after now, in time order (returns before takes at one instant), and
/// the instant of the latest take among them. Building a pool puts only returns here; a
/// take comes from a start later than now (a reservation, a held placement).
#[derive(Debug, Default)]
struct NodeChanges {
    /// Every change lies after the pool's now (what happens now is in `free`); `new` and
    /// `take_shares` keep it so.
    list: Vec<Change>,
    /// The latest instant at which a share is taken: past it only returns follow, and what
    /// is free only grows. `None`: only returns.
    last_take: Option<TimeMs>,
}

impl NodeChanges {
    fn with_capacity(n: usize) -> NodeChanges {
        NodeChanges {
            list: Vec::with_capacity(n),
            last_take: None,
        }
    }

    /// Adds `c` in its place: in time order, returns before takes at one instant.
    fn insert(&mut self, c: Change) {
        if c.takes() {
            self.last_take = self.last_take.max(Some(c.at));
        }
        let key = (c.at, c.takes());
        let at = self.list.partition_point(|x| (x.at, x.takes()) <= key);
        self.list.insert(at, c);
        debug_assert_eq!(
            self.last_take,
            self.list.iter().filter(|c| c.takes()).map(|c| c.at).max(),
            "a node's last take is miscounted"
        );
    }

    /// Whether a change at `at` lies past the last take, where nothing can block a share
    /// that fits: only returns follow.
    fn past_last_take(&self, at: TimeMs) -> bool {
        self.last_take.is_none_or(|t| at > t)
    }

    /// The place from which the changes are all returns: just after the last take (which
    /// sorts after the returns at its instant).
    fn only_returns_from(&self) -> usize {
        self.last_take.map_or(0, |t| {
            self.list
                .partition_point(|c| (c.at, c.takes()) <= (t, true))
        })
    }
}

impl std::ops::Deref for NodeChanges {
    type Target = [Change];

    fn deref(&self) -> &[Change] {
        &self.list
    }
}

/// Node `node`'s returns after `now` (never sooner than just after it: nothing still held
/// is planned on) as its first changes, in time order; their order at one instant does not
/// matter, they are all returns. `returns` is the pool's list for sorting them, left empty.
///
/// From the state's index of returns ([`crate::returns`]) where every job's end on the node
/// follows from the job alone, already in order; else each job looked up, then sorted. The
/// index has every node while it is kept (it is rebuilt whenever nodes come or go); where
/// it is not (backfill off), every node is looked up.
fn profile_returns<'a>(
    state: &'a State,
    node: &'a Node,
    indexed: Option<&'a crate::returns::NodeReturns>,
    now: TimeMs,
    returns: &mut Vec<(TimeMs, &'a NodeUse)>,
    changes: &mut NodeChanges,
) {
    let soonest = TimeMs(now.0.saturating_add(1));
    // In order as they come at any instant from the state's last one on
    // ([`crate::returns::Ends::at`]), as the planners plan: copied, with no list to sort.
    if let Some(r) = indexed.filter(|r| r.moving == 0 && now >= state.applied.now) {
        changes.list.extend(
            r.fixed
                .values()
                .map(|r| Change::of(r.ends.at(now).max(soonest), &r.share, 1)),
        );
        debug_assert!(
            changes.list.is_sorted_by_key(|c| c.at),
            "node {}'s returns are out of order",
            node.spec.name
        );
        return;
    }
    returns.reserve(node.jobs.len());
    returns.extend(looked_up_returns(state, node, now).map(|(at, u)| (at.max(soonest), u)));
    returns.sort_unstable_by_key(|r| r.0);
    changes
        .list
        .extend(returns.drain(..).map(|(at, u)| Change::of(at, u, 1)));
}

/// Node `node`'s jobs' expected ends as of `now`, each job looked up (a node holding a job
/// whose end moves with the clock; what the index is checked against).
fn looked_up_returns<'a>(
    state: &'a State,
    node: &'a Node,
    now: TimeMs,
) -> impl Iterator<Item = (TimeMs, &'a NodeUse)> + 'a {
    node.jobs.iter().filter_map(move |(id, u)| {
        let end = state.jobs.get(id).and_then(|j| expected_end(j, now));
        end.map(|end| (end, u))
    })
}

/// When a job holding resources is expected to give them back, if it is known: at its time
/// limit, or its (corrected) prediction where the site predicts run times (walltime does
/// not run while suspended, so a suspended job's end is unknown).
fn expected_end(job: &Job, now: TimeMs) -> Option<TimeMs> {
    if job.state == JobState::Suspended {
        return None;
    }
    if job.state == JobState::Completing {
        return Some(now);
    }
    let runtime = job.expected_runtime(now)?;
    Some(now.plus(runtime.saturating_sub(job.run_time(now))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantity::MiB;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn share(cpus: u32) -> NodeUse {
        NodeUse {
            cpus,
            memory: MiB(0),
            jobfs: MiB(0),
            gpus: 0,
            exclusive: false,
            suspended: false,
        }
    }

    /// A one-node pool at time 0 with `cpus` free and these changes (kept in order).
    fn pool(cpus: i64, changes: &[(u64, u32, bool)]) -> Pool<'static> {
        let mut list = NodeChanges::default();
        for &(at, c, take) in changes {
            list.insert(Change::of(TimeMs(at), &share(c), if take { -1 } else { 1 }));
        }
        Pool {
            now: TimeMs(0),
            horizon: Horizon::Profile,
            nodes: Vec::new(),
            free: vec![Free {
                cpus,
                memory: i64::MAX,
                jobfs: i64::MAX,
                gpus: 0,
                holders: 0,
                exclusive: 0,
            }],
            closed: vec![false],
            changes: vec![list],
            parts: PartitionViews::default(),
            windows: vec![Vec::new()],
            cpus_free_now: cpus.max(0),
        }
    }

    fn covers(intervals: &[(TimeMs, TimeMs)], t: u64) -> bool {
        intervals.iter().any(|(a, b)| a.0 <= t && t <= b.0)
    }

    #[test]
    fn past_the_last_take_one_interval_runs_to_the_end() {
        // 2 cpus free; 4 come back at 10 s, 2 more at 20 s; a reservation takes 6 at 30 s for
        // 10 s. A 4-cpu job of 5 s fits from 10 s until 25 s, and again from 40 s on.
        let p = pool(
            2,
            &[
                (10_000, 4, false),
                (20_000, 2, false),
                (30_000, 6, true),
                (40_000, 6, false),
                (50_000, 1, false),
            ],
        );
        let d = Some(Seconds(5));
        assert_eq!(
            p.feasible_starts(0, &share(4), d, true).to_vec(),
            vec![
                (TimeMs(10_000), TimeMs(25_000)),
                (TimeMs(40_000), TimeMs(u64::MAX))
            ]
        );
        assert_eq!(
            p.feasible_starts(0, &share(4), d, false).to_vec(),
            vec![
                (TimeMs(10_000), TimeMs(19_999)),
                (TimeMs(20_000), TimeMs(25_000)),
                (TimeMs(40_000), TimeMs(49_999)),
                (TimeMs(50_000), TimeMs(u64::MAX))
            ]
        );
    }

    /// A machine of nodes with these cpus in one default partition, a user to submit as.
    fn machine(cpus: &[u32]) -> (State, u64) {
        use crate::account::{AssocLimits, User, UserAssoc};
        use crate::command::Command;
        use crate::config::SchedConfig;
        use crate::node::NodeSpec;
        use crate::partition::Partition;
        use crate::qos::Qos;
        let config = SchedConfig::default();
        let mut commands = vec![Command::UpsertQos(Box::new(Qos::new(
            config.default_qos.clone(),
        )))];
        let mut names = std::collections::BTreeSet::new();
        for (k, &c) in cpus.iter().enumerate() {
            let name: NodeName = format!("n{k:02}").parse().unwrap();
            names.insert(name.clone());
            commands.push(Command::UpsertNode(NodeSpec {
                name,
                cpus: c,
                memory: MiB::gib(64),
                jobfs: MiB::gib(64),
                gpus: 0,
                features: Default::default(),
            }));
        }
        let mut p = Partition::new("work".parse().unwrap(), names);
        p.is_default = true;
        commands.push(Command::UpsertPartition(Box::new(p)));
        commands.push(Command::UpsertAccount {
            name: "proj".parse().unwrap(),
            parent: crate::account::ROOT.parse().unwrap(),
            shares: 1,
            limits: AssocLimits::default(),
            grant: None,
        });
        commands.push(Command::UpsertUser {
            user: User {
                name: "alice".parse().unwrap(),
                default_account: "proj".parse().unwrap(),
                admin: false,
            },
            assocs: vec![(
                "proj".parse().unwrap(),
                UserAssoc {
                    shares: 1,
                    priority: 0,
                    limits: AssocLimits::default(),
                },
            )],
        });
        let mut state = State::new(config);
        let mut index = 0;
        for c in commands {
            index += 1;
            state
                .apply(
                    crate::command::Envelope::controller(c),
                    crate::apply::ApplyCtx {
                        index,
                        time_ms: TimeMs(0),
                    },
                )
                .unwrap();
        }
        (state, index)
    }

    /// Each partition's members, as the pool finds them, by name.
    fn member_names(state: &State) -> BTreeMap<String, Vec<String>> {
        let pool = Pool::new(state, TimeMs(0), Horizon::Now);
        pool.parts
            .iter()
            .map(|(p, v)| {
                let names = v
                    .members
                    .iter()
                    .map(|&i| pool.nodes[i].spec.name.to_string())
                    .collect();
                (p.to_string(), names)
            })
            .collect()
    }

    #[test]
    fn partition_members_follow_nodes_that_come_and_go() {
        use crate::command::Command;
        let (mut state, mut index) = machine(&[4, 8]);
        let mut apply = |state: &mut State, c: Command| {
            apply_at(state, &mut index, c, TimeMs(0));
            state.check_invariants().unwrap();
        };
        let node = |name: &str, cpus| {
            Command::UpsertNode(crate::node::NodeSpec {
                name: name.parse().unwrap(),
                cpus,
                memory: MiB::gib(1),
                jobfs: MiB::gib(1),
                gpus: 0,
                features: Default::default(),
            })
        };
        // Added out of name order, each before the partition's nodes: every place shifts.
        apply(&mut state, node("m00", 2));
        apply(&mut state, node("a00", 1));
        let other = crate::partition::Partition::new(
            "other".parse().unwrap(),
            ["m00", "n01"].iter().map(|n| n.parse().unwrap()).collect(),
        );
        apply(&mut state, Command::UpsertPartition(Box::new(other)));
        let expect = |pairs: &[(&str, &[&str])]| -> BTreeMap<String, Vec<String>> {
            pairs
                .iter()
                .map(|(p, ns)| (p.to_string(), ns.iter().map(|n| n.to_string()).collect()))
                .collect()
        };
        assert_eq!(
            member_names(&state),
            expect(&[("other", &["m00", "n01"]), ("work", &["n00", "n01"])])
        );
        // Removed from before them all: every place shifts back.
        apply(&mut state, Command::RemoveNode("a00".parse().unwrap()));
        assert_eq!(
            member_names(&state),
            expect(&[("other", &["m00", "n01"]), ("work", &["n00", "n01"])])
        );
        let pool = Pool::new(&state, TimeMs(0), Horizon::Now);
        for (name, cpus) in [("m00", 2), ("n00", 4), ("n01", 8)] {
            let i = pool.position(&name.parse().unwrap()).unwrap();
            assert_eq!(pool.free_now(i).unwrap().cpus, cpus, "{name}");
        }
        assert!(pool.position(&"a00".parse().unwrap()).is_none());
    }

    const SCRIPT: &[u8] = b"#!/bin/sh\n";

    /// (nodes, tasks per node, limit in minutes, exclusive)
    type Shape = (u32, u32, u64, bool);

    /// The jobs of these shapes, cut to what the machine of `cpus` can hold.
    fn specs(cpus: &[u32], shapes: &[Shape]) -> Vec<crate::job::JobSpec> {
        let (most_nodes, narrowest) = (cpus.len() as u32, cpus.iter().copied().min().unwrap_or(1));
        shapes
            .iter()
            .map(|&(nodes, per_node, minutes, exclusive)| {
                let (nodes, per_node) = (nodes.min(most_nodes), per_node.min(narrowest));
                let mut s = crate::job::JobSpec::simple(
                    "alice".parse().unwrap(),
                    crate::job::BlobId::of(SCRIPT),
                );
                s.nodes = nodes;
                s.ntasks = nodes * per_node;
                s.memory = Some(MemoryRequest::PerNode(MiB(0)));
                s.jobfs = Some(MiB(0));
                s.time = crate::job::TimeRequest::Limit(Seconds(minutes * 60));
                s.exclusive = exclusive;
                s
            })
            .collect()
    }

    /// Best fit as first written: every position ranks every member again (the reference
    /// for ranking once per run of equal shares).
    fn fit_position_by_position(
        pool: &Pool<'_>,
        job: &Job,
        start: TimeMs,
        end: Option<TimeMs>,
    ) -> Option<Vec<usize>> {
        let members = pool.parts.get(&job.resolved.partition)?.members;
        let wanted = job.spec.nodes as usize;
        if wanted == 0 || wanted > members.len() {
            return None;
        }
        let mut chosen: Vec<usize> = Vec::new();
        while chosen.len() < wanted {
            let position = chosen.len();
            let mut best: Option<(i64, i64, usize)> = None;
            for &i in members {
                if chosen.contains(&i) || !pool.usable_for(job, i) || !pool.window_ok(job, i, start)
                {
                    continue;
                }
                if let Some(left) = pool.left_after(job, position, i, start, end)
                    && best.is_none_or(|b| left < b)
                {
                    best = Some(left);
                }
            }
            chosen.push(best?.2);
        }
        Some(chosen)
    }

    /// Applies `cmd` at `now` as the next log entry.
    fn apply_at(
        state: &mut State,
        index: &mut u64,
        cmd: crate::command::Command,
        now: TimeMs,
    ) -> crate::Response {
        *index += 1;
        let ctx = crate::apply::ApplyCtx {
            index: *index,
            time_ms: now,
        };
        state
            .apply(crate::command::Envelope::controller(cmd), ctx)
            .unwrap()
    }

    /// Submits `jobs` at `now`: their ids.
    fn submit(
        state: &mut State,
        index: &mut u64,
        jobs: Vec<crate::job::JobSpec>,
        now: TimeMs,
    ) -> Vec<Result<crate::ids::JobId, crate::Rejection>> {
        let blobs = vec![SCRIPT.to_vec()];
        let cmd = crate::command::Command::SubmitJobs { blobs, jobs };
        match apply_at(state, index, cmd, now) {
            crate::Response::Submitted(ids) => ids,
            other => panic!("submission answered {other:?}"),
        }
    }

    /// Submits `jobs` at `now` and starts what a main pass then starts.
    fn start_one(state: &mut State, index: &mut u64, jobs: Vec<crate::job::JobSpec>, now: TimeMs) {
        submit(state, index, jobs, now);
        let starts = state
            .main_pass(now, &mut crate::plan::Unlimited, None)
            .starts;
        apply_at(
            state,
            index,
            crate::command::Command::StartJobs(starts),
            now,
        );
    }

    fn shape() -> impl Strategy<Value = Shape> {
        (1u32..4, 1u32..9, 1u64..240, proptest::bool::weighted(0.15))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// `reserve` with and without merging makes the same reservations, one after another
        /// on one pool (so later ones meet the takes of earlier ones), on machines of several
        /// nodes with jobs of several nodes, exclusive ones, staggered ends and rounding.
        #[test]
        fn reservations_are_the_same_with_and_without_merging(
            cpus in proptest::collection::vec(4u32..17, 1..5),
            running in proptest::collection::vec((shape(), 0u64..90), 0..10),
            waiting in proptest::collection::vec(shape(), 1..8),
            resolution in 1u64..300,
        ) {
            let (mut state, mut index) = machine(&cpus);
            // Jobs start at staggered instants, so their ends spread.
            let mut now = TimeMs(0);
            for (s, gap) in &running {
                now = now.plus(Seconds(gap * 60));
                start_one(&mut state, &mut index, specs(&cpus, &[*s]), now);
            }
            now = now.plus(Seconds(37));
            let ids = submit(&mut state, &mut index, specs(&cpus, &waiting), now);
            let mut merged = Pool::new(&state, now, Horizon::Profile);
            let mut plain = Pool::new(&state, now, Horizon::Profile);
            let horizon = now.plus(Seconds(7 * 86_400));
            for id in ids {
                let job = &state.jobs[&id.unwrap()];
                let d = job.expected_runtime(now);
                let a = merged.reserve_with(job, d, Seconds(resolution), horizon, true);
                let b = plain.reserve_with(job, d, Seconds(resolution), horizon, false);
                prop_assert_eq!(a, b);
            }
        }

        /// The state's index of returns gives each node the same returns as looking every job
        /// up: jobs started at instants with milliseconds (whole seconds run are counted), some
        /// suspended (no return), some suspended and resumed (their limit moves by the whole
        /// seconds suspended), some cancelled (completing: as soon as possible), some past
        /// their limit, seen from a pass at an instant with milliseconds of its own.
        #[test]
        fn indexed_returns_are_the_looked_up_ones(
            cpus in proptest::collection::vec(4u32..17, 1..5),
            running in proptest::collection::vec((shape(), 0u64..90_000, 0u8..6), 0..10),
            later in 0u64..20_000_000,
            whole_seconds in any::<bool>(),
        ) {
            use crate::command::Command;
            use crate::job::JobRef;
            let (mut state, mut index) = machine(&cpus);
            let mut now = TimeMs(0);
            // Instants at whole seconds, as in a replay, or with milliseconds.
            let instant = |ms: u64| if whole_seconds { ms / 1000 * 1000 } else { ms };
            let later = instant(later);
            for (s, gap, fate) in &running {
                let gap = &instant(*gap);
                now = TimeMs(now.0 + gap);
                let before = state.next_job_id;
                start_one(&mut state, &mut index, specs(&cpus, &[*s]), now);
                let id = crate::ids::JobId(before);
                if !state.jobs[&id].state.holds_resources() {
                    continue;
                }
                let jobs = vec![JobRef { job: id, task: None }];
                match fate {
                    0 | 2 => {
                        let cmd = Command::SuspendJobs { jobs: jobs.clone() };
                        apply_at(&mut state, &mut index, cmd, now);
                    }
                    1 => {
                        apply_at(&mut state, &mut index, Command::CancelJobs { jobs }, now);
                        continue;
                    }
                    _ => continue,
                }
                if *fate == 2 {
                    // Resumed before the next job starts, after some seconds and milliseconds.
                    now = TimeMs(now.0 + gap / 2);
                    apply_at(&mut state, &mut index, Command::ResumeJobs { jobs }, now);
                    prop_assert_eq!(state.jobs[&id].state, crate::job::JobState::Running);
                }
            }
            state.check_invariants().unwrap();
            let now = TimeMs(now.0 + later);
            for node in state.nodes.values() {
                let of_node = state.returns.of_node(&node.spec.name);
                prop_assert!(of_node.is_some(), "the returns index is kept");
                let soonest = TimeMs(now.0 + 1);
                let looked_up: Vec<_> = looked_up_returns(&state, node, now)
                    .map(|(at, u)| (at.max(soonest), u))
                    .collect();
                let mut expected: Vec<Change> =
                    looked_up.iter().map(|(at, u)| Change::of(*at, u, 1)).collect();
                // A pool's first changes: the same returns, in time order, whether taken
                // from the index as they are or sorted.
                let mut scratch = Vec::new();
                let mut profile = NodeChanges::default();
                profile_returns(&state, node, of_node, now, &mut scratch, &mut profile);
                prop_assert!(scratch.is_empty());
                prop_assert!(profile.windows(2).all(|w| w[0].at <= w[1].at), "{profile:?}");
                let mut profiled: Vec<Change> = profile.to_vec();
                let order = |c: &Change| {
                    let d = &c.delta;
                    (c.at, d.cpus, d.memory, d.jobfs, d.gpus, d.holders, d.exclusive)
                };
                profiled.sort_unstable_by_key(order);
                expected.sort_unstable_by_key(order);
                prop_assert_eq!(profiled, expected);
            }
        }

        /// Ranking the members once per run of equal shares picks the same nodes, in the
        /// same order, as ranking them for every position: on machines of unequal nodes
        /// partly taken, for jobs whose tasks do not divide evenly over their nodes (the
        /// first nodes take one more), exclusive ones, now and later.
        #[test]
        fn best_fit_ranks_once_per_run_of_equal_shares(
            cpus in proptest::collection::vec(2u32..17, 1..41),
            running in proptest::collection::vec(shape(), 0..8),
            // Up to 40 nodes: past a few chosen nodes, fit marks them by place.
            waiting in proptest::collection::vec(
                ((1u32..41, 1u32..9, 1u64..240, proptest::bool::weighted(0.15)), 0u32..40),
                1..8,
            ),
            later in 1u64..120,
        ) {
            let (mut state, mut index) = machine(&cpus);
            let now = TimeMs(60_000);
            for s in &running {
                start_one(&mut state, &mut index, specs(&cpus, &[*s]), now);
            }
            // Fewer tasks than nodes times tasks per node: the first nodes take one more.
            let jobs: Vec<crate::job::JobSpec> = waiting
                .iter()
                .map(|(shape, fewer)| {
                    let mut s = specs(&cpus, &[*shape]).remove(0);
                    s.ntasks = s.ntasks.saturating_sub(*fewer).max(s.nodes);
                    s
                })
                .collect();
            let ids = submit(&mut state, &mut index, jobs, now);
            let pool = Pool::new(&state, now, Horizon::Profile);
            for id in ids {
                let job = &state.jobs[&id.unwrap()];
                let end = job.expected_runtime(now).map(|d| now.plus(d));
                prop_assert_eq!(
                    pool.fit(job, now, end).map(|c| c.to_vec()),
                    fit_position_by_position(&pool, job, now, end)
                );
                let start = now.plus(Seconds(later * 60));
                let end = job.expected_runtime(now).map(|d| start.plus(d));
                prop_assert_eq!(
                    pool.fit(job, start, end).map(|c| c.to_vec()),
                    fit_position_by_position(&pool, job, start, end)
                );
            }
        }

        /// Stopping at a node's last take changes nothing: whether a share fits over a
        /// stretch, and what is free at its start, are those of walking every change before
        /// its end; and the changes from `only_returns_from` on are all returns, the first
        /// of them just after the last take.
        #[test]
        fn a_walk_stops_at_the_last_take_with_the_same_answer(
            free in 0i64..16,
            changes in proptest::collection::vec((1u64..40, 1u32..8, any::<bool>()), 0..12),
            want in 1u32..12,
            start in 0u64..45,
            duration in proptest::option::of(0u64..45),
        ) {
            let changes: Vec<(u64, u32, bool)> =
                changes.into_iter().map(|(t, c, take)| (t * 1000, c, take)).collect();
            let p = pool(free, &changes);
            let list = &p.changes[0];
            let from = list.only_returns_from();
            prop_assert_eq!(from, list.iter().rposition(Change::takes).map_or(0, |k| k + 1));
            let start = TimeMs(start * 1000);
            let end = duration.map(|d| start.plus(Seconds(d)));
            // Every change up to the start, then every one before the end, as the walk went
            // before it stopped early.
            let walked = || {
                let mut f = p.free[0];
                let (upto, after): (Vec<&Change>, Vec<&Change>) =
                    list.iter().partition(|c| c.at <= start);
                upto.iter().for_each(|c| f.apply(c));
                let at_start = f.fits(&share(want)).then_some(f)?;
                for c in after.iter().filter(|c| end.is_none_or(|e| c.at < e)) {
                    f.apply(c);
                    if c.takes() && !f.fits(&share(want)) {
                        return None;
                    }
                }
                Some(at_start)
            };
            prop_assert_eq!(p.fits_over(0, &share(want), start, end), walked());
        }

        /// Merging gives the same starts: the reservation, which depends only on how many
        /// nodes are feasible at each start (without required nodes), cannot change.
        #[test]
        fn merged_intervals_hold_exactly_the_same_starts(
            free in 0i64..16,
            changes in proptest::collection::vec((1u64..40, 1u32..8, any::<bool>()), 0..12),
            want in 1u32..12,
            duration in proptest::option::of(0u64..20),
        ) {
            // Whole seconds, so that interval ends fall between the probes below.
            let changes: Vec<(u64, u32, bool)> =
                changes.into_iter().map(|(t, c, take)| (t * 1000, c, take)).collect();
            let p = pool(free, &changes);
            let d = duration.map(Seconds);
            let merged = p.feasible_starts(0, &share(want), d, true);
            let plain = p.feasible_starts(0, &share(want), d, false);
            for pair in merged.windows(2) {
                prop_assert!(pair[0].1.0.saturating_add(1) < pair[1].0.0, "{merged:?}");
            }
            let mut probes: Vec<u64> = vec![0, u64::MAX];
            for (a, b) in merged.iter().chain(&plain) {
                probes.extend([a.0, b.0, a.0.saturating_sub(1), b.0.saturating_add(1)]);
            }
            for t in (0..45_000).step_by(250) {
                probes.push(t);
            }
            for t in probes {
                prop_assert_eq!(covers(&merged, t), covers(&plain, t), "at {}: {:?} {:?}", t, merged, plain);
                // A start is feasible exactly where the share fits over the whole run (the
                // walks' cut-offs at the last take, checked against each other).
                if t < u64::MAX / 2 {
                    let start = TimeMs(t);
                    let fits = p.fits_over(0, &share(want), start, d.map(|d| start.plus(d)));
                    prop_assert_eq!(covers(&plain, t), fits.is_some(), "at {}: {:?}", t, plain);
                }
            }
        }
    }
}
