//! The secrets of a cluster on one host — the credential key, the CA and a certificate per
//! replica, node and tool — for the local launcher, tests and benchmarks.
//!
//! Production sites make these once with `docket-controller certs` and `auth-key` and
//! distribute them ([`crate::tls::pki`], [`crate::key`]); a local cluster makes them in its
//! state directory at start. Tools that hold the key (the launcher acts for `root` and the
//! demo's users) mint credentials with it directly ([`Minter`]), as any key holder can —
//! which is why the key is root's and the controllers' only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::credential::{self, Claims};
use crate::key::{KeyError, KeyRing};
use crate::tls::pki::{self, CertAuthority, PkiError};
use crate::tls::{Role, TlsFiles};

/// Why local secrets could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("minting a credential: {0}")]
    Mint(String),
}

/// A directory holding a cluster's key, CA and certificates.
#[derive(Debug, Clone)]
pub struct LocalSecrets {
    dir: PathBuf,
}

impl LocalSecrets {
    /// Creates the directory (0700), a CA and a credential key in it.
    pub fn create(dir: &Path, cluster: &str) -> Result<LocalSecrets, LocalError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| LocalError::Io {
                path: dir.to_owned(),
                source,
            })?;
        CertAuthority::create(cluster, 3650)?.save(dir)?;
        KeyRing::create_file(&dir.join("auth.key"))?;
        Ok(LocalSecrets {
            dir: dir.to_owned(),
        })
    }

    /// The secrets already in `dir`.
    pub fn open(dir: &Path) -> LocalSecrets {
        LocalSecrets {
            dir: dir.to_owned(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate every client needs.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The credential key file.
    pub fn key_file(&self) -> PathBuf {
        self.dir.join("auth.key")
    }

    /// The files of `role`'s certificate (issued or not).
    pub fn files(&self, role: &Role) -> TlsFiles {
        let stem = pki::stem(role);
        TlsFiles {
            ca: self.ca(),
            identity: Some((
                self.dir.join(format!("{stem}.pem")),
                self.dir.join(format!("{stem}.key")),
            )),
        }
    }

    /// The files for a client with no certificate (the command line).
    pub fn anonymous(&self) -> TlsFiles {
        TlsFiles {
            ca: self.ca(),
            identity: None,
        }
    }

    /// Issues `role`'s certificate for `hosts` (a year) unless it exists; its files.
    pub fn issue(&self, role: &Role, hosts: &[String]) -> Result<TlsFiles, LocalError> {
        let files = self.files(role);
        if let Some((cert, _)) = &files.identity
            && cert.exists()
        {
            return Ok(files);
        }
        CertAuthority::load(&self.dir)?
            .issue(role, hosts, 365)?
            .save(&self.dir, &pki::stem(role))?;
        Ok(files)
    }

    /// The flags of `docket-controller run` for replica `id`: the CA, its certificate and
    /// key, the credential key.
    pub fn controller_flags(&self, id: u64) -> Vec<String> {
        let mut flags = vec![
            "--auth-key".to_owned(),
            self.key_file().display().to_string(),
        ];
        flags.extend(tls_flags(&self.files(&Role::Replica(id))));
        flags
    }

    /// The flags of `docket-nodeagent run` for node `node`: the CA, its certificate and key.
    pub fn agent_flags(&self, node: &str) -> Vec<String> {
        tls_flags(&self.files(&Role::Node(node.to_owned())))
    }

    /// A minter of credentials with this cluster's key.
    pub fn minter(&self) -> Result<Minter, LocalError> {
        Ok(Minter {
            ring: KeyRing::load(&self.key_file())?,
            host: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "localhost".into()),
            ttl: Duration::from_secs(60),
        })
    }
}

fn tls_flags(files: &TlsFiles) -> Vec<String> {
    let mut flags = vec!["--tls-ca".to_owned(), files.ca.display().to_string()];
    if let Some((cert, key)) = &files.identity {
        flags.extend([
            "--tls-cert".to_owned(),
            cert.display().to_string(),
            "--tls-key".to_owned(),
            key.display().to_string(),
        ]);
    }
    flags
}

/// Mints credentials for any user with the cluster key (what a key holder can do).
#[derive(Debug, Clone)]
pub struct Minter {
    ring: KeyRing,
    host: String,
    ttl: Duration,
}

impl Minter {
    /// A minter signing with `ring`.
    pub fn new(ring: KeyRing, host: &str) -> Minter {
        Minter {
            ring,
            host: host.to_owned(),
            ttl: Duration::from_secs(60),
        }
    }

    /// A fresh credential for `user`, uid `uid`.
    pub fn credential(&self, uid: u32, user: &str) -> Result<String, LocalError> {
        let now = docket_proto::unix_ms();
        let claims = Claims {
            uid,
            gid: uid,
            gids: vec![uid],
            user: user.to_owned(),
            host: self.host.clone(),
            issued_ms: now,
            expires_ms: now + self.ttl.as_millis() as u64,
            nonce: credential::nonce().map_err(LocalError::Mint)?,
        };
        credential::sign(&self.ring, &claims).map_err(|e| LocalError::Mint(e.to_string()))
    }

    /// A credential for the user of this name on this host (uid 0 for `root`; the host's
    /// uid when the user exists; otherwise a stable made-up uid above 60,000, for users
    /// that exist only in a test's configuration).
    pub fn credential_for(&self, user: &str) -> Result<String, LocalError> {
        self.credential(uid_for(user), user)
    }
}

/// The uid [`Minter::credential_for`] signs for `user`: the host's, or a stable made-up one
/// above 60,000 for a user the host does not know. It reads the user database; callers that
/// mint many credentials for one user look it up once.
pub fn uid_for(user: &str) -> u32 {
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => u.uid.as_raw(),
        _ => {
            60_000
                + user
                    .bytes()
                    .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
                    % 5_000
        }
    }
}

