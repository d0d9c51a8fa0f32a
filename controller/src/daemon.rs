//! One controller replica as a running process: storage, Raft, the gRPC server carrying the
//! Raft, jobs and health services, the leader loops, readiness, and graceful shutdown.
//!
//! Everything is served over TLS with this replica's certificate ([`docket_auth::tls`]),
//! and peers are reached over TLS with it too; the Raft service answers replicas only, the
//! agents service only node agents, and the jobs and admin services only callers with a
//! credential ([`crate::identity`]). Certificates and the credential key reload on SIGHUP
//! (certificates also when their files change).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use docket_auth::tls::{Role, TlsContext, TlsFiles};
use docket_auth::{AuthType, KeyRing, TimeRules, Verifier};
use docket_core::config::SchedConfig;
use docket_core::{Command, State};
use docket_raft::ReplicaId;
use docket_raft::replica::{ClusterError, Replica, ReplicaConfig};

use crate::admin::AdminService;
use crate::health::Readiness;
use crate::identity::{Authenticator, RateLimit, ReplicaOnly};
use crate::inflight::InflightLayer;
use crate::jobs::JobsService;
use crate::loops::{self, LoopContext};
use crate::machine::{CoreMachine, MAX_BATCH_COMMANDS};
use crate::stats::LoopStats;

/// How often glibc's free heap pages go back to the kernel ([`crate::native_heap`]).
pub const NATIVE_HEAP_TRIM_PERIOD: Duration = Duration::from_secs(30);

/// Why a replica could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A setting that cannot work; the message names it and says what would.
    #[error("{0}")]
    Config(String),
    /// A step of starting or running failed: what it was doing, and why.
    #[error("{doing}: {source}")]
    Failed {
        doing: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

type Result<T, E = DaemonError> = std::result::Result<T, E>;

/// Names the step an error happened in ([`DaemonError::Failed`]).
trait Doing<T> {
    fn doing(self, what: impl Into<String>) -> Result<T>;
}

impl<T, E: Into<Box<dyn std::error::Error + Send + Sync>>> Doing<T> for std::result::Result<T, E> {
    fn doing(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|e| DaemonError::Failed {
            doing: what.into(),
            source: e.into(),
        })
    }
}

/// What a replica process needs to run.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub id: u64,
    /// Address the gRPC server binds.
    pub listen: String,
    /// Address other replicas and clients reach it at (default: `listen`).
    pub advertise: Option<String>,
    pub data_dir: PathBuf,
    /// Voters of a new cluster, to bootstrap it on first start (ignored once initialized).
    pub bootstrap: Option<BTreeMap<ReplicaId, String>>,
    /// The site's commands, proposed by the first leader of a cluster with no configuration.
    pub site: Vec<Command>,
    /// The site's ClusterName (`sacctmgr show cluster`, associations).
    pub cluster_name: String,
    /// How long a linearizable read waits for this replica to catch up.
    pub read_timeout: Duration,
    /// Raft timing.
    pub tuning: docket_raft::replica::RaftTuning,
    /// Where to serve the status page, `/metrics` and `/status` over HTTP, if anywhere.
    pub http_listen: Option<String>,
    /// The URL of this replica's status page that others link to (derived when `None`).
    pub http_advertise: Option<String>,
    /// How much the HTTP port serves at once.
    pub http_limits: crate::http_conn::HttpLimits,
    /// How often the status page's plots sample.
    pub history_interval: Duration,
    /// Node agents' timing and liveness.
    pub agents: crate::agents::AgentConfig,
    /// The cluster CA and this replica's certificate and key.
    pub tls: TlsFiles,
    /// How callers prove who they are.
    pub auth: AuthConfig,
}

/// How users prove who they are to this replica.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// `auth/docket` (credentials from docket-authd, checked with the key file) or
    /// `auth/munge`.
    pub kind: AuthType,
    /// The cluster's credential key file (`auth/docket`).
    pub key_file: PathBuf,
    /// munged's socket (`auth/munge`; None: libmunge's default).
    pub munge_socket: Option<PathBuf>,
    /// Clock-skew allowance and longest lifetime accepted.
    pub rules: TimeRules,
    /// Each user's request rate on this replica (None: unlimited).
    pub rate: Option<RateLimit>,
}

