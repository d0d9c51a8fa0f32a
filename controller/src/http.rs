//! The controller's HTTP endpoints: `/metrics` (Prometheus text, prefix `docket_`) and
//! `/status` (JSON: this replica's Raft status, the loops' figures, jobs and nodes by state).
//!
//! Gauges that describe state (jobs and nodes by state, Raft indexes and lag) are set when
//! scraped, from the replica's applied state; counters and histograms (passes, RPCs) are
//! recorded where things happen.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State as AxumState;
use axum::routing::get;
use docket_raft::replica::Replica;
use docket_raft::status::Role;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::machine::CoreMachine;
use crate::stats::LoopStats;

/// What the endpoints read.
#[derive(Clone)]
pub struct HttpState {
    pub replica: Replica<CoreMachine>,
    pub stats: Arc<std::sync::Mutex<LoopStats>>,
    pub inflight: Arc<AtomicUsize>,
    pub prometheus: Option<PrometheusHandle>,
}

impl std::fmt::Debug for HttpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpState").finish_non_exhaustive()
    }
}

/// Installs the Prometheus recorder for this process (once) and returns its handle.
pub fn install_recorder() -> Option<PrometheusHandle> {
    let builder = metrics_exporter_prometheus::PrometheusBuilder::new();
    match builder.install_recorder() {
        Ok(handle) => Some(handle),
        Err(e) => {
            tracing::warn!(error = %e, "metrics recorder not installed; /metrics will be empty");
            None
        }
    }
}

/// The router serving `/metrics` and `/status`.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(state)
}

fn counts(state: &HttpState) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    state.replica.read_stale(|a| {
        let s = &a.machine.state;
        let mut jobs: BTreeMap<String, u64> = BTreeMap::new();
        for j in s.jobs.values() {
            *jobs.entry(j.state.name().to_lowercase()).or_default() += 1;
        }
        let mut nodes: BTreeMap<String, u64> = BTreeMap::new();
        for n in s.nodes.values() {
            *nodes
                .entry(format!("{:?}", n.state()).to_lowercase())
                .or_default() += 1;
        }
        (jobs, nodes)
    })
}

async fn metrics(AxumState(state): AxumState<HttpState>) -> String {
    let (jobs, nodes) = counts(&state);
    for st in docket_core::job::JobState::ALL {
        let name = st.name().to_lowercase();
        let n = jobs.get(&name).copied().unwrap_or(0);
        metrics::gauge!("docket_jobs", "state" => name).set(n as f64);
    }
    for (st, n) in nodes {
        metrics::gauge!("docket_nodes", "state" => st).set(n as f64);
    }
    let raft = state.replica.status();
    metrics::gauge!("docket_raft_term").set(raft.term as f64);
    metrics::gauge!("docket_raft_is_leader").set(if raft.role == Role::Leader { 1.0 } else { 0.0 });
    metrics::gauge!("docket_raft_leader_id").set(raft.leader.map_or(0.0, |l| l.0 as f64));
    metrics::gauge!("docket_raft_last_log_index").set(raft.last_log_index.unwrap_or(0) as f64);
    metrics::gauge!("docket_raft_applied_index").set(raft.applied_index.unwrap_or(0) as f64);
    metrics::gauge!("docket_raft_snapshot_index").set(raft.snapshot_index.unwrap_or(0) as f64);
    for m in &raft.members {
        if let Some(lag) = m.lag {
            metrics::gauge!("docket_raft_replica_lag_entries", "replica" => m.id.0.to_string())
                .set(lag as f64);
        }
    }
    metrics::gauge!("docket_rpcs_in_flight").set(state.inflight.load(Ordering::Relaxed) as f64);
    state
        .prometheus
        .as_ref()
        .map(|p| p.render())
        .unwrap_or_default()
}

async fn status(AxumState(state): AxumState<HttpState>) -> axum::Json<serde_json::Value> {
    let (jobs, nodes) = counts(&state);
    let stats = state
        .stats
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    axum::Json(serde_json::json!({
        "raft": state.replica.status(),
        "loops": stats,
        "jobs": jobs,
        "nodes": nodes,
        "rpcs_in_flight": state.inflight.load(Ordering::Relaxed),
    }))
}
