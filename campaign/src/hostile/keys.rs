//! The keys: sentinels planted before a run, and the final read of etcd that judges what the
//! traffic left behind.

use std::collections::HashSet;

use anyhow::Context;
use etcd_client::{Client, GetOptions};
use lease_proxy_testkit::v3_hostile::{sentinels, MARKERS, NAMESPACE};
use serde::{Deserialize, Serialize};

use super::{HOLDERS, PREFIX};

/// One sentinel key as planted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sentinel {
    /// The key (outside the `/v3` namespace).
    pub key: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
    /// Its create revision after planting.
    pub create_revision: i64,
    /// Its mod revision after planting.
    pub mod_revision: i64,
}

/// The sentinels a run planted; [`verify`] checks them afterwards.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sentinels {
    /// Every sentinel key, in planting order.
    pub keys: Vec<Sentinel>,
}

impl Sentinels {
    /// Whether `key` is one of the sentinels.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.keys.iter().any(|s| s.key == key)
    }
}

/// Puts the generator's sentinel keys (planted and hidden, all outside the namespace) directly
/// into etcd and records their revisions.
pub async fn plant(client: &mut Client) -> anyhow::Result<Sentinels> {
    let mut keys = Vec::new();
    for (key, value) in sentinels() {
        client
            .put(key.clone(), value.clone(), None)
            .await
            .with_context(|| format!("planting {:?}", String::from_utf8_lossy(&key)))?;
        let got = client.get(key.clone(), None).await?;
        let kv = got
            .kvs()
            .first()
            .with_context(|| format!("{:?} gone after planting", String::from_utf8_lossy(&key)))?;
        keys.push(Sentinel {
            key,
            value,
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
        });
    }
    Ok(Sentinels { keys })
}

/// Whether `name` is a valid `/v1` resource name (the proxy's grammar: 1–200 bytes of
/// `[A-Za-z0-9._:-]`, starting with a letter or digit, no `..`).
fn resource(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name[0].is_ascii_alphanumeric()
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
        && !name.windows(2).any(|w| w == b"..")
}

