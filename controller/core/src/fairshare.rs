//! Fair-share factors from the account tree and the usage ledger.
//!
//! Three algorithms, chosen by configuration, each giving every association (account, user)
//! a factor in [0, 1], higher meaning more under-served:
//!
//! - **Fair Tree** (Slurm; GWDG's Slurm documentation): at each level of the tree every child (sub-account or
//!   user) gets a level fair-share LF = S / U, its share of its siblings' shares over its
//!   share of their usage. Walking the tree depth-first, children in descending LF, ranks the
//!   users; the first gets 1.0 and each one after gets rank / number of users. A whole
//!   under-served branch thus outranks every user of an over-served one. Users with equal LF
//!   under one account share a rank; sibling accounts with equal LF are visited in name order.
//! - **Classic** (Slurm's original, and Flux's multi-factor priority plugin): F = 2^(-U/S) with U the association's
//!   fraction of all usage and S its normalized share (the product of share fractions down
//!   the path), so 0.5 means exactly served, 1.0 unused, towards 0 over-served.
//! - **IT4I** (IT4I's job priority documentation): per project, 1 - usage_project / usage_total; every member of a
//!   project has its project's factor.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::account::{AccountTree, ROOT};
use crate::assoc::{AssocId, AssocTable};
use crate::ids::{AccountName, UserName};
use crate::quantity::{Seconds, TimeMs};
use crate::usage::UsageLedger;

/// Which fair-share algorithm to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FairshareAlgorithm {
    FairTree,
    Classic,
    It4i,
}

/// One row of `sshare -l`: an account, or a user's association under it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareRow {
    pub account: AccountName,
    pub user: Option<UserName>,
    pub raw_shares: u32,
    /// Share among its siblings.
    pub norm_shares: f64,
    pub raw_usage: f64,
    /// Usage among its siblings.
    pub effective_usage: f64,
    /// Fair Tree's S / U (infinite with no usage).
    pub level_fs: f64,
    /// The association's factor (users only).
    pub fairshare: Option<f64>,
}

/// The factors of one computation, indexed by association id.
#[derive(Debug, Clone, PartialEq)]
pub struct FairShare<'a> {
    assocs: &'a AssocTable,
    by_id: Vec<f64>,
    pub rows: Vec<ShareRow>,
}

impl<'a> FairShare<'a> {
    /// Every association at factor 1: for formulas that do not use fair-share (FCFS), so
    /// the leader's passes do not pay for the tree walk.
    pub fn unused(assocs: &'a AssocTable) -> Self {
        // Nothing stored: every id reads as unused (1.0), with no allocation per pass.
        FairShare {
            assocs,
            by_id: Vec::new(),
            rows: Vec::new(),
        }
    }

    fn new(assocs: &'a AssocTable) -> Self {
        FairShare {
            assocs,
            by_id: vec![1.0; assocs.capacity()],
            rows: Vec::new(),
        }
    }

    /// The factor of an association; an unknown one is treated as unused (1.0).
    pub fn factor(&self, account: &AccountName, user: &UserName) -> f64 {
        self.assocs
            .id(account, user)
            .map_or(1.0, |id| self.factor_of(id))
    }

    /// The factor of an association by id: what the priority of every job reads.
    pub fn factor_of(&self, id: AssocId) -> f64 {
        self.by_id.get(id.index()).copied().unwrap_or(1.0)
    }

    fn set(&mut self, account: &AccountName, user: &UserName, factor: f64) {
        if let Some(slot) = self
            .assocs
            .id(account, user)
            .and_then(|id| self.by_id.get_mut(id.index()))
        {
            *slot = factor;
        }
    }
}

/// One line of `sshare`: a [`ShareRow`] with its depth below the root.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareLine {
    /// 1 for the root's children, 2 below them, ...
    pub depth: u32,
    pub row: ShareRow,
}

