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
