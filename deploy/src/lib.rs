//! A local Docket cluster: N controller replicas and M node agents as real processes on
//! loopback, sharing one state directory.
//!
//! The `docket-local` binary (up, down, status, logs, drill, demo) and the chaos harness both
//! start clusters through [`LocalCluster`]: the same binaries, flags and configuration an
//! operator runs, only on one host. Every process is started in a session of its own with
//! its output in `STATE/logs/`, and recorded in `STATE/cluster.json`, so a later invocation
//! (`docket-local down`) finds and stops exactly what an earlier one started, and nothing is
//! left behind: no process, no job monitor, no cgroup, no mount.

pub mod cleanup;
pub mod drill;
pub mod layout;
pub mod local;
pub mod net;
pub mod rpc;
pub mod state_dir;
pub mod stats;
pub mod testing;

pub use layout::{AgentSpec, Layout};
pub use local::LocalCluster;

/// What can go wrong starting, driving or stopping a local cluster.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Rpc(String),
    #[error("{0}")]
    Invalid(String),
}

/// The directory of the running binary, where the workspace's other binaries are built too
/// (or `explicit`).
pub fn bin_dir(explicit: Option<std::path::PathBuf>) -> Result<std::path::PathBuf, LaunchError> {
    if let Some(d) = explicit {
        return Ok(d);
    }
    let me = std::env::current_exe().map_err(LaunchError::io("locating this binary"))?;
    me.parent()
        .map(std::path::Path::to_path_buf)
        .ok_or_else(|| LaunchError::Invalid(format!("{} has no directory", me.display())))
}

impl LaunchError {
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
        let what = what.into();
        move |source| LaunchError::Io { what, source }
    }
}

/// Resolves when this process is asked to stop (SIGTERM, or SIGINT from a terminal), naming
/// the signal: a long command that started a cluster selects on it so that the cluster is
/// stopped, not orphaned, when a test runner's timeout or an operator ends the command.
pub async fn interrupted() -> &'static str {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}
