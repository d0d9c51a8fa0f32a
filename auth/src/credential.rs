//! Docket's own credential (`auth/docket`): who a process is, signed by its host's signer.
//!
//! The signer (`docket-authd`, [`crate::signer`]) learns the calling process's uid and groups
//! from the kernel (the Unix socket's peer credentials), resolves the user's name from the
//! host's user database and signs [`Claims`] with the cluster key: `{uid, gid, gids, user,
//! host, issued, expiry, nonce}`. A controller accepts a credential only if its signature is
//! good under a key it holds, it is within its lifetime (with a clock-skew allowance, since
//! the signer's clock is another host's), and it has not been seen before ([`crate::replay`]).
//! This is munge's model (and Slurm's `auth/slurm`), with the user's name carried in the
//! signed claims as `auth/slurm`'s `use_client_ids` does, so controllers need no copy of
//! every submit host's user database.
//!
//! Wire form: `docket1.` base64url(key id ‖ postcard(claims)) `.` base64url(HMAC-SHA256),
//! the MAC over a domain tag and the body. Verification bounds the size before decoding,
//! compares the MAC in constant time, and reads the claims only once the MAC is good.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::key::{Key, KeyId, KeyRing};

/// The prefix of every credential of this format.
pub const PREFIX: &str = "docket1.";
/// Longest credential accepted, in bytes (far above a real one with many groups).
pub const MAX_CREDENTIAL_BYTES: usize = 16 << 10;
/// Most supplementary groups a credential carries (Linux's NGROUPS_MAX is 65536; a real user
/// has dozens).
pub const MAX_GROUPS: usize = 1024;
/// Longest user or host name carried.
pub const MAX_NAME_BYTES: usize = 255;
/// Domain separation for the MAC.
const MAC_DOMAIN: &[u8] = b"docket-credential-v1\0";

/// What a credential says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, as the kernel reported them for the caller.
    pub gids: Vec<u32>,
    /// The user's name on the signing host.
    pub user: String,
    /// The signing host's name.
    pub host: String,
    /// Milliseconds since the Unix epoch, on the signer's clock.
    pub issued_ms: u64,
    pub expires_ms: u64,
    /// Random: makes every credential distinct, for the replay cache.
    pub nonce: [u8; 16],
}

/// Why a credential is refused. Each message says what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("credential: {bytes} bytes is over the {MAX_CREDENTIAL_BYTES}-byte limit")]
    TooLarge { bytes: usize },
    #[error("credential: not a Docket credential ({0})")]
    Malformed(String),
    #[error(
        "credential: signed with key {0}, which this controller does not hold (a credential of \
         another cluster, or a key not yet distributed)"
    )]
    UnknownKey(KeyId),
    #[error("credential: the signature does not match (tampered with, or forged)")]
    BadSignature,
    #[error(
        "credential: expired {ago_ms} ms ago (lifetime and clock-skew allowance passed); get a \
         fresh one"
    )]
    Expired { ago_ms: u64 },
    #[error(
        "credential: issued {ahead_ms} ms in the future, beyond the clock-skew allowance; check \
         the clocks of the submit host and the controllers"
    )]
    FromTheFuture { ahead_ms: u64 },
    #[error("credential: lifetime {lifetime_ms} ms is over the {limit_ms} ms accepted")]
    TooLongLived { lifetime_ms: u64, limit_ms: u64 },
    #[error("credential: already used (each credential is good for one request)")]
    Replayed,
    #[error(
        "credential: this controller is tracking {0} unexpired credentials, its limit; retry \
         shortly"
    )]
    ReplayCacheFull(usize),
}

/// Time rules a verifier applies.
#[derive(Debug, Clone, Copy)]
pub struct TimeRules {
    /// How far the signer's clock may be off from ours, either way.
    pub skew_ms: u64,
    /// The longest lifetime (expiry - issued) accepted.
    pub max_lifetime_ms: u64,
}

