//! How docket-raft turns values into bytes: postcard everywhere (log entries, votes, snapshot
//! metadata, RPC payloads). Compact, deterministic, and the same on every replica.
//!
//! Also the one place that turns a failure into openraft's `StorageError`, so every trait
//! method reports storage problems the same way instead of panicking.

use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::types::StorageError;

/// Encodes `value`.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_stdvec(value)
}

/// Decodes a `T` from the start of `bytes`; bytes after it are ignored (postcard's
/// `from_bytes`), which lets a replica read a request a newer release extended.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// A storage error about `subject` while doing `verb`, caused by `source`.
pub fn storage_error(
    subject: ErrorSubject<crate::ReplicaId>,
    verb: ErrorVerb,
    source: &(dyn std::error::Error + 'static),
) -> StorageError {
    StorageError::IO {
        source: StorageIOError::new(subject, verb, AnyError::from_dyn(source, None)),
    }
}
