//! The signer: mints credentials for local processes (`docket-authd`, like munged or Slurm's
//! sackd).
//!
//! It listens on a Unix socket any local user may connect to. For each connection it asks the
//! kernel who the peer is ([`crate::peer`]), resolves the uid's name in the host's user
//! database, and answers with a credential for exactly that identity, signed with the cluster
//! key. Nothing the caller sends can change what is signed: the request is a fixed greeting.
//! Bounded: a connection has two seconds to greet and at most [`SignerConfig::max_clients`]
//! are served at once (the rest are told to retry), so no caller can tie the signer up.
//!
//! Protocol, one line each way: the client sends `docket-authd 1\n`; the signer answers
//! `ok <credential>\n` or `error <why>\n`.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::credential::{self, Claims, MAX_GROUPS};
use crate::key::KeyRing;
use crate::peer::{Peer, peer_of};

/// The greeting a client sends.
pub const GREETING: &str = "docket-authd 1";
/// Where the signer listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/docket/authd.sock";

/// How the signer runs.
#[derive(Debug, Clone)]
pub struct SignerConfig {
    pub socket: PathBuf,
    /// How long a credential lives.
    pub ttl: Duration,
    /// This host's name, carried in every credential.
    pub host: String,
    /// Connections served at once.
    pub max_clients: usize,
}

/// The keys in use, replaceable while running (SIGHUP reloads the key file).
pub type SharedRing = Arc<RwLock<Arc<KeyRing>>>;

/// Why the signer cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: io::Error,
    },
    #[error("{0}: another signer is already listening there")]
    InUse(PathBuf),
    #[error("{0}: exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
}

/// Re-reads the key file at `path` into `shared` on every SIGHUP, for as long as the returned
/// task runs; a file that does not load is logged and the keys in force stay.
pub fn reload_on_sighup(
    shared: SharedRing,
    path: PathBuf,
) -> io::Result<tokio::task::JoinHandle<()>> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match KeyRing::load(&path) {
                Ok(ring) => {
                    tracing::info!(key = %ring.signing().id(), "credential key file reloaded");
                    *shared.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(ring);
                }
                Err(e) => {
                    tracing::error!(error = %e, "credential key file not reloaded; the old keys stay")
                }
            }
        }
    }))
}

/// The credential for `peer`: its uid, groups and name, signed.
pub fn mint(ring: &KeyRing, peer: &Peer, config: &SignerConfig) -> Result<String, String> {
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(peer.uid))
        .map_err(|e| format!("looking up uid {}: {e}", peer.uid))?
        .ok_or_else(|| format!("uid {} has no user name on this host", peer.uid))?;
    let gids = match &peer.groups {
        Some(g) => g.clone(),
        // Old kernels: the user's groups from the group database.
        None => {
            let name = std::ffi::CString::new(user.name.clone())
                .map_err(|_| "user name has a NUL byte".to_owned())?;
            nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(peer.gid))
                .map_err(|e| format!("groups of {}: {e}", user.name))?
                .into_iter()
                .map(|g| g.as_raw())
                .collect()
        }
    };
    if gids.len() > MAX_GROUPS {
        return Err(format!(
            "{} is in {} groups; a credential carries at most {MAX_GROUPS}",
            user.name,
            gids.len()
        ));
    }
    let issued = docket_proto::unix_ms();
    let claims = Claims {
        uid: peer.uid,
        gid: peer.gid,
        gids,
        user: user.name,
        host: config.host.clone(),
        issued_ms: issued,
        expires_ms: issued + config.ttl.as_millis() as u64,
        nonce: credential::nonce()?,
    };
    credential::sign(ring, &claims).map_err(|e| e.to_string())
}

/// Binds the signer's socket: a stale one (nobody listening) is replaced, a live one or any
/// other file is an error. The socket is open to every local user (mode 0666).
pub fn bind(path: &Path) -> Result<UnixListener, SignerError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let io = |what| {
        move |source| SignerError::Io {
            path: path.to_owned(),
            what,
            source,
        }
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(SignerError::InUse(path.to_owned()));
            }
            std::fs::remove_file(path).map_err(io("removing the stale socket"))?;
        }
        Ok(_) => return Err(SignerError::NotASocket(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("looking at the socket path")(e)),
    }
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(io("creating the socket's directory"))?;
    }
    let listener = UnixListener::bind(path).map_err(io("binding"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(io("opening the socket to every user"))?;
    Ok(listener)
}

/// Serves `listener` until `shutdown` resolves.
pub async fn serve(
    listener: UnixListener,
    ring: SharedRing,
    config: SignerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(config.max_clients.max(1)));
    let config = Arc::new(config);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(async move {
                let mut stream = stream;
                let _ = stream
                    .write_all(b"error busy: too many clients at once; retry\n")
                    .await;
            });
            continue;
        };
        let (ring, config) = (ring.clone(), config.clone());
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) =
                tokio::time::timeout(Duration::from_secs(2), answer(stream, &ring, &config)).await
            {
                tracing::debug!(error = %e, "a client did not greet in time");
            }
        });
    }
}

async fn answer(stream: UnixStream, ring: &SharedRing, config: &SignerConfig) {
    let peer = match peer_of(stream.as_fd()) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "reading the peer's credentials");
            return;
        }
    };
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read).take(64);
    if reader.read_line(&mut line).await.is_err() {
        return;
    }
    let reply = if line.trim_end() != GREETING {
        format!("error expected {GREETING:?}\n")
    } else {
        let ring = ring.read().unwrap_or_else(|p| p.into_inner()).clone();
        match mint(&ring, &peer, config) {
            Ok(token) => {
                tracing::debug!(uid = peer.uid, pid = peer.pid, "minted a credential");
                format!("ok {token}\n")
            }
            Err(e) => {
                tracing::warn!(uid = peer.uid, pid = peer.pid, error = %e, "refused a credential");
                format!("error {e}\n")
            }
        }
    };
    let _ = write.write_all(reply.as_bytes()).await;
}