impl Default for TimeRules {
    fn default() -> Self {
        TimeRules {
            skew_ms: 30_000,
            max_lifetime_ms: 10 * 60_000,
        }
    }
}

type HmacSha256 = Hmac<Sha256>;

fn mac(key: &Key, body: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length.
    let mut m = match HmacSha256::new_from_slice(key.secret()) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of every length"),
    };
    m.update(MAC_DOMAIN);
    m.update(body);
    m
}

/// Signs `claims` with the ring's signing key.
pub fn sign(ring: &KeyRing, claims: &Claims) -> Result<String, CredentialError> {
    if claims.gids.len() > MAX_GROUPS {
        return Err(CredentialError::Malformed(format!(
            "{} groups; at most {MAX_GROUPS}",
            claims.gids.len()
        )));
    }
    let key = ring.signing();
    let mut body = key.id().0.to_vec();
    let payload = postcard::to_allocvec(claims)
        .map_err(|e| CredentialError::Malformed(format!("encoding the claims: {e}")))?;
    body.extend_from_slice(&payload);
    let tag = mac(key, &body).finalize().into_bytes();
    Ok(format!("{PREFIX}{}.{}", B64.encode(&body), B64.encode(tag)))
}

/// Checks the signature and time of `credential` at `now_ms` (not replay: see
/// [`crate::replay::ReplayCache`]), and returns its claims.
pub fn verify(
    ring: &KeyRing,
    credential: &str,
    now_ms: u64,
    rules: TimeRules,
) -> Result<Claims, CredentialError> {
    if credential.len() > MAX_CREDENTIAL_BYTES {
        return Err(CredentialError::TooLarge {
            bytes: credential.len(),
        });
    }
    let rest = credential
        .strip_prefix(PREFIX)
        .ok_or_else(|| CredentialError::Malformed(format!("no {PREFIX:?} prefix")))?;
    let (body, tag) = rest
        .split_once('.')
        .ok_or_else(|| CredentialError::Malformed("no signature part".into()))?;
    let body = B64
        .decode(body)
        .map_err(|e| CredentialError::Malformed(format!("body: {e}")))?;
    let tag = B64
        .decode(tag)
        .map_err(|e| CredentialError::Malformed(format!("signature: {e}")))?;
    if body.len() < 8 {
        return Err(CredentialError::Malformed("body too short".into()));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&body[..8]);
    let key = ring
        .get(KeyId(id))
        .ok_or(CredentialError::UnknownKey(KeyId(id)))?;
    mac(key, &body)
        .verify_slice(&tag)
        .map_err(|_| CredentialError::BadSignature)?;
    // Only a signed body is decoded.
    let (claims, left): (Claims, &[u8]) = postcard::take_from_bytes(&body[8..])
        .map_err(|e| CredentialError::Malformed(format!("claims: {e}")))?;
    if !left.is_empty() {
        return Err(CredentialError::Malformed("trailing bytes".into()));
    }
    if claims.gids.len() > MAX_GROUPS
        || claims.user.is_empty()
        || claims.user.len() > MAX_NAME_BYTES
        || claims.host.len() > MAX_NAME_BYTES
    {
        return Err(CredentialError::Malformed(
            "user, host or groups out of bounds".into(),
        ));
    }
    let lifetime = claims.expires_ms.saturating_sub(claims.issued_ms);
    if claims.expires_ms < claims.issued_ms || lifetime > rules.max_lifetime_ms {
        return Err(CredentialError::TooLongLived {
            lifetime_ms: lifetime,
            limit_ms: rules.max_lifetime_ms,
        });
    }
    if claims.issued_ms > now_ms.saturating_add(rules.skew_ms) {
        return Err(CredentialError::FromTheFuture {
            ahead_ms: claims.issued_ms - now_ms,
        });
    }
    if now_ms > claims.expires_ms.saturating_add(rules.skew_ms) {
        return Err(CredentialError::Expired {
            ago_ms: now_ms - claims.expires_ms,
        });
    }
    Ok(claims)
}

