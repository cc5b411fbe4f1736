//! Signing keys and the signed wire form of tokens.
//!
//! Wire form: `v1.{kid}.{era}.{revision}.{resource-tag}.{mac}` where
//! - `resource-tag` = base64url(HMAC(key, "resource" ‖ resource))[..16 bytes]: a keyed tag of the
//!   resource, so an enforcer can tell "minted for another resource" (403) from "forged" (401)
//!   without the token spelling out the resource name;
//! - `mac` = base64url(HMAC-SHA256(key, "token" ‖ kid ‖ era ‖ revision ‖ resource-tag)).
//!
//! The MAC covers the tag, and the tag is keyed, so the token is bound to its resource as firmly
//! as the MAC itself.
//!
//! [`Keys`] is the keyring in force, swapped whole when its file is reloaded.

mod current;
#[cfg(feature = "server")]
pub(crate) mod file;

pub use current::Keys;

use std::fmt;
use std::path::Path;

use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::{Error, Token, TokenError};

type HmacSha256 = Hmac<Sha256>;

const VERSION: &str = "v1";
const TAG_LEN: usize = 16;
const MAC_LEN: usize = 32;
/// Shortest secret accepted in a key file, in bytes.
const MIN_SECRET_LEN: usize = 32;
/// Longest wire token considered at all; anything longer is malformed without further work.
const MAX_WIRE_LEN: usize = 256;
const MAX_KID_LEN: usize = 32;

/// A key identifier: 1–32 characters of `[A-Za-z0-9_-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyId(String);

impl KeyId {
    /// Validates a key id.
    pub fn parse(s: &str) -> Option<Self> {
        let ok = !s.is_empty()
            && s.len() <= MAX_KID_LEN
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        ok.then(|| Self(s.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone)]
struct Key {
    id: KeyId,
    secret: Vec<u8>,
}

impl Key {
    fn hmac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length; ours are at least 32 bytes by construction.
        match HmacSha256::new_from_slice(&self.secret) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC takes keys of any length"),
        }
    }

    fn resource_tag(&self, resource: &str) -> [u8; TAG_LEN] {
        let mut mac = self.hmac();
        mac.update(b"lease-proxy/fencing/resource/v1\0");
        mac.update(resource.as_bytes());
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    fn token_mac(&self, token: Token, tag: &[u8; TAG_LEN]) -> HmacSha256 {
        let mut mac = self.hmac();
        mac.update(b"lease-proxy/fencing/token/v1\0");
        mac.update(self.id.as_str().as_bytes());
        mac.update(b"\0");
        mac.update(&token.era.to_be_bytes());
        mac.update(&token.revision.to_be_bytes());
        mac.update(tag);
        mac
    }
}

/// The keys that mint and verify tokens. The first key signs; every key verifies, so keys can be
/// rotated by prepending a new one and dropping the old one once its tokens are out of use.
pub struct Keyring {
    keys: Vec<Key>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print secrets.
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Keyring").field("key_ids", &ids).finish()
    }
}

