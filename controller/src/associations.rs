//! What `sacctmgr show` reads: the accounts, users, associations and QOS of the replicated
//! state, in the shape of Slurm's accounting database (an association per account and per
//! user in an account, depth-first from `root`).
//!
//! Everyone may read it, as in Slurm; where the site keeps usage private
//! (`PrivateData=usage`), a user sees only their own associations and the accounts above
//! them, a coordinator their accounts' subtrees, an administrator everything — the rule
//! `sshare` follows ([`State::may_see_usage`]); there, who coordinates an account is shown
//! only to its coordinators and to administrators, and an administrator's level only to
//! administrators and themself. The reply is bounded by the site's size: one pass over the
//! accounts and one over the users.

use std::collections::BTreeMap;

use docket_core::account::Account;
use docket_core::command::Actor;
use docket_core::partition::PreemptMode;
use docket_core::{AccountName, State};
use docket_proto::v1 as pb;

/// The whole view, as `actor` may see it.
pub fn associations(state: &State, actor: &Actor, cluster: &str) -> pb::AssociationsResponse {
    let view = Visibility::of(state, actor);
    let mut out = pb::AssociationsResponse {
        cluster: cluster.to_owned(),
        default_qos: state.config.default_qos.to_string(),
        ..Default::default()
    };
    account_tree(state, actor, &view, &mut out);
    out.users = user_entries(state, actor, &view);
    out.qos = state.qos.values().map(qos_entry).collect();
    out
}

/// What `actor` may see of who coordinates and who administers.
struct Visibility<'a> {
    /// Under private usage, who coordinates what and who administers are shown only to
    /// administrators and to coordinators of the accounts concerned (sshare shows neither).
    private: bool,
    me: Option<&'a docket_core::UserName>,
    state: &'a State,
}

impl<'a> Visibility<'a> {
    fn of(state: &'a State, actor: &'a Actor) -> Self {
        Visibility {
            private: state.config.private_data.usage && !state.is_admin(actor),
            me: match actor {
                Actor::User(u) => Some(u),
                _ => None,
            },
            state,
        }
    }

    /// Whether the coordinators of `account` are shown.
    fn coordinators_of(&self, account: &AccountName) -> bool {
        !self.private
            || self
                .me
                .is_some_and(|u| self.state.is_coordinator(u, account))
    }
}

/// The accounts and associations `actor` may see, depth-first from the root (children in
/// name order), bounded by the tree's size.
fn account_tree(
    state: &State,
    actor: &Actor,
    view: &Visibility<'_>,
    out: &mut pb::AssociationsResponse,
) {
    let accounts = &state.accounts.accounts;
    let mut children: BTreeMap<&AccountName, Vec<&Account>> = BTreeMap::new();
    for a in accounts.values() {
        if let Some(parent) = &a.parent {
            children.entry(parent).or_default().push(a);
        }
    }
    let mut stack: Vec<(&Account, u32)> = accounts
        .values()
        .filter(|a| a.parent.is_none())
        .map(|a| (a, 0))
        .collect();
    let mut visited = 0usize;
    while let Some((account, depth)) = stack.pop() {
        visited += 1;
        if visited > accounts.len() {
            break;
        }
        if state.may_see_usage(actor, &account.name, None) {
            out.accounts.push(pb::AccountEntry {
                name: account.name.to_string(),
                parent: parent_name(account),
                coordinators: if view.coordinators_of(&account.name) {
                    account.coordinators.iter().map(|u| u.to_string()).collect()
                } else {
                    Vec::new()
                },
            });
            out.assocs.push(pb::AssocEntry {
                account: account.name.to_string(),
                user: String::new(),
                parent: parent_name(account),
                shares: account.shares,
                priority: 0,
                max_jobs: account.limits.max_jobs,
                grp_cpu_run_mins: account.limits.grp_cpu_run_mins,
                depth,
            });
        }
        for (user, assoc) in &account.users {
            if state.may_see_usage(actor, &account.name, Some(user)) {
                out.assocs.push(pb::AssocEntry {
                    account: account.name.to_string(),
                    user: user.to_string(),
                    parent: account.name.to_string(),
                    shares: assoc.shares,
                    priority: assoc.priority,
                    max_jobs: assoc.limits.max_jobs,
                    grp_cpu_run_mins: assoc.limits.grp_cpu_run_mins,
                    depth: depth + 1,
                });
            }
        }
        if let Some(kids) = children.get(&account.name) {
            // Pushed in reverse so the first by name comes out first.
            stack.extend(kids.iter().rev().map(|k| (*k, depth + 1)));
        }
    }
}

/// The users `actor` may see, by name, with the accounts they coordinate where shown.
fn user_entries(state: &State, actor: &Actor, view: &Visibility<'_>) -> Vec<pb::UserEntry> {
    // Each user's coordinated accounts, from one pass over the accounts.
    let mut coordinates: BTreeMap<&docket_core::UserName, Vec<String>> = BTreeMap::new();
    for a in state.accounts.accounts.values() {
        if !view.coordinators_of(&a.name) {
            continue;
        }
        for u in &a.coordinators {
            coordinates.entry(u).or_default().push(a.name.to_string());
        }
    }
    let mut users = Vec::new();
    for entry in state.users.values() {
        let user = &entry.user;
        if !state.may_see_usage(actor, &user.default_account, Some(&user.name)) {
            continue;
        }
        users.push(pb::UserEntry {
            name: user.name.to_string(),
            default_account: user.default_account.to_string(),
            admin: user.admin && (!view.private || view.me == Some(&user.name)),
            coordinates: coordinates.remove(&user.name).unwrap_or_default(),
        });
    }
    users.sort_by(|a, b| a.name.cmp(&b.name));
    users
}

/// A QOS as `sacctmgr show qos` lists it.
fn qos_entry(q: &docket_core::qos::Qos) -> pb::QosEntry {
    pb::QosEntry {
        name: q.name.to_string(),
        priority: q.priority,
        preempt: q.preempt.iter().map(|p| p.to_string()).collect(),
        preempt_mode: match q.preempt_mode {
            PreemptMode::Off => "OFF",
            PreemptMode::Suspend => "SUSPEND",
            PreemptMode::Requeue => "REQUEUE",
            PreemptMode::Cancel => "CANCEL",
        }
        .into(),
        usage_factor: q.usage_factor.as_f64(),
        max_wall_seconds: q.limits.max_wall.map(|s| s.0),
        max_jobs_per_user: q.limits.max_jobs_per_user,
        max_submit_jobs_per_user: q.limits.max_submit_jobs_per_user,
        max_cpus_per_user: q.limits.max_cpus_per_user,
        grp_jobs: q.limits.grp_jobs,
        grp_cpus: q.limits.grp_cpus,
        grp_cpu_run_mins: q.limits.grp_cpu_run_mins,
    }
}

fn parent_name(account: &Account) -> String {
    account
        .parent
        .as_ref()
        .map(|p| p.to_string())
        .unwrap_or_default()
}
