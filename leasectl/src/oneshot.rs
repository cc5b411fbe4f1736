//! The one-shot subcommands: one API call each, its answer printed as JSON on stdout.

use std::io::Write;
use std::time::Duration;

use lease_proxy_client::{AcquireOptions, Client};
use serde::Serialize;

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
    print_line(&grant)?;
    Ok(0)
}

/// `leasectl renew`.
pub(crate) async fn renew(client: &Client, resource: &str, secret: &str) -> Result<u8, Error> {
    let renewal = client.renew(resource, secret).await?;
    print_line(&renewal)?;
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
            print_line(&holding)?;
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
        print_line(&holding)?;
    }
    Ok(0)
}

/// Writes `value` as one line of JSON on stdout (the SDK's types serialize as the API answers
/// them: numbers the API writes as strings stay strings, absent optional fields are left out).
pub(crate) fn print_line(value: &impl Serialize) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)
        .map_err(std::io::Error::from)
        .and_then(|()| writeln!(out))
        .and_then(|()| out.flush())
        .map_err(Error::Output)
}

#[cfg(test)]
mod tests {
    use lease_proxy_client::{Grant, Holding, Renewal};

    fn grant(session: Option<&str>, metadata: Option<serde_json::Value>) -> Grant {
        Grant {
            resource: "aisle-1".into(),
            holder: "robot-3".into(),
            lease_id: "7587".into(),
            secret: "s3cr3t".into(),
            token: 1200,
            fencing_token: "v1.k1.x".into(),
            ttl_seconds: 10,
            expires_in_ms: 9990,
            session: session.map(Into::into),
            metadata,
        }
    }

    fn holding(session: Option<&str>, metadata: Option<serde_json::Value>) -> Holding {
        Holding {
            resource: "aisle-1".into(),
            holder: "robot-3".into(),
            token: 1200,
            lease_id: "7587".into(),
            ttl_seconds: 10,
            expires_in_ms: 8000,
            acquired_at: 1_700_000_000_000,
            session: session.map(Into::into),
            metadata,
        }
    }

    #[test]
    fn answers_print_as_the_api_writes_them() {
        // What `print_line` writes, without the newline.
        fn line(value: &impl serde::Serialize) -> String {
            serde_json::to_string(value).unwrap()
        }
        assert_eq!(
            line(&grant(None, None)),
            r#"{"resource":"aisle-1","holder":"robot-3","lease_id":"7587","secret":"s3cr3t","token":"1200","fencing_token":"v1.k1.x","ttl_seconds":10,"expires_in_ms":9990}"#
        );
        assert_eq!(
            line(&grant(
                Some("75"),
                Some(serde_json::json!({"b": 1, "a": [true]}))
            )),
            r#"{"resource":"aisle-1","holder":"robot-3","lease_id":"7587","secret":"s3cr3t","token":"1200","fencing_token":"v1.k1.x","ttl_seconds":10,"expires_in_ms":9990,"session":"75","metadata":{"b":1,"a":[true]}}"#
        );
        assert_eq!(
            line(&Renewal {
                ttl_seconds: 10,
                expires_in_ms: 9990,
                token: 1200
            }),
            r#"{"ttl_seconds":10,"expires_in_ms":9990,"token":"1200"}"#
        );
        assert_eq!(
            line(&holding(None, None)),
            r#"{"resource":"aisle-1","holder":"robot-3","token":"1200","lease_id":"7587","ttl_seconds":10,"expires_in_ms":8000,"acquired_at":1700000000000}"#
        );
        assert_eq!(
            line(&holding(Some("75"), Some(serde_json::json!({"k": "v"})))),
            r#"{"resource":"aisle-1","holder":"robot-3","token":"1200","lease_id":"7587","ttl_seconds":10,"expires_in_ms":8000,"acquired_at":1700000000000,"session":"75","metadata":{"k":"v"}}"#
        );
    }
}
