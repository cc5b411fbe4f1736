//! The fleet through lease-proxy: the benchmark makes the fleet, and each member joins, keeps
//! its session alive at a third of its TTL, long-polls its assignment and releases at once what
//! appears in `releasing` — a member that does its part, so that what is measured is the
//! service's decision and hand-off.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

/// A member: its session and the task that keeps it.
struct Member {
    session: String,
    secret: String,
    task: JoinHandle<()>,
}

/// A fleet on a proxy.
pub(crate) struct ProxyFleet {
    http: reqwest::Client,
    base: String,
    fleet: String,
    ttl: u64,
    members: BTreeMap<String, Member>,
}

impl Drop for ProxyFleet {
    fn drop(&mut self) {
        for m in self.members.values() {
            m.task.abort();
        }
    }
}

impl ProxyFleet {
    /// Makes fleet `fleet` of `resources` on the proxy at `base`; members join with `ttl`.
    pub(crate) async fn create(
        base: &str,
        fleet: &str,
        resources: &[String],
        ttl: u64,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .build()?;
        let resp = http
            .put(format!("{base}/v1/fleets/{fleet}"))
            .json(&json!({ "resources": resources }))
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("PUT fleet: {} {}", resp.status(), resp.text().await?);
        }
        Ok(Self {
            http,
            base: base.to_owned(),
            fleet: fleet.to_owned(),
            ttl,
            members: BTreeMap::new(),
        })
    }

    /// Joins `names` at once.
    pub(crate) async fn join(&mut self, names: &[String]) -> anyhow::Result<()> {
        let (http, url, ttl) = (
            &self.http,
            &format!("{}/v1/fleets/{}/members", self.base, self.fleet),
            self.ttl,
        );
        let joins = names.iter().map(|name| async move {
            let resp = http
                .post(url)
                .json(&json!({"member": name, "ttl_seconds": ttl}))
                .send()
                .await?;
            if resp.status().as_u16() != 201 {
                bail!("join {name}: {} {}", resp.status(), resp.text().await?);
            }
            let body: Value = resp.json().await?;
            let field = |f: &str| {
                body[f]
                    .as_str()
                    .map(str::to_owned)
                    .with_context(|| format!("join {name}: no {f} in {body}"))
            };
            Ok::<_, anyhow::Error>((name.clone(), field("session_id")?, field("secret")?))
        });
        for joined in futures::future::join_all(joins).await {
            let (name, session, secret) = joined?;
            let task = tokio::spawn(keep(
                self.http.clone(),
                format!("{}/v1/fleets/{}/members/{name}", self.base, self.fleet),
                self.base.clone(),
                session.clone(),
                secret.clone(),
                self.ttl,
            ));
            self.members.insert(
                name,
                Member {
                    session,
                    secret,
                    task,
                },
            );
        }
        Ok(())
    }

    /// `name` leaves: its session closed (its grants end at once).
    pub(crate) async fn leave(&mut self, name: &str) -> anyhow::Result<()> {
        let m = self.members.remove(name).context("no such member")?;
        m.task.abort();
        let resp = self
            .http
            .delete(format!("{}/v1/sessions/{}", self.base, m.session))
            .header("lease-secret", &m.secret)
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("leave {name}: {}", resp.status());
        }
        Ok(())
    }

    /// `name` dies: it stops everything; its session lapses after the TTL.
    pub(crate) fn die(&mut self, name: &str) {
        if let Some(m) = self.members.remove(name) {
            m.task.abort();
        }
    }

    /// Ends the fleet and every member's session.
    pub(crate) async fn end(mut self) -> anyhow::Result<()> {
        self.http
            .delete(format!("{}/v1/fleets/{}", self.base, self.fleet))
            .send()
            .await?;
        let members = std::mem::take(&mut self.members);
        let closes = members.into_values().map(|m| {
            m.task.abort();
            self.http
                .delete(format!("{}/v1/sessions/{}", self.base, m.session))
                .header("lease-secret", m.secret)
                .send()
        });
        futures::future::join_all(closes).await;
        Ok(())
    }
}

/// A member's loop: heartbeats, and its assignment followed, releasing what it must give up.
async fn keep(
    http: reqwest::Client,
    view: String,
    base: String,
    session: String,
    secret: String,
    ttl: u64,
) {
    let heartbeat = async {
        loop {
            tokio::time::sleep(Duration::from_secs(ttl) / 3).await;
            let _ = http
                .post(format!("{base}/v1/sessions/{session}/keepalive"))
                .header("lease-secret", &secret)
                .send()
                .await;
        }
    };
    let follow = async {
        let mut after = "0".to_owned();
        loop {
            let answer = http
                .get(format!("{view}?after={after}&wait_ms=30000"))
                .header("lease-secret", &secret)
                .timeout(Duration::from_secs(40))
                .send()
                .await;
            let Some(resp) = answer.ok().filter(|r| r.status().is_success()) else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let Ok(body) = resp.json::<Value>().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let releases = body["releasing"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["resource"].as_str())
                .map(|r| {
                    http.delete(format!("{base}/v1/leases/{r}"))
                        .header("lease-secret", &secret)
                        .send()
                });
            futures::future::join_all(releases).await;
            if let Some(revision) = body["revision"].as_str() {
                after = revision.to_owned();
            }
        }
    };
    tokio::select! {
        () = heartbeat => {}
        () = follow => {}
    }
}
