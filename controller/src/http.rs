//! The controller's HTTP endpoints: the status page (`/`, `/jobs/ID`; [`crate::web`]),
//! `/metrics` (Prometheus text, prefix `docket_`) and `/status` (JSON: this replica's Raft
//! status, the loops' figures, jobs and nodes by state).
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
    /// This replica's accounting archive (its RocksDB memory is reported).
    pub archive: Arc<crate::archive::Archive>,
    pub stats: Arc<std::sync::Mutex<LoopStats>>,
    pub inflight: Arc<AtomicUsize>,
    pub prometheus: Option<PrometheusHandle>,
    /// What the status page plots.
    pub history: Arc<std::sync::Mutex<crate::web::history::History>>,
    /// Where the leader's status page is, as a follower last heard.
    pub leader_pages: crate::web::leader_page::LeaderPages,
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
        Ok(handle) => {
            describe_metrics();
            Some(handle)
        }
        Err(e) => {
            tracing::warn!(error = %e, "metrics recorder not installed; /metrics will be empty");
            None
        }
    }
}

/// Every family `/metrics` serves, with its help text. Counters start at zero with each
/// label set they can take, so every replica exports every family from its first scrape:
/// `rate()` and `increase()` in alert rules see a series before the first event, and the
/// dashboards and rules in `deploy/` are checked against a real scrape.
fn describe_metrics() {
    use metrics::describe_gauge;
    describe_gauge!(
        "docket_jobs",
        "Jobs in the replica's applied state, by state."
    );
    describe_gauge!(
        "docket_nodes",
        "Nodes by state (idle, mix, alloc, drain, draining, down)."
    );
    describe_gauge!("docket_raft_term", "The replica's current Raft term.");
    describe_gauge!("docket_raft_is_leader", "1 on the leader, 0 elsewhere.");
    describe_gauge!(
        "docket_raft_leader_id",
        "The leader this replica knows of (0: none)."
    );
    describe_gauge!(
        "docket_raft_last_log_index",
        "The replica's last log index."
    );
    describe_gauge!(
        "docket_raft_applied_index",
        "The last log index applied to the state."
    );
    describe_gauge!(
        "docket_raft_snapshot_index",
        "The last index in the replica's snapshot."
    );
    describe_gauge!(
        "docket_raft_replica_lag_entries",
        "On the leader: how many entries each replica is behind."
    );
    describe_gauge!(
        "docket_rocksdb_memory_bytes",
        metrics::Unit::Bytes,
        "What RocksDB holds in memory, by database (log, archive) and kind (memtables, \
         table_readers, block_cache)."
    );
    describe_scheduler_and_rpc_metrics();
}

/// The families of the scheduling passes, the RPCs and the leader changes, counters started
/// at zero.
fn describe_scheduler_and_rpc_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!("docket_rpcs_in_flight", "Users' RPCs being served now.");
    describe_gauge!(
        "docket_controller_ready",
        "1 once the replica serves requests."
    );
    describe_gauge!(
        "docket_sched_pass_depth",
        "Jobs the last pass of each kind considered."
    );
    describe_histogram!(
        "docket_sched_pass_duration_seconds",
        Unit::Seconds,
        "How long each scheduling pass took."
    );
    describe_histogram!(
        "docket_rpc_duration_seconds",
        Unit::Seconds,
        "How long users' RPCs took, by method."
    );
    describe_counter!(
        "docket_sched_jobs_started_total",
        "Jobs the leader's passes started, by pass."
    );
    describe_counter!(
        "docket_sched_pass_yields_total",
        "Passes that stopped before the end of their order, by pass and reason."
    );
    describe_counter!(
        "docket_sched_backfill_state_changed_total",
        "Backfill cycles that started over after a yield because the state changed."
    );
    describe_counter!(
        "docket_rpc_rate_limited_total",
        "Requests refused by the per-user rate limit."
    );
    describe_counter!(
        "docket_raft_leader_changes_total",
        "Leaders this replica has seen come to power."
    );
    describe_counter!(
        "docket_raft_read_indexes_total",
        "Read indexes this replica named as leader, by how its leadership was confirmed: \
         from a quorum's saved votes, or by openraft's slower check when those fell short."
    );
    for kind in crate::stats::PassKind::ALL {
        let pass = kind.name();
        metrics::counter!("docket_sched_jobs_started_total", "pass" => pass).absolute(0);
        for reason in crate::stats::STOP_REASONS {
            metrics::counter!("docket_sched_pass_yields_total", "pass" => pass, "reason" => reason)
                .absolute(0);
        }
    }
    metrics::counter!("docket_sched_backfill_state_changed_total").absolute(0);
    metrics::counter!("docket_rpc_rate_limited_total").absolute(0);
    metrics::counter!("docket_raft_leader_changes_total").absolute(0);
}

