//! The account tree (Slurm associations): accounts with shares under `root`, users under
//! accounts with shares of their own, limits at each level, and project grants.
//!
//! Invariants (checked by [`AccountTree::check`]): exactly one root, named `root`, with no
//! parent; every other account's parent exists; following parents always reaches the root
//! (no cycles); shares are at least 1 wherever fair-share divides by them.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{AccountName, UserName};

/// The name of the tree's root account.
pub const ROOT: &str = "root";

/// Limits that can sit on an account or on a user's association with it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssocLimits {
    /// Running jobs.
    pub max_jobs: Option<u32>,
    /// Cpu-minutes still to run over the running jobs (GrpTRESRunMins=cpu).
    pub grp_cpu_run_mins: Option<u64>,
    /// Maui MAXPS soft limit in processor-seconds (overrides the configured default).
    pub maxps_soft: Option<u64>,
    /// Maui MAXPS hard limit in processor-seconds.
    pub maxps_hard: Option<u64>,
}

/// A user's membership of an account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserAssoc {
    pub shares: u32,
    /// The association factor of multifactor priority (normalized by the largest).
    pub priority: u32,
    pub limits: AssocLimits,
}

/// Service units granted to a project and spent so far, in thousandths of an SU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub granted_milli_su: u64,
    pub used_milli_su: u64,
}

impl Grant {
    pub fn remaining_milli_su(&self) -> u64 {
        self.granted_milli_su.saturating_sub(self.used_milli_su)
    }

    pub fn is_exhausted(&self) -> bool {
        self.used_milli_su >= self.granted_milli_su
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub name: AccountName,
    /// `None` only for the root.
    pub parent: Option<AccountName>,
    pub shares: u32,
    pub users: BTreeMap<UserName, UserAssoc>,
    pub limits: AssocLimits,
    /// A project grant (NCI); `None` = not grant-limited.
    pub grant: Option<Grant>,
    /// Users who may act on every job of this account and the accounts below it (Slurm's
    /// account coordinators), without being administrators.
    pub coordinators: BTreeSet<UserName>,
}

impl Account {
    /// Has this project spent its grant? (Never, without one.)
    pub fn grant_exhausted(&self) -> bool {
        self.grant.is_some_and(|g| g.is_exhausted())
    }
}

/// A user known to the scheduler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub name: UserName,
    pub default_account: AccountName,
    /// May act on other users' jobs, hold as admin, change configuration.
    pub admin: bool,
}

/// Why the tree is not well-formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("account tree has no `root` account")]
    NoRoot,
    #[error("account {0} has no parent; only `root` may")]
    Orphan(AccountName),
    #[error("account `root` must not have a parent")]
    RootHasParent,
    #[error("account {account}'s parent {parent} does not exist")]
    MissingParent {
        account: AccountName,
        parent: AccountName,
    },
    #[error("account {0} is in a cycle of parents")]
    Cycle(AccountName),
    #[error("account {0} has shares 0; shares must be at least 1")]
    ZeroShares(String),
}

/// All accounts, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountTree {
    pub accounts: BTreeMap<AccountName, Account>,
}

impl Default for AccountTree {
    fn default() -> Self {
        Self::new()
    }
}

impl AccountTree {
    /// A tree holding only `root`.
    pub fn new() -> AccountTree {
        let root: AccountName = match ROOT.parse() {
            Ok(r) => r,
            Err(_) => unreachable!("`root` is a valid account name"),
        };
        let mut accounts = BTreeMap::new();
        accounts.insert(
            root.clone(),
            Account {
                name: root,
                parent: None,
                shares: 1,
                users: BTreeMap::new(),
                limits: AssocLimits::default(),
                grant: None,
                coordinators: BTreeSet::new(),
            },
        );
        AccountTree { accounts }
    }

    pub fn get(&self, name: &AccountName) -> Option<&Account> {
        self.accounts.get(name)
    }

    /// Direct child accounts of `name`, in name order.
    pub fn children<'a>(&'a self, name: &'a AccountName) -> impl Iterator<Item = &'a Account> {
        self.accounts
            .values()
            .filter(move |a| a.parent.as_ref() == Some(name))
    }