/// The credential checker `config` asks for, and (for `auth/docket`) a task reloading the
/// key file on SIGHUP.
fn authenticator(
    config: &AuthConfig,
) -> Result<(Authenticator, Option<tokio::task::JoinHandle<()>>)> {
    match config.kind {
        AuthType::Docket => {
            let ring = KeyRing::load(&config.key_file).doing("the credential key")?;
            tracing::info!(key = %ring.signing().id(), "accepting auth/docket credentials");
            let shared: docket_auth::signer::SharedRing =
                Arc::new(std::sync::RwLock::new(Arc::new(ring)));
            let reload =
                docket_auth::signer::reload_on_sighup(shared.clone(), config.key_file.clone())
                    .doing("installing the SIGHUP handler")?;
            let verifier =
                Verifier::docket(shared, config.rules, docket_auth::replay::DEFAULT_CAPACITY);
            Ok((Authenticator::new(verifier, config.rate), Some(reload)))
        }
        AuthType::Munge => {
            let munge = docket_auth::munge::Munge::load(config.munge_socket.as_deref())
                .doing("auth/munge")?;
            tracing::info!(socket = ?config.munge_socket, "accepting auth/munge credentials");
            let verifier = Verifier::munge(Arc::new(munge), config.rules);
            Ok((Authenticator::new(verifier, config.rate), None))
        }
    }
}

/// Runs the replica until `shutdown` resolves, then stops cleanly.
pub async fn run(
    config: DaemonConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let tls = replica_tls(&config)?;
    let tls_watch = tls.watch(Duration::from_secs(5));
    let (auth, key_reload) = authenticator(&config.auth)?;
    let auth_sweep = auth.sweep(Duration::from_secs(60));
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .doing(format!("--listen {}: cannot bind", config.listen))?;
    let advertise = match &config.advertise {
        Some(a) => a.clone(),
        None => listener
            .local_addr()
            .doing("the listening address")?
            .to_string(),
    };
    let http_listener = match &config.http_listen {
        None => None,
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .doing(format!("--http-listen {addr}: cannot bind"))?,
        ),
    };
    let replica_config = replica_config(&config, &advertise, http_listener.as_ref())?;
    let wakes = crate::machine::Wakes::default();
    let (replica, archive) = open_replica(&config, replica_config, &tls, &wakes).await?;

    let shared = Shared {
        readiness: Readiness::new(),
        inflight: Arc::new(AtomicUsize::new(0)),
        users_inflight: Arc::new(AtomicUsize::new(0)),
        stats: Arc::new(std::sync::Mutex::new(LoopStats::default())),
        auth,
        archive,
    };
    let http = match http_listener {
        None => None,
        Some(listener) => Some(serve_http(&config, listener, &replica, &shared)?),
    };
    let agents = crate::agents::AgentHub::new(
        replica.clone(),
        config.agents.clone(),
        wakes.dispatch.clone(),
    );
    let grpc = serve_grpc(&config, listener, &tls, &replica, &agents, &shared);
    tracing::info!(id = config.id, addr = %advertise, "replica started");
    if let Some(members) = &config.bootstrap {
        bootstrap(&replica, members).await?;
    }
    let agents_task = tokio::spawn(agents.run());
    let loop_task = tokio::spawn(loops::run(LoopContext {
        replica: replica.clone(),
        schedule: wakes.schedule.clone(),
        inflight: shared.inflight.clone(),
        users_inflight: shared.users_inflight.clone(),
        site: config.site.clone(),
        direct_pacer: Arc::new(std::sync::Mutex::new(std::time::Instant::now())),
        stats: shared.stats.clone(),
    }));
    let ready_task = ready_once_led(&replica, &shared.readiness);
    let trim_task = tokio::spawn(crate::native_heap::trim_every(NATIVE_HEAP_TRIM_PERIOD));

    shutdown.await;
    stopping(&shared.readiness);
    let tasks = [
        Some(ready_task),
        Some(loop_task),
        Some(trim_task),
        Some(agents_task),
        Some(tls_watch),
        key_reload,
        auth_sweep,
        http,
    ];
    for task in tasks.into_iter().flatten() {
        task.abort();
    }
    replica.shutdown().await;
    grpc.stop().await;
    Ok(())
}

/// Tells the log, the readiness probe and systemd that this replica is stopping.
fn stopping(readiness: &Readiness) {
    tracing::info!("shutting down");
    readiness.set_serving(false);
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
}

/// What the services, the loops and the status page share.
struct Shared {
    readiness: Readiness,
    /// Requests being served, and those of them from users.
    inflight: Arc<AtomicUsize>,
    users_inflight: Arc<AtomicUsize>,
    stats: Arc<std::sync::Mutex<LoopStats>>,
    /// Checks callers' credentials.
    auth: Authenticator,
    /// This replica's accounting archive.
    archive: Arc<crate::archive::Archive>,
}

