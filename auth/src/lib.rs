//! Docket's trust boundary: who is calling, proven.
//!
//! Nobody is trusted on their word. A user proves their uid with a **credential** that only
//! their host can mint: the host's signer (`docket-authd`, [`signer`]) reads the caller's uid
//! and groups from the kernel and signs them with the cluster key ([`key`], [`credential`]);
//! the controllers check the signature, the lifetime and single use ([`verifier`],
//! [`replay`]). Sites that run MUNGE can use it instead ([`munge`]). Daemons prove their role
//! with **certificates** of the cluster CA, over mutual TLS ([`tls`]): only replicas speak
//! Raft, only node `n01`'s agent speaks for `n01`, and every client checks it talks to a
//! controller.
//!
//! Map: [`key`] (the shared key and its file), [`credential`] (claims, signing, checking),
//! [`replay`] (single use), [`peer`] (the kernel's word on a Unix socket's peer),
//! [`signer`] and [`client`] (the signer daemon and asking it), [`munge`] (libmunge at run
//! time), [`source`] and [`verifier`] (the two ends as commands and controllers use them),
//! [`tls`] (roles, the CA, rustls configurations, TLS for tonic).

pub mod client;
pub mod credential;
pub mod key;
pub mod local;
pub mod munge;
pub mod peer;
pub mod replay;
pub mod signer;
pub mod source;
pub mod tls;
pub mod verifier;

pub use credential::{Claims, CredentialError, TimeRules};
pub use key::{Key, KeyRing};
pub use source::{AuthType, CredentialSource};
pub use verifier::{Verified, Verifier};
