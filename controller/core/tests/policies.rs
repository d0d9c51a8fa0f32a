//! Scheduling beyond EASY (issue: predicted runtimes and slowdown-aware ordering), on
//! hand-computed traces: backfilling shortest first, planning on runtime predictions and
//! re-planning when one proves too short, and the starvation bound under orders that favour
//! short jobs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Cluster, jr, swf_trace as trace};
use docket_core::apply::update::JobUpdate;
use docket_core::command::EndCause;
use docket_core::config::SchedConfig;
use docket_core::job::TimeRequest;
use docket_core::predict::RuntimePredictor;
use docket_core::quantity::{Seconds, TimeMs};
use docket_core::sim::Policy;
use docket_core::sim::swf::{SwfJob, Trace};
use docket_core::{Actor, Command};

fn job(id: u64, user: i64, submit: u64, procs: u64, runtime: u64, estimate: u64) -> SwfJob {
    SwfJob {
        id,
        submit,
        runtime: runtime.min(estimate),
        procs,
        estimate,
        user,
        group: 1,
        queue: -1,
        partition: -1,
    }
}

/// Each job's start, by SWF id, under the policy named `policy`.
fn starts(t: &Trace, policy: &str) -> Vec<(u64, u64)> {
    common::swf_starts(t, Policy::parse(policy).unwrap())
}

fn start_of(t: &Trace, policy: &str, id: u64) -> u64 {
    starts(t, policy)
        .into_iter()
        .find(|(i, _)| *i == id)
        .map(|(_, s)| s)
        .unwrap()
}

/// 4 processors. Job 1 holds 2 until 100; job 2 (the whole machine) is the head and is
/// reserved at 100. Jobs 3 (90 s) and 4 (10 s) arrive with it: EASY backfills in queue
/// order, so 3 takes the hole and 4 waits behind job 2; shortest first, 4 runs at once
/// and 3 (which would now end after 100) waits. Job 2 starts at 100 either way.
#[test]
fn sjbf_backfills_the_shortest_candidate_first() {
    let t = trace(
        4,
        vec![
            job(1, 1, 0, 2, 100, 100),
            job(2, 2, 1, 4, 50, 50),
            job(3, 3, 1, 2, 90, 90),
            job(4, 4, 1, 2, 10, 10),
        ],
    );
    assert_eq!(starts(&t, "easy"), vec![(1, 0), (2, 100), (3, 1), (4, 150)]);
    assert_eq!(
        starts(&t, "easy-sjbf"),
        vec![(1, 0), (2, 100), (3, 150), (4, 1)]
    );
}

/// 4 processors. User 1's two first jobs ran 10 s each (limits 1,000 s), so their third
/// (2 processors, runs 300 s, limit 1,000 s) is predicted to run 10 s. Job 5 needs the whole
/// machine and is reserved where job 3 is expected to end; job 6 (2 processors, 50 s)
/// arrives at 102.
///
/// EASY on limits reserves job 5 at 1,100, so job 6 backfills at 102. EASY++ reserves it
/// at 110 (the prediction), so job 6 waits; at 110 job 3 outlives its prediction, which
/// becomes 70 s (+1 minute): the reservation moves to 170 and job 6, ending by 160, is
/// backfilled then. Job 3 outlives 70 s too (+5 minutes: 370 s); it ends at 400 on its own
/// (the limit, not the prediction, ends a job) and job 5 starts then.
#[test]
fn easy_plus_plus_plans_on_predictions_and_replans_when_one_is_too_short() {
    let t = trace(
        4,
        vec![
            job(1, 1, 0, 1, 10, 1000),
            job(2, 1, 0, 1, 10, 1000),
            job(3, 1, 100, 2, 300, 1000),
            job(5, 2, 101, 4, 50, 50),
            job(6, 3, 102, 2, 50, 50),
        ],
    );
    let easy = starts(&t, "easy");
    assert_eq!(start_of(&t, "easy", 6), 102, "{easy:?}");
    assert_eq!(start_of(&t, "easy", 5), 400, "{easy:?}");
    let pp = starts(&t, "easy++");
    assert_eq!(start_of(&t, "easy++", 6), 110, "{pp:?}");
    assert_eq!(start_of(&t, "easy++", 5), 400, "{pp:?}");
    // The prediction never ends a job: job 3 ran its full 300 s under both.
    assert_eq!(start_of(&t, "easy++", 3), 100);
}

