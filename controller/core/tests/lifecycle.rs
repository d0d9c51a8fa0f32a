//! Jobs through their lives: start, end, cancel, hold, requeue on node failure, arrays with
//! throttles, and dependencies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Cluster, by, jr, name};
use docket_core::command::{EndCause, EndReport};
use docket_core::config::SchedConfig;
use docket_core::job::{
    ArrayPart, ArraySpec, Dependency, ExitStatus, JobRef, JobState, Part, Reason,
};
use docket_core::{Actor, Command, Rejection, Response};

fn cluster() -> Cluster {
    Cluster::new(SchedConfig::default(), 2)
}

#[test]
fn start_and_end_free_the_node_and_set_final_states() {
    let mut c = cluster();
    let ids = c.submit(vec![c.spec("alice"), c.spec("alice"), c.spec("alice")]);
    for id in &ids {
        c.start(jr(*id), &["n001"]).unwrap();
    }
    assert_eq!(c.state.nodes[&name("n001")].used_cpus(), 3);
    c.end(ids[0], EndCause::Exited, 0);
    c.end(ids[1], EndCause::Exited, 3);
    c.end(ids[2], EndCause::OutOfMemory, 137);
    assert_eq!(c.job(ids[0]).state, JobState::Completed);
    assert_eq!(c.job(ids[1]).state, JobState::Failed);
    assert_eq!(c.job(ids[2]).state, JobState::OutOfMemory);
    assert_eq!(c.state.nodes[&name("n001")].used_cpus(), 0);
    // Ended jobs hold nothing, but accounting still knows where they ran.
    let ended = c.job(ids[0]);
    assert!(ended.alloc.is_none());
    let ran_on = ended.allocation_record().expect("kept for accounting");
    assert_eq!(ran_on.shares[0].node, name("n001"));
}

#[test]
fn stale_epochs_are_ignored_and_requeue_takes_a_new_epoch() {
    let mut c = cluster();
    let mut spec = c.spec("alice");
    spec.requeue = true;
    let id = c.submit(vec![spec])[0];
    c.start(jr(id), &["n001"]).unwrap();
    let first_epoch = c.job(id).alloc.as_ref().unwrap().epoch;
    c.ok(Command::DownNode {
        node: name("n001"),
        reason: "agent fenced".into(),
    });
    let job = c.job(id);
    assert_eq!((job.state, job.requeue_count), (JobState::Pending, 1));
    assert!(
        job.allocation_record().is_none(),
        "a requeued job runs nowhere"
    );
    c.start(jr(id), &["n002"]).unwrap();
    assert!(c.job(id).alloc.as_ref().unwrap().epoch > first_epoch);
    // The old dispatch reports its end late: ignored, the new run goes on.
    let r = c.ok(Command::EndJobs(vec![EndReport {
        job: id,
        epoch: first_epoch,
        cause: EndCause::Exited,
        exit: ExitStatus {
            code: 0,
            signal: 0,
            ..Default::default()
        },
    }]));
    assert_eq!(
        r,
        Response::Ended {
            applied: 0,
            stale: 1,
            refused: 0,
        }
    );
    assert_eq!(c.job(id).state, JobState::Running);
    // Without --requeue a node failure is final.
    let other = c.submit(vec![c.spec("bob")])[0];
    c.start(jr(other), &["n002"]).unwrap();
    c.ok(Command::DownNode {
        node: name("n002"),
        reason: "power".into(),
    });
    assert_eq!(c.job(other).state, JobState::NodeFail);
}

#[test]
fn start_decisions_are_revalidated() {
    let mut c = cluster();
    let mut big = c.spec("alice");
    big.ntasks = 16;
    let ids = c.submit(vec![big.clone(), big]);
    c.start(jr(ids[0]), &["n001"]).unwrap();
    // The planner planned on an older state: the node is now full.
    let err = c.start(jr(ids[1]), &["n001"]).unwrap_err();
    assert!(err.to_string().contains("no room for 16 cpus"), "{err}");
    // A drained node takes nothing new.
    c.ok(Command::DrainNode {
        node: name("n002"),
        reason: "maintenance".into(),
    });
    let err = c.start(jr(ids[1]), &["n002"]).unwrap_err();
    assert!(err.to_string().contains("drain"), "{err}");
    // Wrong node count, unknown node, a started job.
    c.ok(Command::ResumeNode(name("n002")));
    assert!(c.start(jr(ids[1]), &["n002", "n001"]).is_err());
    assert!(c.start(jr(ids[1]), &["nope"]).is_err());
    assert!(c.start(jr(ids[0]), &["n002"]).is_err());
    c.start(jr(ids[1]), &["n002"]).unwrap();
}

