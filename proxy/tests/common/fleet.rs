//! Fleet clients for the tests: the `/v1/fleets` calls, a member that keeps its session alive
//! and gives up what it is told to (or hangs), and readings of a fleet's state.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::task::JoinHandle;

use super::{http, send, str_field};
use lease_proxy_testkit::poll::{eventually, Probe};

/// `PUT {url}/v1/fleets/{fleet}`.
pub async fn put_fleet(url: &str, fleet: &str, body: Value) -> (u16, Value) {
    send(http().put(format!("{url}/v1/fleets/{fleet}")).json(&body)).await
}

/// `PUT` of a fleet over `resources`, which must succeed.
pub async fn make_fleet(url: &str, fleet: &str, resources: &[String], extra: Value) -> Value {
    let mut body = json!({ "resources": resources });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let (status, written) = put_fleet(url, fleet, body).await;
    assert_eq!(status, 200, "{written}");
    written
}

/// `GET {url}/v1/fleets/{fleet}`.
pub async fn fleet_view(url: &str, fleet: &str) -> (u16, Value) {
    send(http().get(format!("{url}/v1/fleets/{fleet}"))).await
}

/// `n` resource names `{prefix}-00`, `{prefix}-01`, …
pub fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:05}")).collect()
}

/// `POST {url}/v1/fleets/{fleet}/members`.
pub async fn join(url: &str, fleet: &str, member: &str, ttl: u64) -> (u16, Value) {
    send(
        http()
            .post(format!("{url}/v1/fleets/{fleet}/members"))
            .json(&json!({"member": member, "ttl_seconds": ttl})),
    )
    .await
}

/// `POST {url}/v1/fleets/{fleet}/members` with a weight, which must succeed.
pub async fn joined_weighted(
    url: &str,
    fleet: &str,
    member: &str,
    ttl: u64,
    weight: u64,
) -> Member {
    let (status, body) = send(
        http()
            .post(format!("{url}/v1/fleets/{fleet}/members"))
            .json(&json!({"member": member, "ttl_seconds": ttl, "weight": weight})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    Member {
        fleet: fleet.to_owned(),
        name: member.to_owned(),
        session: str_field(&body, "session_id"),
        secret: str_field(&body, "secret"),
        url: url.to_owned(),
    }
}

/// A joined member, as its client knows it.
#[derive(Debug, Clone)]
pub struct Member {
    pub fleet: String,
    pub name: String,
    pub session: String,
    pub secret: String,
    /// The replica it talks to.
    pub url: String,
}

/// Joins `member`, which must succeed.
pub async fn joined(url: &str, fleet: &str, member: &str, ttl: u64) -> Member {
    let (status, body) = join(url, fleet, member, ttl).await;
    assert_eq!(status, 201, "{body}");
    assert!(!body.to_string().contains("secret_hash"));
    Member {
        fleet: fleet.to_owned(),
        name: member.to_owned(),
        session: str_field(&body, "session_id"),
        secret: str_field(&body, "secret"),
        url: url.to_owned(),
    }
}

impl Member {
    fn member_url(&self) -> String {
        format!(
            "{}/v1/fleets/{}/members/{}",
            self.url, self.fleet, self.name
        )
    }

    /// Its assignment now.
    pub async fn view(&self) -> (u16, Value) {
        send(
            http()
                .get(self.member_url())
                .header("lease-secret", &self.secret),
        )
        .await
    }

    /// Its assignment once past `after`, waiting up to `wait_ms`.
    pub async fn view_after(&self, after: &str, wait_ms: u64) -> (u16, Value) {
        send(
            http()
                .get(format!(
                    "{}?after={after}&wait_ms={wait_ms}",
                    self.member_url()
                ))
                .header("lease-secret", &self.secret),
        )
        .await
    }

    /// `POST /v1/sessions/{id}/keepalive`.
    pub async fn keepalive(&self) -> u16 {
        send(
            http()
                .post(format!(
                    "{}/v1/sessions/{}/keepalive",
                    self.url, self.session
                ))
                .header("lease-secret", &self.secret),
        )
        .await
        .0
    }

    /// Leaves: closes its session.
    pub async fn leave(&self) {
        let (status, body) = send(
            http()
                .delete(format!("{}/v1/sessions/{}", self.url, self.session))
                .header("lease-secret", &self.secret),
        )
        .await;
        assert_eq!(status, 204, "{body}");
    }

    /// `DELETE /v1/leases/{resource}` with its session's secret.
    pub async fn release(&self, resource: &str) -> u16 {
        send(
            http()
                .delete(format!("{}/v1/leases/{resource}", self.url))
                .header("lease-secret", &self.secret),
        )
        .await
        .0
    }

    /// `POST …/drain`, with its own secret.
    pub async fn drain(&self) -> (u16, Value) {
        send(
            http()
                .post(format!("{}/drain", self.member_url()))
                .header("lease-secret", &self.secret),
        )
        .await
    }

    /// A task that gives up whatever it is told to, as soon as it is told (long polls), and
    /// keeps the session alive every `beat` (if any). Aborting it is the member hanging; its
    /// session then lapses (with a beat) or lives on.
    pub fn cooperate(&self, beat: Option<Duration>) -> JoinHandle<()> {
        let member = self.clone();
        tokio::spawn(async move {
            let mut after = "0".to_owned();
            let mut last_beat = tokio::time::Instant::now();
            loop {
                if let Some(beat) = beat {
                    if last_beat.elapsed() >= beat {
                        member.keepalive().await;
                        last_beat = tokio::time::Instant::now();
                    }
                }
                let wait = beat.map_or(5_000, |b| b.as_millis() as u64);
                let (status, view) = member.view_after(&after, wait).await;
                if status != 200 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                after = str_field(&view, "revision");
                for r in view["releasing"].as_array().into_iter().flatten() {
                    member.release(&str_field(r, "resource")).await;
                }
            }
        })
    }

    /// A task that only keeps the session alive, every `beat`.
    pub fn heartbeat(&self, beat: Duration) -> JoinHandle<()> {
        let member = self.clone();
        tokio::spawn(async move {
            loop {
                member.keepalive().await;
                tokio::time::sleep(beat).await;
            }
        })
    }
}

/// Resource → the member holding it (and assigned it), from a fleet view.
pub fn holders(view: &Value) -> BTreeMap<String, String> {
    let mut holders = BTreeMap::new();
    for m in view["members"].as_array().into_iter().flatten() {
        for r in m["held"].as_array().into_iter().flatten() {
            holders.insert(r.as_str().unwrap().to_owned(), str_field(m, "member"));
        }
    }
    holders
}

/// Member → how many it holds (and is assigned).
pub fn counts(view: &Value) -> BTreeMap<String, usize> {
    view["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                str_field(m, "member"),
                m["held"].as_array().map_or(0, Vec::len),
            )
        })
        .collect()
}

