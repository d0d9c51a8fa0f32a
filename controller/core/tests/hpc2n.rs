//! HPC2N's Maui policy (HPC2N's Maui scheduling policy), its worked examples as tests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Cluster, jr};
use docket_core::command::EndCause;
use docket_core::config::{QueuePolicy, SchedConfig};
use docket_core::job::{Part, Reason, TimeRequest};
use docket_core::quantity::Seconds;
use docket_core::{JobId, Rejection};

fn hpc2n() -> Cluster {
    let config = SchedConfig {
        queue_policy: QueuePolicy::hpc2n(),
        max_walltime: Some(Seconds(432_000)),
        ..SchedConfig::default()
    };
    Cluster::new(config, 4)
}

fn parts(c: &Cluster, ids: &[JobId]) -> Vec<(Part, Reason)> {
    ids.iter()
        .map(|id| (c.job(*id).part, c.job(*id).reason))
        .collect()
}

/// "if you submit 10 jobs to the queue, the first 8 will go to 'idle' and the next 2 to
/// 'blocked'. When one of the 'idle' jobs starts running, the newest of the 'blocked' jobs
/// will be upgraded to 'idle' status."
#[test]
fn ten_jobs_eight_idle_two_blocked_and_newest_promoted() {
    let mut c = hpc2n();
    let specs = (0..10).map(|_| c.spec("alice")).collect();
    let ids = c.submit(specs);
    let got = parts(&c, &ids);
    for (i, (part, reason)) in got.iter().enumerate() {
        if i < 8 {
            assert_eq!((*part, *reason), (Part::Idle, Reason::None), "job {i}");
        } else {
            assert_eq!(
                (*part, *reason),
                (Part::Blocked, Reason::MaxIdleJobsPerUser),
                "job {i}"
            );
        }
    }
    // One idle job starts: the newest blocked job (the 10th) moves up, the 9th stays blocked.
    c.start(jr(ids[0]), &["n001"]).unwrap();
    assert_eq!(c.job(ids[9]).part, Part::Idle);
    assert_eq!(c.job(ids[9]).reason, Reason::None);
    assert_eq!(c.job(ids[8]).part, Part::Blocked);
    // Another starts: now the 9th moves up.
    c.start(jr(ids[1]), &["n001"]).unwrap();
    assert_eq!(c.job(ids[8]).part, Part::Idle);
    // Jobs of another user are not affected by alice's caps.
    let bob = c.submit(vec![c.spec("bob")]);
    assert_eq!(c.job(bob[0]).part, Part::Idle);
}

/// At most 72 jobs running plus idle.
#[test]
fn total_cap_counts_running_and_idle() {
    let mut c = hpc2n();
    let config = SchedConfig {
        queue_policy: QueuePolicy {
            max_idle_jobs_per_user: Some(8),
            max_jobs_per_user: Some(10),
            ..QueuePolicy::hpc2n()
        },
        ..c.state.config.clone()
    };
    c.ok(docket_core::Command::SetConfig(Box::new(config)));
    let mut spec = c.spec("alice");
    spec.time = TimeRequest::Limit(Seconds(60)); // small PS: MAXPS stays out of the way
    let ids = c.submit((0..12).map(|_| spec.clone()).collect());
    for id in &ids[..4] {
        c.start(jr(*id), &["n001"]).unwrap();
    }
    // 4 running + 6 idle = 10 = the cap; the other 2 are blocked by the total cap.
    let idle = ids
        .iter()
        .filter(|id| {
            c.job(**id).part == Part::Idle
                && c.job(**id).state == docket_core::job::JobState::Pending
        })
        .count();
    assert_eq!(idle, 6);
    let blocked: Vec<Reason> = ids
        .iter()
        .filter(|id| c.job(**id).part == Part::Blocked)
        .map(|id| c.job(*id).reason)
        .collect();
    assert_eq!(blocked, vec![Reason::MaxJobsPerUser; 2]);
}

