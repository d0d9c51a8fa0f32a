//! Advance reservations: what creating one checks, who may submit to it, the reasons its
//! jobs show, and that the planners and apply keep everyone else off its nodes inside its
//! window while its own jobs run only there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::{Cluster, jr, name};
use docket_core::config::SchedConfig;
use docket_core::job::{JobRef, JobState, Reason, TimeRequest};
use docket_core::plan::Unlimited;
use docket_core::quantity::Seconds;
use docket_core::reservation::Reservation;
use docket_core::{Command, Rejection, Response};

fn resv(c: &Cluster, nodes: &[&str], from: u64, hours: u64, users: &[&str]) -> Reservation {
    let start = c.now.plus(Seconds(from));
    Reservation {
        name: name("maint"),
        nodes: nodes.iter().map(|n| name(n)).collect(),
        start,
        end: start.plus(Seconds::hours(hours)),
        users: users.iter().map(|u| name(u)).collect(),
        accounts: BTreeSet::new(),
    }
}

/// Two nodes; `maint` holds n001 for Alice from an hour from now, for two hours.
fn with_maintenance() -> Cluster {
    let mut c = Cluster::new(SchedConfig::default(), 2);
    let r = resv(&c, &["n001"], 3600, 2, &["alice"]);
    c.ok(Command::UpsertReservation(Box::new(r)));
    c
}

fn spec(c: &Cluster, user: &str, hours: u64) -> docket_core::job::JobSpec {
    let mut s = c.spec(user);
    s.ntasks = 16; // a whole node
    s.time = TimeRequest::Limit(Seconds::hours(hours));
    s
}

#[test]
fn creating_one_checks_window_nodes_people_and_overlaps() {
    let mut c = Cluster::new(SchedConfig::default(), 2);
    let mut bad = resv(&c, &["n001"], 3600, 2, &["alice"]);
    bad.end = bad.start;
    let err = c
        .apply(Command::UpsertReservation(Box::new(bad)))
        .unwrap_err();
    assert!(err.to_string().contains("reservation maint end"), "{err}");
    let err = c
        .apply(Command::UpsertReservation(Box::new(resv(
            &c,
            &["n404"],
            0,
            1,
            &["alice"],
        ))))
        .unwrap_err();
    assert!(matches!(err, Rejection::Unknown { .. }), "{err}");
    let err = c
        .apply(Command::UpsertReservation(Box::new(resv(
            &c,
            &["n001"],
            0,
            1,
            &[],
        ))))
        .unwrap_err();
    assert!(err.to_string().contains("nobody could use it"), "{err}");
    c.ok(Command::UpsertReservation(Box::new(resv(
        &c,
        &["n001"],
        3600,
        2,
        &["alice"],
    ))));
    let mut other = resv(&c, &["n001", "n002"], 7200, 2, &["bob"]);
    other.name = name("other");
    let err = c
        .apply(Command::UpsertReservation(Box::new(other)))
        .unwrap_err();
    assert!(
        err.to_string().contains("reservation maint holds it"),
        "{err}"
    );
    let err = c.apply(Command::RemoveUser(name("alice"))).unwrap_err();
    assert!(
        err.to_string().contains("reservation maint admits them"),
        "{err}"
    );
}

#[test]
fn only_admitted_jobs_that_fit_the_window_may_submit_to_it() {
    let mut c = with_maintenance();
    let mut s = spec(&c, "bob", 1);
    s.reservation = Some(name("maint"));
    let r = c.submit_as(docket_core::Actor::Operator, vec![s]);
    assert!(
        matches!(&r[0], Err(Rejection::NotPermitted(m)) if m.contains("admits neither")),
        "{r:?}"
    );
    let mut s = spec(&c, "alice", 3);
    s.reservation = Some(name("maint"));
    let r = c.submit_as(docket_core::Actor::Operator, vec![s]);
    assert!(
        matches!(&r[0], Err(e) if e.to_string().contains("window")),
        "{r:?}"
    );
    let mut s = spec(&c, "alice", 1);
    s.reservation = Some(name("nope"));
    let r = c.submit_as(docket_core::Actor::Operator, vec![s]);
    assert!(matches!(&r[0], Err(Rejection::Unknown { .. })), "{r:?}");
}