/// This replica's TLS identity: its certificate must be the certificate of this replica.
fn replica_tls(config: &DaemonConfig) -> Result<TlsContext> {
    let tls = TlsContext::load(config.tls.clone()).doing("TLS")?;
    match tls.role() {
        Some(Role::Replica(id)) if id == config.id => Ok(tls),
        Some(other) => Err(DaemonError::Config(format!(
            "--tls-cert is the certificate of {other}, not of replica {}; issue one with \
             `docket-controller certs issue replica {}`",
            config.id, config.id
        ))),
        None => Err(DaemonError::Config(
            "--tls-cert: a replica needs a certificate of its own".into(),
        )),
    }
}

/// The Raft replica's settings: identity, address, the status page others link to, timing
/// and batch bounds.
fn replica_config(
    config: &DaemonConfig,
    advertise: &str,
    http_listener: Option<&tokio::net::TcpListener>,
) -> Result<ReplicaConfig> {
    let mut replica_config = ReplicaConfig::new(config.id, advertise.to_owned(), &config.data_dir);
    replica_config.app_version = Some(docket_core::command::COMMAND_VERSION);
    replica_config.status_page = match (&config.http_advertise, http_listener) {
        (Some(url), _) if !crate::web::leader_page::linkable(url) => {
            return Err(DaemonError::Config(format!(
                "--http-advertise {url:?}: give an http:// or https:// URL of printable characters \
             without quotes or spaces (at most 512)"
            )));
        }
        (Some(url), _) => Some(url.clone()),
        (None, Some(l)) => Some(status_page_url(
            l.local_addr().doing("the status page's address")?,
            advertise,
        )),
        (None, None) => None,
    };
    replica_config.tuning = config.tuning.clone();
    replica_config.proposer.max_batch_commands = replica_config
        .proposer
        .max_batch_commands
        .min(MAX_BATCH_COMMANDS);
    Ok(replica_config)
}

/// Opens the data directory: the accounting archive, then the replica (its log, its state
/// machine waking the loops), reaching peers over TLS.
async fn open_replica(
    config: &DaemonConfig,
    replica_config: ReplicaConfig,
    tls: &TlsContext,
    wakes: &crate::machine::Wakes,
) -> Result<(Replica<CoreMachine>, Arc<crate::archive::Archive>)> {
    std::fs::create_dir_all(&config.data_dir).doing(format!(
        "creating the data directory {}",
        config.data_dir.display()
    ))?;
    let archive = Arc::new(
        crate::archive::Archive::open(config.data_dir.join("archive"))
            .doing("opening the accounting archive")?,
    );
    let sink = crate::machine::ArchiveSink {
        archive: archive.clone(),
        export_dir: config.data_dir.join("archive-export"),
    };
    let fresh =
        CoreMachine::with_archive(State::new(SchedConfig::default()), sink).waking(wakes.clone());
    let channels = {
        let (tls, network) = (tls.clone(), replica_config.network.clone());
        let connect_timeout = network.connect_timeout;
        docket_raft::network::Channels::with_maker(
            network,
            // A peer's Raft messages, forwards and reads go to that replica and no other (its
            // certificate names it); a status probe by address takes whichever is there.
            Arc::new(move |to: Option<ReplicaId>, addr: &str| {
                docket_auth::tls::connect::channel_with_keepalive(
                    addr,
                    to.map(|id| id.0),
                    &tls,
                    connect_timeout,
                )
            }),
        )
    };
    let replica = Replica::open_with_channels(replica_config, fresh, channels)
        .await
        .doing(format!(
            "opening the data directory {}",
            config.data_dir.display()
        ))?;
    Ok((replica, archive))
}

/// Serves the status page, `/metrics` and `/status`, and samples the page's plots, in one
/// task (stopping the server stops the sampling too).
fn serve_http(
    config: &DaemonConfig,
    listener: tokio::net::TcpListener,
    replica: &Replica<CoreMachine>,
    shared: &Shared,
) -> Result<tokio::task::JoinHandle<()>> {
    let history = Arc::new(std::sync::Mutex::new(
        crate::web::history::History::default(),
    ));
    let router = crate::http::router(crate::http::HttpState {
        replica: replica.clone(),
        archive: shared.archive.clone(),
        stats: shared.stats.clone(),
        inflight: shared.inflight.clone(),
        prometheus: crate::http::install_recorder(),
        history: history.clone(),
        leader_pages: Default::default(),
    });
    tracing::info!(addr = %listener.local_addr().doing("the status page's address")?, "serving the status page, /metrics and /status");
    let sampler = crate::web::sample_every(
        config.history_interval,
        replica.clone(),
        shared.stats.clone(),
        history,
    );
    let limits = config.http_limits;
    Ok(tokio::spawn(async move {
        tokio::select! {
            () = crate::http_conn::serve(listener, router, limits) => {}
            () = sampler => {}
        }
    }))
}

