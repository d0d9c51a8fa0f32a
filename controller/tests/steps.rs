//! Job steps through three `docket-controller` processes: `srun`'s CreateStep sent to the
//! leader (a follower names it: only the leader knows where the agents listen), placed in the job's allocation, busy while other steps hold the cpus, refused to
//! anyone but the owner, listed with the job, and cancelled by `scancel JOBID.STEP`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Instant;

use common::{Cluster, DEADLINE, as_user, job, list, submit};
use docket_proto::v1 as pb;
use docket_proto::v1::jobs_client::JobsClient;
use tonic::transport::Channel;

fn step(job_id: u64, ntasks: u32) -> pb::CreateStepRequest {
    pb::CreateStepRequest {
        job_id,
        name: "hostname".into(),
        ntasks: Some(ntasks),
        cpus_per_task: 1,
        io_key: vec![9; 32],
        ..Default::default()
    }
}

/// Submits alice's four-task job over two nodes through `client`; its id.
async fn submit_allocation(client: &mut JobsClient<Channel>) -> u64 {
    let mut spec = job("alloc", "");
    spec.nodes = 2;
    spec.ntasks = 4;
    spec.ntasks_per_node = Some(2);
    let r = submit(client, "alice", vec![spec]).await.unwrap();
    let Some(pb::submit_result::Result::JobId(id)) = r[0].result else {
        panic!("{r:?}")
    };
    id
}

/// Waits until job `id` runs, as `client` lists it; its node list.
async fn wait_running(client: &mut JobsClient<Channel>, id: u64) -> String {
    let start = Instant::now();
    loop {
        let jobs = list(
            client,
            "alice",
            pb::ListJobsRequest {
                job_ids: vec![id],
                ..Default::default()
            },
        )
        .await
        .unwrap();
        if jobs[0].state == "RUNNING" {
            break jobs[0].node_list.clone();
        }
        assert!(start.elapsed() < DEADLINE, "never started: {jobs:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `request` sent as `user`, which must be refused; the refusal.
async fn create_step_refused(
    client: &mut JobsClient<Channel>,
    user: &str,
    request: pb::CreateStepRequest,
) -> tonic::Status {
    client
        .create_step(as_user(user, request))
        .await
        .unwrap_err()
}

/// Checks steps are refused to bob, and name nodelist or io_key when those are bad.
async fn check_step_refusals(client: &mut JobsClient<Channel>, id: u64) {
    let denied = create_step_refused(client, "bob", step(id, 1)).await;
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    let mut never = step(id, 1);
    never.nodelist = vec!["g01".into()];
    let e = create_step_refused(client, "alice", never).await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("nodelist"), "{e:?}");
    let mut bad_key = step(id, 1);
    bad_key.io_key = vec![1; 5];
    let e = create_step_refused(client, "alice", bad_key).await;
    assert!(e.message().starts_with("io_key"), "{e:?}");
}

/// `scancel JOBID.STEP` of alice's: step `step` of job `job_id`.
fn cancel_step(job_id: u64, step: u32) -> tonic::Request<pb::CancelStepsRequest> {
    as_user(
        "alice",
        pb::CancelStepsRequest {
            steps: vec![pb::StepRef {
                job_id,
                step_id: step,
            }],
        },
    )
}

/// The steps of job `id` as alice's GetJob lists them: (id, state, tasks).
async fn steps_of(client: &mut JobsClient<Channel>, id: u64) -> Vec<(u32, String, u32)> {
    let info = client
        .get_job(as_user(
            "alice",
            pb::GetJobRequest {
                job_id: id,
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    info.steps
        .iter()
        .map(|s| (s.step_id, s.state.clone(), s.ntasks))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srun_creates_steps_in_a_running_job_at_the_leader() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let mut client = cluster.jobs(cluster.follower_of(leader)).await;
    let id = submit_allocation(&mut client).await;
    let nodes = wait_running(&mut client, id).await;

    // A follower sends srun to the leader.
    let e = create_step_refused(&mut client, "alice", step(id, 3)).await;
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("steps are created"), "{e:?}");
    assert!(
        e.metadata().get(docket_proto::metadata::LEADER).is_some(),
        "{e:?}"
    );
    let follower = client;
    let mut client = cluster.jobs(leader).await;

    // Step 0: three tasks over the two nodes, block by block.
    let created = client
        .create_step(as_user("alice", step(id, 3)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.step_id, 0);
    let layout: Vec<(u32, u32)> = created
        .layout
        .iter()
        .map(|s| (s.tasks, s.first_task))
        .collect();
    assert_eq!(layout, [(2, 0), (1, 2)], "{created:?} on {nodes}");

    // One cpu is left: two tasks must wait (srun retries), one fits.
    let busy = create_step_refused(&mut client, "alice", step(id, 2)).await;
    assert_eq!(busy.code(), tonic::Code::ResourceExhausted, "{busy:?}");
    assert!(busy.message().contains("temporarily disabled"), "{busy:?}");
    let one = client
        .create_step(as_user("alice", step(id, 1)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(one.step_id, 1);

    // Nobody else creates steps in alice's job; a step that never fits names its field.
    check_step_refusals(&mut client, id).await;

    // The job lists its steps; scancel JOBID.STEP stops one.
    let mut client = follower;
    let r = client
        .cancel_steps(cancel_step(id, 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.results[0].error, "", "{r:?}");
    let r = client
        .cancel_steps(cancel_step(id, 7))
        .await
        .unwrap()
        .into_inner();
    assert!(r.results[0].error.contains("unknown step"), "{r:?}");
    let steps = steps_of(&mut client, id).await;
    assert_eq!(
        steps,
        [
            (0, "RUNNING".to_owned(), 3),
            (1, "COMPLETING".to_owned(), 1)
        ]
    );
}