impl crate::state::State {
    /// The fair-share tree as `sshare` shows it: accounts and users depth-first, siblings in
    /// Fair Tree's order (descending level fair-share), with the raw and normalised shares
    /// and usage of every level; each user's factor is the one the configured algorithm
    /// gives (what priority reads).
    pub fn share_tree(&self, now: TimeMs) -> Vec<ShareLine> {
        let usage = || Usage {
            ledger: &self.usage,
            now,
            half_life: self.config.fairshare.half_life,
        };
        let shape = compute(
            FairshareAlgorithm::FairTree,
            &self.accounts,
            &self.assocs,
            usage(),
            true,
        );
        let factors = if self.config.fairshare.algorithm == FairshareAlgorithm::FairTree {
            None
        } else {
            Some(compute(
                self.config.fairshare.algorithm,
                &self.accounts,
                &self.assocs,
                usage(),
                false,
            ))
        };
        let depth_of = |account: &AccountName| -> u32 {
            let mut depth = 0;
            let mut at = self.accounts.accounts.get(account);
            while let Some(a) = at.and_then(|a| a.parent.as_ref()) {
                depth += 1;
                at = self.accounts.accounts.get(a);
                if depth > 64 {
                    break;
                }
            }
            depth
        };
        shape
            .rows
            .iter()
            .map(|row| {
                let mut row = row.clone();
                let depth = depth_of(&row.account) + u32::from(row.user.is_some());
                if let (Some(user), Some(f)) = (&row.user, &factors) {
                    row.fairshare = Some(f.factor(&row.account, user));
                }
                ShareLine { depth, row }
            })
            .collect()
    }
}

/// A child of an account at one level of the tree.
enum Child<'a> {
    Account(&'a AccountName),
    User(&'a UserName),
}

struct Tree<'a> {
    accounts: &'a AccountTree,
    usage: Usage<'a>,
    /// Usage of each account including everything below it.
    account_usage: BTreeMap<&'a AccountName, f64>,
}

/// Where usage comes from: the decayed ledger as of a moment.
#[derive(Debug, Clone, Copy)]
pub struct Usage<'a> {
    pub ledger: &'a UsageLedger,
    pub now: TimeMs,
    pub half_life: Seconds,
}

impl<'a> Tree<'a> {
    fn new(accounts: &'a AccountTree, usage: Usage<'a>) -> Self {
        let mut account_usage: BTreeMap<&AccountName, f64> = BTreeMap::new();
        // Each account's own usage, then added to every account above it: one walk per
        // account, not one per association.
        for (account, own) in usage.ledger.per_account(usage.now, usage.half_life) {
            for a in accounts.ancestry(account) {
                *account_usage.entry(&a.name).or_default() += own;
            }
        }
        Tree {
            accounts,
            usage,
            account_usage,
        }
    }

    fn user_usage(&self, account: &AccountName, user: &UserName) -> f64 {
        self.usage
            .ledger
            .usage(account, user, self.usage.now, self.usage.half_life)
    }

    /// Children of `account` with (shares, usage), accounts first, each in name order (the
    /// account's users in theirs; each one's usage looked up in the hashed ledger).
    fn children(&self, account: &'a AccountName) -> Vec<(Child<'a>, u32, f64)> {
        let mut out: Vec<(Child<'a>, u32, f64)> = self
            .accounts
            .children(account)
            .map(|a| {
                let u = self.account_usage.get(&a.name).copied().unwrap_or(0.0);
                (Child::Account(&a.name), a.shares, u)
            })
            .collect();
        if let Some(a) = self.accounts.get(account) {
            let used = self.usage.ledger.entries.get(account);
            for (user, assoc) in &a.users {
                let usage = used
                    .and_then(|u| u.get(user))
                    .map_or(0.0, |d| d.at(self.usage.now, self.usage.half_life));
                out.push((Child::User(user), assoc.shares, usage));
            }
        }
        out
    }
}

fn level_fs(shares: u32, share_sum: u64, usage: f64, usage_sum: f64) -> (f64, f64, f64) {
    let s = if share_sum == 0 {
        0.0
    } else {
        f64::from(shares) / share_sum as f64
    };
    let u = if usage_sum > 0.0 {
        usage / usage_sum
    } else {
        0.0
    };
    let lf = if u > 0.0 { s / u } else { f64::INFINITY };
    (s, u, lf)
}

fn root_name() -> AccountName {
    match ROOT.parse() {
        Ok(r) => r,
        Err(_) => unreachable!("`root` is a valid account name"),
    }
}

/// Computes every association's factor with the chosen algorithm, from usage decayed to the
/// moment of computation. `with_rows` also builds the `sshare` rows (not needed for
/// priority, and a tenth of the cost).
pub fn compute<'a>(
    algorithm: FairshareAlgorithm,
    accounts: &'a AccountTree,
    assocs: &'a AssocTable,
    usage: Usage<'a>,
    with_rows: bool,
) -> FairShare<'a> {
    let tree = Tree::new(accounts, usage);
    let out = FairShare::new(assocs);
    let mut out = match algorithm {
        FairshareAlgorithm::FairTree => fair_tree(&tree, out, with_rows),
        FairshareAlgorithm::Classic => classic(&tree, out),
        FairshareAlgorithm::It4i => it4i(&tree, out),
    };
    if !with_rows {
        out.rows = Vec::new();
    }
    out
}

