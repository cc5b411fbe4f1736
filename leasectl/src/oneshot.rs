//! The one-shot subcommands: one API call each, its answer printed as JSON on stdout.

use std::io::Write;
use std::time::Duration;

use lease_proxy_client::{AcquireOptions, Client, Grant, Holding, Renewal};
use serde_json::{json, Value};

use crate::cli::{default_holder, EXIT_FREE};
use crate::error::Error;

/// `leasectl acquire`: one grant, not renewed.
pub(crate) async fn acquire(
    client: &Client,
    resource: &str,
    ttl: u64,
    holder: Option<String>,
    wait: Option<Duration>,
    idempotency_key: Option<String>,
) -> Result<u8, Error> {
    let mut opts = AcquireOptions::new(
        holder.unwrap_or_else(default_holder),
        Duration::from_secs(ttl),
    );
    if let Some(wait) = wait {
        opts = opts.wait(wait);
    }
    if let Some(key) = idempotency_key {
        opts = opts.idempotency_key(key);
    }
    let grant = client.grant(resource, &opts).await?;
    print_line(&grant_json(&grant))?;
    Ok(0)
}

/// `leasectl renew`.
pub(crate) async fn renew(client: &Client, resource: &str, secret: &str) -> Result<u8, Error> {
    let renewal = client.renew(resource, secret).await?;
    print_line(&renewal_json(&renewal))?;
    Ok(0)
}

/// `leasectl release`.
pub(crate) async fn release(client: &Client, resource: &str, secret: &str) -> Result<u8, Error> {
    client.release(resource, secret).await?;
    Ok(0)
}

/// `leasectl get`: the holding, or exit 1 when the resource is free.
pub(crate) async fn get(client: &Client, resource: &str) -> Result<u8, Error> {
    match client.get(resource).await? {
        Some(holding) => {
            print_line(&holding_json(&holding))?;
            Ok(0)
        }
        None => {
            eprintln!("leasectl: {resource} is free");
            Ok(EXIT_FREE)
        }
    }
}

/// `leasectl list`: one JSON line per held resource.
pub(crate) async fn list(client: &Client, prefix: &str) -> Result<u8, Error> {
    for holding in client.list(prefix).await? {
        print_line(&holding_json(&holding))?;
    }
    Ok(0)
}

/// Writes `value` as one line on stdout.
pub(crate) fn print_line(value: &Value) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}")
        .and_then(|()| out.flush())
        .map_err(Error::Output)
}

/// A grant as the API answers it (numbers the API writes as strings stay strings).
fn grant_json(g: &Grant) -> Value {
    let mut v = json!({
        "resource": g.resource,
        "holder": g.holder,
        "lease_id": g.lease_id,
        "secret": g.secret,
        "token": g.token.to_string(),
        "fencing_token": g.fencing_token,
        "ttl_seconds": g.ttl_seconds,
        "expires_in_ms": g.expires_in_ms,
    });
    with_optional(&mut v, "session", g.session.as_ref().map(|s| json!(s)));
    with_optional(&mut v, "metadata", g.metadata.clone());
    v
}

/// A renewal as the API answers it.
fn renewal_json(r: &Renewal) -> Value {
    json!({
        "ttl_seconds": r.ttl_seconds,
        "expires_in_ms": r.expires_in_ms,
        "token": r.token.to_string(),
    })
}

/// A holding as the API answers it.
fn holding_json(h: &Holding) -> Value {
    let mut v = json!({
        "resource": h.resource,
        "holder": h.holder,
        "token": h.token.to_string(),
        "lease_id": h.lease_id,
        "ttl_seconds": h.ttl_seconds,
        "expires_in_ms": h.expires_in_ms,
        "acquired_at": h.acquired_at,
    });
    with_optional(&mut v, "session", h.session.as_ref().map(|s| json!(s)));
    with_optional(&mut v, "metadata", h.metadata.clone());
    v
}

fn with_optional(object: &mut Value, key: &str, value: Option<Value>) {
    if let (Some(map), Some(value)) = (object.as_object_mut(), value) {
        map.insert(key.to_owned(), value);
    }
}
