//! Talking to the controllers.
//!
//! Endpoints come from `--addr`, else `DOCKET_ADDR` (comma-separated `host:port`), else
//! `[controller] Hosts` in the site's docket.toml (`DOCKET_CONF`, default
//! `/etc/docket/docket.toml`), else `127.0.0.1:6817`. A request goes to the first endpoint
//! that answers; UNAVAILABLE (no leader yet: the request was not applied) is retried, on the
//! next endpoint, for up to 30 seconds (`DOCKET_RETRY_SECONDS`), so an election is invisible
//! to the user; a call only the leader serves is sent on to the leader the answer names.
//!
//! A read (listing, showing, status) waits at most 5 s for one endpoint, then asks the next
//! and asks the silent one last from then on: a replica that accepts connections but does not
//! answer (stopped, overloaded, cut off) delays a command by seconds, not by the whole
//! deadline. A write goes to the first endpoint a connection (TCP and the TLS handshake) can
//! be made to within 2 s — one that cannot was certainly not sent the write, which goes on to
//! the next — and a follower passes it to the leader; it then waits for its answer (30 s,
//! 60 s for administration), since sending it elsewhere could apply it twice; one that got no
//! answer in time ends with the unknown-outcome status. (Asking first who leads cost every
//! `sbatch` a second request and a second credential.)
//!
//! Every connection is TLS: the controller must present a replica certificate of the
//! cluster CA (`DOCKET_TLS_CA`, else `[controller] CaFile` in docket.toml, else
//! `/etc/docket/tls/ca.pem`). Every request carries a fresh credential proving who runs the
//! command: from the local `docket-authd` (`auth/docket`, the default; its socket
//! `DOCKET_AUTH_SOCKET`, else `[controller] AuthSocket`, else `/run/docket/authd.sock`) or
//! from munged (`DOCKET_AUTH_TYPE` / `[controller] AuthType` = `auth/munge`). A request a
//! controller refuses for going over the user's rate (RESOURCE_EXHAUSTED) was not applied:
//! it is sent again a second later, within the retry window, as Slurm's commands back off.

use std::future::Future;
use std::time::{Duration, Instant};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow};
use docket_auth::tls::{TlsContext, TlsFiles};
use docket_auth::{AuthType, CredentialSource};
use docket_proto::v1::admin_client::AdminClient;
use docket_proto::v1::jobs_client::JobsClient;
use tonic::transport::Channel;

/// Where the controllers are, how to reach them, and who is asking.
#[derive(Debug, Clone)]
pub struct Client {
    endpoints: Vec<String>,
    /// Who runs the command, looked up at its first use: most commands never ask (the
    /// controller learns the user from the credential), and the lookup loads the
    /// name-service modules.
    user: Arc<std::sync::OnceLock<Option<String>>>,
    tls: TlsContext,
    credentials: Arc<CredentialSource>,
    /// Why the last credential could not be had, if it could not: said instead of the
    /// controller's "no credential".
    credential_error: Arc<Mutex<Option<String>>>,
    /// One connection per endpoint and call deadline, made at first use and reused by every
    /// call after it.
    channels: Arc<Mutex<HashMap<(String, Duration), Channel>>>,
    /// The connections of `channels` known to have been made (writes go only over those).
    connected: Arc<Mutex<std::collections::HashSet<(String, Duration)>>>,
}

/// The client settings of the site's docket.toml `[controller]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SiteClient {
    /// `Hosts`, comma-joined.
    pub hosts: Option<String>,
    pub ca_file: Option<String>,
    pub auth_type: Option<String>,
    pub auth_socket: Option<String>,
}

/// `name` from the environment, else the site file's value.
fn setting(env: &str, site: &Option<String>) -> Option<String> {
    std::env::var(env)
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| site.clone())
}

/// How long a call of the jobs service, and of the administration service, may take.
const JOBS_DEADLINE: Duration = Duration::from_secs(30);
const ADMIN_DEADLINE: Duration = Duration::from_secs(60);

/// How long a read waits for one endpoint before asking the next.
const READ_ATTEMPT: Duration = Duration::from_secs(5);

/// How long a connection (TCP and the TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether a call may be sent to another endpoint when one does not answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// Changes nothing: on to the next endpoint after [`READ_ATTEMPT`].
    Read,
    /// May change the state: waits for the answer.
    Write,
}

