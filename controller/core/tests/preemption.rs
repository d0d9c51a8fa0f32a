//! Preemption as NCI runs it (NCI's PBS job scheduling documentation): express suspends normal (priority-run), a large
//! job suspends smaller ones at the same priority when the suspension score allows
//! (parallel-run), suspended jobs keep memory and jobfs and stop their walltime, and resume
//! when their cpus come back; requeue mode kills and requeues instead.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Cluster, by, jr, name};
use docket_core::command::{EndCause, PreemptDecision};
use docket_core::config::SchedConfig;
use docket_core::job::{JobState, TimeRequest};
use docket_core::partition::PreemptMode;
use docket_core::plan::Unlimited;
use docket_core::preempt::ParallelRun;
use docket_core::quantity::{MiB, Seconds};
use docket_core::{Actor, Command, JobId, PreemptOutcome, Response};

/// One 16-cpu node in `normal` (tier 1, victims `mode`) and `express` (tier 10).
fn nci(mode: PreemptMode, parallel: Option<ParallelRun>) -> Cluster {
    let mut config = SchedConfig::default();
    config.preempt.parallel_run = parallel;
    let mut c = Cluster::new(config, 1);
    c.add_nci_queues(mode);
    c
}

fn job(c: &mut Cluster, user: &str, partition: &str, cpus: u32, hours: u64) -> JobId {
    let mut s = c.spec(user);
    s.partition = Some(name(partition));
    s.ntasks = cpus;
    s.time = TimeRequest::Limit(Seconds::hours(hours));
    c.submit(vec![s])[0]
}

