//! A client's watch requests as the pump reads them: each create's key and range moved into the
//! namespace exactly as a Range's are, and each answer's keys moved back out.

use etcd_client::proto::{PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use etcd_client::{WatchFilterType, WatchOptions};

use super::hub::Range;
use crate::etcdapi::namespace::Namespace;

/// One client request, confined.
pub(super) enum Ask {
    Create(Create),
    Cancel(i64),
    Progress,
    /// An empty request (no union): etcd ignores it.
    Nothing,
}

/// A create, its key and range moved into the namespace.
pub(super) struct Create {
    pub(super) key: Vec<u8>,
    /// Empty for one key.
    pub(super) end: Vec<u8>,
    pub(super) start_revision: i64,
    /// The client's (0: the next free one).
    pub(super) watch_id: i64,
    pub(super) no_put: bool,
    pub(super) no_delete: bool,
    pub(super) progress_notify: bool,
    pub(super) prev_kv: bool,
    pub(super) fragment: bool,
}

impl Create {
    /// What the stream's own etcd watch is asked, under watch id `id`.
    pub(super) fn options(&self, id: i64) -> WatchOptions {
        let mut options = WatchOptions::new()
            .with_key(self.key.clone())
            .with_start_revision(self.start_revision)
            .with_watch_id(id);
        if !self.end.is_empty() {
            options = options.with_range(self.end.clone());
        }
        let filters: Vec<_> = [
            (self.no_put, WatchFilterType::NoPut),
            (self.no_delete, WatchFilterType::NoDelete),
        ]
        .into_iter()
        .filter_map(|(on, f)| on.then_some(f))
        .collect();
        if !filters.is_empty() {
            options = options.with_filters(filters);
        }
        if self.progress_notify {
            options = options.with_progress_notify();
        }
        if self.prev_kv {
            options = options.with_prev_key();
        }
        if self.fragment {
            options = options.with_fragment();
        }
        options
    }

    /// The shared watch it can be a member of: a watch from now, without fragments or progress
    /// notifications (which are per watch).
    pub(super) fn shared(&self) -> Option<Range> {
        (self.start_revision == 0 && !self.fragment && !self.progress_notify && self.watch_id >= 0)
            .then(|| Range {
                key: self.key.clone(),
                end: self.end.clone(),
                prev_kv: self.prev_kv,
            })
    }
}

/// A create's key, range and options as etcd reads them, moved into `ns`: an empty key is
/// `\0` (etcd's smallest key), an empty range end a single key, `\0` every key from `key` on.
pub(super) fn confine(ns: &Namespace, request: PbWatchRequest) -> Ask {
    let Some(union) = request.request_union else {
        return Ask::Nothing;
    };
    let c = match union {
        PbWatchRequestUnion::CreateRequest(c) => c,
        PbWatchRequestUnion::CancelRequest(c) => return Ask::Cancel(c.watch_id),
        PbWatchRequestUnion::ProgressRequest(_) => return Ask::Progress,
    };
    let key = if c.key.is_empty() {
        ns.key(b"\0")
    } else {
        ns.key(&c.key)
    };
    // etcd ignores filter values it does not know.
    Ask::Create(Create {
        key,
        end: ns.range_end(&c.range_end),
        start_revision: c.start_revision,
        watch_id: c.watch_id,
        no_put: c.filters.contains(&0),
        no_delete: c.filters.contains(&1),
        progress_notify: c.progress_notify,
        prev_kv: c.prev_kv,
        fragment: c.fragment,
    })
}

/// etcd's answer as the client sees it: every key out of `ns`; events outside it dropped.
pub(super) fn strip(ns: &Namespace, mut r: PbWatchResponse) -> PbWatchResponse {
    r.events.retain_mut(|e| {
        let Some(kv) = e.kv.as_mut() else {
            return false;
        };
        let Some(key) = ns.strip(&kv.key) else {
            return false;
        };
        kv.key = key.to_vec();
        if let Some(prev) = e.prev_kv.as_mut() {
            match ns.strip(&prev.key) {
                Some(key) => prev.key = key.to_vec(),
                None => e.prev_kv = None,
            }
        }
        true
    });
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_client::proto::{PbEvent, PbKeyValue};

    fn create(key: &[u8], range_end: &[u8]) -> PbWatchRequest {
        WatchOptions::new()
            .with_key(key.to_vec())
            .with_range(range_end.to_vec())
            .into()
    }

    fn created_range(ask: Ask) -> (Vec<u8>, Vec<u8>) {
        let Ask::Create(create) = ask else {
            panic!("not a create");
        };
        let request: PbWatchRequest = create.options(0).into();
        match request.request_union {
            Some(PbWatchRequestUnion::CreateRequest(c)) => (c.key, c.range_end),
            _ => panic!("not a create"),
        }
    }

    #[test]
    fn every_watched_range_stays_inside_the_namespace() {
        let ns = Namespace::new(b"/ns/".to_vec());
        for (key, end, want_key, want_end) in [
            (
                b"a".as_slice(),
                b"".as_slice(),
                b"/ns/a".as_slice(),
                b"".as_slice(),
            ),
            (b"a", b"b", b"/ns/a", b"/ns/b"),
            (b"a", b"\0", b"/ns/a", b"/ns0"),
            (b"", b"\0", b"/ns/\0", b"/ns0"),
            (b"\0", b"\xff\xff", b"/ns/\0", b"/ns/\xff\xff"),
            (b"", b"", b"/ns/\0", b""),
        ] {
            let got = created_range(confine(&ns, create(key, end)));
            assert_eq!(
                got,
                (want_key.to_vec(), want_end.to_vec()),
                "{key:?} {end:?}"
            );
        }
    }

    #[test]
    fn events_come_back_out_or_not_at_all() {
        let ns = Namespace::new(b"/ns/".to_vec());
        let kv = |k: &[u8]| PbKeyValue {
            key: k.to_vec(),
            ..Default::default()
        };
        let answer = PbWatchResponse {
            events: vec![
                PbEvent {
                    kv: Some(kv(b"/ns/a")),
                    prev_kv: Some(kv(b"/ns/a")),
                    ..Default::default()
                },
                PbEvent {
                    kv: Some(kv(b"/other/b")),
                    ..Default::default()
                },
                PbEvent::default(),
            ],
            ..Default::default()
        };
        let out = strip(&ns, answer);
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].kv.as_ref().unwrap().key, b"a");
        assert_eq!(out.events[0].prev_kv.as_ref().unwrap().key, b"a");
    }
}