#[test]
fn reserved_nodes_go_only_to_the_reservation_inside_its_window() {
    let mut c = with_maintenance();
    let mut mine = spec(&c, "alice", 1);
    mine.reservation = Some(name("maint"));
    let mine = c.submit(vec![mine])[0];
    assert_eq!(
        c.job(mine).reason,
        Reason::Reservation,
        "its window has not begun"
    );
    // Bob: a 2-hour job would overlap the window on n001, so it takes n002; a second one
    // finds no node free for two hours without touching the window; a half-hour job runs
    // on n001 before the window opens.
    let long = c.submit(vec![spec(&c, "bob", 2), spec(&c, "bob", 2)]);
    let mut half = spec(&c, "bob", 1);
    half.time = TimeRequest::Limit(Seconds(1800));
    let half = c.submit(vec![half])[0];
    let plan = c.state.backfill_pass(c.now, &mut Unlimited, None);
    let placed: Vec<(JobRef, String)> = plan
        .starts
        .iter()
        .map(|d| (d.job, d.nodes[0].to_string()))
        .collect();
    assert!(
        placed.contains(&(jr(long[0]), "n002".to_string())),
        "{placed:?}"
    );
    assert!(
        placed.contains(&(jr(half), "n001".to_string())),
        "{placed:?}"
    );
    assert!(
        !placed
            .iter()
            .any(|(j, _)| j.job == long[1] || j.job == mine),
        "{placed:?}"
    );
    assert!(
        matches!(c.ok(Command::StartJobs(plan.starts.clone())), Response::Started(r) if r.iter().all(Result::is_ok))
    );
    // Bob's second long job is reserved after the window, not inside it.
    let later = c.state.backfill_pass(c.now, &mut Unlimited, None);
    let r = later
        .reservations
        .iter()
        .find(|(j, _)| j.job == long[1])
        .map(|(_, p)| p.clone())
        .expect("a reservation for the waiting job");
    // n001 is free from the half hour on, but two hours from then would cross the window:
    // the earliest start is on n002 when the first long job's two hours are up.
    assert_eq!(
        r.nodes,
        vec![name::<docket_core::NodeName>("n002")],
        "{r:?}"
    );
    assert_eq!(r.start, c.now.plus(Seconds::hours(2)), "{r:?}");
    // Apply refuses to put Bob's job on the reserved node across the window.
    let d = docket_core::command::StartDecision {
        job: jr(long[1]),
        nodes: vec![name("n001")],
    };
    let Response::Started(r) = c.ok(Command::StartJobs(vec![d])) else {
        panic!()
    };
    assert!(
        matches!(&r[0], Err(e) if e.to_string().contains("reserved")),
        "{r:?}"
    );
    // When the window opens (and the half-hour job is done), Alice's job starts there.
    c.apply_after(1800, Command::Tick).unwrap();
    c.end(half, docket_core::command::EndCause::Exited, 0);
    c.apply_after(1800, Command::Tick).unwrap();
    assert_eq!(c.job(mine).reason, Reason::None);
    let plan = c.state.main_pass(c.now, &mut Unlimited, None);
    assert_eq!(
        plan.starts[0].job,
        jr(mine),
        "reservation jobs are considered first"
    );
    assert_eq!(
        plan.starts[0].nodes,
        vec![name::<docket_core::NodeName>("n001")]
    );
    c.ok(Command::StartJobs(plan.starts));
    assert_eq!(c.job(mine).state, JobState::Running);
}

#[test]
fn a_deleted_reservation_leaves_its_jobs_waiting_with_a_reason() {
    let mut c = Cluster::new(SchedConfig::default(), 1);
    c.ok(Command::UpsertReservation(Box::new(resv(
        &c,
        &["n001"],
        0,
        2,
        &["alice"],
    ))));
    let mut s = spec(&c, "alice", 1);
    s.reservation = Some(name("maint"));
    let id = c.submit(vec![s])[0];
    assert_eq!(c.job(id).reason, Reason::None);
    c.ok(Command::RemoveReservation(name("maint")));
    assert_eq!(c.job(id).reason, Reason::ReservationDeleted);
    assert!(
        c.state
            .main_pass(c.now, &mut Unlimited, None)
            .starts
            .is_empty()
    );
}
