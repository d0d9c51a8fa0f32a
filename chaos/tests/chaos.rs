//! The harness against real processes: a short seeded run with one fault of each kind (the
//! leader and a follower killed with SIGKILL, the leader stopped with SIGSTOP, an agent
//! killed at random and killed exactly at a launch and at an exit, the leader and a follower
//! partitioned from the other replicas and from the agents, the leader's disk filled, a
//! replica's clock jumped) must pass every checker and print the figures, and leave no
//! namespace or link behind; the operators' drills against a running local cluster report
//! their recovery.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bins() -> PathBuf {
    docket_deploy::testing::bin_dir(
        env!("CARGO_BIN_EXE_docket-chaos"),
        &["docket-controller", "docket-nodeagent", "docket-authd"],
    )
}

/// Partitions need network namespaces: root. Elsewhere the run covers the other kinds.
fn privileged() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        assert!(
            std::env::var_os("DOCKET_REQUIRE_PRIVILEGED").is_none(),
            "DOCKET_REQUIRE_PRIVILEGED is set but this test runs without root"
        );
        eprintln!("partitions skipped: network namespaces need root");
    }
    root
}

fn links_of(state: &std::path::Path) -> usize {
    // Every link and namespace of a cluster carries its tag, derived from the state dir.
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("cluster.json")).unwrap())
            .unwrap();
    let Some(tag) = record["cgroup_tag"].as_str().map(|t| t[..6].to_owned()) else {
        return 0;
    };
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    String::from_utf8_lossy(&ns.stdout).matches(&tag).count()
        + String::from_utf8_lossy(&links.stdout).matches(&tag).count()
}

#[test]
fn a_short_run_with_every_fault_kind_passes_every_checker() {
    if !privileged() {
        return;
    }
    let bins = bins();
    // Clock jumps need libfaketime (scripts/test installs it); without it, eight kinds.
    let clock = docket_deploy::local::faketime_available();
    if !clock {
        eprintln!("clock jumps skipped: libfaketime is not installed");
    }
    let kinds = if clock { 12 } else { 11 };
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_docket-chaos"))
        .args([
            "run",
            "--seed",
            "20261121",
            "--faults",
            &kinds.to_string(),
            "--each",
        ])
        .args(["--clients", "4", "--simulated-agents", "4"])
        .arg("--state-dir")
        .arg(dir.path().join("cluster"))
        .arg("--bin-dir")
        .arg(&bins)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    println!("{out}{err}");
    assert!(o.status.success(), "{out}{err}");
    let injected = format!(
        "faults injected:        {kinds} (1 SIGSTOP leader, 1 agent crash at exit, 1 agent crash at launch, {}1 disk full on leader, 1 kill -9 agent, 1 kill -9 follower, 1 kill -9 leader, 1 partition follower, 1 partition follower from agents, 1 partition leader, 1 partition leader from agents)",
        if clock { "1 clock jump, " } else { "" }
    );
    for line in [
        injected.as_str(),
        "lost: 0   duplicated: 0   unexpected: 0   id changed: 0",
        "double runs: 0   overlapping attempts: 0   not final: 0",
        "seed: 20261121   verdict: PASS",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
    assert!(
        out.contains("leader loss -> first committed write:     p50 "),
        "{out}"
    );
    assert!(out.contains("leaders gone back a term: 0"), "{out}");
    assert!(
        out.contains(
            "starts not backed: 0   abandoned yet started: 0   started beyond 1 + requeues: 0"
        ),
        "{out}"
    );
    // The aimed agent crashes landed where they were aimed.
    for kind in ["agent crash at launch", "agent crash at exit"] {
        assert!(
            out.lines()
                .any(|l| l.contains(&format!("] {kind} (")) && l.contains("crashed there")),
            "{kind} did not land:\n{out}"
        );
    }
    // The history stays in a chosen state directory for reading.
    let history = std::fs::read_to_string(dir.path().join("cluster/history.jsonl")).unwrap();
    assert!(history.lines().any(|l| l.starts_with("{\"fault\":")));
    // ... and the cluster is gone, processes, namespaces and links.
    assert!(docket_deploy_gone(&dir.path().join("cluster")));
    assert_eq!(links_of(&dir.path().join("cluster")), 0);
}

fn docket_deploy_gone(state: &std::path::Path) -> bool {
    let needle = state.display().to_string();
    std::fs::read_dir("/proc").unwrap().flatten().all(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| !String::from_utf8_lossy(&c).contains(&needle))
            .unwrap_or(true)
    })
}