fn fair_tree<'a>(tree: &Tree<'a>, mut out: FairShare<'a>, with_rows: bool) -> FairShare<'a> {
    let root = tree_name(tree, &root_name());
    // Users in rank order; `true` marks a user tied with the one before.
    let mut ranked: Vec<(Option<AssocId>, bool)> = Vec::new();
    let mut rows = Vec::new();
    visit(
        tree,
        out.assocs,
        root,
        &mut ranked,
        with_rows.then_some(&mut rows),
    );
    let n = ranked.len();
    let mut rank = n;
    let mut group_rank = n;
    for (k, (id, tied)) in ranked.iter().enumerate() {
        if !tied {
            group_rank = rank;
        }
        rank = n - k - 1;
        if let Some(slot) = id.and_then(|id| out.by_id.get_mut(id.index())) {
            *slot = group_rank as f64 / n as f64;
        }
    }
    for row in &mut rows {
        if let Some(user) = &row.user {
            row.fairshare = Some(out.factor(&row.account, user));
        }
    }
    out.rows = rows;
    out
}

fn visit<'a>(
    tree: &Tree<'a>,
    assocs: &AssocTable,
    account: &'a AccountName,
    ranked: &mut Vec<(Option<AssocId>, bool)>,
    mut rows: Option<&mut Vec<ShareRow>>,
) {
    let children = tree.children(account);
    let share_sum: u64 = children.iter().map(|c| u64::from(c.1)).sum();
    let usage_sum: f64 = children.iter().map(|c| c.2).sum();
    let mut scored: Vec<(f64, f64, f64, &Child<'a>, u32, f64)> = children
        .iter()
        .map(|(child, shares, usage)| {
            let (s, u, lf) = level_fs(*shares, share_sum, *usage, usage_sum);
            (lf, s, u, child, *shares, *usage)
        })
        .collect();
    // Descending LF; the stable sort keeps accounts-then-users, name order among equals.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let ids = assocs.users_of(account);
    let mut last_user_lf: Option<f64> = None;
    for (lf, s, u, child, shares, usage) in scored {
        let (row_account, row_user) = match child {
            Child::User(user) => {
                let id = ids.and_then(|m| m.get(*user)).copied();
                ranked.push((id, last_user_lf == Some(lf)));
                last_user_lf = Some(lf);
                (account, Some(*user))
            }
            Child::Account(name) => {
                last_user_lf = None;
                (*name, None)
            }
        };
        if let Some(rows) = rows.as_deref_mut() {
            rows.push(ShareRow {
                account: row_account.clone(),
                user: row_user.cloned(),
                raw_shares: shares,
                norm_shares: s,
                raw_usage: usage,
                effective_usage: u,
                level_fs: lf,
                fairshare: None,
            });
        }
        if let Child::Account(name) = child {
            visit(tree, assocs, name, ranked, rows.as_deref_mut());
        }
    }
}

fn classic<'a>(tree: &Tree<'a>, mut out: FairShare<'a>) -> FairShare<'a> {
    let root = tree_name(tree, &root_name());
    let total: f64 = tree.account_usage.get(root).copied().unwrap_or(0.0);
    let mut stack: Vec<(&'a AccountName, f64)> = vec![(root, 1.0)];
    while let Some((account, norm)) = stack.pop() {
        let children = tree.children(account);
        let share_sum: u64 = children.iter().map(|c| u64::from(c.1)).sum();
        for (child, shares, usage) in children {
            let s = if share_sum == 0 {
                0.0
            } else {
                norm * f64::from(shares) / share_sum as f64
            };
            match child {
                Child::Account(name) => stack.push((name, s)),
                Child::User(user) => {
                    let u = if total > 0.0 { usage / total } else { 0.0 };
                    let f = if s > 0.0 { libm::exp2(-u / s) } else { 0.0 };
                    out.set(account, user, f);
                    out.rows.push(ShareRow {
                        account: account.clone(),
                        user: Some(user.clone()),
                        raw_shares: shares,
                        norm_shares: s,
                        raw_usage: usage,
                        effective_usage: u,
                        level_fs: if u > 0.0 { s / u } else { f64::INFINITY },
                        fairshare: Some(f),
                    });
                }
            }
        }
    }
    out
}

/// The tree's own reference to an account name (children borrow from the tree).
fn tree_name<'a>(tree: &Tree<'a>, name: &AccountName) -> &'a AccountName {
    match tree.accounts.accounts.get_key_value(name) {
        Some((k, _)) => k,
        None => unreachable!("accounts on the stack come from the tree"),
    }
}