/// How long an unavailable cluster is retried: `DOCKET_RETRY_SECONDS`, else 30 s.
fn retry_for() -> Duration {
    std::env::var("DOCKET_RETRY_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(30), Duration::from_secs)
}

impl Client {
    /// From an explicit address list, or `DOCKET_ADDR`, or the local default.
    pub fn new(addr: Option<&str>) -> Result<Self> {
        let site = from_config_file()?;
        let spec = match addr {
            Some(a) => a.to_owned(),
            None => match std::env::var("DOCKET_ADDR") {
                Ok(a) => a,
                Err(_) => site
                    .hosts
                    .clone()
                    .unwrap_or_else(|| "127.0.0.1:6817".into()),
            },
        };
        let ca = setting("DOCKET_TLS_CA", &site.ca_file)
            .unwrap_or_else(|| "/etc/docket/tls/ca.pem".into());
        let tls = TlsContext::load(TlsFiles {
            ca: PathBuf::from(&ca),
            identity: None,
        })
        .with_context(|| {
            format!("the cluster's CA certificate (set DOCKET_TLS_CA if it is not at {ca})")
        })?;
        let credentials = Arc::new(credential_source(&site)?);
        let endpoints: Vec<String> = spec
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(anyhow!(
                "no controller address: set DOCKET_ADDR=host:port[,host:port...] or pass --addr"
            ));
        }
        Ok(Client {
            endpoints,
            user: Arc::new(std::sync::OnceLock::new()),
            tls,
            credentials,
            credential_error: Arc::new(Mutex::new(None)),
            channels: Arc::new(Mutex::new(HashMap::new())),
            connected: Arc::new(Mutex::new(std::collections::HashSet::new())),
        })
    }

    /// The name of the user running the command: the password database's entry for the
    /// effective uid, else `$USER`.
    pub fn user(&self) -> Result<&str> {
        self.user
            .get_or_init(|| {
                nix::unistd::User::from_uid(nix::unistd::geteuid())
                    .ok()
                    .flatten()
                    .map(|u| u.name)
                    .or_else(|| std::env::var("USER").ok())
            })
            .as_deref()
            .ok_or_else(|| anyhow!("cannot tell who you are: no passwd entry and no $USER"))
    }

    /// The connection to `addr` whose calls end after `timeout` (made lazily: it connects
    /// at its first call).
    fn channel(&self, addr: &str, timeout: Duration) -> Result<Channel> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let key = (addr.to_owned(), timeout);
        if let Some(c) = channels.get(&key) {
            return Ok(c.clone());
        }
        let c = docket_auth::tls::connect::channel(addr, &self.tls, CONNECT_TIMEOUT, Some(timeout))
            .map_err(|e| anyhow!("controller address {e}"))?;
        channels.insert(key, c.clone());
        Ok(c)
    }

    /// Makes the connection to `addr` for calls ending after `timeout` now, if it was not
    /// made yet; on failure nothing was sent to `addr`, and the reason.
    async fn connect_for_write(&self, addr: &str, timeout: Duration) -> Result<(), String> {
        let key = (addr.to_owned(), timeout);
        if self
            .connected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&key)
        {
            return Ok(());
        }
        let c = docket_auth::tls::connect::connect(addr, &self.tls, CONNECT_TIMEOUT, Some(timeout))
            .await?;
        self.channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), c);
        self.connected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key);
        Ok(())
    }

    fn jobs(&self, addr: &str) -> Result<JobsClient<Channel>> {
        Ok(JobsClient::new(self.channel(addr, JOBS_DEADLINE)?))
    }

    fn admin(&self, addr: &str) -> Result<AdminClient<Channel>> {
        Ok(AdminClient::new(self.channel(addr, ADMIN_DEADLINE)?))
    }

    /// Like [`Client::jobs_call`] for the admin service; a call only the leader may serve is
    /// sent again to the leader it names (`x-docket-leader`).
    pub async fn admin_call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnMut(AdminClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call(Attempt::Write, ADMIN_DEADLINE, |addr| self.admin(addr), f)
            .await
    }

    /// [`Client::admin_call`] for a call that changes nothing: an endpoint that does not
    /// answer within 5 s is passed over.
    pub async fn admin_read<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnMut(AdminClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call(Attempt::Read, ADMIN_DEADLINE, |addr| self.admin(addr), f)
            .await
    }

    /// Every node, as the answering replica lists it.
    pub async fn nodes(&self) -> Result<Vec<docket_proto::v1::NodeInfo>> {
        Ok(rpc!(
            self,
            admin_read,
            list_nodes,
            docket_proto::v1::ListNodesRequest {}
        )
        .await?
        .nodes)
    }

    /// Every partition.
    pub async fn partitions(&self) -> Result<Vec<docket_proto::v1::PartitionInfo>> {
        Ok(rpc!(
            self,
            admin_read,
            list_partitions,
            docket_proto::v1::ListPartitionsRequest {}
        )
        .await?
        .partitions)
    }

    /// `request` with a fresh credential proving the caller's identity. Should none be had
    /// (the signer down), the request goes without one and the reason replaces the
    /// controller's refusal.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        let mut error = self
            .credential_error
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match self.credentials.credential() {
            Ok(c) => match docket_proto::metadata::insert_credential(r.metadata_mut(), &c) {
                Ok(()) => *error = None,
                Err(_) => *error = Some("the credential is not a header value".into()),
            },
            Err(e) => *error = Some(e.to_string()),
        }
        r
    }

    /// Calls `f` on the jobs service of the endpoints in turn until one answers with
    /// something other than UNAVAILABLE, for up to the retry window; a call only the leader
    /// serves (signals) is sent on to the leader it names.
    pub async fn jobs_call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnMut(JobsClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call(Attempt::Write, JOBS_DEADLINE, |addr| self.jobs(addr), f)
            .await
    }

    /// [`Client::jobs_call`] where RESOURCE_EXHAUSTED is an answer for the caller (a step
    /// that must wait for cpus: srun decides whether to wait), not retried here.
    pub async fn jobs_call_or_busy<T, F, Fut>(
        &self,
        mut f: F,
    ) -> Result<std::result::Result<T, tonic::Status>>
    where
        F: FnMut(JobsClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.jobs_call(|c| {
            let answer = f(c);
            async move {
                match answer.await {
                    Ok(r) => Ok(tonic::Response::new(Ok(r.into_inner()))),
                    Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                        Ok(tonic::Response::new(Err(s)))
                    }
                    Err(s) => Err(s),
                }
            }
        })
        .await
    }

    /// The cluster's TLS material (srun dials the agents with it).
    pub fn tls(&self) -> &TlsContext {
        &self.tls
    }

    /// [`Client::jobs_call`] for a call that changes nothing: an endpoint that does not
    /// answer within 5 s is passed over.
    pub async fn jobs_read<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnMut(JobsClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call(Attempt::Read, JOBS_DEADLINE, |addr| self.jobs(addr), f)
            .await
    }

    /// The retry loop of every call: endpoints in turn, UNAVAILABLE retried, a
    /// FAILED_PRECONDITION that names the leader (`x-docket-leader`) followed; a read passes
    /// over an endpoint silent for [`READ_ATTEMPT`] and asks it last afterwards, a write one
    /// no connection can be made to. `deadline` is that of the connections `make` gives.
    async fn call<C, T, F, Fut>(
        &self,
        attempt: Attempt,
        deadline: Duration,
        make: impl Fn(&str) -> Result<C>,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(C) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let start = Instant::now();
        let retry_for = retry_for();
        let mut last = None;
        let mut endpoints = docket_proto::endpoints::Endpoints::new(self.endpoints.clone());
        loop {
            while let Some(addr) = endpoints.next_to_ask() {
                let answer = match attempt {
                    Attempt::Write => {
                        if let Err(why) = self.connect_for_write(&addr, deadline).await {
                            // Nothing was sent: the next endpoint, and this one last from
                            // then on.
                            last = Some(tonic::Status::unavailable(why));
                            endpoints.ask_last(&addr);
                            continue;
                        }
                        f(make(&addr)?).await
                    }
                    Attempt::Read => {
                        match tokio::time::timeout(READ_ATTEMPT, f(make(&addr)?)).await {
                            Ok(a) => a,
                            Err(_) => {
                                last = Some(tonic::Status::unavailable(format!(
                                    "{addr} did not answer within {} s",
                                    READ_ATTEMPT.as_secs()
                                )));
                                endpoints.ask_last(&addr);
                                continue;
                            }
                        }
                    }
                };
                match answer {
                    Ok(r) => return Ok(r.into_inner()),
                    Err(s) if s.code() == tonic::Code::Unavailable => last = Some(s),
                    // No TLS session could be had (a replica that accepts connections but
                    // does not answer, a handshake refused): a read asks the next one, and
                    // asks this one last from then on.
                    Err(s) if attempt == Attempt::Read && transport_failed(&s) => {
                        endpoints.ask_last(&addr);
                        last = Some(s);
                    }
                    // Over the user's rate: not applied; back off a second and send again.
                    Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                        last = Some(s);
                        endpoints.ask_again(addr);
                        if start.elapsed() > retry_for {
                            break;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(s) if s.code() == tonic::Code::Unauthenticated => {
                        let why = self
                            .credential_error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .clone();
                        return Err(match why {
                            Some(why) => anyhow!("no credential: {why}"),
                            None => status_error(&s),
                        });
                    }
                    Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                        if !endpoints.follow(&s, &addr) {
                            return Err(status_error(&s));
                        }
                    }
                    Err(s) => return Err(status_error(&s)),
                }
            }
            if start.elapsed() > retry_for {
                let why = last.map(|s| s.message().to_owned()).unwrap_or_default();
                return Err(Failure::error(
                    exit::UNAVAILABLE,
                    format!(
                        "no controller answered at {} within {} s ({why}); check DOCKET_ADDR and that the controllers run",
                        self.endpoints.join(","),
                        retry_for.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            endpoints.next_round();
        }
    }
}

/// One call of the controllers: `$via` (`jobs_read`, `jobs_call`, `admin_read` or
/// `admin_call`, which choose the service and whether an endpoint may be passed over) runs
/// `$method` with `$message` and a fresh credential on each attempt, through [`Client`]'s
/// retry loop; `$message` is evaluated once per attempt.
macro_rules! rpc {
    ($client:expr, $via:ident, $method:ident, $message:expr) => {{
        let client = &$client;
        client.$via(|mut c| {
            let req = client.request($message);
            async move { c.$method(req).await }
        })
    }};
}
pub(crate) use rpc;

/// Where this host's credentials come from: `DOCKET_AUTH_TYPE` / `[controller] AuthType`
/// (`auth/docket` by default), from `DOCKET_AUTH_SOCKET` / `[controller] AuthSocket` (the
/// method's default socket otherwise).
pub fn credential_source(site: &SiteClient) -> Result<CredentialSource> {
    let kind: AuthType = setting("DOCKET_AUTH_TYPE", &site.auth_type)
        .unwrap_or_else(|| "auth/docket".into())
        .parse()
        .map_err(|e: String| anyhow!("DOCKET_AUTH_TYPE: {e}"))?;
    let socket = setting("DOCKET_AUTH_SOCKET", &site.auth_socket).map(PathBuf::from);
    Ok(CredentialSource::new(kind, socket)?)
}

/// Whether `s` is a failure of the connection itself, not an answer of the service.
fn transport_failed(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::Unknown && s.message().starts_with("transport error")
}

/// The client settings of the site's configuration file (`DOCKET_CONF`, else
/// `/etc/docket/docket.toml`): `[controller] Hosts = ["host:port", ...]` (as Slurm's commands
/// read SlurmctldHost from slurm.conf), `CaFile`, `AuthType`, `AuthSocket`. Empty when there
/// is no such file.
pub fn from_config_file() -> Result<SiteClient> {
    let path = std::env::var("DOCKET_CONF").unwrap_or_else(|_| "/etc/docket/docket.toml".into());
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SiteClient::default()),
        Err(e) => return Err(anyhow!("reading {path}: {e}")),
    };
    site_client(&text).map_err(|e| anyhow!("{path}: {e}"))
}

/// The `[controller]` client settings of a docket.toml.
pub fn site_client(text: &str) -> Result<SiteClient> {
    let table: toml::Table = text.parse().map_err(|e| anyhow!("{e}"))?;
    let controller = table.get("controller");
    let string = |key: &str| -> Result<Option<String>> {
        match controller.and_then(|c| c.get(key)) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(anyhow!("[controller] {key}: {other} is not a string")),
        }
    };
    Ok(SiteClient {
        hosts: hosts_from(&table)?,
        ca_file: string("CaFile")?,
        auth_type: string("AuthType")?,
        auth_socket: string("AuthSocket")?,
    })
}

