//! The client's check of a controller: a certificate the cluster CA signed, valid for the
//! name we dialled (rustls's WebPKI verifier), and carrying the replica role. Without the last
//! check, any certificate of the cluster valid for that name would do; with it, a compromised
//! compute node's certificate cannot stand in for a controller.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::tls::role::Role;

/// Verifies a server's chain and name, then requires [`Role::Replica`].
#[derive(Debug)]
pub struct ReplicaVerifier {
    inner: Arc<WebPkiServerVerifier>,
}

impl ReplicaVerifier {
    pub fn new(inner: Arc<WebPkiServerVerifier>) -> Self {
        ReplicaVerifier { inner }
    }
}

impl ServerCertVerifier for ReplicaVerifier {
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
        match Role::of_certificate(end_entity) {
            Ok(Role::Replica(_)) => Ok(verified),
            Ok(other) => Err(rustls::Error::General(format!(
                "the server's certificate is for {other}, not a controller replica"
            ))),
            Err(e) => Err(rustls::Error::General(format!(
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
