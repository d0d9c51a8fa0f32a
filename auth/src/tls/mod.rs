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
pub fn peer_role<T>(request: &tonic::Request<T>) -> Option<Result<Role, RoleError>> {
    let certs = request.peer_certs()?;
    let leaf = certs.first()?;
    Some(Role::of_certificate(leaf))
}