fn lower_hex(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Why `key` (attached to `lease`) must not exist, if it must not: it lies outside both the
/// `/v3` namespace and the proxies' own layout under [`PREFIX`] (docs/DESIGN.md §2):
/// `holders/{resource}`, `idempotency/{resource}`, `waiters/{resource}/{hex}-{hex}`, the
/// sessions `sessions/{id}` (on lease `id`), the `/v3` lease markers `v3/leases/{id}`, each on
/// its own lease, the release markers of the event stream, `ended/released/{id}` and
/// `ended/closed/{id}` (on lease `id`), the fleets' records (see [`fleet_key`]), a fleet's
/// index of its grants `fleet-grants/{fleet}/{resource}` (on the member's session) and its
/// end's key `fleet-ending/{fleet}` (on no lease). Sentinels are not judged here.
pub fn foreign_key(key: &[u8], lease: i64) -> Option<String> {
    let shown = || format!("{:?}", String::from_utf8_lossy(key));
    if key.starts_with(NAMESPACE) {
        return None;
    }
    let Some(own) = key.strip_prefix(PREFIX) else {
        return Some(format!("{} was created outside the namespace", shown()));
    };
    let ok = if let Some(r) = own.strip_prefix(b"holders/".as_slice()) {
        resource(r)
    } else if let Some(r) = own.strip_prefix(b"idempotency/".as_slice()) {
        resource(r)
    } else if let Some(rest) = own.strip_prefix(b"waiters/".as_slice()) {
        // {resource}/{queue lease:x}-{random:x}
        match rest.iter().rposition(|b| *b == b'/') {
            Some(at) => {
                let (r, entry) = (&rest[..at], &rest[at + 1..]);
                let mut parts = entry.splitn(2, |b| *b == b'-');
                resource(r)
                    && parts.next().is_some_and(lower_hex)
                    && parts.next().is_some_and(lower_hex)
            }
            None => false,
        }
    } else if let Some(id) = own
        .strip_prefix(b"ended/released/".as_slice())
        .or_else(|| own.strip_prefix(b"ended/closed/".as_slice()))
    {
        // `{lease}`, or for a release of a fleet's grant `{lease}/{resource}`.
        let released = own.starts_with(b"ended/released/");
        let (id, r) = match id.iter().position(|b| *b == b'/') {
            Some(at) if released => (&id[..at], Some(&id[at + 1..])),
            _ => (id, None),
        };
        if r.is_some_and(|r| !resource(r)) {
            return Some(format!("{} names no resource", shown()));
        }
        let id = std::str::from_utf8(id)
            .ok()
            .and_then(|s| s.parse::<i64>().ok());
        if id.is_some_and(|id| id != lease) {
            return Some(format!(
                "{} is a release marker of another lease than {lease}",
                shown()
            ));
        }
        id.is_some()
    } else if let Some(rest) = own.strip_prefix(b"fleets/".as_slice()) {
        fleet_key(rest, lease)
    } else if let Some(rest) = own.strip_prefix(b"fleet-grants/".as_slice()) {
        // {fleet}/{resource}, on the member's session.
        let mut parts = rest.splitn(2, |b| *b == b'/');
        let (fleet, r) = (parts.next(), parts.next());
        fleet.is_some_and(resource) && r.is_some_and(resource) && lease != 0
    } else if let Some(fleet) = own.strip_prefix(b"fleet-ending/".as_slice()) {
        resource(fleet) && lease == 0
    } else if let Some(id) = own.strip_prefix(b"sessions/".as_slice()) {
        let id = std::str::from_utf8(id)
            .ok()
            .and_then(|s| s.parse::<i64>().ok());
        if id.is_some_and(|id| id != lease) {
            return Some(format!(
                "{} is a session key attached to lease {lease}, not its own",
                shown()
            ));
        }
        id.is_some()
    } else if let Some(id) = own.strip_prefix(b"v3/leases/".as_slice()) {
        let id = std::str::from_utf8(id)
            .ok()
            .and_then(|s| s.parse::<i64>().ok());
        if id.is_some_and(|id| id != lease) {
            return Some(format!(
                "{} marks a lease as /v3's but is attached to lease {lease}",
                shown()
            ));
        }
        id.is_some()
    } else {
        false
    };
    (!ok).then(|| {
        format!(
            "{} lies among the proxies' own keys but is not one they write",
            shown()
        )
    })
}

/// Reads the sentinels, then every key in etcd at one revision, after a run, and returns what is
/// wrong:
///
/// - a sentinel deleted, or its value, create or mod revision changed;
/// - a key outside the namespace that is neither a sentinel nor one of the proxies' own
///   ([`foreign_key`]);
/// - a key in the namespace attached to a lease that carries no `/v3` marker (a `/v1` grant's,
///   a spare's): `/v3` may only use leases granted through `/v3`;
/// - a `/v1` holder key attached to a `/v3` lease.
///
/// An etcd that cannot be read is reported too (the check did not happen).
pub async fn verify(client: &mut Client, sentinels: &Sentinels) -> Vec<String> {
    let mut problems = Vec::new();
    let shown = |k: &[u8]| format!("{:?}", String::from_utf8_lossy(k));
    for s in &sentinels.keys {
        match client.get(s.key.clone(), None).await {
            Ok(resp) => match resp.kvs().first() {
                None => problems.push(format!("sentinel {} was deleted", shown(&s.key))),
                Some(kv) => {
                    if kv.value() != s.value.as_slice()
                        || kv.mod_revision() != s.mod_revision
                        || kv.create_revision() != s.create_revision
                    {
                        problems.push(format!(
                            "sentinel {} changed: value {} (was {}), revisions {}/{} (were {}/{})",
                            shown(&s.key),
                            shown(kv.value()),
                            shown(&s.value),
                            kv.create_revision(),
                            kv.mod_revision(),
                            s.create_revision,
                            s.mod_revision
                        ));
                    }
                }
            },
            Err(e) => problems.push(format!("sentinel {} not readable: {e}", shown(&s.key))),
        }
    }
    let keys = match all_keys(client).await {
        Ok(keys) => keys,
        Err(e) => {
            problems.push(format!("etcd not readable for the final check: {e:#}"));
            return problems;
        }
    };
    let marked: HashSet<i64> = keys
        .iter()
        .filter_map(|(k, _)| std::str::from_utf8(k.strip_prefix(MARKERS)?).ok())
        .filter_map(|id| id.parse().ok())
        .collect();
    for (key, lease) in &keys {
        if sentinels.contains(key) {
            continue;
        }
        if let Some(problem) = foreign_key(key, *lease) {
            problems.push(problem);
        }
        if key.starts_with(NAMESPACE) && *lease != 0 && !marked.contains(lease) {
            problems.push(format!(
                "{} in the namespace is attached to lease {lease}, which is not a /v3 lease",
                shown(key)
            ));
        }
        if key.starts_with(HOLDERS) && marked.contains(lease) {
            problems.push(format!(
                "{} is attached to lease {lease}, a /v3 lease",
                shown(key)
            ));
        }
    }
    problems
}

/// Every key (with its lease) at one revision, in pages.
async fn all_keys(client: &mut Client) -> anyhow::Result<Vec<(Vec<u8>, i64)>> {
    let mut out = Vec::new();
    let mut from = vec![0u8];
    let mut revision = 0;
    loop {
        let mut options = GetOptions::new()
            .with_from_key()
            .with_keys_only()
            .with_limit(1000);
        if revision != 0 {
            options = options.with_revision(revision);
        }
        let resp = client.get(from.clone(), Some(options)).await?;
        if revision == 0 {
            revision = resp.header().map_or(0, |h| h.revision());
        }
        out.extend(resp.kvs().iter().map(|kv| (kv.key().to_vec(), kv.lease())));
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(out),
        }
    }
}