/// `[controller] Hosts` of a docket.toml, comma-joined.
fn hosts_from(table: &toml::Table) -> Result<Option<String>> {
    let Some(hosts) = table.get("controller").and_then(|c| c.get("Hosts")) else {
        return Ok(None);
    };
    let list: Vec<&str> = match hosts {
        toml::Value::String(s) => vec![s.as_str()],
        toml::Value::Array(a) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| anyhow!("[controller] Hosts: {v} is not a \"host:port\" string"))
            })
            .collect::<Result<_>>()?,
        other => {
            return Err(anyhow!(
                "[controller] Hosts: {other} is not a list of \"host:port\" strings"
            ));
        }
    };
    Ok(Some(list.join(",")))
}

/// The small runtime each command's calls run on.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// The documented exit statuses of every command (README, "Exit status").
pub mod exit {
    /// Done.
    pub const OK: u8 = 0;
    /// The request was refused (invalid, not permitted, no such job) or failed.
    pub const REFUSED: u8 = 1;
    /// The command line was wrong (clap's usage errors).
    pub const USAGE: u8 = 2;
    /// No controller answered, or none led, within the retry window: nothing was done.
    pub const UNAVAILABLE: u8 = 3;
    /// The controller lost leadership while applying: the request may or may not have been
    /// applied; look before repeating it.
    pub const UNKNOWN_OUTCOME: u8 = 4;
}

