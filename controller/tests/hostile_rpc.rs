//! Generated hostile requests to every gRPC method, through the real services of a running
//! replica: valid requests of each method, mutated at the byte level (bytes flipped, cut
//! short, slices repeated, varints claiming huge lengths), sent raw by callers of every kind
//! (a user, root, a node agent, a peer replica).
//!
//! What must hold: the replica answers every call with a response or a status, never
//! `UNKNOWN` or `INTERNAL` (a panic or an unhandled error in a handler), it stays up, its
//! memory stays bounded, and afterwards it still serves an ordinary request.
//! `DOCKET_FUZZ_SEED` (a number, or `random`) picks the generator's seed, fixed by default.
//! `DOCKET_FUZZ_CASES` sets the calls per method (64 by default, what CI runs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Cluster, credential, job, secrets};
use docket_auth::tls::{Role, TlsContext};
use docket_proto::raw::RawCodec;
use docket_proto::v1 as pb;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use prost::Message;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

/// Who calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Caller {
    User,
    Root,
    Node,
    Peer,
}

/// A method's path, who calls it, and valid requests of it to mutate.
type Method = (&'static str, Caller, Vec<Vec<u8>>);

/// Every unary method, with valid requests to mutate and who calls it.
fn methods() -> Vec<Method> {
    [
        job_control_methods(),
        job_query_methods(),
        admin_methods(),
        agent_health_and_raft_methods(),
    ]
    .concat()
}

/// Two job references: job 1, and task 1 of job 2.
fn job_refs() -> Vec<u8> {
    pb::JobsRequest {
        jobs: vec![
            pb::JobRef {
                job_id: 1,
                task: None,
            },
            pb::JobRef {
                job_id: 2,
                task: Some(1),
            },
        ],
    }
    .encode_to_vec()
}

/// The Jobs methods that submit or change jobs.
fn job_control_methods() -> Vec<Method> {
    let submit = pb::SubmitJobsRequest {
        jobs: vec![job("fuzz", ""), {
            let mut j = job("fuzz-array", "");
            j.array = "0-3%2".into();
            j.dependency = "afterok:1".into();
            j
        }],
    }
    .encode_to_vec();
    let jobs = job_refs();
    let e = Vec::new();
    use Caller::*;
    vec![
        ("/docket.v1.Jobs/SubmitJobs", User, vec![submit, e.clone()]),
        ("/docket.v1.Jobs/CancelJobs", User, vec![jobs.clone()]),
        ("/docket.v1.Jobs/HoldJobs", User, vec![jobs.clone()]),
        ("/docket.v1.Jobs/ReleaseJobs", User, vec![jobs.clone()]),
        ("/docket.v1.Jobs/RequeueJobs", Root, vec![jobs.clone()]),
        (
            "/docket.v1.Jobs/UpdateJobs",
            User,
            vec![
                pb::UpdateJobsRequest {
                    jobs: vec![pb::JobRef {
                        job_id: 1,
                        task: None,
                    }],
                    nice: Some(5),
                    ..Default::default()
                }
                .encode_to_vec(),
            ],
        ),
        ("/docket.v1.Jobs/SuspendJobs", Root, vec![jobs.clone()]),
        ("/docket.v1.Jobs/ResumeJobs", Root, vec![jobs.clone()]),
        (
            "/docket.v1.Jobs/SignalJobs",
            User,
            vec![
                pb::SignalJobsRequest {
                    jobs: vec![pb::JobRef {
                        job_id: 1,
                        task: None,
                    }],
                    signal: 10,
                }
                .encode_to_vec(),
            ],
        ),
    ]
}

/// The Jobs methods that read jobs and accounts, and those of steps and of a job's end.
fn job_query_methods() -> Vec<Method> {
    let list = pb::ListJobsRequest {
        users: vec!["alice".into()],
        states: vec!["PD".into()],
        ..Default::default()
    }
    .encode_to_vec();
    let e = Vec::new();
    use Caller::*;
    vec![
        (
            "/docket.v1.Jobs/GetJob",
            User,
            vec![
                pb::GetJobRequest {
                    job_id: 1,
                    ..Default::default()
                }
                .encode_to_vec(),
            ],
        ),
        ("/docket.v1.Jobs/ListJobs", User, vec![list]),
        ("/docket.v1.Jobs/ExplainPriority", User, vec![e.clone()]),
        (
            "/docket.v1.Jobs/Accounting",
            User,
            vec![
                pb::AccountingRequest {
                    users: vec!["alice".into()],
                    page_size: 10,
                    ..Default::default()
                }
                .encode_to_vec(),
            ],
        ),
        ("/docket.v1.Jobs/ShareTree", User, vec![e.clone()]),
        ("/docket.v1.Jobs/Associations", User, vec![e.clone()]),
        (
            "/docket.v1.Jobs/CreateStep",
            User,
            vec![
                pb::CreateStepRequest {
                    job_id: 1,
                    ntasks: Some(2),
                    ..Default::default()
                }
                .encode_to_vec(),
            ],
        ),
        ("/docket.v1.Jobs/CancelSteps", User, vec![e.clone()]),
        (
            "/docket.v1.Jobs/CompleteJob",
            User,
            vec![
                pb::CompleteJobRequest {
                    job_id: 1,
                    exit_code: 3,
                    signal: 0,
                }
                .encode_to_vec(),
            ],
        ),
    ]
}

/// The Admin methods.
fn admin_methods() -> Vec<Method> {
    let e = Vec::new();
    use Caller::*;
    vec![
        ("/docket.v1.Admin/ClusterStatus", Root, vec![e.clone()]),
        ("/docket.v1.Admin/AddReplica", User, vec![e.clone()]),
        ("/docket.v1.Admin/RemoveReplica", User, vec![e.clone()]),
        ("/docket.v1.Admin/GetConfig", Root, vec![e.clone()]),
        (
            "/docket.v1.Admin/ApplyConfig",
            Root,
            vec![
                pb::ApplyConfigRequest {
                    toml: "[[accounts]]\nName = \"fz\"\n".into(),
                    objects_only: true,
                    dry_run: true,
                }
                .encode_to_vec(),
            ],
        ),
        (
            "/docket.v1.Admin/RemoveObject",
            Root,
            vec![
                pb::RemoveObjectRequest {
                    kind: "account".into(),
                    name: "nope".into(),
                    ..Default::default()
                }
                .encode_to_vec(),
            ],
        ),
        (
            "/docket.v1.Admin/DrainNode",
            Root,
            vec![
                pb::DrainNodeRequest {
                    node: "n01".into(),
                    reason: "fuzz".into(),
                }
                .encode_to_vec(),
            ],
        ),
        (
            "/docket.v1.Admin/ResumeNode",
            Root,
            vec![pb::NodeRequest { node: "n01".into() }.encode_to_vec()],
        ),
        ("/docket.v1.Admin/ListNodes", User, vec![e.clone()]),
        ("/docket.v1.Admin/ListPartitions", User, vec![e.clone()]),
        (
            "/docket.v1.Admin/UpsertReservation",
            Root,
            vec![
                pb::Reservation {
                    name: "r".into(),
                    nodes: "n[01-04]".into(),
                    start_unix_ms: 1,
                    end_unix_ms: 2,
                    ..Default::default()
                }
                .encode_to_vec(),
            ],
        ),
        ("/docket.v1.Admin/ListReservations", User, vec![e.clone()]),
        (
            "/docket.v1.Admin/SchedulerDiagnostics",
            User,
            vec![e.clone()],
        ),
    ]
}

/// The Agents, Health and Raft methods.
fn agent_health_and_raft_methods() -> Vec<Method> {
    let e = Vec::new();
    use Caller::*;
    vec![
        (
            "/docket.v1.Agents/Register",
            Node,
            vec![
                pb::RegisterRequest {
                    node: "n01".into(),
                    cpus: 8,
                    memory_mib: 16384,
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }
                .encode_to_vec(),
            ],
        ),
        (
            "/docket.v1.Agents/Heartbeat",
            Node,
            vec![
                pb::HeartbeatRequest {
                    node: "n01".into(),
                    session: "s".into(),
                    jobs: Vec::new(),
                }
                .encode_to_vec(),
            ],
        ),
        (
            "/docket.v1.Agents/ReportEvents",
            Node,
            vec![
                pb::ReportEventsRequest {
                    node: "n01".into(),
                    session: "s".into(),
                    events: Vec::new(),
                }
                .encode_to_vec(),
            ],
        ),
        ("/docket.v1.Health/Check", User, vec![e.clone()]),
        (
            "/docket.v1.Raft/AppendEntries",
            Peer,
            raft::append_entries(),
        ),
        ("/docket.v1.Raft/Vote", Peer, raft::vote()),
        ("/docket.v1.Raft/InstallSnapshot", Peer, vec![e.clone()]),
        ("/docket.v1.Raft/Forward", Peer, raft::forward()),
        ("/docket.v1.Raft/ReadIndex", Peer, raft::read_index()),
        (
            "/docket.v1.Raft/ConfirmLeader",
            Peer,
            raft::confirm_leader(),
        ),
        ("/docket.v1.Raft/Status", Peer, vec![e]),
    ]
}

/// Valid Raft requests of a peer (replica 9, not a member) in a stale term, as the Raft
/// service decodes them: postcard inside a `RaftPayload`.
mod raft {
    use docket_controller::machine::CoreMachine;
    use docket_core::job::{BlobId, JobSpec};
    use docket_core::{Command, Envelope};
    use docket_raft::codec::encode;
    use docket_raft::read_index::{ConfirmLeaderRequest, ReadIndexRequest};
    use docket_raft::{Batch, ReplicaId, TypeConfig};
    use openraft::raft::{AppendEntriesRequest, VoteRequest};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LeaderId, LogId, Vote};
    use prost::Message;

    use super::pb;

    fn payload(data: Vec<u8>) -> Vec<u8> {
        pb::RaftPayload { data }.encode_to_vec()
    }

    pub fn vote() -> Vec<Vec<u8>> {
        vote_as(9)
    }

    /// A vote request of a candidate claiming to be replica `id`.
    pub fn vote_as(id: u64) -> Vec<Vec<u8>> {
        let request = VoteRequest::<ReplicaId>::new(Vote::new(0, ReplicaId(id)), None);
        vec![payload(encode(&request).unwrap())]
    }

    pub fn append_entries() -> Vec<Vec<u8>> {
        append_entries_as(9)
    }

    /// An append of a leader claiming to be replica `id`.
    pub fn append_entries_as(id: u64) -> Vec<Vec<u8>> {
        let entry = Entry::<TypeConfig<CoreMachine>> {
            log_id: LogId::new(CommittedLeaderId::new(0, ReplicaId(id)), 0),
            payload: EntryPayload::Normal(Batch {
                time_ms: 1_700_000_000_000,
                commands: vec![Envelope::controller(Command::Tick)],
            }),
        };
        let request = AppendEntriesRequest::<TypeConfig<CoreMachine>> {
            vote: Vote::new_committed(0, ReplicaId(id)),
            prev_log_id: None,
            entries: vec![entry],
            leader_commit: None,
        };
        vec![payload(encode(&request).unwrap())]
    }

    pub fn read_index() -> Vec<Vec<u8>> {
        let mut seeds = read_index_as(9);
        // A replica of a release that vouched for nobody sent an empty request.
        seeds.push(payload(Vec::new()));
        seeds
    }

    /// A read-index request of a replica claiming to be replica `id`, vouching for replica
    /// 1's leadership in the current term.
    pub fn read_index_as(id: u64) -> Vec<Vec<u8>> {
        let request = ReadIndexRequest {
            from: ReplicaId(id),
            holds: Some(LeaderId::new(1, ReplicaId(1))),
        };
        vec![payload(encode(&request).unwrap())]
    }

    pub fn confirm_leader() -> Vec<Vec<u8>> {
        let request = ConfirmLeaderRequest {
            to: ReplicaId(1),
            leadership: LeaderId::new(1, ReplicaId(1)),
        };
        vec![payload(encode(&request).unwrap())]
    }

    pub fn forward() -> Vec<Vec<u8>> {
        let spec = JobSpec::simple("alice".parse().unwrap(), BlobId::of(b"#!/bin/sh\n"));
        let commands = vec![
            Envelope::controller(Command::Tick),
            Envelope::controller(Command::SubmitJobs {
                blobs: vec![b"#!/bin/sh\n".to_vec()],
                jobs: vec![spec],
            }),
        ];
        vec![payload(encode(&commands).unwrap())]
    }
}

