//! A cluster's certificate authority and the certificates it issues
//! (`docket-controller certs init|issue`).
//!
//! Each cluster gets a CA of its own (an ECDSA P-256 key; the certificate may only sign leaf
//! certificates). It issues one certificate per replica (server and client use, with the host
//! names and addresses it is reached at), per node agent and per operator tool (client use
//! only), each carrying its [`Role`]. Sites that run their own PKI can issue certificates with
//! the same role URIs instead; Docket only needs the CA certificate and each daemon's own
//! certificate and key.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};

use crate::tls::role::Role;

/// Why a certificate could not be made or stored.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: already exists; move it away first (certificates are never overwritten)")]
    Exists(PathBuf),
    #[error("subject name {0:?}: not a host name or an IP address")]
    BadName(String),
    #[error("validity of {0} days: give 1 to 36500")]
    BadValidity(u32),
}

/// A certificate and its private key, PEM-encoded.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A cluster CA: its certificate and the key that signs.
#[derive(Debug, Clone)]
pub struct CertAuthority {
    pub cert_pem: String,
    key_pem: String,
}

fn validity(params: &mut CertificateParams, days: u32) -> Result<(), PkiError> {
    if !(1..=36_500).contains(&days) {
        return Err(PkiError::BadValidity(days));
    }
    let now = time::OffsetDateTime::now_utc();
    // An hour back, for clocks slightly behind the issuer's.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
    let mut serial = [0u8; 16];
    getrandom::fill(&mut serial).map_err(|e| PkiError::Io {
        path: PathBuf::from("(random)"),
        source: std::io::Error::other(e.to_string()),
    })?;
    serial[0] &= 0x7f;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    Ok(())
}

impl CertAuthority {
    /// A new CA named after the cluster.
    pub fn create(cluster: &str, days: u32) -> Result<CertAuthority, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("Docket cluster CA ({cluster})"));
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        validity(&mut params, days)?;
        let cert = params.self_signed(&key)?;
        Ok(CertAuthority {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA in `dir` (`ca.pem`, `ca.key`).
    pub fn load(dir: &Path) -> Result<CertAuthority, PkiError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| PkiError::Io { path, source })
        };
        Ok(CertAuthority {
            cert_pem: read("ca.pem")?,
            key_pem: read("ca.key")?,
        })
    }

    /// Writes `ca.pem` (0644) and `ca.key` (0600) into `dir`, never over existing files.
    pub fn save(&self, dir: &Path) -> Result<(), PkiError> {
        write_new(&dir.join("ca.pem"), &self.cert_pem, 0o644)?;
        write_new(&dir.join("ca.key"), &self.key_pem, 0o600)
    }

    /// A certificate for `role`, valid for `names` (host names or IP addresses; replicas
    /// need the names clients and peers reach them at) for `days`.
    pub fn issue(&self, role: &Role, names: &[String], days: u32) -> Result<Issued, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("docket {role}"));
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match role {
            // Agents also serve srun (the step tasks API) on their node's names.
            Role::Replica(_) | Role::Node(_) => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Role::Tool(_) => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        params.use_authority_key_identifier_extension = true;
        let mut sans = vec![SanType::URI(role.uri().try_into()?)];
        for name in names {
            sans.push(match name.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) if is_host_name(name) => SanType::DnsName(
                    name.clone()
                        .try_into()
                        .map_err(|_| PkiError::BadName(name.clone()))?,
                ),
                Err(_) => return Err(PkiError::BadName(name.clone())),
            });
        }
        params.subject_alt_names = sans;
        validity(&mut params, days)?;
        let ca_key = KeyPair::from_pem(&self.key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key)?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

impl Issued {
    /// Writes `<stem>.pem` (0644) and `<stem>.key` (0600) into `dir`, never over existing
    /// files; returns their paths.
    pub fn save(&self, dir: &Path, stem: &str) -> Result<(PathBuf, PathBuf), PkiError> {
        let cert = dir.join(format!("{stem}.pem"));
        let key = dir.join(format!("{stem}.key"));
        write_new(&cert, &self.cert_pem, 0o644)?;
        write_new(&key, &self.key_pem, 0o600)?;
        Ok((cert, key))
    }
}

/// A DNS host name: dot-separated labels of letters, digits and inner hyphens.
fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// The file stem `certs issue` uses for a role (`replica-1`, `node-n01`, `tool-NAME`).
pub fn stem(role: &Role) -> String {
    match role {
        Role::Replica(id) => format!("replica-{id}"),
        Role::Node(name) => format!("node-{name}"),
        Role::Tool(name) => format!("tool-{name}"),
    }
}

fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), PkiError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| {
            if source.kind() == std::io::ErrorKind::AlreadyExists {
                PkiError::Exists(path.to_owned())
            } else {
                PkiError::Io {
                    path: path.to_owned(),
                    source,
                }
            }
        })?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| PkiError::Io {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_carry_their_role_and_are_never_overwritten() {
        let ca = CertAuthority::create("test", 30).unwrap();
        let issued = ca
            .issue(&Role::Replica(2), &["127.0.0.1".into(), "ctl2".into()], 30)
            .unwrap();
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(issued.cert_pem.as_bytes())
            .map(|c: rustls_pki_types::CertificateDer<'static>| c)
            .unwrap();
        assert_eq!(Role::of_certificate(&der).unwrap(), Role::Replica(2));
        let dir = tempfile::tempdir().unwrap();
        ca.save(dir.path()).unwrap();
        assert!(matches!(ca.save(dir.path()), Err(PkiError::Exists(_))));
        let (_, key) = issued.save(dir.path(), "replica-2").unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let again = CertAuthority::load(dir.path()).unwrap();
        again.issue(&Role::Node("n01".into()), &[], 1).unwrap();
        assert!(matches!(
            ca.issue(&Role::Node("n01".into()), &["bad name!".into()], 1),
            Err(PkiError::BadName(_))
        ));
        assert!(matches!(
            ca.issue(&Role::Node("n01".into()), &[], 0),
            Err(PkiError::BadValidity(0))
        ));
    }
}