#[test]
fn cancel_hold_release_and_permissions() {
    let mut c = cluster();
    let ids = c.submit(vec![c.spec("alice"), c.spec("alice")]);
    let bob = Actor::User(name("bob"));
    let alice = Actor::User(name("alice"));
    let r = c.ok(by(
        bob.clone(),
        Command::CancelJobs {
            jobs: vec![jr(ids[0])],
        },
    ));
    let Response::PerJob(r) = r else { panic!() };
    assert!(matches!(r[0], Err(Rejection::NotPermitted(_))));
    assert_eq!(c.job(ids[0]).state, JobState::Pending);

    c.ok(by(
        alice.clone(),
        Command::HoldJobs {
            jobs: vec![jr(ids[0])],
        },
    ));
    assert_eq!(c.job(ids[0]).reason, Reason::JobHeldUser);
    c.ok(by(
        Actor::Operator,
        Command::HoldJobs {
            jobs: vec![jr(ids[1])],
        },
    ));
    assert_eq!(c.job(ids[1]).reason, Reason::JobHeldAdmin);
    let Response::PerJob(r) = c.ok(by(
        alice.clone(),
        Command::ReleaseJobs {
            jobs: vec![jr(ids[0]), jr(ids[1])],
        },
    )) else {
        panic!()
    };
    assert!(r[0].is_ok());
    assert!(
        matches!(r[1], Err(Rejection::NotPermitted(_))),
        "admin hold"
    );
    assert_eq!(c.job(ids[0]).reason, Reason::None);

    c.start(jr(ids[0]), &["n001"]).unwrap();
    c.ok(by(
        alice,
        Command::CancelJobs {
            jobs: vec![jr(ids[0])],
        },
    ));
    // Running: the agent must confirm; resources stay held until it does.
    assert_eq!(c.job(ids[0]).state, JobState::Completing);
    assert_eq!(c.state.nodes[&name("n001")].used_cpus(), 1);
    c.end(ids[0], EndCause::Exited, 0);
    assert_eq!(c.job(ids[0]).state, JobState::Cancelled);
}

#[test]
fn arrays_split_tasks_and_honour_the_throttle() {
    let mut c = cluster();
    let mut spec = c.spec("alice");
    spec.array = Some(ArraySpec::parse("0-9%2", 1000).unwrap());
    let a = c.submit(vec![spec])[0];
    assert_eq!(c.job(a).pending_count(), 10);
    let t0 = c
        .start(
            JobRef {
                job: a,
                task: Some(0),
            },
            &["n001"],
        )
        .unwrap();
    let t1 = c
        .start(
            JobRef {
                job: a,
                task: Some(1),
            },
            &["n001"],
        )
        .unwrap();
    assert_ne!(t0, a);
    assert_eq!(
        c.job(t1).array,
        Some(ArrayPart::Task {
            array_job: a,
            index: 1
        })
    );
    assert_eq!(c.job(a).pending_count(), 8);
    assert_eq!(c.job(a).reason, Reason::JobArrayTaskLimit);
    assert!(
        c.start(
            JobRef {
                job: a,
                task: Some(2)
            },
            &["n001"]
        )
        .is_err()
    );
    c.end(t0, EndCause::Exited, 0);
    assert_eq!(c.job(a).reason, Reason::None);
    c.start(
        JobRef {
            job: a,
            task: Some(2),
        },
        &["n001"],
    )
    .unwrap();
    // Cancelling one pending task splits it off and cancels only it.
    c.ok(by(
        Actor::User(name("alice")),
        Command::CancelJobs {
            jobs: vec![JobRef {
                job: a,
                task: Some(9),
            }],
        },
    ));
    assert_eq!(c.job(a).pending_count(), 6);
    // Cancelling the array cancels the rest, running tasks included.
    c.ok(by(
        Actor::User(name("alice")),
        Command::CancelJobs { jobs: vec![jr(a)] },
    ));
    assert_eq!(c.job(a).state, JobState::Cancelled);
    assert_eq!(c.job(t1).state, JobState::Completing);
}

#[test]
fn the_last_pending_task_takes_over_the_array_record() {
    let mut c = cluster();
    let mut spec = c.spec("alice");
    spec.array = Some(ArraySpec::parse("3,5", 1000).unwrap());
    let a = c.submit(vec![spec])[0];
    let t3 = c
        .start(
            JobRef {
                job: a,
                task: Some(3),
            },
            &["n001"],
        )
        .unwrap();
    let t5 = c
        .start(
            JobRef {
                job: a,
                task: Some(5),
            },
            &["n001"],
        )
        .unwrap();
    assert_ne!(t3, a);
    assert_eq!(t5, a);
    assert_eq!(
        c.job(a).array,
        Some(ArrayPart::Task {
            array_job: a,
            index: 5
        })
    );
}

fn dep(c: &mut Cluster, expr: &str) -> docket_core::JobId {
    let mut s = c.spec("alice");
    s.dependency = Some(Dependency::parse(expr).unwrap());
    c.submit(vec![s])[0]
}

