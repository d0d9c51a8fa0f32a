//! Benchmarks of the scheduler core, printing figures (never asserting them):
//!
//!   cargo run --release -p docket-core --example core_bench [-- USERS JOBS]
//!
//! Builds a cluster of 1,000 nodes and USERS users (default 10,000) in 100 accounts with
//! varied fair-share usage, then measures:
//! - applying submission batches of 10,000 jobs (one command each) until JOBS (default
//!   100,000) are pending;
//! - the state each pending job costs: heap bytes (a counting allocator) and snapshot bytes;
//! - recomputing every pending job's priority (GWDG multifactor with Fair Tree, and IT4I),
//!   including the fair-share computation, and the full order of consideration.

#[path = "support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use docket_core::config::SchedConfig;
use docket_core::fairshare::FairshareAlgorithm;
use docket_core::job::{BlobId, JobSpec, TimeRequest};
use docket_core::node::NodeSpec;
use docket_core::partition::Partition;
use docket_core::priority::{self, It4i, Multifactor, PriorityFormula};
use docket_core::qos::Qos;
use docket_core::quantity::{MiB, Seconds, TimeMs};
use docket_core::{Command, NodeName, Response, State};
use support::{Bench, name};

/// Counts live heap bytes, so the state's size is measured, not estimated.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SCRIPT: &[u8] = b"#!/bin/bash\n#SBATCH -t 1:00:00\nsrun ./simulate --steps 1000\n";

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args = support::numeric_args();
    let users = args.first().copied().unwrap_or(10_000) as usize;
    let jobs = args.get(1).copied().unwrap_or(100_000) as usize;
    let batch = 10_000usize;
    let (mut b, user_names) = build_site(users);
    let heap_before = LIVE.load(Ordering::Relaxed);
    let mut batch_ms = submit_all(&mut b, &user_names, jobs, batch);
    let heap_bytes = (LIVE.load(Ordering::Relaxed) - heap_before) as f64;
    let pending = b.state.jobs.len();
    let (snapshot, snapshot_ms) = timed(|| b.state.to_snapshot().expect("snapshot"));
    let (restored, restore_ms) = timed(|| State::from_snapshot(&snapshot).expect("restore"));
    drop(restored);

    let later = b.now.plus(Seconds(3600));
    let mut runs = Vec::new();
    for _ in 0..7 {
        let (ms, sum) = recompute(&b.state, later);
        assert!(sum.is_finite());
        runs.push(ms);
    }
    runs.sort_by(f64::total_cmp);
    let (order, order_ms) = timed(|| b.state.consideration_order(later));
    assert_eq!(order.len(), pending);
    let (inputs, inputs_ms) = timed(|| b.state.priority_inputs(b.now));
    drop(inputs);
    let mut it4i_state = b.state.clone();
    it4i_state.config.priority.formula = PriorityFormula::It4i(It4i::default());
    it4i_state.config.fairshare.algorithm = FairshareAlgorithm::It4i;
    let mut it4i_runs: Vec<f64> = (0..7).map(|_| recompute(&it4i_state, later).0).collect();
    it4i_runs.sort_by(f64::total_cmp);

    // One cancel with the queue full: apply re-places only the users the change can affect
    // (the owner, owners of dependents; everyone only under group limits).
    let victim = *b.state.jobs.keys().next().expect("jobs");
    let cancel = Command::CancelJobs {
        jobs: vec![docket_core::job::JobRef {
            job: victim,
            task: None,
        }],
    };
    let (_, cancel_ms) = timed(|| b.apply(cancel));
    // A tick accrues usage, purges what ended `MinJobAge` ago and re-places the jobs whose
    // placement the clock can move (none here).
    let (_, tick_ms) = timed(|| b.apply(Command::Tick));

    batch_ms.sort_by(f64::total_cmp);
    println!(
        "{{\"users\":{users},\"pending_jobs\":{pending},\"submit_batch\":{batch},\
         \"submit_batch_ms_p50\":{:.2},\"submit_batch_ms_max\":{:.2},\
         \"heap_bytes_per_pending_job\":{:.0},\"snapshot_bytes_per_pending_job\":{:.0},\
         \"snapshot_ms\":{snapshot_ms:.1},\"restore_ms\":{restore_ms:.1},\
         \"priority_recompute_ms_p50\":{:.2},\"priority_recompute_ms_max\":{:.2},\
         \"fairshare_inputs_ms\":{inputs_ms:.2},\"it4i_recompute_ms_p50\":{:.2},\
         \"consideration_order_ms\":{order_ms:.2},\"cancel_one_ms\":{cancel_ms:.2},\
         \"tick_ms\":{tick_ms:.3},\
         \"job_record_bytes\":{}}}",
        percentile(&batch_ms, 0.5),
        percentile(&batch_ms, 1.0),
        heap_bytes / pending as f64,
        snapshot.len() as f64 / pending as f64,
        percentile(&runs, 0.5),
        percentile(&runs, 1.0),
        percentile(&it4i_runs, 0.5),
        std::mem::size_of::<docket_core::job::Job>(),
    );
}

