//! The agents API against three `docket-controller` processes, with a scripted agent in the
//! test: registration with the leader, launch with the dispatch epoch, reports, kill of stale
//! runs, liveness and return to service, and reconciliation after a failover without launching
//! anything twice.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Act, Cluster, DEADLINE, act, as_user, job, list, submit};
use docket_proto::v1 as pb;
use docket_proto::v1::agents_client::AgentsClient;
use docket_proto::v1::jobs_client::JobsClient;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// The agents API at `addr`, as node `node`'s agent (its certificate).
fn client(addr: &str, node: &str) -> AgentsClient<Channel> {
    let files = common::secrets()
        .local
        .issue(&docket_auth::tls::Role::Node(node.into()), &[])
        .unwrap();
    let tls = docket_auth::tls::TlsContext::load(files).unwrap();
    AgentsClient::new(
        docket_auth::tls::connect::channel(addr, &tls, Duration::from_secs(2), None).unwrap(),
    )
}

/// A scripted agent for node `node`.
struct FakeAgent {
    node: String,
    session: String,
    client: AgentsClient<Channel>,
    stream: tonic::Streaming<pb::Instruction>,
}

impl FakeAgent {
    /// Registers with whichever replica leads (following `x-docket-leader`), holding `jobs`.
    async fn register(cluster: &Cluster, node: &str, jobs: Vec<pb::HeldJob>) -> FakeAgent {
        let start = Instant::now();
        loop {
            for addr in cluster.procs.keys().map(|id| cluster.addrs[id].clone()) {
                let mut c = client(&addr, node);
                let r = c
                    .register(pb::RegisterRequest {
                        node: node.into(),
                        cpus: 16,
                        memory_mib: 65536,
                        gpus: 0,
                        version: "test".into(),
                        jobs: jobs.clone(),
                        step_address: String::new(),
                    })
                    .await;
                match r {
                    Ok(r) => {
                        let session = r.into_inner().session;
                        let stream = c
                            .instructions(pb::InstructionsRequest {
                                node: node.into(),
                                session: session.clone(),
                            })
                            .await
                            .unwrap()
                            .into_inner();
                        return FakeAgent {
                            node: node.into(),
                            session,
                            client: c,
                            stream,
                        };
                    }
                    Err(e) if e.code() == tonic::Code::FailedPrecondition => {
                        assert!(
                            e.metadata().get(docket_proto::metadata::LEADER).is_some(),
                            "{e:?}"
                        );
                    }
                    Err(_) => {}
                }
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no leader took the registration"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn next(&mut self) -> pb::instruction::Kind {
        let i = tokio::time::timeout(DEADLINE, self.stream.next())
            .await
            .expect("no instruction in time")
            .expect("stream ended")
            .unwrap();
        i.kind.unwrap()
    }

    async fn heartbeat(&mut self, jobs: Vec<pb::HeldJob>) {
        self.client
            .heartbeat(pb::HeartbeatRequest {
                node: self.node.clone(),
                session: self.session.clone(),
                jobs,
            })
            .await
            .unwrap();
    }

    async fn ended(&mut self, job_id: u64, epoch: u64, cause: pb::EndCause, code: i32) {
        let r = self
            .client
            .report_events(pb::ReportEventsRequest {
                node: self.node.clone(),
                session: self.session.clone(),
                events: vec![pb::JobEvent {
                    job_id,
                    epoch,
                    event: Some(pb::job_event::Event::Ended(pb::Ended {
                        cause: cause.into(),
                        exit_code: code,
                        ..Default::default()
                    })),
                }],
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.errors.iter().all(String::is_empty), "{r:?}");
    }
}

async fn state_of(cluster: &Cluster, id: u64) -> String {
    let leader = cluster.leader().await;
    let mut c = cluster.jobs(leader).await;
    let j = list(
        &mut c,
        "alice",
        pb::ListJobsRequest {
            job_ids: vec![id],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    j[0].state.clone()
}

async fn wait_state(cluster: &Cluster, id: u64, want: &str) {
    let start = Instant::now();
    loop {
        let s = state_of(cluster, id).await;
        if s == want {
            return;
        }
        assert!(start.elapsed() < DEADLINE, "job {id} is {s}, never {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The test site with each `(from, to)` replaced (each must be there), written into `dir`.
fn site_with(dir: &tempfile::TempDir, changes: &[(&str, &str)]) -> std::path::PathBuf {
    let mut site = std::fs::read_to_string(common::site_config()).unwrap();
    for (from, to) in changes {
        assert!(site.contains(from), "the test site has no {from:?}");
        site = site.replace(from, to);
    }
    let config = dir.path().join("site.toml");
    std::fs::write(&config, site).unwrap();
    config
}

fn pinned(name: &str, node: &str) -> pb::JobSpec {
    let mut j = job(name, "big");
    j.nodelist = vec![node.into()];
    j.cpus_per_task = 4;
    j
}

/// Submits `spec` as alice through `jobs`; its id.
async fn submit_one(jobs: &mut JobsClient<Channel>, spec: pb::JobSpec) -> u64 {
    let r = submit(jobs, "alice", vec![spec]).await.unwrap();
    let Some(pb::submit_result::Result::JobId(id)) = r[0].result else {
        panic!("{r:?}")
    };
    id
}

/// The next instruction to `agent`, which must be a launch (else a panic saying `what`).
async fn expect_launch(agent: &mut FakeAgent, what: &str) -> pb::Launch {
    let pb::instruction::Kind::Launch(l) = agent.next().await else {
        panic!("{what}")
    };
    l
}

/// The next instruction to `agent`, which must be a kill (else a panic saying `what`).
async fn expect_kill(agent: &mut FakeAgent, what: &str) -> pb::JobControl {
    let pb::instruction::Kind::Kill(k) = agent.next().await else {
        panic!("{what}")
    };
    k
}

/// Waits until every node but g01 is down, `agent` heartbeating `held` meanwhile.
async fn wait_silent_nodes_down(
    cluster: &Cluster,
    leader: u64,
    agent: &mut FakeAgent,
    held: &[pb::HeldJob],
) {
    let start = Instant::now();
    let mut admin = cluster.admin(leader).await;
    loop {
        agent.heartbeat(held.to_vec()).await;
        let nodes = admin
            .list_nodes(as_user("alice", pb::ListNodesRequest {}))
            .await
            .unwrap()
            .into_inner()
            .nodes;
        let down: Vec<&str> = nodes
            .iter()
            .filter(|n| n.state == "down")
            .map(|n| n.name.as_str())
            .collect();
        if down.len() == nodes.len() - 1 {
            assert!(!down.contains(&"g01"), "{down:?}");
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "silent nodes never went down: {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks `agent`'s report of job `id`'s end with an unknown cause is refused naming the cause.
async fn check_bad_cause_is_named(agent: &mut FakeAgent, id: u64, epoch: u64) {
    let r = agent
        .client
        .report_events(pb::ReportEventsRequest {
            node: "g01".into(),
            session: agent.session.clone(),
            events: vec![pb::JobEvent {
                job_id: id,
                epoch,
                event: Some(pb::job_event::Event::Ended(pb::Ended {
                    cause: 99,
                    ..Default::default()
                })),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.errors[0].contains("cause"), "{r:?}");
}

/// Alice sets job `id`'s time limit to `seconds`.
async fn set_time_limit(
    jobs: &mut JobsClient<Channel>,
    id: u64,
    seconds: i64,
) -> pb::PerJobResponse {
    let request = pb::UpdateJobsRequest {
        jobs: vec![pb::JobRef {
            job_id: id,
            task: None,
        }],
        time_limit_seconds: Some(seconds),
        ..Default::default()
    };
    jobs.update_jobs(as_user("alice", request))
        .await
        .unwrap()
        .into_inner()
}

/// Alice requeues job `id`.
async fn requeue(jobs: &mut JobsClient<Channel>, id: u64) -> pb::PerJobResponse {
    let request = pb::JobsRequest {
        jobs: vec![pb::JobRef {
            job_id: id,
            task: None,
        }],
    };
    jobs.requeue_jobs(as_user("alice", request))
        .await
        .unwrap()
        .into_inner()
}

/// Runs a second job on `agent`: its limit lowered (not raised) by alice, requeued, completed.
async fn a_second_job_is_limited_requeued_and_completes(
    cluster: &Cluster,
    agent: &mut FakeAgent,
    jobs: &mut JobsClient<Channel>,
) {
    let id2 = submit_one(jobs, pinned("two", "g01")).await;
    let l = expect_launch(agent, "expected a launch").await;
    assert_eq!(l.job_id, id2);
    assert_eq!(l.time_limit_seconds, 600);
    // Its owner lowers its time limit: the agent is told.
    let r = set_time_limit(jobs, id2, 300).await;
    assert!(r.results[0].error.is_empty(), "{r:?}");
    let pb::instruction::Kind::TimeLimit(t) = agent.next().await else {
        panic!("expected the new time limit")
    };
    assert_eq!(
        (t.job_id, t.epoch, t.time_limit_seconds),
        (id2, l.epoch, 300)
    );
    // Raising it back is for administrators.
    let r = set_time_limit(jobs, id2, 900).await;
    assert!(r.results[0].error.contains("administrator"), "{r:?}");
    // Requeued by its owner: killed, back in the queue, and launched again under a new epoch.
    let r = requeue(jobs, id2).await;
    assert!(r.results[0].error.is_empty(), "{r:?}");
    let k = expect_kill(agent, "expected the requeue's kill").await;
    assert_eq!((k.job_id, k.epoch), (id2, l.epoch));
    agent.ended(id2, l.epoch, pb::EndCause::Cancelled, 0).await;
    let again = expect_launch(agent, "expected the requeued job's new launch").await;
    assert_eq!(again.job_id, id2);
    assert!(again.epoch > l.epoch, "{} <= {}", again.epoch, l.epoch);
    agent
        .ended(id2, again.epoch, pb::EndCause::Completed, 0)
        .await;
    wait_state(cluster, id2, "COMPLETED").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_get_launches_with_epochs_report_ends_and_survive_a_failover() {
    let mut cluster = Cluster::start_with(
        3,
        &[
            "--agent-fence-ms",
            "1500",
            "--node-down-margin-ms",
            "1000",
            "--agent-heartbeat-ms",
            "200",
        ],
    )
    .await;
    // A stale run the agent still holds from before (epoch 1 of a job that is not there).
    let stale = pb::HeldJob {
        job_id: 9999,
        epoch: 1,
        running: true,
        suspended: false,
    };
    let mut agent = FakeAgent::register(&cluster, "g01", vec![stale]).await;
    let k = expect_kill(&mut agent, "the stale run was not killed").await;
    assert_eq!((k.job_id, k.epoch), (9999, 1));
    assert!(k.reason.contains("stale"), "{k:?}");

    // A job for g01 is launched there with its epoch, script and share.
    let leader = cluster.leader().await;
    let mut jobs = cluster.jobs(leader).await;
    let id = submit_one(&mut jobs, pinned("one", "g01")).await;
    let l = expect_launch(&mut agent, "expected a launch").await;
    assert_eq!(l.job_id, id);
    assert!(l.epoch > 0);
    assert_eq!(l.cpus, 4);
    assert_eq!(l.node_list, "g01");
    assert_eq!(l.user, "alice");
    assert!(l.script.starts_with(b"#!/bin/sh"));
    let epoch = l.epoch;
    let held = vec![pb::HeldJob {
        job_id: id,
        epoch,
        running: true,
        suspended: false,
    }];
    agent.heartbeat(held.clone()).await;

    // Nodes nobody's agent speaks for are declared down after fence + margin; g01 is not.
    wait_silent_nodes_down(&cluster, leader, &mut agent, &held).await;

    // The leader dies. The agent registers with the new one, holding the run: the new
    // leader reconciles and does not launch it again.
    cluster.kill(leader);
    let mut agent = FakeAgent::register(&cluster, "g01", held.clone()).await;
    agent.heartbeat(held.clone()).await;
    // Cancel it: the only instruction that comes is the kill of that run.
    let new_leader = cluster.leader().await;
    let mut jobs = cluster.jobs(new_leader).await;
    let r = act(&mut jobs, "alice", Act::Cancel, &[id]).await.unwrap();
    assert!(r[0].error.is_empty(), "{r:?}");
    let k = expect_kill(&mut agent, "expected the kill, not a second launch").await;
    assert_eq!((k.job_id, k.epoch), (id, epoch));
    agent.ended(id, epoch, pb::EndCause::Cancelled, 0).await;
    wait_state(&cluster, id, "CANCELLED").await;

    // A report under an old epoch is ignored; a bad cause is named.
    check_bad_cause_is_named(&mut agent, id, epoch).await;

    // A second job runs to completion.
    a_second_job_is_limited_requeued_and_completes(&cluster, &mut agent, &mut jobs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_node_or_session_is_refused() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let mut c = client(&cluster.addrs[&leader], "nosuch");
    let e = c
        .register(pb::RegisterRequest {
            node: "nosuch".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let mut c = client(&cluster.addrs[&leader], "n01");
    let e = c
        .heartbeat(pb::HeartbeatRequest {
            node: "n01".into(),
            session: "forged".into(),
            jobs: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("register again"), "{e}");
}

/// An agent speaks for the node its certificate names, and only for it: g01's certificate
/// cannot register as g02, and g01 cannot report the end of a run dispatched to g02.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_certificate_speaks_for_its_node_only() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    // g01's certificate, claiming g02.
    let mut as_g01 = client(&cluster.addrs[&leader], "g01");
    let e = as_g01
        .register(pb::RegisterRequest {
            node: "g02".into(),
            cpus: 16,
            memory_mib: 65536,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("cannot speak for node g02"), "{e}");
    // A tool's certificate is no agent's.
    let tool = AgentsClient::new(common::channel(&cluster.addrs[&leader]));
    let e = tool
        .clone()
        .register(pb::RegisterRequest {
            node: "g01".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");

    // A job runs on g02; g01, registered as itself, reports it ended.
    let mut g02 = FakeAgent::register(&cluster, "g02", vec![]).await;
    let mut g01 = FakeAgent::register(&cluster, "g01", vec![]).await;
    let mut jobs = cluster.jobs(cluster.leader().await).await;
    let r = submit(&mut jobs, "alice", vec![pinned("on-g02", "g02")])
        .await
        .unwrap();
    let Some(pb::submit_result::Result::JobId(id)) = r[0].result else {
        panic!("{r:?}")
    };
    let pb::instruction::Kind::Launch(l) = g02.next().await else {
        panic!("expected the launch on g02")
    };
    assert_eq!(l.job_id, id);
    wait_state(&cluster, id, "RUNNING").await;
    let r = g01
        .client
        .report_events(pb::ReportEventsRequest {
            node: "g01".into(),
            session: g01.session.clone(),
            events: vec![pb::JobEvent {
                job_id: id,
                epoch: l.epoch,
                event: Some(pb::job_event::Event::Ended(pb::Ended {
                    cause: pb::EndCause::Completed.into(),
                    ..Default::default()
                })),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.errors[0].contains("is on node g02"), "{r:?}");
    // Its certificate cannot carry the report in g02's name either.
    let e = g01
        .client
        .report_events(pb::ReportEventsRequest {
            node: "g02".into(),
            session: g02.session.clone(),
            events: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(state_of(&cluster, id).await, "RUNNING", "nothing changed");
    // g02 itself may.
    g02.ended(id, l.epoch, pb::EndCause::Completed, 0).await;
    wait_state(&cluster, id, "COMPLETED").await;
}

/// The tasks of step `step` on `agent`'s node ended, as its agent reports.
async fn step_ended(agent: &mut FakeAgent, job_id: u64, epoch: u64, step: u32, code: i32) {
    let r = agent
        .client
        .report_events(pb::ReportEventsRequest {
            node: agent.node.clone(),
            session: agent.session.clone(),
            events: vec![pb::JobEvent {
                job_id,
                epoch,
                event: Some(pb::job_event::Event::StepEnded(pb::StepEnded {
                    step_id: step,
                    ended: Some(pb::Ended {
                        cause: pb::EndCause::Completed.into(),
                        exit_code: code,
                        cpu_time_ms: 250,
                        ..Default::default()
                    }),
                })),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.errors.iter().all(String::is_empty), "{r:?}");
}

async fn steps_of(cluster: &Cluster, id: u64) -> Vec<pb::StepInfo> {
    let mut c = cluster.jobs(cluster.leader().await).await;
    let req = as_user(
        "alice",
        pb::GetJobRequest {
            job_id: id,
            ..Default::default()
        },
    );
    c.get_job(req).await.unwrap().into_inner().steps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_ends_when_each_of_its_nodes_reported_its_own_tasks() {
    let cluster = Cluster::start(3).await;
    let mut g01 = FakeAgent::register(&cluster, "g01", vec![]).await;
    let mut g02 = FakeAgent::register(&cluster, "g02", vec![]).await;
    let mut jobs = cluster.jobs(cluster.leader().await).await;
    let mut spec = job("two-nodes", "big");
    spec.nodes = 2;
    spec.ntasks = 2;
    spec.nodelist = vec!["g01".into(), "g02".into()];
    let r = submit(&mut jobs, "alice", vec![spec]).await.unwrap();
    let Some(pb::submit_result::Result::JobId(id)) = r[0].result else {
        panic!("{r:?}")
    };
    let pb::instruction::Kind::Launch(l) = g01.next().await else {
        panic!("expected the launch on g01")
    };
    wait_state(&cluster, id, "RUNNING").await;
    let step = |ntasks, nodelist: Vec<String>| {
        as_user(
            "alice",
            pb::CreateStepRequest {
                job_id: id,
                name: "hostname".into(),
                ntasks: Some(ntasks),
                overlap: !nodelist.is_empty(),
                nodelist,
                io_key: vec![3; 32],
                ..Default::default()
            },
        )
    };
    // The job has one cpu on each node: step 0 takes both, step 1 shares g01's.
    let s0 = jobs
        .create_step(step(2, vec![]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s0.layout.len(), 2, "{s0:?}");
    let s1 = jobs
        .create_step(step(1, vec!["g01".into()]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s1.step_id, 1);

    // g02 has no task of step 1: its report is refused and changes nothing.
    step_ended(&mut g02, id, l.epoch, 1, 0).await;
    // Step 0 waits for both nodes.
    step_ended(&mut g01, id, l.epoch, 0, 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let states: Vec<String> = steps_of(&cluster, id)
        .await
        .into_iter()
        .map(|s| s.state)
        .collect();
    assert_eq!(states, ["RUNNING", "RUNNING"]);
    step_ended(&mut g02, id, l.epoch, 0, 3).await;
    step_ended(&mut g01, id, l.epoch, 1, 0).await;
    let start = Instant::now();
    loop {
        let steps = steps_of(&cluster, id).await;
        let got: Vec<(&str, Option<i32>, u64)> = steps
            .iter()
            .map(|s| (s.state.as_str(), s.exit_code, s.cpu_time_ms))
            .collect();
        if got == [("FAILED", Some(3), 500), ("COMPLETED", Some(0), 250)] {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "{got:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The job itself runs on.
    assert_eq!(state_of(&cluster, id).await, "RUNNING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waiting_for_cpus_starts_when_the_end_that_frees_them_commits() {
    // Timed passes an hour apart: only a pass that the end itself wakes can start the job
    // waiting behind it before the deadline.
    let dir = tempfile::tempdir().unwrap();
    let config = site_with(
        &dir,
        &[
            ("sched_interval = 1", "sched_interval = 3600"),
            ("bf_interval = 1", "bf_interval = 3600"),
        ],
    );
    let cluster = Cluster::start_custom(1, config, &["--agent-fence-ms", "0"]).await;
    let mut agent = FakeAgent::register(&cluster, "g01", Vec::new()).await;
    let leader = cluster.leader().await;
    let mut jobs = cluster.jobs(leader).await;
    let whole_node = |name: &str| {
        let mut j = pinned(name, "g01");
        j.cpus_per_task = 16;
        j
    };
    let mut submit_one = async |name: &str| {
        let r = submit(&mut jobs, "alice", vec![whole_node(name)])
            .await
            .unwrap();
        let Some(pb::submit_result::Result::JobId(id)) = r[0].result else {
            panic!("{r:?}")
        };
        id
    };
    let first = submit_one("first").await;
    let pb::instruction::Kind::Launch(l) = agent.next().await else {
        panic!("expected the first job's launch")
    };
    assert_eq!(l.job_id, first);
    let second = submit_one("second").await;
    wait_state(&cluster, first, "RUNNING").await;
    assert_eq!(state_of(&cluster, second).await, "PENDING");
    agent
        .ended(first, l.epoch, pb::EndCause::Completed, 0)
        .await;
    let pb::instruction::Kind::Launch(next) = agent.next().await else {
        panic!("expected the second job's launch")
    };
    assert_eq!(next.job_id, second);
    wait_state(&cluster, second, "RUNNING").await;
}

/// A suspension told on one stream and undone while the agent was away (its stream broken,
/// as in a partition) reaches the agent as a resume on its next stream: the state says
/// RUNNING, so a run left frozen would never end. And a run that started and was suspended
/// while the agent was away is launched before it is frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_suspended_or_resumed_while_their_agent_was_away_are_right_when_it_comes_back() {
    let cluster = Cluster::start_with(1, &["--agent-fence-ms", "0"]).await;
    let mut agent = FakeAgent::register(&cluster, "g01", Vec::new()).await;
    let leader = cluster.leader().await;
    let mut jobs = cluster.jobs(leader).await;
    let id = submit_one(&mut jobs, pinned("frozen", "g01")).await;
    let l = expect_launch(&mut agent, "expected the launch").await;
    let held = |suspended| {
        vec![pb::HeldJob {
            job_id: id,
            epoch: l.epoch,
            running: true,
            suspended,
        }]
    };
    agent.heartbeat(held(false)).await;
    let r = act(&mut jobs, "root", Act::Suspend, &[id]).await.unwrap();
    assert!(r[0].error.is_empty(), "{r:?}");
    let pb::instruction::Kind::Suspend(s) = agent.next().await else {
        panic!("expected the suspension")
    };
    assert_eq!((s.job_id, s.epoch), (id, l.epoch));
    drop(agent);
    let r = act(&mut jobs, "root", Act::Resume, &[id]).await.unwrap();
    assert!(r[0].error.is_empty(), "{r:?}");
    wait_state(&cluster, id, "RUNNING").await;
    let mut agent = FakeAgent::register(&cluster, "g01", held(true)).await;
    let pb::instruction::Kind::Resume(r) = agent.next().await else {
        panic!("expected a resume, not a launch")
    };
    assert_eq!((r.job_id, r.epoch), (id, l.epoch));
    // Held as running on the next stream, it is told nothing.
    drop(agent);
    let mut agent = FakeAgent::register(&cluster, "g01", held(false)).await;
    agent.heartbeat(held(false)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), agent.stream.next())
            .await
            .is_err(),
        "an instruction for a run the agent holds as wanted"
    );
    agent.ended(id, l.epoch, pb::EndCause::Completed, 0).await;
    wait_state(&cluster, id, "COMPLETED").await;

    // A job started while the agent is away and suspended before it comes back: launched
    // on the next stream, then frozen (not only told to suspend a run it never had).
    drop(agent);
    let id = submit_one(&mut jobs, pinned("away", "g01")).await;
    wait_state(&cluster, id, "RUNNING").await;
    let r = act(&mut jobs, "root", Act::Suspend, &[id]).await.unwrap();
    assert!(r[0].error.is_empty(), "{r:?}");
    let mut agent = FakeAgent::register(&cluster, "g01", Vec::new()).await;
    let l = expect_launch(&mut agent, "expected the launch of the suspended job").await;
    assert_eq!(l.job_id, id);
    let pb::instruction::Kind::Suspend(s) = agent.next().await else {
        panic!("expected the suspension after the launch")
    };
    assert_eq!((s.job_id, s.epoch), (id, l.epoch));
}

/// The backfill order in the live controller (the planners `docket sim` replays with):
/// node g01 (16 cpus) runs an 8-cpu job for up to 10 minutes; a 16-cpu job waits behind it
/// and is reserved at that job's limit; then an 8-cpu job of 9 minutes and an 8-cpu job of
/// 1 minute arrive together, both able to run before the reservation but only one at a
/// time. EASY in queue order (Slurm's) backfills the 9-minute job; with
/// `bf_order = "shortest"` (EASY++'s SJBF) the 1-minute job goes ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shortest_first_backfill_starts_the_short_job_ahead_of_where_easy_puts_it() {
    for (order, started, waiting) in [("queue", "nine", "one"), ("shortest", "one", "nine")] {
        let dir = tempfile::tempdir().unwrap();
        let config = site_with(
            &dir,
            &[(
                "bf_interval = 1\n",
                &format!("bf_interval = 1\nbf_order = \"{order}\"\n"),
            )],
        );
        let cluster = Cluster::start_custom(1, config, &["--agent-fence-ms", "0"]).await;
        let mut agent = FakeAgent::register(&cluster, "g01", Vec::new()).await;
        let leader = cluster.leader().await;
        let mut jobs = cluster.jobs(leader).await;
        let spec = |name: &str, cpus: u32, limit: i64| {
            let mut j = pinned(name, "g01");
            j.cpus_per_task = cpus;
            j.time_limit_seconds = Some(limit);
            // 1 GiB per cpu: without a memory request a job takes the whole node's.
            j.memory = Some(pb::job_spec::Memory::MemPerCpuMib(1024));
            j
        };
        let ids = |r: Vec<pb::SubmitResult>| -> Vec<u64> {
            r.into_iter()
                .map(|r| match r.result {
                    Some(pb::submit_result::Result::JobId(id)) => id,
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        let first = ids(submit(&mut jobs, "alice", vec![spec("first", 8, 600)])
            .await
            .unwrap())[0];
        let pb::instruction::Kind::Launch(l) = agent.next().await else {
            panic!("expected the first job's launch")
        };
        assert_eq!(l.job_id, first);
        wait_state(&cluster, first, "RUNNING").await;
        let head = ids(submit(&mut jobs, "alice", vec![spec("head", 16, 600)])
            .await
            .unwrap())[0];
        // One request: both wait when the next backfill pass runs.
        let pair = ids(submit(
            &mut jobs,
            "alice",
            vec![spec("nine", 8, 540), spec("one", 8, 60)],
        )
        .await
        .unwrap());
        let id_of = |name: &str| if name == "nine" { pair[0] } else { pair[1] };
        let pb::instruction::Kind::Launch(l) = agent.next().await else {
            panic!("{order}: expected a backfilled launch")
        };
        assert_eq!(l.job_id, id_of(started), "{order}: {started} backfilled");
        wait_state(&cluster, id_of(started), "RUNNING").await;
        // Two more backfill passes: the other still waits (no cpus), and so does the head.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(
            state_of(&cluster, id_of(waiting)).await,
            "PENDING",
            "{order}"
        );
        assert_eq!(state_of(&cluster, head).await, "PENDING", "{order}");
    }
}

/// The nodes' states and reasons, by name.
async fn node_states(cluster: &Cluster) -> BTreeMap<String, (String, String)> {
    let leader = cluster.leader().await;
    let mut admin = cluster.admin(leader).await;
    admin
        .list_nodes(as_user("alice", pb::ListNodesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .nodes
        .into_iter()
        .map(|n| (n.name, (n.state, n.reason)))
        .collect()
}

/// Waits until `node` is in `state`, heartbeating `agent` meanwhile (if any).
async fn wait_node(cluster: &Cluster, node: &str, state: &str, mut agent: Option<&mut FakeAgent>) {
    let start = Instant::now();
    loop {
        if let Some(agent) = agent.as_deref_mut() {
            agent.heartbeat(vec![]).await;
        }
        let nodes = node_states(cluster).await;
        if nodes.get(node).is_some_and(|(s, _)| s == state) {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{node} never became {state}: {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

const FAST_LIVENESS: [&str; 6] = [
    "--agent-fence-ms",
    "1000",
    "--node-down-margin-ms",
    "500",
    "--agent-heartbeat-ms",
    "200",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_for_not_responding_returns_when_its_agent_does_keeping_its_drain() {
    let cluster = Cluster::start_with(1, &FAST_LIVENESS).await;
    // g02 drained by an administrator, then silent long enough to be declared down.
    let leader = cluster.leader().await;
    let mut admin = cluster.admin(leader).await;
    admin
        .drain_node(as_user(
            "root",
            pb::DrainNodeRequest {
                node: "g02".into(),
                reason: "firmware".into(),
            },
        ))
        .await
        .unwrap();
    wait_node(&cluster, "g01", "down", None).await;
    wait_node(&cluster, "g02", "down", None).await;
    let (_, reason) = node_states(&cluster).await["g01"].clone();
    assert!(reason.starts_with("agent not responding"), "{reason}");

    // g01's agent comes back: g01 returns to service, with no reason left.
    let mut g01 = FakeAgent::register(&cluster, "g01", vec![]).await;
    wait_node(&cluster, "g01", "idle", Some(&mut g01)).await;
    assert_eq!(node_states(&cluster).await["g01"].1, "");
    // And takes jobs again.
    let mut jobs = cluster.jobs(cluster.leader().await).await;
    let r = submit(&mut jobs, "alice", vec![pinned("after", "g01")])
        .await
        .unwrap();
    let Some(pb::submit_result::Result::JobId(id)) = r[0].result else {
        panic!("{r:?}")
    };
    let pb::instruction::Kind::Launch(l) = g01.next().await else {
        panic!("expected a launch on the returned node")
    };
    assert_eq!(l.job_id, id);

    // g02's agent comes back: the down is cleared, the administrator's drain stays.
    let mut g02 = FakeAgent::register(&cluster, "g02", vec![]).await;
    wait_node(&cluster, "g02", "drain", Some(&mut g02)).await;
    assert_eq!(node_states(&cluster).await["g02"].1, "firmware");

    // Silent again, down again: a returned node is watched as before.
    drop(g02);
    wait_node(&cluster, "g02", "down", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_return_to_service_0_a_down_node_waits_for_an_administrator() {
    let mut args = FAST_LIVENESS.to_vec();
    args.extend(["--return-to-service", "0"]);
    let cluster = Cluster::start_with(1, &args).await;
    wait_node(&cluster, "g01", "down", None).await;
    let mut g01 = FakeAgent::register(&cluster, "g01", vec![]).await;
    // Heard from for several liveness rounds (500 ms each), still down.
    for _ in 0..10 {
        g01.heartbeat(vec![]).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (state, reason) = node_states(&cluster).await["g01"].clone();
    assert_eq!(state, "down", "{reason}");
    // The administrator resumes it.
    let mut admin = cluster.admin(cluster.leader().await).await;
    admin
        .resume_node(as_user("root", pb::NodeRequest { node: "g01".into() }))
        .await
        .unwrap();
    wait_node(&cluster, "g01", "idle", Some(&mut g01)).await;
}

#[test]
fn return_to_service_takes_slurm_s_values_and_names_the_field_otherwise() {
    use docket_controller::agents::ReturnToService;
    assert_eq!("0".parse(), Ok(ReturnToService::Never));
    assert_eq!("1".parse(), Ok(ReturnToService::NotResponding));
    assert_eq!("2".parse(), Ok(ReturnToService::AnyReason));
    let e = "yes".parse::<ReturnToService>().unwrap_err();
    assert!(
        e.contains("return_to_service") && e.contains("\"yes\""),
        "{e}"
    );
    assert!(ReturnToService::NotResponding.returns("agent not responding for 30 s"));
    assert!(!ReturnToService::NotResponding.returns("power"));
    assert!(ReturnToService::AnyReason.returns("power"));
    assert!(!ReturnToService::Never.returns("agent not responding for 30 s"));
}
