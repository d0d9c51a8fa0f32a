//! The main and direct passes: placement, the order they follow, the limits they keep, and
//! that apply accepts what they plan (and refuses it once stale).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Cluster, jr, name};
use docket_core::config::SchedConfig;
use docket_core::job::{ArraySpec, JobRef, JobState};
use docket_core::partition::Partition;
use docket_core::plan::{JobCount, Plan, Unlimited};
use docket_core::qos::Qos;
use docket_core::{Command, JobId, Response};

fn cluster(nodes: u32) -> Cluster {
    Cluster::new(SchedConfig::default(), nodes)
}

/// Applies a plan's starts and returns what apply answered.
fn apply_plan(c: &mut Cluster, plan: &Plan) -> Vec<Result<JobId, docket_core::Rejection>> {
    match c.ok(Command::StartJobs(plan.starts.clone())) {
        Response::Started(r) => r,
        other => panic!("unexpected {other:?}"),
    }
}

fn started(plan: &Plan) -> Vec<(JobRef, Vec<String>)> {
    plan.starts
        .iter()
        .map(|d| (d.job, d.nodes.iter().map(|n| n.to_string()).collect()))
        .collect()
}

/// Adds partition `other` over `work`'s nodes.
fn add_other_partition(c: &mut Cluster) {
    let mut other = Partition::new(
        name("other"),
        c.state.partitions[&name("work")].nodes.clone(),
    );
    other.def_mem_per_cpu = Some(docket_core::quantity::MiB::gib(1));
    c.ok(Command::UpsertPartition(Box::new(other)));
}

fn spec_cpus(c: &Cluster, user: &str, ntasks: u32) -> docket_core::job::JobSpec {
    let mut s = c.spec(user);
    s.ntasks = ntasks;
    s
}

#[test]
fn best_fit_fills_the_fullest_node_that_fits() {
    let mut c = cluster(3);
    let busy = c.submit(vec![spec_cpus(&c, "alice", 12)])[0];
    c.start(jr(busy), &["n002"]).unwrap();
    let j = c.submit(vec![spec_cpus(&c, "bob", 4)])[0];
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert_eq!(started(&plan), vec![(jr(j), vec!["n002".to_string()])]);
    // A 5-cpu job no longer fits there: it takes the first empty node.
    let k = c.submit(vec![spec_cpus(&c, "bob", 5)])[0];
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert_eq!(
        started(&plan),
        vec![
            (jr(j), vec!["n002".to_string()]),
            (jr(k), vec!["n001".to_string()])
        ]
    );
    assert!(apply_plan(&mut c, &plan).iter().all(Result::is_ok));
    assert_eq!(c.job(k).state, JobState::Running);
}

#[test]
fn multi_node_and_exclusive_jobs_get_whole_shares() {
    let mut c = cluster(3);
    let small = c.submit(vec![spec_cpus(&c, "alice", 1)])[0];
    c.start(jr(small), &["n001"]).unwrap();
    let mut wide = spec_cpus(&c, "bob", 20);
    wide.nodes = 2;
    let mut excl = spec_cpus(&c, "bob", 1);
    excl.exclusive = true;
    let ids = c.submit(vec![wide, excl]);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    // 20 tasks on 2 nodes: 10 + 10; best fit puts the first share on the busy n001.
    assert_eq!(
        started(&plan)[0],
        (jr(ids[0]), vec!["n001".to_string(), "n002".to_string()])
    );
    // The exclusive job needs an empty node: only n003 is.
    assert_eq!(started(&plan)[1], (jr(ids[1]), vec!["n003".to_string()]));
    let r = apply_plan(&mut c, &plan);
    assert!(r.iter().all(Result::is_ok), "{r:?}");
    assert_eq!(c.state.nodes[&name("n003")].used_cpus(), 16);
}

