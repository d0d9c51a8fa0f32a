//! The replicated state: everything every controller replica holds.
//!
//! Only ordered collections (BTreeMap/BTreeSet) so iteration, serialization and therefore
//! snapshots are identical on every replica. Indexes derived from the jobs (jobs per user) are
//! not serialized: [`State::rebuild_indexes`] recomputes them after a restore, and
//! `check_invariants` verifies they match.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::account::{AccountTree, User};
use crate::config::SchedConfig;
use crate::ids::{JobId, NodeName, PartitionName, QosName, UserName};
use crate::job::{BlobId, Job};
use crate::node::Node;
use crate::partition::Partition;
use crate::qos::Qos;
use crate::quantity::TimeMs;

/// A script or environment, stored once however many jobs use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    pub data: Vec<u8>,
    /// Jobs referencing it; the blob is dropped when this reaches zero.
    pub refs: u64,
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
    pub accounts: AccountTree,
    /// Ids of the (account, user) associations.
    pub assocs: crate::assoc::AssocTable,
    pub users: BTreeMap<UserName, User>,
    /// Boxed: a job is ~850 bytes, and B-tree nodes filled in id order are about half
    /// empty; boxing keeps that slack to a pointer per slot.
    pub jobs: BTreeMap<JobId, Box<Job>>,
    pub blobs: BTreeMap<BlobId, Blob>,
    /// Fair-share usage per association.
    pub usage: crate::usage::UsageLedger,
    /// The next job id to hand out; ids are never reused.
    pub next_job_id: u64,
    /// The next dispatch epoch; every start and requeue takes a fresh one.
    pub next_epoch: u64,
    /// Jobs not yet terminal, per owner (derived).
    #[serde(skip)]
    pub(crate) live_by_user: BTreeMap<UserName, BTreeSet<JobId>>,
    /// Jobs holding node resources (derived).
    #[serde(skip)]
    pub(crate) holding: BTreeSet<JobId>,
}

impl Default for State {
    fn default() -> Self {
        Self::new(SchedConfig::default())
    }
}

impl State {
    pub fn new(config: SchedConfig) -> State {
        State {
            applied: Applied::default(),
            config,
            nodes: BTreeMap::new(),
            partitions: BTreeMap::new(),
            qos: BTreeMap::new(),
            accounts: AccountTree::new(),
            assocs: crate::assoc::AssocTable::default(),
            users: BTreeMap::new(),
            jobs: BTreeMap::new(),
            blobs: BTreeMap::new(),
            usage: crate::usage::UsageLedger::default(),
            next_job_id: 1,
            next_epoch: 1,
            live_by_user: BTreeMap::new(),
            holding: BTreeSet::new(),
        }
    }

    /// Recomputes every derived index from the jobs.
    pub fn rebuild_indexes(&mut self) {
        self.live_by_user = self.compute_live_by_user();
        self.holding = self.compute_holding();
    }

    pub(crate) fn compute_holding(&self) -> BTreeSet<JobId> {
        self.jobs
            .values()
            .filter(|j| j.state.holds_resources())
            .map(|j| j.id)
            .collect()
    }

    pub(crate) fn compute_live_by_user(&self) -> BTreeMap<UserName, BTreeSet<JobId>> {
        let mut by_user: BTreeMap<UserName, BTreeSet<JobId>> = BTreeMap::new();
        for job in self.jobs.values().filter(|j| !j.state.is_terminal()) {
            by_user
                .entry(job.spec.user.clone())
                .or_default()
                .insert(job.id);
        }
        by_user
    }

    /// The user's jobs that are not terminal, in id order.
    pub fn live_jobs_of<'a>(&'a self, user: &UserName) -> impl Iterator<Item = &'a Job> + 'a {
        self.live_by_user
            .get(user)
            .into_iter()
            .flatten()
            .filter_map(|id| self.jobs.get(id).map(|j| &**j))
    }

    /// The default partition, if one is marked.
    pub fn default_partition(&self) -> Option<&Partition> {
        self.partitions.values().find(|p| p.is_default)
    }

    /// Is the actor an administrator?
    pub fn is_admin(&self, actor: &crate::command::Actor) -> bool {
        match actor {
            crate::command::Actor::Operator => true,
            crate::command::Actor::User(u) => self.users.get(u).is_some_and(|u| u.admin),
        }
    }

    pub(crate) fn index_live(&mut self, job: &Job) {
        // Look up before inserting: the user is usually there, and cloning the name for
        // `entry` on every submission is measurable.
        match self.live_by_user.get_mut(&job.spec.user) {
            Some(set) => {
                set.insert(job.id);
            }
            None => {
                self.live_by_user
                    .insert(job.spec.user.clone(), BTreeSet::from([job.id]));
            }
        }
    }

    pub(crate) fn unindex_live(&mut self, user: &UserName, id: JobId) {
        if let Some(set) = self.live_by_user.get_mut(user) {
            set.remove(&id);
            if set.is_empty() {
                self.live_by_user.remove(user);
            }
        }
    }
}
