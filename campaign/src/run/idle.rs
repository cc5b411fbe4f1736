//! The idle replica's turn: after serving nothing for [`IDLE`](crate::cluster::IDLE), one
//! holder acquires, writes, renews and releases through it.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::history::{Event, History, Kind, Outcome};

/// What happened when the idle replica was first used.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdleProbe {
    /// How long it had served nothing, in seconds.
    pub idle_s: f64,
    /// Time to its first successful acquire, in milliseconds (retrying for up to 5 s).
    pub first_acquire_ms: Option<f64>,
    /// Operations through it after the idle stretch: acquire, writes, renew, release.
    pub operations: usize,
    /// Of which succeeded.
    pub succeeded: usize,
}

/// The client that uses the idle replica, and its resource (no other client competes for it).
const IDLE_CLIENT: &str = "idle";

/// After the idle stretch: acquire (retrying for up to 5 s), three writes forwarded through it,
/// a renewal and a release, all through the replica that served nothing for
/// [`IDLE`](crate::cluster::IDLE), recorded in the history like any client's.
pub(super) async fn idle_probe(
    url: &str,
    history: &History,
    ops: &AtomicU64,
    idle_since: Instant,
) -> IdleProbe {
    let idle_s = idle_since.elapsed().as_secs_f64();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap_or_default();
    let resource = "idle-0";
    let mut operations = 0;
    let mut succeeded = 0;
    let op = || ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let record =
        |kind: Kind, revision: Option<u64>, op: u64, invoked: Instant, status: Option<u16>| {
            let outcome = crate::history::outcome(status);
            history.record(Event {
                client: IDLE_CLIENT.to_owned(),
                kind,
                resource: resource.to_owned(),
                revision,
                op,
                invoked,
                completed: Instant::now(),
                outcome,
            });
            outcome == Outcome::Ok
        };
    let start = Instant::now();
    let mut grant = None;
    while grant.is_none() && start.elapsed() < Duration::from_secs(5) {
        let invoked = Instant::now();
        let answer = http
            .post(format!("{url}/v1/leases/{resource}"))
            .json(&serde_json::json!({"holder": IDLE_CLIENT, "ttl_seconds": 10}))
            .send()
            .await;
        let (status, body) = crate::history::answer(answer).await;
        let revision = body
            .as_ref()
            .and_then(|b| b["token"].as_str())
            .and_then(|t| t.parse::<u64>().ok());
        if record(Kind::Acquire, revision, op(), invoked, status) {
            grant = body
                .and_then(|b| b["secret"].as_str().map(str::to_owned))
                .zip(revision);
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let first_acquire_ms = grant.as_ref().map(|_| start.elapsed().as_secs_f64() * 1e3);
    if let Some((secret, revision)) = grant {
        operations += 1;
        succeeded += 1;
        for _ in 0..3 {
            let op = op();
            let invoked = Instant::now();
            let status = http
                .put(format!(
                    "{url}/v1/leases/{resource}/forward/items/{resource}"
                ))
                .header("lease-secret", &secret)
                .json(&serde_json::json!({"client": IDLE_CLIENT, "op": op}))
                .send()
                .await
                .ok()
                .map(|r| r.status().as_u16());
            operations += 1;
            succeeded += usize::from(record(
                Kind::WriteViaProxy,
                Some(revision),
                op,
                invoked,
                status,
            ));
        }
        for (kind, req) in [
            (
                Kind::Renew,
                http.post(format!("{url}/v1/leases/{resource}/renew")),
            ),
            (
                Kind::Release,
                http.delete(format!("{url}/v1/leases/{resource}")),
            ),
        ] {
            let invoked = Instant::now();
            let status = req
                .header("lease-secret", &secret)
                .send()
                .await
                .ok()
                .map(|r| r.status().as_u16());
            operations += 1;
            succeeded += usize::from(record(kind, Some(revision), op(), invoked, status));
        }
    } else {
        operations += 1;
    }
    IdleProbe {
        idle_s,
        first_acquire_ms,
        operations,
        succeeded,
    }
}