#[test]
fn a_partition_stops_at_its_first_job_that_cannot_start() {
    let mut c = cluster(2);
    // A second partition on the same nodes, so overlapping partitions are exercised.
    add_other_partition(&mut c);
    let busy = c.submit(vec![spec_cpus(&c, "alice", 8)])[0];
    c.start(jr(busy), &["n001"]).unwrap();
    let mut big = spec_cpus(&c, "alice", 32);
    big.nodes = 2; // needs both nodes whole: cannot start
    let small = spec_cpus(&c, "bob", 1);
    let mut elsewhere = spec_cpus(&c, "bob", 1);
    elsewhere.partition = Some(name("other"));
    let ids = c.submit(vec![big]);
    let more = c.submit(vec![small, elsewhere]);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    // The small job in `work` may not overtake the big one; the one in `other` starts.
    assert_eq!(started(&plan).len(), 1, "{plan:?}");
    assert_eq!(plan.starts[0].job, jr(more[1]));
    assert_eq!(c.job(ids[0]).state, JobState::Pending);
    // squeue's reasons: the big job waits for Resources, the small one behind it for Priority.
    use docket_core::job::Reason;
    assert_eq!(
        plan.reasons,
        vec![(ids[0], Reason::Resources), (more[0], Reason::Priority)]
    );
    c.ok(Command::SetSchedulerReasons(plan.reasons.clone()));
    assert_eq!(c.job(ids[0]).reason, Reason::Resources);
    assert_eq!(c.job(more[0]).reason, Reason::Priority);
    assert!(
        c.job(more[0]).eligible_since.is_some(),
        "age keeps accruing"
    );
    // A policy reason is never overwritten, and no policy reason can be set this way.
    let err = c
        .apply(Command::SetSchedulerReasons(vec![(
            more[0],
            Reason::JobHeldAdmin,
        )]))
        .unwrap_err();
    assert!(err.to_string().contains("not a scheduler reason"), "{err}");
}

#[test]
fn partition_job_depth_bounds_the_jobs_considered_per_partition() {
    let mut config = SchedConfig::default();
    config.sched.partition_job_depth = 2;
    let mut c = Cluster::new(config, 2);
    c.submit(vec![spec_cpus(&c, "alice", 1); 5]);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert_eq!(plan.starts.len(), 2);
    assert_eq!(plan.considered, 2);
}

#[test]
fn the_direct_pass_considers_default_queue_depth_jobs() {
    let mut config = SchedConfig::default();
    config.sched.default_queue_depth = 3;
    let mut c = Cluster::new(config, 2);
    c.submit(vec![spec_cpus(&c, "alice", 1); 5]);
    let plan = c.state.direct_pass(c.now, &mut Unlimited);
    assert_eq!(plan.starts.len(), 3);
    assert!(plan.continuation.is_none());
}

#[test]
fn a_stopped_pass_resumes_where_it_stopped() {
    let mut c = cluster(2);
    let ids = c.submit(vec![spec_cpus(&c, "alice", 1); 4]);
    let first = c.state.main_pass(c.now, &mut JobCount::new(1), None);
    assert_eq!(
        started(&first),
        vec![(jr(ids[0]), vec!["n001".to_string()])]
    );
    let cont = first.continuation.clone().expect("stopped early");
    assert_eq!(cont.remaining(), 3);
    // The first decision is committed meanwhile; the pass resumes with the next job.
    assert!(apply_plan(&mut c, &first).iter().all(Result::is_ok));
    let rest = c.state.main_pass(c.now, &mut Unlimited, Some(cont));
    let jobs: Vec<JobRef> = rest.starts.iter().map(|d| d.job).collect();
    assert_eq!(jobs, vec![jr(ids[1]), jr(ids[2]), jr(ids[3])]);
    assert!(rest.continuation.is_none());
    // Every job landed on n001 (best fit) until it filled.
    assert!(apply_plan(&mut c, &rest).iter().all(Result::is_ok));
    assert_eq!(c.state.nodes[&name("n001")].used_cpus(), 4);
}

#[test]
fn limits_count_the_starts_of_the_same_pass() {
    let mut c = cluster(2);
    let mut q = Qos::new(name("normal"));
    q.limits.max_jobs_per_user = Some(1);
    c.ok(Command::UpsertQos(Box::new(q)));
    let alice = c.submit(vec![spec_cpus(&c, "alice", 1); 2]);
    let bob = c.submit(vec![spec_cpus(&c, "bob", 1)]);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    let jobs: Vec<JobRef> = plan.starts.iter().map(|d| d.job).collect();
    // Alice's second job is held by the QOS limit, which does not stop the partition.
    assert_eq!(jobs, vec![jr(alice[0]), jr(bob[0])]);
    assert!(apply_plan(&mut c, &plan).iter().all(Result::is_ok));
}

