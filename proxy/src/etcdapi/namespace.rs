//! Confining `/v3` to a key prefix: every key a client names is moved under the namespace on
//! the way in, every range end is clamped to the namespace's end, and every key etcd returns is
//! moved back out — or, if it is not inside (which confined requests cannot produce), dropped.
//! So nothing outside the namespace, the proxy's own keys included, can be read or written.

use etcd_client::proto::{
    PbDeleteResponse, PbKeyValue, PbLeaseTimeToLiveResponse, PbPutResponse, PbRangeResponse,
    PbTxnOpResponse, PbTxnResponse,
};

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

    /// A key-value as the client sees it: its key without the namespace, or `None` if outside.
    fn kv(&self, mut kv: PbKeyValue) -> Option<PbKeyValue> {
        kv.key = self.strip(&kv.key)?.to_vec();
        Some(kv)
    }

    fn kvs(&self, kvs: Vec<PbKeyValue>) -> Vec<PbKeyValue> {
        kvs.into_iter().filter_map(|kv| self.kv(kv)).collect()
    }

    /// A range answer as the client sees it.
    pub(crate) fn range_out(&self, mut r: PbRangeResponse) -> PbRangeResponse {
        r.kvs = self.kvs(std::mem::take(&mut r.kvs));
        r
    }

    /// A put answer as the client sees it.
    pub(crate) fn put_out(&self, mut r: PbPutResponse) -> PbPutResponse {
        r.prev_kv = r.prev_kv.take().and_then(|kv| self.kv(kv));
        r
    }

    /// A delete answer as the client sees it.
    pub(crate) fn delete_out(&self, mut r: PbDeleteResponse) -> PbDeleteResponse {
        r.prev_kvs = self.kvs(std::mem::take(&mut r.prev_kvs));
        r
    }

    /// A transaction's answer as the client sees it, at every depth.
    pub(crate) fn txn_out(&self, mut r: PbTxnResponse) -> PbTxnResponse {
        for op in &mut r.responses {
            op.response = op.response.take().map(|response| match response {
                PbTxnOpResponse::ResponseRange(r) => {
                    PbTxnOpResponse::ResponseRange(self.range_out(r))
                }
                PbTxnOpResponse::ResponsePut(r) => PbTxnOpResponse::ResponsePut(self.put_out(r)),
                PbTxnOpResponse::ResponseDeleteRange(r) => {
                    PbTxnOpResponse::ResponseDeleteRange(self.delete_out(r))
                }
                PbTxnOpResponse::ResponseTxn(r) => PbTxnOpResponse::ResponseTxn(self.txn_out(r)),
            });
        }
        r
    }

    /// A lease's time-to-live as the client sees it: only its keys inside the namespace.
    pub(crate) fn time_to_live_out(
        &self,
        mut r: PbLeaseTimeToLiveResponse,
    ) -> PbLeaseTimeToLiveResponse {
        r.keys = std::mem::take(&mut r.keys)
            .into_iter()
            .filter_map(|k| self.strip(&k).map(<[u8]>::to_vec))
            .collect();
        r
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
