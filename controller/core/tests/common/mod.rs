//! A small cluster to apply commands to, checking every invariant after every command.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use docket_core::account::{AssocLimits, User, UserAssoc};
use docket_core::command::{EndCause, EndReport, StartDecision};
use docket_core::config::SchedConfig;
use docket_core::job::{BlobId, ExitStatus, JobRef, JobSpec, TimeRequest};
use docket_core::node::NodeSpec;
use docket_core::partition::Partition;
use docket_core::qos::Qos;
use docket_core::quantity::{MiB, Seconds, TimeMs};
use docket_core::sim::swf::{SwfJob, Trace};
use docket_core::sim::{Policy, SimOptions, replay};
use docket_core::{Actor, ApplyCtx, Command, Envelope, JobId, Rejection, Response, State};

pub const SCRIPT: &[u8] = b"#!/bin/sh\necho hello\n";

/// A trace of `jobs` on a machine of `procs` processors (the textbook replay's).
pub fn swf_trace(procs: u64, jobs: Vec<SwfJob>) -> Trace {
    Trace {
        jobs,
        max_procs: Some(procs),
        ..Trace::default()
    }
}

/// Each job's start when `t` is replayed under `policy`, by SWF id.
pub fn swf_starts(t: &Trace, policy: Policy) -> Vec<(u64, u64)> {
    let options = SimOptions {
        policy: Some(policy),
        procs: None,
        max_jobs: None,
        site: None,
    };
    let r = replay(t, &options, &mut |_, _| {}).unwrap();
    let mut s: Vec<(u64, u64)> = r.outcomes.iter().map(|o| (o.swf_id, o.start)).collect();
    s.sort_unstable();
    s
}

/// What the test cluster applies: a bare command is the controller's own.
pub trait IntoEnvelope {
    fn into_envelope(self) -> Envelope;
}

impl IntoEnvelope for Command {
    fn into_envelope(self) -> Envelope {
        Envelope::controller(self)
    }
}

impl IntoEnvelope for Envelope {
    fn into_envelope(self) -> Envelope {
        self
    }
}

/// `cmd` as `actor` asks for it.
pub fn by(actor: Actor, cmd: Command) -> Envelope {
    Envelope::new(actor, cmd)
}

pub struct Cluster {
    pub state: State,
    pub index: u64,
    pub now: TimeMs,
}

pub fn name<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().unwrap()
}

impl Cluster {
    /// `nodes` nodes of 16 cpus, 64 GiB, 100 GiB jobfs in partition `work` (default), QOS
    /// `normal`, account `proj` under root, users alice and bob in it.
    pub fn new(config: SchedConfig, nodes: u32) -> Cluster {
        let mut c = Cluster {
            state: State::new(config),
            index: 0,
            now: TimeMs(1_700_000_000_000),
        };
        let mut names = BTreeSet::new();
        for i in 1..=nodes {
            let n: docket_core::NodeName = name(&format!("n{i:03}"));
            names.insert(n.clone());
            c.ok(Command::UpsertNode(NodeSpec {
                name: n,
                cpus: 16,
                memory: MiB::gib(64),
                jobfs: MiB::gib(100),
                gpus: 0,
                features: BTreeSet::new(),
            }));
        }
        c.ok(Command::UpsertQos(Box::new(Qos::new(name("normal")))));
        let mut p = Partition::new(name("work"), names);
        p.is_default = true;
        p.def_mem_per_cpu = Some(MiB::gib(1));
        c.ok(Command::UpsertPartition(Box::new(p)));
        c.set_account("proj", AssocLimits::default(), None);
        for u in ["alice", "bob"] {
            c.add_user(u, "proj");
        }
        c
    }

    /// Adds NCI's queues over `work`'s nodes: `normal` (tier 1, victims preempted in
    /// `mode`) and `express` (tier 10), both 1 GiB per cpu by default.
    #[allow(dead_code)] // not every test binary uses it
    pub fn add_nci_queues(&mut self, mode: docket_core::partition::PreemptMode) {
        let nodes = self.state.partitions[&name::<docket_core::PartitionName>("work")]
            .nodes
            .clone();
        let mut normal = Partition::new(name("normal"), nodes.clone());
        normal.preempt_mode = mode;
        normal.def_mem_per_cpu = Some(MiB::gib(1));
        self.ok(Command::UpsertPartition(Box::new(normal)));
        let mut express = Partition::new(name("express"), nodes);
        express.priority_tier = 10;
        express.def_mem_per_cpu = Some(MiB::gib(1));
        self.ok(Command::UpsertPartition(Box::new(express)));
    }

