//! Who may do what, decided at apply from the actor each command carries: admin commands need
//! an admin, scheduling decisions the controller, a node's agent reports only on its own
//! runs, per-user caps bound what one user can queue, and private data stays private. Every
//! refusal changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Cluster, SCRIPT, by, jr, name};
use docket_core::access::Data;
use docket_core::account::User;
use docket_core::command::{EndCause, EndReport};
use docket_core::config::SchedConfig;
use docket_core::job::{BlobId, ExitStatus, JobState};
use docket_core::{Actor, Command, Rejection, Response, State};

fn cluster() -> Cluster {
    Cluster::new(SchedConfig::default(), 2)
}

fn content(state: &State) -> Vec<u8> {
    let mut s = state.clone();
    s.applied = Default::default();
    s.to_snapshot().unwrap()
}

fn alice() -> Actor {
    Actor::User(name("alice"))
}

fn not_permitted(r: Result<Response, Rejection>) -> String {
    match r {
        Err(Rejection::NotPermitted(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn admin_commands_need_an_admin_and_a_refusal_changes_nothing() {
    let mut c = cluster();
    let before = content(&c.state);
    let drain = Command::DrainNode {
        node: name("n001"),
        reason: "mine now".into(),
    };
    let why = not_permitted(c.apply(by(alice(), drain.clone())));
    assert!(
        why.contains("alice cannot drain a node") && why.contains("admin role"),
        "{why}"
    );
    let why = not_permitted(c.apply(by(Actor::Node(name("n001")), drain.clone())));
    assert!(why.contains("n001"), "{why}");
    let mut config = c.state.config.clone();
    config.max_batch = 1;
    not_permitted(c.apply(by(alice(), Command::SetConfig(Box::new(config)))));
    // Making oneself an admin is an admin command too.
    not_permitted(c.apply(by(
        alice(),
        Command::UpsertUser {
            user: User {
                name: name("alice"),
                default_account: name("proj"),
                admin: true,
            },
            assocs: vec![],
        },
    )));
    assert_eq!(content(&c.state), before);
    // Root and a user with AdminLevel may.
    c.ok(by(Actor::Operator, drain.clone()));
    let mut bob = c.state.users[&name::<docket_core::UserName>("bob")]
        .user
        .clone();
    bob.admin = true;
    let assocs = vec![(
        name("proj"),
        docket_core::account::UserAssoc {
            shares: 1,
            priority: 0,
            limits: Default::default(),
        },
    )];
    c.ok(Command::UpsertUser { user: bob, assocs });
    c.ok(by(
        Actor::User(name("bob")),
        Command::ResumeNode(name("n001")),
    ));
}

#[test]
fn only_the_controller_returns_a_node_to_service() {
    let mut c = cluster();
    c.ok(Command::DownNode {
        node: name("n001"),
        reason: format!("{} for 30 s", docket_core::node::NOT_RESPONDING),
    });
    let before = content(&c.state);
    let back = Command::ReturnToService {
        node: name("n001"),
        any_reason: true,
    };
    // Not a user, not an agent (its own node or another), not even an administrator: an
    // administrator resumes nodes with ResumeNode.
    for actor in [alice(), Actor::Operator, Actor::Node(name("n001"))] {
        let refusal = not_permitted(c.apply(by(actor, back.clone())));
        assert!(refusal.contains("return a node to service"), "{refusal}");
    }
    assert_eq!(content(&c.state), before);
    c.ok(back);
    assert_eq!(c.state.nodes[&name("n001")].down, None);
}

#[test]
fn scheduling_decisions_come_from_the_controller_only() {
    let mut c = cluster();
    let id = c.submit(vec![c.spec("alice")])[0];
    let before = content(&c.state);
    let start = Command::StartJobs(vec![docket_core::command::StartDecision {
        job: jr(id),
        nodes: vec![name("n001")],
    }]);
    for actor in [alice(), Actor::Operator, Actor::Node(name("n001"))] {
        not_permitted(c.apply(by(actor.clone(), start.clone())));
        not_permitted(c.apply(by(actor, Command::Tick)));
    }
    assert_eq!(content(&c.state), before);
    c.ok(start);
    assert_eq!(c.job(id).state, JobState::Running);
}

#[test]
fn a_nodes_agent_reports_only_on_runs_dispatched_to_its_node() {
    let mut c = cluster();
    let id = c.submit(vec![c.spec("alice")])[0];
    c.start(jr(id), &["n001"]).unwrap();
    let epoch = c.job(id).alloc.as_ref().unwrap().epoch;
    let report = EndReport {
        job: id,
        epoch,
        cause: EndCause::Exited,
        exit: ExitStatus {
            code: 0,
            signal: 0,
            ..Default::default()
        },
    };
    let before = content(&c.state);
    let r = c.ok(by(
        Actor::Node(name("n002")),
        Command::EndJobs(vec![report.clone()]),
    ));
    assert_eq!(
        r,
        Response::Ended {
            applied: 0,
            stale: 0,
            refused: 1
        }
    );
    assert_eq!(
        content(&c.state),
        before,
        "a foreign report changes nothing"
    );
    // Users cannot report ends at all.
    not_permitted(c.apply(by(alice(), Command::EndJobs(vec![report.clone()]))));
    // Its own node's agent can.
    let r = c.ok(by(
        Actor::Node(name("n001")),
        Command::EndJobs(vec![report]),
    ));
    assert!(matches!(r, Response::Ended { applied: 1, .. }), "{r:?}");
    assert_eq!(c.job(id).state, JobState::Completed);
}

#[test]
fn a_node_agent_cannot_act_as_a_user() {
    let mut c = cluster();
    let id = c.submit(vec![c.spec("alice")])[0];
    let before = content(&c.state);
    let node = Actor::Node(name("n001"));
    not_permitted(c.apply(by(node.clone(), Command::CancelJobs { jobs: vec![jr(id)] })));
    not_permitted(c.apply(by(
        node,
        Command::SubmitJobs {
            blobs: vec![SCRIPT.to_vec()],
            jobs: vec![c.spec("alice")],
        },
    )));
    assert_eq!(content(&c.state), before);
}

#[test]
fn per_user_caps_bound_queued_jobs_and_stored_script_bytes_but_not_admins() {
    let mut config = SchedConfig::default();
    config.user_caps.max_jobs = Some(3);
    config.user_caps.max_script_bytes = Some(100);
    let mut c = Cluster::new(config, 1);
    let r = c.submit_as(alice(), vec![c.spec("alice"); 5]);
    assert_eq!(r.iter().filter(|r| r.is_ok()).count(), 3, "{r:?}");
    let e = r[3].as_ref().unwrap_err().to_string();
    assert!(
        e.contains("MaxSubmitJobsPerUser") && e.contains("limit of 3"),
        "{e}"
    );
    // Distinct scripts: counted once each, over the user's queued jobs.
    let mut c = Cluster::new(
        {
            let mut config = SchedConfig::default();
            config.user_caps.max_script_bytes = Some(100);
            config
        },
        1,
    );
    let script = |n: u8| vec![b'#'; 40 + n as usize];
    let spec_with = |c: &Cluster, data: &[u8]| {
        let mut s = c.spec("alice");
        s.script = BlobId::of(data);
        s
    };
    let specs = vec![
        spec_with(&c, &script(0)),
        spec_with(&c, &script(0)),
        spec_with(&c, &script(1)),
        spec_with(&c, &script(2)),
    ];
    let before_next = c.state.next_job_id;
    let r = match c.ok(by(
        alice(),
        Command::SubmitJobs {
            blobs: vec![script(0), script(1), script(2)],
            jobs: specs.clone(),
        },
    )) {
        Response::Submitted(r) => r,
        other => panic!("{other:?}"),
    };
    // 40 + 41 fit in 100; the third script (42 more) does not.
    assert!(r[0].is_ok() && r[1].is_ok() && r[2].is_ok(), "{r:?}");
    let e = r[3].as_ref().unwrap_err().to_string();
    assert!(
        e.contains("MaxScriptBytesPerUser") && e.contains("123"),
        "{e}"
    );
    assert_eq!(c.state.stored_bytes_of(&name("alice")), 81);
    assert_eq!(c.state.next_job_id, before_next + 3);
    // Root is exempt.
    let r = match c.ok(by(
        Actor::Operator,
        Command::SubmitJobs {
            blobs: vec![script(2)],
            jobs: vec![specs[3].clone()],
        },
    )) {
        Response::Submitted(r) => r,
        other => panic!("{other:?}"),
    };
    assert!(r[0].is_ok(), "{r:?}");
}

#[test]
fn private_jobs_are_seen_by_their_owner_a_coordinator_and_admins_only() {
    let mut c = cluster();
    c.add_user("carol", "proj");
    let id = c.submit(vec![c.spec("alice")])[0];
    let job = c.job(id).clone();
    let bob = Actor::User(name("bob"));
    assert!(
        c.state.may_see_job(&bob, &job, Data::Jobs),
        "public by default, as Slurm"
    );
    let mut config = c.state.config.clone();
    config.private_data.jobs = true;
    c.ok(Command::SetConfig(Box::new(config)));
    assert!(!c.state.may_see_job(&bob, &job, Data::Jobs));
    assert!(
        !c.state.may_see_job(&bob, &job, Data::Accounting),
        "jobs covers accounting"
    );
    assert!(c.state.may_see_job(&alice(), &job, Data::Jobs));
    assert!(c.state.may_see_job(&Actor::Operator, &job, Data::Jobs));
    assert!(
        !c.state
            .may_see_job(&Actor::Node(name("n001")), &job, Data::Jobs)
    );
    c.ok(Command::SetCoordinators {
        account: name("proj"),
        users: vec![name("carol")],
    });
    assert!(
        c.state
            .may_see_job(&Actor::User(name("carol")), &job, Data::Jobs)
    );
    // Usage: own rows and the accounts above.
    let mut config = c.state.config.clone();
    config.private_data.usage = true;
    c.ok(Command::SetConfig(Box::new(config)));
    let (proj, root) = (name("proj"), name("root"));
    assert!(c.state.may_see_usage(&bob, &proj, Some(&name("bob"))));
    assert!(!c.state.may_see_usage(&bob, &proj, Some(&name("alice"))));
    assert!(c.state.may_see_usage(&bob, &proj, None));
    assert!(c.state.may_see_usage(&bob, &root, None));
    assert!(
        c.state
            .may_see_usage(&Actor::User(name("carol")), &proj, Some(&name("alice")))
    );
}
