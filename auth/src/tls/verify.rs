//! The client's check of a server: a certificate the cluster CA signed, valid for the name we
//! dialled (rustls's WebPKI verifier), and carrying the role we meant to reach — a controller
//! replica, or the agent of one named node (srun starting a step's tasks there). Without the
//! last check, any certificate of the cluster valid for that name would do; with it, a
//! compromised compute node's certificate cannot stand in for a controller or for another
//! node's agent.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::tls::role::Role;

/// The role a client expects of the server it dialled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// Any controller replica.
    Replica,
    /// The agent of this node.
    Node(String),
}

/// Verifies a server's chain and name, then requires the [`Expected`] role.
#[derive(Debug)]
pub struct RoleVerifier {
    inner: Arc<WebPkiServerVerifier>,
    expected: Expected,
}

impl RoleVerifier {
    pub fn new(inner: Arc<WebPkiServerVerifier>, expected: Expected) -> Self {
        RoleVerifier { inner, expected }
    }
}

impl ServerCertVerifier for RoleVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        match (Role::of_certificate(end_entity), &self.expected) {
            (Ok(Role::Replica(_)), Expected::Replica) => Ok(verified),
            (Ok(Role::Node(n)), Expected::Node(want)) if &n == want => Ok(verified),
            (Ok(other), Expected::Replica) => Err(rustls::Error::General(format!(
                "the server's certificate is for {other}, not a controller replica"
            ))),
            (Ok(other), Expected::Node(want)) => Err(rustls::Error::General(format!(
                "the server's certificate is for {other}, not node {want}'s agent"
            ))),
            (Err(e), _) => Err(rustls::Error::General(format!(
                "the server's certificate: {e}"
            ))),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
