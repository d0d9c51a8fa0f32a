//! The agent binary against a small in-test leader speaking the agents protocol: real
//! processes run as the user with Slurm's and PBS's environment, exit codes and signals are
//! reported, walltime, kill, suspend/resume (walltime paused), stale epochs refused, a kill
//! of a run never held reported as cancelled.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use docket_proto::v1 as pb;
use docket_proto::v1::agents_server::{Agents, AgentsServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

const DEADLINE: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Shared {
    registered: Vec<pb::RegisterRequest>,
    events: Vec<pb::JobEvent>,
    held: Vec<pb::HeldJob>,
    tx: Option<mpsc::Sender<Result<pb::Instruction, Status>>>,
}

#[derive(Clone, Default)]
struct FakeLeader(Arc<Mutex<Shared>>);

#[tonic::async_trait]
impl Agents for FakeLeader {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        self.0.lock().unwrap().registered.push(request.into_inner());
        Ok(Response::new(pb::RegisterResponse {
            session: "s1".into(),
            heartbeat_ms: 100,
            fence_timeout_ms: 60_000,
        }))
    }
    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        self.0.lock().unwrap().held = request.into_inner().jobs;
        Ok(Response::new(pb::HeartbeatResponse {}))
    }
    type InstructionsStream = ReceiverStream<Result<pb::Instruction, Status>>;
    async fn instructions(
        &self,
        _: Request<pb::InstructionsRequest>,
    ) -> Result<Response<Self::InstructionsStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        self.0.lock().unwrap().tx = Some(tx);
        Ok(Response::new(ReceiverStream::new(rx)))
    }
    async fn report_events(
        &self,
        request: Request<pb::ReportEventsRequest>,
    ) -> Result<Response<pb::ReportEventsResponse>, Status> {
        let events = request.into_inner().events;
        let n = events.len();
        self.0.lock().unwrap().events.extend(events);
        Ok(Response::new(pb::ReportEventsResponse {
            errors: vec![String::new(); n],
        }))
    }
}

