//! Advance reservations: nodes set aside for a time window for some users and accounts
//! (Slurm's `scontrol create reservation`, GWDG's Slurm documentation's "jobs with a reservation").
//!
//! Inside its window a reservation's nodes run only jobs submitted to it (`--reservation`);
//! such jobs run only on its nodes and only within its window, and they are considered
//! before every other job (their resources cannot go to anyone else anyway). Outside the
//! window the nodes are ordinary. The planners enforce this in the availability profile;
//! apply checks it again for every start.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::ids::{AccountName, NodeName, ReservationName, UserName};
use crate::quantity::TimeMs;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub name: ReservationName,
    pub nodes: BTreeSet<NodeName>,
    pub start: TimeMs,
    pub end: TimeMs,
    /// Who may submit to it: these users, and every user charging one of these accounts.
    pub users: BTreeSet<UserName>,
    pub accounts: BTreeSet<AccountName>,
}

impl Reservation {
    /// Does `[start, end)` overlap the window? (`None` = runs for ever.)
    pub fn overlaps(&self, start: TimeMs, end: Option<TimeMs>) -> bool {
        start < self.end && end.is_none_or(|e| e > self.start)
    }

    /// Does `[start, end)` lie inside the window?
    pub fn contains(&self, start: TimeMs, end: Option<TimeMs>) -> bool {
        start >= self.start && end.is_some_and(|e| e <= self.end)
    }

    /// May this user, charging this account, use it?
    pub fn admits(&self, user: &UserName, account: &AccountName) -> bool {
        self.users.contains(user) || self.accounts.contains(account)
    }
}