/// A free loopback address (`127.0.0.1:PORT`) below the kernel's ephemeral range, so that no
/// outgoing connection (of this or any other process) can take the port between our check
/// and the daemon's bind, as can happen with a port the kernel handed out for port 0. For the
/// daemons of a cluster on one host. The port is reserved for a while (see `reserve_in`), so two
/// processes picking ports at once (test binaries run in parallel, two local clusters) do not
/// both hand it out before either daemon binds it.
pub fn free_loopback_addr() -> Result<String, String> {
    free_port_from(&port_reservations())
}

/// How long a port handed out by [`free_loopback_addr`] is not handed out again, by any
/// process: long enough for the daemon it was meant for to start and bind it (after that,
/// binding it fails anyway).
const RESERVATION: std::time::Duration = std::time::Duration::from_secs(120);

/// Where the reservations are: one empty file per port, in the host's temporary directory.
fn port_reservations() -> std::path::PathBuf {
    std::env::temp_dir().join("docket-loopback-ports")
}

/// Claims `port` in `dir` unless another process claimed it within [`RESERVATION`]: the file
/// is created exclusively (`O_EXCL`, which also refuses a symlink planted in its place), and a
/// stale one is removed and claimed afresh (by whichever process creates it first). Best
/// effort: a directory that cannot be written leaves every port claimable, as before.
fn reserve_in(dir: &std::path::Path, port: u16) -> bool {
    use std::fs::OpenOptions;
    if std::fs::create_dir_all(dir).is_err() {
        return true;
    }
    let path = dir.join(port.to_string());
    let claim = || OpenOptions::new().write(true).create_new(true).open(&path);
    match claim() {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let age = std::fs::symlink_metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok());
            if age.is_none_or(|age| age < RESERVATION) {
                return false;
            }
            let _ = std::fs::remove_file(&path);
            claim().is_ok()
        }
        Err(_) => true,
    }
}

/// A free loopback port between 10,000 and the ephemeral range, claimed in `reservations`.
fn free_port_from(reservations: &std::path::Path) -> Result<String, String> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let (from, to) = (10_000u16, low.clamp(10_001, 32_768));
    // Start somewhere different for every process and call.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let salt = std::process::id()
        .wrapping_mul(2_654_435_761)
        .wrapping_add(NEXT.fetch_add(7_919, std::sync::atomic::Ordering::Relaxed))
        ^ (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0));
    let span = u32::from(to - from);
    for k in 0..span {
        let port = from + ((salt.wrapping_add(k)) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && reserve_in(reservations, port)
        {
            return Ok(format!("127.0.0.1:{port}"));
        }
    }
    Err(format!("no free loopback port between {from} and {to}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_handed_out_is_not_handed_out_again_until_its_reservation_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        assert!(reserve_in(dir.path(), 12_345));
        assert!(!reserve_in(dir.path(), 12_345), "claimed twice");
        assert!(reserve_in(dir.path(), 12_346));
        // A reservation older than its time is claimed afresh.
        let file = std::fs::File::options()
            .write(true)
            .open(dir.path().join("12345"))
            .unwrap();
        let old = std::time::SystemTime::now() - RESERVATION - std::time::Duration::from_secs(1);
        file.set_modified(old).unwrap();
        assert!(reserve_in(dir.path(), 12_345));
        assert!(!reserve_in(dir.path(), 12_345));
    }

    #[test]
    fn a_symlink_planted_for_a_port_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::os::unix::fs::symlink(&target, dir.path().join("23456")).unwrap();
        assert!(!reserve_in(dir.path(), 23_456));
        assert!(!target.exists(), "the reservation followed a symlink");
    }
}
