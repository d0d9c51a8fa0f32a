//! Submission: defaults are resolved from partition and config, and every kind of bad input
//! is refused with a message naming the field and the limit, changing nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Cluster, SCRIPT, by, name};
use docket_core::config::SchedConfig;
use docket_core::job::{
    ArraySpec, BlobId, Dependency, JobSpec, MemoryRequest, Part, Reason, TimeRequest,
};
use docket_core::quantity::{MiB, Seconds};
use docket_core::{Actor, Command, Response, State};

fn cluster() -> Cluster {
    Cluster::new(SchedConfig::default(), 2)
}

/// Everything but the log position and time.
fn content(state: &State) -> Vec<u8> {
    let mut s = state.clone();
    s.applied = Default::default();
    s.to_snapshot().unwrap()
}

fn rejected(c: &mut Cluster, spec: JobSpec) -> String {
    let before = content(&c.state);
    let next = c.state.next_job_id;
    let r = c.submit_as(Actor::User(spec.user.clone()), vec![spec]);
    let err = r[0].clone().expect_err("submission should be refused");
    assert_eq!(
        content(&c.state),
        before,
        "a refused job changed state ({err})"
    );
    assert_eq!(c.state.next_job_id, next);
    err.to_string()
}

#[test]
fn defaults_come_from_partition_and_config() {
    let mut c = cluster();
    let mut spec = c.spec("alice");
    spec.time = TimeRequest::Default;
    spec.ntasks = 4;
    let id = c.submit(vec![spec])[0];
    let r = &c.job(id).resolved;
    assert_eq!(r.account.as_str(), "proj");
    assert_eq!(r.partition.as_str(), "work");
    assert_eq!(r.qos.as_str(), "normal");
    assert_eq!(r.time_limit, None, "partition without limits: UNLIMITED");
    assert_eq!(r.memory, MemoryRequest::PerCpu(MiB::gib(1)));
    // No jobfs unless asked (Slurm); a site sets DefaultJobfs (NCI: 100 MB).
    assert_eq!(r.jobfs, MiB(0));
}

/// A change to a valid job spec.
type Mutation = Box<dyn Fn(&mut JobSpec)>;

/// Changes that make a spec invalid, each with the words its refusal must contain: the field
/// and the limit.
fn invalid_specs() -> Vec<(Mutation, &'static str)> {
    vec![
        (Box::new(|s| s.ntasks = 0), "ntasks: must be at least 1"),
        (Box::new(|s| s.nodes = 0), "nodes: must be at least 1"),
        (
            Box::new(|s| s.cpus_per_task = 0),
            "cpus_per_task: must be at least 1",
        ),
        (
            Box::new(|s| {
                s.nodes = 3;
                s.ntasks = 3;
            }),
            "= 3 exceeds the limit of 2",
        ),
        (
            Box::new(|s| s.nodes = 2),
            "ntasks: 1 tasks cannot fill 2 nodes",
        ),
        (
            Box::new(|s| s.cpus_per_task = 17),
            "cpus per node (largest node in work) = 17 exceeds the limit of 16",
        ),
        (
            Box::new(|s| s.memory = Some(MemoryRequest::PerNode(MiB::gib(65)))),
            "memory per node in MiB (largest node in work) = 66560 exceeds the limit of 65536",
        ),
        (
            Box::new(|s| s.memory = Some(MemoryRequest::PerCpu(MiB(u64::MAX / 2)))),
            "exceeds the limit of 65536",
        ),
        (
            Box::new(|s| s.jobfs = Some(MiB::gib(101))),
            "jobfs per node in MiB (largest in work) = 103424 exceeds the limit of 102400",
        ),
        (
            Box::new(|s| s.name = "x".repeat(300).into()),
            "name length = 300 exceeds the limit of 256",
        ),
        (
            Box::new(|s| s.work_dir = "relative/dir".into()),
            "work_dir: \"relative/dir\" is not an absolute path",
        ),
        (
            Box::new(|s| s.nice = -5),
            "only an administrator may set a negative nice",
        ),
        (
            Box::new(|s| s.partition = Some(name("gpu"))),
            "unknown partition \"gpu\"",
        ),
        (
            Box::new(|s| s.qos = Some(name("vip"))),
            "unknown qos \"vip\"",
        ),
        (
            Box::new(|s| s.account = Some(name("other"))),
            "unknown account \"other\"",
        ),
        (
            Box::new(|s| s.time = TimeRequest::Limit(Seconds(0))),
            "time: a limit of 0 s",
        ),
        (
            Box::new(|s| s.array = Some(ArraySpec::parse("0-5000", 10_000).unwrap())),
            "array size = 5001 exceeds the limit of 1001",
        ),
        (
            Box::new(|s| s.dependency = Some(Dependency::parse("afterok:999").unwrap())),
            "dependency: job 999 does not exist",
        ),
        (
            Box::new(|s| s.script = BlobId::of(b"never sent")),
            "script: blob",
        ),
        (
            Box::new(|s| s.nodelist = [name("n009")].into()),
            "nodelist: node n009 is not in partition work",
        ),
    ]
}