/// Without history, a prediction is the limit: EASY++ plans exactly as EASY-SJBF.
#[test]
fn without_history_easy_plus_plus_is_easy_sjbf() {
    let t = trace(
        8,
        (0..40)
            .map(|i| {
                job(
                    i,
                    i as i64,
                    i * 7,
                    1 + (i * 5) % 8,
                    10 + (i * 37) % 200,
                    250,
                )
            })
            .collect(),
    );
    assert_eq!(starts(&t, "easy++"), starts(&t, "easy-sjbf"));
}

/// The adversary of shortest-first orders: a job needing the whole machine arrives while a
/// stream of short one-processor jobs keeps every processor busy for six hours (four 60 s
/// jobs every minute). Shortest first without a bound, the wide job waits until the stream
/// ends; with `+starve=600` it goes ahead of every other job once eligible for 600 s and
/// gets EASY's reservation, so it waits at most 600 s plus the longest run it must wait out
/// (60 s). (LXF and F1 let it through on their own: its expansion factor, and F1's
/// submit-time term, favour it over later arrivals.)
#[test]
fn the_starvation_bound_holds_on_an_adversarial_trace() {
    let mut jobs = vec![job(0, 0, 10, 4, 100, 100)];
    for minute in 0..360u64 {
        for k in 0..4 {
            jobs.push(job(
                1 + minute * 4 + k,
                1 + k as i64,
                minute * 60,
                1,
                60,
                60,
            ));
        }
    }
    jobs.sort_by_key(|j| j.submit);
    let t = trace(4, jobs);
    let wait = |policy: &str| start_of(&t, policy, 0) - 10;
    assert!(
        wait("sjf") > 20_000,
        "sjf: the wide job waited only {} s",
        wait("sjf")
    );
    for bounded in ["sjf+starve=600", "sjf+predict+starve=600"] {
        assert!(
            wait(bounded) <= 600 + 60,
            "{bounded}: the wide job waited {} s",
            wait(bounded)
        );
    }
    for fair in ["easy", "lxf", "f1"] {
        assert!(wait(fair) <= 60, "{fair}: {} s", wait(fair));
    }
}

#[test]
fn policy_names_read_back() {
    for name in [
        "fcfs",
        "easy",
        "conservative",
        "easy-sjbf",
        "easy++",
        "sjf",
        "lxf",
        "f1",
        "sjf+predict",
        "lxf+sjbf+predict+starve=86400",
        "easy+predict",
        "conservative+predict",
        "easy+++starve=600",
    ] {
        assert_eq!(Policy::parse(name).unwrap().name(), name);
    }
    assert_eq!(
        Policy::parse("easy+sjbf+predict").unwrap(),
        Policy::parse("easy++").unwrap()
    );
    for bad in [
        "",
        "easy+",
        "easy+starve=0",
        "easy+starve=x",
        "fcfs+sjbf",
        "conservative+sjbf",
        "best",
    ] {
        assert!(Policy::parse(bad).is_err(), "{bad:?} was accepted");
    }
}

/// In the state machine: a prediction is the average of the user's last two runs that
/// ended on their own (a cancelled run says nothing, another user's neither), made at
/// submission; a limit lowered later caps it.
#[test]
fn predictions_come_from_the_users_own_finished_runs() {
    let mut config = SchedConfig::default();
    config.sched.runtime_predictor = RuntimePredictor::RecentAverage;
    let mut c = Cluster::new(config, 1);
    let run = |c: &mut Cluster, secs: u64, cause: EndCause| {
        let id = c.submit(vec![c.spec("alice")])[0];
        c.start(jr(id), &["n001"]).unwrap();
        c.now = c.now.plus(Seconds(secs));
        c.end(id, cause, 0);
        id
    };
    let first = run(&mut c, 100, EndCause::Exited);
    assert_eq!(c.job(first).predicted, None, "no history yet");
    run(&mut c, 5000, EndCause::Cancelled);
    let next = c.submit(vec![c.spec("alice")])[0];
    assert_eq!(c.job(next).predicted, Some(Seconds(100)));
    run(&mut c, 301, EndCause::Timeout);
    let pending = c.submit(vec![c.spec("alice")])[0];
    assert_eq!(c.job(pending).predicted, Some(Seconds(201)));
    assert_eq!(
        c.job(pending).expected_runtime(TimeMs(0)),
        Some(Seconds(201))
    );
    let bobs = c.submit(vec![c.spec("bob")])[0];
    assert_eq!(
        c.job(bobs).predicted,
        None,
        "alice's runs say nothing of bob's"
    );
    c.ok(common::by(
        Actor::User("alice".parse().unwrap()),
        Command::UpdateJobs {
            jobs: vec![jr(pending)],
            update: JobUpdate {
                time_limit: Some(TimeRequest::Limit(Seconds(120))),
                ..Default::default()
            },
        },
    ));
    assert_eq!(
        c.job(pending).expected_runtime(TimeMs(0)),
        Some(Seconds(120)),
        "the lowered limit caps the prediction"
    );
    // Time-limit planning (the default) predicts nothing.
    let mut plain = Cluster::new(SchedConfig::default(), 1);
    let id = run(&mut plain, 100, EndCause::Exited);
    let after = plain.submit(vec![plain.spec("alice")])[0];
    assert_eq!(
        (plain.job(id).predicted, plain.job(after).predicted),
        (None, None)
    );
}