struct Agent(Child);
impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl FakeLeader {
    async fn send(&self, kind: pb::instruction::Kind) {
        let start = Instant::now();
        let tx = loop {
            if let Some(tx) = self.0.lock().unwrap().tx.clone() {
                break tx;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the agent never opened its stream"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        tx.send(Ok(pb::Instruction { kind: Some(kind) }))
            .await
            .unwrap();
    }

    async fn ended(&self, job: u64) -> (u64, pb::Ended) {
        let start = Instant::now();
        loop {
            let found = self
                .0
                .lock()
                .unwrap()
                .events
                .iter()
                .find_map(|e| match &e.event {
                    Some(pb::job_event::Event::Ended(x)) if e.job_id == job => {
                        Some((e.epoch, x.clone()))
                    }
                    _ => None,
                });
            if let Some(f) = found {
                return f;
            }
            assert!(start.elapsed() < DEADLINE, "job {job} never ended");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn started(&self, job: u64) -> bool {
        self.0
            .lock()
            .unwrap()
            .events
            .iter()
            .any(|e| e.job_id == job && matches!(e.event, Some(pb::job_event::Event::Started(_))))
    }
}

fn launch(
    job: u64,
    epoch: u64,
    dir: &std::path::Path,
    script: &str,
    limit: u64,
) -> pb::instruction::Kind {
    pb::instruction::Kind::Launch(pb::Launch {
        job_id: job,
        epoch,
        name: format!("t{job}"),
        user: "root".into(),
        account: "acct".into(),
        partition: "batch".into(),
        work_dir: dir.display().to_string(),
        script: script.as_bytes().to_vec(),
        cpus: 2,
        memory_mib: 1024,
        time_limit_seconds: limit,
        node_list: "n01".into(),
        node_count: 1,
        ntasks: 1,
        cpus_per_task: 2,
        submit_host_dir: dir.display().to_string(),
        ..Default::default()
    })
}

fn control(job: u64, epoch: u64) -> pb::JobControl {
    pb::JobControl {
        job_id: job,
        epoch,
        reason: "test".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_reports_and_controls_real_jobs() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var_os("DOCKET_REQUIRE_PRIVILEGED").is_none(),
            "DOCKET_REQUIRE_PRIVILEGED is set but this test runs as a user"
        );
        eprintln!("skipped: running jobs as another user needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let leader = FakeLeader::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentsServer::new(leader.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let _agent = Agent(
        Command::new(env!("CARGO_BIN_EXE_docket-nodeagent"))
            .args([
                "run",
                "--node",
                "n01",
                "--controllers",
                &addr,
                "--cpus",
                "2",
            ])
            .args([
                "--memory-mib",
                "1024",
                "--kill-grace-s",
                "1",
                "--log",
                "warn",
            ])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // 1. A job runs in its directory with the scheduler's environment; its output goes to
    //    slurm-%j.out; exit 0 is completed.
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    leader
        .send(launch(
            1,
            5,
            &work,
            "#!/bin/sh\necho \"id=$SLURM_JOB_ID pbs=$PBS_JOBID cpus=$SLURM_CPUS_ON_NODE nodes=$SLURM_JOB_NODELIST pwd=$(pwd)\"\ncat \"$PBS_NODEFILE\" | wc -l\n",
            60,
        ))
        .await;
    let (epoch, end) = leader.ended(1).await;
    assert_eq!(epoch, 5);
    assert_eq!(
        (end.cause.as_str(), end.exit_code, end.signal),
        ("completed", 0, 0)
    );
    assert!(leader.started(1));
    let out = std::fs::read_to_string(work.join("slurm-1.out")).unwrap();
    assert!(
        out.contains(&format!(
            "id=1 pbs=1 cpus=2 nodes=n01 pwd={}",
            work.display()
        )),
        "{out}"
    );
    assert!(out.contains('2'), "{out}");
    assert_eq!(leader.0.lock().unwrap().registered[0].node, "n01");

    // 2. A failing script: failed, with its exit code.
    leader
        .send(launch(2, 1, &work, "#!/bin/sh\nexit 3\n", 60))
        .await;
    let (_, end) = leader.ended(2).await;
    assert_eq!((end.cause.as_str(), end.exit_code), ("failed", 3));

    // 3. Walltime: SIGTERM at the limit (the script ignores nothing): timeout.
    leader
        .send(launch(3, 1, &work, "#!/bin/sh\nsleep 30\n", 1))
        .await;
    let (_, end) = leader.ended(3).await;
    assert_eq!(end.cause, "timeout", "{end:?}");

    // 4. Kill: cancelled, the whole process group (a child that ignores SIGTERM dies by the
    //    SIGKILL after the grace).
    leader
        .send(launch(
            4,
            2,
            &work,
            "#!/bin/sh\n(trap '' TERM; sleep 30) &\nwait\n",
            60,
        ))
        .await;
    let start = Instant::now();
    while !leader.started(4) {
        assert!(start.elapsed() < DEADLINE);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A stale kill (older epoch) is refused; the current one works.
    leader
        .send(pb::instruction::Kind::Kill(control(4, 1)))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !leader
            .0
            .lock()
            .unwrap()
            .events
            .iter()
            .any(|e| e.job_id == 4 && matches!(e.event, Some(pb::job_event::Event::Ended(_))))
    );
    leader
        .send(pb::instruction::Kind::Kill(control(4, 2)))
        .await;
    let (_, end) = leader.ended(4).await;
    assert_eq!(end.cause, "cancelled");

    // 5. Suspend stops the clock: a 2 s limit survives 3 s of suspension.
    leader
        .send(launch(5, 1, &work, "#!/bin/sh\nsleep 1\necho done\n", 2))
        .await;
    leader
        .send(pb::instruction::Kind::Suspend(control(5, 1)))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !leader
            .0
            .lock()
            .unwrap()
            .events
            .iter()
            .any(|e| e.job_id == 5 && matches!(e.event, Some(pb::job_event::Event::Ended(_)))),
        "ran or timed out while suspended"
    );
    leader
        .send(pb::instruction::Kind::Resume(control(5, 1)))
        .await;
    let (_, end) = leader.ended(5).await;
    assert_eq!(end.cause, "completed", "{end:?}");

    // 6. A kill for a run this node never had is reported as cancelled at once.
    leader
        .send(pb::instruction::Kind::Kill(control(99, 7)))
        .await;
    let (epoch, end) = leader.ended(99).await;
    assert_eq!((epoch, end.cause.as_str()), (7, "cancelled"));

    // 7. A second launch of a run already held does nothing.
    let before = leader.0.lock().unwrap().events.len();
    leader
        .send(launch(1, 5, &work, "#!/bin/sh\nexit 0\n", 60))
        .await;
    leader
        .send(launch(1, 4, &work, "#!/bin/sh\nexit 0\n", 60))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after: BTreeMap<u64, usize> =
        leader.0.lock().unwrap().events[before..]
            .iter()
            .fold(BTreeMap::new(), |mut m, e| {
                *m.entry(e.job_id).or_default() += 1;
                m
            });
    assert!(!after.contains_key(&1), "relaunched: {after:?}");
    server.abort();
}
