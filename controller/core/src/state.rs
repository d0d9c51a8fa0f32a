//! The replicated state: everything every controller replica holds.
//!
//! Ordered collections (BTreeMap/BTreeSet), or hash maps written in key order
//! ([`crate::lookup`]), so iteration that matters, serialization and therefore snapshots are
//! identical on every replica. Indexes derived from the jobs (live jobs per user, jobs holding
//! resources, each user's associations) are not serialized: [`State::rebuild_indexes`]
//! recomputes them after a restore, and `check_invariants` verifies they match.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::account::{AccountTree, User};
use crate::assoc::AssocId;
use crate::config::SchedConfig;
use crate::ids::{AccountName, JobId, NodeName, PartitionName, QosName, UserName};
use crate::job::{BlobId, Job};
use crate::job_table::JobTable;
use crate::lookup::NameMap;
use crate::node::Node;
use crate::partition::Partition;
use crate::qos::Qos;
use crate::quantity::TimeMs;
use crate::relations::Relations;

/// A script or environment, stored once however many jobs use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    pub data: Vec<u8>,
    /// Jobs referencing it; the blob is dropped when this reaches zero.
    pub refs: u64,
}

/// A user, and what submission needs to know about them without searching: their live
/// jobs and their associations. One hash lookup per job finds all of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserEntry {
    pub user: User,
    /// The run times of their last jobs that ran to their end (what runtime predictions
    /// read; two at most).
    pub recent_runtimes: crate::predict::RecentRuntimes,
    /// Their jobs that are not terminal (derived from the jobs).
    #[serde(skip)]
    pub(crate) live: BTreeSet<JobId>,
    /// Their associations in account order (derived from the association table).
    #[serde(skip)]
    pub(crate) assocs: Vec<(AccountName, AssocId)>,
    /// The scripts and environments their jobs in the queue hold, with how many of their
    /// jobs hold each (derived from the jobs), and those blobs' total size: what the
    /// per-user cap on stored bytes counts.
    #[serde(skip)]
    pub(crate) stored: BTreeMap<BlobId, u32>,
    #[serde(skip)]
    pub(crate) stored_bytes: u64,
}

impl UserEntry {
    pub fn new(user: User) -> UserEntry {
        UserEntry {
            user,
            recent_runtimes: Default::default(),
            live: BTreeSet::new(),
            assocs: Vec::new(),
            stored: BTreeMap::new(),
            stored_bytes: 0,
        }
    }

    /// The id of this user's association with `account`, if they are a member.
    pub fn assoc(&self, account: &AccountName) -> Option<AssocId> {
        self.assocs
            .iter()
            .find(|(a, _)| a == account)
            .map(|(_, id)| *id)
    }
}