fn it4i<'a>(tree: &Tree<'a>, mut out: FairShare<'a>) -> FairShare<'a> {
    let root = root_name();
    let total: f64 = tree.account_usage.get(&root).copied().unwrap_or(0.0);
    for account in tree.accounts.accounts.values() {
        let used = tree
            .account_usage
            .get(&account.name)
            .copied()
            .unwrap_or(0.0);
        let f = if total > 0.0 { 1.0 - used / total } else { 1.0 };
        for (user, assoc) in &account.users {
            out.set(&account.name, user, f);
            out.rows.push(ShareRow {
                account: account.name.clone(),
                user: Some(user.clone()),
                raw_shares: assoc.shares,
                norm_shares: 0.0,
                raw_usage: tree.user_usage(&account.name, user),
                effective_usage: if total > 0.0 { used / total } else { 0.0 },
                level_fs: f64::NAN,
                fairshare: Some(f),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::{Account, AssocLimits, UserAssoc};

    fn n<T: std::str::FromStr>(s: &str) -> T
    where
        T::Err: std::fmt::Debug,
    {
        s.parse().unwrap()
    }

    /// (account, shares, [(user, shares)]) under root.
    type AccountSpec<'a> = (&'a str, u32, &'a [(&'a str, u32)]);

    fn tree(spec: &[AccountSpec<'_>]) -> AccountTree {
        let mut t = AccountTree::new();
        for (name, shares, users) in spec {
            t.accounts.insert(
                n(name),
                Account {
                    coordinators: Default::default(),
                    name: n(name),
                    parent: Some(n("root")),
                    shares: *shares,
                    users: users
                        .iter()
                        .map(|(u, s)| {
                            (
                                n(u),
                                UserAssoc {
                                    shares: *s,
                                    priority: 0,
                                    limits: AssocLimits::default(),
                                },
                            )
                        })
                        .collect(),
                    limits: AssocLimits::default(),
                    grant: None,
                },
            );
        }
        t
    }

    fn usage(u: &[(&str, &str, f64)]) -> UsageLedger {
        let mut ledger = UsageLedger::default();
        for (a, user, x) in u {
            ledger.add(&n(a), &n(user), *x, TimeMs(0), Seconds(0));
        }
        ledger
    }

    fn assocs(t: &AccountTree) -> AssocTable {
        let mut table = AssocTable::default();
        for a in t.accounts.values() {
            for u in a.users.keys() {
                table.ensure(&a.name, u);
            }
        }
        table
    }

    fn compute<'a>(
        alg: FairshareAlgorithm,
        t: &'a AccountTree,
        table: &'a AssocTable,
        ledger: &'a UsageLedger,
    ) -> FairShare<'a> {
        let usage = Usage {
            ledger,
            now: TimeMs(0),
            half_life: Seconds(0),
        };
        super::compute(alg, t, table, usage, true)
    }

    /// root: nhr (60 shares; alice 100, bob 300 used) and scc (40 shares; carol 100, dave 0).
    /// Root level: nhr LF = 0.6/0.8 = 0.75, scc LF = 0.4/0.2 = 2 -> scc's users first.
    /// In scc: dave LF = inf, carol 0.5/1.0 = 0.5. In nhr: alice 0.5/0.25 = 2, bob 0.67.
    /// Ranks: dave 4/4, carol 3/4, alice 2/4, bob 1/4: alice, though under-served within
    /// nhr (LF 2), ranks below carol because her whole branch is over-served.
    #[test]
    fn fair_tree_ranks_branches_before_users() {
        let t = tree(&[
            ("nhr", 60, &[("alice", 1), ("bob", 1)]),
            ("scc", 40, &[("carol", 1), ("dave", 1)]),
        ]);
        let u = usage(&[
            ("nhr", "alice", 100.0),
            ("nhr", "bob", 300.0),
            ("scc", "carol", 100.0),
        ]);
        let table = assocs(&t);
        let fs = compute(FairshareAlgorithm::FairTree, &t, &table, &u);
        assert_eq!(fs.factor(&n("scc"), &n("dave")), 1.0);
        assert_eq!(fs.factor(&n("scc"), &n("carol")), 0.75);
        assert_eq!(fs.factor(&n("nhr"), &n("alice")), 0.5);
        assert_eq!(fs.factor(&n("nhr"), &n("bob")), 0.25);
        let nhr = fs
            .rows
            .iter()
            .find(|r| r.account.as_str() == "nhr" && r.user.is_none())
            .unwrap();
        assert_eq!((nhr.norm_shares, nhr.effective_usage), (0.6, 0.8));
        assert!((nhr.level_fs - 0.75).abs() < 1e-12, "{}", nhr.level_fs);
        // sshare order: the tree walked in rank order.
        let order: Vec<String> = fs
            .rows
            .iter()
            .map(|r| {
                r.user
                    .as_ref()
                    .map_or(r.account.to_string(), |u| u.to_string())
            })
            .collect();
        assert_eq!(order, ["scc", "dave", "carol", "nhr", "alice", "bob"]);
    }

    #[test]
    fn fair_tree_gives_tied_users_one_rank() {
        let t = tree(&[("p", 1, &[("a", 1), ("b", 1), ("c", 1)])]);
        let u = usage(&[("p", "a", 10.0), ("p", "b", 10.0), ("p", "c", 40.0)]);
        let table = assocs(&t);
        let fs = compute(FairshareAlgorithm::FairTree, &t, &table, &u);
        assert_eq!(fs.factor(&n("p"), &n("a")), 1.0);
        assert_eq!(fs.factor(&n("p"), &n("b")), 1.0);
        assert_eq!(fs.factor(&n("p"), &n("c")), 1.0 / 3.0);
    }

    #[test]
    fn classic_factor_is_one_half_when_exactly_served() {
        let t = tree(&[("p", 1, &[("a", 1), ("b", 1)]), ("q", 1, &[("c", 1)])]);
        // a and b each have 1/4 of the shares; a uses exactly 1/4, b twice that, c a quarter.
        let u = usage(&[("p", "a", 25.0), ("p", "b", 50.0), ("q", "c", 25.0)]);
        let table = assocs(&t);
        let fs = compute(FairshareAlgorithm::Classic, &t, &table, &u);
        assert_eq!(fs.factor(&n("p"), &n("a")), 0.5);
        assert_eq!(fs.factor(&n("p"), &n("b")), 0.25);
        assert!(fs.factor(&n("q"), &n("c")) > 0.5, "under-served");
        let empty = UsageLedger::default();
        let idle = compute(FairshareAlgorithm::Classic, &t, &table, &empty);
        assert_eq!(idle.factor(&n("p"), &n("a")), 1.0);
    }

    /// IT4I: fair-share = MAX_FAIRSHARE * (1 - usage_project / usage_total), shared by all
    /// members of the project.
    #[test]
    fn it4i_factor_is_one_minus_the_project_share_of_usage() {
        let t = tree(&[("p1", 1, &[("a", 1), ("b", 1)]), ("p2", 1, &[("c", 1)])]);
        let u = usage(&[("p1", "a", 200.0), ("p1", "b", 100.0), ("p2", "c", 100.0)]);
        let table = assocs(&t);
        let fs = compute(FairshareAlgorithm::It4i, &t, &table, &u);
        assert_eq!(fs.factor(&n("p1"), &n("a")), 0.25);
        assert_eq!(fs.factor(&n("p1"), &n("b")), 0.25);
        assert_eq!(fs.factor(&n("p2"), &n("c")), 0.75);
        assert_eq!(1e6 * fs.factor(&n("p2"), &n("c")), 750_000.0);
    }
}
