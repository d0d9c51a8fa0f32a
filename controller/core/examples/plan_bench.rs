//! Planner speed, printing figures (never asserting them):
//!
//!   cargo run --release -p docket-core --example plan_bench
//!
//! - backfill: 5,000 nodes of 64 cpus, 90% of their cpus taken by running jobs with
//!   staggered time limits, 10,000 pending jobs of 1-256 cpus and 10 min-2 days from 500
//!   users; one EASY pass that considers every job (bf_max_job_test = 10,000), then one
//!   conservative pass with 100 reservations;
//! - main: 1,000 nodes, 100,000 pending jobs from 10,000 users under GWDG's multifactor
//!   priority with Fair Tree; one main pass (order of consideration included).
//!
//! Each pass runs 5 times; the JSON line gives the median and the maximum.

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeSet;

use docket_core::command::StartDecision;
use docket_core::config::{BackfillMode, SchedConfig, SchedParams};
use docket_core::job::{BlobId, JobRef, JobSpec, TimeRequest};
use docket_core::node::NodeSpec;
use docket_core::partition::Partition;
use docket_core::plan::Unlimited;
use docket_core::qos::Qos;
use docket_core::quantity::{MiB, Seconds};
use docket_core::{Command, NodeName, Response, State, UserName};
use support::{Bench, name, time_runs};

const SCRIPT: &[u8] = b"#!/bin/sh\nsrun ./app\n";

struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

fn cluster(config: SchedConfig, nodes: usize, cpus: u32, users: usize) -> (Bench, Vec<UserName>) {
    let mut b = Bench::new(State::new(config), Seconds(0));
    let mut names = BTreeSet::new();
    for i in 0..nodes {
        let n: NodeName = name(&format!("c{i:05}"));
        names.insert(n.clone());
        b.apply(Command::UpsertNode(NodeSpec {
            name: n,
            cpus,
            memory: MiB::gib(256),
            jobfs: MiB::gib(400),
            gpus: 0,
            features: BTreeSet::new(),
        }));
    }
    b.apply(Command::UpsertQos(Box::new(Qos::new(name("normal")))));
    let mut work = Partition::new(name("work"), names);
    work.is_default = true;
    work.def_mem_per_cpu = Some(MiB::gib(2));
    b.apply(Command::UpsertPartition(Box::new(work)));
    let accounts = b.add_accounts("p", 50, |_| 1);
    let user_names = b.add_users(users, &accounts, |_| 1);
    (b, user_names)
}

fn submit(b: &mut Bench, specs: Vec<JobSpec>) -> Vec<docket_core::JobId> {
    let mut ids = Vec::new();
    for chunk in specs.chunks(10_000) {
        let r = b.apply(Command::SubmitJobs {
            blobs: vec![SCRIPT.to_vec()],
            jobs: chunk.to_vec(),
        });
        let Response::Submitted(r) = r else {
            panic!("unexpected {r:?}")
        };
        ids.extend(r.into_iter().map(|x| x.expect("accepted")));
    }
    ids
}

fn main() {
    let mut r = Lcg(7);
    let b = busy_backfill_cluster(&mut r);
    let (easy_ms, easy_max, plan) =
        time_runs(5, || b.state.backfill_pass(b.now, &mut Unlimited, None));
    let mut cons_state = b.state.clone();
    cons_state.config.sched.backfill = BackfillMode::Conservative;
    cons_state.config.sched.reservation_depth = 100;
    let (cons_ms, cons_max, cons_plan) =
        time_runs(5, || cons_state.backfill_pass(b.now, &mut Unlimited, None));
    assert!(cons_plan.reservations.len() <= 100);

    let (m, started) = deep_main_cluster(&mut r);
    let (main_ms, main_max, main_plan) =
        time_runs(5, || m.state.main_pass(m.now, &mut Unlimited, None));
    assert!(main_plan.continuation.is_none());
    println!(
        "{{\"backfill_nodes\":5000,\"backfill_pending\":10000,\"easy_pass_ms_median\":{easy_ms:.1},\
         \"easy_pass_ms_max\":{easy_max:.1},\"easy_starts\":{},\"easy_reservations\":{},\
         \"conservative_100_pass_ms_median\":{cons_ms:.1},\"conservative_100_pass_ms_max\":{cons_max:.1},\
         \"main_nodes\":1000,\"main_pending\":{},\"main_pass_ms_median\":{main_ms:.1},\
         \"main_pass_ms_max\":{main_max:.1},\"main_first_fill_starts\":{started}}}",
        plan.starts.len(),
        plan.reservations.len(),
        100_000 - started,
    );
}