impl Keyring {
    /// Parses a key file: one key per line, `KID SECRET` with the secret in base64url (padding
    /// optional) of at least 32 bytes; `#` starts a comment; blank lines are ignored.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let mut keys: Vec<Key> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |reason: &str| Error::KeyLine {
                line: line_no,
                reason: reason.to_owned(),
            };
            let mut parts = line.split_whitespace();
            let (Some(kid), Some(secret), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad("expected `KID SECRET`"));
            };
            let id =
                KeyId::parse(kid).ok_or_else(|| bad("key id must be 1-32 of [A-Za-z0-9_-]"))?;
            if keys.iter().any(|k| k.id == id) {
                return Err(bad("duplicate key id"));
            }
            let secret = URL_SAFE_NO_PAD
                .decode(secret.trim_end_matches('='))
                .or_else(|_| URL_SAFE.decode(secret))
                .map_err(|_| bad("secret is not base64url"))?;
            if secret.len() < MIN_SECRET_LEN {
                return Err(bad("secret must be at least 32 bytes"));
            }
            keys.push(Key { id, secret });
        }
        if keys.is_empty() {
            return Err(Error::NoKeys);
        }
        Ok(Self { keys })
    }

    /// Reads and parses a key file (see [`Keyring::parse`]); a file whose last line has no
    /// newline is refused as possibly cut short ([`runtime::files::read_config_text`]).
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = runtime::files::read_config_text(path, 1 << 20).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text)
    }

    /// The text of a fresh key file holding one random 32-byte key with the given id.
    pub fn generate_file(kid: &KeyId) -> String {
        format!(
            "# fencing key file: `KID SECRET` per line; the first key signs, all verify\n{}",
            Self::key_line(kid)
        )
    }

    /// One line of a key file: `kid` and a fresh random 32-byte secret, newline included.
    fn key_line(kid: &KeyId) -> String {
        let mut secret = [0u8; MIN_SECRET_LEN];
        rand::rng().fill_bytes(&mut secret);
        format!("{kid} {}\n", URL_SAFE_NO_PAD.encode(secret))
    }

    /// Writes a fresh key file (one random key with id `kid`) at `path`, readable by the owner
    /// only; refuses to overwrite an existing file.
    pub fn create_file(path: &Path, kid: &KeyId) -> Result<(), Error> {
        use std::io::Write;
        let io = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(path).map_err(io)?;
        file.write_all(Self::generate_file(kid).as_bytes())
            .map_err(io)?;
        file.sync_all().map_err(io)
    }

    /// The id of the signing key.
    pub fn signing_key_id(&self) -> &KeyId {
        &self.keys[0].id
    }

    /// The ids of every key, the signing key first.
    pub fn key_ids(&self) -> impl Iterator<Item = &KeyId> {
        self.keys.iter().map(|k| &k.id)
    }

    /// Every key's id and secret, the signing key first: what the in-database package
    /// verifies with (`fence-gateway pg sync-keys`, [`crate::indb`]). Never log them.
    #[cfg(feature = "server")]
    pub(crate) fn secrets(&self) -> impl Iterator<Item = (&KeyId, &[u8])> {
        self.keys.iter().map(|k| (&k.id, k.secret.as_slice()))
    }

    /// One short tag per key, `KID:` and 16 hex digits of an HMAC under the key: the same for
    /// every holder of the key file, unpredictable without it, and saying nothing about the
    /// secret. fence-gateway's PostgreSQL store and `fence-gateway pg sync-keys` stamp a set of
    /// marks with them, so that an enforcer can tell this deployment's marks from another's
    /// (a key shared is a deployment shared). The signing key's first.
    pub fn marks_tags(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|k| {
                let mut mac = k.hmac();
                mac.update(b"lease-proxy/fencing/marks/v1\0");
                let digest = mac.finalize().into_bytes();
                let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
                format!("{}:{hex}", k.id)
            })
            .collect()
    }

    /// The ring as each of its keys would sign: one single-key ring per key, the signing key
    /// first. For checking a value [`Keyring::derive`]d (or minted) by a holder of this file
    /// before a rotation made another key the signing one: it matches under one of them as
    /// long as the key that made it is still a line of the file.
    pub fn signers(&self) -> impl Iterator<Item = Keyring> + '_ {
        self.keys.iter().map(|k| Keyring {
            keys: vec![k.clone()],
        })
    }

    /// 32 bytes derived from the signing key and `context`: the same for the same key and
    /// context, unpredictable without the key. Used for values that must be reproducible across
    /// replicas sharing the key file (e.g. the secret of an idempotent grant).
    pub fn derive(&self, context: &[u8]) -> [u8; 32] {
        let mut mac = self.keys[0].hmac();
        mac.update(b"lease-proxy/fencing/derive/v1\0");
        mac.update(context);
        mac.finalize().into_bytes().into()
    }

    /// Signs `token` for `resource` with the first key.
    pub fn mint(&self, resource: &str, token: Token) -> String {
        let key = &self.keys[0];
        let tag = key.resource_tag(resource);
        let mac = key.token_mac(token, &tag).finalize().into_bytes();
        format!(
            "{VERSION}.{}.{}.{}.{}.{}",
            key.id,
            token.era,
            token.revision,
            URL_SAFE_NO_PAD.encode(tag),
            URL_SAFE_NO_PAD.encode(mac)
        )
    }

    /// Checks a wire token presented for `resource` and returns the token it carries.
    ///
    /// Never panics, whatever the input; the MAC and the resource tag are compared in constant
    /// time.
    pub fn verify(&self, resource: &str, wire: &str) -> Result<Token, TokenError> {
        let parsed = Parsed::parse(wire)?;
        let key = self
            .keys
            .iter()
            .find(|k| k.id.as_str() == parsed.kid)
            .ok_or(TokenError::UnknownKey)?;
        key.token_mac(parsed.token, &parsed.tag)
            .verify_slice(&parsed.mac)
            .map_err(|_| TokenError::BadSignature)?;
        if bool::from(key.resource_tag(resource).ct_eq(&parsed.tag)) {
            Ok(parsed.token)
        } else {
            Err(TokenError::WrongResource)
        }
    }
}

/// The syntactic pieces of a wire token, before any key is consulted.
struct Parsed<'a> {
    kid: &'a str,
    token: Token,
    tag: [u8; TAG_LEN],
    mac: [u8; MAC_LEN],
}

impl<'a> Parsed<'a> {
    fn parse(wire: &'a str) -> Result<Self, TokenError> {
        if wire.len() > MAX_WIRE_LEN {
            return Err(TokenError::Malformed);
        }
        let mut parts = wire.split('.');
        let mut next = || parts.next().ok_or(TokenError::Malformed);
        let (version, kid, era, revision, tag, mac) =
            (next()?, next()?, next()?, next()?, next()?, next()?);
        if parts.next().is_some() || version != VERSION || KeyId::parse(kid).is_none() {
            return Err(TokenError::Malformed);
        }
        Ok(Self {
            kid,
            token: Token::new(parse_decimal(era)?, parse_decimal(revision)?),
            tag: decode_fixed(tag)?,
            mac: decode_fixed(mac)?,
        })
    }
}

/// A canonical unsigned decimal: digits only, no sign, no leading zeros, fits in a u64.
fn parse_decimal(s: &str) -> Result<u64, TokenError> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if !canonical {
        return Err(TokenError::Malformed);
    }
    s.parse().map_err(|_| TokenError::Malformed)
}

fn decode_fixed<const N: usize>(s: &str) -> Result<[u8; N], TokenError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| TokenError::Malformed)?;
    bytes.try_into().map_err(|_| TokenError::Malformed)
}

#[cfg(test)]
mod tests;