#[test]
fn array_tasks_start_up_to_the_throttle() {
    let mut c = cluster(2);
    let mut s = spec_cpus(&c, "alice", 1);
    let mut a = ArraySpec::parse("0-9", 1001).unwrap();
    a.throttle = Some(3);
    s.array = Some(a);
    let id = c.submit(vec![s])[0];
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    let tasks: Vec<Option<u32>> = plan.starts.iter().map(|d| d.job.task).collect();
    assert_eq!(tasks, vec![Some(0), Some(1), Some(2)]);
    assert!(plan.starts.iter().all(|d| d.job.job == id));
    let r = apply_plan(&mut c, &plan);
    assert!(r.iter().all(Result::is_ok), "{r:?}");
    // Nothing more until a task ends.
    assert!(
        c.state
            .main_pass(c.now, &mut Unlimited, None)
            .starts
            .is_empty()
    );
}

#[test]
fn a_higher_tier_partition_gets_the_last_free_cpus() {
    let mut c = cluster(1);
    let mut test = Partition::new(
        name("test"),
        c.state.partitions[&name("work")].nodes.clone(),
    );
    test.priority_tier = 100;
    test.def_mem_per_cpu = Some(docket_core::quantity::MiB::gib(1));
    c.ok(Command::UpsertPartition(Box::new(test)));
    let normal = c.submit(vec![spec_cpus(&c, "alice", 16)])[0];
    let mut urgent = spec_cpus(&c, "bob", 16);
    urgent.partition = Some(name("test"));
    let urgent = c.submit(vec![urgent])[0];
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert_eq!(plan.starts.len(), 1);
    assert_eq!(plan.starts[0].job, jr(urgent));
    assert_eq!(c.job(normal).state, JobState::Pending);
}

#[test]
fn a_stale_plan_is_refused_whole_job_by_job() {
    let mut c = cluster(1);
    let ids = c.submit(vec![spec_cpus(&c, "alice", 16), spec_cpus(&c, "alice", 16)]);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert_eq!(plan.starts.len(), 1);
    // Meanwhile another decision gave the node to the second job.
    c.start(jr(ids[1]), &["n001"]).unwrap();
    let before = c.snapshot();
    let r = apply_plan(&mut c, &plan);
    assert!(r[0].is_err(), "{r:?}");
    let mut after = c.state.clone();
    after.applied = Default::default();
    let mut b = docket_core::State::from_snapshot(&before).unwrap();
    b.applied = Default::default();
    assert_eq!(after.to_snapshot().unwrap(), b.to_snapshot().unwrap());
}

/// Backfill reports the jobs a lower one started ahead of; apply counts them (Maui's
/// bypass count, which priority and the suspension score reward).
#[test]
fn backfill_reports_bypassed_jobs_and_apply_counts_them() {
    use docket_core::job::TimeRequest;
    use docket_core::quantity::Seconds;
    let mut c = cluster(1);
    let running = c.submit(vec![spec_cpus(&c, "alice", 8)])[0];
    c.start(jr(running), &["n001"]).unwrap();
    let mut big = spec_cpus(&c, "alice", 16);
    big.time = TimeRequest::Limit(Seconds::hours(1));
    let big = c.submit(vec![big])[0];
    let mut short = spec_cpus(&c, "bob", 8);
    short.time = TimeRequest::Limit(Seconds(600));
    let short = c.submit(vec![short])[0];
    let plan = c.state.backfill_pass(c.now, &mut Unlimited, None);
    let started: Vec<JobRef> = plan.starts.iter().map(|d| d.job).collect();
    assert_eq!(started, vec![jr(short)]);
    assert_eq!(plan.bypassed, vec![big]);
    c.ok(Command::NoteBypassed(plan.bypassed.clone()));
    assert_eq!(c.job(big).bypass_count, 1);
    // Counting a job that no longer waits does nothing.
    c.ok(Command::NoteBypassed(vec![running]));
    assert_eq!(c.job(running).bypass_count, 0);
}