#[test]
fn dependencies_wait_release_and_never() {
    let mut c = cluster();
    let base = c.submit(vec![c.spec("alice"), c.spec("alice")]);
    let (a, b) = (base[0], base[1]);
    let ok = dep(&mut c, &format!("afterok:{a}"));
    let notok = dep(&mut c, &format!("afternotok:{a}"));
    let any = dep(&mut c, &format!("afterany:{a}"));
    let after = dep(&mut c, &format!("after:{b}+10"));
    let either = dep(&mut c, &format!("afterok:{a}?afterok:{b}"));
    for id in [ok, notok, any, after, either] {
        assert_eq!(c.job(id).reason, Reason::Dependency, "job {id}");
        assert_eq!(c.job(id).part, Part::Blocked);
    }
    c.start(jr(a), &["n001"]).unwrap();
    c.start(jr(b), &["n001"]).unwrap();
    c.end(a, EndCause::Exited, 1);
    assert_eq!(c.job(ok).reason, Reason::DependencyNeverSatisfied);
    assert_eq!(c.job(notok).reason, Reason::None);
    assert_eq!(c.job(any).reason, Reason::None);
    assert_eq!(
        c.job(either).reason,
        Reason::Dependency,
        "b may still succeed"
    );
    // `after:b+10`: ten minutes after b started.
    c.apply_after(599, Command::Tick).unwrap();
    assert_eq!(c.job(after).reason, Reason::Dependency);
    c.apply_after(1, Command::Tick).unwrap();
    assert_eq!(c.job(after).reason, Reason::None);
    c.end(b, EndCause::Exited, 0);
    assert_eq!(c.job(either).reason, Reason::None);
}

#[test]
fn singleton_runs_one_at_a_time_per_name_and_user() {
    let mut c = cluster();
    let ids: Vec<_> = (0..3).map(|_| dep(&mut c, "singleton")).collect();
    assert_eq!(c.job(ids[0]).reason, Reason::None);
    assert_eq!(c.job(ids[1]).reason, Reason::Dependency);
    c.start(jr(ids[0]), &["n001"]).unwrap();
    assert_eq!(c.job(ids[1]).reason, Reason::Dependency);
    c.end(ids[0], EndCause::Exited, 0);
    assert_eq!(c.job(ids[1]).reason, Reason::None);
    assert_eq!(c.job(ids[2]).reason, Reason::Dependency);
    // Bob's job of the same name is independent.
    let mut s = c.spec("bob");
    s.dependency = Some(Dependency::parse("singleton").unwrap());
    let bob = c.submit(vec![s])[0];
    assert_eq!(c.job(bob).reason, Reason::None);
}

#[test]
fn aftercorr_releases_matching_tasks() {
    let mut c = cluster();
    let mut first = c.spec("alice");
    first.array = Some(ArraySpec::parse("0-1", 1000).unwrap());
    let a = c.submit(vec![first])[0];
    let mut second = c.spec("alice");
    second.array = Some(ArraySpec::parse("0-1", 1000).unwrap());
    second.dependency = Some(Dependency::parse(&format!("aftercorr:{a}")).unwrap());
    let b = c.submit(vec![second])[0];
    assert_eq!(c.job(b).reason, Reason::Dependency);
    let a0 = c
        .start(
            JobRef {
                job: a,
                task: Some(0),
            },
            &["n001"],
        )
        .unwrap();
    c.end(a0, EndCause::Exited, 0);
    // Task 0 of b may go; task 1 may not yet.
    assert_eq!(c.job(b).reason, Reason::None);
    assert!(
        c.start(
            JobRef {
                job: b,
                task: Some(1)
            },
            &["n001"]
        )
        .is_err()
    );
    c.start(
        JobRef {
            job: b,
            task: Some(0),
        },
        &["n001"],
    )
    .unwrap();
}