/// What `f` returns, and how long it took in milliseconds.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed().as_secs_f64() * 1e3)
}

/// 1,000 nodes of 64 cpus in a work and an express partition, two QOS, 100 accounts and
/// `users` users with varied past usage, so fair-share has something to rank.
fn build_site(users: usize) -> (Bench, Vec<docket_core::UserName>) {
    let mut config = SchedConfig::default();
    config.priority.formula = PriorityFormula::Multifactor(Multifactor::gwdg());
    config.fairshare.algorithm = FairshareAlgorithm::FairTree;
    let mut b = Bench::new(State::new(config), Seconds(1));
    let mut nodes = BTreeSet::new();
    for i in 0..1000 {
        let n: NodeName = name(&format!("c{i:04}"));
        nodes.insert(n.clone());
        b.apply(Command::UpsertNode(NodeSpec {
            name: n,
            cpus: 64,
            memory: MiB::gib(256),
            jobfs: MiB::gib(400),
            gpus: 0,
            features: BTreeSet::new(),
        }));
    }
    b.apply(Command::UpsertQos(Box::new(Qos::new(name("normal")))));
    let mut high = Qos::new(name("high"));
    high.priority = 100;
    b.apply(Command::UpsertQos(Box::new(high)));
    let mut work = Partition::new(name("work"), nodes.clone());
    work.is_default = true;
    work.def_mem_per_cpu = Some(MiB::gib(2));
    b.apply(Command::UpsertPartition(Box::new(work)));
    let mut express = Partition::new(name("express"), nodes);
    express.priority_tier = 10;
    express.priority_job_factor = 10;
    b.apply(Command::UpsertPartition(Box::new(express)));
    let accounts = b.add_accounts("proj", 100, |i| 1 + (i as u32 % 7));
    let user_names = b.add_users(users, &accounts, |i| 1 + (i as u32 % 3));
    let half_life = b.state.config.fairshare.half_life;
    for (i, u) in user_names.iter().enumerate() {
        let used = ((i * 7919) % 10_007) as f64 * 3600.0;
        let account = &accounts[i % accounts.len()];
        b.state.usage.add(account, u, used, b.now, half_life);
    }
    (b, user_names)
}

/// Submits `jobs` varied jobs in batches of `batch` (one command each); each batch's apply
/// time in milliseconds.
fn submit_all(
    b: &mut Bench,
    user_names: &[docket_core::UserName],
    jobs: usize,
    batch: usize,
) -> Vec<f64> {
    let base = JobSpec::simple(name("u00000"), BlobId::of(SCRIPT));
    let mut batch_ms = Vec::new();
    let mut submitted = 0usize;
    while submitted < jobs {
        let n = batch.min(jobs - submitted);
        let specs: Vec<JobSpec> = (0..n)
            .map(|k| {
                let i = submitted + k;
                let mut s = base.clone();
                s.user = user_names[i % user_names.len()].clone();
                s.name = format!("sim-{}", i % 97).into();
                s.ntasks = 1 + (i % 32) as u32;
                s.time = TimeRequest::Limit(Seconds(600 + (i % 48) as u64 * 1800));
                if i.is_multiple_of(10) {
                    s.partition = Some(name("express"));
                    s.qos = Some(name("high"));
                }
                s.work_dir = format!("/home/{}/run{}", s.user, i % 13).into();
                s
            })
            .collect();
        let cmd = Command::SubmitJobs {
            blobs: vec![SCRIPT.to_vec()],
            jobs: specs,
        };
        let (r, ms) = timed(|| b.apply(cmd));
        batch_ms.push(ms);
        if let Response::Submitted(results) = r
            && let Some(Err(e)) = results.iter().find(|r| r.is_err())
        {
            panic!("a benchmark job was refused: {e}");
        }
        submitted += n;
    }
    batch_ms
}

/// Every job's priority, as the leader computes it every pass (fair share included): the
/// milliseconds it took, and the sum (so nothing is optimized away).
fn recompute(state: &State, now: TimeMs) -> (f64, f64) {
    let t = Instant::now();
    let inputs = state.priority_inputs(now);
    let mut sum = 0.0;
    for job in state.jobs.values() {
        sum += priority::priority(&inputs, job);
    }
    (t.elapsed().as_secs_f64() * 1e3, sum)
}
