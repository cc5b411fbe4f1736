//! Per-grant secrets: the proof of holding required to renew, release and forward.
//!
//! etcd lease ids are guessable, so holding is proven by a 256-bit secret returned once at
//! acquire. etcd stores only its SHA-256, so nobody reading etcd can act as the holder.
//!
//! A secret is base64url(lease id, 8 bytes big-endian ‖ 32 secret bytes). The lease id lets the
//! proxy tell a secret of an *earlier* grant (its lease is no longer the resource's: the caller
//! has lost the lease, 410) from a wrong secret for the *current* grant (403).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use fencing::Keyring;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

const ENCODED_LEN: usize = 54;

fn encode(lease_id: i64, secret: &[u8; 32]) -> String {
    let mut bytes = [0u8; 40];
    bytes[..8].copy_from_slice(&lease_id.to_be_bytes());
    bytes[8..].copy_from_slice(secret);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A fresh random secret for a grant on `lease_id`.
pub(crate) fn random(lease_id: i64) -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    encode(lease_id, &bytes)
}

/// The lease id a secret was issued for, if it is a well-formed secret at all.
pub(crate) fn lease_id(secret: &str) -> Option<i64> {
    if secret.len() != ENCODED_LEN {
        return None;
    }
    let bytes = URL_SAFE_NO_PAD.decode(secret).ok()?;
    let id: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some(i64::from_be_bytes(id))
}

/// The secret of an idempotent grant: derived from the shared key, so any replica answering a
/// retried acquire with the same `Idempotency-Key` returns the same secret.
pub(crate) fn idempotent(
    keys: &Keyring,
    resource: &str,
    holder: &str,
    key: &str,
    lease_id: i64,
) -> String {
    let mut context = Vec::with_capacity(resource.len() + holder.len() + key.len() + 32);
    for part in [resource.as_bytes(), holder.as_bytes(), key.as_bytes()] {
        context.extend_from_slice(&(part.len() as u64).to_be_bytes());
        context.extend_from_slice(part);
    }
    context.extend_from_slice(&lease_id.to_be_bytes());
    encode(lease_id, &keys.derive(&context))
}

/// The stored hash of a secret.
pub(crate) fn hash(secret: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(secret.as_bytes()))
}

/// The stored marker of an idempotency key, scoped to the holder.
pub(crate) fn idempotency_marker(holder: &str, key: &str) -> String {
    let mut h = Sha256::new();
    h.update((holder.len() as u64).to_be_bytes());
    h.update(holder.as_bytes());
    h.update(key.as_bytes());
    URL_SAFE_NO_PAD.encode(h.finalize())
}

/// Whether `secret` hashes to `stored`, compared in constant time.
pub(crate) fn matches(secret: &str, stored: &str) -> bool {
    hash(secret).as_bytes().ct_eq(stored.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashing() {
        let s = random(42);
        assert_eq!(s.len(), ENCODED_LEN);
        assert_eq!(lease_id(&s), Some(42));
        assert!(matches(&s, &hash(&s)));
        assert!(!matches(&random(42), &hash(&s)));
        assert_ne!(random(7), random(7));
        assert_eq!(lease_id("short"), None);
        assert_eq!(lease_id(&"!".repeat(ENCODED_LEN)), None);
    }
}
