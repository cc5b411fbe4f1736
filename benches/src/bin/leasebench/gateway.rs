//! A JSON gateway of etcd's API over HTTP/1.1 — etcd's own (`/v3/…` on its client port) or
//! lease-proxy's `/v3` — doing what an application without lease-proxy would do over HTTP:
//! `POST /v3/lease/grant` then a create-if-absent `POST /v3/kv/txn` to acquire (the lease revoked
//! when the key exists), `POST /v3/lease/keepalive` to renew, a linearizable `POST /v3/kv/range`
//! to read, a delete-if-same-revision `POST /v3/kv/txn` then `POST /v3/lease/revoke` to release;
//! and, for `lock`, etcd's lock service under a lease (`/v3/lock/lock`, `/v3/lock/unlock`).
//!
//! Numbers of etcd's int64 fields come as JSON strings (grpc-gateway's encoding); both forms are
//! read. Keys and values are base64, as the gateway wants them.

use anyhow::{bail, Context};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::sessions::SessionBackend;

/// A JSON gateway at a base URL; keys get `prefix`.
pub(crate) struct Gateway {
    http: reqwest::Client,
    base: String,
    prefix: String,
}

/// A lease held through a gateway: the key, its lease and the revision that created it.
pub(crate) struct GatewayHeld {
    key: String,
    lease: i64,
    revision: i64,
}

impl Gateway {
    /// A client of the gateway at `base` (a pool of HTTP/1.1 connections); keys get `prefix`.
    pub(crate) fn new(base: &str, prefix: &str) -> Self {
        Self {
            http: crate::http::pooled(),
            base: base.trim_end_matches('/').to_owned(),
            prefix: prefix.to_owned(),
        }
    }

    /// `POST {base}/v3/{method}` with `body`; the answer's JSON, an error unless 200.
    async fn call(&self, method: &str, body: Value) -> anyhow::Result<Value> {
        let resp = self
            .http
            .post(format!("{}/v3/{method}", self.base))
            .json(&body)
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("/v3/{method} answered {status}: {text}");
        }
        serde_json::from_str(&text).with_context(|| format!("/v3/{method} answered {text}"))
    }

    /// A lease of `ttl` seconds.
    async fn grant(&self, ttl: u64) -> anyhow::Result<i64> {
        let grant = self
            .call("lease/grant", json!({"TTL": ttl.to_string()}))
            .await?;
        match int(&grant["ID"])? {
            0 => bail!("lease/grant gave no lease: {grant}"),
            lease => Ok(lease),
        }
    }

    /// Renews `lease`; an error when it is gone.
    async fn keep(&self, lease: i64) -> anyhow::Result<()> {
        let answer = self
            .call("lease/keepalive", json!({"ID": lease.to_string()}))
            .await?;
        if int(&answer["result"]["TTL"])? <= 0 {
            bail!("lease {lease} lost: {answer}");
        }
        Ok(())
    }

    async fn revoke(&self, lease: i64) -> anyhow::Result<()> {
        self.call("lease/revoke", json!({"ID": lease.to_string()}))
            .await?;
        Ok(())
    }
}

/// An int64 field of a gateway answer: a JSON string or number; absent reads as 0 (proto3
/// leaves zero values out).
fn int(v: &Value) -> anyhow::Result<i64> {
    match v {
        Value::Null => Ok(0),
        Value::String(s) => s.parse().with_context(|| format!("not an integer: {s}")),
        Value::Number(n) => n.as_i64().context("not an int64"),
        other => bail!("not an integer: {other}"),
    }
}

impl Backend for Gateway {
    type Held = GatewayHeld;

    async fn acquire(&self, resource: String, ttl: u64) -> anyhow::Result<Option<GatewayHeld>> {
        let lease = self.grant(ttl).await?;
        let key = format!("{}{resource}", self.prefix);
        let k = B64.encode(&key);
        let txn = self
            .call(
                "kv/txn",
                json!({
                    "compare": [{"key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                    "success": [{"request_put": {"key": k, "value": B64.encode("leasebench"), "lease": lease.to_string()}}],
                }),
            )
            .await?;
        if txn["succeeded"].as_bool() != Some(true) {
            self.revoke(lease).await?;
            return Ok(None);
        }
        Ok(Some(GatewayHeld {
            key,
            lease,
            revision: int(&txn["header"]["revision"])?,
        }))
    }

    async fn renew(&self, held: &GatewayHeld) -> anyhow::Result<()> {
        self.keep(held.lease).await
    }

    async fn read(&self, held: &GatewayHeld) -> anyhow::Result<()> {
        let answer = self
            .call("kv/range", json!({"key": B64.encode(&held.key)}))
            .await?;
        if int(&answer["count"])? != 1 {
            bail!("{} is not held: {answer}", held.key);
        }
        Ok(())
    }

    async fn release(&self, held: &GatewayHeld) -> anyhow::Result<()> {
        let k = B64.encode(&held.key);
        self.call(
            "kv/txn",
            json!({
                "compare": [{"key": k, "target": "MOD", "result": "EQUAL", "mod_revision": held.revision.to_string()}],
                "success": [{"request_delete_range": {"key": k}}],
            }),
        )
        .await?;
        self.revoke(held.lease).await
    }
}

/// A lock held through a gateway's lock service: the key it made.
pub(crate) struct GatewayLock {
    key: String,
}

/// Sessions as an application over a JSON gateway keeps them: a lease, kept alive; a lock
/// taken under it with `/v3/lock/lock` (which waits while another holds the name) and given
/// back with `/v3/lock/unlock`.
impl SessionBackend for Gateway {
    type Session = i64;
    type Grant = GatewayLock;

    async fn open(&self, ttl: u64) -> anyhow::Result<i64> {
        self.grant(ttl).await
    }

    async fn acquire_in(&self, lease: &i64, resource: &str) -> anyhow::Result<Option<GatewayLock>> {
        let name = B64.encode(format!("{}{resource}", self.prefix));
        let locked = self
            .call(
                "lock/lock",
                json!({"name": name, "lease": lease.to_string()}),
            )
            .await?;
        let key = locked["key"]
            .as_str()
            .with_context(|| format!("lock/lock answered no key: {locked}"))?;
        Ok(Some(GatewayLock {
            key: key.to_owned(),
        }))
    }

    async fn renew_in(&self, lease: &i64, _: &GatewayLock) -> anyhow::Result<()> {
        self.keep(*lease).await
    }

    async fn release_in(&self, lock: &GatewayLock) -> anyhow::Result<()> {
        self.call("lock/unlock", json!({"key": lock.key})).await?;
        Ok(())
    }

    async fn keepalive(&self, lease: &i64) -> anyhow::Result<()> {
        self.keep(*lease).await
    }

    async fn close(&self, lease: &i64) -> anyhow::Result<()> {
        self.revoke(*lease).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int64_fields_are_read_as_strings_numbers_or_absent() {
        assert_eq!(int(&json!("7587")).unwrap(), 7587);
        assert_eq!(int(&json!(-1)).unwrap(), -1);
        assert_eq!(int(&Value::Null).unwrap(), 0);
        assert!(int(&json!("x")).is_err());
        assert!(int(&json!([1])).is_err());
    }
}
