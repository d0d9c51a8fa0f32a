//! Mutual TLS between Docket's roles.
//!
//! Every connection to a controller is TLS. Replicas, agents and tools present a certificate
//! from the cluster CA naming their [`Role`]; the controller checks the role on every call
//! that needs one (Raft only from replicas; the agents API only from the node a certificate
//! names). Users present no certificate and prove who they are with a credential. Clients
//! check that they talk to a controller replica.
//!
//! - [`role`]: roles, as URIs in certificates.
//! - [`pki`]: the cluster CA and issuing certificates.
//! - [`config`]: loading and reloading a daemon's material into rustls configurations.
//! - [`verify`]: the clients' check of a controller.
//! - [`serve`]: accepting TLS connections for tonic.
//! - [`connect`]: TLS channels for tonic clients.

pub mod config;
pub mod connect;
pub mod pki;
pub mod role;
pub mod serve;
pub mod verify;

pub use config::{TlsContext, TlsError, TlsFiles};
pub use role::{Role, RoleError};

/// The role of the certificate the peer of `request` presented (verified against the
/// cluster CA during the handshake), if any.
///
/// Every call on a connection carries the same certificate, and parsing it (X.509, then its
/// names) cost a follower about 5% of its cpu under a submission storm, once per Raft
/// message: roles are remembered by the certificate's exact bytes (at most
/// [`ROLE_CACHE_ENTRIES`] of them; a full cache is emptied and starts again). A certificate
/// that does not parse is never remembered.
pub fn peer_role<T>(request: &tonic::Request<T>) -> Option<Result<Role, RoleError>> {
    let certs = request.peer_certs()?;
    let leaf = certs.first()?;
    Some(cached_role(leaf))
}

/// How many certificates' roles [`peer_role`] remembers.
pub const ROLE_CACHE_ENTRIES: usize = 4096;

fn cached_role(der: &[u8]) -> Result<Role, RoleError> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static ROLES: OnceLock<Mutex<HashMap<Box<[u8]>, Role>>> = OnceLock::new();
    let roles = ROLES.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(role) = roles.lock().unwrap_or_else(|p| p.into_inner()).get(der) {
        return Ok(role.clone());
    }
    let role = Role::of_certificate(der)?;
    let mut roles = roles.lock().unwrap_or_else(|p| p.into_inner());
    if roles.len() >= ROLE_CACHE_ENTRIES {
        roles.clear();
    }
    roles.insert(der.into(), role.clone());
    Ok(role)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn der_of(role: &Role, ca: &pki::CertAuthority) -> Vec<u8> {
        let issued = ca.issue(role, &["127.0.0.1".into()], 30).unwrap();
        rustls_pki_types::pem::PemObject::from_pem_slice(issued.cert_pem.as_bytes())
            .map(|c: rustls_pki_types::CertificateDer<'static>| c.to_vec())
            .unwrap()
    }

    #[test]
    fn remembered_roles_are_each_certificates_own_and_bad_bytes_are_never_remembered() {
        let ca = pki::CertAuthority::create("test", 30).unwrap();
        let (a, b) = (
            der_of(&Role::Replica(1), &ca),
            der_of(&Role::Node("n01".into()), &ca),
        );
        for _ in 0..2 {
            assert_eq!(cached_role(&a).unwrap(), Role::Replica(1));
            assert_eq!(cached_role(&b).unwrap(), Role::Node("n01".into()));
        }
        // One byte changed is another certificate: parsed, not taken from the cache.
        let mut bad = a.clone();
        let last = bad.len() - 40;
        bad.truncate(last);
        assert!(cached_role(&bad).is_err());
        assert!(cached_role(&bad).is_err());
    }
}