/// A fresh nonce from the operating system's generator.
pub fn nonce() -> Result<[u8; 16], String> {
    let mut n = [0u8; 16];
    getrandom::fill(&mut n).map_err(|e| e.to_string())?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> KeyRing {
        KeyRing::new(vec![Key::generate().unwrap()]).unwrap()
    }

    fn claims(now: u64) -> Claims {
        Claims {
            uid: 1000,
            gid: 1000,
            gids: vec![1000, 27],
            user: "alice".into(),
            host: "login1".into(),
            issued_ms: now,
            expires_ms: now + 60_000,
            nonce: nonce().unwrap(),
        }
    }

    #[test]
    fn a_signed_credential_verifies_within_its_lifetime() {
        let r = ring();
        let c = claims(1_000_000);
        let token = sign(&r, &c).unwrap();
        assert!(token.starts_with(PREFIX));
        let rules = TimeRules::default();
        assert_eq!(verify(&r, &token, 1_000_000, rules).unwrap(), c);
        // Within the skew allowance either side.
        verify(&r, &token, 1_000_000 - 29_000, rules).unwrap();
        verify(&r, &token, 1_000_000 + 60_000 + 29_000, rules).unwrap();
        assert!(matches!(
            verify(&r, &token, 1_000_000 + 60_000 + 31_000, rules),
            Err(CredentialError::Expired { .. })
        ));
        assert!(matches!(
            verify(&r, &token, 1_000_000 - 31_000, rules),
            Err(CredentialError::FromTheFuture { .. })
        ));
    }

    #[test]
    fn tampering_or_another_clusters_key_is_refused() {
        let r = ring();
        let token = sign(&r, &claims(5_000)).unwrap();
        let rules = TimeRules::default();
        // Another cluster's key.
        assert!(matches!(
            verify(&ring(), &token, 5_000, rules),
            Err(CredentialError::UnknownKey(_))
        ));
        // Same key id, different secret: a forged body under a guessed id.
        let (body, _) = token[PREFIX.len()..].split_once('.').unwrap();
        let mut raw = B64.decode(body).unwrap();
        let forged_claims = Claims {
            uid: 0,
            user: "root".into(),
            ..claims(5_000)
        };
        raw.truncate(8);
        raw.extend(postcard::to_allocvec(&forged_claims).unwrap());
        let forged = format!("{PREFIX}{}.{}", B64.encode(&raw), B64.encode([0u8; 32]));
        assert_eq!(
            verify(&r, &forged, 5_000, rules),
            Err(CredentialError::BadSignature)
        );
        // One flipped bit of a signed credential.
        let mut bytes = token.clone().into_bytes();
        let at = PREFIX.len() + 20;
        bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
        let flipped = String::from_utf8(bytes).unwrap();
        assert!(verify(&r, &flipped, 5_000, rules).is_err());
        // Not a credential at all, and an absurdly long one.
        assert!(matches!(
            verify(&r, "MUNGE:abc:", 5_000, rules),
            Err(CredentialError::Malformed(_))
        ));
        let huge = format!("{PREFIX}{}", "A".repeat(MAX_CREDENTIAL_BYTES));
        assert!(matches!(
            verify(&r, &huge, 5_000, rules),
            Err(CredentialError::TooLarge { .. })
        ));
    }

    #[test]
    fn lifetimes_beyond_the_rule_are_refused_even_when_signed() {
        let r = ring();
        let mut c = claims(0);
        c.expires_ms = 365 * 24 * 3_600_000;
        let token = sign(&r, &c).unwrap();
        assert!(matches!(
            verify(&r, &token, 10, TimeRules::default()),
            Err(CredentialError::TooLongLived { .. })
        ));
    }
}