/// How many hand-offs a view shows under way.
pub fn releasing(view: &Value) -> usize {
    view["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["releasing"].as_array().map_or(0, Vec::len))
        .sum()
}

/// Whether every resource is held by exactly one member, nothing is being handed off, and
/// the active members' counts are `expected` (member → count).
pub fn at_rest(view: &Value, expected: &BTreeMap<&str, usize>) -> bool {
    let resources = view["resources"].as_array().map_or(0, Vec::len);
    let counts = counts(view);
    view["unassigned"].as_array().is_some_and(Vec::is_empty)
        && releasing(view) == 0
        && holders(view).len() == resources
        && expected
            .iter()
            .all(|(m, n)| counts.get(*m).copied().unwrap_or(0) == *n)
}

/// Waits (at most `within`) for the fleet to be at rest with these counts; the view then, and
/// how long it took.
pub async fn rested(
    url: &str,
    fleet: &str,
    expected: &[(&str, usize)],
    within: Duration,
) -> (Value, Duration) {
    let expected: BTreeMap<&str, usize> = expected.iter().copied().collect();
    eventually(
        within,
        &format!("fleet {fleet} at rest with {expected:?}"),
        || async {
            let (status, view) = fleet_view(url, fleet).await;
            if status == 200 && at_rest(&view, &expected) {
                Probe::Done(view)
            } else {
                Probe::Not(format!(
                    "{status}: counts {:?}, releasing {}, unassigned {}",
                    counts(&view),
                    releasing(&view),
                    view["unassigned"]
                ))
            }
        },
    )
    .await
}

/// Waits (at most `within`) until every resource is held by one member, nothing is handed
/// off, and each member's count is within one of its weight's exact share (`weights`: member →
/// weight); the view then.
pub async fn fairly_rested(
    url: &str,
    fleet: &str,
    weights: &[(&str, u64)],
    within: Duration,
) -> Value {
    let total: u64 = weights.iter().map(|(_, w)| w).sum();
    let (view, _) = eventually(within, &format!("fleet {fleet} fairly at rest"), || async {
        let (status, view) = fleet_view(url, fleet).await;
        let n = view["resources"].as_array().map_or(0, Vec::len) as f64;
        let counts = counts(&view);
        let fair = weights.iter().all(|(m, w)| {
            let exact = n * *w as f64 / total as f64;
            (counts.get(*m).copied().unwrap_or(0) as f64 - exact).abs() < 1.0
        });
        if status == 200 && fair && at_rest(&view, &BTreeMap::new()) {
            Probe::Done(view)
        } else {
            Probe::Not(format!(
                "{status}: counts {counts:?}, releasing {}",
                releasing(&view)
            ))
        }
    })
    .await;
    view
}

/// The resources whose holder differs between two readings of [`holders`].
pub fn moved(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> BTreeMap<String, (String, String)> {
    after
        .iter()
        .filter_map(|(r, m)| {
            let was = before.get(r).cloned().unwrap_or_default();
            (was != *m).then(|| (r.clone(), (was, m.clone())))
        })
        .collect()
}

/// The token of `resource`'s current grant (`GET /v1/leases/{resource}`).
pub async fn token_of(url: &str, resource: &str) -> u64 {
    let (status, body) = send(http().get(format!("{url}/v1/leases/{resource}"))).await;
    assert_eq!(status, 200, "{resource}: {body}");
    str_field(&body, "token").parse().unwrap()
}