fn preempt(
    c: &mut Cluster,
    d: Vec<PreemptDecision>,
) -> Vec<Result<PreemptOutcome, docket_core::Rejection>> {
    match c.ok(Command::Preempt(d)) {
        Response::Preempted(r) => r,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn express_suspends_normal_and_normal_resumes_after() {
    let mut c = nci(PreemptMode::Suspend, None);
    let normal = job(&mut c, "alice", "normal", 16, 10);
    c.start(jr(normal), &["n001"]).unwrap();
    let express = job(&mut c, "bob", "express", 8, 1);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert!(plan.starts.is_empty());
    assert_eq!(plan.preemptions.len(), 1, "{plan:?}");
    assert_eq!(plan.preemptions[0].start.job, jr(express));
    assert_eq!(plan.preemptions[0].victims, vec![normal]);
    let r = preempt(&mut c, plan.preemptions.clone());
    assert_eq!(r, vec![Ok(PreemptOutcome::Started(express))]);
    assert_eq!(c.job(normal).state, JobState::Suspended);
    assert_eq!(c.job(express).state, JobState::Running);
    let node = &c.state.nodes[&name("n001")];
    assert_eq!(
        node.used_cpus(),
        8,
        "the suspended job's cpus run the express job"
    );
    assert_eq!(
        node.used_memory(),
        MiB::gib(24),
        "memory of both stays allocated"
    );
    // Walltime stops while suspended.
    let ran = c.job(normal).run_time(c.now);
    c.apply_after(1800, Command::Tick).unwrap();
    assert_eq!(c.job(normal).run_time(c.now), ran);
    // Resuming by hand is refused while its cpus are taken.
    let r = c.ok(by(
        Actor::Operator,
        Command::ResumeJobs {
            jobs: vec![jr(normal)],
        },
    ));
    assert!(matches!(&r, Response::PerJob(v) if v[0].is_err()), "{r:?}");
    // The express job ends; the next main pass resumes the normal one.
    c.end(express, EndCause::Exited, 0);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert_eq!(plan.resumes, vec![normal]);
    c.ok(by(
        Actor::Operator,
        Command::ResumeJobs {
            jobs: plan.resumes.iter().map(|id| jr(*id)).collect(),
        },
    ));
    assert_eq!(c.job(normal).state, JobState::Running);
    assert_eq!(c.job(normal).run_time(c.now), ran);
}

#[test]
fn nothing_is_preempted_where_the_mode_is_off() {
    let mut c = nci(PreemptMode::Off, None);
    let normal = job(&mut c, "alice", "normal", 16, 10);
    c.start(jr(normal), &["n001"]).unwrap();
    job(&mut c, "bob", "express", 8, 1);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert!(plan.preemptions.is_empty() && plan.starts.is_empty());
    // And apply refuses a hand-made preemption.
    let d = PreemptDecision {
        start: docket_core::command::StartDecision {
            job: jr(JobId(2)),
            nodes: vec![name("n001")],
        },
        victims: vec![normal],
    };
    let r = preempt(&mut c, vec![d]);
    assert!(
        r[0].as_ref()
            .is_err_and(|e| e.to_string().contains("may not preempt")),
        "{r:?}"
    );
    assert_eq!(c.job(normal).state, JobState::Running, "nothing changed");
}

#[test]
fn parallel_run_suspends_the_best_victim_and_spares_one_nearly_done() {
    let pr = ParallelRun {
        min_size_ratio: 2,
        ..ParallelRun::default()
    };
    let mut c = nci(PreemptMode::Suspend, Some(pr));
    c.add_user("carol", "proj");
    // Two 4-cpu jobs: one nearly done, one just started.
    let old = job(&mut c, "alice", "normal", 4, 1);
    c.start(jr(old), &["n001"]).unwrap();
    c.apply_after(3300, Command::Tick).unwrap(); // 55 of its 60 minutes done
    let fresh = job(&mut c, "carol", "normal", 4, 10);
    c.start(jr(fresh), &["n001"]).unwrap();
    // A 12-cpu job needs 4 more cpus than are free: one victim.
    let large = job(&mut c, "bob", "normal", 12, 1);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert_eq!(plan.preemptions.len(), 1, "{plan:?}");
    assert_eq!(plan.preemptions[0].start.job, jr(large));
    assert_eq!(
        plan.preemptions[0].victims,
        vec![fresh],
        "the nearly done job is spared"
    );
    assert!(
        c.state.suspension_score(c.job(large), c.job(fresh), c.now)
            > c.state.suspension_score(c.job(large), c.job(old), c.now)
    );
    let r = preempt(&mut c, plan.preemptions);
    assert_eq!(r, vec![Ok(PreemptOutcome::Started(large))]);
    assert_eq!(c.job(fresh).state, JobState::Suspended);
    assert_eq!(c.job(old).state, JobState::Running);
}

#[test]
fn a_job_too_small_for_parallel_run_waits() {
    let pr = ParallelRun::default(); // 4x the victim's cpus
    let mut c = nci(PreemptMode::Suspend, Some(pr));
    let running = job(&mut c, "alice", "normal", 16, 10);
    c.start(jr(running), &["n001"]).unwrap();
    job(&mut c, "bob", "normal", 16, 1); // same size: no parallel-run
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert!(plan.preemptions.is_empty(), "{plan:?}");
}

#[test]
fn requeue_mode_kills_the_victim_and_puts_it_back_in_the_queue() {
    let mut c = nci(PreemptMode::Requeue, None);
    let normal = job(&mut c, "alice", "normal", 16, 10);
    c.start(jr(normal), &["n001"]).unwrap();
    let express = job(&mut c, "bob", "express", 8, 1);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    let r = preempt(&mut c, plan.preemptions);
    assert_eq!(r, vec![Ok(PreemptOutcome::Freeing)]);
    assert_eq!(c.job(normal).state, JobState::Completing);
    assert_eq!(
        c.job(express).state,
        JobState::Pending,
        "waits for the kill"
    );
    // The agent reports the kill: the victim is requeued, and the express job starts.
    c.end(normal, EndCause::Cancelled, 0);
    assert_eq!(c.job(normal).state, JobState::Pending);
    assert_eq!(c.job(normal).requeue_count, 1);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert_eq!(
        plan.starts[0].job,
        jr(express),
        "express first (higher tier)"
    );
}