#[test]
fn suspend_stops_walltime_and_keeps_resources() {
    let mut c = cluster();
    let mut spec = c.spec("alice");
    spec.jobfs = Some(docket_core::quantity::MiB(100));
    let id = c.submit(vec![spec])[0];
    c.start(jr(id), &["n001"]).unwrap();
    c.apply_after(600, Command::Tick).unwrap();
    let Response::PerJob(r) = c.ok(by(
        Actor::User(name("alice")),
        Command::SuspendJobs { jobs: vec![jr(id)] },
    )) else {
        panic!()
    };
    assert!(
        matches!(r[0], Err(Rejection::NotPermitted(_))),
        "users may not suspend"
    );
    c.ok(by(
        Actor::Operator,
        Command::SuspendJobs { jobs: vec![jr(id)] },
    ));
    assert_eq!(c.job(id).state, JobState::Suspended);
    c.apply_after(3000, Command::Tick).unwrap();
    assert_eq!(
        c.job(id).run_time(c.now),
        docket_core::quantity::Seconds(600)
    );
    // NCI: a suspended job keeps its memory and jobfs; its cpus are free for a preemptor.
    let node = &c.state.nodes[&name("n001")];
    assert_eq!(node.used_cpus(), 0, "cpus free while suspended");
    assert!(node.used_memory().0 > 0, "memory stays held");
    assert!(node.used_jobfs().0 > 0, "jobfs stays held");
    c.ok(by(
        Actor::Operator,
        Command::ResumeJobs { jobs: vec![jr(id)] },
    ));
    c.apply_after(60, Command::Tick).unwrap();
    assert_eq!(
        c.job(id).run_time(c.now),
        docket_core::quantity::Seconds(660)
    );
    // 1 cpu x 660 s of usage: the suspended hour is not charged to fair-share.
    let used: f64 = c
        .state
        .usage
        .entries
        .values()
        .flat_map(|u| u.values())
        .map(|d| d.billing.value)
        .sum();
    // (decayed a little: the default half-life is a week)
    assert!((used - 660.0).abs() < 5.0, "{used}");
}

/// Fair-share usage bills what a job holds, memory and cpus, by the partition's
/// TRESBillingWeights; each resource's own seconds are kept as well.
#[test]
fn usage_bills_memory_by_the_partition_weights() {
    use docket_core::job::MemoryRequest;
    use docket_core::partition::Milli;
    use docket_core::quantity::{MiB, Seconds};
    let mut c = Cluster::new(SchedConfig::default(), 1);
    let mut p = c.state.partitions[&name::<docket_core::PartitionName>("work")].clone();
    p.billing.mem_per_gib = Milli(500); // 0.5 per GiB
    c.ok(Command::UpsertPartition(Box::new(p)));
    let mut s = c.spec("alice");
    s.ntasks = 2;
    s.memory = Some(MemoryRequest::PerNode(MiB::gib(8)));
    s.time = docket_core::job::TimeRequest::Limit(Seconds::hours(2));
    let id = c.submit(vec![s])[0];
    c.start(jr(id), &["n001"]).unwrap();
    // The allocation keeps what it was weighed at (sacct's AllocTRES billing=6): later
    // changes to the weights do not rewrite history.
    assert_eq!(
        c.job(id).alloc.as_ref().and_then(|a| a.billing_milli),
        Some(6000)
    );
    let mut p = c.state.partitions[&name::<docket_core::PartitionName>("work")].clone();
    p.billing.mem_per_gib = Milli(0);
    c.ok(Command::UpsertPartition(Box::new(p.clone())));
    assert_eq!(
        c.job(id).alloc.as_ref().and_then(|a| a.billing_milli),
        Some(6000)
    );
    p.billing.mem_per_gib = Milli(500);
    c.ok(Command::UpsertPartition(Box::new(p)));
    c.apply_after(1000, Command::Tick).unwrap();
    let entry = c.state.usage.entries[&name::<docket_core::AccountName>("proj")]
        [&name::<docket_core::UserName>("alice")];
    let t = entry.billing.at;
    // 1000 s x (2 cpus + 8 GiB x 0.5) = 6000 billing-seconds.
    assert!((entry.billing.value - 6000.0).abs() < 1e-6, "{entry:?}");
    assert_eq!(entry.cpu_seconds.value, 2000.0);
    assert_eq!(entry.mem_mib_seconds.value, 8192.0 * 1000.0);
    assert_eq!(entry.gpu_seconds.value, 0.0);
    assert_eq!(t, c.now);
}

/// The tick finds the jobs to purge and the jobs the clock can move from indexes that
/// commands keep (checked against a fresh computation after every command here); an
/// administrator's command in between rebuilds the queue index and must not lose them.
#[test]
fn the_tick_still_finds_clocked_and_finished_jobs_after_an_admin_command() {
    let mut c = cluster();
    let done = c.submit(vec![c.spec("alice")])[0];
    c.start(jr(done), &["n001"]).unwrap();
    c.end(done, EndCause::Exited, 0);
    let mut later = c.spec("alice");
    later.begin = Some(c.now.plus(docket_core::quantity::Seconds(600)));
    let later = c.submit(vec![later])[0];
    assert_eq!(c.job(later).reason, Reason::BeginTime);
    let mut config = c.state.config.clone();
    config.sched.default_queue_depth += 1;
    c.ok(Command::SetConfig(Box::new(config)));
    c.ok(Command::UpsertQos(Box::new(docket_core::qos::Qos::new(
        name("normal"),
    ))));
    c.apply_after(600, Command::Tick).unwrap();
    assert_eq!(
        c.job(later).reason,
        Reason::None,
        "its begin time has passed"
    );
    assert!(!c.state.jobs.contains_key(&done), "purged at MinJobAge");
}