    /// `name` and its ancestors up to the root, nearest first. Stops on a cycle.
    pub fn ancestry(&self, name: &AccountName) -> Vec<&Account> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        let mut cur = self.accounts.get(name);
        while let Some(a) = cur {
            if !seen.insert(&a.name) {
                break;
            }
            out.push(a);
            cur = a.parent.as_ref().and_then(|p| self.accounts.get(p));
        }
        out
    }

    /// `name` and its ancestors up to the root, nearest first, walked without allocating:
    /// for questions asked of every account up the tree ("does any have a limit?"), which
    /// the scheduler asks at every start and end. On a tree with a cycle (which [`check`]
    /// refuses, so no applied configuration has one) the walk may repeat accounts, and it
    /// stops after as many steps as there are accounts: use [`ancestry`] where a repeat
    /// would count twice.
    ///
    /// [`check`]: Self::check
    /// [`ancestry`]: Self::ancestry
    pub fn ancestors<'a>(&'a self, name: &AccountName) -> impl Iterator<Item = &'a Account> {
        let first = self.accounts.get(name);
        std::iter::successors(first, |a| {
            a.parent.as_ref().and_then(|p| self.accounts.get(p))
        })
        .take(self.accounts.len())
    }

    /// Is `descendant` equal to or below `ancestor`?
    pub fn is_within(&self, descendant: &AccountName, ancestor: &AccountName) -> bool {
        self.ancestors(descendant).any(|a| &a.name == ancestor)
    }

    /// Checks the tree's invariants.
    pub fn check(&self) -> Result<(), TreeError> {
        let root = self
            .accounts
            .values()
            .find(|a| a.name.as_str() == ROOT)
            .ok_or(TreeError::NoRoot)?;
        if root.parent.is_some() {
            return Err(TreeError::RootHasParent);
        }
        for a in self.accounts.values() {
            if a.name.as_str() != ROOT {
                let parent = a
                    .parent
                    .as_ref()
                    .ok_or_else(|| TreeError::Orphan(a.name.clone()))?;
                if !self.accounts.contains_key(parent) {
                    return Err(TreeError::MissingParent {
                        account: a.name.clone(),
                        parent: parent.clone(),
                    });
                }
                let chain = self.ancestry(&a.name);
                if chain.last().map(|r| r.name.as_str()) != Some(ROOT) {
                    return Err(TreeError::Cycle(a.name.clone()));
                }
            }
            if a.shares == 0 {
                return Err(TreeError::ZeroShares(a.name.to_string()));
            }
            for (u, assoc) in &a.users {
                if assoc.shares == 0 {
                    return Err(TreeError::ZeroShares(format!("{}/{u}", a.name)));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> AccountName {
        s.parse().expect("a valid account name")
    }

    /// `root` ← `a` ← `b` ← `c`, and `x` whose parent is set by the caller.
    fn tree(x_parent: &str) -> AccountTree {
        let mut t = AccountTree::new();
        for (n, p) in [("a", "root"), ("b", "a"), ("c", "b"), ("x", x_parent)] {
            t.accounts.insert(
                name(n),
                Account {
                    name: name(n),
                    parent: Some(name(p)),
                    shares: 1,
                    users: BTreeMap::new(),
                    limits: AssocLimits::default(),
                    grant: None,
                    coordinators: BTreeSet::new(),
                },
            );
        }
        t
    }

    fn names<'a>(it: impl Iterator<Item = &'a Account>) -> Vec<String> {
        it.map(|a| a.name.to_string()).collect()
    }

    #[test]
    fn ancestors_walk_the_same_chain_as_ancestry_on_a_valid_tree() {
        let t = tree("c");
        assert_eq!(t.check(), Ok(()));
        for n in ["root", "a", "b", "c", "x", "nobody"] {
            assert_eq!(
                names(t.ancestors(&name(n))),
                names(t.ancestry(&name(n)).into_iter()),
                "{n}"
            );
        }
        assert_eq!(names(t.ancestors(&name("x"))), ["x", "c", "b", "a", "root"]);
        assert!(t.is_within(&name("x"), &name("a")));
        assert!(!t.is_within(&name("a"), &name("x")));
    }

    #[test]
    fn a_cycle_ends_the_walk_within_as_many_steps_as_there_are_accounts() {
        // `a`'s parent made `x`, and `x`'s `c`: a → x → c → b → a → ... (never applied:
        // `check` refuses it; the walk must still end).
        let mut t = tree("c");
        if let Some(a) = t.accounts.get_mut(&name("a")) {
            a.parent = Some(name("x"));
        }
        assert!(matches!(t.check(), Err(TreeError::Cycle(_))));
        let walked = t.ancestors(&name("c")).count();
        assert_eq!(walked, t.accounts.len());
        assert_eq!(
            names(t.ancestry(&name("c")).into_iter()),
            ["c", "b", "a", "x"]
        );
        assert!(!t.is_within(&name("c"), &name("root")));
    }
}
