//! Data written before a field was added still reads after an upgrade: a replica's Raft log,
//! its snapshots and its archive outlive the build that wrote them (`docket_core::layout`).
//!
//! The fixtures are bytes an earlier build wrote (`tests/data/README.md`), not bytes this
//! build made up: a mistake in the layout marks shows here as a decode error or a misread
//! field.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use docket_core::job::JobState;
use docket_core::snapshot::SNAPSHOT_FORMAT;
use docket_core::{Command, Envelope, JobId, Response, State};

const SNAPSHOT_4: &[u8] = include_bytes!("data/layout-original/snapshot-format-4.bin");
const ENVELOPE_3: &[u8] = include_bytes!("data/layout-original/envelope-version-3.bin");

#[test]
fn a_format_4_snapshot_restores_with_every_field_where_it_was() {
    let state = State::from_snapshot(SNAPSHOT_4).unwrap();
    let pending = &state.jobs[&JobId(1)];
    assert_eq!(pending.spec.name, "before-upgrade");
    assert_eq!(
        pending.spec.stdout.as_deref(),
        Some("/home/alice/out-%j.txt")
    );
    assert_eq!(pending.spec.comment, None);
    assert_eq!(pending.state, JobState::Pending);
    let ended = &state.jobs[&JobId(2)];
    assert_eq!(ended.spec.name, "ended-before-upgrade");
    assert!(ended.spec.requeue);
    assert_eq!(ended.exit.map(|e| e.code), Some(3));
    // Written again, it is the current format, and reads back the same.
    let again = state.to_snapshot().unwrap();
    assert_eq!(&again[4..6], &SNAPSHOT_FORMAT.to_be_bytes());
    let back = State::from_snapshot(&again).unwrap();
    assert_eq!(back.jobs, state.jobs);
}

#[test]
fn a_version_3_log_entry_applies_after_the_upgrade() {
    let env: Envelope = postcard::from_bytes(ENVELOPE_3).unwrap();
    assert_eq!(env.version, 3);
    let Command::SubmitJobs { jobs, .. } = &env.command else {
        panic!("not a submission: {env:?}");
    };
    assert_eq!(jobs[0].name, "before-upgrade");
    assert_eq!(jobs[0].comment, None);

    let mut c = Cluster::new(docket_core::config::SchedConfig::default(), 2);
    match c.ok(env) {
        Response::Submitted(r) => assert!(r[0].is_ok(), "{r:?}"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn old_and_new_entries_side_by_side_each_read_in_their_own_layout() {
    // A log entry is a batch of envelopes: one logged before the upgrade, one after.
    let mut new = by(
        docket_core::Actor::User(name("bob")),
        Command::SubmitJobs {
            blobs: vec![SCRIPT.to_vec()],
            jobs: vec![{
                let c = Cluster::new(docket_core::config::SchedConfig::default(), 1);
                let mut s = c.spec("bob");
                s.comment = Some("sweep 7 of 12".into());
                s
            }],
        },
    );
    new.version = docket_core::command::COMMAND_VERSION;
    let mut batch = vec![2u8];
    batch.extend_from_slice(ENVELOPE_3);
    batch.extend(postcard::to_stdvec(&new).unwrap());
    let read: Vec<Envelope> = postcard::from_bytes(&batch).unwrap();
    assert_eq!(read[1], new);
    let Command::SubmitJobs { jobs, .. } = &read[0].command else {
        panic!("not a submission");
    };
    assert_eq!(
        (jobs[0].name.as_str(), &jobs[0].comment),
        ("before-upgrade", &None)
    );
}

#[test]
fn an_old_entry_written_again_is_the_same_bytes() {
    // The log store and every append re-encode entries: a version-3 entry must come out as a
    // version-3 entry, or the next reader misreads it.
    let env: Envelope = postcard::from_bytes(ENVELOPE_3).unwrap();
    assert_eq!(postcard::to_stdvec(&env).unwrap(), ENVELOPE_3);
    // In a batch, followed by another envelope, it still ends where it ended.
    let batch = vec![env.clone(), by(docket_core::Actor::Operator, Command::Tick)];
    let bytes = postcard::to_stdvec(&batch).unwrap();
    let back: Vec<Envelope> = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(back, batch);
}

#[test]
fn what_changed_meaning_follows_the_entry_s_version_and_the_cluster_s() {
    use docket_core::command::StartDecision;
    // A cluster restored from a format-4 snapshot writes version 3 until raised.
    let state = State::from_snapshot(SNAPSHOT_4).unwrap();
    assert_eq!(state.command_version.0, 3);
    let mut c = Cluster::new(docket_core::config::SchedConfig::default(), 2);
    assert_eq!(
        c.state.command_version.0, 3,
        "raised by the leader, in the log"
    );
    // A start logged as version 3 records no billing, as the build that logged it did not;
    // one logged as version 4 does.
    let ids = c.submit(vec![c.spec("alice"), c.spec("alice")]);
    for (id, version, billed) in [(ids[0], 3, None), (ids[1], 4, Some(1000))] {
        let mut env = Envelope::controller(Command::StartJobs(vec![StartDecision {
            job: jr(id),
            nodes: vec![name("n001")],
        }]));
        env.version = version;
        c.ok(env);
        assert_eq!(
            c.job(id).alloc.as_ref().map(|a| a.billing_milli),
            Some(billed)
        );
    }
    // Only the controller raises the cluster's version, never past this build's, never down.
    let mut c = Cluster {
        state,
        index: 100,
        now: c.now,
    };
    let raise = |v| Command::RaiseCommandVersion(v);
    assert!(c.apply(by(docket_core::Actor::Operator, raise(4))).is_err());
    c.ok(raise(99));
    let this_build = docket_core::command::COMMAND_VERSION;
    assert_eq!(c.state.command_version.0, this_build);
    c.ok(raise(2));
    assert_eq!(c.state.command_version.0, this_build);
}
