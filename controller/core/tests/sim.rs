//! `docket sim`'s engine: with unlimited depths and 1 s resolution, the planners reproduce
//! textbook FCFS and EASY exactly: on hand-computed traces, and against a small independent
//! implementation of each on random traces.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{swf_starts as starts, swf_trace as trace};
use docket_core::sim::Policy;
use docket_core::sim::swf::SwfJob;
use proptest::prelude::*;

fn job(id: u64, submit: u64, procs: u64, runtime: u64, estimate: u64) -> SwfJob {
    SwfJob {
        id,
        submit,
        runtime: runtime.min(estimate),
        procs,
        estimate,
        user: (id % 3) as i64,
        group: 1,
        queue: -1,
        partition: -1,
    }
}

/// Job 2 needs the whole machine; job 3 is short enough to run before job 2's reserved start.
#[test]
fn easy_backfills_a_short_job_that_fcfs_makes_wait() {
    let t = trace(
        4,
        vec![
            job(1, 0, 2, 10, 10),
            job(2, 0, 4, 10, 10),
            job(3, 1, 2, 5, 5),
            job(4, 2, 2, 20, 20),
        ],
    );
    assert_eq!(
        starts(&t, Policy::FCFS),
        vec![(1, 0), (2, 10), (3, 20), (4, 20)]
    );
    // Job 4 would run past job 2's start at 10 on processors job 2 needs: it waits.
    assert_eq!(
        starts(&t, Policy::EASY),
        vec![(1, 0), (2, 10), (3, 1), (4, 20)]
    );
}

/// The extra processors: job 3 runs past the shadow time, but on a processor job 2 does not
/// need then; job 4 finds none free.
#[test]
fn easy_uses_the_extra_processors_at_the_shadow_time() {
    let t = trace(
        4,
        vec![
            job(1, 0, 3, 10, 10),
            job(2, 0, 2, 10, 10),
            job(3, 0, 1, 100, 100),
            job(4, 0, 1, 50, 50),
        ],
    );
    assert_eq!(
        starts(&t, Policy::FCFS),
        vec![(1, 0), (2, 10), (3, 10), (4, 10)]
    );
    assert_eq!(
        starts(&t, Policy::EASY),
        vec![(1, 0), (2, 10), (3, 0), (4, 10)]
    );
}

/// A job that ends before its estimate frees the machine early; the reservation moves up.
#[test]
fn an_early_end_lets_the_reserved_job_start_early() {
    let t = trace(
        4,
        vec![
            job(1, 0, 4, 5, 100),
            job(2, 1, 4, 10, 10),
            job(3, 2, 1, 3, 3),
        ],
    );
    for p in [Policy::FCFS, Policy::EASY, Policy::CONSERVATIVE] {
        assert_eq!(starts(&t, p), vec![(1, 0), (2, 5), (3, 15)], "{p:?}");
    }
}

/// EASY protects only the first waiting job: job 4 may take the processor left over at
/// job 2's start and so push job 3 back. Conservative reserves for job 3 as well, so job 4
/// must wait until after it.
#[test]
fn conservative_protects_every_waiting_job() {
    let t = trace(
        4,
        vec![
            job(1, 0, 3, 10, 10),
            job(2, 0, 3, 10, 10),   // reserved at 10; 1 processor extra then
            job(3, 0, 4, 10, 10),   // conservative: reserved at 20
            job(4, 0, 1, 100, 100), // fits now, on the extra processor, until 100
        ],
    );
    assert_eq!(
        starts(&t, Policy::EASY),
        vec![(1, 0), (2, 10), (3, 100), (4, 0)]
    );
    assert_eq!(
        starts(&t, Policy::CONSERVATIVE),
        vec![(1, 0), (2, 10), (3, 20), (4, 30)]
    );
}

