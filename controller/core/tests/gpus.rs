//! GPUs: allocated whole per node like cpus, checked at submission, planned on by every
//! pass, kept by a suspended job (so suspension cannot free them), and charged as usage.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::{Cluster, by, jr, name};
use docket_core::command::EndCause;
use docket_core::config::SchedConfig;
use docket_core::job::Reason;
use docket_core::job::{JobSpec, JobState, TimeRequest};
use docket_core::node::NodeSpec;
use docket_core::partition::PreemptMode;
use docket_core::plan::Unlimited;
use docket_core::quantity::{MiB, Seconds};
use docket_core::{Command, JobId};

/// Two nodes of 16 cpus and 4 GPUs each in partition `work`.
fn gpu_cluster() -> Cluster {
    let mut c = Cluster::new(SchedConfig::default(), 2);
    for n in ["n001", "n002"] {
        let mut spec = c.state.nodes[&name(n)].spec.clone();
        spec.gpus = 4;
        c.ok(Command::UpsertNode(spec));
    }
    c
}

fn gpu_job(c: &Cluster, user: &str, gpus: u32, hours: u64) -> JobSpec {
    let mut s = c.spec(user);
    s.gpus_per_node = gpus;
    s.time = TimeRequest::Limit(Seconds::hours(hours));
    s
}

fn start_plan(c: &mut Cluster) -> Vec<JobId> {
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    let started: Vec<JobId> = plan.starts.iter().map(|d| d.job.job).collect();
    match c.ok(Command::StartJobs(plan.starts)) {
        docket_core::Response::Started(r) => assert!(r.iter().all(Result::is_ok), "{r:?}"),
        other => panic!("unexpected {other:?}"),
    }
    c.ok(Command::SetSchedulerReasons(plan.reasons));
    started
}

#[test]
fn gpus_bound_starts_even_with_cpus_free() {
    let mut c = gpu_cluster();
    let ids = c.submit((0..5).map(|_| gpu_job(&c, "alice", 2, 1)).collect());
    assert_eq!(start_plan(&mut c), ids[..4].to_vec());
    for n in ["n001", "n002"] {
        let node = &c.state.nodes[&name(n)];
        assert_eq!((node.used_gpus(), node.used_cpus()), (4, 2), "{n}");
    }
    // 28 cpus are free but no GPU: the fifth waits for resources.
    assert!(start_plan(&mut c).is_empty());
    assert_eq!(c.job(ids[4]).reason, Reason::Resources);
    // The main pass stops at the blocked job; backfill starts a cpu-only job beside it,
    // since it takes no GPU the blocked job is waiting for.
    let cpu_only = c.submit(vec![c.spec("bob")])[0];
    assert!(start_plan(&mut c).is_empty());
    let plan = c.state.backfill_pass(c.now, &mut Unlimited, None);
    assert_eq!(
        plan.starts.iter().map(|d| d.job.job).collect::<Vec<_>>(),
        vec![cpu_only]
    );
    c.ok(Command::StartJobs(plan.starts));
    assert_eq!(c.job(cpu_only).state, JobState::Running);
    // Allocation and accounting carry the GPUs.
    let alloc = c.job(ids[0]).alloc.clone().unwrap();
    assert_eq!(alloc.gpus(), 2);
    assert_eq!(c.job(ids[0]).tres_held().gpus, 2);
    // One GPU job ends: the fifth takes its GPUs.
    c.end(ids[0], EndCause::Exited, 0);
    assert_eq!(start_plan(&mut c), vec![ids[4]]);
}

#[test]
fn submission_refuses_more_gpus_than_any_node_has() {
    let mut c = gpu_cluster();
    let user = name::<docket_core::UserName>("alice");
    let r = c.submit_as(
        docket_core::Actor::User(user),
        vec![gpu_job(&c, "alice", 5, 1)],
    );
    let err = r[0].as_ref().unwrap_err().to_string();
    assert!(
        err.contains("gpus per node") && err.contains('5') && err.contains('4'),
        "{err}"
    );
    assert!(c.state.jobs.is_empty(), "nothing changed");
}