/// An error that ends the command with a particular exit status.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    /// The error to return.
    pub fn error(code: u8, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Failure {
            code,
            message: message.into(),
        })
    }
}

/// The exit status an error ends the command with.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    e.chain()
        .find_map(|c| c.downcast_ref::<Failure>())
        .map_or(exit::REFUSED, |f| f.code)
}

/// One line saying what went wrong and, where it helps, what to do.
pub fn status_error(s: &tonic::Status) -> anyhow::Error {
    match s.code() {
        tonic::Code::Unavailable => Failure::error(exit::UNAVAILABLE, s.message()),
        tonic::Code::PermissionDenied => anyhow!("permission denied: {}", s.message()),
        tonic::Code::Unauthenticated => anyhow!("not authenticated: {}", s.message()),
        tonic::Code::InvalidArgument => anyhow!("invalid request: {}", s.message()),
        tonic::Code::NotFound => anyhow!("{}", s.message()),
        // Our own deadline passed before the answer came: it may still be applied.
        tonic::Code::Cancelled | tonic::Code::DeadlineExceeded => Failure::error(
            exit::UNKNOWN_OUTCOME,
            format!(
                "no answer in time ({}); the request may or may not have been applied: look (squeue, scontrol show) before repeating it",
                s.message()
            ),
        ),
        tonic::Code::Aborted => Failure::error(
            exit::UNKNOWN_OUTCOME,
            format!(
                "{} (check with squeue before submitting again)",
                s.message()
            ),
        ),
        _ => anyhow!("{}: {}", s.code(), s.message()),
    }
}

