//! Administrative commands: configuration, nodes, partitions, QOS, accounts and users.
//!
//! Removal is refused while something still refers to the thing removed (a job, a partition,
//! an account), so state never holds a dangling name.

use std::collections::BTreeSet;

use crate::account::{Account, AssocLimits, Grant, ROOT, User, UserAssoc};
use crate::apply::{Rejection, Response};
use crate::config::SchedConfig;
use crate::ids::{AccountName, NodeName, PartitionName, QosName, UserName};
use crate::node::{Node, NodeSpec};
use crate::partition::Partition;
use crate::qos::Qos;
use crate::quantity::TimeMs;
use crate::state::{State, UserEntry};

/// Longest free-text reason (drain, down) kept in state.
pub const MAX_REASON_LEN: usize = 256;

pub(crate) fn check_reason(reason: &str) -> Result<(), Rejection> {
    if reason.len() > MAX_REASON_LEN {
        return Err(Rejection::too_large(
            "reason length",
            reason.len() as u64,
            MAX_REASON_LEN as u64,
        ));
    }
    Ok(())
}

impl State {
    pub(crate) fn set_config(&mut self, config: &SchedConfig) -> Result<Response, Rejection> {
        if config.max_array_size == 0 {
            return Err(Rejection::invalid("max_array_size", "must be at least 1"));
        }
        if config.max_batch == 0 {
            return Err(Rejection::invalid("max_batch", "must be at least 1"));
        }
        if let (Some(soft), Some(hard)) = (
            config.queue_policy.maxps_soft,
            config.queue_policy.maxps_hard,
        ) && soft > hard
        {
            return Err(Rejection::invalid(
                "queue_policy.maxps_soft",
                format!("{soft} is above maxps_hard {hard}"),
            ));
        }
        if let Some(b) = &config.bonus_qos
            && !self.qos.contains_key(b)
        {
            return Err(Rejection::unknown("qos", b));
        }
        self.config = config.clone();
        let now = self.applied.now;
        self.refresh_all_pending(now);
        Ok(Response::Done)
    }

    pub(crate) fn upsert_node(&mut self, spec: &NodeSpec) -> Result<Response, Rejection> {
        if spec.cpus == 0 {
            return Err(Rejection::invalid(
                format!("node {} cpus", spec.name),
                "must be at least 1",
            ));
        }
        match self.nodes.get_mut(&spec.name) {
            Some(node) => {
                let (cpus, mem, jobfs) = (node.used_cpus(), node.used_memory(), node.used_jobfs());
                if spec.cpus < cpus || spec.memory < mem || spec.jobfs < jobfs {
                    return Err(Rejection::InUse {
                        kind: "node".into(),
                        name: spec.name.to_string(),
                        why: format!(
                            "running jobs hold {cpus} cpus, {mem} memory, {jobfs} jobfs; \
                             the new capacity is smaller"
                        ),
                    });
                }
                node.spec = spec.clone();
            }
            None => {
                self.nodes
                    .insert(spec.name.clone(), Node::new(spec.clone()));
            }
        }
        self.refresh_partition_views();
        Ok(Response::Done)
    }

    pub(crate) fn remove_node(&mut self, name: &NodeName) -> Result<Response, Rejection> {
        let node = self
            .nodes
            .get(name)
            .ok_or_else(|| Rejection::unknown("node", name))?;
        if !node.jobs.is_empty() {
            return Err(Rejection::InUse {
                kind: "node".into(),
                name: name.to_string(),
                why: format!("{} jobs hold resources on it", node.jobs.len()),
            });
        }
        if let Some(p) = self.partitions.values().find(|p| p.nodes.contains(name)) {
            return Err(Rejection::InUse {
                kind: "node".into(),
                name: name.to_string(),
                why: format!("partition {} lists it", p.name),
            });
        }
        if let Some(r) = self.reservations.values().find(|r| r.nodes.contains(name)) {
            return Err(Rejection::InUse {
                kind: "node".into(),
                name: name.to_string(),
                why: format!("reservation {} holds it", r.name),
            });
        }
        self.nodes.remove(name);
        self.refresh_partition_views();
        Ok(Response::Done)
    }

    pub(crate) fn drain_node(
        &mut self,
        name: &NodeName,
        reason: &str,
    ) -> Result<Response, Rejection> {
        check_reason(reason)?;
        let node = self
            .nodes
            .get_mut(name)
            .ok_or_else(|| Rejection::unknown("node", name))?;
        node.drain = Some(reason.to_owned());
        Ok(Response::Done)
    }

    pub(crate) fn resume_node(
        &mut self,
        name: &NodeName,
        now: TimeMs,
    ) -> Result<Response, Rejection> {
        let node = self
            .nodes
            .get_mut(name)
            .ok_or_else(|| Rejection::unknown("node", name))?;
        node.drain = None;
        node.down = None;
        self.refresh_all_pending(now);
        Ok(Response::Done)
    }