/// Where the log stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// Index of the last applied log entry.
    pub index: u64,
    /// The latest leader time seen; never goes backwards, even if a new leader's clock does.
    pub now: TimeMs,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub applied: Applied,
    pub config: SchedConfig,
    pub nodes: BTreeMap<NodeName, Node>,
    pub partitions: BTreeMap<PartitionName, Partition>,
    pub qos: BTreeMap<QosName, Qos>,
    pub reservations: BTreeMap<crate::ids::ReservationName, crate::reservation::Reservation>,
    pub accounts: AccountTree,
    /// Ids of the (account, user) associations.
    pub assocs: crate::assoc::AssocTable,
    /// Looked up on every submission: hashed (see [`crate::lookup`]).
    #[serde(with = "crate::lookup::sorted")]
    pub users: NameMap<UserName, UserEntry>,
    /// Hashed for lookups, iterated in id order (see [`crate::job_table`]).
    pub jobs: JobTable,
    pub blobs: BTreeMap<BlobId, Blob>,
    /// Fair-share usage per association.
    pub usage: crate::usage::UsageLedger,
    /// The next job id to hand out; ids are never reused.
    pub next_job_id: u64,
    /// The next dispatch epoch; every start and requeue takes a fresh one.
    pub next_epoch: u64,
    /// The command version every replica applies, so the one commands are written in
    /// ([`Command::RaiseCommandVersion`](crate::Command::RaiseCommandVersion)).
    #[serde(
        deserialize_with = "crate::layout::since_v2",
        skip_serializing_if = "crate::layout::before_v2",
        default
    )]
    pub command_version: ClusterCommandVersion,
    /// The version of the envelope being applied (not state: set at each apply).
    #[serde(skip, default = "current_command_version")]
    pub(crate) applying_version: u16,
    /// Jobs holding node resources (derived).
    #[serde(skip)]
    pub(crate) holding: BTreeSet<JobId>,
    /// Jobs whose shares some node marks suspended (derived): found without walking every
    /// node's shares, which every main and direct pass asks about.
    #[serde(skip)]
    pub(crate) suspended_shares: BTreeSet<JobId>,
    /// Dependents and array tasks of each job (derived).
    #[serde(skip)]
    pub(crate) relations: Relations,
    /// Which account, QOS and partition limits exist at all (derived from the
    /// configuration).
    #[serde(skip)]
    pub(crate) account_rules: crate::policy::AccountRules,
    /// What each partition's nodes offer a job (derived from the nodes and partitions;
    /// recomputed whenever either changes).
    #[serde(skip)]
    pub(crate) partition_caps: BTreeMap<PartitionName, crate::apply::submit::NodeCaps>,
    /// Each partition's nodes as their places in `nodes` (in name order), ascending
    /// (derived from the nodes and partitions; recomputed whenever either changes). Every
    /// pass's availability profile starts from them: finding a large machine's members by
    /// name at every pass was most of a replay on a site of 976 nodes.
    #[serde(skip)]
    pub(crate) partition_members: BTreeMap<PartitionName, Vec<usize>>,
    /// Jobs purged and not yet archived by the daemon (see [`crate::apply::purge`]).
    #[serde(skip)]
    pub(crate) finished: crate::apply::purge::Outbox,
    /// The idle queue in order of consideration, where that order is time-independent
    /// (derived).
    #[serde(skip)]
    pub(crate) queue_index: crate::queue_index::QueueIndex,
    /// When each node's running jobs give their shares back, in order (derived).
    #[serde(skip)]
    pub(crate) returns: crate::returns::Returns,
    /// Terminal jobs in order of their end, what purging walks (derived; see
    /// [`crate::apply::purge`]).
    #[serde(skip)]
    pub(crate) ended: BTreeSet<(TimeMs, JobId)>,
    /// The pending jobs whose placement the clock alone can move: what the tick re-places
    /// (derived; kept by `State::set_pending` and for every job a command marks in the
    /// queue index).
    #[serde(skip)]
    pub(crate) clocked: BTreeSet<JobId>,
}

fn current_command_version() -> u16 {
    crate::command::COMMAND_VERSION
}

/// The command version a cluster writes. It starts at the last version before the cluster
/// kept one (3), as a state restored from an older snapshot was written by replicas of that
/// version; the leader raises it once every replica applies a newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterCommandVersion(pub u16);

impl Default for ClusterCommandVersion {
    fn default() -> Self {
        ClusterCommandVersion(3)
    }
}

impl Default for State {
    fn default() -> Self {
        Self::new(SchedConfig::default())
    }
}

impl State {
    pub fn new(config: SchedConfig) -> State {
        let mut state = State {
            applied: Applied::default(),
            config,
            nodes: BTreeMap::new(),
            partitions: BTreeMap::new(),
            qos: BTreeMap::new(),
            reservations: BTreeMap::new(),
            accounts: AccountTree::new(),
            assocs: crate::assoc::AssocTable::default(),
            users: NameMap::default(),
            jobs: JobTable::new(),
            blobs: BTreeMap::new(),
            usage: crate::usage::UsageLedger::default(),
            next_job_id: 1,
            next_epoch: 1,
            // Every replica starts here and replays the same raises from the log, so a replica
            // that replays from the first entry agrees with one restored from a snapshot.
            command_version: ClusterCommandVersion::default(),
            applying_version: crate::command::COMMAND_VERSION,
            holding: BTreeSet::new(),
            suspended_shares: BTreeSet::new(),
            relations: Relations::default(),
            account_rules: crate::policy::AccountRules::default(),
            partition_caps: BTreeMap::new(),
            partition_members: BTreeMap::new(),
            finished: crate::apply::purge::Outbox::default(),
            queue_index: crate::queue_index::QueueIndex::default(),
            returns: crate::returns::Returns::default(),
            ended: BTreeSet::new(),
            clocked: BTreeSet::new(),
        };
        state.account_rules = crate::policy::AccountRules::of(&state);
        state.queue_index = state.compute_queue_index();
        state.returns = state.compute_returns();
        state
    }

