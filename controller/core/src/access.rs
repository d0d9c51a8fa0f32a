//! Who may act on, and see, whose jobs and usage.
//!
//! One rule for acting (cancel, hold, update, signal, ...): a job's owner, a coordinator of
//! its account (or of an account above it), or an administrator. Seeing follows the same rule
//! when the site keeps that kind of data private ([`PrivateData`](crate::config::PrivateData),
//! Slurm's `PrivateData`); otherwise everyone sees everything, as in Slurm by default.

use crate::command::Actor;
use crate::ids::{AccountName, UserName};
use crate::job::Job;
use crate::state::State;

/// What kind of data a reader asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// The queue: listings, a job's details, its priority.
    Jobs,
    /// Accounting records of ended and running jobs.
    Accounting,
}

impl State {
    /// Whether `actor` may act on `job`: its owner, a coordinator of its account, an admin.
    pub fn may_act_on(&self, actor: &Actor, job: &Job) -> bool {
        match actor {
            Actor::Operator | Actor::Controller => true,
            Actor::Node(_) => false,
            Actor::User(u) => {
                u == &job.spec.user
                    || self.is_admin(actor)
                    || self.is_coordinator(u, &job.resolved.account)
            }
        }
    }

    /// Whether `actor` may see `job` as `data`, under the site's privacy settings.
    pub fn may_see_job(&self, actor: &Actor, job: &Job, data: Data) -> bool {
        let private = match data {
            Data::Jobs => self.config.private_data.jobs,
            Data::Accounting => {
                self.config.private_data.jobs || self.config.private_data.accounting
            }
        };
        !private || self.may_act_on(actor, job)
    }

    /// Whether `actor` may see the fair-share usage of `user` in `account` (a row of
    /// `sshare`; `user` None for the account's own row): everyone unless usage is private;
    /// then a user sees their own rows and the accounts above them, a coordinator their
    /// accounts' subtrees, an admin everything.
    pub fn may_see_usage(
        &self,
        actor: &Actor,
        account: &AccountName,
        user: Option<&UserName>,
    ) -> bool {
        if !self.config.private_data.usage || self.is_admin(actor) {
            return true;
        }
        let Actor::User(me) = actor else {
            return false;
        };
        if self.is_coordinator(me, account) {
            return true;
        }
        match user {
            Some(u) => u == me,
            // An account row: shown if it is one of the reader's accounts or above one.
            None => self.users.get(me).is_some_and(|e| {
                e.assocs
                    .iter()
                    .any(|(a, _)| self.is_ancestor_or_self(account, a))
            }),
        }
    }

    /// Whether `ancestor` is `account` or an account above it.
    pub fn is_ancestor_or_self(&self, ancestor: &AccountName, account: &AccountName) -> bool {
        let mut at = Some(account);
        let mut depth = 0;
        while let Some(name) = at {
            if name == ancestor {
                return true;
            }
            depth += 1;
            if depth > 64 {
                return false;
            }
            at = self
                .accounts
                .accounts
                .get(name)
                .and_then(|a| a.parent.as_ref());
        }
        false
    }
}
