//! `docket sim` end to end: the binary reads a trace, prints the JSON summary the simulator's interface
//! promises, and writes the per-job CSV and the SVG plot.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

/// This crate's directory, read when the test runs (cargo and nextest set it) rather than
/// baked in at compile time: a test binary built from one clone and reused by another through
/// a shared target directory must still read the tree it is testing.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

fn trace() -> String {
    manifest_dir()
        .join("../controller/core/tests/data/lublin-aaroh.swf")
        .display()
        .to_string()
}

/// The JSON summary of a run that must have succeeded.
fn summary(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn sim_prints_its_summary_and_writes_csv_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("jobs.csv");
    let svg = dir.path().join("plot.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_docket"))
        .args([
            "sim",
            "--swf",
            &trace(),
            "--policy",
            "easy",
            "--jobs",
            "300",
            "--no-progress",
        ])
        .arg("--jobs-out")
        .arg(&csv)
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    let v = summary(&out);
    for key in [
        "jobs",
        "procs",
        "policy",
        "utilization",
        "mean_wait_s",
        "p95_wait_s",
        "max_wait_s",
        "mean_bsld",
        "makespan_s",
        "sim_wall_s",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {v}");
    }
    assert_eq!(v["jobs"], 300);
    assert_eq!(v["procs"], 256, "MaxNodes from the header");
    assert_eq!(v["policy"], "easy");
    let rows = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(rows.lines().count(), 301);
    assert!(rows.starts_with("swf_id,user,procs,submit,start,end,wait_s"));
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.starts_with("<svg") && plot.contains("queued jobs"),
        "an SVG with its captions"
    );
}

#[test]
fn sim_names_what_is_wrong_with_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.swf");
    std::fs::write(&bad, "1 0 5 x 4 -1 -1 8 50 -1 1 3 2 -1 1 -1 -1 -1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_docket"))
        .args(["sim", "--no-progress", "--swf"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 1: field 4 (run time)"), "{err}");
    let missing = Command::new(env!("CARGO_BIN_EXE_docket"))
        .args(["sim", "--swf", "/nonexistent.swf"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("reading trace /nonexistent.swf"));
}

/// `--config` takes a controller's configuration: its machine, partitions and policies.
#[test]
fn sim_replays_on_a_site_configuration() {
    let config = manifest_dir()
        .join("../deploy/config/nci.toml")
        .display()
        .to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_docket"))
        .args([
            "sim",
            "--no-progress",
            "--jobs",
            "300",
            "--swf",
            &trace(),
            "--config",
            &config,
        ])
        .output()
        .unwrap();
    let v = summary(&out);
    assert_eq!(v["procs"], 1492 * 8, "the site's nodes are the machine");
    assert_eq!(v["policy"], "easy", "the site's bf_mode");
    assert_eq!(v["refused"], 0);
    assert_eq!(v["jobs"], 300);
    // A broken configuration is refused with the key named.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[SchedulerParameters]\nbf_window = 0\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_docket"))
        .args(["sim", "--no-progress", "--swf", &trace(), "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SchedulerParameters.bf_window"), "{err}");
}

/// `--compare` replays the trace under each policy (here sequences of 200 jobs at a load
/// where queues form) and prints one JSON row per policy, and an SVG comparing them; an
/// unknown policy is refused with the known ones named.
#[test]
fn sim_compares_policies_over_windows() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("compare.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_docket"))
        .args([
            "sim",
            "--swf",
            &trace(),
            "--load",
            "0.9",
            "--jobs",
            "1000",
            "--window",
            "200",
            "--samples",
            "3",
            "--compare",
            "easy,easy++,lxf+starve=86400",
            "--json",
        ])
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["easy", "easy++", "lxf+starve=86400"]);
    for r in &rows {
        assert_eq!(r["replays"], 3, "{r}");
        assert_eq!(r["jobs"], 200.0, "{r}");
        assert!(r["mean_bsld"].as_f64().unwrap() >= 1.0, "{r}");
    }
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("mean bounded slowdown"));

    let table = Command::new(env!("CARGO_BIN_EXE_docket"))
        .args([
            "sim",
            "--swf",
            &trace(),
            "--jobs",
            "300",
            "--compare",
            "fcfs,easy",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.contains("mean bsld") && text.lines().count() == 4,
        "{text}"
    );

    let bad = Command::new(env!("CARGO_BIN_EXE_docket"))
        .args(["sim", "--swf", &trace(), "--compare", "easy,best"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("unknown policy \"best\"") && err.contains("easy++"),
        "{err}"
    );
}