    /// Recomputes every derived index from the jobs and the association table.
    pub fn rebuild_indexes(&mut self) {
        let (mut live, mut assocs) = self.compute_user_index();
        let mut stored = self.compute_stored();
        for (name, entry) in self.users.iter_mut() {
            entry.live = live.remove(name).unwrap_or_default();
            entry.assocs = assocs.remove(name).unwrap_or_default();
            (entry.stored, entry.stored_bytes) = stored.remove(name).unwrap_or_default();
        }
        self.holding = self.compute_holding();
        self.suspended_shares = self.compute_suspended_shares();
        self.relations = Relations::compute(self.jobs.values());
        self.account_rules = crate::policy::AccountRules::of(self);
        self.refresh_partition_views();
        self.queue_index = self.compute_queue_index();
        self.returns = self.compute_returns();
        self.ended = self.compute_ended();
        self.clocked = self.compute_clocked();
    }

    /// Recomputes what is derived from the nodes and partitions together; every command
    /// that adds or removes a node or changes a partition calls it.
    pub(crate) fn refresh_partition_views(&mut self) {
        self.partition_caps = self.compute_partition_caps();
        self.partition_members = self.compute_partition_members();
    }

    pub(crate) fn compute_partition_members(&self) -> BTreeMap<PartitionName, Vec<usize>> {
        let nodes: Vec<&Node> = self.nodes.values().collect();
        self.partitions
            .values()
            .map(|p| {
                let members = crate::plan::pool::places(&nodes, &p.nodes).collect();
                (p.name.clone(), members)
            })
            .collect()
    }

    pub(crate) fn compute_suspended_shares(&self) -> BTreeSet<JobId> {
        self.nodes
            .values()
            .flat_map(|n| n.jobs.iter())
            .filter(|(_, u)| u.suspended)
            .map(|(id, _)| *id)
            .collect()
    }

    pub(crate) fn compute_holding(&self) -> BTreeSet<JobId> {
        self.jobs
            .values()
            .filter(|j| j.state.holds_resources())
            .map(|j| j.id)
            .collect()
    }

    /// Each user's live jobs and associations, as the derived fields of [`UserEntry`]
    /// should hold them.
    #[allow(clippy::type_complexity)]
    pub(crate) fn compute_user_index(
        &self,
    ) -> (
        NameMap<UserName, BTreeSet<JobId>>,
        NameMap<UserName, Vec<(AccountName, AssocId)>>,
    ) {
        let mut live: NameMap<UserName, BTreeSet<JobId>> = NameMap::default();
        for job in self.jobs.values().filter(|j| !j.state.is_terminal()) {
            live.entry(job.spec.user.clone())
                .or_default()
                .insert(job.id);
        }
        let mut assocs: NameMap<UserName, Vec<(AccountName, AssocId)>> = NameMap::default();
        // The table iterates by account, so each user's list comes out in account order.
        for (account, user, id) in self.assocs.iter() {
            assocs
                .entry(user.clone())
                .or_default()
                .push((account.clone(), id));
        }
        (live, assocs)
    }

    /// Each user's stored blobs (with the count of their jobs holding each) and their total
    /// size, as [`UserEntry`]'s derived fields should hold them.
    pub(crate) fn compute_stored(&self) -> NameMap<UserName, (BTreeMap<BlobId, u32>, u64)> {
        let mut out: NameMap<UserName, (BTreeMap<BlobId, u32>, u64)> = NameMap::default();
        for job in self.jobs.values() {
            let (held, bytes) = out.entry(job.spec.user.clone()).or_default();
            for id in std::iter::once(job.spec.script).chain(job.spec.env) {
                let n = held.entry(id).or_default();
                if *n == 0 {
                    *bytes += self.blobs.get(&id).map_or(0, |b| b.data.len() as u64);
                }
                *n += 1;
            }
        }
        out
    }

    /// One more of `user`'s jobs holds blob `id` (which is stored).
    pub(crate) fn retain_blob(&mut self, user: &UserName, id: BlobId) {
        let Some(blob) = self.blobs.get_mut(&id) else {
            return;
        };
        blob.refs += 1;
        let size = blob.data.len() as u64;
        if let Some(entry) = self.users.get_mut(user) {
            let n = entry.stored.entry(id).or_default();
            if *n == 0 {
                entry.stored_bytes += size;
            }
            *n += 1;
        }
    }

