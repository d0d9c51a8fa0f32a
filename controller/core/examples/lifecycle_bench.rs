//! The scheduler core's cost per job over a whole lifecycle, printing figures (never
//! asserting them):
//!
//!   cargo run --release -p docket-core --example lifecycle_bench [-- NODES JOBS USERS]
//!
//! NODES nodes of 8 cpus (default 200), JOBS whole-node jobs (default 10,000) from USERS
//! users (default 1: one deep queue, the case where a per-user cost shows), all submitted
//! first, then run to their end as the leader drives them: a main pass, one `StartJobs`
//! command with its starts, then one `EndJobs` command per job (each agent reports its own
//! end), until the queue is empty. Prints the microseconds per job spent planning, applying
//! starts and applying ends: what the leader pays for all three and every follower for the
//! last two. This is the state machine's share of `docket-local scale`, without the network.

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use docket_core::command::{EndCause, EndReport};
use docket_core::job::{BlobId, ExitStatus, JobSpec, TimeRequest};
use docket_core::node::NodeSpec;
use docket_core::partition::Partition;
use docket_core::plan::Unlimited;
use docket_core::qos::Qos;
use docket_core::quantity::{MiB, Seconds};
use docket_core::{Command, NodeName, Response, State};
use support::{Bench, name};

const SCRIPT: &[u8] = b"#!/bin/sh\ntrue\n";

fn main() {
    let args = support::numeric_args();
    let nodes = args.first().copied().unwrap_or(200) as usize;
    let jobs = args.get(1).copied().unwrap_or(10_000) as usize;
    let users = args.get(2).copied().unwrap_or(1).max(1) as usize;
    let (mut b, user_names) = build_site(nodes, users);
    let t = Instant::now();
    submit_all(&mut b, &user_names, jobs);
    let submit = t.elapsed();
    let spent = run_to_completion(&mut b, jobs);
    let per_job = |d: Duration| d.as_secs_f64() * 1e6 / jobs as f64;
    println!(
        "{{\"nodes\":{nodes},\"jobs\":{jobs},\"users\":{users},\"passes\":{},\
         \"submit_us_per_job\":{:.1},\"plan_us_per_job\":{:.1},\"start_apply_us_per_job\":{:.1},\
         \"end_apply_us_per_job\":{:.1},\"jobs_per_s_of_one_core\":{:.0}}}",
        spent.passes,
        per_job(submit),
        per_job(spent.plan),
        per_job(spent.start),
        per_job(spent.end),
        jobs as f64 / (spent.plan + spent.start + spent.end).as_secs_f64(),
    );
}

/// `nodes` nodes of 8 cpus in one partition, one account, `users` users.
fn build_site(nodes: usize, users: usize) -> (Bench, Vec<docket_core::UserName>) {
    let mut b = Bench::new(State::new(Default::default()), Seconds(0));
    let mut names = BTreeSet::new();
    for i in 0..nodes {
        let n: NodeName = name(&format!("n{i:04}"));
        names.insert(n.clone());
        b.apply(Command::UpsertNode(NodeSpec {
            name: n,
            cpus: 8,
            memory: MiB::gib(8),
            jobfs: MiB::gib(1),
            gpus: 0,
            features: BTreeSet::new(),
        }));
    }
    b.apply(Command::UpsertQos(Box::new(Qos::new(name("normal")))));
    let mut work = Partition::new(name("work"), names);
    work.is_default = true;
    b.apply(Command::UpsertPartition(Box::new(work)));
    let accounts = b.add_accounts("proj", 1, |_| 1);
    let user_names = b.add_users(users, &accounts, |_| 1);
    (b, user_names)
}

/// Submits `jobs` whole-node jobs, the users in turn, 1,000 per command.
fn submit_all(b: &mut Bench, user_names: &[docket_core::UserName], jobs: usize) {
    let base = JobSpec::simple(user_names[0].clone(), BlobId::of(SCRIPT));
    let mut submitted = 0;
    while submitted < jobs {
        let n = 1000.min(jobs - submitted);
        let specs = (0..n)
            .map(|k| {
                let mut s = base.clone();
                s.user = user_names[(submitted + k) % user_names.len()].clone();
                s.ntasks = 8;
                s.time = TimeRequest::Limit(Seconds(600));
                s
            })
            .collect();
        let r = b.apply(Command::SubmitJobs {
            blobs: vec![SCRIPT.to_vec()],
            jobs: specs,
        });
        if let Response::Submitted(results) = r
            && let Some(Err(e)) = results.iter().find(|r| r.is_err())
        {
            panic!("a benchmark job was refused: {e}");
        }
        submitted += n;
    }
}

/// Where the lifecycle's time went: planning, applying starts, applying ends.
#[derive(Default)]
struct Spent {
    plan: Duration,
    start: Duration,
    end: Duration,
    passes: usize,
}

/// Main passes, `StartJobs` and one `EndJobs` per job, a second apart, until every job ran.
fn run_to_completion(b: &mut Bench, jobs: usize) -> Spent {
    let mut spent = Spent::default();
    let mut started = 0usize;
    loop {
        b.now = b.now.plus(Seconds(1));
        let t = Instant::now();
        let p = b.state.main_pass(b.now, &mut Unlimited, None);
        spent.plan += t.elapsed();
        spent.passes += 1;
        if p.starts.is_empty() {
            if started < jobs {
                let j = b.state.jobs.values().next().expect("a job");
                panic!(
                    "nothing starts: job {} is {:?}/{:?}",
                    j.id, j.part, j.reason
                );
            }
            break;
        }
        let t = Instant::now();
        let Response::Started(results) = b.apply(Command::StartJobs(p.starts)) else {
            panic!("StartJobs answered otherwise");
        };
        spent.start += t.elapsed();
        let ids: Vec<_> = results.into_iter().filter_map(Result::ok).collect();
        started += ids.len();
        let reports: Vec<EndReport> = ids
            .iter()
            .filter_map(|id| b.state.jobs.get(id))
            .filter_map(|j| {
                Some(EndReport {
                    job: j.id,
                    epoch: j.alloc.as_ref()?.epoch,
                    cause: EndCause::Exited,
                    exit: ExitStatus::default(),
                })
            })
            .collect();
        let t = Instant::now();
        for r in reports {
            b.apply(Command::EndJobs(vec![r]));
        }
        spent.end += t.elapsed();
    }
    assert_eq!(started, jobs, "every job ran");
    spent
}