    /// Clears a node's down and nothing else (a drain stays): only a down for not
    /// responding unless `any_reason`, as Slurm's `ReturnToService=1` and `=2`.
    pub(crate) fn return_to_service(
        &mut self,
        name: &NodeName,
        any_reason: bool,
        now: TimeMs,
    ) -> Result<Response, Rejection> {
        let node = self
            .nodes
            .get_mut(name)
            .ok_or_else(|| Rejection::unknown("node", name))?;
        let Some(reason) = &node.down else {
            return Err(Rejection::invalid(
                format!("node {name}"),
                "is not down; nothing to return to service",
            ));
        };
        if !any_reason && !reason.starts_with(crate::node::NOT_RESPONDING) {
            return Err(Rejection::invalid(
                format!("node {name}"),
                format!(
                    "is down for {reason:?}, not for not responding: only an administrator \
                     resumes it"
                ),
            ));
        }
        node.down = None;
        self.refresh_all_pending(now);
        Ok(Response::Done)
    }

    pub(crate) fn upsert_partition(
        &mut self,
        p: &Partition,
        now: TimeMs,
    ) -> Result<Response, Rejection> {
        if let Some(missing) = p.nodes.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(Rejection::unknown("node", missing));
        }
        for q in p.allowed_qos.iter().flatten().chain(p.default_qos.iter()) {
            if !self.qos.contains_key(q) {
                return Err(Rejection::unknown("qos", q));
            }
        }
        for a in p.allowed_accounts.iter().flatten() {
            if self.accounts.get(a).is_none() {
                return Err(Rejection::unknown("account", a));
            }
        }
        if let (Some(def), Some(max)) = (p.default_time, p.max_time)
            && def > max
        {
            return Err(Rejection::invalid(
                format!("partition {} default_time", p.name),
                format!("{def} is above max_time {max}"),
            ));
        }
        if p.is_default {
            for other in self.partitions.values_mut() {
                other.is_default = false;
            }
        }
        self.partitions.insert(p.name.clone(), p.clone());
        self.refresh_partition_views();
        self.refresh_all_pending(now);
        Ok(Response::Done)
    }

    pub(crate) fn remove_partition(&mut self, name: &PartitionName) -> Result<Response, Rejection> {
        if !self.partitions.contains_key(name) {
            return Err(Rejection::unknown("partition", name));
        }
        if let Some(job) = self
            .jobs
            .values()
            .find(|j| !j.state.is_terminal() && &j.resolved.partition == name)
        {
            return Err(Rejection::InUse {
                kind: "partition".into(),
                name: name.to_string(),
                why: format!("job {} is queued or running in it", job.id),
            });
        }
        self.partitions.remove(name);
        self.refresh_partition_views();
        Ok(Response::Done)
    }

    pub(crate) fn upsert_qos(&mut self, q: &Qos) -> Result<Response, Rejection> {
        if let Some(missing) = q
            .preempt
            .iter()
            .find(|p| *p != &q.name && !self.qos.contains_key(*p))
        {
            return Err(Rejection::unknown("qos", missing));
        }
        self.qos.insert(q.name.clone(), q.clone());
        let now = self.applied.now;
        self.refresh_all_pending(now);
        Ok(Response::Done)
    }

    pub(crate) fn remove_qos(&mut self, name: &QosName) -> Result<Response, Rejection> {
        if !self.qos.contains_key(name) {
            return Err(Rejection::unknown("qos", name));
        }
        let why = if let Some(j) = self
            .jobs
            .values()
            .find(|j| !j.state.is_terminal() && &j.resolved.qos == name)
        {
            Some(format!("job {} uses it", j.id))
        } else if let Some(p) = self.partitions.values().find(|p| {
            p.default_qos.as_ref() == Some(name)
                || p.allowed_qos.as_ref().is_some_and(|s| s.contains(name))
        }) {
            Some(format!("partition {} names it", p.name))
        } else if let Some(other) = self.qos.values().find(|o| o.preempt.contains(name)) {
            Some(format!("qos {} may preempt it", other.name))
        } else if &self.config.default_qos == name {
            Some("it is the configured default_qos".to_owned())
        } else if self.config.bonus_qos.as_ref() == Some(name) {
            Some("it is the configured bonus_qos".to_owned())
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Rejection::InUse {
                kind: "qos".into(),
                name: name.to_string(),
                why,
            });
        }
        self.qos.remove(name);
        Ok(Response::Done)
    }

    /// Makes exactly `users` the coordinators of `account` (Slurm's `sacctmgr add
    /// coordinator`); each must be a known user.
    pub(crate) fn set_coordinators(
        &mut self,
        account: &AccountName,
        users: &[crate::ids::UserName],
    ) -> Result<Response, Rejection> {
        if let Some(u) = users.iter().find(|u| !self.users.contains_key(*u)) {
            return Err(Rejection::unknown("user", u));
        }
        let acct = self
            .accounts
            .accounts
            .get_mut(account)
            .ok_or_else(|| Rejection::unknown("account", account))?;
        acct.coordinators = users.iter().cloned().collect();
        Ok(Response::Done)
    }

    pub(crate) fn upsert_account(
        &mut self,
        name: &AccountName,
        parent: &AccountName,
        shares: u32,
        limits: &AssocLimits,
        grant: &Option<Grant>,
    ) -> Result<Response, Rejection> {
        if name.as_str() == ROOT {
            return Err(Rejection::invalid(
                "account",
                "`root` is built in and cannot be changed",
            ));
        }
        if shares == 0 {
            return Err(Rejection::invalid(
                format!("account {name} shares"),
                "must be at least 1",
            ));
        }
        if self.accounts.get(parent).is_none() {
            return Err(Rejection::unknown("account", parent));
        }
        if self.accounts.is_within(parent, name) {
            return Err(Rejection::invalid(
                format!("account {name} parent"),
                format!("{parent} is {name} or below it; that would make a cycle"),
            ));
        }
        if let (Some(s), Some(h)) = (limits.maxps_soft, limits.maxps_hard)
            && s > h
        {
            return Err(Rejection::invalid(
                format!("account {name} maxps_soft"),
                format!("{s} is above maxps_hard {h}"),
            ));
        }
        let (users, coordinators) = self
            .accounts
            .get(name)
            .map(|a| (a.users.clone(), a.coordinators.clone()))
            .unwrap_or_default();
        self.accounts.accounts.insert(
            name.clone(),
            Account {
                name: name.clone(),
                parent: Some(parent.clone()),
                shares,
                users,
                limits: limits.clone(),
                grant: *grant,
                coordinators,
            },
        );
        let now = self.applied.now;
        self.refresh_all_pending(now);
        Ok(Response::Done)
    }

    pub(crate) fn remove_account(&mut self, name: &AccountName) -> Result<Response, Rejection> {
        let account = self
            .accounts
            .get(name)
            .ok_or_else(|| Rejection::unknown("account", name))?;
        let in_use = |why: String| Rejection::InUse {
            kind: "account".into(),
            name: name.to_string(),
            why,
        };
        if name.as_str() == ROOT {
            return Err(in_use("it is the root of the tree".into()));
        }
        if let Some(child) = self.accounts.children(name).next() {
            return Err(in_use(format!("account {} is below it", child.name)));
        }
        if let Some(u) = account.users.keys().next() {
            return Err(in_use(format!("user {u} belongs to it")));
        }
        if let Some(j) = self
            .jobs
            .values()
            .find(|j| !j.state.is_terminal() && &j.resolved.account == name)
        {
            return Err(in_use(format!("job {} is charged to it", j.id)));
        }
        if let Some(p) = self.partitions.values().find(|p| {
            p.allowed_accounts
                .as_ref()
                .is_some_and(|s| s.contains(name))
        }) {
            return Err(in_use(format!("partition {} allows it", p.name)));
        }
        if let Some(r) = self
            .reservations
            .values()
            .find(|r| r.accounts.contains(name))
        {
            return Err(in_use(format!("reservation {} admits it", r.name)));
        }
        self.accounts.accounts.remove(name);
        Ok(Response::Done)
    }

    pub(crate) fn upsert_user(
        &mut self,
        user: &User,
        assocs: &[(AccountName, UserAssoc)],
    ) -> Result<Response, Rejection> {
        let mut seen = BTreeSet::new();
        for (account, assoc) in assocs {
            if self.accounts.get(account).is_none() {
                return Err(Rejection::unknown("account", account));
            }
            if !seen.insert(account) {
                return Err(Rejection::invalid(
                    format!("user {} associations", user.name),
                    format!("account {account} is listed twice"),
                ));
            }
            if assoc.shares == 0 {
                return Err(Rejection::invalid(
                    format!("user {} shares in {account}", user.name),
                    "must be at least 1",
                ));
            }
        }
        if !seen.contains(&user.default_account) {
            return Err(Rejection::invalid(
                format!("user {} default_account", user.name),
                format!("{} is not among the user's accounts", user.default_account),
            ));
        }
        // Accounts the user leaves must not carry their live jobs.
        if let Some(j) = self
            .live_jobs_of(&user.name)
            .find(|j| !seen.contains(&j.resolved.account))
        {
            return Err(Rejection::InUse {
                kind: "association".into(),
                name: format!("{}/{}", j.resolved.account, user.name),
                why: format!("job {} is charged to it", j.id),
            });
        }
        // Associations the user leaves lose their ids; the ones kept keep theirs.
        for account in self.accounts.accounts.values_mut() {
            if account.users.remove(&user.name).is_some() && !seen.contains(&account.name) {
                self.assocs.remove(&account.name, &user.name);
            }
        }
        for (account, assoc) in assocs {
            if let Some(a) = self.accounts.accounts.get_mut(account) {
                a.users.insert(user.name.clone(), assoc.clone());
                self.assocs.ensure(account, &user.name);
            }
        }
        match self.users.get_mut(&user.name) {
            Some(entry) => entry.user = user.clone(),
            None => {
                // A user removed and added again: their ended jobs still in the queue hold
                // scripts, which count against them again.
                let mut entry = UserEntry::new(user.clone());
                for job in self.jobs.values().filter(|j| j.spec.user == user.name) {
                    for id in std::iter::once(job.spec.script).chain(job.spec.env) {
                        let n = entry.stored.entry(id).or_default();
                        if *n == 0 {
                            entry.stored_bytes +=
                                self.blobs.get(&id).map_or(0, |b| b.data.len() as u64);
                        }
                        *n += 1;
                    }
                }
                self.users.insert(user.name.clone(), entry);
            }
        }
        self.reindex_assocs_of(&user.name, assocs.iter().map(|(a, _)| a));
        // Its associations' limits may be the site's first (or change which exist): checks
        // skip what the rules cache says is not there.
        self.account_rules = crate::policy::AccountRules::of(self);
        let now = self.applied.now;
        self.refresh_user(&user.name.clone(), now);
        Ok(Response::Done)
    }

    pub(crate) fn remove_user(&mut self, name: &UserName) -> Result<Response, Rejection> {
        if !self.users.contains_key(name) {
            return Err(Rejection::unknown("user", name));
        }
        if let Some(j) = self.live_jobs_of(name).next() {
            return Err(Rejection::InUse {
                kind: "user".into(),
                name: name.to_string(),
                why: format!("job {} is queued or running", j.id),
            });
        }
        if let Some(r) = self.reservations.values().find(|r| r.users.contains(name)) {
            return Err(Rejection::InUse {
                kind: "user".into(),
                name: name.to_string(),
                why: format!("reservation {} admits them", r.name),
            });
        }
        for account in self.accounts.accounts.values_mut() {
            if account.users.remove(name).is_some() {
                self.assocs.remove(&account.name, name);
            }
        }
        self.users.remove(name);
        Ok(Response::Done)
    }
}

