//! Fair-share factors from the account tree and the usage ledger.
//!
//! Three algorithms, chosen by configuration, each giving every association (account, user)
//! a factor in [0, 1], higher meaning more under-served:
//!
//! - **Fair Tree** (Slurm, seed 003): at each level of the tree every child (sub-account or
//!   user) gets a level fair-share LF = S / U, its share of its siblings' shares over its
//!   share of their usage. Walking the tree depth-first, children in descending LF, ranks the
//!   users; the first gets 1.0 and each one after gets rank / number of users. A whole
//!   under-served branch thus outranks every user of an over-served one. Users with equal LF
//!   under one account share a rank; sibling accounts with equal LF are visited in name order.
//! - **Classic** (Slurm's original and Flux, seed 002): F = 2^(-U/S) with U the association's
//!   fraction of all usage and S its normalized share (the product of share fractions down
//!   the path), so 0.5 means exactly served, 1.0 unused, towards 0 over-served.
//! - **IT4I** (seed 004): per project, 1 - usage_project / usage_total; every member of a
//!   project has its project's factor.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::account::{AccountTree, ROOT};
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

/// The factors of one computation, borrowing the names from the account tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FairShare<'a> {
    /// account -> user -> factor.
    pub factors: BTreeMap<&'a AccountName, BTreeMap<&'a UserName, f64>>,
    pub rows: Vec<ShareRow>,
}

impl<'a> FairShare<'a> {
    /// The factor of an association; an unknown one is treated as unused (1.0).
    pub fn factor(&self, account: &AccountName, user: &UserName) -> f64 {
        self.factors
            .get(account)
            .and_then(|users| users.get(user))
            .copied()
            .unwrap_or(1.0)
    }

    fn set(&mut self, account: &'a AccountName, user: &'a UserName, factor: f64) {
        self.factors
            .entry(account)
            .or_default()
            .insert(user, factor);
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

    /// Children of `account` with (shares, usage), accounts first, each in name order.
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
            for (user, assoc) in &a.users {
                out.push((
                    Child::User(user),
                    assoc.shares,
                    self.user_usage(account, user),
                ));
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
    usage: Usage<'a>,
    with_rows: bool,
) -> FairShare<'a> {
    let tree = Tree::new(accounts, usage);
    let mut out = match algorithm {
        FairshareAlgorithm::FairTree => fair_tree(&tree),
        FairshareAlgorithm::Classic => classic(&tree),
        FairshareAlgorithm::It4i => it4i(&tree),
    };
    if !with_rows {
        out.rows = Vec::new();
    }
    out
}

fn fair_tree<'a>(tree: &Tree<'a>) -> FairShare<'a> {
    let root = tree_name(tree, &root_name());
    let mut out = FairShare::default();
    // Tie groups of users, in rank order.
    let mut groups: Vec<Vec<(&'a AccountName, &'a UserName)>> = Vec::new();
    visit(tree, root, &mut groups, &mut out.rows);
    let n: usize = groups.iter().map(Vec::len).sum();
    let mut rank = n;
    for group in groups {
        let factor = if n == 0 { 0.0 } else { rank as f64 / n as f64 };
        rank -= group.len();
        for (account, user) in group {
            out.set(account, user, factor);
        }
    }
    let FairShare { factors, rows } = &mut out;
    for row in rows.iter_mut() {
        if let Some(user) = &row.user {
            row.fairshare = factors
                .get(&row.account)
                .and_then(|users| users.get(user))
                .copied();
        }
    }
    out
}