/// A fleet's record under `fleets/`: `{fleet}/spec` and `{fleet}/assignment` (on no lease),
/// `{fleet}/members/{member}` (on the member's session), fleet and member in the resource
/// grammar.
fn fleet_key(rest: &[u8], lease: i64) -> bool {
    let Some(at) = rest.iter().position(|b| *b == b'/') else {
        return false;
    };
    let (fleet, record) = (&rest[..at], &rest[at + 1..]);
    resource(fleet)
        && match record {
            b"spec" | b"assignment" => lease == 0,
            _ => record
                .strip_prefix(b"members/".as_slice())
                .is_some_and(|m| resource(m) && lease != 0),
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxys_own_layout_is_recognised() {
        for (key, lease) in [
            (b"/lease-proxy/v3/kv/anything\0\xff".as_slice(), 5),
            (b"/lease-proxy/holders/shard-3", 9),
            (b"/lease-proxy/idempotency/shard-3", 9),
            (b"/lease-proxy/waiters/shard-3/694d9a-1f2e3d", 9),
            (b"/lease-proxy/v3/leases/1234", 1234),
            (b"/lease-proxy/sessions/1234", 1234),
            (b"/lease-proxy/ended/released/9", 9),
            (b"/lease-proxy/ended/closed/1234", 1234),
            (b"/lease-proxy/ended/released/9/aisle-1", 9),
            (b"/lease-proxy/fleets/aisles/spec", 0),
            (b"/lease-proxy/fleets/aisles/assignment", 0),
            (b"/lease-proxy/fleet-grants/aisles/aisle-1", 77),
            (b"/lease-proxy/fleet-ending/aisles", 0),
            (b"/lease-proxy/fleets/aisles/members/robot-1", 1234),
        ] {
            assert_eq!(foreign_key(key, lease), None, "{key:?}");
        }
        for (key, lease) in [
            (b"/outside/new".as_slice(), 0),
            (b"/lease-proxy/v3/kv", 0),
            (b"/lease-proxy/holders/../x", 0),
            (b"/lease-proxy/holders/", 0),
            (b"/lease-proxy/waiters/shard-3/zz", 0),
            (b"/lease-proxy/v3/leases/1234", 99),
            (b"/lease-proxy/v3/leases/x", 0),
            (b"/lease-proxy/sessions/1234", 99),
            (b"/lease-proxy/sessions/x", 0),
            (b"/lease-proxy/ended/released/shard-3", 9),
            (b"/lease-proxy/ended/released/8", 9),
            (b"/lease-proxy/ended/released/8/aisle-1", 9),
            (b"/lease-proxy/ended/released/9/../x", 9),
            (b"/lease-proxy/ended/closed/9/aisle-1", 9),
            (b"/lease-proxy/ended/closed/1234", 99),
            (b"/lease-proxy/ended/other", 0),
            (b"/lease-proxy/fleets/aisles/spec", 9),
            (b"/lease-proxy/fleets/aisles/members/robot-1", 0),
            (b"/lease-proxy/fleets/aisles/other", 0),
            (b"/lease-proxy/fleets/../spec", 0),
            (b"/lease-proxy/fleets/aisles", 0),
            (b"/lease-proxy/fleet-grants/aisles/aisle-1", 0),
            (b"/lease-proxy/fleet-grants/aisles", 77),
            (b"/lease-proxy/fleet-ending/aisles", 77),
            (b"/lease-proxy/other", 0),
            (b"\0x", 0),
        ] {
            assert!(foreign_key(key, lease).is_some(), "{key:?}");
        }
    }
}
