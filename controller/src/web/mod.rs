//! The status page every replica serves on its HTTP port (`/`, and `/jobs/ID`): the
//! cluster's replicas and roles, the nodes as a grid coloured by state with their reasons
//! and jobs, the partitions, the queue (filtered by user, partition and state), a job's
//! priority factors, reason, steps and output paths, and the scheduler's passes.
//!
//! Rendered on the server from askama templates (`controller/templates/`, HTML-escaped);
//! a few lines of plain JavaScript ask for the page's main part again every five seconds
//! (`X-Docket-Partial`) and swap it in, so it updates without reloading. Any replica
//! answers from its own applied state; a follower says so, names the leader and links to
//! its page ([`leader_page`]). What it
//! shows, anyone reaching the port may see: the privacy rules are in [`view`].

pub mod history;
pub mod leader_page;
pub mod view;

use askama::Template;
use axum::extract::{Path, Query, State as AxumState};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};

use crate::http::HttpState;
use view::{Filter, JobPage, Overview};

/// The header the page's script sends to get only the main part.
const PARTIAL: &str = "x-docket-partial";

/// Pages rendered at once. A page walks every job (the counts) under the state's read
/// lock, and the port takes requests from anyone who reaches it: more requests than this
/// wait their turn instead of stacking up work beside the replica's own.
const RENDERING_AT_ONCE: usize = 1;

/// How long a request waits for its turn before it is told to come back (503).
const TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits for a turn to render, at most [`TURN_WAIT`].
async fn turn() -> Option<tokio::sync::SemaphorePermit<'static>> {
    tokio::time::timeout(TURN_WAIT, RENDERING.acquire())
        .await
        .ok()
        .and_then(Result::ok)
}

fn busy() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, "busy rendering; try again").into_response()
}

static RENDERING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(RENDERING_AT_ONCE);

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage<'a> {
    replica: u64,
    role: &'a str,
    v: &'a Overview,
}

#[derive(Template)]
#[template(path = "overview_main.html")]
struct OverviewMain<'a> {
    v: &'a Overview,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobFull<'a> {
    replica: u64,
    role: &'a str,
    j: &'a JobPage,
}

#[derive(Template)]
#[template(path = "job_main.html")]
struct JobMain<'a> {
    j: &'a JobPage,
}

fn html(rendered: askama::Result<String>) -> Response {
    let mut response = match rendered {
        Ok(body) => Html(body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("rendering: {e}")).into_response(),
    };
    // Always fresh (the whole page and its main part share a URL), never sniffed as
    // anything but what it says, scripts only the page's own.
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::VARY, HeaderValue::from_static(PARTIAL));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'unsafe-inline'; \
             object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
        ),
    );
    response
}

/// `/`: the overview.
pub async fn overview(
    AxumState(state): AxumState<HttpState>,
    Query(filter): Query<Filter>,
    headers: HeaderMap,
) -> Response {
    // Asked before the turn is taken: a slow leader holds up this page alone.
    let leader_page = state.leader_pages.find(&state.replica).await;
    let Some(_turn) = turn().await else {
        return busy();
    };
    let partial = headers.contains_key(PARTIAL);
    // The walk over every job runs on the blocking pool, not on the async workers that
    // serve gRPC and Raft.
    blocking(move || {
        let raft = state.replica.status();
        let loops = state
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut v = state
            .replica
            .read_stale(|a| view::overview(&a.machine.state, &raft, &loops, filter));
        v.plots = state
            .history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .plots_for(v.private);
        v.leader_page = leader_page;
        let role = raft.role.to_string();
        page(
            partial,
            &OverviewMain { v: &v },
            &OverviewPage {
                replica: raft.id.0,
                role: &role,
                v: &v,
            },
        )
    })
    .await
}

/// `/jobs/ID`: one job.
pub async fn job(
    AxumState(state): AxumState<HttpState>,
    Path(id): Path<u64>,
    headers: HeaderMap,
) -> Response {
    let Some(_turn) = turn().await else {
        return busy();
    };
    let partial = headers.contains_key(PARTIAL);
    blocking(move || {
        let raft = state.replica.status();
        let found = state.replica.read_stale(|a| {
            let s = &a.machine.state;
            view::job_page(s, id, s.applied.now)
        });
        let Some(j) = found else {
            return (
                StatusCode::NOT_FOUND,
                format!("no job {id} here (or jobs are private on this cluster)"),
            )
                .into_response();
        };
        let role = raft.role.to_string();
        page(
            partial,
            &JobMain { j: &j },
            &JobFull {
                replica: raft.id.0,
                role: &role,
                j: &j,
            },
        )
    })
    .await
}

/// The main part alone (the script's refresh) or the whole page.
fn page(partial: bool, main: &impl Template, full: &impl Template) -> Response {
    html(if partial {
        main.render()
    } else {
        full.render()
    })
}

/// Runs `render` on the blocking pool.
async fn blocking(render: impl FnOnce() -> Response + Send + 'static) -> Response {
    tokio::task::spawn_blocking(render)
        .await
        .unwrap_or_else(|e| {
            (StatusCode::INTERNAL_SERVER_ERROR, format!("rendering: {e}")).into_response()
        })
}

/// `/refresh.js`: the page's one script, served from the page's own origin (the content
/// security policy allows no other).
pub async fn script() -> Response {
    let mut response = (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        REFRESH_JS,
    )
        .into_response();
    response.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// Refreshes the page's main part every five seconds, without reloading.
const REFRESH_JS: &str = r#"setInterval(async () => {
  try {
    const r = await fetch(location.href, { headers: { "X-Docket-Partial": "1" } });
    if (r.ok) { document.querySelector("main").innerHTML = await r.text(); }
  } catch (e) { /* the replica may be restarting; try again later */ }
}, 5000);
"#;

/// Samples this replica into `history` every `interval`, for ever (the caller stops it).
pub async fn sample_every(
    interval: std::time::Duration,
    replica: docket_raft::replica::Replica<crate::machine::CoreMachine>,
    stats: std::sync::Arc<std::sync::Mutex<crate::stats::LoopStats>>,
    history: std::sync::Arc<std::sync::Mutex<history::History>>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let loops = stats.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let at_ms = docket_proto::unix_ms();
        let sample = replica.read_stale(|a| history::Sample::of(&a.machine.state, &loops, at_ms));
        history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(sample);
    }
}