/// The MAXPS arithmetic: a running job with 9:42:28 left on 2 procs is 69896 PS; a new job
/// of 8 procs for 1:00:00 is 28800 PS; 69896 + 28800 = 98696 > 72000, so it may not start.
#[test]
fn maxps_worked_example_blocks_on_the_soft_limit() {
    let mut c = hpc2n();
    let mut running = c.spec("alice");
    running.ntasks = 2;
    running.time = TimeRequest::Limit(Seconds(36_000));
    let r = c.submit(vec![running]);
    c.start(jr(r[0]), &["n001"]).unwrap();
    // 36000 - 34948 = 1052 s later, 34948 s remain.
    let mut next = c.spec("alice");
    next.ntasks = 8;
    next.time = TimeRequest::Limit(Seconds(3600));
    c.apply_after(1052, docket_core::Command::Tick).unwrap();
    assert_eq!(c.job(r[0]).remaining_ps(c.now), Some(69_896));
    let n = c.submit(vec![next]);
    let job = c.job(n[0]);
    assert_eq!(job.requested_ps(), Some(28_800));
    assert_eq!(
        job.part,
        Part::Idle,
        "MAXPS keeps the job idle, as showq shows"
    );
    assert_eq!(job.reason, Reason::MaxPsSoftLimit);
    // Once the running job ends, the sum is 28800 <= 72000 and it may start.
    c.end(r[0], EndCause::Exited, 0);
    assert_eq!(c.job(n[0]).reason, Reason::None);
}

/// A job may never exceed the hard limit: alone above it, it can never run; with running
/// jobs above it, it waits (hard) rather than being a soft candidate.
#[test]
fn maxps_hard_limit() {
    let mut c = hpc2n();
    let mut huge = c.spec("alice");
    huge.ntasks = 16;
    huge.time = TimeRequest::Limit(Seconds(80_000)); // 1,280,000 > 1,080,000
    let h = c.submit(vec![huge]);
    assert_eq!(c.job(h[0]).reason, Reason::MaxPsHardLimitNever);
    assert_eq!(c.job(h[0]).part, Part::Blocked);

    let mut big = c.spec("alice");
    big.ntasks = 16;
    big.time = TimeRequest::Limit(Seconds(40_000)); // 640,000: above soft, below hard
    let b = c.submit(vec![big.clone()]);
    assert_eq!(c.job(b[0]).reason, Reason::MaxPsSoftLimit);
    // The soft limit may be lifted by the planner: a start decision is accepted.
    c.start(jr(b[0]), &["n001"]).unwrap();
    // A second one would make 1,280,000 > hard: it waits for the first.
    let b2 = c.submit(vec![big]);
    assert_eq!(c.job(b2[0]).reason, Reason::MaxPsHardLimit);
    let err = c.start(jr(b2[0]), &["n002"]).unwrap_err();
    assert!(matches!(err, Rejection::Stale { .. }), "{err}");
}

/// "a job is not allowed to run longer than 5 days (432000 s)".
#[test]
fn five_day_walltime_cap() {
    let mut c = hpc2n();
    let mut long = c.spec("alice");
    long.time = TimeRequest::Limit(Seconds(432_001));
    let r = c.submit_as(docket_core::Actor::User(common::name("alice")), vec![long]);
    let err = r[0].clone().unwrap_err();
    assert_eq!(
        err.to_string(),
        "time (site maximum walltime) = 432001 exceeds the limit of 432000"
    );
    let mut ok = c.spec("alice");
    ok.time = TimeRequest::Limit(Seconds(432_000));
    ok.ntasks = 1;
    assert!(c.submit(vec![ok]).len() == 1);
}

/// "If there are NO other jobs eligible for scheduling then and only then are jobs with
/// resource requests between SOFT and HARD limit considered for scheduling."
#[test]
fn soft_maxps_is_lifted_only_when_nothing_else_is_eligible() {
    let mut c = hpc2n();
    let mut big = c.spec("alice");
    big.ntasks = 16;
    big.time = TimeRequest::Limit(Seconds(40_000)); // 640,000 PS: above soft, below hard
    let soft = c.submit(vec![big])[0];
    let other = c.submit(vec![c.spec("bob")])[0];
    assert_eq!(c.job(soft).reason, Reason::MaxPsSoftLimit);
    assert_eq!(c.job(other).reason, Reason::None);
    let err = c.start(jr(soft), &["n001"]).unwrap_err();
    assert!(
        err.to_string()
            .contains("only when nothing else is eligible"),
        "{err}"
    );
    // Once bob's job has started nothing else is eligible: the soft limit may be lifted.
    c.start(jr(other), &["n002"]).unwrap();
    c.start(jr(soft), &["n001"]).unwrap();
}
