//! Association ids: a small integer for each (account, user) association.
//!
//! Hot paths (priority of every pending job, every pass) must not compare names: a job
//! records its association's [`AssocId`] at submission, and per-association results
//! (fair-share factors) live in vectors indexed by it. Ids are assigned by apply when an
//! association is created, never reused, and dropped when it goes, so they are replicated
//! state like everything else.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{AccountName, UserName};

/// The id of one (account, user) association.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct AssocId(pub u32);

impl AssocId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Every association's id, both ways.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssocTable {
    by_name: BTreeMap<AccountName, BTreeMap<UserName, AssocId>>,
    by_id: BTreeMap<AssocId, (AccountName, UserName)>,
    next: u32,
}

impl AssocTable {
    pub fn id(&self, account: &AccountName, user: &UserName) -> Option<AssocId> {
        self.by_name.get(account)?.get(user).copied()
    }

    pub fn key(&self, id: AssocId) -> Option<&(AccountName, UserName)> {
        self.by_id.get(&id)
    }

    /// The ids of one account's users, by user name.
    pub fn users_of(&self, account: &AccountName) -> Option<&BTreeMap<UserName, AssocId>> {
        self.by_name.get(account)
    }

    /// One more than the largest id ever handed out: the length of id-indexed vectors.
    pub fn capacity(&self) -> usize {
        self.next as usize
    }

    /// The id of the association, creating it if new.
    pub fn ensure(&mut self, account: &AccountName, user: &UserName) -> AssocId {
        if let Some(id) = self.id(account, user) {
            return id;
        }
        let id = AssocId(self.next);
        self.next += 1;
        self.by_name
            .entry(account.clone())
            .or_default()
            .insert(user.clone(), id);
        self.by_id.insert(id, (account.clone(), user.clone()));
        id
    }

    pub fn remove(&mut self, account: &AccountName, user: &UserName) {
        if let Some(users) = self.by_name.get_mut(account)
            && let Some(id) = users.remove(user)
        {
            self.by_id.remove(&id);
            if users.is_empty() {
                self.by_name.remove(account);
            }
        }
    }

    /// Every association, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&AccountName, &UserName, AssocId)> {
        self.by_name
            .iter()
            .flat_map(|(a, users)| users.iter().map(move |(u, id)| (a, u, *id)))
    }

    /// The two directions agree and every id is below `next`.
    pub fn is_consistent(&self) -> bool {
        let forward: usize = self.by_name.values().map(BTreeMap::len).sum();
        forward == self.by_id.len()
            && self.iter().all(|(a, u, id)| {
                id.0 < self.next && self.by_id.get(&id) == Some(&(a.clone(), u.clone()))
            })
    }
}
