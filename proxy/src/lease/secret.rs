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
//!
//! Secrets, seals and idempotency markers are made with the signing key of the keyring in force
//! and checked against every key of it ([`Keyring::signers`]), so a key rotation changes nothing
//! for grants made before it as long as their key stays a line of the file: the secret itself is
//! checked by its hash, whatever the keys.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use fencing::Keyring;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

const ENCODED_LEN: usize = 54;

/// The seal's domain of a grant's secret.
const GRANT: &[u8; 24] = b"lease-proxy/secret/v1\0\0\0";
/// The seal's domain of a session's secret: never mistaken for a grant's (same lease id).
const SESSION: &[u8; 24] = b"lease-proxy/session/v1\0\0";

fn seal(keys: &Keyring, domain: &[u8; 24], lease_id: i64, nonce: &[u8; 16]) -> [u8; 16] {
    let mut context = [0u8; 8 + 16 + 24];
    context[..24].copy_from_slice(domain);
    context[24..32].copy_from_slice(&lease_id.to_be_bytes());
    context[32..].copy_from_slice(nonce);
    let mut out = [0u8; 16];
    out.copy_from_slice(&keys.derive(&context)[..16]);
    out
}

fn encode(keys: &Keyring, lease_id: i64, nonce: &[u8; 16]) -> String {
    encode_in(keys, GRANT, lease_id, nonce)
}

