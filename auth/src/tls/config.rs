//! A daemon's TLS material — the cluster CA, its own certificate and key — turned into
//! rustls configurations, and reloaded while running.
//!
//! Servers (controllers) ask for a client certificate but do not require one: agents and
//! replicas present theirs and the services check the role; users' commands present none and
//! prove who they are with a credential instead. Clients (replicas to each other, agents, the
//! command line) verify the controller's certificate with [`RoleVerifier`] (srun an agent's, for
//! the node it expects).
//!
//! Certificates are short-lived in a well-run site, so they must change without a restart:
//! [`TlsContext::reload`] re-reads the files (a bad new set is refused and the old one kept),
//! and [`TlsContext::watch`] reloads on SIGHUP and whenever the files change. New connections
//! use the new material; established ones keep theirs until they close.
//!
//! Sessions are never resumed: every connection makes a full handshake and every peer is
//! verified by the configuration in force when it connects. Resumption would buy nothing
//! here: replicas and agents keep their connections for hours, and a command is a new
//! process with an empty session cache. Yet a server left at rustls' default made and sent
//! two session tickets after every handshake, which each `sbatch` then decrypted and stored
//! for nothing.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::tls::role::{Role, RoleError};
use crate::tls::verify::{Expected, RoleVerifier};

/// Where a daemon's TLS material is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster CA's certificate (PEM): what peers' certificates must chain to.
    pub ca: PathBuf,
    /// This daemon's certificate chain and private key (PEM), if it has one (the command line
    /// has none).
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// Why TLS material cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {what}")]
    File { path: PathBuf, what: String },
    #[error("{path}: {source}")]
    Role { path: PathBuf, source: RoleError },
    #[error("TLS configuration: {0}")]
    Rustls(String),
    #[error("this daemon has no certificate of its own; it cannot serve TLS")]
    NoIdentity,
    #[error(
        "the new certificate is {new}'s, not {old}'s as the one in force: a daemon keeps its \
         identity for its whole life; restart it to take another"
    )]
    RoleChanged { old: String, new: String },
    #[error(transparent)]
    Key(#[from] crate::key::KeyError),
}

/// The provider every configuration uses: ring's, with TLS 1.3's AES-128-GCM with SHA-256
/// offered first.
///
/// rustls offers AES-256-GCM with SHA-384 first, and a server takes the client's first
/// choice. Every `sbatch` is a new connection, and `perf` of a leader under a storm of them
/// put 3% of its cpu in SHA-512's compression function (SHA-384's, which the handshake's
/// transcript and key schedule run on): ring has no hardware path for it on x86-64, while
/// SHA-256 runs on the SHA extensions and AES-128 does four fewer rounds per block on every
/// record after. The strength is that of the key exchange (X25519) and of the certificates
/// (P-256), about 128 bits either way, and this is the suite TLS 1.3 requires every
/// implementation to have (RFC 8446, 9.1). Nothing is removed: a peer that offers only
/// AES-256 still gets it.
pub fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

/// What the files held at one moment.
#[derive(Debug)]
struct Loaded {
    server: Option<Arc<ServerConfig>>,
    client: Arc<ClientConfig>,
    /// The cluster CA's roots and the crypto provider, for clients of a node's agent.
    roots: Arc<RootCertStore>,
    role: Option<Role>,
    stamps: Vec<Stamp>,
}

/// A file's identity for change detection.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    path: PathBuf,
    modified: Option<SystemTime>,
    len: u64,
}

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok();
    Stamp {
        path: path.to_owned(),
        modified: meta.as_ref().and_then(|m| m.modified().ok()),
        len: meta.map_or(0, |m| m.len()),
    }
}

/// A daemon's TLS configuration, reloadable. Cheap to clone; clones share.
#[derive(Debug, Clone)]
pub struct TlsContext {
    files: TlsFiles,
    current: Arc<RwLock<Arc<Loaded>>>,
}

