//! Confining `/v3` to a key prefix: every key a client names is moved under the namespace on
//! the way in, every range end is clamped to the namespace's end, and every key etcd returns is
//! moved back out — or, if it is not inside (which confined requests cannot produce), dropped.
//! So nothing outside the namespace, the proxy's own keys included, can be read or written.

use crate::etcd::prefix_end;

/// The namespace, as raw key bytes.
#[derive(Debug, Clone)]
pub(crate) struct Namespace {
    prefix: Vec<u8>,
    /// The first key after every key of the namespace.
    end: Vec<u8>,
}

impl Namespace {
    /// A namespace at `prefix`, which must be non-empty and not all `0xff` bytes (config
    /// validation guarantees both: the prefix is non-empty UTF-8).
    pub(crate) fn new(prefix: impl Into<Vec<u8>>) -> Self {
        let prefix = prefix.into();
        let end = prefix_end(&prefix);
        Self { prefix, end }
    }

    /// The etcd key of the client's `key`.
    pub(crate) fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key);
        k
    }

    /// The etcd range end of the client's `range_end`: empty (a single key) stays empty; `"\0"`
    /// (every key from `key` on) becomes the namespace's end; anything else moves inside and is
    /// never past the namespace's end, whatever bytes the client sent.
    pub(crate) fn range_end(&self, range_end: &[u8]) -> Vec<u8> {
        match range_end {
            [] => Vec::new(),
            [0] => self.end.clone(),
            end => self.key(end).min(self.end.clone()),
        }
    }

    /// The client's view of an etcd key: without the namespace, or `None` if outside it.
    pub(crate) fn strip<'k>(&self, key: &'k [u8]) -> Option<&'k [u8]> {
        key.strip_prefix(self.prefix.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_ranges_stay_inside() {
        let ns = Namespace::new(b"/ns/".to_vec());
        let end = prefix_end(b"/ns/");
        assert_eq!(ns.key(b"a"), b"/ns/a");
        assert_eq!(ns.key(b""), b"/ns/");
        assert_eq!(ns.range_end(b""), b"");
        assert_eq!(ns.range_end(b"\0"), end);
        assert_eq!(ns.range_end(b"b"), b"/ns/b");
        assert_eq!(ns.range_end(b"\xff\xff"), b"/ns/\xff\xff");
        assert_eq!(ns.range_end(b"\0\x01"), b"/ns/\0\x01");
        for client_end in [b"".as_slice(), b"\0", b"\xff", b"zz", b"\0\0"] {
            let e = ns.range_end(client_end);
            assert!(e.is_empty() || (e.as_slice() <= end.as_slice() && e > b"/ns/".to_vec()));
        }
    }

    #[test]
    fn keys_come_back_out_or_not_at_all() {
        let ns = Namespace::new(b"/ns/".to_vec());
        assert_eq!(ns.strip(b"/ns/a"), Some(b"a".as_slice()));
        assert_eq!(ns.strip(b"/ns/"), Some(b"".as_slice()));
        assert_eq!(ns.strip(b"/other/a"), None);
        assert_eq!(ns.strip(b"/ns"), None);
    }
}
