//! Fair-share usage per association, decayed with a half-life: billing-seconds (what
//! fair-share compares; cpu-seconds under default weights, see [`crate::tres`]) and each
//! resource's own seconds.
//!
//! Usage is replicated state, so its decay must come out the same on every replica: it is
//! computed from the leader-stamped times in the log (never a clock) with `libm`'s exp2,
//! which gives the same bits on every platform (the system libm need not). Each entry
//! remembers when it was last brought up to date and decays lazily, so time passing costs
//! nothing until someone reads or adds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{AccountName, UserName};
use crate::lookup::NameMap;
use crate::quantity::{Seconds, TimeMs};

/// A value that halves every `half_life`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Decayed {
    pub value: f64,
    pub at: TimeMs,
}

impl Decayed {
    /// The value as of `now` (never grows when `now` is before `at`).
    pub fn at(&self, now: TimeMs, half_life: Seconds) -> f64 {
        Self::decay(self.at, now, half_life).map_or(self.value, |f| self.value * f)
    }

    pub fn add(&mut self, amount: f64, now: TimeMs, half_life: Seconds) {
        let factor = Self::decay(self.at, now, half_life);
        self.add_decayed(amount, now, factor);
    }

    /// What a value brought up to date at `since` is multiplied by as of `now`; `None` when
    /// it has not decayed (no half-life, or `now` not after `since`).
    fn decay(since: TimeMs, now: TimeMs, half_life: Seconds) -> Option<f64> {
        if half_life.0 == 0 || now <= since {
            return None;
        }
        let halvings = now.ms_since(since) as f64 / (half_life.0 as f64 * 1000.0);
        Some(libm::exp2(-halvings))
    }

    /// [`Decayed::add`] with the decay since `self.at` already known.
    fn add_decayed(&mut self, amount: f64, now: TimeMs, factor: Option<f64>) {
        self.value = factor.map_or(self.value, |f| self.value * f) + amount;
        self.at = now.max(self.at);
    }
}

/// One association's decayed usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct AssocUsage {
    /// Billing-seconds x the partition's and QOS's usage factors: what fair-share uses.
    pub billing: Decayed,
    /// Cpu-seconds, MiB-seconds and GPU-seconds held (unweighted), for reports.
    pub cpu_seconds: Decayed,
    pub mem_mib_seconds: Decayed,
    pub gpu_seconds: Decayed,
}

impl AssocUsage {
    /// Decayed billing usage as of `now`.
    pub fn at(&self, now: TimeMs, half_life: Seconds) -> f64 {
        self.billing.at(now, half_life)
    }
}

/// What one job used over one stretch of time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Accrual {
    /// Billing-seconds, already weighted by usage factors.
    pub billing: f64,
    pub seconds: f64,
    pub tres: crate::tres::Tres,
}

/// Usage per association, account first, so lookups borrow the names.
///
/// Hashed ([`crate::lookup`]): every running job's association is looked up at every tick,
/// and in ordered maps of names that was two-thirds of an accrual. Written in name order,
/// so snapshots are the same bytes as the ordered maps made.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageLedger {
    #[serde(with = "crate::lookup::sorted")]
    pub entries: NameMap<AccountName, AccountUsage>,
}

/// One account's associations' usage, by user (hashed, written in user order).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AccountUsage(#[serde(with = "crate::lookup::sorted")] pub NameMap<UserName, AssocUsage>);