fn visit<'a>(
    tree: &Tree<'a>,
    account: &'a AccountName,
    groups: &mut Vec<Vec<(&'a AccountName, &'a UserName)>>,
    rows: &mut Vec<ShareRow>,
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
    let mut last_user_lf: Option<f64> = None;
    for (lf, s, u, child, shares, usage) in scored {
        match child {
            Child::User(user) => {
                rows.push(ShareRow {
                    account: account.clone(),
                    user: Some((*user).clone()),
                    raw_shares: shares,
                    norm_shares: s,
                    raw_usage: usage,
                    effective_usage: u,
                    level_fs: lf,
                    fairshare: None,
                });
                let key = (account, *user);
                match (last_user_lf, groups.last_mut()) {
                    (Some(prev), Some(group)) if prev == lf => group.push(key),
                    _ => groups.push(vec![key]),
                }
                last_user_lf = Some(lf);
            }
            Child::Account(name) => {
                last_user_lf = None;
                rows.push(ShareRow {
                    account: (*name).clone(),
                    user: None,
                    raw_shares: shares,
                    norm_shares: s,
                    raw_usage: usage,
                    effective_usage: u,
                    level_fs: lf,
                    fairshare: None,
                });
                visit(tree, name, groups, rows);
            }
        }
    }
}

fn classic<'a>(tree: &Tree<'a>) -> FairShare<'a> {
    let root = tree_name(tree, &root_name());
    let total: f64 = tree.account_usage.get(root).copied().unwrap_or(0.0);
    let mut out = FairShare::default();
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

fn it4i<'a>(tree: &Tree<'a>) -> FairShare<'a> {
    let root = root_name();
    let total: f64 = tree.account_usage.get(&root).copied().unwrap_or(0.0);
    let mut out = FairShare::default();
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

    fn compute<'a>(
        alg: FairshareAlgorithm,
        t: &'a AccountTree,
        ledger: &'a UsageLedger,
    ) -> FairShare<'a> {
        let usage = Usage {
            ledger,
            now: TimeMs(0),
            half_life: Seconds(0),
        };
        super::compute(alg, t, usage, true)
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
        let fs = compute(FairshareAlgorithm::FairTree, &t, &u);
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
        let fs = compute(FairshareAlgorithm::FairTree, &t, &u);
        assert_eq!(fs.factor(&n("p"), &n("a")), 1.0);
        assert_eq!(fs.factor(&n("p"), &n("b")), 1.0);
        assert_eq!(fs.factor(&n("p"), &n("c")), 1.0 / 3.0);
    }

    #[test]
    fn classic_factor_is_one_half_when_exactly_served() {
        let t = tree(&[("p", 1, &[("a", 1), ("b", 1)]), ("q", 1, &[("c", 1)])]);
        // a and b each have 1/4 of the shares; a uses exactly 1/4, b twice that, c a quarter.
        let u = usage(&[("p", "a", 25.0), ("p", "b", 50.0), ("q", "c", 25.0)]);
        let fs = compute(FairshareAlgorithm::Classic, &t, &u);
        assert_eq!(fs.factor(&n("p"), &n("a")), 0.5);
        assert_eq!(fs.factor(&n("p"), &n("b")), 0.25);
        assert!(fs.factor(&n("q"), &n("c")) > 0.5, "under-served");
        let empty = UsageLedger::default();
        let idle = compute(FairshareAlgorithm::Classic, &t, &empty);
        assert_eq!(idle.factor(&n("p"), &n("a")), 1.0);
    }

    /// IT4I: fair-share = MAX_FAIRSHARE * (1 - usage_project / usage_total), shared by all
    /// members of the project.
    #[test]
    fn it4i_factor_is_one_minus_the_project_share_of_usage() {
        let t = tree(&[("p1", 1, &[("a", 1), ("b", 1)]), ("p2", 1, &[("c", 1)])]);
        let u = usage(&[("p1", "a", 200.0), ("p1", "b", 100.0), ("p2", "c", 100.0)]);
        let fs = compute(FairshareAlgorithm::It4i, &t, &u);
        assert_eq!(fs.factor(&n("p1"), &n("a")), 0.25);
        assert_eq!(fs.factor(&n("p1"), &n("b")), 0.25);
        assert_eq!(fs.factor(&n("p2"), &n("c")), 0.75);
        assert_eq!(1e6 * fs.factor(&n("p2"), &n("c")), 750_000.0);
    }
}