/// The exit status of a command that passes on one of its own (`srun`'s tasks', `salloc`'s
/// command's): that status, or on an error the message on stderr and its code (at least 1).
pub fn status_of(name: &str, result: Result<u8>) -> u8 {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{name}: error: {e:#}");
            exit_code(&e).max(1)
        }
    }
}

/// A request to remove the `kind` object `name`: the kind typed (`docket.v1.ObjectKind`),
/// and by name too for a controller one release behind.
pub fn remove_request(kind: &str, name: &str) -> docket_proto::v1::RemoveObjectRequest {
    let typed = docket_proto::v1::ObjectKind::from_str_name(&format!(
        "OBJECT_KIND_{}",
        kind.to_ascii_uppercase()
    ))
    .unwrap_or_default();
    docket_proto::v1::RemoveObjectRequest {
        kind: kind.to_owned(),
        name: name.to_owned(),
        object_kind: typed.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_file_names_the_controllers_the_ca_and_the_authentication() {
        let text = "[controller]\nHosts = [\"c1:6817\", \"c2:6817\"]\nCaFile = \"/x/ca.pem\"\n\
                    AuthType = \"auth/munge\"\n[[nodes]]\nNodeName = \"n1\"\n";
        let site = site_client(text).unwrap();
        assert_eq!(site.hosts.as_deref(), Some("c1:6817,c2:6817"));
        assert_eq!(site.ca_file.as_deref(), Some("/x/ca.pem"));
        assert_eq!(site.auth_type.as_deref(), Some("auth/munge"));
        assert_eq!(site.auth_socket, None);
        assert_eq!(site_client("[[nodes]]\n").unwrap(), SiteClient::default());
        let e = site_client("[controller]\nHosts = [1]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("Hosts"), "{e}");
        let e = site_client("[controller]\nCaFile = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("CaFile"), "{e}");
    }

    #[test]
    fn exit_codes_travel_with_the_error() {
        let e = Failure::error(exit::UNAVAILABLE, "down").context("squeue");
        assert_eq!(exit_code(&e), exit::UNAVAILABLE);
        assert_eq!(exit_code(&anyhow!("plain")), exit::REFUSED);
        let aborted = status_error(&tonic::Status::aborted("lost leadership"));
        assert_eq!(exit_code(&aborted), exit::UNKNOWN_OUTCOME);
    }
}
