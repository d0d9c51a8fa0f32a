//! What a certificate entitles its holder to: its role, carried as a SPIFFE-style URI in the
//! subject alternative names.
//!
//! - `spiffe://docket/replica/<id>`: a controller replica. It serves every API and may speak
//!   Raft (append, vote, snapshots, forwarded writes) to the other replicas.
//! - `spiffe://docket/node/<name>`: the agent of compute node `<name>`. It may register as
//!   that node, and report only on runs dispatched to it.
//! - `spiffe://docket/tool/<name>`: an operator's tool (the local launcher, the chaos
//!   harness): it may read a replica's Raft status, nothing else.
//!
//! Users hold no certificate; they prove who they are with a credential on each request.
//! A certificate carries exactly one role; one with none or several is refused.

use std::fmt;

use x509_parser::extensions::GeneralName;

/// The trust domain of every role URI.
pub const TRUST_DOMAIN: &str = "docket";

/// A certificate's role.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Replica(u64),
    Node(String),
    Tool(String),
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Replica(id) => write!(f, "replica {id}"),
            Role::Node(name) => write!(f, "node {name}"),
            Role::Tool(name) => write!(f, "tool {name}"),
        }
    }
}

/// Why a certificate's role cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleError {
    #[error("the certificate does not parse: {0}")]
    Parse(String),
    #[error("the certificate carries no Docket role (a spiffe://{TRUST_DOMAIN}/... URI name)")]
    None,
    #[error("the certificate carries several Docket roles")]
    Several,
    #[error("{0:?} is not a Docket role (replica/ID, node/NAME or tool/NAME)")]
    Bad(String),
}

impl Role {
    /// The URI naming this role.
    pub fn uri(&self) -> String {
        match self {
            Role::Replica(id) => format!("spiffe://{TRUST_DOMAIN}/replica/{id}"),
            Role::Node(name) => format!("spiffe://{TRUST_DOMAIN}/node/{name}"),
            Role::Tool(name) => format!("spiffe://{TRUST_DOMAIN}/tool/{name}"),
        }
    }

    /// The role a URI names; `None` for a URI outside Docket's trust domain.
    pub fn from_uri(uri: &str) -> Option<Result<Role, RoleError>> {
        let path = uri.strip_prefix(&format!("spiffe://{TRUST_DOMAIN}/"))?;
        let bad = || RoleError::Bad(path.to_owned());
        let (kind, name) = match path.split_once('/') {
            Some(p) => p,
            None => return Some(Err(bad())),
        };
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        Some(match kind {
            "replica" => name
                .parse()
                .ok()
                .filter(|id| *id > 0)
                .map(Role::Replica)
                .ok_or_else(bad),
            "node" if name_ok => Ok(Role::Node(name.to_owned())),
            "tool" if name_ok => Ok(Role::Tool(name.to_owned())),
            _ => Err(bad()),
        })
    }

    /// The role of a DER-encoded certificate (already verified against the CA).
    pub fn of_certificate(der: &[u8]) -> Result<Role, RoleError> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| RoleError::Parse(e.to_string()))?;
        let san = cert
            .subject_alternative_name()
            .map_err(|e| RoleError::Parse(e.to_string()))?;
        let mut found = None;
        for name in san.iter().flat_map(|s| s.value.general_names.iter()) {
            if let GeneralName::URI(uri) = name
                && let Some(role) = Role::from_uri(uri)
            {
                if found.is_some() {
                    return Err(RoleError::Several);
                }
                found = Some(role?);
            }
        }
        found.ok_or(RoleError::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_uris_round_trip_and_foreign_or_bad_ones_are_told_apart() {
        for role in [
            Role::Replica(3),
            Role::Node("n01".into()),
            Role::Tool("docket-local".into()),
        ] {
            assert_eq!(Role::from_uri(&role.uri()), Some(Ok(role.clone())));
        }
        assert_eq!(Role::from_uri("spiffe://example.org/node/n01"), None);
        assert!(matches!(
            Role::from_uri("spiffe://docket/replica/0"),
            Some(Err(RoleError::Bad(_)))
        ));
        assert!(matches!(
            Role::from_uri("spiffe://docket/node/n01/../x"),
            Some(Err(RoleError::Bad(_)))
        ));
        assert!(matches!(
            Role::from_uri("spiffe://docket/admin/me"),
            Some(Err(RoleError::Bad(_)))
        ));
    }
}