/// Shortest-first backfill in the live planner: the caps count jobs in the queue's order
/// (Slurm's `bf_max_job_test`), only the jobs within them are reordered, and a job counts
/// as bypassed when one behind it in the queue's order starts while it cannot. One node of
/// 16 cpus: `run` holds 8 for an hour; `head` needs 16; then 8-cpu jobs of 50, 40 and 1
/// minutes. With every job tested, the 1-minute job starts; with three tested (head, 50,
/// 40), the 40-minute one does. The jobs ahead of the one that started in the queue's order
/// were bypassed, though the 40-minute one was tried after the 1-minute one.
#[test]
fn shortest_first_backfill_reorders_only_the_jobs_within_the_caps() {
    use docket_core::config::{BackfillMode, BackfillOrder};
    use docket_core::plan::Unlimited;
    for (cap, expected, bypassed) in [(0u32, "one", 3), (3, "forty", 2)] {
        let mut config = SchedConfig::default();
        config.sched.backfill = BackfillMode::Easy;
        config.sched.bf_order = BackfillOrder::Shortest;
        config.sched.bf_max_job_test = cap;
        config.sched.bf_resolution = Seconds(1);
        let mut c = Cluster::new(config, 1);
        let spec = |c: &Cluster, name: &str, cpus: u32, minutes: u64| {
            let mut s = c.spec("alice");
            s.name = name.into();
            s.cpus_per_task = cpus;
            s.time = TimeRequest::Limit(Seconds::minutes(minutes));
            s
        };
        let run = c.submit(vec![spec(&c, "run", 8, 60)])[0];
        c.start(jr(run), &["n001"]).unwrap();
        let ids = c.submit(vec![
            spec(&c, "head", 16, 60),
            spec(&c, "fifty", 8, 50),
            spec(&c, "forty", 8, 40),
            spec(&c, "one", 8, 1),
        ]);
        let plan = c.state.backfill_pass(c.now, &mut Unlimited, None);
        let started: Vec<&str> = plan
            .starts
            .iter()
            .map(|d| c.job(d.job.job).spec.name.as_str())
            .collect();
        assert_eq!(started, [expected], "bf_max_job_test {cap}");
        assert_eq!(plan.bypassed, ids[..bypassed], "bf_max_job_test {cap}");
        assert_eq!(plan.reservations.len(), 1, "the head's");
    }
}

/// A per-user association limit that `UpsertUser` brings to a site with no limits anywhere
/// holds at once: the rules cache, which lets checks skip the association lookup where no
/// such limit exists, learns of it (before, it did only at the next configuration change,
/// so a live replica started both jobs while one restored from a snapshot would hold one;
/// the harness's invariant check, that the cache covers every rule, failed at once).
#[test]
fn an_association_limit_from_upsert_user_holds_at_once() {
    use docket_core::account::{AssocLimits, User, UserAssoc};
    use docket_core::job::Reason;
    use docket_core::plan::Unlimited;
    let mut c = Cluster::new(SchedConfig::default(), 2);
    c.ok(Command::UpsertUser {
        user: User {
            name: common::name("alice"),
            default_account: common::name("proj"),
            admin: false,
        },
        assocs: vec![(
            common::name("proj"),
            UserAssoc {
                shares: 1,
                priority: 0,
                limits: AssocLimits {
                    max_jobs: Some(1),
                    ..AssocLimits::default()
                },
            },
        )],
    });
    let ids = c.submit(vec![c.spec("alice"), c.spec("alice")]);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    let started: Vec<_> = plan.starts.iter().map(|d| d.job.job).collect();
    assert_eq!(started, ids[..1].to_vec());
    c.ok(Command::StartJobs(plan.starts));
    c.ok(Command::SetSchedulerReasons(plan.reasons));
    assert_eq!(c.job(ids[1]).reason, Reason::AssocMaxJobsLimit);
}