/// The gRPC server's task and the way to stop it.
struct GrpcServer {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::result::Result<(), tonic::transport::Error>>,
}

impl GrpcServer {
    /// Stops accepting, and waits up to 10 s for the requests in flight.
    async fn stop(self) {
        let _ = self.stop.send(());
        match tokio::time::timeout(Duration::from_secs(10), self.task).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "gRPC server ended with an error"),
            Err(_) => tracing::warn!("gRPC server did not stop within 10 s"),
            _ => {}
        }
    }
}

/// Serves Raft (replicas only), jobs, admin, agents and health over TLS on `listener`.
fn serve_grpc(
    config: &DaemonConfig,
    listener: tokio::net::TcpListener,
    tls: &TlsContext,
    replica: &Replica<CoreMachine>,
    agents: &crate::agents::AgentHub,
    shared: &Shared,
) -> GrpcServer {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let incoming = docket_auth::tls::serve::incoming(listener, tls.clone());
    let router = tonic::transport::Server::builder()
        .layer(InflightLayer::new(
            shared.inflight.clone(),
            shared.users_inflight.clone(),
        ))
        .layer(docket_proto::malformed::MalformedLayer)
        .add_service(ReplicaOnly::new(replica.service()))
        .add_service(JobsService::new(
            replica.clone(),
            config.read_timeout,
            Some(shared.archive.clone()),
            Some(agents.clone()),
            shared.auth.clone(),
            config.cluster_name.clone(),
        ))
        .add_service(AdminService::new(
            replica.clone(),
            shared.stats.clone(),
            shared.inflight.clone(),
            Some(agents.clone()),
            shared.auth.clone(),
            replica.channels().clone(),
        ))
        .add_service(agents.service())
        .add_service(shared.readiness.service());
    let task = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await
    });
    GrpcServer { stop, task }
}

/// Starts a new cluster of `members` once; ignored when the data directory is initialized.
async fn bootstrap(
    replica: &Replica<CoreMachine>,
    members: &BTreeMap<ReplicaId, String>,
) -> Result<()> {
    match replica.bootstrap(members.clone()).await {
        Ok(()) => tracing::info!(?members, "bootstrapped a new cluster"),
        Err(ClusterError::AlreadyInitialized) => {
            tracing::info!("cluster already initialized; --bootstrap ignored")
        }
        Err(e) => return Err(e).doing("bootstrapping the cluster"),
    }
    Ok(())
}

/// Ready once a leader is known: from then on requests are served (or forwarded), and
/// systemd is told.
fn ready_once_led(
    replica: &Replica<CoreMachine>,
    readiness: &Readiness,
) -> tokio::task::JoinHandle<()> {
    let replica = replica.clone();
    let readiness = readiness.clone();
    tokio::spawn(async move {
        loop {
            if replica
                .wait_for_leader(Duration::from_secs(3600))
                .await
                .is_ok()
            {
                readiness.set_serving(true);
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
                return;
            }
        }
    })
}

/// This replica's status page as others should link to it: the HTTP address it listens on,
/// or, when that is every address (`0.0.0.0`, `::`), the host others reach its Raft port at
/// (`advertise`) with the HTTP port.
fn status_page_url(http: std::net::SocketAddr, advertise: &str) -> String {
    if http.ip().is_unspecified() {
        let host = advertise
            .rsplit_once(':')
            .map_or(advertise, |(host, _port)| host);
        format!("http://{host}:{}/", http.port())
    } else {
        format!("http://{http}/")
    }
}

#[cfg(test)]
mod tests {
    use super::status_page_url;

    #[test]
    fn the_status_page_is_advertised_where_others_can_reach_it() {
        let at = |s: &str| s.parse().unwrap();
        assert_eq!(
            status_page_url(at("127.0.0.1:7180"), "127.0.0.1:7100"),
            "http://127.0.0.1:7180/"
        );
        assert_eq!(
            status_page_url(at("0.0.0.0:7180"), "ctl2.example.org:7100"),
            "http://ctl2.example.org:7180/"
        );
        assert_eq!(
            status_page_url(at("[::]:7180"), "[fd00::2]:7100"),
            "http://[fd00::2]:7180/"
        );
    }
}
