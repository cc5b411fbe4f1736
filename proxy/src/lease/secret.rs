//! Per-grant secrets: the proof of holding required to renew, release and forward.
//!
//! etcd lease ids are guessable, so holding is proven by a secret returned once at acquire.
//! etcd stores only its SHA-256, so nobody reading etcd can act as the holder.
//!
//! A secret is base64url(lease id, 8 bytes big-endian ‖ 16-byte nonce ‖ 16-byte seal), where the
//! seal is keyed by the fencing key over the lease id and nonce. The lease id lets the proxy
//! tell a secret of an *earlier* grant (its lease is no longer the resource's: the caller has
//! lost the lease, 410) from a wrong secret for the *current* grant (403); the seal keeps that
//! distinction when a lease is reused for a later grant (see `spares`): a sealed secret that does
//! not match is an earlier grant's, an unsealed one is forged.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use fencing::Keyring;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

const ENCODED_LEN: usize = 54;

fn seal(keys: &Keyring, lease_id: i64, nonce: &[u8; 16]) -> [u8; 16] {
    let mut context = [0u8; 8 + 16 + 24];
    context[..24].copy_from_slice(b"lease-proxy/secret/v1\0\0\0");
    context[24..32].copy_from_slice(&lease_id.to_be_bytes());
    context[32..].copy_from_slice(nonce);
    let mut out = [0u8; 16];
    out.copy_from_slice(&keys.derive(&context)[..16]);
    out
}

fn encode(keys: &Keyring, lease_id: i64, nonce: &[u8; 16]) -> String {
    let mut bytes = [0u8; 40];
    bytes[..8].copy_from_slice(&lease_id.to_be_bytes());
    bytes[8..24].copy_from_slice(nonce);
    bytes[24..].copy_from_slice(&seal(keys, lease_id, nonce));
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A fresh random secret for a grant on `lease_id`.
pub(crate) fn random(keys: &Keyring, lease_id: i64) -> String {
    let mut nonce = [0u8; 16];
    rand::rng().fill_bytes(&mut nonce);
    encode(keys, lease_id, &nonce)
}

/// Whether `secret` was issued by a proxy holding the current signing key (for some grant).
pub(crate) fn sealed(keys: &Keyring, secret: &str) -> bool {
    if secret.len() != ENCODED_LEN {
        return false;
    }
    let Ok(bytes) = URL_SAFE_NO_PAD.decode(secret) else {
        return false;
    };
    let (Some(id), Some(nonce), Some(tag)) = (bytes.get(..8), bytes.get(8..24), bytes.get(24..))
    else {
        return false;
    };
    let (Ok(id), Ok(nonce)) = (<[u8; 8]>::try_from(id), <[u8; 16]>::try_from(nonce)) else {
        return false;
    };
    seal(keys, i64::from_be_bytes(id), &nonce).ct_eq(tag).into()
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
    let mut nonce = [0u8; 16];
    nonce.copy_from_slice(&keys.derive(&context)[..16]);
    encode(keys, lease_id, &nonce)
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

    fn keys() -> Keyring {
        Keyring::parse(&Keyring::generate_file(
            &fencing::KeyId::parse("k1").unwrap(),
        ))
        .unwrap()
    }

    #[test]
    fn hashing() {
        let keys = keys();
        let s = random(&keys, 42);
        assert_eq!(s.len(), ENCODED_LEN);
        assert_eq!(lease_id(&s), Some(42));
        assert!(matches(&s, &hash(&s)));
        assert!(!matches(&random(&keys, 42), &hash(&s)));
        assert_ne!(random(&keys, 7), random(&keys, 7));
        assert_eq!(lease_id("short"), None);
        assert_eq!(lease_id(&"!".repeat(ENCODED_LEN)), None);
    }

    #[test]
    fn only_issued_secrets_are_sealed() {
        let keys = keys();
        let s = random(&keys, 42);
        assert!(sealed(&keys, &s));
        assert!(sealed(&keys, &idempotent(&keys, "r", "h", "k", 42)));
        // Another key, a flipped byte, a different lease id, junk: not sealed.
        assert!(!sealed(&self::keys(), &s));
        let mut bytes = URL_SAFE_NO_PAD.decode(&s).unwrap();
        bytes[30] ^= 1;
        assert!(!sealed(&keys, &URL_SAFE_NO_PAD.encode(&bytes)));
        let mut bytes = URL_SAFE_NO_PAD.decode(&s).unwrap();
        bytes[7] ^= 1;
        assert!(!sealed(&keys, &URL_SAFE_NO_PAD.encode(&bytes)));
        assert!(!sealed(&keys, "short"));
        assert!(!sealed(&keys, &"!".repeat(ENCODED_LEN)));
    }

    #[test]
    fn idempotent_secrets_are_reproducible() {
        let keys = keys();
        assert_eq!(
            idempotent(&keys, "r", "h", "k", 1),
            idempotent(&keys, "r", "h", "k", 1)
        );
        assert_ne!(
            idempotent(&keys, "r", "h", "k", 1),
            idempotent(&keys, "r", "h", "k", 2)
        );
    }
}
