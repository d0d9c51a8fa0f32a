//! Job steps in replicated state: created by the job's owner inside its allocation, holding
//! their cpus against other steps, ended node by node by the agents of their own nodes, and
//! ended with their job.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Cluster, by, jr, name};
use docket_core::command::{EndCause, StepEndReport};
use docket_core::config::SchedConfig;
use docket_core::job::step::IO_KEY_BYTES;
use docket_core::job::{ExitStatus, JobState, StepId, StepRef, StepSpec};
use docket_core::{Actor, Command, JobId, Rejection, Response};

/// Alice's job of 2 nodes x 4 tasks, running on n001 and n002.
fn running_job() -> (Cluster, JobId) {
    let mut c = Cluster::new(SchedConfig::default(), 3);
    let mut spec = c.spec("alice");
    spec.nodes = 2;
    spec.ntasks = 8;
    spec.ntasks_per_node = Some(4);
    let id = c.submit(vec![spec])[0];
    c.start(jr(id), &["n001", "n002"]).unwrap();
    (c, id)
}

fn step(ntasks: Option<u32>) -> StepSpec {
    StepSpec {
        name: "hostname".into(),
        ntasks,
        nodes: None,
        ntasks_per_node: None,
        cpus_per_task: 1,
        nodelist: Vec::new(),
        overlap: false,
        time_limit: None,
        io_key: vec![7; IO_KEY_BYTES],
    }
}

fn create(c: &mut Cluster, actor: Actor, job: JobId, spec: StepSpec) -> Result<StepId, Rejection> {
    match c.apply(by(actor, Command::CreateStep { job, spec }))? {
        Response::StepCreated { step, .. } => Ok(step),
        other => panic!("unexpected {other:?}"),
    }
}

fn alice() -> Actor {
    Actor::User(name("alice"))
}

fn report(c: &Cluster, step: StepRef, node: &str, cause: EndCause, code: i32) -> StepEndReport {
    StepEndReport {
        step,
        epoch: c.job(step.job).alloc.as_ref().unwrap().epoch,
        node: name(node),
        cause,
        exit: ExitStatus {
            code,
            signal: 0,
            cpu_time_ms: 100,
            max_rss_mib: 10,
        },
    }
}