#[test]
fn finished_jobs_are_purged_after_min_job_age_unless_still_needed() {
    let mut c = cluster();
    let ids = c.submit(vec![c.spec("alice"), c.spec("alice")]);
    let waiter = {
        let mut s = c.spec("alice");
        s.dependency = Some(Dependency::parse(&format!("afterok:{}", ids[1])).unwrap());
        s.hold = true;
        c.submit(vec![s])[0]
    };
    for id in &ids {
        c.start(jr(*id), &["n001"]).unwrap();
        c.end(*id, EndCause::Exited, 0);
    }
    c.apply_after(299, Command::Tick).unwrap();
    assert!(c.state.jobs.contains_key(&ids[0]));
    c.apply_after(1, Command::Tick).unwrap();
    assert!(!c.state.jobs.contains_key(&ids[0]), "purged at MinJobAge");
    assert!(
        c.state.jobs.contains_key(&ids[1]),
        "a live dependency still names it"
    );
    c.ok(by(
        Actor::User(name("alice")),
        Command::ReleaseJobs {
            jobs: vec![jr(waiter)],
        },
    ));
    assert_eq!(
        c.job(waiter).reason,
        Reason::None,
        "the outcome is still known"
    );
    c.ok(by(
        Actor::User(name("alice")),
        Command::CancelJobs {
            jobs: vec![jr(waiter)],
        },
    ));
    c.apply_after(300, Command::Tick).unwrap();
    assert!(c.state.jobs.is_empty());
    assert!(
        c.state.blobs.is_empty(),
        "scripts go with the last job using them"
    );
}

/// Archived jobs leave the archive only by the site's retention: without `PurgeJobAfter`
/// no tick names a cut-off; with it each tick names now minus the setting, on the
/// replicated clock, so every replica expires the same records.
#[test]
fn a_tick_names_the_archive_cut_off_only_under_a_retention_setting() {
    use docket_core::quantity::{Seconds, TimeMs};
    let mut c = cluster();
    c.apply_after(10, Command::Tick).unwrap();
    assert_eq!(
        c.state.take_archive_expiry(),
        None,
        "kept forever by default"
    );
    let mut config = c.state.config.clone();
    config.retention.purge_job_after = Some(Seconds::hours(24));
    c.ok(Command::SetConfig(Box::new(config)));
    c.apply_after(3600, Command::Tick).unwrap();
    let now = c.now;
    assert_eq!(
        c.state.take_archive_expiry(),
        Some(TimeMs(now.0 - 24 * 3600 * 1000))
    );
    assert_eq!(c.state.take_archive_expiry(), None, "taken once");
    // A command other than a tick names none.
    c.apply_after(1, Command::EndJobs(Vec::new())).unwrap();
    assert_eq!(c.state.take_archive_expiry(), None);
}

/// A change to a fresh cluster that sets one running limit.
type Setup = Box<dyn Fn(&mut Cluster)>;

/// Sets the `normal` QOS's limits.
fn qos_limits(limits: docket_core::qos::QosLimits) -> Setup {
    Box::new(move |c: &mut Cluster| {
        let mut q = docket_core::qos::Qos::new(name("normal"));
        q.limits = limits.clone();
        c.ok(Command::UpsertQos(Box::new(q)));
    })
}

/// Sets the `work` partition's limits.
fn partition_limits(limits: docket_core::partition::PartitionLimits) -> Setup {
    Box::new(move |c: &mut Cluster| {
        let mut p = c.state.partitions[&name("work")].clone();
        p.limits = limits.clone();
        c.ok(Command::UpsertPartition(Box::new(p)));
    })
}

/// Sets the `proj` account's limits.
fn account_limits(limits: docket_core::account::AssocLimits) -> Setup {
    Box::new(move |c: &mut Cluster| c.set_account("proj", limits.clone(), None))
}

