//! The state's jobs by id: hashed for lookups, with their ids kept in order for walks.
//!
//! Every command and every scheduling pass looks jobs up by id, many times over: a backfill
//! pass once for each job it walks, a start or an end a dozen times through the indexes that
//! name jobs by id (the queue, the running jobs, each node's shares). In an ordered map each
//! lookup descended a B-tree of every job held, finished ones kept for `MinJobAge` included:
//! about 50 instructions a lookup, a tenth of a 100,000-job replay in all. A hash lookup is a
//! third of that. The ids are kept in order beside it, since walks (listings, snapshots, the
//! derived indexes' recomputation) go in id order, and a replica must write the same snapshot
//! whatever order its jobs came in.
//!
//! Invariant: `order` holds exactly the keys of `by_id`. Every method that changes one
//! changes the other; [`JobTable::check`] verifies it.
//!
//! Each job is shared (`Arc`) and copied when it changes while shared, so a copy of the
//! table costs a reference per job, not a copy of each: a snapshot takes one under the
//! machine's lock and encodes it after the lock is released. Copying 240,000 jobs one by one
//! took 0.4–0.6 s, longer than encoding them; encoding them under the lock stopped every
//! apply on the replica for 0.2–0.3 s.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Index, RangeBounds};
use std::sync::Arc;

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::JobId;
use crate::job::Job;
use crate::lookup::NameMap;

/// Jobs by id; iterates in id order. Behind a pointer: a job is about half a kilobyte, and
/// the table moves its entries when it grows. Cloning shares the jobs (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct JobTable {
    by_id: NameMap<JobId, Arc<Job>>,
    order: BTreeSet<JobId>,
}

/// `job` owned alone: moved out if no copy of the table shares it, else copied.
fn unshared(job: Arc<Job>) -> Box<Job> {
    Box::new(Arc::unwrap_or_clone(job))
}

impl JobTable {
    pub fn new() -> JobTable {
        JobTable::default()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn get(&self, id: &JobId) -> Option<&Job> {
        self.by_id.get(id).map(|j| &**j)
    }

    /// The job `id` to change; copied first if a copy of the table shares it.
    pub fn get_mut(&mut self, id: &JobId) -> Option<&mut Job> {
        self.by_id.get_mut(id).map(Arc::make_mut)
    }

    pub fn contains_key(&self, id: &JobId) -> bool {
        self.by_id.contains_key(id)
    }

    /// Holds `job` as `id`; the job it replaces, if any.
    pub fn insert(&mut self, id: JobId, job: Box<Job>) -> Option<Box<Job>> {
        self.order.insert(id);
        self.by_id.insert(id, Arc::from(job)).map(unshared)
    }

    pub fn remove(&mut self, id: &JobId) -> Option<Box<Job>> {
        self.order.remove(id);
        self.by_id.remove(id).map(unshared)
    }

    /// Every job with its id, in id order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&JobId, &Job)> + '_ {
        self.in_order(self.order.iter())
    }

    /// Every job, in id order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Job> + '_ {
        self.iter().map(|(_, j)| j)
    }

    /// Every id, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &JobId> + '_ {
        self.order.iter()
    }

    /// The jobs whose ids fall in `range`, in id order.
    pub fn range<R: RangeBounds<JobId>>(
        &self,
        range: R,
    ) -> impl DoubleEndedIterator<Item = (&JobId, &Job)> + '_ {
        self.in_order(self.order.range(range))
    }

    /// Keeps the jobs for which `keep` is true, asking in id order (as an ordered map does).
    pub fn retain(&mut self, mut keep: impl FnMut(&JobId, &mut Job) -> bool) {
        let by_id = &mut self.by_id;
        self.order.retain(|id| {
            let kept = by_id
                .get_mut(id)
                .is_some_and(|job| keep(id, Arc::make_mut(job)));
            if !kept {
                by_id.remove(id);
            }
            kept
        });
    }

    /// Whether the ordered ids are exactly the held jobs' ids.
    pub fn check(&self) -> bool {
        self.order.len() == self.by_id.len()
            && self.order.iter().all(|id| self.by_id.contains_key(id))
    }

    fn in_order<'a>(
        &'a self,
        ids: impl DoubleEndedIterator<Item = &'a JobId> + 'a,
    ) -> impl DoubleEndedIterator<Item = (&'a JobId, &'a Job)> + 'a {
        ids.filter_map(move |id| {
            let job = self.by_id.get(id);
            debug_assert!(job.is_some(), "job {id} is ordered but not held");
            job.map(|j| (id, &**j))
        })
    }
}

impl Index<&JobId> for JobTable {
    type Output = Job;

    /// The job `id`; panics if it is not held, as a map's index does.
    fn index(&self, id: &JobId) -> &Job {
        &self.by_id[id]
    }
}

impl PartialEq for JobTable {
    fn eq(&self, other: &JobTable) -> bool {
        self.by_id == other.by_id
    }
}

impl FromIterator<(JobId, Box<Job>)> for JobTable {
    fn from_iter<I: IntoIterator<Item = (JobId, Box<Job>)>>(iter: I) -> JobTable {
        let mut table = JobTable::new();
        for (id, job) in iter {
            table.insert(id, job);
        }
        table
    }
}

/// Written as a map in id order: the same bytes as the ordered map it replaced, so snapshots
/// do not depend on hashing.
impl Serialize for JobTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if !self.check() {
            return Err(serde::ser::Error::custom(
                "the job table's ordered ids are not its jobs' ids",
            ));
        }
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (id, job) in self.iter() {
            map.serialize_entry(id, job)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for JobTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<JobTable, D::Error> {
        let jobs = BTreeMap::<JobId, Box<Job>>::deserialize(deserializer)?;
        Ok(jobs.into_iter().collect())
    }
}
