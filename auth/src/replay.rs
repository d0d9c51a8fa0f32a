//! Single use: a credential seen once is refused for the rest of its life.
//!
//! Each controller keeps the nonces of the credentials it accepted until they expire (plus
//! the clock-skew allowance, the longest a verifier would still take them). The cache is
//! bounded: only validly signed credentials reach it, so only key holders could fill it, and
//! when it is full it refuses (fails closed) rather than forget a nonce that is still live.

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;

use crate::credential::CredentialError;

/// Default bound: a minute's worth of credentials at over 16,000 requests a second.
pub const DEFAULT_CAPACITY: usize = 1 << 20;

#[derive(Debug, Default)]
struct Inner {
    seen: HashSet<[u8; 16]>,
    /// (forget at, nonce), oldest first.
    by_expiry: BTreeSet<(u64, [u8; 16])>,
}

/// The nonces of accepted, unexpired credentials.
#[derive(Debug)]
pub struct ReplayCache {
    inner: Mutex<Inner>,
    capacity: usize,
}

impl ReplayCache {
    pub fn new(capacity: usize) -> ReplayCache {
        ReplayCache {
            inner: Mutex::new(Inner::default()),
            capacity,
        }
    }

    /// Records `nonce` until `forget_at_ms`; refuses a nonce already recorded.
    pub fn admit(
        &self,
        nonce: [u8; 16],
        forget_at_ms: u64,
        now_ms: u64,
    ) -> Result<(), CredentialError> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(&(at, n)) = inner.by_expiry.first() {
            if at > now_ms {
                break;
            }
            inner.by_expiry.pop_first();
            inner.seen.remove(&n);
        }
        if inner.seen.contains(&nonce) {
            return Err(CredentialError::Replayed);
        }
        if inner.seen.len() >= self.capacity {
            return Err(CredentialError::ReplayCacheFull(self.capacity));
        }
        inner.seen.insert(nonce);
        inner.by_expiry.insert((forget_at_ms, nonce));
        Ok(())
    }

    /// Nonces held.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .seen
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_is_admitted_once_until_it_expires_and_a_full_cache_fails_closed() {
        let c = ReplayCache::new(2);
        c.admit([1; 16], 100, 0).unwrap();
        assert_eq!(c.admit([1; 16], 100, 50), Err(CredentialError::Replayed));
        c.admit([2; 16], 200, 50).unwrap();
        assert_eq!(
            c.admit([3; 16], 200, 60),
            Err(CredentialError::ReplayCacheFull(2))
        );
        // At 100 the first nonce is forgotten: room again, and [1] could be seen anew (its
        // credential is expired by then, which verification refuses first).
        c.admit([3; 16], 300, 100).unwrap();
        assert_eq!(c.len(), 2);
    }
}