/// Each running limit: how to set it, the tasks of each of two jobs that make the second
/// wait, and the reason it waits for.
fn running_limit_cases() -> Vec<(Setup, u32, Reason)> {
    use docket_core::account::AssocLimits;
    use docket_core::partition::PartitionLimits;
    use docket_core::qos::QosLimits;
    let (qos, partition, account) = (qos_limits, partition_limits, account_limits);
    vec![
        (
            qos(QosLimits {
                max_jobs_per_user: Some(1),
                ..Default::default()
            }),
            1,
            Reason::QosMaxJobsPerUserLimit,
        ),
        (
            qos(QosLimits {
                max_cpus_per_user: Some(5),
                ..Default::default()
            }),
            4,
            Reason::QosMaxCpuPerUserLimit,
        ),
        (
            qos(QosLimits {
                grp_jobs: Some(1),
                ..Default::default()
            }),
            1,
            Reason::QosGrpJobsLimit,
        ),
        (
            qos(QosLimits {
                grp_cpus: Some(6),
                ..Default::default()
            }),
            4,
            Reason::QosGrpCpuLimit,
        ),
        // 4 cpus x 1 h = 240 cpu-minutes each; the group may have 400 running.
        (
            qos(QosLimits {
                grp_cpu_run_mins: Some(400),
                ..Default::default()
            }),
            4,
            Reason::QosGrpCpuRunMinutesLimit,
        ),
        (
            partition(PartitionLimits {
                max_jobs_per_user: Some(1),
                ..Default::default()
            }),
            1,
            Reason::PartitionMaxJobsPerUserLimit,
        ),
        (
            partition(PartitionLimits {
                max_cpus_per_user: Some(7),
                ..Default::default()
            }),
            4,
            Reason::PartitionMaxCpuPerUserLimit,
        ),
        (
            account(AssocLimits {
                max_jobs: Some(1),
                ..Default::default()
            }),
            1,
            Reason::AssocMaxJobsLimit,
        ),
        (
            account(AssocLimits {
                grp_cpu_run_mins: Some(300),
                ..Default::default()
            }),
            4,
            Reason::AssocGrpCpuRunMinutesLimit,
        ),
    ]
}

/// Every Slurm-style running limit blocks with its own reason, and lifts when a job ends.
#[test]
fn running_limits_block_with_their_reason() {
    let cases = running_limit_cases();
    for (setup, ntasks, reason) in cases {
        let mut c = cluster();
        setup(&mut c);
        let mut s = c.spec("alice");
        s.ntasks = ntasks;
        let ids = c.submit(vec![s.clone(), s]);
        assert_eq!(
            c.job(ids[1]).reason,
            Reason::None,
            "{reason}: nothing runs yet"
        );
        c.start(jr(ids[0]), &["n001"]).unwrap();
        assert_eq!(c.job(ids[1]).reason, reason);
        assert!(
            c.start(jr(ids[1]), &["n002"]).is_err(),
            "{reason}: apply re-checks"
        );
        c.end(ids[0], EndCause::Exited, 0);
        assert_eq!(c.job(ids[1]).reason, Reason::None, "{reason} lifts");
    }
}

#[test]
fn partition_submit_limit_refuses_more_jobs() {
    let mut c = cluster();
    let mut p = c.state.partitions[&name("work")].clone();
    p.limits.max_submit_jobs_per_user = Some(2);
    c.ok(Command::UpsertPartition(Box::new(p)));
    let r = c.submit_as(Actor::User(name("alice")), vec![c.spec("alice"); 3]);
    assert!(r[0].is_ok() && r[1].is_ok());
    let err = r[2].clone().unwrap_err().to_string();
    assert_eq!(
        err,
        "jobs of user alice in partition work (MaxSubmitJobsPerUser) = 3 exceeds the limit of 2"
    );
}

#[test]
fn requeue_stops_a_running_job_and_puts_it_back_for_a_new_run() {
    let mut c = cluster();
    let id = c.submit(vec![c.spec("alice")])[0];
    let requeue = |actor: Actor| by(actor, Command::RequeueJobs { jobs: vec![jr(id)] });
    // A pending job has nothing to requeue.
    let Response::PerJob(r) = c.ok(requeue(Actor::User(name("alice")))) else {
        panic!()
    };
    assert!(matches!(r[0], Err(Rejection::WrongState { .. })), "{r:?}");
    c.start(jr(id), &["n001"]).unwrap();
    let first_epoch = c.job(id).alloc.as_ref().unwrap().epoch;
    // Another user may not; the owner may.
    let Response::PerJob(r) = c.ok(requeue(Actor::User(name("bob")))) else {
        panic!()
    };
    assert!(matches!(r[0], Err(Rejection::NotPermitted(_))), "{r:?}");
    let Response::PerJob(r) = c.ok(requeue(Actor::User(name("alice")))) else {
        panic!()
    };
    assert!(r[0].is_ok(), "{r:?}");
    assert_eq!(c.job(id).state, JobState::Completing);
    // The agent kills it and reports; it is pending again, counted, for a new epoch.
    c.end(id, EndCause::Cancelled, 0);
    let job = c.job(id);
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.requeue_count, 1);
    assert!(job.alloc.is_none() && job.end_time.is_none());
    c.start(jr(id), &["n001"]).unwrap();
    assert!(c.job(id).alloc.as_ref().unwrap().epoch > first_epoch);
}