/// Stops the local cluster in `0` when the test ends, passed or failed.
struct Down(PathBuf);
impl Drop for Down {
    fn drop(&mut self) {
        if let Ok(cluster) = docket_deploy::LocalCluster::open(&self.0)
            && let Ok(rt) = tokio::runtime::Runtime::new()
        {
            let _ = rt.block_on(cluster.stop(true));
        }
    }
}

#[test]
fn the_operators_drills_report_the_recovery() {
    let bins = bins();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("local");
    let mut layout = docket_deploy::Layout::new(3, 2, 0, state.clone(), bins);
    layout.netns = privileged();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let cluster = docket_deploy::LocalCluster::start(&layout).unwrap();
    let _down = Down(state.clone());
    runtime
        .block_on(cluster.wait_ready(std::time::Duration::from_secs(60)))
        .unwrap();
    // Stopped for 5 s: its agents must find the new leader while it is still stopped (they
    // hold a connection to it that only silence betrays).
    let o = local_drill_for(&state, "pause", 5_000);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let o3 = privileged().then(|| local_drill(&state, "partition"));
    let o2 = local_drill(&state, "kill-leader");
    let out2 = String::from_utf8_lossy(&o2.stdout).into_owned();
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("new leader"), "{out}");
    assert!(out.contains("rejoined as follower"), "{out}");
    println!("{out}");
    let started = figure(&out, "first scheduling decision after ");
    assert!(
        started.is_some_and(|ms| ms < 4_000),
        "a job started only when the stopped leader came back (5 s), or never:\n{out}"
    );
    assert!(o2.status.success(), "{out2}");
    if let Some(o3) = o3 {
        let out3 = String::from_utf8_lossy(&o3.stdout);
        assert!(
            o3.status.success(),
            "{out3}{}",
            String::from_utf8_lossy(&o3.stderr)
        );
        assert!(out3.contains("fault: partition leader"), "{out3}");
        assert!(out3.contains("rejoined as follower"), "{out3}");
    }
    assert!(out2.contains("first committed write after"), "{out2}");
    assert!(out2.contains("jobs lost: 0"), "{out2}");
    assert!(out2.contains("rejoined as follower"), "{out2}");

    // Any cluster: reached only by its addresses, its CA and this host's credentials, broken
    // and healed by the operator's commands.
    a_drill_on_any_cluster_reports_the_recovery(&cluster, &state);
    // A fault command that fails is reported, not taken for a fault.
    a_failing_fault_command_is_reported(&cluster, &state);
}

/// `docket-chaos drill kind` against the local cluster in `state` (2 s pauses).
fn local_drill(state: &Path, kind: &str) -> Output {
    local_drill_for(state, kind, 2_000)
}

/// `docket-chaos drill kind` against the local cluster in `state`, the fault held `hold_ms`.
fn local_drill_for(state: &Path, kind: &str, hold_ms: u64) -> Output {
    Command::new(env!("CARGO_BIN_EXE_docket-chaos"))
        .args([
            "drill",
            kind,
            "--pause-ms",
            &hold_ms.to_string(),
            "--state-dir",
        ])
        .arg(state)
        .output()
        .unwrap()
}

/// The milliseconds a drill's report gives after `label` ("... after 812 ms").
fn figure(report: &str, label: &str) -> Option<u64> {
    report.lines().find_map(|l| {
        let rest = l.trim().strip_prefix(label)?;
        rest.strip_suffix(" ms")?.parse().ok()
    })
}