impl State {
    pub(crate) fn upsert_reservation(
        &mut self,
        r: &crate::reservation::Reservation,
        now: TimeMs,
    ) -> Result<Response, Rejection> {
        let field = |f: &str| format!("reservation {} {f}", r.name);
        if r.end <= r.start {
            return Err(Rejection::invalid(
                field("end"),
                format!("{} is not after its start {}", r.end.0, r.start.0),
            ));
        }
        if r.nodes.is_empty() {
            return Err(Rejection::invalid(field("nodes"), "names no node"));
        }
        if let Some(n) = r.nodes.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(Rejection::unknown("node", n));
        }
        if r.users.is_empty() && r.accounts.is_empty() {
            return Err(Rejection::invalid(
                field("users"),
                "names no user and no account: nobody could use it",
            ));
        }
        if let Some(u) = r.users.iter().find(|u| !self.users.contains_key(*u)) {
            return Err(Rejection::unknown("user", u));
        }
        if let Some(a) = r.accounts.iter().find(|a| self.accounts.get(a).is_none()) {
            return Err(Rejection::unknown("account", a));
        }
        // Two reservations may not hold one node at the same time.
        if let Some(other) = self.reservations.values().find(|o| {
            o.name != r.name && o.overlaps(r.start, Some(r.end)) && !o.nodes.is_disjoint(&r.nodes)
        }) {
            return Err(Rejection::InUse {
                kind: "node".into(),
                name: other
                    .nodes
                    .intersection(&r.nodes)
                    .next()
                    .map_or_else(String::new, |n| n.to_string()),
                why: format!(
                    "reservation {} holds it in an overlapping window",
                    other.name
                ),
            });
        }
        self.reservations.insert(r.name.clone(), r.clone());
        self.refresh_all_pending(now);
        Ok(Response::Done)
    }

    pub(crate) fn remove_reservation(
        &mut self,
        name: &crate::ids::ReservationName,
        now: TimeMs,
    ) -> Result<Response, Rejection> {
        if self.reservations.remove(name).is_none() {
            return Err(Rejection::unknown("reservation", name));
        }
        // Its waiting jobs now wait for a reservation that is gone (Slurm keeps them pending
        // with reason ReservationDeleted); running ones run on.
        self.refresh_all_pending(now);
        Ok(Response::Done)
    }
}
