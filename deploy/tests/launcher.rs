//! `docket-local` end to end: up (3 controllers, 4 agents), status, the quick start's demo
//! to its summary, the lifecycle benchmark, a second `up` refused, logs, down — and then no process, mount or cgroup
//! of the cluster is left; and an `up` into a directory no launcher created is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// docket-local's directory, with the binaries it starts.
fn bin_dir() -> PathBuf {
    docket_deploy::testing::bin_dir(
        env!("CARGO_BIN_EXE_docket-local"),
        &[
            "docket-controller",
            "docket-nodeagent",
            "docket-authd",
            "docket",
        ],
    )
}

fn local(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_docket-local"))
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .output()
        .unwrap()
}

use docket_deploy::testing::output_text as text;

/// Stops the cluster if the test fails half-way.
struct Down<'a>(&'a Path);
impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = local(self.0, &["down"]);
    }
}

#[test]
fn the_launcher_runs_the_demo_and_leaves_nothing_behind() {
    let privileged = nix::unistd::geteuid().is_root();
    if !privileged {
        if std::env::var_os("DOCKET_REQUIRE_PRIVILEGED").is_some() {
            panic!("DOCKET_REQUIRE_PRIVILEGED is set but this test runs without root");
        }
        eprintln!("skipped: the demo's memory-limit job needs root for cgroups");
        return;
    }
    let bins = bin_dir();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("cluster");
    let _down = Down(&state);

    // A mistyped --state-dir naming someone's directory is refused, never emptied.
    up_refuses_someone_elses_directory(dir.path(), &bins);

    up_starts_three_controllers_and_four_agents(&state, &bins);
    let o = local(&state, &["up"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("already runs"), "{}", text(&o));

    let o = local(&state, &["status"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert_eq!(out.matches(" leader ").count(), 1, "{out}");
    assert_eq!(out.matches("yes").count(), 4, "every agent responds: {out}");

    let o = local(&state, &["demo"]);
    let out = text(&o);
    println!("{out}");
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("verdict:                   everything shown, nothing lost"),
        "{out}"
    );
    assert!(out.contains("jobs lost:                 0"), "{out}");

    // The lifecycle benchmark, small: real sbatch processes and an array, to their end.
    the_lifecycle_benchmark_runs_to_the_end(&state);

    let o = local(&state, &["logs", "controller-1", "-n", "5"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("controller-1.log"));
    assert!(!text(&o).contains('\u{1b}'), "no colour codes in log files");

    let cgroups = agent_cgroups(&state);
    let o = local(&state, &["down"]);
    assert!(o.status.success(), "{}", text(&o));
    let left = docket_deploy::cleanup::processes_naming(&state);
    assert!(left.is_empty(), "processes left: {left:?}");
    assert!(docket_deploy::cleanup::mounts_under(&state).is_empty());
    for c in cgroups {
        assert!(!c.exists(), "cgroup left: {}", c.display());
    }
    let o = local(&state, &["status"]);
    assert!(
        text(&o).contains("false") && !text(&o).contains("true "),
        "{}",
        text(&o)
    );
}

/// `up` with a --state-dir naming an existing directory of someone's (under `dir`): refused,
/// and the directory's file kept.
fn up_refuses_someone_elses_directory(dir: &Path, bins: &Path) {
    let theirs = dir.join("someones-home");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("notes.txt"), "keep me").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_docket-local"))
        .arg("--state-dir")
        .arg(&theirs)
        .args(["up", "--bin-dir"])
        .arg(bins)
        .output()
        .unwrap();
    let out = text(&o);
    assert!(!o.status.success() && out.contains("refusing"), "{out}");
    assert_eq!(
        std::fs::read_to_string(theirs.join("notes.txt")).unwrap(),
        "keep me"
    );
}

/// `up` in `state`: it succeeds, prints DOCKET_ADDR, 3 controllers and 4 agents, and links
/// the commands.
fn up_starts_three_controllers_and_four_agents(state: &Path, bins: &Path) {
    let o = Command::new(env!("CARGO_BIN_EXE_docket-local"))
        .arg("--state-dir")
        .arg(state)
        .args(["up", "--bin-dir"])
        .arg(bins)
        .output()
        .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("export DOCKET_ADDR=127.0.0.1:"), "{out}");
    assert_eq!(out.matches("  controller ").count(), 3, "{out}");
    assert_eq!(out.matches("  agent n0").count(), 4, "{out}");
    assert!(state.join("bin/sbatch").exists());
}

/// `bench --jobs 20 --loops 4`: every figure is printed and every job completed.
fn the_lifecycle_benchmark_runs_to_the_end(state: &Path) {
    let o = local(state, &["bench", "--jobs", "20", "--loops", "4"]);
    let out = text(&o);
    println!("{out}");
    assert!(o.status.success(), "{out}");
    for line in [
        "20 sbatch processes from 4 loops:",
        "  sbatch processes:   20 in ",
        "  to completion:      20 jobs, first submission to last end ",
        "an array of 20 tasks:",
        "  submit -> start:    p50 ",
        "  cpu per job:        leader ",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(line)),
            "missing {line:?} in\n{out}"
        );
    }
    assert!(!out.contains("NOT COMPLETED"), "{out}");
}

/// The cgroups of every agent, from the cluster record in `state`.
fn agent_cgroups(state: &Path) -> Vec<PathBuf> {
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("cluster.json")).unwrap())
            .unwrap();
    record["agents"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| a["cgroups"].as_array().cloned().unwrap_or_default())
        .map(|c| PathBuf::from(c.as_str().unwrap()))
        .collect()
}

/// The scale benchmark on a small scale: simulated agents, each its own process, run
/// whole-node jobs to completion; the figures are printed and the cluster is removed.
#[test]
fn the_scale_benchmark_runs_every_job_and_removes_its_cluster() {
    let bins = bin_dir();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("scale");
    let _down = Down(&state);
    let o = Command::new(env!("CARGO_BIN_EXE_docket-local"))
        .arg("--state-dir")
        .arg(&state)
        .args(["scale", "--agents", "24", "--jobs", "60", "--runtime", "2"])
        .args(["--heartbeat-ms", "500", "--batch", "25", "--bin-dir"])
        .arg(&bins)
        .output()
        .unwrap();
    let out = text(&o);
    println!("{out}");
    assert!(o.status.success(), "{out}");
    for line in [
        "every agent registered and responding:",
        "agents' memory (PSS):",
        "every job started:",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    assert!(
        out.contains("final states:                          60 COMPLETED\n"),
        "{out}"
    );
    assert!(
        !state.exists(),
        "the scale cluster's state directory is left"
    );
    let needle = state.display().to_string();
    let left = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
    });
    assert!(!left, "a process of the scale cluster is left");
}
