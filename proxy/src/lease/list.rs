//! The list (`GET /v1/leases`): held resources in name order, a page at a time, read only from
//! the prefixes the caller may read.
//!
//! A listing is one range read per prefix of [`list_prefixes`] (the asked prefix intersected
//! with each of the caller's read prefixes, disjoint, in key order) until the page is full.
//! Nothing outside those prefixes is read, so nothing outside them is shown or named by a
//! cursor: `next_cursor` is the last resource of the page. A cursor is a position, not a
//! permission — whatever it names, the reads stay inside the caller's prefixes and only move
//! where they start — so it is checked against the resource grammar only, and a cursor taken
//! before the caller's permissions changed stays usable.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::Serialize;

use super::types::holding;
use super::{validate, HolderRecord, Holding, Leases};
use crate::etcd::{prefix_end, RangePage};
use crate::{Error, Result};

/// One page of a listing.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct Page {
    /// Held resources in name order.
    pub(crate) leases: Vec<Holding>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) next_cursor: Option<String>,
}

/// The resource-name prefixes a listing of `asked` reads for a caller who may read under each
/// of `readable` (`""`: everything): their intersections with `asked`, none inside another, in
/// key order. Empty when the caller may read nothing under `asked`.
pub(crate) fn list_prefixes(asked: &str, readable: &[&str]) -> Vec<String> {
    // Two prefixes intersect only if one starts with the other; the longer one is then the
    // intersection.
    let mut prefixes: Vec<&str> = readable
        .iter()
        .filter_map(|p| {
            if p.starts_with(asked) {
                Some(*p)
            } else if asked.starts_with(p) {
                Some(asked)
            } else {
                None
            }
        })
        .collect();
    prefixes.sort_unstable();
    // Sorted, the names a prefix covers follow it without a gap, so a prefix covered by an
    // earlier one comes right after it (or after others it covers too).
    let mut disjoint: Vec<String> = Vec::with_capacity(prefixes.len());
    for p in prefixes {
        if !disjoint
            .last()
            .is_some_and(|kept| p.starts_with(kept.as_str()))
        {
            disjoint.push(p.to_owned());
        }
    }
    disjoint
}

impl Leases {
    /// Held resources under `prefixes` (from [`list_prefixes`]), in name order, `limit` per
    /// page, after `cursor` (a `next_cursor` of an earlier page).
    pub(crate) async fn list(
        &self,
        prefixes: &[String],
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<Page> {
        let after = cursor
            .map(|c| {
                decode_cursor(c).map(|name| {
                    let mut from = self.key(&name).into_bytes();
                    from.push(0);
                    from
                })
            })
            .transpose()?;
        let holders_prefix = self.layout.holders().as_bytes();
        let mut leases = Vec::new();
        let mut more = false;
        for (n, prefix) in prefixes.iter().enumerate() {
            let base = self.key(prefix).into_bytes();
            let end = prefix_end(&base);
            let start = match &after {
                Some(from) => base.max(from.clone()),
                None => base,
            };
            if start >= end {
                continue; // wholly before the cursor
            }
            let wanted = i64::try_from(limit - leases.len()).unwrap_or(i64::MAX);
            let RangePage {
                kvs,
                more: more_here,
                ..
            } = self.etcd.range(&start, &end, wanted).await?;
            // One range read per prefix, no look-up per lease (a page of 1,000 made 1,000 TTL
            // look-ups): every key read is held, since etcd deletes a lease's keys in the same
            // step that ends the lease. The remaining lifetime is reported from the record as
            // the grant's TTL, the most the lease can have left; `get` asks etcd for the exact
            // value.
            for kv in &kvs {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let resource = kv
                    .key()
                    .strip_prefix(holders_prefix)
                    .map(|r| String::from_utf8_lossy(r).into_owned())
                    .unwrap_or_default();
                let record = HolderRecord::decode(&key, kv.value())?;
                let most = i64::try_from(record.ttl_seconds).unwrap_or(i64::MAX);
                leases.push(holding(resource, record, kv.create_revision(), most));
            }
            if leases.len() >= limit {
                // A later prefix may hold more: the next page says (it may be empty).
                more = more_here || n + 1 < prefixes.len();
                break;
            }
        }
        let next_cursor = more
            .then(|| leases.last())
            .flatten()
            .map(|h| URL_SAFE_NO_PAD.encode(&h.resource));
        Ok(Page {
            leases,
            next_cursor,
        })
    }
}

fn decode_cursor(cursor: &str) -> Result<String> {
    let bad = || Error::InvalidField {
        field: "cursor",
        reason: "not a cursor returned by this API".to_owned(),
    };
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    let name = String::from_utf8(bytes).map_err(|_| bad())?;
    validate::resource(&name).map_err(|_| bad())?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_name_a_resource_or_are_refused() {
        let cursor = URL_SAFE_NO_PAD.encode("aisle-7");
        assert_eq!(decode_cursor(&cursor).unwrap(), "aisle-7");
        let bad = [
            String::new(),
            "!!".into(),
            URL_SAFE_NO_PAD.encode([0xff]),
            URL_SAFE_NO_PAD.encode("a/b"),
        ];
        for bad in bad {
            assert!(
                matches!(
                    decode_cursor(&bad),
                    Err(Error::InvalidField {
                        field: "cursor",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_listing_reads_only_where_the_asked_and_the_readable_prefixes_meet() {
        let cases: [(&str, &[&str], &[&str]); 10] = [
            // Without authentication, or with `read:*`: the asked prefix.
            ("", &[""], &[""]),
            ("aisle-", &[""], &["aisle-"]),
            // One readable prefix: the longer of the two, or nothing.
            ("", &["a-"], &["a-"]),
            ("a", &["a-"], &["a-"]),
            ("a-2", &["a-"], &["a-2"]),
            ("ab-", &["a-"], &[]),
            // Several: disjoint, in key order, duplicates and covered ones dropped.
            ("", &["d-", "b-", "d-", "b-x"], &["b-", "d-"]),
            ("", &["b-", "", "d-"], &[""]),
            ("b", &["d-", "b-", "ba"], &["b-", "ba"]),
            ("c", &["d-", "b-"], &[]),
        ];
        for (asked, readable, want) in cases {
            assert_eq!(
                list_prefixes(asked, readable),
                want.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
                "{asked:?} under {readable:?}"
            );
        }
    }
}