#[test]
fn an_exclusive_job_takes_every_gpu_of_its_nodes() {
    let mut c = gpu_cluster();
    let mut s = c.spec("alice");
    s.exclusive = true;
    let id = c.submit(vec![s])[0];
    assert_eq!(start_plan(&mut c), vec![id]);
    let alloc = c.job(id).alloc.clone().unwrap();
    assert_eq!((alloc.cpus(), alloc.gpus()), (16, 4));
}

#[test]
fn backfill_reserves_gpus_for_the_blocked_job() {
    let mut c = gpu_cluster();
    // Both nodes' GPUs are busy: one for 1 hour, one for 10.
    let short = c.submit(vec![gpu_job(&c, "alice", 4, 1)])[0];
    let long = c.submit(vec![gpu_job(&c, "alice", 4, 10)])[0];
    assert_eq!(start_plan(&mut c), vec![short, long]);
    // The blocked job wants 4 GPUs: its reservation is where `short` ends, in an hour.
    let blocked = c.submit(vec![gpu_job(&c, "bob", 4, 5)])[0];
    // A 2-hour GPU job would delay it; a 2-hour cpu job would not.
    let gpu_late = c.submit(vec![gpu_job(&c, "bob", 1, 2)])[0];
    let cpu_fill = c.submit(vec![{
        let mut s = c.spec("bob");
        s.time = TimeRequest::Limit(Seconds::hours(2));
        s
    }])[0];
    let plan = c.state.backfill_pass(c.now, &mut Unlimited, None);
    let started: Vec<JobId> = plan.starts.iter().map(|d| d.job.job).collect();
    assert_eq!(started, vec![cpu_fill], "{plan:?}");
    let reserved = plan
        .reservations
        .iter()
        .find(|(j, _)| *j == jr(blocked))
        .expect("the blocked job holds a reservation");
    assert_eq!(
        reserved.1.start,
        c.job(short).start_time.unwrap().plus(Seconds::hours(1))
    );
    assert!(!started.contains(&gpu_late));
}

#[test]
fn a_suspended_job_keeps_its_gpus_so_suspension_cannot_free_them() {
    // One node, 16 cpus and 4 GPUs, in `normal` (suspend mode) and `express` (tier 10).
    let mut c = Cluster::new(SchedConfig::default(), 1);
    c.ok(Command::UpsertNode(NodeSpec {
        name: name("n001"),
        cpus: 16,
        memory: MiB::gib(64),
        jobfs: MiB::gib(100),
        gpus: 4,
        features: BTreeSet::new(),
    }));
    c.add_nci_queues(PreemptMode::Suspend);
    let mut s = gpu_job(&c, "alice", 4, 10);
    s.partition = Some(name("normal"));
    s.ntasks = 16;
    let victim = c.submit(vec![s])[0];
    c.start(jr(victim), &["n001"]).unwrap();
    // An express job needing GPUs gets nothing by suspending: the GPUs stay with the victim.
    let mut s = gpu_job(&c, "bob", 1, 1);
    s.partition = Some(name("express"));
    let needs_gpu = c.submit(vec![s])[0];
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert!(
        plan.preemptions.is_empty() && plan.starts.is_empty(),
        "{plan:?}"
    );
    // An express job needing only cpus does suspend it.
    c.ok(by(
        docket_core::Actor::Operator,
        Command::CancelJobs {
            jobs: vec![jr(needs_gpu)],
        },
    ));
    let mut s = c.spec("bob");
    s.partition = Some(name("express"));
    s.ntasks = 8;
    let cpu_express = c.submit(vec![s])[0];
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert_eq!(plan.preemptions.len(), 1, "{plan:?}");
    assert_eq!(plan.preemptions[0].start.job, jr(cpu_express));
    c.ok(Command::Preempt(plan.preemptions));
    assert_eq!(c.job(victim).state, JobState::Suspended);
    assert_eq!(c.state.nodes[&name("n001")].used_gpus(), 4);
}

#[test]
fn gpu_seconds_are_charged_to_the_association() {
    let mut c = gpu_cluster();
    let id = c.submit(vec![gpu_job(&c, "alice", 3, 2)])[0];
    c.start(jr(id), &["n001"]).unwrap();
    c.apply_after(1000, Command::Tick).unwrap();
    let entry = c.state.usage.entries[&name::<docket_core::AccountName>("proj")]
        [&name::<docket_core::UserName>("alice")];
    assert_eq!(entry.gpu_seconds.value, 3000.0);
}
