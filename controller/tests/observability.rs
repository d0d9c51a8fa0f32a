//! The Grafana dashboard and the Prometheus alert rules in `deploy/`, against what three
//! real `docket-controller` processes serve: the dashboard parses, every metric it or the
//! rules name is a family the replicas export, every exported family is on the dashboard,
//! and the rules pass `promtool check rules` and their own unit tests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Cluster, DEADLINE, as_user, job, submit};
use docket_proto::v1 as pb;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every `docket_*` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("docket_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// Every `name{label="value"}` equality matcher in `text`, as (name, `label="value"`).
fn matchers(text: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for name in metric_names(text) {
        let open = format!("{name}{{");
        for (at, _) in text.match_indices(&open) {
            let inside = &text[at + open.len()..];
            let Some(end) = inside.find('}') else {
                continue;
            };
            for m in inside[..end].split(',') {
                let m = m.trim();
                if let Some((label, value)) = m.split_once('=')
                    && !value.starts_with('~')
                    && !label.ends_with('!')
                {
                    out.insert((name.clone(), format!("{}={}", label.trim(), value.trim())));
                }
            }
        }
    }
    out
}

/// The families a `/metrics` body declares (`# TYPE name kind`).
fn families(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// A name a query uses, as the family it belongs to (histograms' series carry suffixes).
fn family_of(name: &str, exported: &BTreeSet<String>) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && exported.contains(base)
        {
            return base.to_owned();
        }
    }
    name.to_owned()
}

/// Every query of the dashboard, checking its structure on the way.
fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(deploy().join("grafana/docket.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(dash["uid"], "docket-overview");
    let panels = dash["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut queries = Vec::new();
    for p in panels {
        let id = p["id"].as_u64().expect("every panel has an id");
        assert!(ids.insert(id), "panel id {id} twice");
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title: {p}");
        if p["type"] == "row" {
            continue;
        }
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} queries nothing");
        for t in targets {
            let expr = t["expr"].as_str().expect("a PromQL expression");
            assert!(expr.contains("docket_"), "panel {title}: {expr}");
            queries.push(expr.to_owned());
        }
        let grid = &p["gridPos"];
        assert!(
            grid["w"].as_u64().is_some_and(|w| (1..=24).contains(&w)),
            "panel {title}: {grid}"
        );
    }
    queries
}

/// Scrapes `leader` until the histograms have series; the families it declares, and the body.
async fn wait_for_histograms(cluster: &Cluster, leader: u64) -> (BTreeSet<String>, String) {
    let start = Instant::now();
    loop {
        let body = cluster.http_get(leader, "/metrics");
        let f = families(&body);
        if f.contains("docket_sched_pass_duration_seconds")
            && f.contains("docket_rpc_duration_seconds")
            && f.contains("docket_raft_replica_lag_entries")
        {
            break (f, body);
        }
        assert!(
            start.elapsed() < DEADLINE,
            "histograms never appeared:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks a call of a method nobody serves is counted as `unimplemented`, not by its path.
async fn check_unknown_method_is_counted_as_unimplemented(cluster: &Cluster, leader: u64) {
    let mut raw = tonic::client::Grpc::new(common::channel(&cluster.addrs[&leader]));
    raw.ready().await.unwrap();
    let e = raw
        .unary::<pb::AssociationsRequest, pb::AssociationsResponse, _>(
            as_user("alice", pb::AssociationsRequest {}),
            tonic::codegen::http::uri::PathAndQuery::from_static("/docket.v1.Jobs/NoSuchMethod7"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    let scraped = cluster.http_get(leader, "/metrics");
    assert!(!scraped.contains("NoSuchMethod7"), "{scraped}");
    assert!(scraped.contains("method=\"unimplemented\""), "{scraped}");
}

/// Checks every family `queries` and `rules` read is `exported`; those the dashboard reads.
fn check_read_families_exist(
    queries: &[String],
    rules: &str,
    exported: &BTreeSet<String>,
) -> BTreeSet<String> {
    let dashboard_names: BTreeSet<String> = queries
        .iter()
        .flat_map(|q| metric_names(q))
        .map(|n| family_of(&n, exported))
        .collect();
    let rule_names: BTreeSet<String> = metric_names(rules)
        .iter()
        .map(|n| family_of(n, exported))
        .collect();
    assert!(rule_names.len() >= 5, "{rule_names:?}");
    for name in dashboard_names.iter().chain(&rule_names) {
        assert!(
            exported.contains(name),
            "{name} is not exported; the leader exports {exported:?}"
        );
    }
    dashboard_names
}

/// Checks every series `queries` and `rules` select by label is in the scraped `body`.
fn check_selected_series_exist(queries: &[String], rules: &str, body: &str) {
    let selected = queries
        .iter()
        .flat_map(|q| matchers(q))
        .chain(matchers(rules));
    let mut checked = 0;
    for (name, matcher) in selected {
        let present = body
            .lines()
            .any(|l| l.starts_with(&format!("{name}{{")) && l.contains(&matcher));
        assert!(present, "no {name} series with {matcher} in\n{body}");
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} label matchers checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_alert_rules_name_only_what_the_replicas_export() {
    let queries = dashboard_queries();
    let rules = std::fs::read_to_string(deploy().join("prometheus/alerts.yml")).unwrap();

    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.follower_of(leader);
    // A request and a few passes, so the histograms have series.
    let mut jobs = cluster.jobs(leader).await;
    submit(&mut jobs, "alice", vec![job("observed", "debug")])
        .await
        .unwrap();
    let (exported, body) = wait_for_histograms(&cluster, leader).await;
    // Whoever reaches the port cannot mint label values: a method no service serves is
    // counted as `unimplemented`, not under the path it was sent to.
    check_unknown_method_is_counted_as_unimplemented(&cluster, leader).await;
    let mut admin = cluster.admin(follower).await;
    admin
        .cluster_status(as_user("alice", pb::ClusterStatusRequest::default()))
        .await
        .unwrap();
    let on_follower = families(&cluster.http_get(follower, "/metrics"));

    // Everything the dashboard and the rules read exists.
    let dashboard_names = check_read_families_exist(&queries, &rules, &exported);
    // The series the rules and panels select by label exist too (a misspelt state or
    // reason would select nothing, and an alert on it would never fire).
    check_selected_series_exist(&queries, &rules, &body);
    // And the dashboard shows everything exported.
    let docket: BTreeSet<&String> = exported
        .iter()
        .filter(|f| f.starts_with("docket_"))
        .collect();
    let missing: Vec<&&String> = docket
        .iter()
        .filter(|f| !dashboard_names.contains(**f))
        .collect();
    assert!(missing.is_empty(), "not on the dashboard: {missing:?}");
    // A follower exports the same families but the leader's own: its view of the others'
    // lag, and the passes only a leader runs (the counters start at zero everywhere).
    let leader_only: BTreeSet<&str> = docket
        .iter()
        .filter(|f| !on_follower.contains(**f))
        .map(|f| f.as_str())
        .collect();
    assert_eq!(
        leader_only,
        BTreeSet::from([
            "docket_raft_replica_lag_entries",
            "docket_sched_pass_depth",
            "docket_sched_pass_duration_seconds",
        ]),
        "families only the leader exports"
    );
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let dir = deploy().join("prometheus");
    let promtool = std::process::Command::new("promtool")
        .arg("--version")
        .output();
    if promtool.is_err() {
        let why = "promtool not found (Debian's prometheus package; scripts/test installs it)";
        if std::env::var("DOCKET_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
            panic!("{why}");
        }
        eprintln!("skipped: {why}");
        return;
    }
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
