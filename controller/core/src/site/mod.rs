//! The site configuration file (`docket.toml`): what a cluster is (nodes, partitions, QOS,
//! accounts, users) and how it schedules, in Slurm's vocabulary.
//!
//! One file serves the controller and `docket sim`: its `[controller]` table holds the
//! daemon's own settings (the controller reads them; they are not replicated) and its
//! `[sim]` table the SWF mapping `docket sim` uses; everything else is the *site*, which
//! this module turns into the commands that build it in replicated state
//! ([`SiteConfig::commands`]). Parsing is pure (text in, values out), so `check-config`, the
//! controller and the simulator validate a file identically.
//!
//! Keys are Slurm's (`PartitionName`, `MaxTime`, `PriorityWeightAge`, `bf_window` in
//! minutes, hostlists such as `n[001-128]`), Maui's for HPC2N's queue policy (`MAXIJOB`,
//! `MAXJOB`, `MAXPS`), and NCI's for charging and parallel-run. Every error names the key
//! (`partitions[1].MaxTime`) and what it accepts.

mod build;
pub mod file;

use std::collections::BTreeSet;

pub use build::build;

use crate::account::{AssocLimits, Grant, User, UserAssoc};
use crate::command::Command;
use crate::config::SchedConfig;
use crate::ids::{AccountName, QosName};
use crate::node::NodeSpec;
use crate::partition::Partition;
use crate::qos::Qos;

/// Why a configuration file is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SiteError {
    /// Not TOML, or a key or value the schema does not allow (toml names the key, the line,
    /// and the allowed keys or values).
    #[error("{0}")]
    Syntax(String),
    /// A value of the right type that is not acceptable.
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
}

impl SiteError {
    pub(crate) fn invalid(key: impl Into<String>, message: impl Into<String>) -> SiteError {
        SiteError::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// An account as the file defines it.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountDef {
    pub name: AccountName,
    pub parent: AccountName,
    pub shares: u32,
    pub limits: AssocLimits,
    pub grant: Option<Grant>,
    pub coordinators: Vec<crate::ids::UserName>,
}

/// A user and the associations the file gives them.
#[derive(Debug, Clone, PartialEq)]
pub struct UserDef {
    pub user: User,
    pub assocs: Vec<(AccountName, UserAssoc)>,
}

/// A validated site: everything but the daemon's and the simulator's own tables.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteConfig {
    pub cluster_name: Option<String>,
    pub sched: SchedConfig,
    pub nodes: Vec<NodeSpec>,
    pub qos: Vec<Qos>,
    /// Parents before children.
    pub accounts: Vec<AccountDef>,
    pub partitions: Vec<Partition>,
    pub users: Vec<UserDef>,
}

/// A parsed file: the site, plus the raw tables other programs read.
#[derive(Debug, Clone)]
pub struct SiteFile {
    pub site: SiteConfig,
    pub controller: Option<toml::Table>,
    pub sim: Option<toml::Table>,
}

/// Parses and validates a configuration file's text.
pub fn parse(text: &str) -> Result<SiteFile, SiteError> {
    let raw: file::RawFile = toml::from_str(text).map_err(|e| SiteError::Syntax(e.to_string()))?;
    let controller = raw.controller.clone();
    let sim = raw.sim.clone();
    Ok(SiteFile {
        site: build(raw)?,
        controller,
        sim,
    })
}

impl SiteConfig {
    /// The commands that build this site in a fresh state, in an order apply accepts: QOS
    /// (then their preemption lists, which name each other), the scheduler config, nodes,
    /// accounts parent-first, partitions (which name QOS and accounts), users.
    ///
    /// Like Slurm, which creates QOS `normal` when it is installed, a site that does not
    /// define its default QOS (`default_qos`, `normal` unless set) gets it with no limits.
    pub fn commands(&self) -> Vec<Command> {
        let mut out = Vec::new();
        if !self.qos.iter().any(|q| q.name == self.sched.default_qos) {
            out.push(Command::UpsertQos(Box::new(crate::qos::Qos::new(
                self.sched.default_qos.clone(),
            ))));
        }
        for q in &self.qos {
            let mut bare = q.clone();
            bare.preempt = BTreeSet::new();
            out.push(Command::UpsertQos(Box::new(bare)));
        }
        for q in self.qos.iter().filter(|q| !q.preempt.is_empty()) {
            out.push(Command::UpsertQos(Box::new(q.clone())));
        }
        out.push(Command::SetConfig(Box::new(self.sched.clone())));
        for n in &self.nodes {
            out.push(Command::UpsertNode(n.clone()));
        }
        for a in &self.accounts {
            out.push(Command::UpsertAccount {
                name: a.name.clone(),
                parent: a.parent.clone(),
                shares: a.shares,
                limits: a.limits.clone(),
                grant: a.grant,
            });
        }
        for p in &self.partitions {
            out.push(Command::UpsertPartition(Box::new(p.clone())));
        }
        for u in &self.users {
            out.push(Command::UpsertUser {
                user: u.user.clone(),
                assocs: u.assocs.clone(),
            });
        }
        // Coordinators name users, so they come last.
        for a in self.accounts.iter().filter(|a| !a.coordinators.is_empty()) {
            out.push(Command::SetCoordinators {
                account: a.name.clone(),
                users: a.coordinators.clone(),
            });
        }
        out
    }

    /// A fresh state holding this site, built by applying [`SiteConfig::commands`] at
    /// `now`; the first command apply refuses is reported with the object it was building.
    pub fn to_state(&self, now: crate::quantity::TimeMs) -> Result<crate::state::State, SiteError> {
        let mut state = crate::state::State::new(self.sched.clone());
        for (i, cmd) in self.commands().into_iter().enumerate() {
            let what = describe(&cmd);
            let ctx = crate::apply::ApplyCtx {
                index: i as u64 + 1,
                time_ms: now,
            };
            state
                .apply(crate::command::Envelope::controller(cmd), ctx)
                .map_err(|e| SiteError::invalid(what, e.to_string()))?;
        }
        Ok(state)
    }

    /// The QOS named `name`, if the file defines it.
    pub fn qos(&self, name: &QosName) -> Option<&Qos> {
        self.qos.iter().find(|q| &q.name == name)
    }
}

/// Which part of the file a command builds, for error messages.
fn describe(cmd: &Command) -> String {
    match cmd {
        Command::UpsertQos(q) => format!("qos {}", q.name),
        Command::SetConfig(_) => "scheduler configuration".into(),
        Command::UpsertNode(n) => format!("node {}", n.name),
        Command::UpsertAccount { name, .. } => format!("account {name}"),
        Command::UpsertPartition(p) => format!("partition {}", p.name),
        Command::UpsertUser { user, .. } => format!("user {}", user.name),
        _ => "configuration".into(),
    }
}
