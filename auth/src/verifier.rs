//! The controllers' side: turning a request's credential into the uid (and, for Docket's own
//! credentials, the name and groups) it proves, exactly once.

use std::sync::Arc;

use crate::credential::{self, CredentialError, TimeRules};
use crate::munge::{Munge, MungeError};
use crate::replay::ReplayCache;
use crate::signer::SharedRing;

/// What a credential proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (Docket's credentials carry them; MUNGE's do not).
    pub gids: Option<Vec<u32>>,
    /// The user's name on the signing host (Docket's credentials); MUNGE gives only the uid,
    /// which the controller resolves itself.
    pub user: Option<String>,
    /// The signing host.
    pub host: Option<String>,
}

/// Why a credential was refused.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Credential(#[from] CredentialError),
    #[error(transparent)]
    Munge(#[from] MungeError),
}

enum Method {
    Docket(SharedRing),
    Munge(Arc<Munge>),
}

/// Checks credentials by the configured method, with a replay cache.
pub struct Verifier {
    method: Method,
    rules: TimeRules,
    replay: ReplayCache,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field(
                "method",
                &match self.method {
                    Method::Docket(_) => "auth/docket",
                    Method::Munge(_) => "auth/munge",
                },
            )
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// Docket's own credentials, signed by a key of `ring`.
    pub fn docket(ring: SharedRing, rules: TimeRules, replay_capacity: usize) -> Verifier {
        Verifier {
            method: Method::Docket(ring),
            rules,
            replay: ReplayCache::new(replay_capacity),
        }
    }

    /// MUNGE credentials, decoded by the local munged (which checks replays itself).
    pub fn munge(munge: Arc<Munge>, rules: TimeRules) -> Verifier {
        Verifier {
            method: Method::Munge(munge),
            rules,
            replay: ReplayCache::new(0),
        }
    }

    /// Whether verifying talks to another process (munged) and so belongs off an async
    /// worker.
    pub fn blocks(&self) -> bool {
        matches!(self.method, Method::Munge(_))
    }

    /// The method's name, as `AuthType` spells it.
    pub fn method(&self) -> &'static str {
        match self.method {
            Method::Docket(_) => "auth/docket",
            Method::Munge(_) => "auth/munge",
        }
    }

    /// Checks `credential` at `now_ms` and records it as used.
    pub fn verify(&self, credential: &str, now_ms: u64) -> Result<Verified, VerifyError> {
        match &self.method {
            Method::Docket(ring) => {
                let ring = ring.read().unwrap_or_else(|p| p.into_inner()).clone();
                let claims = credential::verify(&ring, credential, now_ms, self.rules)?;
                self.replay.admit(
                    claims.nonce,
                    claims.expires_ms.saturating_add(self.rules.skew_ms),
                    now_ms,
                )?;
                Ok(Verified {
                    uid: claims.uid,
                    gid: claims.gid,
                    gids: Some(claims.gids),
                    user: Some(claims.user),
                    host: Some(claims.host),
                })
            }
            Method::Munge(munge) => {
                let id = munge.decode(credential)?;
                Ok(Verified {
                    uid: id.uid,
                    gid: id.gid,
                    gids: None,
                    user: None,
                    host: None,
                })
            }
        }
    }

    /// Credentials currently remembered against replay.
    pub fn remembered(&self) -> usize {
        self.replay.len()
    }
}
