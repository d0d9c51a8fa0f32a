//! The whole path with real processes: three `docket-controller` replicas and a real
//! `docket-nodeagent` — a job submitted through the jobs API runs on the agent's node and
//! completes; the leader is killed while a job runs, the agent follows the new leader, which
//! adopts the run without launching it again, and a cancel reaches it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Act, Cluster, DEADLINE, act, job, list, submit};
use docket_proto::v1 as pb;
use docket_proto::v1::jobs_client::JobsClient;
use tonic::transport::Channel;

/// The agent binary, next to this package's binaries (the workspace test run builds it; a
/// run of this package alone builds it here).
fn agent_binary() -> PathBuf {
    let path =
        PathBuf::from(env!("CARGO_BIN_EXE_docket-controller")).with_file_name("docket-nodeagent");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "docket-nodeagent"])
            .status()
            .expect("running cargo to build docket-nodeagent");
        assert!(status.success(), "building docket-nodeagent failed");
    }
    assert!(path.exists(), "no agent binary at {}", path.display());
    path
}

struct Agent(Child);
impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_state(cluster: &Cluster, id: u64, want: &str) -> pb::JobInfo {
    let start = Instant::now();
    loop {
        let leader = cluster.leader().await;
        let mut c = cluster.jobs(leader).await;
        if let Ok(j) = list(
            &mut c,
            "nobody",
            pb::ListJobsRequest {
                job_ids: vec![id],
                ..Default::default()
            },
        )
        .await
            && let Some(j) = j.into_iter().next()
        {
            if j.state == want {
                return j;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "job {id} is {} ({}), never {want}",
                j.state,
                j.reason
            );
        }
        assert!(start.elapsed() < DEADLINE, "job {id} never {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A scratch directory like /tmp: everyone's, and sticky.
fn shared_work_dir() -> tempfile::TempDir {
    let work = tempfile::tempdir().unwrap();
    // Everyone's and sticky, like /tmp: the job's user writes here, and the agent keeps its
    // state below it (it refuses a parent others could write without the sticky bit).
    std::fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    work
}

/// Starts `agent_bin` as node n01's agent (8 cpus, 16 GiB) for `cluster`, its state in `work`.
fn start_agent(agent_bin: &std::path::Path, cluster: &Cluster, work: &std::path::Path) -> Agent {
    let controllers = cluster
        .addrs
        .values()
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    Agent(
        Command::new(agent_bin)
            .args(["run", "--node", "n01", "--controllers", &controllers])
            .args([
                "--cpus",
                "8",
                "--memory-mib",
                "16384",
                "--kill-grace-s",
                "1",
            ])
            .args(["--confinement", "none", "--log", "warn"])
            .args(["--step-listen", "127.0.0.1:0"])
            .args(common::node_flags("n01"))
            .arg("--state-dir")
            .arg(work.join("agent"))
            .arg("--runtime-dir")
            .arg(work.join("agent-run"))
            .args(["--runtime-tmpfs-mib", "0"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Submits, as the user nobody, a job named `name` running `script` on n01 in `work`; its id.
async fn submit_on_n01(
    jobs: &mut JobsClient<Channel>,
    name: &str,
    work: &std::path::Path,
    script: &[u8],
) -> u64 {
    let mut spec = job(name, "batch");
    spec.nodelist = vec!["n01".into()];
    spec.work_dir = work.display().to_string();
    spec.script = script.to_vec();
    let r = submit(jobs, "nobody", vec![spec]).await.unwrap();
    let Some(pb::submit_result::Result::JobId(id)) = r[0].result else {
        panic!("{r:?}")
    };
    id
}

/// Waits until `path` exists; `what` names what did not happen otherwise.
async fn wait_for_file(path: &std::path::Path, what: &str) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < DEADLINE, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a greeting job through `leader`, and checks it completed on n01 as the user nobody.
async fn run_a_job_to_completion(cluster: &Cluster, leader: u64, work: &std::path::Path) {
    let mut jobs = cluster.jobs(leader).await;
    let id = submit_on_n01(
        &mut jobs,
        "hello",
        work,
        b"#!/bin/sh\necho \"hello from $SLURM_JOB_ID on $SLURMD_NODENAME\"\n",
    )
    .await;
    let done = wait_state(cluster, id, "COMPLETED").await;
    assert_eq!(done.exit_code, Some(0));
    let out = std::fs::read_to_string(work.join(format!("slurm-{id}.out"))).unwrap();
    assert_eq!(out.trim(), format!("hello from {id} on n01"));
}

/// Kills `leader` under a long job, which then runs on once and is cancelled; the new leader.
async fn a_long_job_survives_a_leader_kill(
    cluster: &mut Cluster,
    leader: u64,
    work: &std::path::Path,
) -> u64 {
    let mut jobs = cluster.jobs(leader).await;
    let long = submit_on_n01(
        &mut jobs,
        "long",
        work,
        b"#!/bin/sh\necho started >> marks\nsleep 60\n",
    )
    .await;
    wait_state(cluster, long, "RUNNING").await;
    let marks = work.join("marks");
    wait_for_file(&marks, "the job never started on the agent").await;
    cluster.kill(leader);
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    // Give the agent time to find the new leader and be reconciled.
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_state(cluster, long, "RUNNING").await;
    let mut jobs = cluster.jobs(new_leader).await;
    let r = act(&mut jobs, "nobody", Act::Cancel, &[long])
        .await
        .unwrap();
    assert!(r[0].error.is_empty(), "{r:?}");
    wait_state(cluster, long, "CANCELLED").await;
    let started = std::fs::read_to_string(&marks).unwrap();
    assert_eq!(
        started.lines().count(),
        1,
        "the job ran more than once: {started:?}"
    );
    new_leader
}

/// `scancel --signal=USR1 JOB` as `user`.
fn signal_request(job_id: u64, user: &str) -> tonic::Request<pb::SignalJobsRequest> {
    let mut req = tonic::Request::new(pb::SignalJobsRequest {
        jobs: vec![pb::JobRef { job_id, task: None }],
        signal: 10,
    });
    req.metadata_mut()
        .insert(docket_proto::metadata::CREDENTIAL, common::credential(user));
    req
}

/// Checks USR1 reaches a job through `new_leader`, not from another user nor via a follower.
async fn a_signal_reaches_the_job(
    cluster: &Cluster,
    leader: u64,
    new_leader: u64,
    work: &std::path::Path,
) {
    let mut jobs = cluster.jobs(new_leader).await;
    let script = b"#!/bin/sh
trap 'echo usr1 > got-signal; exit 0' USR1
echo ready > ready
while true; do sleep 0.2; done
";
    let trapper = submit_on_n01(&mut jobs, "trapper", work, script).await;
    wait_state(cluster, trapper, "RUNNING").await;
    wait_for_file(&work.join("ready"), "the trapper never started").await;
    let follower = *cluster
        .addrs
        .keys()
        .find(|id| **id != new_leader && **id != leader)
        .unwrap();
    let mut on_follower = cluster.jobs(follower).await;
    let e = on_follower
        .signal_jobs(signal_request(trapper, "nobody"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.metadata().get(docket_proto::metadata::LEADER).is_some(),
        "{e:?}"
    );
    let r = jobs
        .signal_jobs(signal_request(trapper, "alice"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.results[0].error.contains("cannot signal"), "{r:?}");
    let r = jobs
        .signal_jobs(signal_request(trapper, "nobody"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.results[0].error.is_empty(), "{r:?}");
    let done = wait_state(cluster, trapper, "COMPLETED").await;
    assert_eq!(done.exit_code, Some(0));
    let got = std::fs::read_to_string(work.join("got-signal")).unwrap();
    assert_eq!(got.trim(), "usr1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_on_a_real_agent_and_survives_a_leader_kill() {
    let agent_bin = agent_binary();
    let mut cluster = Cluster::start_with(
        3,
        &[
            "--agent-fence-ms",
            "4000",
            "--node-down-margin-ms",
            "2000",
            "--agent-heartbeat-ms",
            "200",
        ],
    )
    .await;
    let work = shared_work_dir();
    let _agent = start_agent(&agent_bin, &cluster, work.path());

    // 1. Submitted through the API, run by the agent as the user nobody, completed.
    let leader = cluster.leader().await;
    run_a_job_to_completion(&cluster, leader, work.path()).await;

    // 2. A long job runs; the leader dies; the agent re-registers with the new leader, which
    //    neither relaunches nor loses it; a cancel then reaches it.
    let new_leader = a_long_job_survives_a_leader_kill(&mut cluster, leader, work.path()).await;

    // 3. scancel --signal: the signal reaches the job's processes through the new leader's
    //    stream; another user may not send it; a follower names the leader.
    a_signal_reaches_the_job(&cluster, leader, new_leader, work.path()).await;
}
