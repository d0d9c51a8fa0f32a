//! Calls to the controllers, as the launcher makes them: one short-timeout TLS channel per
//! call (with the launcher's tool certificate), and for each request a fresh credential for
//! the user it acts as, minted with the cluster key the launcher made ([`use_secrets`]).
//! Against a cluster the launcher did not start ([`use_site`]) calls go as the commands' do:
//! the site's CA, and the credential this host's `docket-authd` (or munged) signs for the
//! user running the tool.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use docket_auth::local::{LocalSecrets, Minter};
use docket_auth::tls::{Role, TlsContext};
use docket_proto::v1 as pb;
use docket_proto::v1::admin_client::AdminClient;
use docket_proto::v1::jobs_client::JobsClient;
use tonic::transport::Channel;

use crate::LaunchError;

/// How the launcher reaches a cluster: TLS as the tool `docket-local`, credentials by the key
/// (a cluster it started), or as a command does (any cluster).
#[derive(Debug, Clone)]
pub struct Access {
    pub tls: TlsContext,
    pub credentials: Credentials,
}

/// Where requests' credentials come from.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// Minted for any user with the cluster key (a cluster this launcher started).
    Minted(Minter),
    /// Signed by this host for whoever runs the tool.
    Host(Arc<docket_auth::source::CredentialSource>),
}

static ACCESS: RwLock<Option<Arc<Access>>> = RwLock::new(None);

/// The tool's role.
pub fn tool() -> Role {
    Role::Tool("docket-local".into())
}

/// Makes the calls of this process use the cluster whose secrets are in `secrets` (set when a
/// cluster is started or opened).
pub fn use_secrets(secrets: &LocalSecrets) -> Result<(), LaunchError> {
    let files = secrets
        .issue(&tool(), &[])
        .map_err(|e| LaunchError::Invalid(format!("the launcher's certificate: {e}")))?;
    let access = Access {
        tls: TlsContext::load(files)
            .map_err(|e| LaunchError::Invalid(format!("the launcher's TLS: {e}")))?,
        credentials: Credentials::Minted(
            secrets
                .minter()
                .map_err(|e| LaunchError::Invalid(format!("the credential key: {e}")))?,
        ),
    };
    *ACCESS.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(access));
    Ok(())
}

/// Makes the calls of this process reach any cluster as its commands do: TLS verified by the
/// CA certificate at `ca` (no client certificate), credentials from `source` (as the user
/// running this process, whatever user a call names).
pub fn use_site(
    ca: &std::path::Path,
    source: docket_auth::source::CredentialSource,
) -> Result<(), LaunchError> {
    let tls = TlsContext::load(docket_auth::tls::TlsFiles {
        ca: ca.to_path_buf(),
        identity: None,
    })
    .map_err(|e| LaunchError::Invalid(format!("--ca {}: {e}", ca.display())))?;
    let access = Access {
        tls,
        credentials: Credentials::Host(Arc::new(source)),
    };
    *ACCESS.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(access));
    Ok(())
}

/// The access [`use_secrets`] set.
pub fn access() -> Result<Arc<Access>, LaunchError> {
    ACCESS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or_else(|| {
            LaunchError::Invalid("no cluster secrets loaded (start or open a cluster first)".into())
        })
}

/// How long TCP and the TLS handshake to a replica may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a call may take once sent.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

fn channel(addr: &str) -> Result<Channel, LaunchError> {
    docket_auth::tls::connect::channel(addr, &access()?.tls, CONNECT_TIMEOUT, Some(CALL_TIMEOUT))
        .map_err(LaunchError::Invalid)
}

pub fn admin(addr: &str) -> Result<AdminClient<Channel>, LaunchError> {
    Ok(AdminClient::new(channel(addr)?))
}

pub fn jobs(addr: &str) -> Result<JobsClient<Channel>, LaunchError> {
    Ok(JobsClient::new(channel(addr)?))
}

/// Like [`jobs`], connected now, as the commands connect before they send a write: TCP and
/// the TLS handshake within the connect timeout. [`LaunchError::Rpc`] when they failed, and
/// then nothing was sent to `addr` (a stopped replica accepts TCP connections but never
/// completes a handshake; a call on a lazy channel would fail with a transport error that
/// cannot tell this from a connection lost after the request went out).
pub async fn jobs_connected(addr: &str) -> Result<JobsClient<Channel>, LaunchError> {
    let access = access()?;
    docket_auth::tls::connect::connect(addr, &access.tls, CONNECT_TIMEOUT, Some(CALL_TIMEOUT))
        .await
        .map(JobsClient::new)
        .map_err(LaunchError::Rpc)
}

/// `message` with a fresh credential for `user` (`root` is the operator), or, against a
/// cluster reached as a command reaches it, for the user running this process. Without
/// access it goes without one, and the controller says so.
pub fn as_user<T>(user: &str, message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    let credential = access().ok().and_then(|access| match &access.credentials {
        Credentials::Minted(minter) => minter.credential_for(user).ok(),
        Credentials::Host(source) => source.credential().ok(),
    });
    if let Some(c) = credential {
        // A credential is base64url and dots; one that is not a header value goes unsent.
        let _ = docket_proto::metadata::insert_credential(r.metadata_mut(), &c);
    }
    r
}

/// The cluster as the first answering replica of `addrs` sees it.
pub async fn cluster_status(addrs: &[String]) -> Option<pb::ClusterStatusResponse> {
    for a in addrs {
        if let Ok(mut c) = admin(a)
            && let Ok(r) = c
                .cluster_status(as_user("root", pb::ClusterStatusRequest::default()))
                .await
        {
            return Some(r.into_inner());
        }
    }
    None
}

/// The leader's id and address, if one of `addrs` knows it and it answers as leader.
pub async fn leader(addrs: &[String]) -> Option<(u64, String)> {
    let s = cluster_status(addrs).await?;
    let id = s.leader_id?;
    let leader = s.replicas.iter().find(|r| r.id == id)?;
    (leader.role_typed() == pb::ReplicaRole::Leader).then(|| (id, leader.addr.clone()))
}

/// Whether a job has reached a final state (not pending, running, suspended or completing).
pub fn is_final(j: &pb::JobInfo) -> bool {
    !matches!(j.state_code.as_str(), "PD" | "R" | "S" | "CG")
}

/// Nodes as the leader lists them (with `responding` filled).
pub async fn nodes(leader: &str) -> Result<Vec<pb::NodeInfo>, LaunchError> {
    let mut c = admin(leader)?;
    Ok(c.list_nodes(as_user("root", pb::ListNodesRequest {}))
        .await
        .map_err(|s| LaunchError::Rpc(format!("list nodes: {}", s.message())))?
        .into_inner()
        .nodes)
}

/// Every job in the queue (all pages).
pub async fn all_jobs(addr: &str) -> Result<Vec<pb::JobInfo>, LaunchError> {
    all_jobs_read(addr, pb::ReadConsistency::Linearizable).await
}

/// Every job in the queue as the replica at `addr` answers with `consistency` (stale: its
/// own applied view, without asking the leader).
pub async fn all_jobs_read(
    addr: &str,
    consistency: pb::ReadConsistency,
) -> Result<Vec<pb::JobInfo>, LaunchError> {
    let mut c = jobs(addr)?;
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list_jobs(as_user(
                "root",
                pb::ListJobsRequest {
                    page_size: 10_000,
                    page_token: token.clone(),
                    consistency: consistency as i32,
                    ..Default::default()
                },
            ))
            .await
            .map_err(|s| LaunchError::Rpc(format!("list jobs: {}", s.message())))?
            .into_inner();
        out.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}