/// The router serving `/metrics` and `/status`.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/", get(crate::web::overview))
        .route("/jobs/{id}", get(crate::web::job))
        .route("/refresh.js", get(crate::web::script))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(state)
}

/// Jobs and nodes by state.
type Counts = (BTreeMap<String, u64>, BTreeMap<String, u64>);

/// Counts taken at once by `/metrics` and `/status`: each walks every job, so the anonymous
/// port may not stack such walks up; one more waits its turn at most [`COUNT_WAIT`].
static COUNTING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
const COUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// [`counts`] on the blocking pool, one walk at a time; `None` when the turn did not come.
async fn counted(state: &HttpState) -> Option<Counts> {
    let _turn = tokio::time::timeout(COUNT_WAIT, COUNTING.acquire())
        .await
        .ok()?
        .ok()?;
    let state = state.clone();
    tokio::task::spawn_blocking(move || counts(&state))
        .await
        .ok()
}

fn busy() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "busy counting; try again",
    )
        .into_response()
}

fn counts(state: &HttpState) -> Counts {
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

async fn metrics(AxumState(state): AxumState<HttpState>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some((jobs, nodes)) = counted(&state).await else {
        return busy();
    };
    for st in docket_core::job::JobState::ALL {
        let name = st.name().to_lowercase();
        let n = jobs.get(&name).copied().unwrap_or(0);
        metrics::gauge!("docket_jobs", "state" => name).set(n as f64);
    }
    // Every state, so a state no node is in any more reads 0 rather than its last count.
    for st in docket_core::node::NodeState::ALL {
        let name = format!("{st:?}").to_lowercase();
        let n = nodes.get(&name).copied().unwrap_or(0);
        metrics::gauge!("docket_nodes", "state" => name).set(n as f64);
    }
    let raft = state.replica.status();
    metrics::gauge!("docket_raft_term").set(raft.term as f64);
    metrics::gauge!("docket_raft_is_leader").set(if raft.role == Role::Leader { 1.0 } else { 0.0 });
    metrics::gauge!("docket_raft_leader_id").set(raft.leader.map_or(0.0, |l| l.0 as f64));
    metrics::gauge!("docket_raft_last_log_index").set(raft.last_log_index.unwrap_or(0) as f64);
    metrics::gauge!("docket_raft_applied_index").set(raft.applied_index.unwrap_or(0) as f64);
    metrics::gauge!("docket_raft_snapshot_index").set(raft.snapshot_index.unwrap_or(0) as f64);
    let (by_votes, by_openraft) = state.replica.read_index_counts();
    metrics::counter!("docket_raft_read_indexes_total", "confirmed" => "votes").absolute(by_votes);
    metrics::counter!("docket_raft_read_indexes_total", "confirmed" => "openraft")
        .absolute(by_openraft);
    for m in &raft.members {
        if let Some(lag) = m.lag {
            metrics::gauge!("docket_raft_replica_lag_entries", "replica" => m.id.0.to_string())
                .set(lag as f64);
        }
    }
    metrics::gauge!("docket_rpcs_in_flight").set(state.inflight.load(Ordering::Relaxed) as f64);
    set_rocks_memory(&state);
    state
        .prometheus
        .as_ref()
        .map(|p| p.render())
        .unwrap_or_default()
        .into_response()
}

/// RocksDB's own memory for the log and the archive (property reads, no I/O).
fn set_rocks_memory(state: &HttpState) {
    for (db, memory) in [
        ("log", state.replica.rocks_memory()),
        ("archive", state.archive.memory()),
    ] {
        for (kind, bytes) in memory.by_kind() {
            metrics::gauge!("docket_rocksdb_memory_bytes", "db" => db, "kind" => kind)
                .set(bytes as f64);
        }
    }
}

async fn status(AxumState(state): AxumState<HttpState>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some((jobs, nodes)) = counted(&state).await else {
        return busy();
    };
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
    .into_response()
}