fn file_error(path: &Path, what: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        what: what.to_string(),
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn load(files: &TlsFiles) -> Result<Loaded, TlsError> {
    let provider = provider();
    let mut roots = RootCertStore::empty();
    for cert in read_certs(&files.ca)? {
        roots
            .add(cert)
            .map_err(|e| file_error(&files.ca, format!("not a usable CA certificate: {e}")))?;
    }
    let roots = Arc::new(roots);
    let identity = match &files.identity {
        None => None,
        Some((cert, key)) => {
            let chain = read_certs(cert)?;
            let meta = std::fs::metadata(key).map_err(|e| file_error(key, e))?;
            crate::key::check_private(key, &meta)?;
            let private = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e))?;
            let role = Role::of_certificate(&chain[0]).map_err(|source| TlsError::Role {
                path: cert.clone(),
                source,
            })?;
            Some((chain, private, role))
        }
    };
    let rustls_error = |e: rustls::Error| TlsError::Rustls(e.to_string());
    let server_verifier =
        WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let client_builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(rustls_error)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(RoleVerifier::new(
            server_verifier,
            Expected::Replica,
        )));
    let mut client = match &identity {
        Some((chain, key, _)) => client_builder
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(rustls_error)?,
        None => client_builder.with_no_client_auth(),
    };
    client.alpn_protocols = vec![b"h2".to_vec()];
    client.resumption = rustls::client::Resumption::disabled();
    let server = match &identity {
        Some((chain, key, _)) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| TlsError::Rustls(e.to_string()))?;
            let mut server = ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(rustls_error)?
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain.clone(), key.clone_key())
                .map_err(rustls_error)?;
            server.alpn_protocols = vec![b"h2".to_vec()];
            server.send_tls13_tickets = 0;
            server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            Some(Arc::new(server))
        }
        None => None,
    };
    let mut stamps = vec![stamp(&files.ca)];
    if let Some((cert, key)) = &files.identity {
        stamps.push(stamp(cert));
        stamps.push(stamp(key));
    }
    Ok(Loaded {
        server,
        client: Arc::new(client),
        roots,
        role: identity.map(|(_, _, role)| role),
        stamps,
    })
}

impl TlsContext {
    /// Loads `files`, failing with what is wrong with them.
    pub fn load(files: TlsFiles) -> Result<TlsContext, TlsError> {
        let loaded = load(&files)?;
        Ok(TlsContext {
            files,
            current: Arc::new(RwLock::new(Arc::new(loaded))),
        })
    }

    fn loaded(&self) -> Arc<Loaded> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The files this context reads.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The server configuration in force.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        self.loaded().server.clone().ok_or(TlsError::NoIdentity)
    }

    /// The client configuration in force.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.loaded().client.clone()
    }

    /// A client configuration that accepts only the agent of `node` (srun's, for a step's
    /// tasks there). Users present no certificate.
    pub fn node_client_config(&self, node: &str) -> Result<Arc<ClientConfig>, TlsError> {
        let loaded = self.loaded();
        let provider = provider();
        let inner =
            WebPkiServerVerifier::builder_with_provider(loaded.roots.clone(), provider.clone())
                .build()
                .map_err(|e| TlsError::Rustls(e.to_string()))?;
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rustls(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(RoleVerifier::new(
                inner,
                Expected::Node(node.to_owned()),
            )))
            .with_no_client_auth();
        client.alpn_protocols = vec![b"h2".to_vec()];
        client.resumption = rustls::client::Resumption::disabled();
        Ok(Arc::new(client))
    }

    /// The role of this daemon's own certificate.
    pub fn role(&self) -> Option<Role> {
        self.loaded().role.clone()
    }

    /// Whether the files changed since they were last loaded.
    pub fn changed(&self) -> bool {
        self.loaded().stamps.iter().any(|s| stamp(&s.path) != *s)
    }

    /// Re-reads the files. On error the material in force stays (and the error says why the
    /// new files were refused). A certificate of another role is refused: what the daemon
    /// checked of its identity at start (a replica's own id, a node's own name) must hold
    /// for its whole life, so another replica's or a node's certificate dropped into its
    /// files never makes it speak as someone else.
    pub fn reload(&self) -> Result<(), TlsError> {
        let loaded = load(&self.files)?;
        let old_role = self.role();
        if loaded.role != old_role {
            let name = |r: &Option<Role>| r.as_ref().map_or("no one".to_owned(), Role::to_string);
            return Err(TlsError::RoleChanged {
                old: name(&old_role),
                new: name(&loaded.role),
            });
        }
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(loaded);
        Ok(())
    }

    /// Reloads on SIGHUP and whenever the files change (checked every `every`), for as long as
    /// the returned task runs.
    pub fn watch(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut hup = match tokio::signal::unix::signal(
                tokio::signal::unix::SignalKind::hangup(),
            ) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch SIGHUP; reloading on file changes only");
                    None
                }
            };
            let mut tick = tokio::time::interval(every);
            loop {
                let by_signal = tokio::select! {
                    _ = tick.tick() => false,
                    Some(()) = async { match &mut hup { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
                };
                if !by_signal && !this.changed() {
                    continue;
                }
                match this.reload() {
                    Ok(()) => tracing::info!(by_signal, "TLS certificates reloaded"),
                    Err(e) => {
                        tracing::error!(error = %e, "TLS certificates not reloaded; the old ones stay in force")
                    }
                }
            }
        })
    }
}
