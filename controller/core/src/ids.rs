//! Identifiers of the things the scheduler reasons about.
//!
//! Each is a newtype so a partition name can never be passed where a user name is expected.
//! Names are validated once, at the edge ([`str::parse`]), with an error that names the kind
//! of name and the rule it broke; inside the core a name is always well-formed.
//!
//! Names are [`SmolStr`]s: every job carries its owner, account, partition and QOS, and
//! submission and limit checks clone and compare them thousands of times per command. Names
//! up to 23 bytes (nearly all) live inline, so a clone is a copy and a comparison reads no
//! other cache line; longer ones share one allocation.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use smol_str::SmolStr;

/// A job's id: assigned by apply from a counter in replicated state, never reused.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The longest name accepted for any named entity (Slurm allows more, but nobody needs it and
/// names appear in every listing).
pub const MAX_NAME_LEN: usize = 64;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{kind} name is empty")]
    Empty { kind: &'static str },
    #[error("{kind} name {name:?} is {len} bytes long; the limit is {MAX_NAME_LEN}")]
    TooLong {
        kind: &'static str,
        name: String,
        len: usize,
    },
    #[error(
        "{kind} name {name:?} contains {bad:?}; allowed are ASCII letters, digits, '-', '_' \
         and '.', not starting with '-' or '.'"
    )]
    BadChar {
        kind: &'static str,
        name: String,
        bad: char,
    },
}

fn validate(kind: &'static str, name: &str) -> Result<(), IdError> {
    if name.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(IdError::TooLong {
            kind,
            name: name.chars().take(MAX_NAME_LEN).collect(),
            len: name.len(),
        });
    }
    for (i, c) in name.chars().enumerate() {
        // Partitions may also hold a colon after the first character (GWDG's
        // `standard96:test`).
        let ok = c.is_ascii_alphanumeric()
            || c == '_'
            || (i > 0 && (c == '-' || c == '.' || (c == ':' && kind == "partition")));
        if !ok {
            return Err(IdError::BadChar {
                kind,
                name: name.to_owned(),
                bad: c,
            });
        }
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $ty:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "SmolStr", into = "SmolStr")]
        pub struct $ty(SmolStr);

        impl $ty {
            /// What this kind of name is called in error messages.
            pub const KIND: &'static str = $kind;

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $ty {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                validate($kind, s)?;
                Ok(Self(SmolStr::new(s)))
            }
        }

        impl TryFrom<SmolStr> for $ty {
            type Error = IdError;
            fn try_from(s: SmolStr) -> Result<Self, IdError> {
                validate($kind, &s)?;
                Ok(Self(s))
            }
        }

        impl From<$ty> for SmolStr {
            fn from(v: $ty) -> SmolStr {
                v.0
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// A login name of a job owner.
    UserName,
    "user"
);
name_type!(
    /// An account (project) in the fair-share tree, charged for usage.
    AccountName,
    "account"
);
name_type!(
    /// A partition (PBS: queue): a named set of compute nodes with its own policies.
    PartitionName,
    "partition"
);
name_type!(
    /// A quality-of-service class: priority, limits and preemption rights.
    QosName,
    "qos"
);
name_type!(
    /// An advance reservation (`scontrol create reservation`).
    ReservationName,
    "reservation"
);
name_type!(
    /// A compute node. Never a controller replica (those are `ReplicaId`s in docket-raft).
    NodeName,
    "node"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_names_parse() {
        for ok in ["alice", "a", "node-001", "gpu_a100.x", "_svc", "P123"] {
            assert_eq!(ok.parse::<NodeName>().unwrap().as_str(), ok);
        }
    }

    #[test]
    fn bad_names_are_refused_naming_the_kind_and_rule() {
        assert_eq!(
            "".parse::<UserName>().unwrap_err(),
            IdError::Empty { kind: "user" }
        );
        let long = "x".repeat(MAX_NAME_LEN + 1);
        let err = long.parse::<PartitionName>().unwrap_err();
        assert!(err.to_string().starts_with("partition name"), "{err}");
        assert!(err.to_string().contains("limit is 64"), "{err}");
        for bad in ["-x", ".x", "a b", "a/b", "../etc", "é"] {
            let err = bad.parse::<AccountName>().unwrap_err();
            assert!(
                matches!(
                    err,
                    IdError::BadChar {
                        kind: "account",
                        ..
                    }
                ),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn names_deserialize_through_validation() {
        let ok: QosName = serde_json::from_str("\"normal\"").unwrap();
        assert_eq!(ok.to_string(), "normal");
        assert_eq!(serde_json::to_string(&ok).unwrap(), "\"normal\"");
        let err = serde_json::from_str::<QosName>("\"no way\"").unwrap_err();
        assert!(err.to_string().contains("qos name"), "{err}");
    }

    #[test]
    fn job_ids_order_numerically() {
        assert!(JobId(9) < JobId(10));
        assert_eq!(JobId(42).to_string(), "42");
    }
}