    /// One fewer of `user`'s jobs holds blob `id`; the blob goes when no job holds it.
    pub(crate) fn release_blob(&mut self, user: &UserName, id: BlobId) {
        let Some(blob) = self.blobs.get_mut(&id) else {
            return;
        };
        blob.refs = blob.refs.saturating_sub(1);
        let size = blob.data.len() as u64;
        if blob.refs == 0 {
            self.blobs.remove(&id);
        }
        if let Some(entry) = self.users.get_mut(user)
            && let Some(n) = entry.stored.get_mut(&id)
        {
            *n -= 1;
            if *n == 0 {
                entry.stored.remove(&id);
                entry.stored_bytes -= size;
            }
        }
    }

    /// The bytes `user`'s queued jobs hold in scripts and environments.
    pub fn stored_bytes_of(&self, user: &UserName) -> u64 {
        self.users.get(user).map_or(0, |e| e.stored_bytes)
    }

    /// The user's jobs that are not terminal, in id order.
    pub fn live_jobs_of<'a>(&'a self, user: &UserName) -> impl Iterator<Item = &'a Job> + 'a {
        self.users
            .get(user)
            .into_iter()
            .flat_map(|entry| entry.live.iter())
            .filter_map(|id| self.jobs.get(id))
    }

    /// Users that have live jobs, in name order.
    pub(crate) fn users_with_live_jobs(&self) -> Vec<UserName> {
        let mut users: Vec<UserName> = self
            .users
            .iter()
            .filter(|(_, entry)| !entry.live.is_empty())
            .map(|(name, _)| name.clone())
            .collect();
        // Hash order must not reach state.
        users.sort_unstable();
        users
    }

    /// Sets a user's associations in the derived index from the association table, given
    /// the accounts the user belongs to.
    pub(crate) fn reindex_assocs_of<'a>(
        &mut self,
        user: &UserName,
        accounts: impl Iterator<Item = &'a AccountName>,
    ) {
        let mut mine: Vec<(AccountName, AssocId)> = accounts
            .filter_map(|a| self.assocs.id(a, user).map(|id| (a.clone(), id)))
            .collect();
        mine.sort_unstable();
        if let Some(entry) = self.users.get_mut(user) {
            entry.assocs = mine;
        }
    }

    /// The default partition, if one is marked.
    pub fn default_partition(&self) -> Option<&Partition> {
        self.partitions.values().find(|p| p.is_default)
    }

    /// The jobs holding node resources (running, suspended, completing), from the index kept
    /// for that: the daemon's dispatcher walks these, not the whole queue.
    pub fn holding_jobs(&self) -> impl Iterator<Item = &Job> + '_ {
        self.holding.iter().filter_map(|id| self.jobs.get(id))
    }

    /// Whether `user` coordinates `account` or an account above it.
    pub fn is_coordinator(&self, user: &UserName, account: &AccountName) -> bool {
        let mut at = Some(account);
        while let Some(name) = at {
            let Some(a) = self.accounts.accounts.get(name) else {
                return false;
            };
            if a.coordinators.contains(user) {
                return true;
            }
            at = a.parent.as_ref();
        }
        false
    }

    /// Whether `actor` is an administrator: root, the controller, or a user with
    /// `AdminLevel`. A node's agent never is.
    pub fn is_admin(&self, actor: &crate::command::Actor) -> bool {
        match actor {
            crate::command::Actor::Operator | crate::command::Actor::Controller => true,
            crate::command::Actor::User(u) => self.users.get(u).is_some_and(|e| e.user.admin),
            crate::command::Actor::Node(_) => false,
        }
    }

    /// Records a job as live for its owner (who exists: submission checked).
    pub(crate) fn index_live(&mut self, job: &Job) {
        if let Some(entry) = self.users.get_mut(&job.spec.user) {
            entry.live.insert(job.id);
        }
    }

    /// Records a job that has just ended for good: no longer live for its owner, and due
    /// to be purged `MinJobAge` after its end.
    pub(crate) fn index_ended(&mut self, user: &UserName, id: JobId) {
        if let Some(entry) = self.users.get_mut(user) {
            entry.live.remove(&id);
        }
        if let Some(end) = self.jobs.get(&id).and_then(|j| j.end_time) {
            self.ended.insert((end, id));
        }
    }
}