/// Backfill's cluster: 5,000 nodes of 64 cpus, each 90% busy with jobs ending at staggered
/// times, and 10,000 pending jobs of up to 256 cpus.
fn busy_backfill_cluster(r: &mut Lcg) -> Bench {
    let config = SchedConfig {
        sched: SchedParams {
            backfill: BackfillMode::Easy,
            bf_max_job_test: 10_000,
            bf_window: Seconds::days(2),
            ..SchedParams::default()
        },
        ..SchedConfig::default()
    };
    let (mut b, users) = cluster(config, 5000, 64, 500);
    let base = JobSpec::simple(users[0].clone(), BlobId::of(SCRIPT));
    let mut fill = Vec::new();
    for i in 0..5000u64 {
        for k in 0..3u64 {
            let mut s = base.clone();
            s.user = users[((i * 3 + k) % 500) as usize].clone();
            s.ntasks = if k == 2 { 13 } else { 22 };
            s.time = TimeRequest::Limit(Seconds(600 + r.below(2 * 86_400)));
            s.nodelist = BTreeSet::from([name(&format!("c{i:05}"))]);
            fill.push(s);
        }
    }
    let running = submit(&mut b, fill);
    for chunk in running.chunks(5000) {
        let decisions: Vec<StartDecision> = chunk
            .iter()
            .map(|id| StartDecision {
                job: JobRef {
                    job: *id,
                    task: None,
                },
                nodes: b.state.jobs[id].spec.nodelist.iter().cloned().collect(),
            })
            .collect();
        b.apply(Command::StartJobs(decisions));
    }
    let pending: Vec<JobSpec> = (0..10_000u64)
        .map(|i| {
            let mut s = base.clone();
            s.user = users[(i % 500) as usize].clone();
            s.ntasks = 1 + r.below(256) as u32;
            s.nodes = s.ntasks.div_ceil(64);
            s.time = TimeRequest::Limit(Seconds(600 + r.below(2 * 86_400)));
            s
        })
        .collect();
    submit(&mut b, pending);
    b.now = b.now.plus(Seconds(30));
    b
}

/// The main pass's cluster: 100,000 pending jobs of 10,000 users (multifactor) on 1,000
/// nodes, filled by a first pass; and how many that pass started.
fn deep_main_cluster(r: &mut Lcg) -> (Bench, usize) {
    let (mut m, users) = cluster(SchedConfig::default(), 1000, 64, 10_000);
    let base = JobSpec::simple(users[0].clone(), BlobId::of(SCRIPT));
    let pending: Vec<JobSpec> = (0..100_000u64)
        .map(|i| {
            let mut s = base.clone();
            s.user = users[(i % 10_000) as usize].clone();
            s.ntasks = 1 + r.below(128) as u32;
            s.nodes = s.ntasks.div_ceil(64);
            s.time = TimeRequest::Limit(Seconds(600 + r.below(86_400)));
            s
        })
        .collect();
    submit(&mut m, pending);
    // Fill the machine first, so the pass meets the usual full cluster.
    let first = m.state.main_pass(m.now, &mut Unlimited, None);
    let started = first.starts.len();
    m.apply(Command::StartJobs(first.starts));
    m.now = m.now.plus(Seconds(60));
    (m, started)
}