fn encode_in(keys: &Keyring, domain: &[u8; 24], lease_id: i64, nonce: &[u8; 16]) -> String {
    let mut bytes = [0u8; 40];
    bytes[..8].copy_from_slice(&lease_id.to_be_bytes());
    bytes[8..24].copy_from_slice(nonce);
    bytes[24..].copy_from_slice(&seal(keys, domain, lease_id, nonce));
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A fresh random secret for a grant on `lease_id`.
pub(crate) fn random(keys: &Keyring, lease_id: i64) -> String {
    let mut nonce = [0u8; 16];
    rand::rng().fill_bytes(&mut nonce);
    encode(keys, lease_id, &nonce)
}

/// A fresh random secret for the session on `lease_id`.
pub(crate) fn session(keys: &Keyring, lease_id: i64) -> String {
    let mut nonce = [0u8; 16];
    rand::rng().fill_bytes(&mut nonce);
    encode_in(keys, SESSION, lease_id, &nonce)
}

/// Whether `secret` was issued (for some grant) by a proxy signing with one of the keys of
/// `keys`.
pub(crate) fn sealed(keys: &Keyring, secret: &str) -> bool {
    sealed_in(keys, GRANT, secret)
}

fn sealed_in(keys: &Keyring, domain: &[u8; 24], secret: &str) -> bool {
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
    let id = i64::from_be_bytes(id);
    keys.signers()
        .any(|signer| bool::from(seal(&signer, domain, id, &nonce).ct_eq(tag)))
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
/// retried acquire with the same `Idempotency-Key` returns the same secret. `salt` is the grant's
/// own random value (stored in its idempotency marker), so no two grants share a secret even
/// with the same resource, holder, key and (reused) lease.
pub(crate) fn idempotent(
    keys: &Keyring,
    resource: &str,
    holder: &str,
    key: &str,
    lease_id: i64,
    salt: &[u8; SALT_LEN],
) -> String {
    let mut context = framed(b"lease-proxy/idempotent-secret/v2", resource, holder, key);
    context.extend_from_slice(&lease_id.to_be_bytes());
    context.extend_from_slice(salt);
    let mut nonce = [0u8; 16];
    nonce.copy_from_slice(&keys.derive(&context)[..16]);
    encode(keys, lease_id, &nonce)
}

/// Length of an idempotency marker's salt.
pub(crate) const SALT_LEN: usize = 16;

/// `label` followed by each part, length-prefixed, so no two inputs frame alike.
fn framed(label: &[u8], resource: &str, holder: &str, key: &str) -> Vec<u8> {
    let mut context =
        Vec::with_capacity(label.len() + resource.len() + holder.len() + key.len() + 64);
    context.extend_from_slice(label);
    context.push(0);
    for part in [resource.as_bytes(), holder.as_bytes(), key.as_bytes()] {
        context.extend_from_slice(&(part.len() as u64).to_be_bytes());
        context.extend_from_slice(part);
    }
    context
}

fn marker_mac(keys: &Keyring, resource: &str, holder: &str, key: &str, salt: &[u8]) -> [u8; 32] {
    let mut context = framed(b"lease-proxy/idempotency-marker/v2", resource, holder, key);
    context.extend_from_slice(salt);
    keys.derive(&context)
}

/// A fresh random salt for an idempotent grant.
pub(crate) fn salt() -> [u8; SALT_LEN] {
    let mut salt = [0u8; SALT_LEN];
    rand::rng().fill_bytes(&mut salt);
    salt
}

/// The stored marker of an `Idempotency-Key`: `v2.{salt}.{mac}`, the MAC keyed by the fencing
/// key over resource, holder, key and salt. Without the key, nobody reading etcd can test
/// guesses of the `Idempotency-Key` against it (a bare hash can be brute-forced offline).
pub(crate) fn idempotency_marker(
    keys: &Keyring,
    resource: &str,
    holder: &str,
    key: &str,
    salt: &[u8; SALT_LEN],
) -> String {
    format!(
        "v2.{}.{}",
        URL_SAFE_NO_PAD.encode(salt),
        URL_SAFE_NO_PAD.encode(marker_mac(keys, resource, holder, key, salt))
    )
}

/// The salt of `marker` if it was made for this resource, holder and key (constant-time
/// comparison) with one of the keys of `keys`, and that key alone as a ring (the grant's
/// [`idempotent`] secret was made with it); `None` for anything else, including markers of the
/// earlier, unkeyed form.
pub(crate) fn idempotency_salt(
    keys: &Keyring,
    marker: &str,
    resource: &str,
    holder: &str,
    key: &str,
) -> Option<([u8; SALT_LEN], Keyring)> {
    let mut parts = marker.split('.');
    let (Some("v2"), Some(salt), Some(mac), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let salt: [u8; SALT_LEN] = URL_SAFE_NO_PAD.decode(salt).ok()?.try_into().ok()?;
    let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
    let signer = keys.signers().find(|signer| {
        let want = marker_mac(signer, resource, holder, key, &salt);
        bool::from(want.as_slice().ct_eq(&mac))
    })?;
    Some((salt, signer))
}

/// The stored hash of a secret.
pub(crate) fn hash(secret: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(secret.as_bytes()))
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
        assert!(sealed(
            &keys,
            &idempotent(&keys, "r", "h", "k", 42, &[0; SALT_LEN])
        ));
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
    fn idempotent_secrets_are_reproducible_and_distinct_per_grant() {
        let keys = keys();
        let (a, b) = (salt(), salt());
        assert_ne!(a, b);
        assert_eq!(
            idempotent(&keys, "r", "h", "k", 1, &a),
            idempotent(&keys, "r", "h", "k", 1, &a)
        );
        // Another lease, or another grant (salt) on the same lease: another secret.
        assert_ne!(
            idempotent(&keys, "r", "h", "k", 1, &a),
            idempotent(&keys, "r", "h", "k", 2, &a)
        );
        assert_ne!(
            idempotent(&keys, "r", "h", "k", 1, &a),
            idempotent(&keys, "r", "h", "k", 1, &b)
        );
    }

    #[test]
    fn markers_are_keyed_and_bound() {
        let keys = keys();
        let salt = salt();
        let marker = idempotency_marker(&keys, "r", "h", "order-4711", &salt);
        let salt_of = |keys: &Keyring, marker: &str, r: &str, h: &str, k: &str| {
            idempotency_salt(keys, marker, r, h, k).map(|(salt, _)| salt)
        };
        assert_eq!(salt_of(&keys, &marker, "r", "h", "order-4711"), Some(salt));
        for (r, h, k) in [
            ("r", "h", "order-4712"),
            ("r", "g", "order-4711"),
            ("q", "h", "order-4711"),
        ] {
            assert_eq!(salt_of(&keys, &marker, r, h, k), None);
        }
        // Another key (another deployment, or an attacker without it) cannot make or check one.
        assert_eq!(
            salt_of(&self::keys(), &marker, "r", "h", "order-4711"),
            None
        );
        // Neither the key nor an unkeyed hash of it appears in the marker.
        assert!(!marker.contains("order"));
        for junk in ["", "v2", "v2..", "v1.x.y", &format!("{marker}.x")] {
            assert_eq!(salt_of(&keys, junk, "r", "h", "order-4711"), None);
        }
    }

    /// A rotation puts a new key first: what the old key made is still recognised while the old
    /// key is a line of the file, and an idempotent grant's secret is made again exactly.
    #[test]
    fn a_rotation_keeps_what_the_old_key_made_while_it_verifies() {
        let old_file = Keyring::generate_file(&fencing::KeyId::parse("k1").unwrap());
        let new_file = Keyring::generate_file(&fencing::KeyId::parse("k2").unwrap());
        let before = Keyring::parse(&old_file).unwrap();
        let rotated = Keyring::parse(&format!("{new_file}{old_file}")).unwrap();
        let retired = Keyring::parse(&new_file).unwrap();
        let salt = salt();
        let secret = idempotent(&before, "r", "h", "k", 9, &salt);
        let marker = idempotency_marker(&before, "r", "h", "k", &salt);
        assert!(sealed(&rotated, &random(&before, 9)));
        assert!(sealed(&rotated, &secret));
        let (found, signer) = idempotency_salt(&rotated, &marker, "r", "h", "k").unwrap();
        assert_eq!(found, salt);
        assert_eq!(idempotent(&signer, "r", "h", "k", 9, &salt), secret);
        // The new key signs what is made from now on.
        assert_ne!(idempotent(&rotated, "r", "h", "k", 9, &salt), secret);
        // Once the old key is gone, what it made is not recognised.
        assert!(!sealed(&retired, &secret));
        assert!(idempotency_salt(&retired, &marker, "r", "h", "k").is_none());
    }
}
