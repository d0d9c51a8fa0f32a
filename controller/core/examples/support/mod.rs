//! What the benchmark examples share: a state driven by commands with a log index and a
//! clock of its own, and name parsing that may panic (benchmark setup is not input).

// Each example compiles this module on its own and uses part of it.
#![allow(dead_code)]

use docket_core::account::{AssocLimits, User, UserAssoc};
use docket_core::quantity::{Seconds, TimeMs};
use docket_core::{AccountName, ApplyCtx, Command, Envelope, Response, State, UserName};

pub struct Bench {
    pub state: State,
    pub index: u64,
    pub now: TimeMs,
    /// How far the clock moves with each command.
    pub step: Seconds,
}

impl Bench {
    pub fn new(state: State, step: Seconds) -> Bench {
        Bench {
            state,
            index: 0,
            now: TimeMs(1_700_000_000_000),
            step,
        }
    }

    /// Applies a setup or measured command; a refusal is a bug in the benchmark.
    pub fn apply(&mut self, cmd: Command) -> Response {
        self.index += 1;
        self.now = self.now.plus(self.step);
        let ctx = ApplyCtx {
            index: self.index,
            time_ms: self.now,
        };
        match self.state.apply(Envelope::controller(cmd), ctx) {
            Ok(r) => r,
            Err(e) => panic!("setup command refused: {e}"),
        }
    }
}

impl Bench {
    /// `n` accounts under root named `{prefix}NNN`, account `i` with `shares(i)` shares.
    pub fn add_accounts(
        &mut self,
        prefix: &str,
        n: usize,
        shares: impl Fn(usize) -> u32,
    ) -> Vec<AccountName> {
        let accounts: Vec<AccountName> = (0..n).map(|i| name(&format!("{prefix}{i:03}"))).collect();
        for (i, a) in accounts.iter().enumerate() {
            self.apply(Command::UpsertAccount {
                name: a.clone(),
                parent: name("root"),
                shares: shares(i),
                limits: AssocLimits::default(),
                grant: None,
            });
        }
        accounts
    }

    /// `n` users `uNNNNN`, user `i` in account `i % accounts` with `shares(i)` shares.
    pub fn add_users(
        &mut self,
        n: usize,
        accounts: &[AccountName],
        shares: impl Fn(usize) -> u32,
    ) -> Vec<UserName> {
        let users: Vec<UserName> = (0..n).map(|i| name(&format!("u{i:05}"))).collect();
        for (i, u) in users.iter().enumerate() {
            let account = accounts[i % accounts.len()].clone();
            self.apply(Command::UpsertUser {
                user: User {
                    name: u.clone(),
                    default_account: account.clone(),
                    admin: false,
                },
                assocs: vec![(
                    account,
                    UserAssoc {
                        shares: shares(i),
                        priority: 0,
                        limits: AssocLimits::default(),
                    },
                )],
            });
        }
        users
    }
}

/// Milliseconds of `runs` runs of `f` (with its last result): median and maximum.
pub fn time_runs<T>(runs: usize, mut f: impl FnMut() -> T) -> (f64, f64, T) {
    let mut ms = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs.max(1) {
        let t = std::time::Instant::now();
        last = Some(f());
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    let last = last.expect("at least one run");
    (ms[ms.len() / 2], ms[ms.len() - 1], last)
}

/// The command line's numeric arguments, in order (the others are left to the caller).
pub fn numeric_args() -> Vec<u64> {
    std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect()
}

pub fn name<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().expect("valid name")
}