#[test]
fn an_account_coordinator_may_act_on_that_accounts_jobs_and_no_others() {
    let mut c = cluster();
    c.set_account("other", docket_core::account::AssocLimits::default(), None);
    c.add_user("carol", "other");
    let alices = c.submit(vec![c.spec("alice")])[0];
    let hold = |user: &str, id| {
        by(
            Actor::User(name(user)),
            Command::HoldJobs { jobs: vec![jr(id)] },
        )
    };
    let Response::PerJob(r) = c.ok(hold("carol", alices)) else {
        panic!()
    };
    assert!(matches!(r[0], Err(Rejection::NotPermitted(_))), "{r:?}");
    // Carol coordinates proj: now she may act on alice's job there.
    c.ok(Command::SetCoordinators {
        account: name("proj"),
        users: vec![name("carol")],
    });
    let Response::PerJob(r) = c.ok(hold("carol", alices)) else {
        panic!()
    };
    assert!(r[0].is_ok(), "{r:?}");
    // Not suspend (administrators only), and not an unknown coordinator.
    let Response::PerJob(r) = c.ok(by(
        Actor::User(name("carol")),
        Command::SuspendJobs {
            jobs: vec![jr(alices)],
        },
    )) else {
        panic!()
    };
    assert!(r[0].is_err());
    assert!(matches!(
        c.apply(Command::SetCoordinators {
            account: name("proj"),
            users: vec![name("nobody")],
        }),
        Err(Rejection::Unknown { .. })
    ));
}

/// `actor`'s update of job `id`: its one answer.
fn update_as(
    c: &mut Cluster,
    id: docket_core::JobId,
    actor: Actor,
    update: docket_core::apply::update::JobUpdate,
) -> Result<(), Rejection> {
    let cmd = by(
        actor,
        Command::UpdateJobs {
            jobs: vec![jr(id)],
            update,
        },
    );
    let Response::PerJob(mut r) = c.ok(cmd) else {
        panic!("an update answers per job")
    };
    r.remove(0)
}

/// An update of the time limit alone (seconds; `None`: unlimited).
fn new_limit(secs: Option<u64>) -> docket_core::apply::update::JobUpdate {
    use docket_core::job::spec::TimeRequest;
    use docket_core::quantity::Seconds;
    docket_core::apply::update::JobUpdate {
        time_limit: Some(secs.map_or(TimeRequest::Unlimited, |s| TimeRequest::Limit(Seconds(s)))),
        ..Default::default()
    }
}

/// An update of the name alone.
fn new_name(name: &str) -> docket_core::apply::update::JobUpdate {
    docket_core::apply::update::JobUpdate {
        name: Some(name.into()),
        ..Default::default()
    }
}

#[test]
fn updates_follow_slurms_rules_for_owners_and_administrators() {
    use docket_core::apply::update::JobUpdate;
    use docket_core::job::spec::TimeRequest;
    use docket_core::quantity::Seconds;
    let mut c = cluster();
    let mut spec = c.spec("alice");
    spec.time = TimeRequest::Limit(Seconds(3600));
    let id = c.submit(vec![spec])[0];
    let alice = || Actor::User(name("alice"));
    // The owner lowers the limit, renames, raises nice.
    let r = update_as(
        &mut c,
        id,
        alice(),
        JobUpdate {
            time_limit: Some(TimeRequest::Limit(Seconds(1800))),
            name: Some("renamed".into()),
            nice: Some(10),
            comment: Some("first try".into()),
        },
    );
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(c.job(id).resolved.time_limit, Some(Seconds(1800)));
    assert_eq!(c.job(id).spec.name, "renamed");
    assert_eq!(c.job(id).spec.comment.as_deref(), Some("first try"));
    // Raising, unlimited and negative nice are for administrators.
    let negative_nice = JobUpdate {
        nice: Some(-5),
        ..Default::default()
    };
    for u in [new_limit(Some(7200)), new_limit(None), negative_nice] {
        let r = update_as(&mut c, id, alice(), u.clone());
        assert!(matches!(r, Err(Rejection::NotPermitted(_))), "{u:?}: {r:?}");
        let r = update_as(&mut c, id, Actor::Operator, u.clone());
        assert!(r.is_ok(), "{u:?}: {r:?}");
    }
    // Someone else's job: no.
    let r = update_as(&mut c, id, Actor::User(name("bob")), new_name("mine"));
    assert!(matches!(r, Err(Rejection::NotPermitted(_))), "{r:?}");
    // Running: only the time limit, and never below what it has run.
    update_as(&mut c, id, Actor::Operator, new_limit(Some(3600))).unwrap();
    c.start(jr(id), &["n001"]).unwrap();
    c.apply_after(600, Command::Tick).unwrap();
    let r = update_as(&mut c, id, alice(), new_name("late"));
    assert!(matches!(r, Err(Rejection::WrongState { .. })), "{r:?}");
    let r = update_as(&mut c, id, alice(), new_limit(Some(300)));
    assert!(matches!(r, Err(Rejection::Invalid { .. })), "{r:?}");
    let r = update_as(&mut c, id, alice(), new_limit(Some(1200)));
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(c.job(id).resolved.time_limit, Some(Seconds(1200)));
    // A running job's comment changes; a terminal escape in it does not; empty clears it.
    let comment = |text: &str| JobUpdate {
        comment: Some(text.into()),
        ..Default::default()
    };
    assert!(update_as(&mut c, id, alice(), comment("checkpointed at step 40")).is_ok());
    assert_eq!(
        c.job(id).spec.comment.as_deref(),
        Some("checkpointed at step 40")
    );
    let r = update_as(&mut c, id, alice(), comment("\u{1b}]0;owned\u{7}"));
    assert!(
        matches!(&r, Err(Rejection::Invalid { field, .. }) if field == "comment"),
        "{r:?}"
    );
    let r = update_as(&mut c, id, alice(), comment(&"x".repeat(1025)));
    assert!(
        matches!(&r, Err(Rejection::TooLarge { field, limit: 1024, .. }) if field == "comment length"),
        "{r:?}"
    );
    assert!(update_as(&mut c, id, alice(), comment("")).is_ok());
    assert_eq!(c.job(id).spec.comment, None);
}

