//! The keyring in force: read from the key file at start and swapped whole when the file is
//! reloaded (SIGHUP, or a change that has settled; see [`runtime::reload`]), so every mint and
//! every verification uses one whole keyring — the old one or the new one, never a mix — and a
//! file that does not load changes nothing.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use super::Keyring;
use crate::Error;

/// The current [`Keyring`], shared by everything that mints or verifies; cheap to clone (all
/// clones see the same reloads). Take [`Keys::current`] once per operation whose values must
/// agree (a grant's token, secret and idempotency marker are made with one keyring).
#[derive(Clone)]
pub struct Keys {
    inner: Arc<Inner>,
}

struct Inner {
    /// The key file, when the keyring came from one (only then can it be reloaded).
    path: Option<PathBuf>,
    current: RwLock<Arc<Keyring>>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("path", &self.inner.path)
            .field("current", &self.current())
            .finish()
    }
}

impl From<Keyring> for Keys {
    fn from(ring: Keyring) -> Self {
        Arc::new(ring).into()
    }
}

impl From<Arc<Keyring>> for Keys {
    /// A keyring that never changes (there is no file to reload it from).
    fn from(ring: Arc<Keyring>) -> Self {
        Self {
            inner: Arc::new(Inner {
                path: None,
                current: RwLock::new(ring),
            }),
        }
    }
}

impl Keys {
    /// Loads the key file at `path` ([`Keyring::load`]); it can be reloaded later.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let ring = Keyring::load(path)?;
        Ok(Self {
            inner: Arc::new(Inner {
                path: Some(path.to_owned()),
                current: RwLock::new(Arc::new(ring)),
            }),
        })
    }

    /// The keyring in force now.
    pub fn current(&self) -> Arc<Keyring> {
        // A poisoned lock only means a panic while an Arc was being swapped: the value is whole.
        self.inner
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The key file, if the keyring came from one.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// Reads the key file again and, if it loads, puts it in force (for every clone) and
    /// returns it; if it does not, the current keyring stays in force and the error says why.
    /// Without a file there is nothing to reload: the current keyring is returned.
    pub fn reload(&self) -> Result<Arc<Keyring>, Error> {
        let Some(path) = &self.inner.path else {
            return Ok(self.current());
        };
        let ring = Arc::new(Keyring::load(path)?);
        *self
            .inner
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = ring.clone();
        Ok(ring)
    }

    /// Reloads on SIGHUP and when the key file changes (see [`runtime::reload::on_change`]),
    /// until `cancel`; the task is `tracker`'s. Each outcome is logged — the key ids in force
    /// (never a secret), or why the file was not taken — and counted as `file="key-file"`.
    /// Without a file, nothing is watched.
    #[cfg(feature = "server")]
    pub fn watch(
        &self,
        reloads: &runtime::reload::Reloads,
        tracker: &tokio_util::task::TaskTracker,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        use runtime::reload::Outcome;
        let Some(path) = self.inner.path.clone() else {
            return;
        };
        let keys = self.clone();
        let counted = reloads.of("key-file");
        runtime::reload::on_change(vec![path.clone()], counted, tracker, cancel, move |why| {
            match keys.reload() {
                Ok(ring) => {
                    let ids: Vec<&str> = ring.key_ids().map(|k| k.as_str()).collect();
                    tracing::info!(path = %path.display(), signing = %ring.signing_key_id(), keys = ?ids, why, "fencing key file reloaded");
                    Outcome::Loaded
                }
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, why, "fencing key file NOT reloaded; the previous keys stay in force");
                    Outcome::Refused
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyId, Token, TokenError};

    fn key(kid: &str) -> String {
        Keyring::generate_file(&KeyId::parse(kid).unwrap())
    }

    #[test]
    fn a_reload_swaps_the_whole_ring_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        let (k1, k2) = (key("k1"), key("k2"));
        std::fs::write(&path, &k1).unwrap();
        let keys = Keys::load(&path).unwrap();
        let clone = keys.clone();
        let t = Token::new(0, 7);
        let old = keys.current().mint("r", t);
        // Replaced by rename: k2 signs, k1 is gone.
        let tmp = dir.path().join("keys.tmp");
        std::fs::write(&tmp, &k2).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        keys.reload().unwrap();
        let now = clone.current();
        assert_eq!(now.signing_key_id().as_str(), "k2");
        assert_eq!(now.verify("r", &old), Err(TokenError::UnknownKey));
        let new = now.mint("r", t);
        // Malformed, or cut mid-line: refused, k2 stays.
        for bad in ["k3 short\n", &k1[..k1.len() - 5]] {
            std::fs::write(&path, bad).unwrap();
            assert!(keys.reload().is_err(), "{bad:?}");
            assert_eq!(clone.current().verify("r", &new), Ok(t));
        }
        // A ring without a file never changes.
        let fixed = Keys::from(Keyring::parse(&k1).unwrap());
        assert!(fixed.path().is_none());
        assert_eq!(fixed.reload().unwrap().verify("r", &old), Ok(t));
    }
}
