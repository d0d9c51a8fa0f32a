//! `docket-authd`: the credential signer of one host (like munged, or Slurm's sackd).
//!
//! Runs on every host users submit from (login nodes and compute nodes) as root, with the
//! cluster key. Any local process may ask it for a credential over its Unix socket and gets
//! one for exactly the uid and groups the kernel says it has; `docket`, `sbatch` and the
//! other commands do so before every request. SIGHUP re-reads the key file (key rotation);
//! SIGTERM stops it.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use docket_auth::KeyRing;
use docket_auth::signer::{self, SignerConfig};

/// Signs credentials for local processes: the uid and groups the kernel reports for each
/// caller, with the cluster key.
#[derive(Debug, Parser)]
#[command(name = "docket-authd", version, about, long_about)]
struct Args {
    /// The Unix socket to listen on (made 0666: any local user may ask for their own
    /// credential).
    #[arg(long, env = "DOCKET_AUTH_SOCKET", default_value = signer::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The cluster's credential key file (readable by root and the controllers only).
    #[arg(long, env = "DOCKET_AUTH_KEY", default_value = "/etc/docket/auth.key")]
    key: PathBuf,
    /// How long a credential lives, seconds (controllers also allow for clock skew).
    #[arg(long, env = "DOCKET_AUTH_TTL_S", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    ttl_s: u64,
    /// The host name carried in credentials (default: this host's name).
    #[arg(long, env = "DOCKET_AUTH_HOST")]
    host: Option<String>,
    /// Clients served at once; more are told to retry.
    #[arg(long, env = "DOCKET_AUTH_MAX_CLIENTS", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_clients: u64,
    /// Log filter (tracing's EnvFilter syntax).
    #[arg(long, env = "DOCKET_LOG", default_value = "info")]
    log: String,
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("docket-authd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&args.log)
                .with_context(|| format!("--log {:?}", args.log))?,
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let ring = KeyRing::load(&args.key)?;
    let host = match args.host {
        Some(h) => h,
        None => nix::unistd::gethostname()
            .context("this host's name")?
            .into_string()
            .map_err(|_| anyhow::anyhow!("this host's name is not UTF-8; give --host"))?,
    };
    if host.is_empty() || host.len() > docket_auth::credential::MAX_NAME_BYTES {
        bail!("--host: {host:?} is not a usable host name");
    }
    let config = SignerConfig {
        socket: args.socket.clone(),
        ttl: Duration::from_secs(args.ttl_s),
        host,
        max_clients: args.max_clients as usize,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = signer::bind(&args.socket)?;
        let shared: signer::SharedRing = Arc::new(RwLock::new(Arc::new(ring)));
        tracing::info!(socket = %args.socket.display(), key = %shared.read().unwrap_or_else(|p| p.into_inner()).signing().id(), "signing credentials");
        let reloader = signer::reload_on_sighup(shared.clone(), args.key.clone())
            .context("installing the SIGHUP handler")?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
        signer::serve(listener, shared, config, async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await;
        reloader.abort();
        let _ = std::fs::remove_file(&args.socket);
        tracing::info!("stopped");
        Ok(())
    })
}
