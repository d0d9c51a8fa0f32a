//! The names of the gRPC metadata Docket's services and clients exchange, written once.

use tonic::metadata::errors::InvalidMetadataValue;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

/// A request's credential (docket-authd's or munge's), the only proof of who sends it.
pub const CREDENTIAL: &str = "x-docket-credential";

/// On a refusal from a replica that does not lead: the leader's address, so that a client
/// (the commands, an agent) sends the call there instead.
pub const LEADER: &str = "x-docket-leader";

/// A claim of who sends a request, which early builds believed. Nothing reads it any more:
/// the attack tests send it, with another user's name, to show that it changes nothing.
pub const CLAIMED_USER: &str = "x-docket-user";

/// `credential` as the value of a [`CREDENTIAL`] header, marked sensitive.
///
/// HTTP/2 compresses headers with HPACK, whose encoder stores each value it sends in a table
/// shared by every later request on the connection, so that a repeated value costs an index.
/// A credential is never repeated (each carries a fresh nonce), so storing it only evicts the
/// values that do repeat (the method's path, `content-type`, `te`), and storing a secret in a
/// compression context is what RFC 7541 §7.1.3 warns against (the CRIME family of attacks
/// guesses a secret from the compressed size). A sensitive value is sent as a
/// never-indexed literal: neither end stores it, and no intermediary may index it either.
pub fn credential_value(credential: &str) -> Result<AsciiMetadataValue, InvalidMetadataValue> {
    let mut value = AsciiMetadataValue::try_from(credential)?;
    value.set_sensitive(true);
    Ok(value)
}

/// Puts `credential` on a request's metadata as [`credential_value`] makes it; an error, and
/// nothing put, if it is not a header value (it is base64url and dots when well formed).
pub fn insert_credential(
    metadata: &mut MetadataMap,
    credential: &str,
) -> Result<(), InvalidMetadataValue> {
    metadata.insert(CREDENTIAL, credential_value(credential)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_marked_sensitive_so_hpack_never_indexes_it() {
        let v = credential_value("docket1.AAAA.BBBB").expect("a valid value");
        assert!(v.is_sensitive());
        let mut map = MetadataMap::new();
        insert_credential(&mut map, "docket1.AAAA.BBBB").expect("inserted");
        let got = map.get(CREDENTIAL).expect("present");
        assert!(got.is_sensitive());
        assert_eq!(got.to_str().ok(), Some("docket1.AAAA.BBBB"));
    }

    #[test]
    fn a_value_that_is_not_a_header_is_refused_and_nothing_is_put() {
        assert!(credential_value("line\nbreak").is_err());
        let mut map = MetadataMap::new();
        assert!(insert_credential(&mut map, "bad\r\nx-docket-user: root").is_err());
        assert!(map.is_empty());
    }
}