#[test]
fn a_node_down_for_not_responding_returns_to_service_keeping_its_drain() {
    let mut c = cluster();
    let n = || name::<docket_core::NodeName>("n001");
    let back = |any_reason| Command::ReturnToService {
        node: n(),
        any_reason,
    };
    // Not down: nothing to return, nothing changed.
    let err = c.apply(back(false)).unwrap_err();
    assert!(err.to_string().contains("node n001"), "{err}");
    assert!(err.to_string().contains("not down"), "{err}");

    c.ok(Command::DrainNode {
        node: n(),
        reason: "firmware".into(),
    });
    c.ok(Command::DownNode {
        node: n(),
        reason: format!("{} for 30 s", docket_core::node::NOT_RESPONDING),
    });
    c.ok(back(false));
    let node = &c.state.nodes[&n()];
    assert_eq!(node.down, None);
    assert_eq!(node.drain.as_deref(), Some("firmware"), "the drain stays");

    // A down for another reason waits for an administrator, unless any reason returns.
    c.ok(Command::DownNode {
        node: n(),
        reason: "power".into(),
    });
    let err = c.apply(back(false)).unwrap_err();
    assert!(err.to_string().contains("\"power\""), "{err}");
    assert_eq!(c.state.nodes[&n()].down.as_deref(), Some("power"));
    c.ok(back(true));
    assert_eq!(c.state.nodes[&n()].down, None);

    // An unknown node is named.
    let err = c
        .apply(Command::ReturnToService {
            node: name("n999"),
            any_reason: true,
        })
        .unwrap_err();
    assert!(err.to_string().contains("n999"), "{err}");
}

#[test]
fn a_returned_node_takes_jobs_again() {
    let mut c = Cluster::new(SchedConfig::default(), 1);
    let id = c.submit(vec![c.spec("alice")])[0];
    c.ok(Command::DownNode {
        node: name("n001"),
        reason: format!("{} for 30 s", docket_core::node::NOT_RESPONDING),
    });
    assert!(
        c.start(jr(id), &["n001"]).is_err(),
        "a down node takes nothing"
    );
    c.ok(Command::ReturnToService {
        node: name("n001"),
        any_reason: false,
    });
    c.start(jr(id), &["n001"]).unwrap();
    assert_eq!(c.job(id).state, JobState::Running);
}

/// A snapshot's copy of the state (taken under the machine's lock, encoded after it) encodes
/// to the bytes the state had when it was taken, whatever is applied meanwhile; the state goes
/// on changing on its own, and the copy's bytes restore to a whole state.
#[test]
fn a_snapshot_copy_encodes_the_state_as_it_was_when_taken() {
    let mut c = Cluster::new(SchedConfig::default(), 2);
    let ids = c.submit(vec![c.spec("alice"); 5]);
    c.start(jr(ids[0]), &["n001"]).unwrap();
    let before = c.snapshot();
    let copy = c.state.snapshot_copy();
    assert_eq!(copy.to_snapshot().unwrap(), before);

    // After the copy: a job ends, another starts, more are submitted.
    c.end(ids[0], EndCause::Exited, 0);
    c.start(jr(ids[1]), &["n002"]).unwrap();
    let spec = c.spec("bob");
    c.submit(vec![spec; 2]);
    let after = c.snapshot();
    assert_ne!(after, before);
    assert_eq!(
        copy.to_snapshot().unwrap(),
        before,
        "the copy changed with the state"
    );
    assert_eq!(c.state.snapshot_copy().to_snapshot().unwrap(), after);
    assert!(c.job(ids[0]).end_time.is_some());
    assert!(copy.jobs[&ids[0]].end_time.is_none());

    let restored = docket_core::State::from_snapshot(&before).unwrap();
    assert_eq!(restored.to_snapshot().unwrap(), before);
}