/// A pause drill given only `cluster`'s addresses, CA and credentials, with SIGSTOP and
/// SIGCONT as its fault and heal commands, reports every recovery figure.
fn a_drill_on_any_cluster_reports_the_recovery(
    cluster: &docket_deploy::LocalCluster,
    state: &Path,
) {
    // The commands signal the replica's process, found by its id and this test's state
    // directory; `[-]` keeps the pattern from matching the shell that runs pkill.
    let ours = format!("[-]-id {{id}} .*{}", state.display());
    let o4 = Command::new(env!("CARGO_BIN_EXE_docket-chaos"))
        .args(["drill", "pause", "--hold-ms", "1000", "--addrs"])
        .arg(cluster.addrs().join(","))
        .arg("--ca")
        .arg(state.join("ca.pem"))
        .arg("--fault-cmd")
        .arg(format!("pkill -STOP -f -- '{ours}'"))
        .arg("--heal-cmd")
        .arg(format!("pkill -CONT -f -- '{ours}'"))
        .arg("--work-dir")
        .arg(state)
        .env("DOCKET_AUTH_SOCKET", cluster.auth_socket().unwrap())
        .env_remove("DOCKET_LOCAL_DIR")
        .output()
        .unwrap();
    let out4 = String::from_utf8_lossy(&o4.stdout);
    assert!(
        o4.status.success(),
        "{out4}{}",
        String::from_utf8_lossy(&o4.stderr)
    );
    for figure in [
        "fault: SIGSTOP leader",
        "new leader",
        "first committed write after",
        "first scheduling decision after",
        "jobs lost: 0",
        "rejoined as follower",
    ] {
        assert!(out4.contains(figure), "{figure}: {out4}");
    }
}

/// A kill-leader drill whose fault command exits 3 fails, naming the exit status.
fn a_failing_fault_command_is_reported(cluster: &docket_deploy::LocalCluster, state: &Path) {
    let o5 = Command::new(env!("CARGO_BIN_EXE_docket-chaos"))
        .args(["drill", "kill-leader", "--addrs"])
        .arg(cluster.addrs().join(","))
        .arg("--ca")
        .arg(state.join("ca.pem"))
        .args(["--fault-cmd", "exit 3", "--heal-cmd", "true"])
        .env("DOCKET_AUTH_SOCKET", cluster.auth_socket().unwrap())
        .output()
        .unwrap();
    assert!(!o5.status.success());
    assert!(
        String::from_utf8_lossy(&o5.stderr).contains("exit 3"),
        "{}",
        String::from_utf8_lossy(&o5.stderr)
    );
}

/// A leader stopped with SIGSTOP holds its agents' connections open; they notice its silence
/// and register with the new leader while it is still stopped, so jobs can start again
/// before it comes back. (They waited for it to come back, or for their calls' 10 s deadline.)
#[test]
fn agents_leave_a_stopped_leader_for_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("local");
    let layout = docket_deploy::Layout::new(3, 2, 0, state.clone(), bins());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut cluster = docket_deploy::LocalCluster::start(&layout).unwrap();
    let _down = Down(state.clone());
    let (old, old_addr) = runtime
        .block_on(cluster.wait_ready(std::time::Duration::from_secs(60)))
        .unwrap();
    let agents: Vec<String> = cluster
        .record
        .agents
        .iter()
        .map(|a| a.spec.name.clone())
        .collect();
    // The replica among `addrs` that leads with every agent responding (only the leader
    // fills `responding`; nothing is asked of the stopped replica, whose silence would
    // hold the question up).
    let all_responding = |addrs: &[String]| {
        runtime.block_on(async {
            for addr in addrs {
                let Ok(Ok(nodes)) = tokio::time::timeout(
                    std::time::Duration::from_secs(1),
                    docket_deploy::rpc::nodes(addr),
                )
                .await
                else {
                    continue;
                };
                let every = agents.iter().all(|a| {
                    nodes
                        .iter()
                        .any(|n| &n.name == a && n.responding == Some(true))
                });
                if every {
                    return Some(addr.clone());
                }
            }
            None
        })
    };
    let start = std::time::Instant::now();
    while all_responding(std::slice::from_ref(&old_addr)).is_none() {
        assert!(start.elapsed().as_secs() < 30, "agents never all responded");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let others = cluster.addrs_except(old);

    cluster.pause_replica(old, true).unwrap();
    let stopped_at = std::time::Instant::now();
    let new = loop {
        if let Some(new) = all_responding(&others) {
            break new;
        }
        if stopped_at.elapsed().as_secs() >= 8 {
            cluster.pause_replica(old, false).unwrap();
            panic!(
                "8 s after the leader (replica {old}) was stopped, its agents had not all registered with a new leader"
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    println!(
        "every agent registered with the replica at {new} {} ms after replica {old} was stopped",
        stopped_at.elapsed().as_millis()
    );
    cluster.pause_replica(old, false).unwrap();
}
