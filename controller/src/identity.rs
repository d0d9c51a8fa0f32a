//! Who is calling, proven — never claimed.
//!
//! Users prove their uid with a credential on every request, in the `x-docket-credential`
//! metadata entry: Docket's own (`auth/docket`, minted by the caller's host's `docket-authd`
//! and checked here against the cluster key, its lifetime and a replay cache) or MUNGE's
//! (`auth/munge`, checked by this host's munged). A credential for uid 0 is the operator
//! (root); any other uid is the user of that name — the name the signer resolved on the
//! caller's host (Docket's credentials carry it, signed), or, with MUNGE, this host's user
//! database's. Nothing else a request carries says who it is from: the old `x-docket-user`
//! entry is ignored.
//!
//! Daemons prove their role with their TLS certificate ([`docket_auth::tls`]): the Raft
//! service answers only replicas (`require_replica`), the agents service only the agent of
//! the node its certificate names ([`node_of`]).
//!
//! One user cannot monopolise a replica: each user's requests are rate-limited per replica
//! (a token bucket like Slurm's `rl_*` parameters; root is exempt), and a caller over the
//! limit is told RESOURCE_EXHAUSTED, which the command line waits out and retries.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use docket_auth::Verifier;
use docket_auth::tls::Role;
use docket_core::{Actor, NodeName, UserName};
use docket_proto::metadata::CREDENTIAL as CREDENTIAL_HEADER;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tonic::{Request, Status};

/// A user's request rate limit per replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests per second, sustained.
    pub per_second: u32,
    /// Requests allowed in a burst.
    pub burst: u32,
}

/// Checks credentials and rate limits. Cheap to clone; clones share.
#[derive(Clone)]
pub struct Authenticator {
    verifier: Arc<Verifier>,
    limiter: Option<Arc<DefaultKeyedRateLimiter<UserName>>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("verifier", &self.verifier)
            .field("rate_limited", &self.limiter.is_some())
            .finish()
    }
}

impl Authenticator {
    /// Checks credentials with `verifier`; limits each user to `limit` (None: no limit).
    pub fn new(verifier: Verifier, limit: Option<RateLimit>) -> Self {
        let limiter = limit.and_then(|l| {
            let rate = NonZeroU32::new(l.per_second)?;
            let burst = NonZeroU32::new(l.burst.max(l.per_second)).unwrap_or(rate);
            Some(Arc::new(RateLimiter::keyed(
                Quota::per_second(rate).allow_burst(burst),
            )))
        });
        Authenticator {
            verifier: Arc::new(verifier),
            limiter,
        }
    }

    /// Forgets rate-limit state of users idle long enough to be back at a full bucket, every
    /// `every`, for as long as the returned task runs.
    pub fn sweep(&self, every: Duration) -> Option<tokio::task::JoinHandle<()>> {
        let limiter = self.limiter.clone()?;
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                limiter.retain_recent();
                limiter.shrink_to_fit();
            }
        }))
    }

    /// The proven actor of `request`, or UNAUTHENTICATED saying what is wrong with its
    /// credential, or RESOURCE_EXHAUSTED when the user is over their rate.
    pub async fn caller<T>(&self, request: &Request<T>) -> Result<Actor, Status> {
        let Some(value) = request.metadata().get(CREDENTIAL_HEADER) else {
            return Err(Status::unauthenticated(format!(
                "no credential: every request must carry one in {CREDENTIAL_HEADER} \
                 ({} on this cluster; the docket commands get one from the local {})",
                self.verifier.method(),
                if self.verifier.blocks() {
                    "munged"
                } else {
                    "docket-authd"
                }
            )));
        };
        let credential = value
            .to_str()
            .map_err(|_| Status::unauthenticated(format!("{CREDENTIAL_HEADER}: not ASCII")))?
            .to_owned();
        let actor = if self.verifier.blocks() {
            let verifier = self.verifier.clone();
            tokio::task::spawn_blocking(move || resolve(&verifier, &credential))
                .await
                .map_err(|e| Status::internal(format!("checking the credential: {e}")))??
        } else {
            resolve(&self.verifier, &credential)?
        };
        if let (Actor::User(user), Some(limiter)) = (&actor, &self.limiter)
            && limiter.check_key(user).is_err()
        {
            metrics::counter!("docket_rpc_rate_limited_total").increment(1);
            return Err(Status::resource_exhausted(format!(
                "user {user}: too many requests to this controller; slow down (retry in a \
                 second)"
            )));
        }
        Ok(actor)
    }
}