#[test]
fn bad_requests_name_the_field_and_limit() {
    let mut c = cluster();
    let base = c.spec("alice");
    let cases = invalid_specs();
    for (mutate, expected) in cases {
        let mut spec = base.clone();
        mutate(&mut spec);
        let err = rejected(&mut c, spec);
        assert!(err.contains(expected), "expected {expected:?} in {err:?}");
    }
}

#[test]
fn unknown_users_and_impersonation_are_refused() {
    let mut c = cluster();
    let mallory = c.spec("mallory");
    let err = rejected(&mut c, mallory);
    assert_eq!(err, "unknown user \"mallory\"");
    let spec = c.spec("alice");
    let r = c.submit_as(Actor::User(name("bob")), vec![spec]);
    assert!(
        r[0].clone()
            .unwrap_err()
            .to_string()
            .contains("cannot submit jobs as alice")
    );
    // An operator may submit on behalf of a user.
    let r = c.submit_as(Actor::Operator, vec![c.spec("alice")]);
    assert!(r[0].is_ok());
}

#[test]
fn a_batch_accepts_and_refuses_jobs_one_by_one() {
    let mut c = cluster();
    let mut bad = c.spec("alice");
    bad.ntasks = 0;
    let r = c.submit_as(
        Actor::User(name("alice")),
        vec![c.spec("alice"), bad, c.spec("alice")],
    );
    assert!(r[0].is_ok() && r[1].is_err() && r[2].is_ok());
    // Ids are consecutive over the accepted jobs only.
    assert_eq!(r[2].clone().unwrap().0, r[0].clone().unwrap().0 + 1);
    // The script blob is stored once, referenced twice.
    let blob = &c.state.blobs[&BlobId::of(SCRIPT)];
    assert_eq!(blob.refs, 2);
}

#[test]
fn oversized_batches_and_blobs_are_refused_whole() {
    let mut c = cluster();
    let config = SchedConfig {
        max_batch: 2,
        max_blob_bytes: 16,
        ..SchedConfig::default()
    };
    c.ok(Command::SetConfig(Box::new(config)));
    let before = content(&c.state);
    let err = c
        .apply(by(
            Actor::Operator,
            Command::SubmitJobs {
                blobs: vec![],
                jobs: vec![c.spec("alice"); 3],
            },
        ))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "jobs per submission = 3 exceeds the limit of 2"
    );
    let err = c
        .apply(by(
            Actor::Operator,
            Command::SubmitJobs {
                blobs: vec![vec![0u8; 17]],
                jobs: vec![],
            },
        ))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "blob 0 size in bytes = 17 exceeds the limit of 16"
    );
    assert_eq!(content(&c.state), before);
}

#[test]
fn held_and_future_jobs_are_blocked_with_their_reason() {
    let mut c = cluster();
    let mut held = c.spec("alice");
    held.hold = true;
    let mut later = c.spec("alice");
    later.begin = Some(c.now.plus(Seconds(60)));
    let ids = c.submit(vec![held, later]);
    assert_eq!(
        (c.job(ids[0]).part, c.job(ids[0]).reason),
        (Part::Blocked, Reason::JobHeldUser)
    );
    assert_eq!(c.job(ids[1]).reason, Reason::BeginTime);
    c.apply_after(60, Command::Tick).unwrap();
    assert_eq!(c.job(ids[1]).reason, Reason::None);
    // Age accrues from when it became eligible, not from submission.
    c.apply_after(30, Command::Tick).unwrap();
    assert_eq!(c.job(ids[1]).eligible_time(c.now), Seconds(30));
    assert_eq!(c.job(ids[0]).eligible_time(c.now), Seconds(0));
}