/// Textbook FCFS and EASY on a machine of `p` processors, procs only (the reference).
fn reference(p: u64, jobs: &[SwfJob], easy: bool) -> Vec<(u64, u64)> {
    let mut queue: Vec<&SwfJob> = Vec::new();
    let mut running: Vec<(u64, u64, u64)> = Vec::new(); // (actual end, estimated end, procs)
    let mut out = Vec::new();
    let mut arrivals: Vec<&SwfJob> = jobs.iter().collect();
    arrivals.sort_by_key(|j| j.submit);
    let mut next = 0;
    loop {
        let t = match (
            arrivals.get(next).map(|j| j.submit),
            running.iter().map(|r| r.0).min(),
        ) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(e)) => e,
            (Some(a), Some(e)) => a.min(e),
        };
        running.retain(|r| r.0 != t);
        while next < arrivals.len() && arrivals[next].submit == t {
            queue.push(arrivals[next]);
            next += 1;
        }
        let mut free = p - running.iter().map(|r| r.2).sum::<u64>();
        while let Some(head) = queue.first() {
            if head.procs > free {
                break;
            }
            free -= head.procs;
            running.push((t + head.runtime, t + head.estimate, head.procs));
            out.push((head.id, t));
            queue.remove(0);
        }
        if easy && let Some(head) = queue.first() {
            let mut by_end: Vec<(u64, u64)> = running.iter().map(|r| (r.1, r.2)).collect();
            by_end.sort_unstable();
            let mut avail = free;
            let mut shadow = u64::MAX;
            let mut extra = 0;
            for &(end, procs) in &by_end {
                avail += procs;
                if avail >= head.procs && shadow == u64::MAX {
                    shadow = end;
                }
            }
            if shadow != u64::MAX {
                // Every job ending at the shadow time frees its processors by then.
                let at_shadow: u64 = free
                    + by_end
                        .iter()
                        .filter(|(end, _)| *end <= shadow)
                        .map(|(_, p)| p)
                        .sum::<u64>();
                extra = at_shadow - head.procs;
            }
            let mut k = 1;
            while k < queue.len() {
                let j = queue[k];
                let ends_in_time = t + j.estimate <= shadow;
                if j.procs <= free && (ends_in_time || j.procs <= extra) {
                    free -= j.procs;
                    if !ends_in_time {
                        extra -= j.procs;
                    }
                    running.push((t + j.runtime, t + j.estimate, j.procs));
                    out.push((j.id, t));
                    queue.remove(k);
                } else {
                    k += 1;
                }
            }
        }
    }
    out.sort_unstable();
    out
}

fn random_trace() -> impl Strategy<Value = Vec<SwfJob>> {
    // Times on a coarse grid half the time, so arrivals, ends and estimates often coincide.
    (
        any::<bool>(),
        proptest::collection::vec((0..40u64, 1..17u64, 1..60u64, 0..40u64), 1..60),
    )
        .prop_map(|(coarse, v)| {
            let grid = |x: u64| if coarse { 5 * (x / 8) } else { x };
            let mut submit = 0;
            v.into_iter()
                .enumerate()
                .map(|(i, (gap, procs, est, early))| {
                    submit += grid(gap);
                    let est = grid(est).max(1);
                    // Runtimes at or below the estimate, sometimes much below.
                    let run = est.saturating_sub(grid(early)).max(1);
                    job(i as u64 + 1, submit, procs, run, est)
                })
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn fcfs_matches_the_textbook(jobs in random_trace()) {
        let t = trace(16, jobs.clone());
        prop_assert_eq!(starts(&t, Policy::FCFS), reference(16, &jobs, false));
    }

    #[test]
    fn easy_matches_the_textbook(jobs in random_trace()) {
        let t = trace(16, jobs.clone());
        prop_assert_eq!(starts(&t, Policy::EASY), reference(16, &jobs, true));
    }
}

/// A suspended job's clock stops, and a replay's figures count the seconds it ran: counting
/// the time it held its place, a preemptor and its suspended victim were both counted on
/// the same cpus (utilization above 1). One node of 4 cpus: job 1 (normal) would run 100 s
/// from 0; job 2 (express, the higher tier) suspends it at 10 and runs 50 s; job 1 resumes
/// at 60 and ends at 150.
#[test]
fn a_suspended_job_counts_the_seconds_it_ran() {
    let text = r#"
ClusterName = "t"
[SchedulerParameters]
bf_mode = "easy"
[[nodes]]
NodeName = "n1"
CPUs = 4
RealMemory = "4G"
[[partitions]]
PartitionName = "express"
Nodes = "ALL"
PriorityTier = 10
[[partitions]]
PartitionName = "normal"
Nodes = "ALL"
Default = true
PriorityTier = 1
PreemptMode = "SUSPEND"
[sim]
DefaultPartition = "normal"
queues = { 1 = { partition = "normal" }, 2 = { partition = "express" } }
"#;
    let file = docket_core::site::parse(text).unwrap();
    let site = docket_core::sim::SimSite::from_file(&file).unwrap();
    let t = trace(
        4,
        vec![
            SwfJob {
                queue: 1,
                ..job(1, 0, 4, 100, 100)
            },
            SwfJob {
                queue: 2,
                ..job(2, 10, 4, 50, 50)
            },
        ],
    );
    let options = docket_core::sim::SimOptions {
        policy: None,
        procs: None,
        max_jobs: None,
        site: Some(site),
    };
    let r = docket_core::sim::replay(&t, &options, &mut |_, _| {}).unwrap();
    let of = |id: u64| r.outcomes.iter().find(|o| o.swf_id == id).unwrap();
    let (victim, preemptor) = (of(1), of(2));
    assert_eq!(
        (preemptor.start, preemptor.end),
        (10, 60),
        "job 2 suspends job 1"
    );
    assert_eq!((victim.start, victim.end, victim.run), (0, 150, 100));
    assert_eq!(victim.bsld(), 1.5, "150 s in the system for 100 s of run");
    assert_eq!(
        r.summary.utilization, 1.0,
        "600 cpu-seconds on 4 cpus over 150 s"
    );
}