impl std::ops::Deref for AccountUsage {
    type Target = NameMap<UserName, AssocUsage>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for AccountUsage {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl UsageLedger {
    /// Adds billing usage only (past usage loaded by an administrator, tests).
    pub fn add(
        &mut self,
        account: &AccountName,
        user: &UserName,
        amount: f64,
        now: TimeMs,
        half_life: Seconds,
    ) {
        self.accrue(
            account,
            user,
            Accrual {
                billing: amount,
                seconds: 0.0,
                tres: crate::tres::Tres::default(),
            },
            now,
            half_life,
        );
    }

    /// Adds what a job used over `accrual.seconds`.
    pub fn accrue(
        &mut self,
        account: &AccountName,
        user: &UserName,
        accrual: Accrual,
        now: TimeMs,
        half_life: Seconds,
    ) {
        let valid = |x: f64| x.is_finite() && x >= 0.0;
        if !valid(accrual.billing) || !valid(accrual.seconds) {
            return;
        }
        if accrual.billing == 0.0 && accrual.seconds == 0.0 {
            return;
        }
        // Found without cloning the names when the association has used something before
        // (every accrual but its first): this runs for every running job at every tick.
        let users = match self.entries.get_mut(account) {
            Some(users) => users,
            None => self.entries.entry(account.clone()).or_default(),
        };
        let entry = match users.get_mut(user) {
            Some(entry) => entry,
            None => users.entry(user.clone()).or_default(),
        };
        // The four values are usually brought up to date together, so they share one decay:
        // an exp2 each was a tenth of the accrual at every tick. The same factor from the
        // same instants, so the same bits.
        let since = entry.billing.at;
        let factor = Decayed::decay(since, now, half_life);
        entry.billing.add_decayed(accrual.billing, now, factor);
        let t = accrual.tres;
        for (d, amount) in [
            (&mut entry.cpu_seconds, t.cpus as f64),
            (&mut entry.mem_mib_seconds, t.memory.0 as f64),
            (&mut entry.gpu_seconds, t.gpus as f64),
        ] {
            let factor = if d.at == since {
                factor
            } else {
                Decayed::decay(d.at, now, half_life)
            };
            d.add_decayed(amount * accrual.seconds, now, factor);
        }
    }

    /// One association's decayed billing usage as of `now` (0 if it never used anything).
    pub fn usage(
        &self,
        account: &AccountName,
        user: &UserName,
        now: TimeMs,
        half_life: Seconds,
    ) -> f64 {
        self.entries
            .get(account)
            .and_then(|users| users.get(user))
            .map_or(0.0, |d| d.at(now, half_life))
    }

    /// Every association's decayed usage as of `now`, summed per account (not including
    /// sub-accounts). Summed in user order: a sum of floats in the hashed map's order would
    /// depend on how the map was built (a replica restored from a snapshot against one that
    /// applied the log).
    pub fn per_account(&self, now: TimeMs, half_life: Seconds) -> BTreeMap<&AccountName, f64> {
        self.entries
            .iter()
            .map(|(a, users)| {
                let mut by_user: Vec<(&UserName, f64)> = users
                    .iter()
                    .map(|(u, d)| (u, d.at(now, half_life)))
                    .collect();
                by_user.sort_unstable_by(|x, y| x.0.cmp(y.0));
                (a, by_user.iter().map(|(_, v)| v).sum())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hashed ledger writes the bytes the ordered maps wrote (snapshots keep their
    /// format), whatever order its associations came in, and sums each account's users in
    /// one order, so replicas built by different histories agree to the bit.
    #[test]
    fn the_ledger_is_written_and_summed_in_name_order() {
        let week = Seconds::hours(168);
        let names: Vec<(AccountName, UserName, f64)> = (0..40u32)
            .map(|i| {
                let a: AccountName = format!("acct{}", i % 3).parse().unwrap();
                let u: UserName = format!("user{i:02}").parse().unwrap();
                (a, u, 0.1 + f64::from(i) * 1.37e-3)
            })
            .collect();
        let mut forward = UsageLedger::default();
        for (a, u, x) in &names {
            forward.add(a, u, *x, TimeMs(0), week);
        }
        let mut backward = UsageLedger::default();
        for (a, u, x) in names.iter().rev() {
            backward.add(a, u, *x, TimeMs(0), week);
        }
        let mut ordered: BTreeMap<&AccountName, BTreeMap<&UserName, &AssocUsage>> = BTreeMap::new();
        for (a, users) in &forward.entries {
            for (u, d) in users.iter() {
                ordered.entry(a).or_default().insert(u, d);
            }
        }
        let bytes = postcard::to_allocvec(&forward).unwrap();
        assert_eq!(bytes, postcard::to_allocvec(&backward).unwrap());
        assert_eq!(bytes, postcard::to_allocvec(&ordered).unwrap());
        let back: UsageLedger = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, forward);
        let bits = |l: &UsageLedger| -> Vec<(String, u64)> {
            l.per_account(TimeMs(3_600_000), week)
                .into_iter()
                .map(|(a, v)| (a.to_string(), v.to_bits()))
                .collect()
        };
        assert_eq!(bits(&forward), bits(&backward));
        assert_eq!(bits(&forward), bits(&back));
    }

    /// IT4I: "Usage is decayed, or cut in half periodically, at the interval 168 hours".
    #[test]
    fn usage_halves_every_half_life() {
        let week = Seconds::hours(168);
        let mut d = Decayed::default();
        d.add(1000.0, TimeMs(0), week);
        assert_eq!(d.at(TimeMs(0), week), 1000.0);
        assert_eq!(d.at(TimeMs(0).plus(week), week), 500.0);
        assert_eq!(d.at(TimeMs(0).plus(Seconds::hours(336)), week), 250.0);
        // Adding later first decays what was there.
        d.add(100.0, TimeMs(0).plus(week), week);
        assert_eq!(d.value, 600.0);
        // Time never runs backwards for usage.
        assert_eq!(d.at(TimeMs(0), week), 600.0);
        // A zero half-life means no decay.
        assert_eq!(d.at(TimeMs(u64::MAX), Seconds(0)), 600.0);
    }
}
