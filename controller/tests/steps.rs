//! Job steps through three `docket-controller` processes: `srun`'s CreateStep sent to the
//! leader (a follower names it: only the leader knows where the agents listen), placed in the job's allocation, busy while other steps hold the cpus, refused to
//! anyone but the owner, listed with the job, and cancelled by `scancel JOBID.STEP`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Instant;

use common::{Cluster, DEADLINE, as_user, job, list, submit};
use docket_proto::v1 as pb;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srun_creates_steps_in_a_running_job_at_the_leader() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let mut client = cluster.jobs(cluster.follower_of(leader)).await;
    let mut spec = job("alloc", "");
    spec.nodes = 2;
    spec.ntasks = 4;
    spec.ntasks_per_node = Some(2);
    let r = submit(&mut client, "alice", vec![spec]).await.unwrap();
    let Some(pb::submit_result::Result::JobId(id)) = r[0].result else {
        panic!("{r:?}")
    };
    let start = Instant::now();
    let nodes = loop {
        let jobs = list(
            &mut client,
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
    };

    // A follower sends srun to the leader.
    let e = client
        .create_step(as_user("alice", step(id, 3)))
        .await
        .unwrap_err();
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
    let busy = client
        .create_step(as_user("alice", step(id, 2)))
        .await
        .unwrap_err();
    assert_eq!(busy.code(), tonic::Code::ResourceExhausted, "{busy:?}");
    assert!(busy.message().contains("temporarily disabled"), "{busy:?}");
    let one = client
        .create_step(as_user("alice", step(id, 1)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(one.step_id, 1);

    // Nobody else creates steps in alice's job; a step that never fits names its field.
    let denied = client
        .create_step(as_user("bob", step(id, 1)))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    let mut never = step(id, 1);
    never.nodelist = vec!["g01".into()];
    let e = client
        .create_step(as_user("alice", never))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("nodelist"), "{e:?}");
    let mut bad_key = step(id, 1);
    bad_key.io_key = vec![1; 5];
    let e = client
        .create_step(as_user("alice", bad_key))
        .await
        .unwrap_err();
    assert!(e.message().starts_with("io_key"), "{e:?}");

    // The job lists its steps; scancel JOBID.STEP stops one.
    let cancel = |s: u32| {
        as_user(
            "alice",
            pb::CancelStepsRequest {
                steps: vec![pb::StepRef {
                    job_id: id,
                    step_id: s,
                }],
            },
        )
    };
    let mut client = follower;
    let r = client.cancel_steps(cancel(1)).await.unwrap().into_inner();
    assert_eq!(r.results[0].error, "", "{r:?}");
    let r = client.cancel_steps(cancel(7)).await.unwrap().into_inner();
    assert!(r.results[0].error.contains("unknown step"), "{r:?}");
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
    let steps: Vec<(u32, &str, u32)> = info
        .steps
        .iter()
        .map(|s| (s.step_id, s.state.as_str(), s.ntasks))
        .collect();
    assert_eq!(steps, [(0, "RUNNING", 3), (1, "COMPLETING", 1)]);
}