#[test]
fn a_direct_pass_on_a_full_machine_plans_nothing() {
    use docket_core::job::Reason;
    let mut c = cluster(3);
    c.ok(Command::DrainNode {
        node: name("n003"),
        reason: "maintenance".into(),
    });
    let full = c.submit(vec![spec_cpus(&c, "alice", 16); 2]);
    c.start(jr(full[0]), &["n001"]).unwrap();
    c.start(jr(full[1]), &["n002"]).unwrap();
    let waiting = c.submit(vec![spec_cpus(&c, "bob", 1); 3]);
    // Every cpu of the nodes that take jobs is held; the drained node's are not offered.
    assert!(!c.state.may_start_anything());
    let direct = c.state.direct_pass(c.now, &mut Unlimited);
    assert!(
        direct.starts.is_empty() && direct.reasons.is_empty() && direct.considered == 0,
        "{direct:?}"
    );
    // The timed main pass still looks, and says why the head waits.
    let main = c.state.main_pass(c.now, &mut Unlimited, None);
    assert!(main.starts.is_empty());
    assert_eq!(main.reasons, vec![(waiting[0], Reason::Resources)]);
    // A configuration that preempts could make room: the direct pass runs.
    let mut preempting = c.state.partitions[&name("work")].clone();
    preempting.preempt_mode = docket_core::partition::PreemptMode::Requeue;
    c.ok(Command::UpsertPartition(Box::new(preempting.clone())));
    assert!(c.state.may_start_anything());
    preempting.preempt_mode = docket_core::partition::PreemptMode::Off;
    c.ok(Command::UpsertPartition(Box::new(preempting)));
    assert!(!c.state.may_start_anything());
    // The node back in service: the direct pass starts the head there.
    c.ok(Command::ResumeNode(name("n003")));
    assert!(c.state.may_start_anything());
    let direct = c.state.direct_pass(c.now, &mut Unlimited);
    assert_eq!(
        started(&direct),
        vec![
            (jr(waiting[0]), vec!["n003".to_string()]),
            (jr(waiting[1]), vec!["n003".to_string()]),
            (jr(waiting[2]), vec!["n003".to_string()])
        ]
    );
}

/// Once nothing can start now and every partition has its reservation, the rest of the
/// queue can decide nothing: backfill stops walking there. With a cpu free, with a
/// partition still to reserve for, or with preemption configured, it walks on.
#[test]
fn backfill_stops_walking_when_nothing_can_start_or_be_reserved() {
    use docket_core::job::Reason;
    use docket_core::partition::PreemptMode;
    let mut c = cluster(2);
    add_other_partition(&mut c);
    let full = c.submit(vec![spec_cpus(&c, "alice", 16), spec_cpus(&c, "alice", 15)]);
    c.start(jr(full[0]), &["n001"]).unwrap();
    c.start(jr(full[1]), &["n002"]).unwrap();
    let waiting = c.submit(vec![spec_cpus(&c, "bob", 2); 4]);
    let mut last = spec_cpus(&c, "bob", 2);
    last.partition = Some(name("other"));
    let last = c.submit(vec![last])[0];
    // One cpu free on n002: every job is tried; each partition's first gets a reservation.
    let plan = c.state.backfill_pass(c.now, &mut Unlimited, None);
    assert!(plan.starts.is_empty());
    assert_eq!(plan.considered, 5);
    let reserved: Vec<JobRef> = plan.reservations.iter().map(|r| r.0).collect();
    assert_eq!(reserved, vec![jr(waiting[0]), jr(last)]);
    // A 1-cpu job takes that cpu: the machine is full. `work`'s head is reserved, then the
    // walk goes on only as far as `other`'s job, which still needs its reservation.
    let filler = c.submit(vec![spec_cpus(&c, "alice", 1)])[0];
    c.start(jr(filler), &["n002"]).unwrap();
    let plan = c.state.backfill_pass(c.now, &mut Unlimited, None);
    assert_eq!(plan.considered, 5);
    let reserved: Vec<JobRef> = plan.reservations.iter().map(|r| r.0).collect();
    assert_eq!(reserved, vec![jr(waiting[0]), jr(last)]);
    // With `other` gone, every partition has its reservation once `work`'s head has one:
    // the walk stops there.
    c.ok(Command::CancelJobs {
        jobs: vec![jr(last)],
    });
    c.ok(Command::RemovePartition(name("other")));
    let plan = c.state.backfill_pass(c.now, &mut Unlimited, None);
    assert_eq!(plan.considered, 1, "{plan:?}");
    assert_eq!(plan.reservations.len(), 1);
    assert_eq!(plan.reservations[0].0, jr(waiting[0]));
    assert_eq!(plan.reasons.first(), Some(&(waiting[0], Reason::Resources)));
    // A budget that would have stopped the walk in the tail: the pass ends instead, with
    // nothing left to resume.
    let plan = c.state.backfill_pass(c.now, &mut JobCount::new(2), None);
    assert_eq!(plan.considered, 1);
    assert!(plan.continuation.is_none(), "{plan:?}");
    // A configuration that preempts could make room for any of them: every job is tried.
    let mut work = c.state.partitions[&name("work")].clone();
    work.preempt_mode = PreemptMode::Requeue;
    c.ok(Command::UpsertPartition(Box::new(work)));
    let plan = c.state.backfill_pass(c.now, &mut Unlimited, None);
    assert_eq!(plan.considered, 4);
}