fn ended(r: Response) -> (u32, u32, u32) {
    match r {
        Response::Ended {
            applied,
            stale,
            refused,
        } => (applied, stale, refused),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn steps_are_numbered_in_order_and_laid_out_over_the_allocation() {
    let (mut c, id) = running_job();
    let s0 = create(&mut c, alice(), id, step(Some(6))).unwrap();
    assert_eq!(s0, StepId(0));
    let layout: Vec<(String, u32, u32)> = c.job(id).steps.list[&s0]
        .layout
        .iter()
        .map(|s| (s.node.to_string(), s.tasks, s.first_task))
        .collect();
    assert_eq!(
        layout,
        [("n001".to_string(), 4, 0), ("n002".to_string(), 2, 4)]
    );
    // Two cpus are left, on n002: a 2-task step fits, a third waits.
    let s1 = create(&mut c, alice(), id, step(Some(2))).unwrap();
    assert_eq!(s1, StepId(1));
    let busy = create(&mut c, alice(), id, step(Some(1))).unwrap_err();
    assert!(matches!(busy, Rejection::Busy { .. }), "{busy}");
    assert!(busy.to_string().contains("temporarily disabled"), "{busy}");
    // --overlap shares the cpus.
    let mut overlap = step(Some(8));
    overlap.overlap = true;
    assert_eq!(create(&mut c, alice(), id, overlap).unwrap(), StepId(2));
    // A refused step takes no number.
    assert_eq!(c.job(id).steps.next, 3);
}

#[test]
fn a_step_ends_when_every_node_reported_and_frees_its_cpus() {
    let (mut c, id) = running_job();
    let s = StepRef {
        job: id,
        step: create(&mut c, alice(), id, step(Some(8))).unwrap(),
    };
    assert!(matches!(
        create(&mut c, alice(), id, step(Some(1))),
        Err(Rejection::Busy { .. })
    ));
    let r = report(&c, s, "n001", EndCause::Exited, 0);
    assert_eq!(
        ended(c.ok(by(
            Actor::Node(name("n001")),
            Command::EndSteps(vec![r.clone()])
        ))),
        (1, 0, 0)
    );
    assert_eq!(c.job(id).steps.list[&s.step].state, JobState::Running);
    // The same report again is stale; n001 cannot speak for n002.
    assert_eq!(
        ended(c.ok(by(Actor::Node(name("n001")), Command::EndSteps(vec![r])))),
        (0, 1, 0)
    );
    let r2 = report(&c, s, "n002", EndCause::Exited, 5);
    assert_eq!(
        ended(c.ok(by(
            Actor::Node(name("n001")),
            Command::EndSteps(vec![r2.clone()])
        ))),
        (0, 0, 1)
    );
    // n003 is not in the step: refused even from its own agent.
    let r3 = report(&c, s, "n003", EndCause::Exited, 0);
    assert_eq!(
        ended(c.ok(by(Actor::Node(name("n003")), Command::EndSteps(vec![r3])))),
        (0, 0, 1)
    );
    assert_eq!(
        ended(c.ok(by(Actor::Node(name("n002")), Command::EndSteps(vec![r2])))),
        (1, 0, 0)
    );
    let done = &c.job(id).steps.list[&s.step];
    assert_eq!(done.state, JobState::Failed);
    let exit = done.exit.unwrap();
    assert_eq!((exit.code, exit.cpu_time_ms), (5, 200));
    assert!(done.end_time.is_some());
    // Its cpus are free again; the job itself runs on.
    assert_eq!(c.job(id).state, JobState::Running);
    create(&mut c, alice(), id, step(Some(8))).unwrap();
}

#[test]
fn only_the_owner_or_root_creates_steps_and_only_in_a_running_job() {
    let (mut c, id) = running_job();
    let e = create(&mut c, Actor::User(name("bob")), id, step(None)).unwrap_err();
    assert!(matches!(e, Rejection::NotPermitted(_)), "{e}");
    let e = create(&mut c, Actor::Node(name("n001")), id, step(None)).unwrap_err();
    assert!(matches!(e, Rejection::NotPermitted(_)), "{e}");
    assert_eq!(c.job(id).steps.next, 0);
    create(&mut c, Actor::Operator, id, step(None)).unwrap();

    let pending = c.submit(vec![c.spec("alice")])[0];
    let e = create(&mut c, alice(), pending, step(None)).unwrap_err();
    assert!(matches!(e, Rejection::WrongState { .. }), "{e}");
    let e = create(&mut c, alice(), JobId(9_999), step(None)).unwrap_err();
    assert!(matches!(e, Rejection::Unknown { .. }), "{e}");
}

#[test]
fn bad_step_requests_name_the_field_and_change_nothing() {
    let (mut c, id) = running_job();
    let before = c.snapshot();
    let cases: Vec<(StepSpec, &str)> = vec![
        (
            StepSpec {
                io_key: vec![1; 3],
                ..step(None)
            },
            "io_key",
        ),
        (
            StepSpec {
                cpus_per_task: 0,
                ..step(None)
            },
            "cpus_per_task",
        ),
        (
            StepSpec {
                name: "x".repeat(10_000),
                ..step(None)
            },
            "step name length",
        ),
        (
            StepSpec {
                nodelist: vec![name("n003")],
                ..step(None)
            },
            "nodelist",
        ),
        (
            StepSpec {
                nodelist: vec![name("n001"), name("n001")],
                ..step(None)
            },
            "nodelist",
        ),
        (step(Some(9)), "ntasks"),
        (
            StepSpec {
                nodes: Some(3),
                ..step(None)
            },
            "nodes",
        ),
    ];
    for (spec, field) in cases {
        let e = create(&mut c, alice(), id, spec).unwrap_err();
        assert!(e.to_string().starts_with(field), "{field}: {e}");
    }
    // Only the log position moved.
    let after = docket_core::State::from_snapshot(&c.snapshot()).unwrap();
    let was = docket_core::State::from_snapshot(&before).unwrap();
    assert_eq!(after.jobs, was.jobs);
}

#[test]
fn cancelling_a_step_is_the_owners_and_ends_it_as_cancelled() {
    let (mut c, id) = running_job();
    let s = StepRef {
        job: id,
        step: create(&mut c, alice(), id, step(Some(1))).unwrap(),
    };
    let bob = c.ok(by(
        Actor::User(name("bob")),
        Command::CancelSteps { steps: vec![s] },
    ));
    assert!(matches!(&bob, Response::PerJob(r) if matches!(r[0], Err(Rejection::NotPermitted(_)))));
    c.ok(by(alice(), Command::CancelSteps { steps: vec![s] }));
    assert_eq!(c.job(id).steps.list[&s.step].state, JobState::Completing);
    let r = report(&c, s, "n001", EndCause::Cancelled, 0);
    c.ok(by(Actor::Node(name("n001")), Command::EndSteps(vec![r])));
    assert_eq!(c.job(id).steps.list[&s.step].state, JobState::Cancelled);
    let again = c.ok(by(alice(), Command::CancelSteps { steps: vec![s] }));
    assert!(
        matches!(&again, Response::PerJob(r) if matches!(r[0], Err(Rejection::WrongState { .. })))
    );
    let missing = StepRef {
        job: id,
        step: StepId(42),
    };
    let r = c.ok(by(
        alice(),
        Command::CancelSteps {
            steps: vec![missing],
        },
    ));
    assert!(matches!(&r, Response::PerJob(r) if matches!(r[0], Err(Rejection::Unknown { .. }))));
}

#[test]
fn the_jobs_end_ends_its_live_steps_and_later_reports_are_stale() {
    let (mut c, id) = running_job();
    let s = StepRef {
        job: id,
        step: create(&mut c, alice(), id, step(Some(2))).unwrap(),
    };
    let late = report(&c, s, "n001", EndCause::Exited, 0);
    c.end(id, EndCause::Timeout, 0);
    let over = &c.job(id).steps.list[&s.step];
    assert_eq!(over.state, JobState::Cancelled);
    assert!(over.end_time.is_some());
    assert_eq!(
        ended(c.ok(by(Actor::Node(name("n001")), Command::EndSteps(vec![late])))),
        (0, 1, 0)
    );
    let e = create(&mut c, alice(), id, step(None)).unwrap_err();
    assert!(matches!(e, Rejection::WrongState { .. }), "{e}");
}

#[test]
fn a_node_failure_ends_its_steps_as_node_failures() {
    let (mut c, id) = running_job();
    let s = create(&mut c, alice(), id, step(Some(8))).unwrap();
    c.ok(Command::DownNode {
        node: name("n002"),
        reason: "agent fenced".into(),
    });
    assert_eq!(c.job(id).steps.list[&s].state, JobState::NodeFail);
}

#[test]
fn a_suspended_jobs_steps_wait() {
    let (mut c, id) = running_job();
    c.ok(by(
        Actor::Operator,
        Command::SuspendJobs { jobs: vec![jr(id)] },
    ));
    let e = create(&mut c, alice(), id, step(None)).unwrap_err();
    assert!(matches!(e, Rejection::Busy { .. }), "{e}");
}

#[test]
fn steps_survive_a_snapshot_exactly() {
    let (mut c, id) = running_job();
    create(&mut c, alice(), id, step(Some(3))).unwrap();
    let bytes = c.snapshot();
    let restored = docket_core::State::from_snapshot(&bytes).unwrap();
    assert_eq!(restored.jobs[&id].steps, c.job(id).steps);
    assert_eq!(restored.to_snapshot().unwrap(), bytes);
}

/// `salloc` and `srun` outside an allocation end their job with their command's status:
/// the job's owner completes it, the agent's report of the killed holder ends it with that
/// status (and the agent's measurements); nobody else may, and only a running job.
#[test]
fn the_owner_completes_a_running_job_with_its_own_exit_status() {
    let (mut c, id) = running_job();
    let complete = |code: i32, signal: i32| Command::CompleteJob {
        job: id,
        exit: ExitStatus {
            code,
            signal,
            ..Default::default()
        },
    };
    let e = c
        .apply(by(Actor::User(name("bob")), complete(0, 0)))
        .unwrap_err();
    assert!(matches!(e, Rejection::NotPermitted(_)), "{e}");
    let e = c.apply(by(alice(), complete(256, 0))).unwrap_err();
    assert!(e.to_string().contains("exit"), "{e}");
    assert_eq!(
        c.job(id).state,
        JobState::Running,
        "refusals change nothing"
    );

    c.ok(by(alice(), complete(3, 0)));
    assert_eq!(c.job(id).state, JobState::Completing);
    let e = c.apply(by(alice(), complete(0, 0))).unwrap_err();
    assert!(matches!(e, Rejection::WrongState { .. }), "{e}");
    // The agent killed the holder and says so; the job ends as its owner said.
    c.end(id, EndCause::Cancelled, 0);
    let job = c.job(id);
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.exit.map(|e| e.code), Some(3));

    let (mut c, id) = running_job();
    c.ok(by(alice(), complete(0, 0)));
    c.end(id, EndCause::Cancelled, 0);
    assert_eq!(c.job(id).state, JobState::Completed);
}

#[test]
fn a_step_time_limit_beyond_a_year_is_refused_naming_the_field() {
    let (mut c, id) = running_job();
    let mut spec = step(Some(1));
    spec.time_limit = Some(docket_core::quantity::Seconds(u64::MAX));
    let e = create(&mut c, alice(), id, spec).unwrap_err();
    assert!(e.to_string().contains("time_limit"), "{e}");
    assert!(c.job(id).steps.list.is_empty(), "nothing changed");
}