    /// Adds or changes an account under root (shares 1).
    pub fn set_account(
        &mut self,
        account: &str,
        limits: AssocLimits,
        grant: Option<docket_core::account::Grant>,
    ) {
        self.ok(Command::UpsertAccount {
            name: name(account),
            parent: name("root"),
            shares: 1,
            limits,
            grant,
        });
    }

    pub fn add_user(&mut self, user: &str, account: &str) {
        self.ok(Command::UpsertUser {
            user: User {
                name: name(user),
                default_account: name(account),
                admin: false,
            },
            assocs: vec![(
                name(account),
                UserAssoc {
                    shares: 1,
                    priority: 0,
                    limits: AssocLimits::default(),
                },
            )],
        });
    }

    /// Applies a command one log entry later, `advance` seconds later; checks invariants. A
    /// bare [`Command`] comes from the controller; [`by`] names another actor.
    pub fn apply_after(
        &mut self,
        advance: u64,
        cmd: impl IntoEnvelope,
    ) -> Result<Response, Rejection> {
        self.index += 1;
        self.now = self.now.plus(Seconds(advance));
        let r = self.state.apply(
            cmd.into_envelope(),
            ApplyCtx {
                index: self.index,
                time_ms: self.now,
            },
        );
        if let Err(v) = self.state.check_invariants() {
            panic!("after index {}: {v}", self.index);
        }
        r
    }

    pub fn apply(&mut self, cmd: impl IntoEnvelope) -> Result<Response, Rejection> {
        self.apply_after(0, cmd)
    }

    pub fn ok(&mut self, cmd: impl IntoEnvelope) -> Response {
        let cmd = cmd.into_envelope();
        let shown = format!("{cmd:?}");
        self.apply(cmd)
            .unwrap_or_else(|e| panic!("{} rejected: {e}", &shown[..shown.len().min(200)]))
    }

    pub fn spec(&self, user: &str) -> JobSpec {
        let mut s = JobSpec::simple(name(user), BlobId::of(SCRIPT));
        s.time = TimeRequest::Limit(Seconds::hours(1));
        s
    }

    /// Submits specs as `user`; returns one result per spec.
    pub fn submit_as(
        &mut self,
        actor: Actor,
        specs: Vec<JobSpec>,
    ) -> Vec<Result<JobId, Rejection>> {
        match self.ok(by(
            actor,
            Command::SubmitJobs {
                blobs: vec![SCRIPT.to_vec()],
                jobs: specs,
            },
        )) {
            Response::Submitted(r) => r,
            other => panic!("unexpected {other:?}"),
        }
    }

    pub fn submit(&mut self, specs: Vec<JobSpec>) -> Vec<JobId> {
        let user = specs[0].user.clone();
        self.submit_as(Actor::User(user), specs)
            .into_iter()
            .map(|r| r.unwrap())
            .collect()
    }

    pub fn start(&mut self, job: JobRef, nodes: &[&str]) -> Result<JobId, Rejection> {
        let d = StartDecision {
            job,
            nodes: nodes.iter().map(|n| name(n)).collect(),
        };
        match self.ok(Command::StartJobs(vec![d])) {
            Response::Started(mut r) => r.remove(0),
            other => panic!("unexpected {other:?}"),
        }
    }

    pub fn end(&mut self, job: JobId, cause: EndCause, code: i32) -> Response {
        let epoch = self.state.jobs[&job].alloc.as_ref().map_or(0, |a| a.epoch);
        self.ok(Command::EndJobs(vec![EndReport {
            job,
            epoch,
            cause,
            exit: ExitStatus {
                code,
                signal: 0,
                ..Default::default()
            },
        }]))
    }

    pub fn job(&self, id: JobId) -> &docket_core::job::Job {
        &self.state.jobs[&id]
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.state.to_snapshot().unwrap()
    }
}

pub fn jr(id: JobId) -> JobRef {
    JobRef {
        job: id,
        task: None,
    }
}