#[test]
fn commands_from_a_newer_version_or_replayed_indexes_are_refused() {
    let mut c = cluster();
    let mut env = docket_core::Envelope::controller(Command::Tick);
    env.version = docket_core::command::COMMAND_VERSION + 1;
    let ctx = docket_core::ApplyCtx {
        index: c.index + 1,
        time_ms: c.now,
    };
    let err = c.state.apply(env, ctx).unwrap_err();
    assert!(err.to_string().contains("upgrade every replica"), "{err}");
    let err = c
        .state
        .apply(docket_core::Envelope::controller(Command::Tick), ctx)
        .unwrap_err();
    assert!(
        err.to_string().contains("not after the last applied index"),
        "{err}"
    );
    c.index += 1; // the refused entry still took its place in the log
    assert!(matches!(c.apply(Command::Tick), Ok(Response::Done)));
}

#[test]
fn a_comment_is_kept_and_bounded_and_free_of_control_characters() {
    let mut c = cluster();
    let mut s = c.spec("alice");
    s.comment = Some("sweep 3 of 12: lr=0.01".into());
    let id = c.submit(vec![s])[0];
    assert_eq!(
        c.job(id).spec.comment.as_deref(),
        Some("sweep 3 of 12: lr=0.01")
    );
    for (comment, says) in [
        ("x".repeat(1025), "comment length"),
        ("\u{1b}[2J".to_string(), "comment"),
        ("two\nlines".to_string(), "comment"),
        ("reads \u{202E}backwards".to_string(), "U+202E"),
    ] {
        let mut s = c.spec("alice");
        s.comment = Some(comment.into());
        let err = rejected(&mut c, s);
        assert!(err.contains(says), "{err}");
    }
    let err = {
        let mut s = c.spec("alice");
        s.comment = Some("x".repeat(1025).into());
        rejected(&mut c, s)
    };
    assert!(err.contains("1024"), "names the limit: {err}");
}

/// The state's jobs are hashed for lookups but walked in id order, and written as the
/// ordered map they replaced: the same bytes whatever order the jobs came in, so replicas
/// with different histories write identical snapshots.
#[test]
fn the_job_table_walks_in_id_order_and_writes_an_ordered_map() {
    use docket_core::JobId;
    use docket_core::job::Job;
    use docket_core::job_table::JobTable;
    use std::collections::BTreeMap;

    let mut c = cluster();
    let specs = (0..40).map(|_| c.spec("alice")).collect();
    let ids = c.submit(specs);
    let jobs: Vec<(JobId, Box<Job>)> = c
        .state
        .jobs
        .iter()
        .map(|(id, j)| (*id, Box::new(j.clone())))
        .collect();
    assert_eq!(jobs.iter().map(|(id, _)| *id).collect::<Vec<_>>(), ids);
    let forward: JobTable = jobs.iter().cloned().collect();
    let mut backward: JobTable = jobs.iter().rev().cloned().collect();
    let ordered: BTreeMap<JobId, Box<Job>> = jobs.iter().cloned().collect();
    let bytes = postcard::to_allocvec(&forward).unwrap();
    assert_eq!(bytes, postcard::to_allocvec(&backward).unwrap());
    assert_eq!(bytes, postcard::to_allocvec(&ordered).unwrap());
    let back: JobTable = postcard::from_bytes(&bytes).unwrap();
    assert!(back == forward && back.check());

    assert_eq!(backward.keys().copied().collect::<Vec<_>>(), ids);
    let middle: Vec<JobId> = backward
        .range(ids[10]..ids[20])
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(middle, ids[10..20]);
    let last_first: Vec<JobId> = backward.values().rev().map(|j| j.id).collect();
    assert_eq!(last_first, ids.iter().rev().copied().collect::<Vec<_>>());

    assert!(backward.remove(&ids[5]).is_some());
    assert!(backward.remove(&ids[5]).is_none());
    backward.retain(|id, _| id.0 % 2 == 0);
    let kept: Vec<JobId> = ids
        .iter()
        .copied()
        .filter(|id| *id != ids[5] && id.0 % 2 == 0)
        .collect();
    assert_eq!(backward.keys().copied().collect::<Vec<_>>(), kept);
    assert_eq!(backward.len(), kept.len());
    assert!(backward.check());
    assert!(backward.get(&ids[5]).is_none() && backward.get(&kept[0]).is_some());
}