/// Verifies `credential` and turns the uid it proves into an actor.
fn resolve(verifier: &Verifier, credential: &str) -> Result<Actor, Status> {
    let verified = verifier
        .verify(credential, docket_proto::unix_ms())
        .map_err(|e| Status::unauthenticated(e.to_string()))?;
    if verified.uid == 0 {
        return Ok(Actor::Operator);
    }
    let name = match verified.user {
        Some(name) => name,
        // MUNGE: the uid, resolved here as slurmctld does.
        None => {
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(verified.uid))
                .map_err(|e| Status::unavailable(format!("looking up uid {}: {e}", verified.uid)))?
                .ok_or_else(|| {
                    Status::permission_denied(format!(
                        "uid {} has no user name on this controller's host",
                        verified.uid
                    ))
                })?
                .name
        }
    };
    let user: UserName = name.parse().map_err(|e| {
        Status::permission_denied(format!(
            "user {name:?} (uid {}) is not a name Docket accepts: {e}",
            verified.uid
        ))
    })?;
    Ok(Actor::User(user))
}

/// The role of the certificate `request`'s peer presented.
fn peer_role<T>(request: &Request<T>) -> Result<Role, Status> {
    match docket_auth::tls::peer_role(request) {
        Some(Ok(role)) => Ok(role),
        Some(Err(e)) => Err(Status::permission_denied(format!(
            "the client certificate: {e}"
        ))),
        None => Err(Status::unauthenticated(
            "this service needs a client certificate of the cluster (TLS)",
        )),
    }
}

/// The node whose agent is calling: the certificate must be a node's, for `claimed`.
pub fn node_of<T>(request: &Request<T>, claimed: &str) -> Result<NodeName, Status> {
    match peer_role(request)? {
        Role::Node(name) if name == claimed => name
            .parse()
            .map_err(|e| Status::invalid_argument(format!("node: {e}"))),
        Role::Node(name) => Err(Status::permission_denied(format!(
            "this certificate is node {name}'s; it cannot speak for node {claimed}"
        ))),
        other => Err(Status::permission_denied(format!(
            "the agents API is for node agents; this certificate is {other}'s"
        ))),
    }
}

/// The Raft service, answering replicas only; `Status` also answers any certificate of the
/// cluster (operators' tools read it). A tower wrapper rather than an interceptor, because
/// the check depends on the method, which only the HTTP path names.
#[derive(Debug, Clone)]
pub struct ReplicaOnly<S> {
    inner: S,
}

impl<S> ReplicaOnly<S> {
    pub fn new(inner: S) -> Self {
        ReplicaOnly { inner }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for ReplicaOnly<S> {
    const NAME: &'static str = S::NAME;
}

/// Whether the peer of an HTTP request may call `method` of the Raft service; the replica it
/// is, if it is one.
fn raft_allowed<B>(request: &http::Request<B>) -> Result<Option<u64>, Status> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let method = request.uri().path().rsplit('/').next().unwrap_or_default();
    let role = request
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|info| info.peer_certs())
        .and_then(|certs| certs.first().map(|c| Role::of_certificate(c)));
    match role {
        Some(Ok(Role::Replica(id))) => Ok(Some(id)),
        Some(Ok(_)) if method == "Status" => Ok(None),
        Some(Ok(other)) => Err(Status::permission_denied(format!(
            "Raft.{method} is for controller replicas; this certificate is {other}'s"
        ))),
        Some(Err(e)) => Err(Status::permission_denied(format!(
            "the client certificate: {e}"
        ))),
        None => Err(Status::unauthenticated(format!(
            "Raft.{method} needs a replica certificate of the cluster"
        ))),
    }
}

impl<S, B> tower::Service<http::Request<B>> for ReplicaOnly<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        match raft_allowed(&request) {
            Ok(replica) => {
                // The Raft service refuses calls that speak for another replica.
                if let Some(id) = replica {
                    request
                        .extensions_mut()
                        .insert(docket_raft::network::PeerReplica(docket_raft::ReplicaId(
                            id,
                        )));
                }
                Box::pin(self.inner.call(request))
            }
            Err(status) => {
                tracing::warn!(path = %request.uri().path(), %status, "refused a Raft call");
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}
