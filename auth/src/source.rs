//! The clients' side: where a command gets a credential for each request.

use std::path::PathBuf;
use std::time::Duration;

use crate::client::{self, FetchError};
use crate::munge::{Munge, MungeError};

/// How users prove who they are, as Slurm's `AuthType` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthType {
    /// Docket's own credentials from `docket-authd` (the default: nothing else to install).
    Docket,
    /// MUNGE credentials from the site's munged.
    Munge,
}

impl std::str::FromStr for AuthType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auth/docket" => Ok(AuthType::Docket),
            "auth/munge" => Ok(AuthType::Munge),
            other => Err(format!(
                "{other:?} is not an authentication type; use auth/docket or auth/munge"
            )),
        }
    }
}

impl std::fmt::Display for AuthType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AuthType::Docket => "auth/docket",
            AuthType::Munge => "auth/munge",
        })
    }
}

/// Why no credential could be had.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Munge(#[from] MungeError),
}

/// Where credentials come from.
#[derive(Debug)]
pub enum CredentialSource {
    /// The local `docket-authd` at this socket.
    Signer(PathBuf),
    /// The local munged.
    Munge(Munge),
}

impl CredentialSource {
    /// The source for `kind`; `socket` is docket-authd's or munged's socket (None: the
    /// method's default).
    pub fn new(kind: AuthType, socket: Option<PathBuf>) -> Result<Self, SourceError> {
        Ok(match kind {
            AuthType::Docket => CredentialSource::Signer(
                socket.unwrap_or_else(|| PathBuf::from(crate::signer::DEFAULT_SOCKET)),
            ),
            AuthType::Munge => CredentialSource::Munge(Munge::load(socket.as_deref())?),
        })
    }

    /// A fresh credential for this process's user.
    pub fn credential(&self) -> Result<String, SourceError> {
        Ok(match self {
            CredentialSource::Signer(socket) => client::fetch(socket, Duration::from_secs(5))?,
            CredentialSource::Munge(m) => m.encode()?,
        })
    }
}