/// Under FCFS the state keeps the queue in order and a fresh backfill pass walks that order
/// itself instead of a copy; a pass its budget stops takes the rest with it, and resumed it
/// reserves exactly what one pass without a budget reserves.
#[test]
fn a_stopped_backfill_pass_over_the_kept_queue_resumes_with_the_rest() {
    let mut config = SchedConfig::default();
    config.priority.formula = docket_core::priority::PriorityFormula::Fcfs;
    config.sched.backfill = docket_core::config::BackfillMode::Conservative;
    let mut c = Cluster::new(config, 2);
    let mut both = spec_cpus(&c, "alice", 32);
    both.nodes = 2;
    let big = c.submit(vec![both])[0];
    c.start(jr(big), &["n001", "n002"]).unwrap();
    let waiting = c.submit(vec![spec_cpus(&c, "bob", 4); 6]);
    let whole = c.state.backfill_pass(c.now, &mut Unlimited, None);
    let reserved: Vec<JobRef> = whole.reservations.iter().map(|r| r.0).collect();
    assert_eq!(
        reserved,
        waiting.iter().map(|&id| jr(id)).collect::<Vec<_>>()
    );

    let first = c.state.backfill_pass(c.now, &mut JobCount::new(2), None);
    let cont = first.continuation.clone().expect("stopped after two jobs");
    assert_eq!(cont.remaining(), 4);
    assert_eq!(first.reservations.len(), 2);
    let rest = c.state.backfill_pass(c.now, &mut Unlimited, Some(cont));
    assert!(rest.continuation.is_none());
    assert_eq!(rest.reservations, whole.reservations);
}

/// The same queue planned with the state keeping its order (FCFS) and without (FCFS with a
/// starvation bound no job reaches, which orders the same but computes the order at every
/// pass): every plan the same, in queue order and shortest first, whole and stopped by a
/// budget at every depth and resumed.
#[test]
fn backfill_plans_the_same_whether_the_queue_is_kept_in_order_or_not() {
    use docket_core::config::{BackfillMode, BackfillOrder};
    use docket_core::quantity::Seconds;
    for order in [BackfillOrder::Queue, BackfillOrder::Shortest] {
        let plans: Vec<Vec<String>> = [None, Some(Seconds::hours(10_000))]
            .into_iter()
            .map(|starvation_wait| {
                let mut config = SchedConfig::default();
                config.priority.formula = docket_core::priority::PriorityFormula::Fcfs;
                config.sched.backfill = BackfillMode::Easy;
                config.sched.bf_order = order;
                config.sched.starvation_wait = starvation_wait;
                let mut c = Cluster::new(config, 2);
                // n001 keeps 4 cpus free for an hour, n002 is full for two.
                let running =
                    c.submit(vec![spec_cpus(&c, "alice", 12), spec_cpus(&c, "alice", 16)]);
                c.start(jr(running[0]), &["n001"]).unwrap();
                c.start(jr(running[1]), &["n002"]).unwrap();
                // The head waits for n001; short small jobs behind it backfill (and bypass
                // it), long ones and wide ones wait.
                let mut waiting = Vec::new();
                for (cpus, minutes) in [
                    (10, 60),
                    (2, 240),
                    (2, 30),
                    (8, 30),
                    (1, 20),
                    (1, 10),
                    (16, 5),
                    (1, 50),
                ] {
                    let mut s = spec_cpus(&c, "bob", cpus);
                    s.time = docket_core::job::TimeRequest::Limit(Seconds(minutes * 60));
                    waiting.push(s);
                }
                c.submit(waiting);
                assert_eq!(
                    c.state.consideration_order(c.now).len(),
                    8,
                    "every waiting job is idle"
                );
                let mut seen = Vec::new();
                for depth in [1, 2, 3, 5, 100] {
                    let mut plan = c
                        .state
                        .backfill_pass(c.now, &mut JobCount::new(depth), None);
                    seen.push(format!("{plan:?}"));
                    while let Some(cont) = plan.continuation.take() {
                        plan = c
                            .state
                            .backfill_pass(c.now, &mut JobCount::new(depth), Some(cont));
                        seen.push(format!("{plan:?}"));
                    }
                }
                seen
            })
            .collect();
        assert!(
            plans[0].len() > 5,
            "some passes stopped and resumed: {:?}",
            plans[0]
        );
        assert!(
            plans[0].iter().any(|p| p.contains("bypassed: [JobId(")),
            "{:?}",
            plans[0]
        );
        assert_eq!(plans[0], plans[1], "{order:?}");
    }
}