/// A valid request, mutated.
fn mutations(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let edit = (
        0u8..5,
        any::<prop::sample::Index>(),
        any::<u8>(),
        1usize..64,
    );
    (
        any::<prop::sample::Index>(),
        proptest::collection::vec(edit, 0..6),
    )
        .prop_map(move |(seed, edits)| {
            let mut b = seeds[seed.index(seeds.len())].clone();
            for (kind, at, byte, n) in edits {
                let at = at.index(b.len() + 1);
                match kind {
                    0 if at < b.len() => b[at] = byte,
                    1 => b.truncate(at),
                    2 => {
                        // A field tag and a varint length claiming far more than follows.
                        b.splice(at..at, [byte | 2, 0xff, 0xff, 0xff, 0xff, 0x0f]);
                    }
                    3 => {
                        let end = (at + n).min(b.len());
                        let slice = b[at..end].to_vec();
                        for _ in 0..n {
                            b.splice(at..at, slice.iter().copied());
                        }
                    }
                    _ => b
                        .splice(at..at, std::iter::repeat_n(byte, n))
                        .for_each(drop),
                }
            }
            b
        })
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The calls per method: `DOCKET_FUZZ_CASES`, 64 by default.
fn fuzz_cases() -> u32 {
    std::env::var("DOCKET_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Channels to one replica as each kind of caller.
struct Callers {
    /// The harness's tool certificate: a user or root, told apart by their credentials.
    user: Channel,
    /// Node n01's agent's certificate.
    node: Channel,
    /// Replica 9's certificate (not a member).
    peer: Channel,
}

impl Callers {
    /// Connects to the replica at `addr` as each kind of caller.
    fn connect(addr: &str) -> Callers {
        let tls_of = |role: Role| {
            let files = secrets()
                .local
                .issue(&role, &["127.0.0.1".to_owned()])
                .unwrap();
            TlsContext::load(files).unwrap()
        };
        let channel_for = |tls: &TlsContext| {
            docket_auth::tls::connect::channel(addr, tls, Duration::from_secs(2), None).unwrap()
        };
        Callers {
            user: common::channel(addr),
            node: channel_for(&tls_of(Role::Node("n01".into()))),
            peer: channel_for(&tls_of(Role::Replica(9))),
        }
    }

    /// The channel `caller` calls over.
    fn of(&self, caller: Caller) -> Channel {
        match caller {
            Caller::User | Caller::Root => self.user.clone(),
            Caller::Node => self.node.clone(),
            Caller::Peer => self.peer.clone(),
        }
    }
}

/// `cases` mutations of `seeds`, drawn from the generator's seed.
fn mutated_bodies(seeds: &[Vec<u8>], cases: u32) -> Vec<Vec<u8>> {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        rng_seed: rng_seed(),
        ..Config::default()
    });
    (0..cases)
        .map(|_| {
            mutations(seeds.to_vec())
                .new_tree(&mut runner)
                .map(|t| proptest::strategy::ValueTree::current(&t))
                .unwrap()
        })
        .collect()
}

/// `body` as `caller` sends it: with alice's credential for a user, root's for root.
fn raw_request(body: Vec<u8>, caller: Caller) -> tonic::Request<Vec<u8>> {
    let mut request = tonic::Request::new(body);
    request.set_timeout(Duration::from_secs(10));
    match caller {
        Caller::User => {
            request
                .metadata_mut()
                .insert(docket_proto::metadata::CREDENTIAL, credential("alice"));
        }
        Caller::Root => {
            request
                .metadata_mut()
                .insert(docket_proto::metadata::CREDENTIAL, credential("root"));
        }
        Caller::Node | Caller::Peer => {}
    }
    request
}

/// Sends `bodies` to `path` as `caller`, checking each answer is sane; the count of each code.
///
/// Sane: a response, or a status that says something and is never `UNKNOWN` or `INTERNAL`.
async fn fuzz_method(
    channel: Channel,
    path: &'static str,
    caller: Caller,
    bodies: Vec<Vec<u8>>,
) -> BTreeMap<String, u64> {
    let mut grpc = tonic::client::Grpc::new(channel);
    let mut method_codes: BTreeMap<String, u64> = BTreeMap::new();
    for body in bodies {
        let request = raw_request(body.clone(), caller);
        grpc.ready().await.unwrap();
        let answer = grpc
            .unary::<Vec<u8>, Vec<u8>, _>(request, PathAndQuery::from_static(path), RawCodec)
            .await;
        let code = match &answer {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        };
        *method_codes.entry(format!("{code:?}")).or_default() += 1;
        if let Err(s) = &answer {
            assert!(
                !matches!(s.code(), tonic::Code::Unknown | tonic::Code::Internal),
                "{path} answered {s:?} to {body:?}"
            );
            assert!(!s.message().trim().is_empty(), "{path}: {s:?} says nothing");
        }
    }
    method_codes
}

/// Waits until replica 1 of `cluster` serves a listing again.
async fn wait_serving(cluster: &Cluster) {
    let mut jobs = cluster.jobs(1).await;
    let start = Instant::now();
    while let Err(e) = common::list(&mut jobs, "alice", pb::ListJobsRequest::default()).await {
        assert!(
            start.elapsed() < common::DEADLINE,
            "not serving after the calls: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_requests_to_every_method_are_answered_and_change_nothing_unsafe() {
    let cases = fuzz_cases();
    let cluster = Cluster::start(1).await;
    let addr = cluster.addrs[&1].clone();
    let pid = cluster.procs[&1].id();
    let callers = Callers::connect(&addr);
    let rss_before = rss_kib(pid);

    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    let mut per_method: Vec<String> = Vec::new();
    let mut calls = 0u64;
    let started = Instant::now();
    // `DOCKET_FUZZ_METHODS=Raft/` to aim at some methods only.
    let only = std::env::var("DOCKET_FUZZ_METHODS").unwrap_or_default();
    for (path, caller, seeds) in methods().into_iter().filter(|m| m.0.contains(&only)) {
        let bodies = mutated_bodies(&seeds, cases);
        let method_codes = fuzz_method(callers.of(caller), path, caller, bodies).await;
        for (code, n) in &method_codes {
            *codes.entry(code.clone()).or_default() += n;
            calls += n;
        }
        assert!(
            std::fs::metadata(format!("/proc/{pid}")).is_ok(),
            "the replica died during {path}"
        );
        per_method.push(format!("  {path} ({caller:?}): {method_codes:?}"));
    }
    println!("{}", per_method.join("\n"));
    let rss_after = rss_kib(pid);
    println!(
        "{calls} hostile calls over {} methods in {:?}: {codes:?}; replica RSS {rss_before} -> {rss_after} KiB",
        methods().len(),
        started.elapsed()
    );
    assert!(
        rss_after < 1 << 20,
        "the replica holds {rss_after} KiB after the hostile calls"
    );
    // Still serving (a peer's vote in a later term may have made it wait out an election).
    wait_serving(&cluster).await;
}

/// A replica's certificate proves which replica calls: replica 9's cannot send appends as the
/// leader replica 1, ask for votes as replica 1, nor vouch for a read index as replica 1; in
/// its own name the same calls are heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_certificate_cannot_lead_or_campaign_in_another_replica_s_name() {
    let cluster = Cluster::start(1).await;
    let addr = cluster.addrs[&1].clone();
    let files = secrets()
        .local
        .issue(&Role::Replica(9), &["127.0.0.1".to_owned()])
        .unwrap();
    let tls = TlsContext::load(files).unwrap();
    let channel =
        docket_auth::tls::connect::channel(&addr, &tls, Duration::from_secs(2), None).unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    for (path, as_1, as_9) in [
        (
            "/docket.v1.Raft/AppendEntries",
            raft::append_entries_as(1),
            raft::append_entries_as(9),
        ),
        ("/docket.v1.Raft/Vote", raft::vote_as(1), raft::vote_as(9)),
        // Vouching for the leader in replica 1's name would make up a quorum for a read.
        (
            "/docket.v1.Raft/ReadIndex",
            raft::read_index_as(1),
            raft::read_index_as(9),
        ),
    ] {
        let mut call = async |body: Vec<u8>| {
            grpc.ready().await.unwrap();
            let mut request = tonic::Request::new(body);
            request.set_timeout(Duration::from_secs(10));
            grpc.unary::<Vec<u8>, Vec<u8>, _>(request, PathAndQuery::from_static(path), RawCodec)
                .await
        };
        let refused = call(as_1[0].clone()).await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::PermissionDenied,
            "{path}: {refused:?}"
        );
        assert!(
            refused.message().contains("speaks for replica 1")
                && refused.message().contains("replica 9's"),
            "{path}: {refused:?}"
        );
        // In its own name (a stale term, not a member): heard and answered by Raft.
        let heard = call(as_9[0].clone()).await;
        assert!(
            heard.as_ref().is_ok_and(|r| !r.get_ref().is_empty()),
            "{path}: {heard:?}"
        );
    }
}

/// The generator's seed: fixed unless `DOCKET_FUZZ_SEED` names one (or `random`), so a CI
/// failure reproduces; long runs pass `random` or a seed of their own.
fn rng_seed() -> proptest::test_runner::RngSeed {
    use proptest::test_runner::RngSeed;
    match std::env::var("DOCKET_FUZZ_SEED").as_deref() {
        Ok("random") => RngSeed::Random,
        Ok(n) => n.parse().map_or(RngSeed::Fixed(20_261_126), RngSeed::Fixed),
        Err(_) => RngSeed::Fixed(20_261_126),
    }
}
