//! The workspace's layering rules (see docs/architecture.md), checked against the resolved dependency graph
//! that `cargo metadata` reports, so a careless `cargo add` fails the build instead of
//! quietly making the scheduler impure.
//!
//! 1. docket-core reaches none of the I/O, async, storage, RPC, tracing or randomness crates,
//!    not even transitively through its normal dependencies.
//! 2. docket-core does not depend on any other Docket crate (the controller converts between
//!    wire messages and core types; the core never sees protobuf).
//! 3. Nothing depends on docket-controller or docket-nodeagent: they are leaves — except
//!    docket-chaos, whose deterministic simulation runs the controller's own state machine
//!    (`CoreMachine`) and request conversion, so that what it proves is about the real code.
//! 4. docket-raft knows nothing of jobs: it does not depend on docket-core.

// Integration tests: a panic is a failed test, which is what we want.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// Crates the pure core must never reach.
const FORBIDDEN_IN_CORE: &[&str] = &[
    "tokio",
    "tonic",
    "prost",
    "rocksdb",
    "librocksdb-sys",
    "openraft",
    "tracing",
    "metrics",
    "rand",
    "getrandom",
    "chrono",
    "mio",
];

struct Graph {
    /// package id -> package name
    names: BTreeMap<String, String>,
    /// package id -> (dependency id, is a normal or build dependency)
    edges: BTreeMap<String, Vec<(String, bool)>>,
    workspace: BTreeSet<String>,
}

/// The host's target triple, as rustc reports it.
fn host_triple() -> String {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned()))
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host")
}

fn graph() -> Graph {
    let manifest = manifest_dir().join("../../Cargo.toml");
    // Offline and filtered to the host platform: the graph that is actually built here, and
    // no download of crates only other platforms need.
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
        ])
        .arg(host_triple())
        .arg("--manifest-path")
        .arg(&manifest)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_owned(),
                p["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let workspace = meta["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap().to_owned())
        .collect();
    let mut edges = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let deps = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let not_dev = d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].as_str() != Some("dev"));
                (d["pkg"].as_str().unwrap().to_owned(), not_dev)
            })
            .collect();
        edges.insert(node["id"].as_str().unwrap().to_owned(), deps);
    }
    Graph {
        names,
        edges,
        workspace,
    }
}

impl Graph {
    fn id_of(&self, name: &str) -> String {
        self.workspace
            .iter()
            .find(|id| self.names[*id] == name)
            .unwrap_or_else(|| panic!("{name} is not a workspace member"))
            .clone()
    }

    /// Every package reachable from `root` through normal and build dependencies, with the
    /// path that reaches it (for the failure message).
    fn reachable(&self, root: &str) -> BTreeMap<String, Vec<String>> {
        let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut stack = vec![(self.id_of(root), vec![root.to_owned()])];
        while let Some((id, path)) = stack.pop() {
            for (dep, not_dev) in self.edges.get(&id).into_iter().flatten() {
                let name = &self.names[dep];
                if *not_dev && !seen.contains_key(name) {
                    let mut p = path.clone();
                    p.push(name.clone());
                    seen.insert(name.clone(), p.clone());
                    stack.push((dep.clone(), p));
                }
            }
        }
        seen
    }

    /// Direct dependencies (any kind) of a workspace member, by name.
    fn direct(&self, name: &str) -> BTreeSet<String> {
        self.edges[&self.id_of(name)]
            .iter()
            .map(|(d, _)| self.names[d].clone())
            .collect()
    }
}

#[test]
fn core_is_pure() {
    let g = graph();
    let reach = g.reachable("docket-core");
    let bad: Vec<String> = FORBIDDEN_IN_CORE
        .iter()
        .filter_map(|f| reach.get(*f).map(|path| path.join(" -> ")))
        .collect();
    assert!(
        bad.is_empty(),
        "docket-core must stay pure, but reaches:\n{}",
        bad.join("\n")
    );
    let ours: Vec<&String> = reach.keys().filter(|n| n.starts_with("docket-")).collect();
    assert!(
        ours.is_empty(),
        "docket-core depends on Docket crates {ours:?}"
    );
}

#[test]
fn daemons_are_leaves() {
    let g = graph();
    for member in &g.workspace {
        let name = &g.names[member];
        if name == "docket-chaos" {
            continue;
        }
        let direct = g.direct(name);
        for leaf in ["docket-controller", "docket-nodeagent"] {
            assert!(
                !direct.contains(leaf),
                "{name} depends on {leaf}, which must be a leaf"
            );
        }
    }
}

#[test]
fn raft_knows_nothing_of_jobs() {
    let g = graph();
    let reach = g.reachable("docket-raft");
    assert!(
        !reach.contains_key("docket-core"),
        "docket-raft reaches docket-core: {:?}",
        reach["docket-core"]
    );
}

/// This crate's directory, read when the test runs (cargo and nextest set it) rather than
/// baked in at compile time: a test binary built from one clone and reused by another through
/// a shared target directory must still read the tree it is testing.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
