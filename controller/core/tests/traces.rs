//! Every trace shipped in `tests/data/` replays under every policy, and the replay keeps
//! the machine's rules: no job starts before it is submitted, runs other than its runtime,
//! or finds the machine without room for it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use docket_core::sim::{Policy, SimOptions, replay, swf};

fn check(path: &std::path::Path, jobs: usize) {
    let path = &path.display().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    let trace = swf::parse(&text).unwrap();
    assert!(
        trace.jobs.len() >= jobs,
        "{path}: {} jobs",
        trace.jobs.len()
    );
    let procs = trace.machine_procs(None).unwrap();
    let mut means = Vec::new();
    for policy in [Policy::FCFS, Policy::EASY, Policy::CONSERVATIVE] {
        let options = SimOptions {
            policy: Some(policy),
            procs: None,
            max_jobs: Some(jobs),
            site: None,
        };
        let r = replay(&trace, &options, &mut |_, _| {}).unwrap();
        assert_eq!(r.outcomes.len(), jobs, "{path} {policy:?}: every job ran");
        let by_id: std::collections::BTreeMap<u64, &swf::SwfJob> =
            trace.jobs.iter().map(|j| (j.id, j)).collect();
        let mut events: Vec<(u64, i64)> = Vec::new();
        for o in &r.outcomes {
            let j = by_id[&o.swf_id];
            assert!(
                o.start >= o.submit,
                "{path}: job {} started early",
                o.swf_id
            );
            assert_eq!(o.run, j.runtime, "{path}: job {} ran its runtime", o.swf_id);
            events.push((o.start, o.procs as i64));
            events.push((o.end, -(o.procs as i64)));
        }
        // Ends before starts at one instant; never more busy than the machine has.
        events.sort_by_key(|(t, d)| (*t, *d));
        let mut busy = 0i64;
        for (t, d) in events {
            busy += d;
            assert!(
                busy <= procs as i64,
                "{path} {policy:?}: {busy} busy at {t}"
            );
        }
        assert!(r.summary.utilization > 0.0 && r.summary.utilization <= 1.0);
        means.push(r.summary.mean_wait_s);
    }
    // Backfilling never makes the average wait worse on these traces.
    assert!(
        means[1] <= means[0],
        "{path}: EASY {} vs FCFS {}",
        means[1],
        means[0]
    );
}

#[test]
fn the_nasa_ipsc_trace_replays() {
    check(
        &manifest_dir().join("tests/data/NASA-iPSC-1993-3.1-cln.swf"),
        5000,
    );
}

#[test]
fn the_lublin_model_trace_replays() {
    check(&manifest_dir().join("tests/data/lublin-aaroh.swf"), 5000);
}

/// This crate's directory, read when the test runs (cargo and nextest set it) rather than
/// baked in at compile time: a test binary built from one clone and reused by another through
/// a shared target directory must still read the tree it is testing.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
